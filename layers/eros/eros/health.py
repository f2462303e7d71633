"""Health report: is the database reachable, and which providers (real or offline) is this process using."""

from __future__ import annotations

import psycopg

from . import providers
from .db import connection
from .secrets import ConfigurationError


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
    healthy = database == "ok" and "error" not in described
    return {"status": "ok" if healthy else "degraded", "database": database, "providers": described}
