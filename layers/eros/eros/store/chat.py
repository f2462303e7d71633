"""Personas, persona instances, sessions and messages."""

from __future__ import annotations

from uuid import UUID

from pgvector import Vector
from psycopg.types.json import Jsonb

from ..db import connection, one, transaction
from . import usage
from .rows import Message, Persona, RecordedTurn, Session, SessionWithPersona, TurnMessages


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


def list_sessions(user_id: str, limit: int = 100) -> list[Session]:
    return connection().execute(
        f"SELECT {_SESSION_COLUMNS} FROM engine.chat_sessions s"
        " JOIN engine.persona_instances i ON i.id = s.instance_id"
        " WHERE s.user_id = %s ORDER BY s.created_at DESC LIMIT %s",
        (user_id, limit),
    ).fetchall()


def get_session(user_id: str, session_id: UUID) -> SessionWithPersona | None:
    """The session with its persona's prompt, only if it belongs to this user."""
    return connection().execute(
        f"SELECT {_SESSION_COLUMNS}, p.name AS persona_name, p.system_prompt FROM engine.chat_sessions s"
        " JOIN engine.persona_instances i ON i.id = s.instance_id"
        " JOIN engine.personas p ON p.id = i.persona_id"
        " WHERE s.id = %s AND s.user_id = %s",
        (session_id, user_id),
    ).fetchone()


def find_turn(session_id: UUID, client_turn_id: str) -> TurnMessages:
    """The messages already stored for this turn, by role (a retry finds its first attempt here)."""
    rows = connection().execute(
        "SELECT id, role, content, metadata FROM engine.chat_messages"
        " WHERE session_id = %s AND client_turn_id = %s",
        (session_id, client_turn_id),
    ).fetchall()
    return {row["role"]: row for row in rows}


def recent_messages(session_id: UUID, limit: int, exclude_turn: str | None = None) -> list[Message]:
    """The last ``limit`` messages, oldest first (the prompt's history)."""
    rows = connection().execute(
        "SELECT id, role, content FROM engine.chat_messages"
        " WHERE session_id = %s AND client_turn_id IS DISTINCT FROM %s ORDER BY id DESC LIMIT %s",
        (session_id, exclude_turn, limit),
    ).fetchall()
    return rows[::-1]


def list_messages(session_id: UUID, limit: int, before: int | None) -> list[Message]:
    """A page of history, newest first; ``before`` is the id of the oldest message of the previous page."""
    return connection().execute(
        "SELECT id, role, content, client_turn_id, sent_at FROM engine.chat_messages"
        " WHERE session_id = %s AND (%s::bigint IS NULL OR id < %s) ORDER BY id DESC LIMIT %s",
        (session_id, before, before, limit),
    ).fetchall()


def claim_turn(session_id: UUID, content: str, client_turn_id: str) -> TurnMessages:
    """Store the user's message of a turn before any model call, claiming ``client_turn_id`` for it.

    The message is committed first, so that nothing typed is lost whatever happens to the model call,
    and so that the UNIQUE (session_id, client_turn_id, role) constraint decides which of several
    concurrent senders of one turn id owns it: exactly one insert wins; the others (they wait for the
    winner's commit) find its message. Returns the turn's messages by role, as ``find_turn`` does: the
    caller compares the stored user message with its own (another content is a conflict) and replays a
    stored reply."""
    for _ in range(3):
        with transaction() as conn:
            row = _insert_message(conn, session_id, "user", content, client_turn_id, {})
            if row is not None:
                _touch(conn, session_id)
                return {"user": {"id": row["id"], "role": "user", "content": content, "metadata": {}}}
        turn = find_turn(session_id, client_turn_id)
        if "user" in turn:
            return turn
        # The conflicting row went away between the two statements (its session was deleted): try again.
    raise RuntimeError(f"could not claim turn {client_turn_id!r}")


def record_turn(session: SessionWithPersona, user_id: str, user_message_id: int, content: str, client_turn_id: str,
                reply: str, reply_metadata: dict, embedding: list[float], embed_model: str, tokens: int = 0
                ) -> RecordedTurn:
    """One transaction: the tokens the turn's provider calls cost (paid even if a concurrent sender's
    reply wins), the reply to the user's message (stored by ``claim_turn``), the session's activity, and
    the utterance in the relationship layer. Returns both message ids, or ``replayed`` when a concurrent
    sender of the same message recorded its reply first (keep that one)."""
    with transaction() as conn:
        usage.record(user_id, tokens, "chat", usage.utcnow(), conn)
        assistant = _insert_message(conn, session["id"], "assistant", reply, client_turn_id, reply_metadata)
        if assistant is None:
            return {"replayed": True}
        _touch(conn, session["id"])
        conn.execute(
            "INSERT INTO engine.companion_memories (session_id, user_id, instance_id, content, embedding, source,"
            " from_message_id, through_message_id, metadata) VALUES (%s, %s, %s, %s, %s, 'utterance', %s, %s, %s)",
            (session["id"], user_id, session["instance_id"], content, Vector(embedding), user_message_id,
             user_message_id, Jsonb({"message_id": user_message_id, "embed_model": embed_model})),
        )
    return {"replayed": False, "user_message_id": user_message_id, "assistant_message_id": assistant["id"]}


def _insert_message(conn, session_id, role, content, client_turn_id, metadata) -> dict | None:
    """Insert one message of a turn; None if that turn already has a message of this role."""
    return conn.execute(
        "INSERT INTO engine.chat_messages (session_id, role, content, client_turn_id, metadata)"
        " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (session_id, client_turn_id, role) DO NOTHING RETURNING id",
        (session_id, role, content, client_turn_id, Jsonb(metadata)),
    ).fetchone()


def _touch(conn, session_id) -> None:
    """New messages: the session is active again and, if it was extracted (or given up on), eligible for
    dreaming again with a fresh attempts budget; extraction resumes after its watermark."""
    conn.execute("UPDATE engine.chat_sessions SET last_active_at = now(), extracted_at = NULL,"
                 " extraction_attempts = 0 WHERE id = %s", (session_id,))
