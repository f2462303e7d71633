"""Dreaming's data access: the claim, the transcript, and the one guarded write of an extraction.

The claim token is the ``classification_claimed_at`` value a claim set. Every later write of that
extraction is guarded by it (row-locked), so a duplicate delivery, a retry after success, or a
worker whose claim went stale and was re-claimed by another, writes nothing.
"""

from __future__ import annotations

from datetime import datetime, timezone
from uuid import UUID, uuid4

from pgvector import Vector
from psycopg.types.json import Jsonb

from ..db import connection, transaction
from . import consolidation

# The SPEC's claim, verbatim in shape: one statement, FOR UPDATE SKIP LOCKED so concurrent
# sweepers take disjoint sets without blocking; cut-offs computed by the caller and bound.
# It also counts the attempt, so that a session that keeps failing is eventually given up on.
# The claim is stamped with the same application clock the stale cut-off comes from: were it the
# database's now(), an application clock running ahead by more than the stale threshold would
# find every fresh claim already stale and re-claim the same sessions batch after batch.
_CLAIM = """
UPDATE engine.chat_sessions
SET classification_claimed_at = %(now)s,
    classification_attempts = classification_attempts + 1
WHERE id IN (
    SELECT id FROM engine.chat_sessions
    WHERE classified_at IS NULL
      AND last_active_at < %(idle_before)s
      AND (classification_claimed_at IS NULL
           OR classification_claimed_at < %(stale_before)s)
    ORDER BY last_active_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING id, user_id, instance_id, classification_claimed_at AS claim_token
"""


def claim(idle_before: datetime, stale_before: datetime, limit: int, now: datetime | None = None) -> list[dict]:
    """Claim up to ``limit`` idle sessions; ``now`` (default: the application's clock) stamps the claim."""
    now = now or datetime.now(timezone.utc)
    return connection().execute(_CLAIM, {"idle_before": idle_before, "stale_before": stale_before,
                                         "limit": limit, "now": now}).fetchall()


def release(session_id: UUID, claim_token: datetime) -> bool:
    """Give a claim back (its invoke failed) so the next sweep takes the session at once."""
    row = connection().execute(
        "UPDATE engine.chat_sessions SET classification_claimed_at = NULL,"
        " classification_attempts = greatest(classification_attempts - 1, 0)"
        " WHERE id = %s AND classification_claimed_at = %s RETURNING id",
        (session_id, claim_token),
    ).fetchone()
    return row is not None


def claimed_session(session_id: UUID, claim_token: datetime) -> dict | None:
    """The session if this claim still holds it (None: duplicate delivery, done, or re-claimed)."""
    return connection().execute(
        "SELECT id, user_id, instance_id, classified_through_message_id AS watermark, classification_attempts"
        " FROM engine.chat_sessions WHERE id = %s AND classification_claimed_at = %s AND classified_at IS NULL",
        (session_id, claim_token),
    ).fetchone()


def transcript(session_id: UUID, after_id: int | None, context_messages: int, limit: int) -> tuple[list, list]:
    """(earlier messages given as context, new messages to extract), each oldest first."""
    conn = connection()
    new = conn.execute(
        "SELECT id, role, content FROM engine.chat_messages WHERE session_id = %s AND id > %s"
        " ORDER BY id LIMIT %s",
        (session_id, after_id or 0, limit),
    ).fetchall()
    earlier = []
    if after_id and context_messages > 0:
        earlier = conn.execute(
            "SELECT id, role, content FROM engine.chat_messages WHERE session_id = %s AND id <= %s"
            " ORDER BY id DESC LIMIT %s",
            (session_id, after_id, context_messages),
        ).fetchall()[::-1]
    return earlier, new


# The known memories a session touches, found with no provider call: each new user turn of the
# session already has its vector in the relationship layer (the chat turn paid for it), so the
# active profile rows nearest to those turns are what the session is likely to confirm or change.
# Per turn the nearest ``limit`` (an exact scan of the user's active rows through the partial
# profile index), then the best of those overall. Rows at the same distance (a lexical embedder puts
# every row that shares no word with the session at one distance) go by importance, then the newest:
# the facts a change is most likely to touch ("lives in", "works at") are the important ones.
_TOUCHED = """
WITH turns AS (
    SELECT embedding FROM engine.companion_memories
    WHERE session_id = %(session)s AND instance_id IS NOT NULL AND from_message_id > %(after)s
    ORDER BY from_message_id DESC
    LIMIT %(turns)s
), near AS (
    SELECT m.* FROM turns t CROSS JOIN LATERAL (
        SELECT id, content, category, importance, created_at, embedding <=> t.embedding AS distance
        FROM engine.companion_memories
        WHERE user_id = %(user)s AND instance_id IS NULL AND superseded_at IS NULL AND category IS NOT NULL
        ORDER BY distance, importance DESC NULLS LAST, created_at DESC, id
        LIMIT %(limit)s
    ) m
)
SELECT id, content, category, importance, created_at, min(distance) AS distance
FROM near
GROUP BY id, content, category, importance, created_at
ORDER BY min(distance), importance DESC NULLS LAST, created_at DESC, id
LIMIT %(limit)s
"""


