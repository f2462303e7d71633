"""The chat API's request and response shapes (pydantic), and the checks their fields share."""

# No `from __future__ import annotations` here: pydantic and the resolver would then compile and evaluate
# every annotation of the models and routes from its text at import (~115 evaluations a cold start).
from collections.abc import Mapping
from datetime import date, datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StringConstraints,
    model_validator,
)

from eros import apps, context, curation, importing, ingest, recall, webhooks
from eros.config import settings
from eros.json_body import storable, unstorable  # noqa: F401 (unstorable: routes/__init__.py)
from eros.memory import (
    EVENT_TIME_FORMS,
    Category,
    EventTime,
    MemoryLayer,
    Precision,
    Source,
    SupersededReason,
    event_time_text,
    parse_event_time,
    stored_importance,
)
from eros.store import memories as memory_store


def _within_limit(value: str) -> str:
    """MAX_CONTENT_CHARS, read per request (a setting, not a constant of the module)."""
    limit = settings().max_content_chars
    if len(value) > limit:
        raise ValueError(f"must be at most {limit} characters (it has {len(value)})")
    return value


Content = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1), BeforeValidator(storable),
                    AfterValidator(_within_limit), Field(
                        description="text, trimmed: at most MAX_CONTENT_CHARS (4,000) characters, no NUL character or "
                                    "lone surrogate")]


def _event_time(value: str) -> str:
    """An event time in one of its four forms, normalised ("2026-w47" -> "2026-W47")."""
    return parse_event_time(value).text()


EventTimeText = Annotated[str, AfterValidator(_event_time), Field(
    description=f"when what the memory is about happened or will happen: {EVENT_TIME_FORMS}",
    examples=["2026-W47", "2019", "2019-03", "2026-12-03"])]


def event_of(text: str | None) -> EventTime | None:
    """A request's validated (so normalised) event time as the domain's, or None."""
    return parse_event_time(text) if text else None


def _as_stored(value):
    """A number as the importance column stores it (``stored_importance``), before the range is checked: what
    rounds to 0 in a float4 (1e-100, -1e-100) is 0, not an underflow error after the embedding was paid for.
    Anything else is left to the type check (strict: no text, no booleans; no NaN or infinity)."""
    return value if isinstance(value, bool) or not isinstance(value, int | float) else stored_importance(value)


Importance = Annotated[float, BeforeValidator(_as_stored), Field(ge=0, le=1, strict=True, allow_inf_nan=False)]
IMPORTANCE = ("a number 0..1, stored as a float4 (one too small for a float4, such as 1e-100, is 0); NaN, infinities, "
              "text and booleans are refused")


class ApiModel(BaseModel):
    """A request or response shape of this API. Built when first used, not at import: a cold container
    validates with the one or two models its first request needs, not with all thirty (bench/cold_start.py)."""
    model_config = ConfigDict(defer_build=True)


class Strict(ApiModel):
    model_config = ConfigDict(extra="forbid")


class NewSession(Strict):
    persona_id: Annotated[str, StringConstraints(min_length=1, max_length=64), BeforeValidator(storable)]


ClientId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._:-]{1,128}$")]


class NewTurn(Strict):
    content: Content
    client_turn_id: ClientId | None = None


class NewMessage(Strict):
    role: Literal["user", "assistant"] = Field(description="who said it: the user, or the persona (your model)")
    content: Content
    client_message_id: ClientId | None = Field(
        None, description="your id for the message (1-128 of A-Z a-z 0-9 . _ : -): a retry with the same id and role "
                          "stores nothing twice; the same id with other text is a 409 message_conflict. Without "
                          "one, an id is made, and a retry stores the message again")
    created_at: AwareDatetime | None = Field(
        None, description="when it was said, with its time zone (ISO 8601); default: when it is stored. Not ahead of "
                          "the server's clock by more than 5 minutes, in order within the request, and not before "
                          "the session's newest message")


class NewMessages(Strict):
    messages: list[NewMessage] = Field(min_length=1, max_length=ingest.MAX_MESSAGES,
                                       description=f"in order, 1 to {ingest.MAX_MESSAGES}")


