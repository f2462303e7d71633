"""Numbered SQL migrations (``migrations/NNNN_name.sql``) and the persona seed.

Applied in order, each in its own transaction together with its row in
``engine.schema_migrations``; re-running is a no-op. A session-level advisory lock serialises
concurrent runners (two deploys, two local stacks), so no migration is applied twice.

In AWS the migrate function then creates or updates the application's login user (``ensure_app_user``), a
member of the DML-only group role ``eros_app`` that migration 0006 creates. Locally nothing of that runs:
the local stack connects with DATABASE_URL as it always has.
"""

from __future__ import annotations

import json
import re
from importlib import resources

import psycopg
from psycopg import sql

from .db import Connection, connect, one
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
            grant_app_role(conn)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
    return applied_now


def seed_personas(conn: Connection) -> None:
    with conn.transaction():
        for p in personas():
            conn.execute(
                "INSERT INTO engine.personas (id, name, description, system_prompt) VALUES (%s, %s, %s, %s)"
                " ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, description = EXCLUDED.description,"
                " system_prompt = EXCLUDED.system_prompt",
                (p["id"], p["name"], p.get("description", ""), p["system_prompt"]),
            )


APP_ROLE = "eros_app"


def grant_app_role(conn: Connection) -> None:
    """The app role's grants again (migration 0019's ``engine.grant_app_role``): a table created by a later
    migration gets them by default privileges only if the same user created it; this covers any other creator."""
    if conn.execute("SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %s", (APP_ROLE,)).fetchone() is None:
        return  # migration 0006 not applied (an older schema): nothing to grant to
    with conn.transaction():
        conn.execute("CALL engine.grant_app_role()")


class UnsafeAppUser(RuntimeError):
    """The configured application user is the migration's own user, or a role with powers an app must not have."""


def ensure_app_user(dsn: str, username: str, password: str) -> str:
    """Create the application's login user, or bring an existing one up to date: LOGIN, this password,
    member of eros_app. Runs with the migration's (admin) credentials. Returns "created" or "updated".

    The password reaches the server as a SCRAM verifier computed here (libpq's PQencryptPasswordConn), so
    the statement text, which the server may log, never holds it. An existing role is only updated if it
    has no power beyond an application's (superuser, createrole, createdb, replication, bypassrls): this
    never turns the admin user, or anyone else's role, into the app's login.
    """
    with connect(dsn, vector=False) as conn:
        if one(conn.execute("SELECT current_user = %s AS same", (username,)))["same"]:
            raise UnsafeAppUser(f"the application user {username!r} is the migration's own user")
        verifier = conn.pgconn.encrypt_password(password.encode(), username.encode(), b"scram-sha-256").decode()
        name = sql.Identifier(username)
        outcome = "updated"
        if _role(conn, username) is None:
            try:
                conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(name, sql.Literal(verifier)))
                outcome = "created"
            except (psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation):
                pass  # created meanwhile by a concurrent run: update it below
        if outcome == "updated":
            role = _role(conn, username) or {}
            powers = [power for power in ("rolsuper", "rolcreaterole", "rolcreatedb", "rolreplication",
                                          "rolbypassrls") if role.get(power)]
            if powers:
                raise UnsafeAppUser(f"the application user {username!r} exists with {', '.join(powers)}: "
                                    "refusing to make it the application's login")
            conn.execute(sql.SQL("ALTER ROLE {} WITH LOGIN PASSWORD {}").format(name, sql.Literal(verifier)))
        conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(APP_ROLE), name))
    logger.info("application database user ready", extra={"app_user": username, "outcome": outcome})
    return outcome


def _role(conn: Connection, name: str) -> dict | None:
    return conn.execute("SELECT rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls"
                        " FROM pg_catalog.pg_roles WHERE rolname = %s", (name,)).fetchone()
