"""Personas, persona instances, sessions and messages."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from uuid import UUID

from pgvector import Vector
from psycopg.types.json import Jsonb

from ..db import connection, one, transaction
from . import usage
from .rows import (
    Message,
    OpenedTurn,
    Persona,
    RecordedTurn,
    Session,
    SessionWithDreaming,
    SessionWithPersona,
    TurnMessages,
)


def list_personas() -> list[Persona]:
    return connection().execute("SELECT id, name, description FROM engine.personas ORDER BY id").fetchall()


def create_session(user_id: str, persona_id: str) -> Session | None:
    """A new session with the user's instance of the persona (created on first use). None: no such persona."""
    with transaction() as conn:
        instance = conn.execute(
            "INSERT INTO engine.persona_instances (user_id, persona_id)"
            " SELECT %(user)s, id FROM engine.personas WHERE id = %(persona)s"
            " ON CONFLICT (user_id, persona_id) DO UPDATE SET user_id = EXCLUDED.user_id"
            " RETURNING id",
            {"user": user_id, "persona": persona_id},
        ).fetchone()
        if instance is None:
            return None
        return one(conn.execute(
            "INSERT INTO engine.chat_sessions (user_id, instance_id) VALUES (%s, %s)"
            " RETURNING id, instance_id, created_at, last_active_at",
            (user_id, instance["id"]),
        )) | {"persona_id": persona_id}


_SESSION_COLUMNS = (
    "s.id, s.instance_id, i.persona_id, s.created_at, s.last_active_at, s.extracted_at"
)

# New messages: the session is active again and, if it was extracted (or given up on), eligible for dreaming
# again with a fresh attempts budget; extraction resumes after its watermark. (Completed with a WHERE.)
_TOUCH = ("UPDATE engine.chat_sessions SET last_active_at = now(), extracted_at = NULL,"
          " extraction_attempts = 0 WHERE user_id = %(user)s AND id = %(session)s")


# Where a session is in dreaming, from its bookkeeping columns (migrations 0002, 0005, 0008), first match:
# failed (given up; its error says why), extracted (through its last message), claimed (a sweep took it),
# retrying (a failure's backoff), active (not quiet for DREAMING_IDLE_SECS yet), else waiting for a sweep.
_DREAMING_STATE = """CASE WHEN s.extraction_gave_up IS NOT NULL THEN 'failed'
    WHEN s.extracted_at IS NOT NULL THEN 'extracted'
    WHEN s.extraction_claimed_at IS NOT NULL THEN 'claimed'
    WHEN s.extraction_next_attempt_at > now() THEN 'retrying'
    WHEN s.last_active_at > now() - make_interval(secs => %(idle)s) THEN 'active'
    ELSE 'waiting' END"""


def list_sessions(user_id: str, idle_secs: int, limit: int = 100) -> list[SessionWithDreaming]:
    """The user's sessions, newest first, each with where it is in dreaming (``_DREAMING_STATE``), the
    error of its last failed attempt, its attempts, and when it is due: quiet enough (active) or retried."""
    rows = connection().execute(
        f"SELECT {_SESSION_COLUMNS}, {_DREAMING_STATE} AS state, s.extraction_error AS error,"
        " s.extraction_attempts AS attempts,"
        " CASE WHEN s.extraction_next_attempt_at > now() THEN s.extraction_next_attempt_at"
        "      ELSE s.last_active_at + make_interval(secs => %(idle)s) END AS due_at"
        " FROM engine.chat_sessions s JOIN engine.persona_instances i ON i.id = s.instance_id"
        " WHERE s.user_id = %(user)s ORDER BY s.created_at DESC LIMIT %(limit)s",
        {"user": user_id, "idle": idle_secs, "limit": limit},
    ).fetchall()
    return [{"id": r["id"], "instance_id": r["instance_id"], "persona_id": r["persona_id"],
             "created_at": r["created_at"], "last_active_at": r["last_active_at"], "extracted_at": r["extracted_at"],
             "dreaming": {"state": r["state"], "error": r["error"], "attempts": r["attempts"], "due_at": r["due_at"]}}
            for r in rows]


def get_session(user_id: str, session_id: UUID) -> SessionWithPersona | None:
    """The session with its persona's prompt, only if it belongs to this user."""
    return connection().execute(
        f"SELECT {_SESSION_COLUMNS}, p.name AS persona_name, p.system_prompt FROM engine.chat_sessions s"
        " JOIN engine.persona_instances i ON i.id = s.instance_id"
        " JOIN engine.personas p ON p.id = i.persona_id"
        " WHERE s.id = %s AND s.user_id = %s",
        (session_id, user_id),
    ).fetchone()


def find_turn(user_id: str, session_id: UUID, client_turn_id: str) -> TurnMessages:
    """The messages already stored for this turn, by role (a retry finds its first attempt here)."""
    rows = connection().execute(
        "SELECT id, role, content, metadata FROM engine.chat_messages"
        " WHERE user_id = %s AND session_id = %s AND client_turn_id = %s",
        (user_id, session_id, client_turn_id),
    ).fetchall()
    return {row["role"]: row for row in rows}