class ContextRequest(Strict):
    content: Content = Field(description="the user's message to answer")
    store: StrictBool = Field(False, description="also record the message in the session, as an appended user "
                                                 "message (POST .../messages): then append only your reply")
    client_message_id: ClientId | None = Field(None, description="with store: the message's id, as in POST "
                                                                 ".../messages (a retry stores it once)")

    @model_validator(mode="after")
    def _id_needs_store(self):
        if self.client_message_id is not None and not self.store:
            raise ValueError("client_message_id names the message to store: give it with store: true")
        return self


class Memory(ApiModel):
    """A memory as its owner sees it (never its embedding)."""
    id: UUID
    layer: MemoryLayer
    category: Category | None
    content: str
    importance: float | None
    persona_id: str | None = Field(description="the persona of a relationship memory; null in the profile layer")
    created_at: datetime
    occurred_at: str | None = Field(description=f"its event time, when a session (or the user) said when what "
                                                f"it is about happened or will happen: {EVENT_TIME_FORMS}; null: "
                                                f"none was said")
    occurred_precision: Precision | None = Field(description="the size of that period; null with occurred_at")
    source: Source = Field(
        description="what wrote it: a chat utterance, session-end dreaming, the per-user deep pass, the user, or "
                    "'episode': a session's account of what happened between the user and the persona (relationship "
                    "layer, one per session, rewritten when the session resumes)")
    session_id: UUID | None = Field(description="the session it came from")
    from_message_id: int | None = Field(description="first message of the range it was distilled from")
    through_message_id: int | None = Field(description="last message of that range")
    model: str | None = Field(description="the model that wrote it, if one did")
    last_confirmed_at: datetime | None = Field(description="when it was last repeated or confirmed")
    mention_count: int
    superseded_at: datetime | None = Field(description="validity end; null while the memory is active")
    superseded_by: UUID | None = Field(description="the memory that replaced it (null once that one is deleted)")
    superseded_reason: SupersededReason | None = Field(
        description="changed: a newer fact replaced it; duplicate: merged into its twin; reverted: the user restored"
                    " an older version; edited: the user edited it (its new version replaced it); outdated: an"
                    " utterance that stated a fact which changed (superseded_by names that fact)")
    supersedes: list[UUID] = Field(description="ids of the memories this one replaced")

    @model_validator(mode="before")
    @classmethod
    def _event_time_as_text(cls, row):
        """The store's first day and precision as the text form (a week's first day alone would read as a day)."""
        if isinstance(row, Mapping) and isinstance(row.get("occurred_at"), date):
            row = {**row, "occurred_at": event_time_text(row["occurred_at"], row.get("occurred_precision"))}
        return row


class MemoryPage(ApiModel):
    memories: list[Memory]
    next_before: str | None = Field(description="an opaque cursor: pass it as `before` for the next page (it stays "
                                                "valid when the memory it was taken from is deleted); null on the "
                                                "last page")


class MemoryWithHistory(Memory):
    history: list[Memory] = Field(description="every version of this memory (itself included), oldest first: "
                                              "what it replaced and what replaced it, recursively")


MemoryCursor = Annotated[str, StringConstraints(min_length=1, max_length=200),
                         AfterValidator(memory_store.listing_position)]


class HealthReport(ApiModel):
    status: Literal["ok", "degraded"]
    database: Literal["ok", "unreachable"]
    providers: dict[str, str] = Field(description="what the chat model and the embedder are (real or offline)")
    offline: list[Literal["llm", "embedder"]] = Field(
        description="the providers this deployment runs offline stand-ins for (no key or base URL set: local runs "
                    "only): with llm, replies are echoes and memories a crude pick of the user's words; with "
                    "embedder, recall matches words, not meaning. Empty when real ones are configured")
    dreaming: dict[str, Any] = Field(description="ok, or held while a provider refuses our credentials (and why)")


