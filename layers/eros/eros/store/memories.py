"""The two memory layers as the user sees them: listing, one memory with its history, restore, deletion
(one, or all of a layer or category).

Recall ranking lives in ``eros.store.recall``; consolidation's writes in ``eros.store.consolidation``.

A memory is *active* while ``superseded_at`` IS NULL. A superseded row is history: it names the row
that replaced it (``superseded_by``, NULL once that row is deleted: the validity end stays, so a row
replaced once never silently becomes current again) and why (``superseded_reason``). The versions of one
fact are a *version chain* (``chain_id``, migration 0017), which has at most one active row: the database
keeps the chains and enforces that, and every write here takes the user's memory lock first
(``consolidation.hold_user``). Every query here is scoped to the user: another user's id is "not found",
never a different answer.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from uuid import UUID

from pgvector import Vector
from psycopg.types.json import Jsonb

from ..db import Connection, connection, one, retried, transaction
from ..errors import ClientError
from ..memory import EventTime, event_columns
from . import consolidation
from .rows import Memory, MemoryWithHistory

# Restoring a merged duplicate follows superseded_by links back from it at most this many steps: a cycle
# (nothing forbids one in the data) or a very long chain cannot hang a request.
MAX_CHAIN_DEPTH = 100

# What every memory in an answer carries. ``supersedes`` is one correlated lookup per row through
# companion_memories_superseded_by_idx inside the same statement (not one query per row).
FIELDS = """
    m.id, CASE WHEN m.instance_id IS NULL THEN 'profile' ELSE 'relationship' END AS layer,
    m.category, m.content, m.importance, i.persona_id, m.created_at, m.occurred_at, m.occurred_precision,
    m.source, m.session_id,
    m.from_message_id, m.through_message_id, m.metadata->>'model' AS model, m.last_confirmed_at,
    m.mention_count, m.superseded_at, m.superseded_by, m.superseded_reason,
    ARRAY(SELECT s.id FROM engine.companion_memories s
          WHERE s.superseded_by = m.id AND s.user_id = m.user_id AND s.superseded_reason <> 'outdated'
          ORDER BY s.created_at, s.id) AS supersedes
"""
FROM = " FROM engine.companion_memories m LEFT JOIN engine.persona_instances i ON i.id = m.instance_id"

_LIST = ("SELECT" + FIELDS + FROM +
         " WHERE m.user_id = %(user)s {active}"
         "   AND (%(layer)s::text IS NULL OR (%(layer)s = 'profile') = (m.instance_id IS NULL))"
         "   AND (%(category)s::text IS NULL OR m.category = %(category)s)"
         "   AND (%(source)s::text IS NULL OR m.source = %(source)s)"
         "   AND (%(before_at)s::timestamptz IS NULL OR (m.created_at, m.id) < (%(before_at)s, %(before_id)s::uuid))"
         " ORDER BY m.created_at DESC, m.id DESC LIMIT %(limit)s")
# Two fixed statements rather than a boolean parameter: the default (active rows only) is a plain
# predicate on the listing index's rows.
_LIST_ACTIVE = _LIST.format(active="AND m.superseded_at IS NULL")
_LIST_ALL = _LIST.format(active="")

# The versions of one memory: the rows of its version chain (migration 0017), oldest first, the memory itself
# included; a relationship-layer row is a chain of its own.
_HISTORY = ("""
WITH named AS (
    SELECT coalesce(chain_id, id) AS chain FROM engine.companion_memories
    WHERE id = %(id)s AND user_id = %(user)s AND instance_id IS NULL
), chain AS (
    SELECT c.id FROM engine.companion_memories c, named
    WHERE c.user_id = %(user)s AND c.chain_id = named.chain
    UNION
    SELECT c.id FROM engine.companion_memories c, named
    WHERE c.id = named.chain AND c.user_id = %(user)s AND c.chain_id IS NULL
    UNION
    SELECT %(id)s::uuid
)
SELECT""" + FIELDS + FROM + """
WHERE m.user_id = %(user)s AND m.id IN (SELECT id FROM chain)
ORDER BY m.created_at, m.id
""")

# A restored row's chain as restore changes it: ``chain`` its name, ``active`` its current version (if any).
_CHAIN_OF = """
SELECT coalesce(r.chain_id, r.id) AS chain,
       (SELECT a.id FROM engine.companion_memories a
        WHERE a.user_id = r.user_id AND a.instance_id IS NULL AND a.superseded_at IS NULL
          AND coalesce(a.chain_id, a.id) = coalesce(r.chain_id, r.id)) AS active
