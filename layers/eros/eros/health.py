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
    return {"status": "ok" if database == "ok" else "degraded", "database": database,
            "providers": providers.describe()}