class Check(ApiModel):
    status: Literal["ok", "warning", "failed"] = Field(
        description="warning: works, but needs an operator's look (an embedder with no calibration)")
    detail: str
    ms: float
    age_s: float = Field(description="seconds since the check ran: 0, but for the providers' checks, which a "
                                     "container makes at most once per DEEP_HEALTH_CACHE_SECS")


class Reembedding(ApiModel):
    """How far a change of embedder is (eros.dreaming.reembedding)."""
    next_model: str | None = Field(description="the model the stored vectors are being re-embedded with")
    users: int | None
    users_pending: int | None
    users_failed: int | None = Field(description="users whose job was given up on (`eros doctor` says why)")
    rows_done: int | None
    rows_pending: int | None


class Calibration(ApiModel):
    """The similarity thresholds and score weights the engine uses for the embedding model (issue 30)."""
    model: str = Field(description="the model they are for: the stored vectors' (the configured embedder's before "
                                   "any vector is stored)")
    source: Literal["env", "calibrated", "shipped", "default"] = Field(
        description="env: every one set in the environment; calibrated: stored by `eros calibrate`; shipped: "
                    "measured for this model and shipped with the build; default: none for this model, the "
                    "defaults tuned on e5 (a warning)")
    base: Literal["calibrated", "shipped", "default"] = Field(
        description="where the values the environment does not set come from")
    values: dict[str, float] = Field(description="dedupe_similarity, demote_similarity, lexical_weight, "
                                                 "importance_weight, demote_penalty, recency_weight (recency's "
                                                 "lambda), lexical_year_weight, deep_pass_similarity")
    sources: dict[str, Literal["env", "calibrated", "shipped", "default"]] = Field(
        description="where each value comes from")
    sample: int = Field(description="calibrated: the memories it was derived from")
    refused: str | None = Field(description="a stored calibration that failed validation (not used), and why")
    calibrated_at: str | None = Field(description="calibrated: when `eros calibrate` stored it")
    configured_model: str = Field(description="the configured embedder's model")
    stored_model: str | None = Field(description="the model the stored vectors came from (null: none stored yet)")
    stored_dimension: int | None
    mismatch: bool = Field(description="the stored vectors came from another model than the configured embedder's: "
                                       "a re-embedding toward it runs (`reembedding` says how far)")
    reembedding: Reembedding | None = Field(None, description="while a change of embedder is under way")


class DeepHealth(ApiModel):
    status: Literal["ok", "failed"] = Field(description="failed when any check failed (a warning does not fail)")
    checks: dict[str, Check] = Field(description="database, schema, chat, extraction, embedder, calibration")
    calibration: Calibration | None = Field(
        description="the embedder's similarity thresholds and where they come from (null when the embedder or the "
                    "database cannot be read)")


class PersonaView(ApiModel):
    id: str
    name: str
    description: str
    version: int = Field(description="its current version: a session keeps the one it started with")
    own: bool = Field(description="a character you made (else one of the app's)")
    system_prompt: str | None = Field(description="your own character's prompt (null for the app's)")


MAX_PERSONA_PROMPT = 8_000
PersonaName = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=64),
                        BeforeValidator(storable)]
PersonaDescription = Annotated[str, StringConstraints(strip_whitespace=True, max_length=500),
                               BeforeValidator(storable)]
PersonaPrompt = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_PERSONA_PROMPT),
                          BeforeValidator(storable), Field(
                              description=f"who the character is and how it talks: 1 to {MAX_PERSONA_PROMPT:,} "
                                          f"characters; what a turn puts first in its system prompt")]


class NewPersona(Strict):
    name: PersonaName
    description: PersonaDescription = ""
    system_prompt: PersonaPrompt


class AppPersona(ApiModel):
    """One of the app's personas, as an operator sees it (its prompt included)."""
    id: str
    name: str
    description: str
    system_prompt: str
    version: int
    retired_at: datetime | None


class AppPersonaList(ApiModel):
    personas: list[AppPersona]


class PersonaEdit(Strict):
    name: PersonaName | None = None
    description: PersonaDescription | None = None
    system_prompt: PersonaPrompt | None = None

    @model_validator(mode="after")
    def _changes_something(self):
        if self.name is None and self.description is None and self.system_prompt is None:
            raise ValueError("name at least one of name, description, system_prompt to change")
        return self


