"""Health report: is the database reachable, which providers (real or offline) is this process using, and
is dreaming held because a provider refuses our configuration (401/402/403: a bad key, no credit; a model it does not
serve).

``deep_report`` (``GET /v1/health/deep``, ``eros doctor``) goes further: it times a query, compares the
schema's applied migrations with the ones this code ships, and makes one tiny call to each provider (a
one-token completion, a one-word embedding), so a wrong URL, key or model shows before a user finds it.

The provider calls are paid by the deployment, not by a user (they are no user's usage), so the route, which
any token holder can call, must not let one make them be paid at will: a container answers the provider checks
it made within ``DEEP_HEALTH_CACHE_SECS`` (with their age), at most one pair of calls per container per period,
whoever asks and however often. The database and schema checks cost nothing and always run. An operator's
``eros doctor`` always calls the providers (``fresh``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from time import monotonic
from typing import Any

import psycopg

from . import providers
from .config import settings
from .credentials import ConfigurationError
from .db import connection, one
from .providers import Deadline, ModelNotFound, ProviderError


def report() -> dict:
    try:
        connection().execute("SELECT 1")
        database = "ok"
    except (psycopg.Error, ConfigurationError):
        database = "unreachable"
    try:
        described, offline = providers.describe(), providers.running_offline()
    except ConfigurationError as exc:
        described, offline = {"error": str(exc)}, []
    dreaming = _dreaming() if database == "ok" else {"status": "unknown"}
    healthy = database == "ok" and "error" not in described and dreaming["status"] == "ok"
    return {"status": "ok" if healthy else "degraded", "database": database, "providers": described,
            "offline": offline, "dreaming": dreaming}


def _dreaming() -> dict:
    """Dreaming is "held" while a provider block exists (engine.provider_blocks, migration 0005): no
    session is extracted and none is counted until the configuration is fixed; the reason says which
    provider answered what (its status, never its body)."""
    from .store import blocks as provider_blocks

    try:
        blocks = provider_blocks.blocks()
    except psycopg.Error:
        return {"status": "unknown"}
    if not blocks:
        return {"status": "ok"}
    return {"status": "held",
            "reason": "a provider refuses our configuration; fix the key, the credit or the model each block names",
            "blocked": [{"provider": b["provider"], "status": b["status"], "error": b["error"],
                         "since": b["since"].isoformat()} for b in blocks]}


def deep_report(*, fresh: bool = False) -> dict:
    """Each check's status ("ok", "warning" or "failed"), a line of detail, how long it took and its age (``age_s``:
    0 but for the providers' checks a container kept; ``fresh``: none is kept); ``status`` is "ok" when none
    failed (a warning, such as an uncalibrated embedder, does not fail it). ``calibration``: what the engine's
    similarity thresholds are for the embedder, and where they come from (eros.calibrated)."""
    found: dict[str, Any] = {}
    checks = {"database": _check(_database), "schema": _check(_schema), **_provider_checks(fresh),
              "calibration": _check(lambda: _calibration(found))}
    return {"status": "failed" if any(c["status"] == "failed" for c in checks.values()) else "ok", "checks": checks,
            "calibration": found.get("report")}


_probed: dict[str, Any] = {}  # this container's last provider checks: when, with which clients, what they said


def _provider_checks(fresh: bool) -> dict[str, dict]:
    """The providers' checks, one per configured model (the chat model, the extraction model, the embedder): those
    made within DEEP_HEALTH_CACHE_SECS by this container with the same clients and models (new settings or
    credentials make new clients, and so a new probe), else new calls."""
    cfg = settings()
    try:
        clients = (providers.chat_client(), providers.embedder(), cfg.chat_model, cfg.extract_model, cfg.embed_model)
    except ConfigurationError:
        clients = None  # the checks below fail and say why
    last, now = _probed.get("last"), monotonic()
    if not fresh and last and clients and last["clients"] == clients and now - last["at"] < cfg.deep_health_cache_secs:
        return {name: check | {"age_s": round(now - last["at"], 1)} for name, check in last["checks"].items()}
    chat = _check(lambda: _llm(cfg.chat_model, "CHAT_MODEL", json_mode=False))
    if cfg.extract_model == cfg.chat_model and chat["status"] == "ok":  # one model: its JSON mode still checked
        extraction = _check(lambda: _llm(cfg.extract_model, "EXTRACT_MODEL = CHAT_MODEL", json_mode=True))
    elif cfg.extract_model == cfg.chat_model:
        extraction = chat | {"detail": f"EXTRACT_MODEL is CHAT_MODEL: {chat['detail']}"}
    else:
        extraction = _check(lambda: _llm(cfg.extract_model, "EXTRACT_MODEL", json_mode=True))
    checks = {"chat": chat, "extraction": extraction, "embedder": _check(_embedder)}
    _probed["last"] = {"at": now, "clients": clients, "checks": checks}
    return checks


def _check(probe: Callable[[], str | tuple[str, str]]) -> dict:
    """Run ``probe``: its detail (and status, when it says one: "warning"), or "failed" with the error's first
    line."""
    started = time.perf_counter()
    try:
        said = probe()
        detail, status = (said, "ok") if isinstance(said, str) else said
    except (psycopg.Error, ConfigurationError, ProviderError, SchemaMismatch) as exc:
        detail, status = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", "failed"
    return {"status": status, "detail": detail, "ms": round((time.perf_counter() - started) * 1000, 1), "age_s": 0.0}


class SchemaMismatch(Exception):
    """The database's migrations are not the ones this code ships."""


