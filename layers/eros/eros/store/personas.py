"""Personas (migration 0030): the app's, which operators keep (``eros personas``) and the package seeds, and the
characters users make, visible to their maker alone. Each edit is a new version; a session keeps the version it
started with. The runtime writes a user's characters only through the database's functions
(sql/functions/personas.sql): it may not write the tables, so it cannot change one of the app's."""

from __future__ import annotations

import uuid

from ..db import Connection, connection, one
from .rows import Persona

MAX_OWN = 20  # characters a user may have (not retired)

_COLUMNS = ("id, name, description, version, owner_id IS NOT NULL AS own,"
            " CASE WHEN owner_id IS NOT NULL THEN system_prompt END AS system_prompt")
# What a user may see and start sessions with: their app's personas and their own, not retired (store.chat too).
# The user's key names their app (eros.apps): engine.app_of reads it.
USABLE = ("retired_at IS NULL AND (owner_id = %(user)s OR (owner_id IS NULL AND app_id = engine.app_of(%(user)s)))")


def usable(user_id: str) -> list[Persona]:
    """The personas the user may chat with: the app's, then their own, each by id."""
    return connection().execute(f"SELECT {_COLUMNS} FROM engine.personas WHERE {USABLE}"
                                " ORDER BY owner_id NULLS FIRST, id", {"user": user_id}).fetchall()


def own(user_id: str, persona_id: str) -> Persona | None:
    """The user's own character (not retired), or None."""
    return connection().execute(f"SELECT {_COLUMNS} FROM engine.personas"
                                " WHERE id = %s AND owner_id = %s AND retired_at IS NULL",
                                (persona_id, user_id)).fetchone()


def count_own(user_id: str) -> int:
    return one(connection().execute("SELECT count(*) AS n FROM engine.personas WHERE owner_id = %s"
                                    " AND retired_at IS NULL", (user_id,)))["n"]


def keep_own(user_id: str, persona_id: str | None, name: str, description: str, prompt: str) -> Persona | None:
    """Make (``persona_id`` None: a new id) or edit the user's character: a new version (engine.keep_user_persona).
    None: not the user's, or retired."""
    persona_id = persona_id or f"u-{uuid.uuid4().hex[:16]}"
    version = one(connection().execute("SELECT engine.keep_user_persona(%s, %s, %s, %s, %s) AS v",
                                       (user_id, persona_id, name, description, prompt)))["v"]
    return None if version is None else own(user_id, persona_id)


def retire_own(user_id: str, persona_id: str) -> bool:
    return one(connection().execute("SELECT engine.retire_user_persona(%s, %s) AS r", (user_id, persona_id)))["r"]


# --- an app's personas: the operator API, operators at the command line (eros personas) and the package's seed
# (eros.migrate, the first app's). A changed name, description or prompt is a new version; the same text again
# changes nothing (engine.keep_app_persona_v2, sql/functions/personas.sql).

def keep_app(app: str, persona_id: str, name: str, description: str, prompt: str,
             conn: Connection | None = None) -> int | None:
    """One of ``app``'s personas, made or changed. Returns the new version; None: nothing changed (or the id is a
    user's character or another app's persona)."""
    return one((conn or connection()).execute("SELECT engine.keep_app_persona_v2(%s, %s, %s, %s, %s) AS version",
                                              (app, persona_id, name, description, prompt)))["version"]


def retire_app(app: str, persona_id: str, conn: Connection | None = None) -> bool:
    return one((conn or connection()).execute("SELECT engine.retire_app_persona_v2(%s, %s) AS r",
                                              (app, persona_id)))["r"]


def app_personas(app: str, conn: Connection | None = None) -> list[dict]:
    """Every one of ``app``'s personas, retired ones too, each with its current text."""
    return (conn or connection()).execute(
        "SELECT id, name, description, system_prompt, version, retired_at FROM engine.personas"
        " WHERE owner_id IS NULL AND app_id = %s ORDER BY id", (app,)).fetchall()