# A turn's first statement (``open_turn``): everything a turn does before its model calls, in one round
# trip and one implicit transaction. Its parts:
# * session: the session with its persona, only if it belongs to this user (another user's is not found:
#   nothing below runs for it, since every part reads `session`);
# * earlier: the messages already stored under this turn id (a retry's first attempt);
# * to_admit / admitted (usage.ADMISSION): the turn counted against the spend limits, when they are on and
#   the turn is not the retry of an answered turn with the same message (a replay is never limited);
# * claimed: the user's message, stored before any model call, claiming the turn id (the UNIQUE
#   (session_id, client_turn_id, role) constraint decides between concurrent senders), only when there is
#   none yet and the turn was admitted; touched: the session's activity, when the message was stored;
# * the history the prompt carries (the last `history` messages, the turn's own excluded), oldest first.
# The admission locks the usage row before the session row is touched, as record_turn does: concurrent turns
# of one user take the two locks in one order. Reads see the statement's snapshot: a concurrent sender that
# stored its message after it began is neither in `earlier` nor beaten by `claimed` (ON CONFLICT waits for it,
# then does nothing); the caller then finds it with claim_turn.
_OPEN_TURN = f"""
WITH session AS (
    SELECT {_SESSION_COLUMNS}, p.name AS persona_name, p.system_prompt FROM engine.chat_sessions s
    JOIN engine.persona_instances i ON i.id = s.instance_id
    JOIN engine.personas p ON p.id = i.persona_id
    WHERE s.id = %(session)s AND s.user_id = %(user)s
), earlier AS (
    SELECT m.id, m.role, m.content, m.metadata FROM engine.chat_messages m
    WHERE m.user_id = %(user)s AND m.session_id = (SELECT id FROM session) AND m.client_turn_id = %(turn)s
), to_admit AS (
    SELECT FROM session
    WHERE %(limited)s AND NOT EXISTS (SELECT FROM earlier a JOIN earlier u ON u.role = 'user'
                                      WHERE a.role = 'assistant' AND u.content = %(content)s)
), {usage.ADMISSION}, claimed AS (
    INSERT INTO engine.chat_messages (session_id, user_id, role, content, client_turn_id)
    SELECT id, %(user)s, 'user', %(content)s, %(turn)s FROM session
    WHERE NOT EXISTS (SELECT FROM earlier WHERE role = 'user') AND (NOT %(limited)s OR EXISTS (SELECT FROM admitted))
    ON CONFLICT (session_id, client_turn_id, role, user_id) DO NOTHING
    RETURNING id
), touched AS (
    {_TOUCH} AND EXISTS (SELECT FROM claimed)
)
SELECT session.*, (SELECT id FROM claimed) AS claimed_id,
       NOT %(limited)s OR EXISTS (SELECT FROM admitted) AS admitted,
       (SELECT coalesce(jsonb_object_agg(role, to_jsonb(earlier)), '{{}}') FROM earlier) AS earlier,
       (SELECT coalesce(jsonb_agg(h ORDER BY h.id), '[]') FROM (
            SELECT id, role, content FROM engine.chat_messages
            WHERE user_id = %(user)s AND session_id = %(session)s AND client_turn_id <> %(turn)s
            ORDER BY id DESC LIMIT %(history)s) h
       ) AS history
FROM session
"""


def open_turn(user_id: str, session_id: UUID, content: str, client_turn_id: str, *, history: int,
              now: datetime, turns_per_minute: int = 0, daily_budget: int = 0) -> OpenedTurn | None:
    """Open a turn in one statement (see ``_OPEN_TURN``): the session (None: not this user's, or none), the
    messages stored under the turn id (the user's message just stored, or a retry's earlier attempt; empty
    when a concurrent sender's came first: see ``claim_turn``), whether the spend limits admitted the turn
    (counting it), and the prompt's history."""
    values = {"user": user_id, "session": session_id, "turn": client_turn_id, "content": content,
              "history": history} | usage.admission(now, turns_per_minute, daily_budget)
    row = connection().execute(_OPEN_TURN, values).fetchone()
    if row is None:
        return None
    claimed, admitted, turn, messages = (row.pop(k) for k in ("claimed_id", "admitted", "earlier", "history"))
    if claimed is not None:
        turn = {"user": {"id": claimed, "role": "user", "content": content, "metadata": {}}}
    return {"session": row, "turn": turn, "admitted": admitted, "history": messages}


def list_messages(user_id: str, session_id: UUID, limit: int, before: int | None) -> list[Message]:
    """A page of history, newest first; ``before`` is the id of the oldest message of the previous page. A
    reply carries what its prompt recalled (ids, layers, categories and scores, as the turn stored them)."""
    return connection().execute(
        "SELECT id, role, content, client_turn_id, sent_at,"
        " CASE WHEN role = 'assistant' THEN coalesce(metadata->'recalled', '[]'::jsonb) END AS recalled"
        " FROM engine.chat_messages"
        " WHERE user_id = %s AND session_id = %s AND (%s::bigint IS NULL OR id < %s) ORDER BY id DESC LIMIT %s",
        (user_id, session_id, before, before, limit),
    ).fetchall()


