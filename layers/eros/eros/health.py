"""Health report: is the database reachable, which providers (real or offline) is this process using, and
is dreaming held because a provider refuses our credentials (401/402/403: a bad key, no credit).

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
from .providers import Deadline, ProviderError


def report() -> dict:
    try:
        connection().execute("SELECT 1")
        database = "ok"
    except (psycopg.Error, ConfigurationError):
        database = "unreachable"
    try:
        described = providers.describe()
    except ConfigurationError as exc:
        described = {"error": str(exc)}
    dreaming = _dreaming() if database == "ok" else {"status": "unknown"}
    healthy = database == "ok" and "error" not in described and dreaming["status"] == "ok"
    return {"status": "ok" if healthy else "degraded", "database": database, "providers": described,
            "dreaming": dreaming}


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
    return {"status": "held", "reason": "a provider refuses our credentials; fix the key or the credit",
            "blocked": [{"provider": b["provider"], "status": b["status"], "error": b["error"],
                         "since": b["since"].isoformat()} for b in blocks]}


def deep_report(*, fresh: bool = False) -> dict:
    """Each check's status ("ok" or "failed"), a line of detail, how long it took and its age (``age_s``: 0 but
    for the providers' checks a container kept; ``fresh``: none is kept); ``status`` is "ok" when all are."""
    checks = {"database": _check(_database), "schema": _check(_schema), **_provider_checks(fresh)}
    return {"status": "ok" if all(c["status"] == "ok" for c in checks.values()) else "failed", "checks": checks}


_probed: dict[str, Any] = {}  # this container's last provider checks: when, with which clients, what they said


def _provider_checks(fresh: bool) -> dict[str, dict]:
    """The providers' checks: those made within DEEP_HEALTH_CACHE_SECS by this container with the same clients
    (new settings or credentials make new clients, and so a new probe), else a new pair of calls."""
    try:
        clients = (providers.chat_client(), providers.embedder())
    except ConfigurationError:
        clients = None  # the checks below fail and say why
    last, now = _probed.get("last"), monotonic()
    if not fresh and last and clients and last["clients"] == clients and now - last["at"] < settings(
            ).deep_health_cache_secs:
        return {name: check | {"age_s": round(now - last["at"], 1)} for name, check in last["checks"].items()}
    checks = {"llm": _check(_llm), "embedder": _check(_embedder)}
    _probed["last"] = {"at": now, "clients": clients, "checks": checks}
    return checks


def _check(probe: Callable[[], str]) -> dict:
    started = time.perf_counter()
    try:
        detail, status = probe(), "ok"
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


def _llm() -> str:
    client, model = providers.chat_client(), settings().chat_model
    answer = client.complete(model, [{"role": "user", "content": "Reply with one word: ok"}], max_tokens=1,
                             temperature=0.0, deadline=Deadline.after(15))
    return f"{client.describe()}: {answer.model} answered"


def _embedder() -> str:
    client = providers.embedder()
    vectors = client.embed(["ok"], "query", deadline=Deadline.after(15))
    return f"{client.describe()}: {len(vectors.vectors[0])}-d vector"