FROM engine.companion_memories r WHERE r.id = %(id)s AND r.user_id = %(user)s
"""

# Restoring a merged duplicate says it was not the same fact: it leaves its twin's chain with the versions it
# had itself (the rows whose successor links lead to it), under a new name.
_SPLIT_OFF = """
WITH RECURSIVE own(id, depth) AS (
    SELECT %(id)s::uuid, 0
  UNION
    SELECT p.id, o.depth + 1 FROM own o
    JOIN engine.companion_memories p ON p.superseded_by = o.id AND p.user_id = %(user)s AND p.instance_id IS NULL
    WHERE o.depth < %(depth)s
), named AS MATERIALIZED (
    SELECT gen_random_uuid() AS chain
)
UPDATE engine.companion_memories m SET chain_id = named.chain
FROM named
WHERE m.user_id = %(user)s AND m.instance_id IS NULL AND m.id IN (SELECT id FROM own)
"""


class NotSuperseded(ClientError):
    """Restore asked for a memory that is active: there is nothing to undo."""
    status, code = 409, "memory_active"


class NotAnEpisodeField(ClientError):
    """An edit of an episode that names a category or an importance: an episode has neither."""
    status, code = 422, "not_an_episode_field"

    def __init__(self, memory_id: UUID):
        super().__init__(f"memory {memory_id} is an episode: only its content and occurred_at can be edited")


class NotCurrent(ClientError):
    """An edit of a memory that is history (superseded) or not in the profile layer: only the current
    version of a profile memory can be edited."""
    status, code = 409, "memory_not_current"

    def __init__(self, memory_id: UUID):
        super().__init__(f"memory {memory_id} is not the current version of a profile memory: edit the current "
                         "version (its history names it)")


def list_memories(user_id: str, layer: str | None, category: str | None, limit: int,
                  before: tuple[datetime, UUID] | None = None, include_superseded: bool = False,
                  source: str | None = None) -> list[Memory]:
    """The user's own memories, newest first, without embeddings, of one ``source`` if given (e.g. 'episode');
    active rows only unless ``include_superseded``. ``before`` is the (created_at, id) of the last row of the
    previous page: the page goes on from that position whether or not the row is still there (it may have been
    deleted)."""
    before_at, before_id = before or (None, None)
    return connection().execute(
        _LIST_ALL if include_superseded else _LIST_ACTIVE,
        {"user": user_id, "layer": layer, "category": category, "source": source, "limit": limit,
         "before_at": before_at,
         "before_id": before_id},
    ).fetchall()


def by_ids(user_id: str, ids: list[UUID]) -> dict[UUID, Memory]:
    """The user's memories of ``ids`` (another user's are not there), as listed, by id."""
    rows = connection().execute("SELECT" + FIELDS + FROM + " WHERE m.user_id = %s AND m.id = ANY(%s)",
                                (user_id, ids)).fetchall()
    return {row["id"]: row for row in rows}


def instance_of(user_id: str, persona_id: str) -> UUID | None:
    """The user's instance of a persona (the key of its relationship layer), if they have one."""
    row = connection().execute("SELECT id FROM engine.persona_instances WHERE user_id = %s AND persona_id = %s",
                               (user_id, persona_id)).fetchone()
    return row["id"] if row else None


