"""Consolidation's writes: supersede, confirm, and "this user's memory changed".

Shared by write-time consolidation (``store.dreaming.finish``), the per-user deep pass and the
memory API. Every function takes the connection of a transaction the caller already holds (the
claim-guarded one), and re-checks ownership in SQL: a row is touched only if it belongs to the
user, is in the profile layer, and is still active. What a model names beyond that is ignored
and counted by the caller (applied < asked).

Provenance follows a fact: a profile row knows the message range it was distilled from
(``session_id``, ``from_message_id``..``through_message_id``), and ``metadata.confirmed_in`` lists
the ranges of the sessions that repeated it (and of the duplicates merged into it). When the fact
changes, the relationship layer's raw utterances in those ranges that stated it -- those whose
nearest profile memory is the old fact, not the new one nor any other -- leave recall with it
(reason ``outdated``): otherwise "I live in Shanghai", said to a persona, would still be recalled
next to the profile's "moved to Tokyo".
"""

from __future__ import annotations

from collections.abc import Iterable
from uuid import UUID

from psycopg.types.json import Jsonb

from ..db import Connection
from ..memory import SUPERSESSIONS, EventTime, event_columns, event_time

_OUTDATES = ("changed", "reverted")  # the old fact is no longer true: its utterances go with it
MAX_CONFIRMED_IN = 50  # ranges kept per memory, newest last

# Append ranges to a row's metadata.confirmed_in, keeping the newest MAX_CONFIRMED_IN.
_APPEND_RANGES = """
jsonb_set(metadata, '{confirmed_in}', (
    SELECT coalesce(jsonb_agg(e ORDER BY n), '[]'::jsonb) FROM (
        SELECT e, n FROM jsonb_array_elements(coalesce(metadata->'confirmed_in', '[]'::jsonb) || %(ranges)s::jsonb)
             WITH ORDINALITY AS t(e, n)
        ORDER BY n DESC LIMIT %(cap)s) newest))
"""

# The utterances that stated the superseded rows `ids`: in one of their ranges, still active, and
# nearer to the old fact than to any active profile row (the new fact included). A session's episode too, on the
# same rule: an account nearest to the old fact ("the user told Luna she lives in Shanghai") would bring it back
# into the prompt next to the new one; it returns when the old fact is restored, as the utterances do.
_OUTDATE_UTTERANCES = """
WITH x AS (
    SELECT id, embedding, session_id, from_message_id, through_message_id, metadata
    FROM engine.companion_memories WHERE id = ANY(%(ids)s) AND user_id = %(user)s AND instance_id IS NULL
), ranges AS (
    SELECT id AS xid, session_id, from_message_id AS lo, through_message_id AS hi FROM x
    UNION ALL
    SELECT x.id, (e->>'session_id')::uuid, (e->>'from')::bigint, (e->>'through')::bigint
    FROM x, jsonb_array_elements(coalesce(x.metadata->'confirmed_in', '[]'::jsonb)) e
), stated AS (
    SELECT DISTINCT ON (r.id) r.id, rg.xid, r.embedding, r.embedding <=> x.embedding AS distance
    FROM ranges rg
    JOIN x ON x.id = rg.xid
    JOIN engine.companion_memories r ON r.session_id = rg.session_id AND r.user_id = %(user)s
         AND r.instance_id IS NOT NULL AND r.superseded_at IS NULL
         AND r.from_message_id BETWEEN rg.lo AND rg.hi
    ORDER BY r.id, distance
)
UPDATE engine.companion_memories u
SET superseded_at = now(), superseded_by = s.xid, superseded_reason = 'outdated'
FROM stated s
WHERE u.id = s.id
  AND NOT EXISTS (SELECT 1 FROM engine.companion_memories p
                  WHERE p.user_id = %(user)s AND p.instance_id IS NULL AND p.superseded_at IS NULL
                    AND p.category IS NOT NULL AND (p.embedding <=> s.embedding) < s.distance)
RETURNING u.id
"""

# A duplicate merged into its twin hands over where it was said, so the twin's ranges cover it.
_HANDED_OVER = """(
    SELECT coalesce(jsonb_agg(r), '[]'::jsonb) FROM (
        SELECT jsonb_build_object('session_id', g.session_id, 'from', g.from_message_id,
                                  'through', g.through_message_id) AS r
        FROM engine.companion_memories g
        WHERE g.id = ANY(%(gone)s) AND g.user_id = %(user)s AND g.session_id IS NOT NULL
          AND g.from_message_id IS NOT NULL
        UNION ALL
        SELECT e FROM engine.companion_memories g, jsonb_array_elements(coalesce(g.metadata->'confirmed_in',
                                                                                   '[]'::jsonb)) e
        WHERE g.id = ANY(%(gone)s) AND g.user_id = %(user)s) handed)"""
_HAND_OVER_RANGES = ("UPDATE engine.companion_memories SET metadata = "
                     + _APPEND_RANGES.replace("%(ranges)s::jsonb", _HANDED_OVER)
                     + " WHERE id = %(successor)s AND user_id = %(user)s")