class PersonaList(ApiModel):
    personas: list[PersonaView]


class CreatedSession(ApiModel):
    id: UUID
    persona_id: str
    created_at: datetime
    last_active_at: datetime


class DreamingState(ApiModel):
    state: Literal["active", "waiting", "claimed", "retrying", "extracted", "nothing", "failed"] = Field(
        description="active: not quiet for DREAMING_IDLE_SECS yet; waiting: for the next sweep; claimed: being "
                    "extracted; retrying: after a failure, at due_at; extracted: its memories are written; "
                    "nothing: extracted, and nothing in it was worth remembering (no messages, or only questions "
                    "and small talk); failed: given up (error says why; a new message makes it eligible again)")
    error: str | None = Field(description="the last failed attempt's error")
    attempts: int
    due_at: datetime | None = Field(description="when it is quiet enough to be dreamt about, or retried")


class SessionView(CreatedSession):
    extracted_at: datetime | None
    dreaming: DreamingState


class SessionList(ApiModel):
    sessions: list[SessionView] = Field(description="newest first")


class MessageView(ApiModel):
    id: int
    role: Literal["user", "assistant"]
    content: str
    client_turn_id: str | None
    sent_at: datetime
    recalled: list[context.RecalledMemory] | None = Field(
        description="a reply's: the memories its prompt carried, with their scores (their text is the memories' "
                    "own: look them up by id); null for the user's messages")


class MessagePage(ApiModel):
    messages: list[MessageView] = Field(description="newest first")
    next_before: int | None = Field(description="the last message's id: pass it as `before` for the next (older) "
                                                "page; null on the last")


class MemorySearch(Strict):
    query: Content
    layer: MemoryLayer | None = Field(None, description="default: both (the relationship layer needs persona_id)")
    category: Category | None = Field(None, description="profile memories of this category only")
    persona_id: Annotated[str, StringConstraints(min_length=1, max_length=64), BeforeValidator(storable)] | None = \
        Field(None, description="the persona whose relationship memories (what was said to it) are searched too: its "
                                "episodes, its newest utterances and older ones that share a rare word with the query")
    k: Annotated[int, Field(ge=1, le=50, description="how many results at most")] = 10


class SearchResult(Memory):
    score: float = Field(description="what ranks it: similarity + recency + importance + lexical - demotion")
    parts: recall.ScoreParts


class SearchResults(ApiModel):
    results: list[SearchResult] = Field(description="best first")


class NewMemory(Strict):
    content: Content
    category: Category
    importance: Importance | None = Field(
        None, description=f"{IMPORTANCE}; default {curation.USER_IMPORTANCE} (what the user states matters)")
    occurred_at: EventTimeText | None = None


class MemoryEdit(Strict):
    content: Content | None = None
    category: Category | None = None
    importance: Importance | None = Field(None, description=IMPORTANCE)
    occurred_at: EventTimeText | None = Field(None, description="the new event time; null clears it; left out: "
                                                                "kept")

    @model_validator(mode="after")
    def _changes_something(self):
        if (self.content is None and self.category is None and self.importance is None
                and "occurred_at" not in self.model_fields_set):  # an explicit null clears the event time
            raise ValueError("name at least one of content, category, importance, occurred_at to change")
        return self

    def changes(self) -> dict[str, Any]:
        """What ``curation.edit`` takes: the fields given, the event time as ``occurred`` (None: clear it)."""
        changes = self.model_dump(exclude_none=True, exclude={"occurred_at"})
        if "occurred_at" in self.model_fields_set:
            changes["occurred"] = event_of(self.occurred_at)
        return changes


class Deleted(ApiModel):
    deleted: int = Field(description="how many memories were deleted (0 when none matched)")