def memory_cursor(memory: Mapping[str, Any]) -> str:
    """The opaque cursor after a memory in the listing: its position (created_at, id), not a reference to the
    row, so that the next page does not depend on the row still existing."""
    position = json.dumps([memory["created_at"].isoformat(), str(memory["id"])], separators=(",", ":"))
    return base64.urlsafe_b64encode(position.encode()).rstrip(b"=").decode()


def listing_position(value: str) -> tuple[datetime, UUID] | UUID:
    """``before`` of the listing: a cursor (``memory_cursor``) as a position, or a memory id (what older clients
    send) as a UUID (``position_of`` finds its position). Raises ValueError for anything else."""
    try:
        return UUID(value)
    except ValueError:
        pass
    try:
        created_at, memory_id = json.loads(base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)))
        position = datetime.fromisoformat(created_at), UUID(memory_id)
    except (ValueError, TypeError, binascii.Error, RecursionError):
        raise ValueError("not a cursor: pass the next_before of the previous page") from None
    if position[0].tzinfo is None:
        raise ValueError("not a cursor: pass the next_before of the previous page")
    return position


def position_of(user_id: str, memory_id: UUID) -> tuple[datetime, UUID] | None:
    """The listing position (created_at, id) of one of the user's memories; None if there is no such row
    (a cursor given as a bare id, as older clients do, can only be resolved while its row exists)."""
    row = connection().execute(
        "SELECT created_at, id FROM engine.companion_memories WHERE id = %s AND user_id = %s", (memory_id, user_id),
    ).fetchone()
    return (row["created_at"], row["id"]) if row else None


def _with_history(conn: Connection, user_id: str, memory_id: UUID) -> MemoryWithHistory | None:
    chain = conn.execute(_HISTORY, {"id": memory_id, "user": user_id}).fetchall()
    memory = next((row for row in chain if row["id"] == memory_id), None)
    if memory is None:
        return None
    return memory | {"history": chain}


def get_memory(user_id: str, memory_id: UUID) -> MemoryWithHistory | None:
    """One of the user's memories with ``history``: every version of it, oldest first (itself
    included). None: no such memory of this user."""
    return _with_history(connection(), user_id, memory_id)


@retried
def restore_memory(user_id: str, memory_id: UUID) -> MemoryWithHistory | None:
    """Undo a supersession: the user says the old version is still true.

    One transaction under the user's memory lock (``consolidation.hold_user``: an edit, a merge or another
    restore of the same user runs before or after it, never in between), so the version chain is read as it
    is: the chain's active version, whichever it is now, is superseded by the restored row with reason
    'reverted' first, then the row becomes active and confirmed now, so that the chain keeps one current
    version (migration 0017 makes a second one an error). A merged duplicate is different: the user says it
    was not the same fact, so it leaves its twin's chain with its own earlier versions and only it is
    reactivated (its twin stays as it is); so is an utterance ('outdated'), which is no version of anything.
    The utterances that stated the restored fact come back with it. The user's profile is marked changed for
    the deep pass. Returns the restored memory with its history; None if the user has no such memory; raises
    ``NotSuperseded`` if it is active.
    """
    with transaction() as conn:
        consolidation.hold_user(conn, user_id)
        row = _locked_row(conn, user_id, memory_id, "superseded_at, superseded_reason, instance_id")
        if row is None:
            return None
        if row["superseded_at"] is None:
            raise NotSuperseded(f"memory {memory_id} is active (not superseded): there is nothing to restore")
        if row["superseded_reason"] == "duplicate":
            conn.execute(_SPLIT_OFF, {"id": memory_id, "user": user_id, "depth": MAX_CHAIN_DEPTH})
        elif row["instance_id"] is None:
            chain = one(conn.execute(_CHAIN_OF, {"id": memory_id, "user": user_id}))
            if chain["active"] is not None:
                consolidation.supersede(conn, user_id, memory_id, [chain["active"]], "reverted")
        conn.execute(
            "UPDATE engine.companion_memories SET superseded_at = NULL, superseded_by = NULL,"
            " superseded_reason = NULL, last_confirmed_at = now() WHERE id = %s AND user_id = %s", (memory_id, user_id),
        )
        # The utterances that stated this fact left recall with it (reason 'outdated'): they come back too.
        conn.execute(
            "UPDATE engine.companion_memories SET superseded_at = NULL, superseded_by = NULL, superseded_reason = NULL"
            " WHERE superseded_by = %s AND user_id = %s AND superseded_reason = 'outdated'", (memory_id, user_id),
        )
        consolidation.mark_changed(conn, user_id)
        return _with_history(conn, user_id, memory_id)