def hold_user(conn: Connection, user_id: str) -> None:
    """Take the user's memory lock for the rest of the transaction: the first lock of every transaction that
    changes the user's memories (dreaming's write, the deep pass, the memory API's restore, edit, add and
    delete, erasure), before any row. One lock, first, is the lock order (docs/DESIGN.md, "Locks"): two such
    transactions of one user run one after the other and never wait on each other in a cycle, and a version
    chain is only ever changed by the one transaction that holds it, so a restore cannot miss the head an
    edit is replacing. A transaction-level advisory lock: released at commit or rollback, where RDS Proxy
    multiplexes, so it pins no connection. Users whose keys collide only wait for each other."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('eros.user:' || %s::text, 0))", (user_id,))


def lock(conn: Connection, user_id: str, ids: Iterable[UUID]) -> dict[UUID, EventTime | None]:
    """Row-lock the user's memory rows a transaction is about to change, in id order (under ``hold_user``,
    which already orders the user's writers). Returns each locked row's event time as it is now (what a
    repeat's is merged with)."""
    ids = sorted(set(ids))
    if not ids:
        return {}
    rows = conn.execute("SELECT id, occurred_at, occurred_precision FROM engine.companion_memories"
                        " WHERE id = ANY(%s) AND user_id = %s ORDER BY id FOR UPDATE", (ids, user_id)).fetchall()
    return {r["id"]: event_time(r["occurred_at"], r["occurred_precision"]) for r in rows}


def supersede(conn: Connection, user_id: str, successor: UUID | None, old_ids: Iterable[UUID],
              reason: str) -> list[UUID]:
    """Give the user's active profile rows ``old_ids`` a validity end, replaced by ``successor``: the database
    joins their version chains and the successor's into one (migration 0017). The caller holds ``hold_user``.

    Returns the ids actually superseded (not another user's, not a relationship row, not already
    history, never the successor itself)."""
    if reason not in SUPERSESSIONS:
        raise ValueError(f"unknown supersession reason {reason!r}")
    ids = [i for i in dict.fromkeys(old_ids) if i != successor]
    if not ids:
        return []
    rows = conn.execute(
        "UPDATE engine.companion_memories SET superseded_at = now(), superseded_by = %(successor)s,"
        " superseded_reason = %(reason)s"
        " WHERE id = ANY(%(ids)s) AND user_id = %(user)s AND instance_id IS NULL AND superseded_at IS NULL"
        " RETURNING id",
        {"successor": successor, "reason": reason, "ids": ids, "user": user_id},
    ).fetchall()
    done = [r["id"] for r in rows]
    if done and reason in _OUTDATES:
        outdate_utterances(conn, user_id, done)
    if done and reason == "duplicate" and successor is not None:
        conn.execute(_HAND_OVER_RANGES, {"gone": done, "successor": successor, "user": user_id,
                                         "cap": MAX_CONFIRMED_IN})
    return done


def outdate_utterances(conn: Connection, user_id: str, superseded: list[UUID]) -> None:
    """Supersede ('outdated') the relationship utterances that stated the ``superseded`` facts and are
    nearer to one of them than to any active profile row: what was said of a fact no longer true."""
    conn.execute(_OUTDATE_UTTERANCES, {"ids": superseded, "user": user_id})


def confirm(conn: Connection, user_id: str, memory_id: UUID, importance: float | None = None,
            mentions: int = 1, said_in: tuple[UUID, int, int] | None = None, occurred: EventTime | None = None
            ) -> bool:
    """A repeat of a known active memory: stamp ``last_confirmed_at``, count the mention(s), let the
    importance rise (never fall) to what the repeat says, note where it was said again
    (``said_in``: session, first and last message id) and, given ``occurred``, take that event time (the
    caller merged it: ``eros.memory.later_telling``). False: not the user's active row."""
    ranges = [{"session_id": str(said_in[0]), "from": said_in[1], "through": said_in[2]}] if said_in else []
    occurred_at, precision = event_columns(occurred)
    row = conn.execute(
        "UPDATE engine.companion_memories SET last_confirmed_at = now(), mention_count = mention_count + %(n)s,"
        " importance = CASE WHEN %(importance)s::real IS NULL THEN importance"
        "                   ELSE greatest(coalesce(importance, 0), %(importance)s::real) END,"
        " occurred_at = coalesce(%(occurred_at)s::date, occurred_at),"
        " occurred_precision = coalesce(%(precision)s::text, occurred_precision),"
        " metadata = " + _APPEND_RANGES +
        " WHERE id = %(id)s AND user_id = %(user)s AND instance_id IS NULL AND superseded_at IS NULL"
        " RETURNING id",
        {"n": max(1, mentions), "importance": importance, "id": memory_id, "user": user_id,
         "ranges": Jsonb(ranges), "cap": MAX_CONFIRMED_IN, "occurred_at": occurred_at, "precision": precision},
    ).fetchone()
    return row is not None


def mark_changed(conn: Connection, user_id: str) -> None:
    """The user's profile changed: the deep pass is due for them (again). clock_timestamp(), not the
    transaction's start: the stamp should be as close to the commit as it can, so that a deep pass
    that read the rows before this change committed is not taken for having seen it."""
    conn.execute(
        "INSERT INTO engine.user_deep_pass (user_id, changed_at) VALUES (%s, clock_timestamp())"
        " ON CONFLICT (user_id) DO UPDATE SET changed_at = clock_timestamp()",
        (user_id,),
    )