class Erased(ApiModel):
    """What an erasure deleted, by kind (all 0 when there was nothing, e.g. the second time)."""
    memories: int = Field(description="both layers, superseded history included")
    messages: int
    sessions: int
    persona_instances: int
    deep_pass: int = Field(description="the user's deep-pass (per-user consolidation) record")
    personas: int = Field(0, description="characters the user made, with every version")
    reembedding: int = Field(0, description="the user's re-embedding job, while a change of embedder is under way")
    events: int = Field(0, description="memory events about the user not yet published (one `user.erased` event "
                        "is published in their place)")
    webhook_deliveries: int = Field(0, description="the app's webhook deliveries of the user's events, made or not")
    usage_days: int = Field(description="days of token usage and turn counts")
    usage_by_model: int = Field(description="rows of usage per day, purpose and model")
    exports: int = Field(description="export files not yet expired")


class Erasure(ApiModel):
    erased: Erased


class ExportLink(ApiModel):
    url: str = Field(description="where the export is, a JSON document: `user_id`, `exported_at`, `sessions` "
                                 "(each with its `messages`), `memories` of both layers with their history, provenance "
                                 "and event time (never an embedding), `usage` per day and `usage_by_model` per day, "
                                 "purpose and model")
    expires_at: datetime = Field(description="the link (and, within a day, the file) expires")
    bytes: int


class CallsUsage(ApiModel):
    purpose: Literal["chat", "extraction", "deep_pass", "curation", "reembedding"] = Field(
        description="chat: turns (reply and query embedding); extraction and deep_pass: dreaming; curation: the "
                    "memory API's embeddings; reembedding: a change of embedder re-embedding the user's memories")
    model: str
    calls: int
    input_tokens: int
    output_tokens: int
    estimated_cost: float | None = Field(description="USD at the configured list prices; null: the model has no price")


class DayUsage(ApiModel):
    day: date = Field(description="a UTC day")
    tokens: int = Field(description="what the daily token budget counted")
    estimated_cost: float
    calls: list[CallsUsage]


class PurposeUsage(ApiModel):
    purpose: str
    calls: int
    input_tokens: int
    output_tokens: int
    estimated_cost: float


class UsageTotals(ApiModel):
    tokens: int
    calls: int
    input_tokens: int
    output_tokens: int
    estimated_cost: float


class UsageReport(ApiModel):
    model_config = ConfigDict(populate_by_name=True)
    first: date = Field(alias="from")
    last: date = Field(alias="to")
    currency: str
    daily_token_budget: int | None = Field(description="tokens a day the caller may spend (null: no budget)")
    days: list[DayUsage] = Field(description="days with any usage, oldest first")
    purposes: list[PurposeUsage] = Field(description="the range per purpose")
    totals: UsageTotals
    unpriced_models: list[str] = Field(description="models with no configured price: their cost is not in a total")


MAX_IMPORT_CONVERSATIONS = 50  # a request's: a bigger history goes in several (each conversation is stored once)


class ImportConversation(Strict):
    conversation_id: Annotated[str, StringConstraints(min_length=1, max_length=200), BeforeValidator(storable)] = \
        Field(description="your id for the conversation: importing it again finds its session (stores nothing twice)")
    persona_id: Annotated[str, StringConstraints(min_length=1, max_length=64), BeforeValidator(storable)]
    messages: list[importing.ImportedMessage] = Field(
        min_length=1, max_length=importing.MAX_MESSAGES,
        description="in order, OpenAI-style (`role`, `content`, and `created_at` with its time zone); system and "
                    "tool messages are skipped, other fields ignored")


class NewImport(Strict):
    conversations: list[ImportConversation] = Field(min_length=1, max_length=MAX_IMPORT_CONVERSATIONS,
                                                    description=f"1 to {MAX_IMPORT_CONVERSATIONS}")


class ImportedConversationView(ApiModel):
    conversation_id: str
    session_id: UUID
    created: bool = Field(description="false: an earlier import made its session")
    messages: int = Field(description="its user and assistant messages")
    stored: int = Field(description="of those, stored by this request (the rest were there already)")
    skipped: int = Field(description="system and tool messages")


class ImportRefusal(ApiModel):
    index: int = Field(description="the conversation's place in the request")
    conversation_id: str
    problem: str


class ImportResult(ApiModel):
    imported: list[ImportedConversationView]
    refused: list[ImportRefusal] = Field(description="conversations not imported, each with why; the others were")