def _locked_row(conn, user_id: str, memory_id: UUID, columns: str) -> dict | None:
    """``columns`` (constants of ours) of the user's memory, its row locked for the transaction; None: not theirs."""
    return conn.execute(f"SELECT {columns} FROM engine.companion_memories WHERE id = %s AND user_id = %s"
                        " FOR UPDATE", (memory_id, user_id)).fetchone()


@retried
def add_memory(user_id: str, content: str, category: str, importance: float, embedding: list[float],
               embed_model: str, occurred: EventTime | None = None) -> MemoryWithHistory:
    """A profile memory the user states (source 'user'), with its event time if they give one: confirmed now;
    the user's profile is marked changed (the deep pass merges it with a memory that says the same)."""
    with transaction() as conn:
        consolidation.hold_user(conn, user_id)
        memory_id = one(conn.execute(
            "INSERT INTO engine.companion_memories (user_id, content, embedding, category, importance, source,"
            " last_confirmed_at, metadata, occurred_at, occurred_precision)"
            " VALUES (%s, %s, %s, %s, %s, 'user', now(), %s, %s, %s) RETURNING id",
            (user_id, content, Vector(embedding), category, importance, Jsonb({"embed_model": embed_model}),
             *event_columns(occurred)),
        ))["id"]
        consolidation.mark_changed(conn, user_id)
        return _with_history(conn, user_id, memory_id)  # type: ignore[return-value]  # just inserted


@retried
def edit_memory(user_id: str, memory_id: UUID, changes: dict, embedding: list[float] | None = None,
                embed_model: str | None = None) -> MemoryWithHistory | None:
    """A new version of one of the user's current profile memories, superseding it (reason 'edited'):
    ``changes`` of content, category, importance and ``occurred`` (an ``EventTime``, or None to clear it; the
    old one is kept when the key is absent); ``embedding`` when the content changed (else the old
    one is kept). It keeps the provenance of the version it replaces (session, message range) and says it
    was written by the user. A changed text outdates the relationship utterances that stated the old one
    (as a changed fact does in consolidation; a spelling fix leaves them, being nearer to the new text).
    The old row is locked, so two edits of one version make one successor (the second finds it
    superseded). Returns the new version with its history; None: no such memory of this user; raises
    ``NotCurrent`` for history or a relationship row."""
    with transaction() as conn:
        consolidation.hold_user(conn, user_id)
        old = _locked_row(conn, user_id, memory_id, "instance_id, superseded_at")
        if old is None:
            return None
        if old["instance_id"] is not None or old["superseded_at"] is not None:
            raise NotCurrent(memory_id)
        occurred_at, precision = event_columns(changes.get("occurred"))
        new_id = one(conn.execute(
            "INSERT INTO engine.companion_memories (user_id, content, embedding, category, importance, source,"
            " session_id, from_message_id, through_message_id, mention_count, last_confirmed_at, metadata,"
            " occurred_at, occurred_precision)"
            " SELECT user_id, coalesce(%(content)s, content), coalesce(%(embedding)s, embedding),"
            "        coalesce(%(category)s, category), coalesce(%(importance)s, importance), 'user', session_id,"
            "        from_message_id, through_message_id, mention_count, now(),"
            "        metadata || jsonb_build_object('edited_from', id::text)"
            "                 || CASE WHEN %(embed_model)s::text IS NULL THEN '{}'::jsonb"
            "                         ELSE jsonb_build_object('embed_model', %(embed_model)s::text) END,"
            "        CASE WHEN %(set_occurred)s THEN %(occurred_at)s::date ELSE occurred_at END,"
            "        CASE WHEN %(set_occurred)s THEN %(precision)s::text ELSE occurred_precision END"
            " FROM engine.companion_memories WHERE id = %(id)s RETURNING id",
            {"content": changes.get("content"), "category": changes.get("category"),
             "importance": changes.get("importance"), "id": memory_id, "embed_model": embed_model,
             "embedding": Vector(embedding) if embedding is not None else None,
             "set_occurred": "occurred" in changes, "occurred_at": occurred_at, "precision": precision},
        ))["id"]
        consolidation.supersede(conn, user_id, new_id, [memory_id], "edited")
        if embedding is not None:  # the text changed: what was said of the old text, and is nearer to it
            consolidation.outdate_utterances(conn, user_id, [memory_id])  # than to the new, goes with it
        consolidation.mark_changed(conn, user_id)
        return _with_history(conn, user_id, new_id)