def touched_memories(user_id: str, session_id: UUID, after_id: int | None, limit: int,
                     turns: int = 20) -> list[dict]:
    """The user's active profile memories nearest to this session's last ``turns`` new user turns,
    nearest first."""
    return connection().execute(_TOUCHED, {"session": session_id, "after": after_id or 0, "user": user_id,
                                           "turns": turns, "limit": limit}).fetchall()


def _locked(conn, session_id: UUID, claim_token: datetime) -> bool:
    return conn.execute(
        "SELECT 1 FROM engine.chat_sessions WHERE id = %s AND classification_claimed_at = %s"
        " AND classified_at IS NULL FOR UPDATE",
        (session_id, claim_token),
    ).fetchone() is not None


def finish(session: dict, claim_token: datetime, memories: list[dict], through_message_id: int | None,
           error: str | None, confirm: list[tuple[UUID, float]] = (), from_message_id: int | None = None
           ) -> dict | None:
    """ONE transaction: insert the profile rows, apply their consolidation, and stamp the session,
    only if the claim still holds.

    Each memory may carry ``id`` and ``supersedes`` (ids of known rows it replaces); ``confirm`` are
    known rows the session repeated (noted with the session's message range, ``from_message_id`` to
    ``through_message_id``). Only the user's own active profile rows are touched; whatever
    else was asked is counted as ``ignored``. The session is stamped ``classified_at`` unless
    messages beyond ``through_message_id`` exist (turns that arrived meanwhile, or windows not read
    yet): then it stays eligible for the next sweep, which starts from the new watermark.
    Returns the counts, or None when the claim was lost (nothing written).
    """
    counts = {"inserted": len(memories), "superseded": 0, "confirmed": 0, "ignored": 0}
    user = session["user_id"]
    with transaction() as conn:
        if not _locked(conn, session["id"], claim_token):
            return None
        consolidation.lock(conn, user, [i for m in memories for i in m.get("supersedes") or []]
                           + [memory_id for memory_id, _ in confirm])
        if memories:
            rows = [m | {"id": m.get("id") or uuid4()} for m in memories]
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO engine.companion_memories (id, session_id, user_id, instance_id, content, embedding,"
                    " category, importance, source, from_message_id, through_message_id, metadata)"
                    " VALUES (%s, %s, %s, NULL, %s, %s, %s, %s, 'dreaming', %s, %s, %s)",
                    [(m["id"], session["id"], user, m["content"], Vector(m["embedding"]), m["category"],
                      m["importance"], m.get("from_message_id"), m.get("through_message_id"), Jsonb(m["metadata"]))
                     for m in rows],
                )
            for m in rows:
                asked = m.get("supersedes") or []
                done = consolidation.supersede(conn, user, m["id"], asked, "changed") if asked else []
                counts["superseded"] += len(done)
                counts["ignored"] += len(asked) - len(done)
        said_in = (session["id"], from_message_id, through_message_id) if from_message_id and through_message_id \
            else None
        for memory_id, importance in confirm:
            ok = consolidation.confirm(conn, user, memory_id, importance, said_in=said_in)
            counts["confirmed" if ok else "ignored"] += 1
        if memories or counts["superseded"]:
            consolidation.mark_changed(conn, user)
        conn.execute(
            "UPDATE engine.chat_sessions SET"
            " classified_through_message_id = coalesce(%(through)s, classified_through_message_id),"
            " classified_at = CASE WHEN EXISTS (SELECT 1 FROM engine.chat_messages WHERE session_id = %(id)s"
            "     AND id > coalesce(%(through)s, classified_through_message_id, 0)) THEN NULL ELSE now() END,"
            " classification_claimed_at = NULL, classification_error = %(error)s,"
            " classification_attempts = 0"
            " WHERE id = %(id)s",
            {"id": session["id"], "through": through_message_id, "error": error},
        )
    return counts


def give_up(session: dict, claim_token: datetime, error: str) -> bool:
    """Stamp the session with the error without extracting (attempts exhausted). Nothing else changes."""
    with transaction() as conn:
        if not _locked(conn, session["id"], claim_token):
            return False
        conn.execute(
            "UPDATE engine.chat_sessions SET classified_at = now(), classification_claimed_at = NULL,"
            " classification_error = %s WHERE id = %s",
            (error, session["id"]),
        )
    return True


def record_failure(session_id: UUID, claim_token: datetime, error: str) -> None:
    """Note a retryable failure; the claim stays (Lambda's retry reuses it; if all fail it goes stale)."""
    connection().execute(
        "UPDATE engine.chat_sessions SET classification_error = %s WHERE id = %s AND classification_claimed_at = %s",
        (error[:1000], session_id, claim_token),
    )
