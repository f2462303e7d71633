"""Configuration, read once from the environment into one validated model.

Every knob of the engine, the local stack's included, is here with its default, and this is the only
module that reads ``os.environ`` (the local stack *writes* it: it is the environment of the functions it
runs, as Lambda's is in AWS). Secrets are not in the environment in AWS: there their *ARNs* are, and
``eros.credentials`` resolves them (cached) into the values below.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

EMBED_DIM = 512


class RecallKnobs(BaseModel):
    """How recall ranks: the one definition of its knobs (``Settings.recall``; eros.recall and
    eros.store.recall take this model, with no defaults of their own). Each field is read from the
    environment variable its alias names; code and tests set it by field name.

    Defaults: the winner of bench/recall_eval.py on the dev set with semantic (e5) embeddings
    (bench/results/recall_summary.md). ``lam`` and ``importance_floor`` are on the embedder's cosine
    scale: re-run the sweep with the production embedder (Voyage) before changing them."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    strategy: Literal["grouped", "recency", "composite"] = Field("recency", alias="RECALL_STRATEGY")
    per_category: int = Field(2, ge=1, le=20, alias="RECALL_PER_CATEGORY")  # grouped: profile rows per category
    top_k: int = Field(10, ge=1, le=50, alias="RECALL_TOP_K")  # recency/composite: profile rows across categories
    # recency/composite: at most this many per category; 0 = no cap
    category_cap: int = Field(0, ge=0, le=50, alias="RECALL_CATEGORY_CAP")
    relationship_top_k: int = Field(5, ge=0, le=50, alias="RELATIONSHIP_TOP_K")
    lam: float = Field(0.002, ge=0, le=10, alias="RECALL_DECAY_LAMBDA")  # recency: weight of the decay term
    tau_days: float = Field(365.0, gt=0, le=36500, alias="RECALL_DECAY_TAU_DAYS")  # decay = exp(-age_days / tau)
    floor: float = Field(0.9, ge=0, le=1, alias="RECALL_DECAY_FLOOR")  # composite: what a very old row keeps
    # composite: importance weight = f + (1 - f) * importance
    importance_floor: float = Field(0.9, ge=0, le=1, alias="RECALL_IMPORTANCE_FLOOR")
    # two recalled rows at least this cosine-similar: one is dropped
    dedupe_similarity: float = Field(0.97, gt=0, le=1, alias="RECALL_DEDUPE_SIMILARITY")
    # Read-time safety net (consolidation, docs/CONSOLIDATION.md): an older profile row with a newer
    # active row of the same category at least ``demote_similarity`` cosine-similar loses
    # ``demote_penalty`` (demoted, not hidden; above 1: off), checked among the ``demote_pool`` best
    # rows only; plus ``importance_weight * importance`` added to every score. Tuned on the e5 dev set,
    # which is also where hygiene's duplicate threshold moved from 0.95 to 0.97: e5 puts a stable fact
    # and a newer related one ("has a cat, Mochi" / "adopted a second cat") above 0.95, and hygiene
    # dropped the old one. On the embedder's cosine scale: re-tune with the production embedder.
    demote_similarity: float = Field(0.84, gt=0, le=2, alias="RECALL_DEMOTE_SIMILARITY")
    demote_penalty: float = Field(0.01, ge=0, le=1, alias="RECALL_DEMOTE_PENALTY")
    demote_pool: int = Field(32, ge=1, le=200, alias="RECALL_DEMOTE_POOL")
    importance_weight: float = Field(0.05, ge=0, le=1, alias="RECALL_IMPORTANCE_WEIGHT")
    # Lexical tie-breaker (issue 14): ``lexical_weight`` times the row's BM25 match with the message over the
    # user's rows, scaled to [0, 1] by the best row's (0: off; the statement is the same, its lexical part adds
    # 0). On the embedder's cosine scale like the rest: 0.01 is e5's best (recall_summary.md); re-tune with Voyage.
    lexical_weight: float = Field(0.01, ge=0, le=1, alias="RECALL_LEXICAL_WEIGHT")
    # ... and what a memory gets whose event time is in a year the message names ("what happened in 2008?").
    lexical_year_weight: float = Field(0.05, ge=0, le=1, alias="RECALL_LEXICAL_YEAR_WEIGHT")
    # The bound (issue 27; engine.recall_layer_v2 in sql/functions/recall.sql says what each reads and why).
    # ``utterance_window``: the newest active utterances of the persona instance that recall scores (older ones
    # are reached through their episode and the lexical path); 0 = no bound at all: the exact scan of every row
    # of both layers, as before (what a quality evaluation compares the bound with). ``pool``: every candidate is
    # scored exactly but for the lexical part and the demotion; the best k + ``pool`` of a layer (at most cap +
    # ``pool`` of a category) go through those two parts, the only ones that read a row's text (``demote_pool``
    # instead of ``pool`` when that is more: the demotion compares rows of the pool).
    # ``lexical_pool``: at most this many older rows (beyond the window) that share a word rare in the window
    # with the message.
    utterance_window: int = Field(1000, ge=0, le=100_000, alias="RECALL_UTTERANCE_WINDOW")
    pool: int = Field(32, ge=0, le=5_000, alias="RECALL_POOL")
    lexical_pool: int = Field(50, ge=0, le=1_000, alias="RECALL_LEXICAL_POOL")

    @model_validator(mode="after")
    def _bound_holds_a_turn(self) -> RecallKnobs:
        if 0 < self.utterance_window < 50:
            raise ValueError("RECALL_UTTERANCE_WINDOW must be 0 (no bound) or at least 50, not"
                             f" {self.utterance_window}: a window smaller than a few sessions would recall only"
                             " the current one")
        return self

    @property
    def demoting(self) -> bool:
        """Whether the read-time demotion is on at all."""
        return self.demote_similarity <= 1 and self.demote_penalty > 0


