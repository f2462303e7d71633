"""Dreaming's data access: the claim, the transcript, and the one guarded write of an extraction.

The claim token is the ``classification_claimed_at`` value a claim set. Every later write of that
extraction is guarded by it (row-locked), so a duplicate delivery, a retry after success, or a
worker whose claim went stale and was re-claimed by another, writes nothing.
"""

from __future__ import annotations

from datetime import datetime, timezone
from uuid import UUID

from pgvector import Vector
from psycopg.types.json import Jsonb

from ..db import connection, transaction

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


def _locked(conn, session_id: UUID, claim_token: datetime) -> bool:
    return conn.execute(
        "SELECT 1 FROM engine.chat_sessions WHERE id = %s AND classification_claimed_at = %s"
        " AND classified_at IS NULL FOR UPDATE",
        (session_id, claim_token),
    ).fetchone() is not None


def finish(session: dict, claim_token: datetime, memories: list[dict], through_message_id: int | None,
           error: str | None) -> bool:
    """ONE transaction: insert the profile rows and stamp the session, only if the claim still holds.

    The session is stamped ``classified_at`` unless messages beyond ``through_message_id`` exist
    (turns that arrived meanwhile, or windows not read yet): then it stays eligible for the next
    sweep, which starts from the new watermark. Returns False when the claim was lost (nothing written).
    """
    with transaction() as conn:
        if not _locked(conn, session["id"], claim_token):
            return False
        if memories:
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO engine.companion_memories"
                    " (session_id, user_id, instance_id, content, embedding, category, importance, metadata)"
                    " VALUES (%s, %s, NULL, %s, %s, %s, %s, %s)",
                    [(session["id"], session["user_id"], m["content"], Vector(m["embedding"]), m["category"],
                      m["importance"], Jsonb(m["metadata"])) for m in memories],
                )
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
    return True


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