class ImportProgress(ApiModel):
    state: Literal["none", "backfilling", "done"] = Field(
        description="none: nothing imported; backfilling: dreaming is distilling the imported sessions, oldest "
                    "first; done: every one is extracted (or given up on)")
    sessions: int
    waiting: int
    in_progress: int
    extracted: int
    failed: int = Field(description="given up on: GET /v1/sessions says why")
    oldest: datetime | None = Field(description="the oldest imported conversation's last message")
    newest: datetime | None
    distilled_through: datetime | None = Field(description="the newest imported conversation dreaming has "
                                                           "extracted: it goes oldest first")


# --- the app's operator: the app, its API keys, its users' usage ----------------------------------------------------
class AppView(ApiModel):
    """The caller's app (``eros apps`` makes and sets apps)."""
    id: str
    name: str
    settings: apps.AppSettings = Field(description="what the app sets over the deployment's settings (null: the "
                                                   "deployment's applies)")
    created_at: datetime


KeyName = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=100),
                    BeforeValidator(storable), Field(description="what the key is for, to tell keys apart: 1 to 100 "
                                                                 "characters")]


class NewKey(Strict):
    name: KeyName


class ApiKey(ApiModel):
    """One of the app's API keys, as listed: never its secret."""
    id: UUID
    name: str
    prefix: str = Field(description="the key's first characters, to tell keys apart")
    created_at: datetime
    last_used_at: datetime | None = Field(description="when a request last came with it (to the minute)")
    revoked_at: datetime | None = Field(description="refused since (null: live)")
    replaced_by: UUID | None = Field(description="the key a rotation made in its place")


class IssuedKey(ApiKey):
    secret: str = Field(description="the key: send it in X-Api-Key to the /server routes. Shown this once: only "
                                    "its SHA-256 is kept")


class ApiKeyList(ApiModel):
    keys: list[ApiKey] = Field(description="newest first, revoked ones too")


def _endpoint(url: str) -> str:
    why = webhooks.refused_url(url, settings())
    if why:
        raise ValueError(why)
    return url


class NewWebhook(Strict):
    url: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=webhooks.MAX_URL),
                   AfterValidator(_endpoint),
                   Field(description="where the app's memory events are posted: an https URL, without credentials "
                                     "or fragment, not a private IP address")]
    rotate_secret: StrictBool = Field(False, description="a new signing secret in place of the current one (the old "
                                                        "one signs nothing from this answer on)")


class Webhook(ApiModel):
    """The app's webhook (docs/EVENTS.md "Webhooks"): never its secret."""
    url: str
    created_at: datetime
    secret_rotated_at: datetime | None = Field(description="when the secret was last rotated (null: never)")
    pending: int = Field(0, description="deliveries waiting (a first attempt or a retry)")
    dead: int = Field(0, description="deliveries given up on after every attempt: POST /v1/operator/webhook/redrive "
                                     "sends them again")


class WebhookSet(ApiModel):
    url: str
    created_at: datetime
    secret_rotated_at: datetime | None
    secret: str | None = Field(None, description="the signing secret (whsec_ and base64 of 32 bytes), only when the "
                                                 "webhook was made or its secret rotated: shown this once")


class Redriven(ApiModel):
    redriven: int = Field(description="dead deliveries due again, with fresh attempts")


class UserUsage(ApiModel):
    user_id: str = Field(description="the user's subject, as the app names them")
    tokens: int = Field(description="what the daily token budget counted")
    calls: int
    input_tokens: int
    output_tokens: int
    estimated_cost: float
    purposes: dict[str, int] = Field(description="tokens (input and output) per purpose")


class AppUsageReport(ApiModel):
    model_config = ConfigDict(populate_by_name=True)
    first: date = Field(alias="from")
    last: date = Field(alias="to")
    currency: str
    app: str
    users: list[UserUsage] = Field(description="users with any usage, costliest first")
    totals: UsageTotals
    unpriced_models: list[str] = Field(description="models with no configured price: their cost is not in a total")