class ModelPrice(BaseModel):
    """What a model costs, in US dollars per million tokens (an embedder's tokens are all input)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: float = Field(ge=0, le=10000)
    output: float = Field(0.0, ge=0, le=10000)


# The providers' list prices for the default models (USD per million tokens, as published in late 2025:
# OpenRouter's page for Claude Haiku 4.5, Voyage's pricing page). MODEL_PRICES adds models or overrides
# these; usage reports turn tokens into an *estimated* cost with them (discounts, caching and currency
# are not modelled). Check them against your provider's current prices before relying on a figure.
DEFAULT_PRICES = {
    "anthropic/claude-haiku-4.5": ModelPrice(input=1.0, output=5.0),
    "voyage-3.5-lite": ModelPrice(input=0.02),
}


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    # --- database -------------------------------------------------------------------
    database_url: SecretStr | None = None  # local runs and tests
    database_secret_arn: str | None = None  # AWS: an RDS-style JSON secret
    database_host: str | None = None  # AWS: overrides the secret's host (the RDS Proxy endpoint)
    # AWS: the CA bundle that verifies the server's certificate (sslmode=verify-full). Empty: the
    # Mozilla roots of certifi, Amazon's included (RDS Proxy's certificate is issued by ACM); "system":
    # the TLS library's store; else a file (the RDS CA bundle), relative paths from the eros package.
    database_ssl_root_cert: str | None = None
    # AWS, migrate function only: the application's login {username, password}, created by the migration
    # as a member of the DML-only role eros_app; the app functions get it as their database_secret_arn.
    app_database_secret_arn: str | None = None

    # --- providers ------------------------------------------------------------------
    provider_secret_arn: str | None = None  # AWS: {"OPENROUTER_API_KEY": ..., "VOYAGE_API_KEY": ...}
    openrouter_api_key: SecretStr | None = None
    llm_base_url: str | None = None  # any OpenAI-compatible server; default OpenRouter
    chat_model: str = "anthropic/claude-haiku-4.5"
    # Unset: the chat model (``_extraction_follows_chat``). Set it to extract with a model of its own.
    extract_model: str = "anthropic/claude-haiku-4.5"
    voyage_api_key: SecretStr | None = None
    embed_base_url: str | None = None  # default Voyage
    embed_model: str = "voyage-3.5-lite"
    provider_max_retries: int = Field(3, ge=0, le=10)
    llm_timeout_secs: float = Field(20.0, gt=0)
    embed_timeout_secs: float = Field(5.0, gt=0)

    # --- chat turn ------------------------------------------------------------------
    turn_budget_secs: float = Field(25.0, gt=0)  # API Gateway gives a request about 30 s
    max_content_chars: int = Field(4000, ge=1)
    max_body_bytes: int = Field(64 * 1024, ge=1024)
    history_messages: int = Field(12, ge=0, le=200)
    chat_max_tokens: int = Field(600, ge=16)

    # --- spend (issue 8 item 10; eros.store.usage, migration 0007) ---------------------------
    # Per user, kept in Postgres (every container sees the same counts); 0 = off. A turn, or a memory
    # request that embeds, over either limit is refused with 429 and Retry-After before any provider call.
    # The budget counts the tokens of every provider call of the user's UTC day (chat, extraction, deep pass,
    # embeddings) and, while a request runs, its reservation (migration 0018: the day overshoots the budget by
    # less than one request's reservation); a user over it is not dreamt about until midnight UTC (the session
    # waits, it is not lost or counted).
    # Off by default here (local runs, tests); the SAM template turns both on (TurnsPerMinute,
    # DailyTokenBudget parameters).
    turns_per_minute: int = Field(0, ge=0)
    daily_token_budget: int = Field(0, ge=0)
    # GET /v1/health/deep: a container calls the providers for it at most once in this many seconds and answers
    # the checks it made meanwhile (eros.health): a token holder cannot make the deployment pay by repeating it.
    deep_health_cache_secs: int = Field(300, ge=1)
    # MODEL_PRICES: a JSON object {"<model>": {"input": <USD per 1M tokens>, "output": ...}}, added to
    # DEFAULT_PRICES (eros.usage turns usage into estimated cost with ``prices``).
    model_prices: dict[str, ModelPrice] = Field(default_factory=dict)

    # --- the user's record (eros.account): where an export is written. AWS: the S3 bucket (the template's
    # ExportBucket); the local stack: a folder it serves under EXPORT_BASE_URL (`eros serve` sets both).
    export_bucket: str | None = None
    export_dir: str | None = None
    export_base_url: str | None = None

    # --- memory events (eros.events): where the sweeper publishes them. AWS: the template's EventBus
    # (EVENT_BUS_NAME); the local stack: a JSON-lines file (`eros serve` sets EVENTS_LOG; `eros events` reads it).
    # Neither: events are dropped as they are drained. A memory's text only with EVENTS_INCLUDE_TEXT.
    event_bus_name: str | None = None
    events_log: str | None = None
    events_include_text: bool = False
    events_per_tick: int = Field(2000, ge=1)
    # --- signed webhooks (eros.webhooks): each sweep posts the due deliveries of apps with an endpoint, at most
    # WEBHOOKS_PER_TICK; a failed one is tried again after an exponential backoff with jitter (from
    # WEBHOOK_RETRY_BASE_SECS, at most WEBHOOK_RETRY_MAX_DELAY_SECS), and is dead (a dead letter) after
    # WEBHOOK_MAX_ATTEMPTS. A taken delivery is held for WEBHOOK_LEASE_SECS (longer than a post can take). Endpoints
    # are https only, and never an IP literal of a private range, unless WEBHOOK_ALLOW_HTTP (the local stack, tests).
    webhook_allow_http: bool = False
    webhook_retry_base_secs: float = Field(30.0, gt=0)
    webhook_retry_max_delay_secs: float = Field(6 * 3600.0, gt=0)
    webhook_max_attempts: int = Field(8, ge=1, le=100)
    webhooks_per_tick: int = Field(500, ge=1)
    webhook_timeout_secs: float = Field(5.0, gt=0, le=30)
    webhook_lease_secs: int = Field(120, ge=1)

    # --- recall (eros.recall): one nested model, each knob read from the variable its alias names -----
    recall: RecallKnobs = RecallKnobs()

    # --- dreaming -------------------------------------------------------------------
    dreaming_idle_secs: int = Field(1800, ge=1)
    dreaming_tick_secs: int = Field(300, ge=1)  # local stack only; in AWS the schedule (DreamingScheduleRate)
    dreaming_claim_stale_secs: int = Field(600, ge=1)
    dreaming_batch_size: int = Field(200, ge=1, le=10000)
    dreaming_tick_cap: int = Field(5000, ge=1)
    # Failure policy (issue 8): the session's own failures (a provider 4xx on its transcript, a crash on
    # it, a worker that died on it) are capped at max_attempts; the world's (provider down, 5xx, 429,
    # timeouts) are retried with exponential backoff and jitter, base .. max_delay apart, for as long as
    # retry_window, then stamped loudly and re-drivable; configuration failures (401/402/403) hold all
    # dreaming but one probe per config_probe_secs, counted against nobody.
    dreaming_max_attempts: int = Field(5, ge=1)
    dreaming_retry_base_secs: float = Field(60.0, gt=0)
    dreaming_retry_max_delay_secs: float = Field(3600.0, gt=0)
    dreaming_retry_window_secs: float = Field(86400.0, gt=0)
    dreaming_config_probe_secs: float = Field(300.0, gt=0)
    # What the extract function can start before a claim goes stale: concurrency x stale window /
    # seconds per job. A tick claims no more than that, less what is still in flight: a claim made
    # beyond it would only wait in Lambda's queue until it went stale (or its event expired) and be
    # claimed again. concurrency is the extract function's reserved concurrency; extract_secs a
    # generous estimate of one job (a session's extraction or a user's deep pass).
    dreaming_extract_concurrency: int = Field(10, ge=1)
    dreaming_extract_secs: float = Field(30.0, gt=0)
    extract_function_name: str | None = None

    # Transcript retention: messages older than this many days are deleted once their session has been
    # extracted through them (eros.dreaming.tick.expire_transcripts, each sweep); memories keep their provenance
    # ids. 0 = keep messages for ever.
    transcript_retention_days: int = Field(0, ge=0)

    # --- deep pass (eros.dreaming.deep_pass: per-user consolidation across sessions) --------------------
    deep_pass_quiet_secs: int = Field(3600, ge=0)  # a user's memory unchanged this long before a pass
    deep_pass_claim_stale_secs: int = Field(600, ge=1)  # a claim older than this is taken again
    deep_pass_tick_cap: int = Field(200, ge=0)  # most users one sweep claims (0 = no deep pass)
    deep_pass_max_attempts: int = Field(5, ge=1)
    deep_pass_max_rows: int = Field(300, ge=2, le=5000)  # the user's most recent active profile rows read
    deep_pass_similarity: float = Field(0.75, gt=0, le=1)  # cosine at which two rows share a cluster
    deep_pass_max_shown: int = Field(40, ge=2, le=200)  # rows shown to the model (handles m1..mN)
    deep_pass_max_supersessions: int = Field(20, ge=0)  # rows one pass may supersede, whatever it is told

    # --- local stack (eros_dev, the `eros` command) ----------------------------------------
    jwt_issuer: str = "http://127.0.0.1:3000/local"
    jwt_audience: str = "eros-local"
    # The scope (in the token's space-separated `scope` claim) that lets a caller manage the app's personas through
    # /v1/operator/personas; the app's identity provider grants it to its operators alone.
    operator_scope: str = Field("eros/operator", min_length=1, max_length=200, pattern=r"^\S+$")
    # The claim of an end user's token that names their app (eros.apps; migration 0036); a token without it is a
    # user of the first app, "default". The deployment's identity provider sets it (e.g. Cognito's pre token
    # generation trigger), as it grants the operator scope.
    app_claim: str = Field("eros_app", min_length=1, max_length=100, pattern=r"^\S+$")
    eros_data_dir: str | None = None  # the embedded Postgres and the local signing key; default .data/
    local_jwt_secret: SecretStr | None = None  # the local tokens' HS256 key; default one generated into .data/
    port: int = Field(3000, ge=1, le=65535)  # the local API's port: `make run`, `eros chat`, the banner
    eros_debug: bool = False  # the eros command shows a failure's traceback instead of its one line

    # --- logs (eros.observability) -----------------------------------------------------------
    # "json": Powertools' structured lines and the CloudWatch EMF metric blobs, what CloudWatch Logs wants; "text":
    # one readable line per record for a person at a terminal, and no metric blobs (metrics are for CloudWatch).
    # Unset: json inside Lambda (AWS_LAMBDA_FUNCTION_NAME, which Lambda and `sam local` set), text elsewhere.
    log_format: Literal["json", "text"] = "json"
    aws_lambda_function_name: str | None = None  # set by Lambda itself

    @model_validator(mode="before")
    @classmethod
    def _extraction_follows_chat(cls, values: Any) -> Any:
        """EXTRACT_MODEL defaults to CHAT_MODEL, not to a fixed name: a person who points the engine at their own
        server (``LLM_BASE_URL=... CHAT_MODEL=llama3.1``) names one model, and a second default that only
        OpenRouter serves would make every extraction fail while chat works."""
        if isinstance(values, dict) and values.get("extract_model") is None and values.get("chat_model"):
            return values | {"extract_model": values["chat_model"]}
        return values

    @model_validator(mode="before")
    @classmethod
    def _logs_for_where_they_go(cls, values: Any) -> Any:
        """LOG_FORMAT defaults to JSON in Lambda (CloudWatch reads it) and to text on a terminal."""
        if isinstance(values, dict) and values.get("log_format") is None:
            return values | {"log_format": "json" if values.get("aws_lambda_function_name") else "text"}
        return values

    @field_validator("log_format", mode="before")
    @classmethod
    def _log_format_any_case(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("model_prices", mode="before")
    @classmethod
    def _prices_from_json(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return json.loads(value)
            except ValueError as exc:
                raise ValueError(f"MODEL_PRICES is not JSON: {exc}") from None
        return value

    @property
    def prices(self) -> dict[str, ModelPrice]:
        """The price table: DEFAULT_PRICES with MODEL_PRICES over them."""
        return DEFAULT_PRICES | self.model_prices

    @property
    def llm_url(self) -> str:
        return (self.llm_base_url or "https://openrouter.ai/api/v1").rstrip("/")

    @property
    def embed_url(self) -> str:
        return (self.embed_base_url or "https://api.voyageai.com/v1").rstrip("/")

    @property
    def llm_online(self) -> bool:
        """A real chat server is configured: a key, or an explicit base URL (Ollama, vLLM need no key)."""
        return self.openrouter_api_key is not None or self.llm_base_url is not None

    @property
    def embed_online(self) -> bool:
        return self.voyage_api_key is not None or self.embed_base_url is not None

    @property
    def dreaming_capacity(self) -> int:
        """Jobs the extract function can start within one claim-stale window."""
        return max(1, int(self.dreaming_extract_concurrency * self.dreaming_claim_stale_secs
                          // self.dreaming_extract_secs))

    @classmethod
    def env_names(cls) -> set[str]:
        """Every environment variable the settings are read from."""
        flat = {name.upper() for name, field in cls.model_fields.items() if name not in _NESTED}
        return flat | {field.alias for model in _NESTED.values() for field in model.model_fields.values()
                       if field.alias}

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """The settings from ``env`` (default: the process environment); ``overrides`` by field name win."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {name: env[name.upper()] for name in cls.model_fields
                  if name not in _NESTED and env.get(name.upper(), "") != ""}
        for name, model in _NESTED.items():
            values[name] = {field.alias: env[field.alias] for field in model.model_fields.values()
                            if field.alias and env.get(field.alias, "") != ""}
        values.update(overrides)
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise SettingsError(exc) from None


