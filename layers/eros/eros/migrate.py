"""Numbered SQL migrations (``migrations/NNNN_name.sql``) and the persona seed.

Applied in order, each in its own transaction together with its row in
``engine.schema_migrations``; re-running is a no-op. A session-level advisory lock serialises
concurrent runners (two deploys, two local stacks), so no migration is applied twice.
"""

from __future__ import annotations

import json
import re
from importlib import resources

import psycopg

from .db import connect
from .observability import logger

_LOCK_KEY = 0x65726F73  # "eros"
_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


def migration_files() -> list[tuple[str, str]]:
    folder = resources.files("eros") / "migrations"
    names = sorted(p.name for p in folder.iterdir() if _NAME.match(p.name))
    return [(name.removesuffix(".sql"), (folder / name).read_text(encoding="utf-8")) for name in names]


def personas() -> list[dict]:
    folder = resources.files("eros") / "personas"
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.iterdir(), key=lambda p: p.name)
            if p.name.endswith(".json")]


def migrate(dsn: str) -> list[str]:
    """Apply pending migrations and (re)seed personas. Returns the names applied now."""
    applied_now: list[str] = []
    with connect(dsn, vector=False) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
        try:
            conn.execute("CREATE SCHEMA IF NOT EXISTS engine")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS engine.schema_migrations ("
                " name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {r["name"] for r in conn.execute("SELECT name FROM engine.schema_migrations")}
            for name, sql in migration_files():
                if name in done:
                    continue
                with conn.transaction():
                    conn.execute(sql)
                    conn.execute("INSERT INTO engine.schema_migrations (name) VALUES (%s)", (name,))
                applied_now.append(name)
                logger.info("migration applied", extra={"migration": name})
            seed_personas(conn)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
    return applied_now


def seed_personas(conn: psycopg.Connection) -> None:
    with conn.transaction():
        for p in personas():
            conn.execute(
                "INSERT INTO engine.personas (id, name, description, system_prompt) VALUES (%s, %s, %s, %s)"
                " ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, description = EXCLUDED.description,"
                " system_prompt = EXCLUDED.system_prompt",
                (p["id"], p["name"], p.get("description", ""), p["system_prompt"]),
            )