def _database() -> str:
    row = one(connection().execute("SELECT current_setting('server_version') AS server,"
                               " (SELECT extversion FROM pg_extension WHERE extname = 'vector') AS vector"))
    return f"PostgreSQL {row['server']}, pgvector {row['vector'] or 'not installed'}"


def _schema() -> str:
    from .migrate import migration_files

    shipped = [name for name, _ in migration_files()]
    applied = {r["name"] for r in connection().execute("SELECT name FROM engine.schema_migrations").fetchall()}
    missing, unknown = [n for n in shipped if n not in applied], sorted(applied - set(shipped))
    if missing:
        raise SchemaMismatch(f"not applied: {', '.join(missing)} (run `eros migrate`, or deploy)")
    if unknown:
        raise SchemaMismatch(f"applied but unknown to this code (an older build?): {', '.join(unknown)}")
    return f"{len(shipped)} migrations, the newest {shipped[-1]}"


def _llm(model: str, setting: str, *, json_mode: bool) -> str:
    """One tiny completion with ``model``; the extraction's check asks for JSON as extraction does (a server
    that cannot would fail every extraction)."""
    client = providers.chat_client()
    prompt = 'Reply with the JSON object {"ok": true}' if json_mode else "Reply with one word: ok"
    try:
        answer = client.complete(model, [{"role": "user", "content": prompt}], max_tokens=8 if json_mode else 1,
                                 temperature=0.0, deadline=Deadline.after(15), json_mode=json_mode)
    except ModelNotFound as exc:
        raise ModelNotFound(f"{exc.hint()} ({client.describe()}, HTTP {exc.status})", status=exc.status,
                            model=model) from None
    return f"{setting} {model!r} at {client.describe()}: {answer.model} answered"


def _embedder() -> str:
    client, model = providers.embedder(), settings().embed_model
    try:
        vectors = client.embed(["ok"], "query", deadline=Deadline.after(15))
    except ModelNotFound as exc:
        raise ModelNotFound(f"{exc.hint()} ({client.describe()}, HTTP {exc.status})", status=exc.status,
                            model=model) from None
    return f"EMBED_MODEL {model!r} at {client.describe()}: {len(vectors.vectors[0])}-d vector"


def _calibration(found: dict[str, Any]) -> tuple[str, str]:
    """The similarity thresholds for the embedder (eros.calibrated): "failed" when the stored vectors came from
    another model than the configured embedder's (turns and dreaming are refused then), "warning" when the model
    has no calibration (e5's defaults on another model's cosines) or a stored one is refused; ``found["report"]``
    gets the details."""
    from . import calibrated, calibration

    configured = calibrated.configured_model()
    used = calibrated.effective(model=None)
    space, other = used.space, calibrated.mismatch(configured)
    found["report"] = used.describe() | {
        "configured_model": configured, "stored_model": space["model"] if space else None,
        "stored_dimension": space["dimension"] if space else None, "mismatch": other is not None}
    if space and other:
        from .store import reembedding as reembedding_store

        progress = reembedding_store.progress() or {}
        found["report"]["reembedding"] = {k: progress.get(k) for k in (
            "next_model", "users", "users_pending", "users_failed", "rows_done", "rows_pending")}
        from . import providers

        reachable = providers.embedder_of(space["model"]) is not None
        meanwhile = (f"turns, recall and dreaming go on with {space['model']!r} until the switch" if reachable else
                     f"turns and dreaming are refused until then: {space['model']!r} cannot be reached with this"
                     f" configuration (set EMBED_MODEL to it again to stop the re-embedding)")
        if progress.get("next_model") == configured:
            failed = f", {progress['users_failed']} given up" if progress["users_failed"] else ""
            return (f"re-embedding the stored vectors of {space['model']!r} with {configured!r}:"
                    f" {progress['rows_done']:,} rows done, {progress['rows_pending']:,} to go"
                    f" ({progress['users_pending']:,} of {progress['users']:,} users pending{failed}); {meanwhile}",
                    "warning" if reachable else "failed")
        return (f"the stored vectors were embedded by {space['model']!r} ({space['dimension']}-d), but the configured"
                f" embedder is {configured!r}: the next turn or extraction starts re-embedding them with it;"
                f" {meanwhile}",
                "warning" if reachable else "failed")
    values = ", ".join(f"{calibrated.ENV_NAMES[k]}={v:g}" for k, v in used.values.items())
    env = [calibrated.ENV_NAMES[k] for k, s in used.sources.items() if s == "env"]
    overridden = f"; from the environment: {', '.join(env)}" if env and used.source != "env" else ""
    stored = "" if space else " (no vector stored yet)"
    refused = f"; {used.refused}" if used.refused else ""
    if used.source == "env":
        line, status = f"{used.model!r}: every threshold set in the environment ({values})", "ok"
    elif used.source == "calibrated":
        at = str(used.stored["created_at"])[:19].replace("T", " ") if used.stored else "?"
        line, status = (f"{used.model!r}: calibrated by `eros calibrate` at {at} from {used.sample:,} memories"
                        f" ({values}){overridden}"), "ok"
    elif used.source == "shipped":
        line, status = f"{used.model!r}: the calibration this build ships ({values}){overridden}", "ok"
    elif used.model == calibration.OFFLINE_MODEL:
        line, status = (f"{used.model!r} (the offline stand-in): e5's defaults, on purpose: calibrated, the stand-in"
                        f" lost stable facts (bench/results/calibrate_embedders.md) ({values}){overridden}"), "ok"
    else:
        line, status = (f"{used.model!r} has NO calibration: its similarity thresholds are the defaults tuned on"
                        f" e5, which may not fit its cosines ({values}){overridden}; run `eros calibrate` once it"
                        f" has a few hundred memories"), "warning"
    return line + stored + refused, "warning" if used.refused else status