class SettingsError(ValueError):
    """A setting the environment gives cannot be used: one line per variable, each named as the environment names
    it (``DREAMING_IDLE_SECS='abc': ...``), which pydantic's own message does not (it names the field, and
    a nested knob by its model). A secret's value is never repeated."""

    def __init__(self, exc: ValidationError):
        self.variables = [_variable(error["loc"]) for error in exc.errors()]
        super().__init__("; ".join(_line(error) for error in exc.errors()))


def _line(error: Any) -> str:
    message = error["msg"].removeprefix("Value error, ")
    if error["loc"] and error["loc"][0] in _NESTED and len(error["loc"]) == 1:
        return message  # a check across a nested model's knobs: its message names them
    loc = error["loc"]
    if len(loc) > 1 and loc[0] not in _NESTED:  # inside a JSON value: where in it, not the part's value
        return f"{_variable(loc)} (at {'.'.join(map(str, loc[1:]))}): {message}"
    return f"{_variable(loc)}{_shown(error)}: {message}"


def _variable(loc: tuple) -> str:
    """The environment variable of an error's location: a field upper-cased, a nested knob by its alias."""
    if len(loc) > 1 and loc[0] in _NESTED:
        return str(loc[1])
    return str(loc[0]).upper() if loc else "settings"


def _shown(error: Any) -> str:
    field = Settings.model_fields.get(str(error["loc"][0])) if error["loc"] else None
    secret = field is not None and "Secret" in str(field.annotation)
    value = error.get("input")
    if secret or not isinstance(value, str | int | float) or isinstance(value, bool):
        return ""
    return f"={str(value)[:80]!r}"


# Settings fields that are models of their own, read from their fields' aliases.
_NESTED: dict[str, type[BaseModel]] = {"recall": RecallKnobs}


@lru_cache(maxsize=1)
def settings() -> Settings:
    """The process's settings (cached: a Lambda container reads its environment once)."""
    return Settings.from_env()