def claim_turn(user_id: str, session_id: UUID, content: str, client_turn_id: str) -> TurnMessages:
    """Store the user's message of a turn before any model call, claiming ``client_turn_id`` for it: what
    ``open_turn`` does, for the turn whose ``open_turn`` found a concurrent sender's message in its way but
    not in its snapshot (the rare race, at a few round trips more; the turn was admitted already).

    The message is committed first, so that nothing typed is lost whatever happens to the model call,
    and so that the UNIQUE (session_id, client_turn_id, role) constraint decides which of several
    concurrent senders of one turn id owns it: exactly one insert wins; the others (they wait for the
    winner's commit) find its message. Returns the turn's messages by role, as ``find_turn`` does: the
    caller compares the stored user message with its own (another content is a conflict) and replays a
    stored reply."""
    for _ in range(3):
        with transaction() as conn:
            row = _insert_message(conn, user_id, session_id, "user", content, client_turn_id, {})
            if row is not None:
                _touch(conn, user_id, session_id)
                return {"user": {"id": row["id"], "role": "user", "content": content, "metadata": {}}}
        turn = find_turn(user_id, session_id, client_turn_id)
        if "user" in turn:
            return turn
        # The conflicting row went away between the two statements (its session was deleted): try again.
    raise RuntimeError(f"could not claim turn {client_turn_id!r}")


# A turn's last statement (``record_turn``): its reply and what goes with it, in one round trip and one
# implicit transaction (a statement's data-modifying CTEs commit or fail together). Its parts:
# * spent, itemised (usage.spending): the turn's provider calls, recorded even if a concurrent sender's
#   reply wins (they were paid for); they run first (`reply` reads them), so that the usage rows are locked
#   before the session row, in the order open_turn takes them;
# * reply: the assistant's message, unless a concurrent sender of the same message stored one first;
# * touched and utterance, only with the reply: the session's activity, and the user's message in the
#   relationship layer (with the embedding recall already paid for).
_RECORD_TURN = f"""
WITH {usage.spending()}, reply AS (
    INSERT INTO engine.chat_messages (session_id, user_id, role, content, client_turn_id, metadata)
    SELECT %(session)s, %(user)s, 'assistant', %(reply)s, %(turn)s, %(metadata)s
    FROM (SELECT count(*) FROM itemised) usage_first
    ON CONFLICT (session_id, client_turn_id, role, user_id) DO NOTHING
    RETURNING id
), touched AS (
    {_TOUCH} AND EXISTS (SELECT FROM reply)
), utterance AS (
    INSERT INTO engine.companion_memories (session_id, user_id, instance_id, content, embedding, source,
                                           from_message_id, through_message_id, metadata)
    SELECT %(session)s, %(user)s, %(instance)s, %(content)s, %(embedding)s, 'utterance', %(message)s,
           %(message)s, %(utterance_metadata)s FROM reply
)
SELECT id FROM reply
"""


def record_turn(session: SessionWithPersona, user_id: str, user_message_id: int, content: str, client_turn_id: str,
                reply: str, reply_metadata: dict, embedding: list[float], embed_model: str,
                spent: Sequence[usage.Call] = ()) -> RecordedTurn:
    """One statement (see ``_RECORD_TURN``): the ``spent`` provider calls of the turn, the reply to the
    user's message (stored by ``open_turn``), the session's activity and the utterance in the relationship
    layer. Returns both message ids, or ``replayed`` when a concurrent sender of the same message recorded
    its reply first (keep that one)."""
    assistant = connection().execute(_RECORD_TURN, usage.calls(user_id, usage.utcnow(), spent) | {
        "session": session["id"], "instance": session["instance_id"], "turn": client_turn_id, "reply": reply,
        "metadata": Jsonb(reply_metadata), "content": content, "embedding": Vector(embedding),
        "message": user_message_id, "utterance_metadata": Jsonb({"message_id": user_message_id,
                                                                 "embed_model": embed_model}),
    }).fetchone()
    if assistant is None:
        return {"replayed": True}
    return {"replayed": False, "user_message_id": user_message_id, "assistant_message_id": assistant["id"]}


def _insert_message(conn, user_id, session_id, role, content, client_turn_id, metadata) -> dict | None:
    """Insert one message of a turn; None if that turn already has a message of this role."""
    return conn.execute(
        "INSERT INTO engine.chat_messages (session_id, user_id, role, content, client_turn_id, metadata)"
        " VALUES (%s, %s, %s, %s, %s, %s)"
        " ON CONFLICT (session_id, client_turn_id, role, user_id) DO NOTHING RETURNING id",
        (session_id, user_id, role, content, client_turn_id, Jsonb(metadata)),
    ).fetchone()


def _touch(conn, user_id, session_id) -> None:
    conn.execute(_TOUCH, {"user": user_id, "session": session_id})
