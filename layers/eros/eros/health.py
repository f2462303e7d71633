"""Health report: is the database reachable, which providers (real or offline) is this process using, and
is dreaming held because a provider refuses our credentials (401/402/403: a bad key, no credit)."""

from __future__ import annotations

import psycopg

from . import providers
from .credentials import ConfigurationError
from .db import connection


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
    from .store import dreaming as store

    try:
        blocks = store.blocks()
    except psycopg.Error:
        return {"status": "unknown"}
    if not blocks:
        return {"status": "ok"}
    return {"status": "held", "reason": "a provider refuses our credentials; fix the key or the credit",
            "blocked": [{"provider": b["provider"], "status": b["status"], "error": b["error"],
                         "since": b["since"].isoformat()} for b in blocks]}
