"""The schema: numbered SQL migrations (``migrations/NNNN_name.sql``), the current definitions of the
database's functions (``sql/functions/*.sql``) and the persona seed.

* A migration is history: applied once, in order, each in its own transaction together with its row in
  ``engine.schema_migrations``, which records the file's SHA-256 (migration 0020). A migration is never edited
  after it was applied anywhere: a database migrated before the edit would keep the old text silently. So a
  recorded checksum that differs from the file's refuses the run (``EditedMigration``, naming the file) on
  deploy, and is a warning in the local stack (``migrate(..., local=True)``, which ``eros serve`` passes).
  A migration applied before checksums were kept gets its file's checksum of the time it is first seen.
* A function file is the one current ``CREATE OR REPLACE`` definition of its functions (``sql/functions/
  README.md``: what may go there, and the ``_v2`` rule for a changed signature). It is applied after the
  migrations, in the same locked run, whenever its SHA-256 differs from the one ``engine.schema_objects``
  records: a change of a function is an edit of its file, never a copy of it in a new migration.

Re-running is a no-op. A session-level advisory lock serialises concurrent runners (two deploys, two local
stacks), so nothing is applied twice.

In AWS the migrate function then creates or updates the application's login user (``ensure_app_user``), a
member of the DML-only group role ``eros_app`` that migration 0006 creates. Locally nothing of that runs:
the local stack connects with DATABASE_URL as it always has.
"""

from __future__ import annotations

import hashlib
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


def function_files() -> list[tuple[str, str]]:
    """(``functions/<name>``, text) of each function file, in the order of their names, which is the order
    they are applied in."""
    folder = resources.files("eros") / "sql" / "functions"
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".sql"))
    return [(f"functions/{name.removesuffix('.sql')}", (folder / name).read_text(encoding="utf-8"))
            for name in names]


def checksum(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def personas() -> list[dict]:
    folder = resources.files("eros") / "personas"
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.iterdir(), key=lambda p: p.name)
            if p.name.endswith(".json")]


class EditedMigration(RuntimeError):
    """An applied migration's file differs from the text that was applied (its recorded SHA-256)."""


class FileFailed(RuntimeError):
    """A migration or a function file the database refused: the message names the file and the database's
    error (the error itself is the cause). Nothing of that file was applied."""


def _apply(conn: Connection, file: str, text: str) -> None:
    try:
        conn.execute(text)
    except psycopg.Error as exc:
        raise FileFailed(f"{file} failed: {type(exc).__name__}: {exc}".strip()) from exc


def migrate(dsn: str, *, local: bool = False) -> list[str]:
    """Apply pending migrations, then the changed function files, and (re)seed personas. Returns the names
    applied now (a function file as ``functions/<name>``).

    ``local``: the caller is the local stack, where an edited applied migration is only warned about (a
    developer's database, the edit often their own work in progress); anywhere else it refuses the run before
    anything is applied."""
    applied_now: list[str] = []
    with connect(dsn, vector=False) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
        try:
            conn.execute("CREATE SCHEMA IF NOT EXISTS engine")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS engine.schema_migrations ("
                " name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            files = migration_files()
            # to_jsonb: the checksum column exists only once 0020 is applied.
            recorded = {r["name"]: r["sha256"] for r in conn.execute(
                "SELECT name, to_jsonb(m)->>'sha256' AS sha256 FROM engine.schema_migrations m")}
            _refuse_edited(files, recorded, local)
            for name, sql in files:
                if name in recorded:
                    continue
                with conn.transaction():
                    _apply(conn, f"migrations/{name}.sql", sql)
                    conn.execute("INSERT INTO engine.schema_migrations (name) VALUES (%s)", (name,))
                applied_now.append(name)
                logger.info("migration applied", extra={"migration": name})
            _record_checksums(conn, files, applied_now)
            applied_now += apply_function_files(conn)
            seed_personas(conn)
            grant_app_role(conn)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
    return applied_now


def _refuse_edited(files: list[tuple[str, str]], recorded: dict[str, str | None], local: bool) -> None:
    edited = [f"{name}.sql" for name, sql in files if recorded.get(name) not in (None, checksum(sql))]
    if not edited:
        return
    message = (f"applied migration {', '.join(edited)} was edited since it was applied (its SHA-256 differs from"
               " the one engine.schema_migrations records): a database migrated before the edit keeps the old"
               " text. Restore the file as it was and make the change in a new migration (the body of a"
               " function: in eros/sql/functions/)")
    if not local:
        raise EditedMigration(message)
    logger.warning(f"{message}; the local stack goes on with the database as it is", extra={"edited": edited})


def _record_checksums(conn: Connection, files: list[tuple[str, str]], applied_now: list[str]) -> None:
    """The checksum of each migration that has none: one applied by this run, or (said in the log) one applied
    before checksums were kept, which gets its file's checksum as it is now."""
    first_seen = [r["name"] for r in conn.execute(
        "UPDATE engine.schema_migrations m SET sha256 = f.sha256"
        " FROM unnest(%s::text[], %s::text[]) AS f(name, sha256)"
        " WHERE m.name = f.name AND m.sha256 IS NULL RETURNING m.name",
        ([name for name, _ in files], [checksum(sql) for _, sql in files])) if r["name"] not in applied_now]
    if first_seen:
        logger.info("checksums recorded for migrations applied before checksums were kept: from their files as"
                    " they are now", extra={"migrations": sorted(first_seen)})


def apply_function_files(conn: Connection) -> list[str]:
    """Apply each function file whose SHA-256 is not the one engine.schema_objects records, each in its own
    transaction with its row. Returns the names applied."""
    recorded = {r["name"]: r["sha256"] for r in conn.execute("SELECT name, sha256 FROM engine.schema_objects")}
    applied = []
    for name, text in function_files():
        digest = checksum(text)
        if recorded.get(name) == digest:
            continue
        with conn.transaction():
            _apply(conn, f"sql/{name}.sql", text)
            conn.execute("INSERT INTO engine.schema_objects (name, sha256) VALUES (%s, %s)"
                         " ON CONFLICT (name) DO UPDATE SET sha256 = EXCLUDED.sha256, applied_at = now()",
                         (name, digest))
        applied.append(name)
        logger.info("function file applied", extra={"file": f"{name}.sql"})
    return applied


def seed_personas(conn: Connection) -> None:
    """The package's personas (eros/personas/*.json), made or, when their text changed, given a new version
    (store.personas.keep_app: sessions already started keep theirs). A retired one stays retired."""
    from .apps import DEFAULT
    from .store.personas import keep_app

    with conn.transaction():
        for p in personas():
            keep_app(DEFAULT, p["id"], p["name"], p.get("description", ""), p["system_prompt"], conn)


APP_ROLE = "eros_app"


def grant_app_role(conn: Connection) -> None:
    """The app role's grants again (``engine.grant_app_role``, sql/functions/grants.sql): a table created by a later
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
