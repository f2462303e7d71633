"""Apps and their API keys (migration 0036; eros.apps says what an app is). Apps are made, set and deleted by
operators at the command line with the migration credentials (the app role may only read them); an app's keys are
kept by its operator through the API as well."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

from ..db import Connection, connection, one, transaction

_APP = "id, name, settings, created_at"


def find(app: str, conn: Connection | None = None) -> dict | None:
    """The app, unless it does not exist or is being deleted: asked on every request (eros.apps)."""
    return (conn or connection()).execute(f"SELECT {_APP} FROM engine.apps WHERE id = %(app)s AND deleted_at IS NULL",
                                          {"app": app}).fetchone()


def every(conn: Connection | None = None) -> list[dict]:
    return (conn or connection()).execute(f"SELECT {_APP}, deleted_at FROM engine.apps ORDER BY id").fetchall()


def users_by_app(conn: Connection | None = None) -> dict[str, int]:
    """How many users each app has that started a session (one read of the persona instances: what `eros apps
    list` shows; an app's deletion finds every user of it in every table instead)."""
    return {r["app"]: r["users"] for r in (conn or connection()).execute(
        "SELECT engine.app_of(user_id) AS app, count(DISTINCT user_id) AS users FROM engine.persona_instances"
        " GROUP BY 1").fetchall()}


def create(app: str, name: str, settings: dict[str, Any], conn: Connection | None = None) -> dict | None:
    """A new app; None when the id is taken (by a live app or one being deleted)."""
    return (conn or connection()).execute(
        f"INSERT INTO engine.apps (id, name, settings) VALUES (%(app)s, %(name)s, %(settings)s)"
        f" ON CONFLICT (id) DO NOTHING RETURNING {_APP}",
        {"app": app, "name": name, "settings": json.dumps(settings)}).fetchone()


def set_settings(app: str, settings: dict[str, Any], conn: Connection | None = None) -> dict | None:
    """Replace the app's settings (already checked against eros.apps.AppSettings)."""
    return (conn or connection()).execute(
        f"UPDATE engine.apps SET settings = %(settings)s WHERE id = %(app)s AND deleted_at IS NULL RETURNING {_APP}",
        {"settings": json.dumps(settings), "app": app}).fetchone()


# --- API keys ----------------------------------------------------------------------------------------------------

_KEY = "id, app_id, name, prefix, created_at, last_used_at, revoked_at, replaced_by"

# The key's app, if the key is live and its app is: one index probe on the hash and one on the app. Its use is
# recorded to the minute (a key used by every request would otherwise write its row on each: one writer at a time).
_IDENTIFY = ("WITH k AS (SELECT k.id, k.app_id, k.last_used_at, a.settings FROM engine.app_keys k"
             "           JOIN engine.apps a ON a.id = k.app_id AND a.deleted_at IS NULL"
             "           WHERE k.secret_sha256 = %(hash)s AND k.revoked_at IS NULL),"
             " used AS (UPDATE engine.app_keys SET last_used_at = now() FROM k WHERE app_keys.id = k.id"
             "          AND (k.last_used_at IS NULL OR k.last_used_at < now() - interval '1 minute'))"
             " SELECT id, app_id, settings FROM k")


def identify(secret_hash: bytes) -> dict | None:
    return connection().execute(_IDENTIFY, {"hash": secret_hash}).fetchone()


def add_key(app: str, name: str, prefix: str, secret_hash: bytes, conn: Connection | None = None) -> dict:
    return one((conn or connection()).execute(
        f"INSERT INTO engine.app_keys (app_id, name, prefix, secret_sha256) VALUES (%s, %s, %s, %s)"
        f" RETURNING {_KEY}", (app, name, prefix, secret_hash)))


def keys(app: str, conn: Connection | None = None) -> list[dict]:
    """The app's keys, newest first, revoked ones too (never their secret or its hash)."""
    return (conn or connection()).execute(f"SELECT {_KEY} FROM engine.app_keys WHERE app_id = %s"
                                          " ORDER BY created_at DESC, id", (app,)).fetchall()


def revoke(app: str, key_id: UUID, replaced_by: UUID | None = None, conn: Connection | None = None) -> dict | None:
    """Revoke one of the app's live keys; None when it is not the app's or already revoked."""
    return (conn or connection()).execute(
        f"UPDATE engine.app_keys SET revoked_at = now(), replaced_by = %s WHERE id = %s AND app_id = %s"
        f" AND revoked_at IS NULL RETURNING {_KEY}", (replaced_by, key_id, app)).fetchone()


def rotate(app: str, key_id: UUID, prefix: str, secret_hash: bytes) -> dict | None:
    """A new key in place of one of the app's live keys, which is revoked in the same transaction (refused from the
    commit on); the new key keeps the old one's name. None when the old key is not the app's live key."""
    with transaction() as conn:
        old = conn.execute("SELECT name FROM engine.app_keys WHERE id = %s AND app_id = %s AND revoked_at IS NULL"
                           " FOR UPDATE", (key_id, app)).fetchone()
        if old is None:
            return None
        new = add_key(app, old["name"], prefix, secret_hash, conn)
        revoke(app, key_id, new["id"], conn)
        return new