@retried
def edit_episode(user_id: str, memory_id: UUID, changes: dict, embedding: list[float] | None = None,
                 embed_model: str | None = None) -> MemoryWithHistory | None:
    """Correct one of the user's episodes in place: ``changes`` of content (with its new ``embedding``) and
    ``occurred`` (an ``EventTime``, or None to clear it); the row stays the session's one episode, with its
    provenance, and metadata.edited_at says the user changed it. In place, as a resumed session's extraction
    rewrites it: an episode has no versions (a later extraction of the session is shown the corrected text and
    goes on from it). None: the user has no such episode."""
    occurred_at, precision = event_columns(changes.get("occurred"))
    with transaction() as conn:
        consolidation.hold_user(conn, user_id)
        row = conn.execute(
            "UPDATE engine.companion_memories SET content = coalesce(%(content)s, content),"
            " embedding = coalesce(%(embedding)s, embedding),"
            " occurred_at = CASE WHEN %(set_occurred)s THEN %(occurred_at)s::date ELSE occurred_at END,"
            " occurred_precision = CASE WHEN %(set_occurred)s THEN %(precision)s::text ELSE occurred_precision END,"
            " metadata = metadata || jsonb_build_object('edited_at', now())"
            "     || CASE WHEN %(embed_model)s::text IS NULL THEN '{}'::jsonb"
            "             ELSE jsonb_build_object('embed_model', %(embed_model)s::text) END"
            " WHERE id = %(id)s AND user_id = %(user)s AND source = 'episode' RETURNING id",
            {"content": changes.get("content"), "embedding": Vector(embedding) if embedding is not None else None,
             "set_occurred": "occurred" in changes, "occurred_at": occurred_at, "precision": precision,
             "embed_model": embed_model, "id": memory_id, "user": user_id}).fetchone()
        return _with_history(conn, user_id, memory_id) if row else None


@retried
def delete_memories(user_id: str, layer: str | None, category: str | None) -> int:
    """Delete the user's memories of a layer and/or a category, history included; returns how many.
    A memory of another layer or category that one of them had replaced stays history, in its chain."""
    with transaction() as conn:
        consolidation.hold_user(conn, user_id)
        return conn.execute(
            "DELETE FROM engine.companion_memories m WHERE m.user_id = %(user)s"
            "   AND (%(layer)s::text IS NULL OR (%(layer)s = 'profile') = (m.instance_id IS NULL))"
            "   AND (%(category)s::text IS NULL OR m.category = %(category)s)",
            {"user": user_id, "layer": layer, "category": category},
        ).rowcount


@retried
def delete_memory(user_id: str, memory_id: UUID) -> bool:
    """Delete one of the user's memories. Rows it had superseded keep their validity end and their version
    chain (the foreign key only clears their superseded_by): they stay history of the versions that remain,
    and restoring one of them retires the chain's current version."""
    with transaction() as conn:
        consolidation.hold_user(conn, user_id)
        return conn.execute(
            "DELETE FROM engine.companion_memories WHERE id = %s AND user_id = %s RETURNING id", (memory_id, user_id)
        ).fetchone() is not None
