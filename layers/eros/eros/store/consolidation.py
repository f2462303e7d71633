"""Consolidation's writes: supersede, confirm, and "this user's memory changed".

Shared by write-time consolidation (``store.dreaming.finish``), the per-user deep pass and the
memory API. Every function takes the connection of a transaction the caller already holds (the
claim-guarded one), and re-checks ownership in SQL: a row is touched only if it belongs to the
user, is in the profile layer, and is still active. What a model names beyond that is ignored
and counted by the caller (applied < asked).
"""

from __future__ import annotations

from typing import Iterable
from uuid import UUID

import psycopg

REASONS = ("changed", "duplicate", "reverted", "edited")


def lock(conn: psycopg.Connection, user_id: str, ids: Iterable[UUID]) -> None:
    """Row-lock the user's memory rows a transaction is about to change, in id order. Every writer
    (dreaming, the deep pass, restore) takes memory rows in this one order before the user's
    consolidation row, so two writers never wait on each other in a cycle."""
    ids = sorted(set(ids))
    if ids:
        conn.execute("SELECT id FROM engine.companion_memories WHERE id = ANY(%s) AND user_id = %s"
                     " ORDER BY id FOR UPDATE", (ids, user_id)).fetchall()


def supersede(conn: psycopg.Connection, user_id: str, successor: UUID | None, old_ids: Iterable[UUID],
              reason: str) -> list[UUID]:
    """Give the user's active profile rows ``old_ids`` a validity end, replaced by ``successor``.

    Returns the ids actually superseded (not another user's, not a relationship row, not already
    history, never the successor itself)."""
    if reason not in REASONS:
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
    return [r["id"] for r in rows]


def confirm(conn: psycopg.Connection, user_id: str, memory_id: UUID, importance: float | None = None,
            mentions: int = 1) -> bool:
    """A repeat of a known active memory: stamp ``last_confirmed_at``, count the mention(s), and
    let the importance rise (never fall) to what the repeat says. False: not the user's active row."""
    row = conn.execute(
        "UPDATE engine.companion_memories SET last_confirmed_at = now(), mention_count = mention_count + %(n)s,"
        " importance = CASE WHEN %(importance)s::real IS NULL THEN importance"
        "                   ELSE greatest(coalesce(importance, 0), %(importance)s::real) END"
        " WHERE id = %(id)s AND user_id = %(user)s AND instance_id IS NULL AND superseded_at IS NULL"
        " RETURNING id",
        {"n": max(1, mentions), "importance": importance, "id": memory_id, "user": user_id},
    ).fetchone()
    return row is not None


def mark_changed(conn: psycopg.Connection, user_id: str) -> None:
    """The user's profile changed: the deep pass is due for them (again). clock_timestamp(), not the
    transaction's start: the stamp should be as close to the commit as it can, so that a deep pass
    that read the rows before this change committed is not taken for having seen it."""
    conn.execute(
        "INSERT INTO engine.user_consolidation (user_id, changed_at) VALUES (%s, clock_timestamp())"
        " ON CONFLICT (user_id) DO UPDATE SET changed_at = clock_timestamp()",
        (user_id,),
    )
