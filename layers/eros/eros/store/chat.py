"""Personas, persona instances, sessions and messages."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from uuid import UUID

import psycopg
from pgvector import Vector
from psycopg.types.json import Jsonb

from ..db import connection, one, transaction
from ..errors import ClientError
from . import usage
from .rows import (
    Message,
    OpenedTurn,
    Persona,
    RecordedTurn,
    Session,
    SessionWithDreaming,
    SessionWithPersona,
    StoredMessage,
    Transcript,
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


def get_session(user_id: str, session_id: UUID, *, history: int = 0) -> SessionWithPersona | None:
    """The session with its persona's prompt, only if it belongs to this user; with ``history``, also its last
    ``history`` messages, oldest first (what a prompt's history is, as engine.open_turn_v2 reads it for a turn)."""
    return connection().execute(
        f"SELECT {_SESSION_COLUMNS}, p.name AS persona_name, p.system_prompt"
        + (", (SELECT coalesce(jsonb_agg(h ORDER BY h.id), '[]') FROM ("
           "   SELECT m.id, m.role, m.content FROM engine.chat_messages m"
           "   WHERE m.user_id = s.user_id AND m.session_id = s.id ORDER BY m.id DESC LIMIT %(history)s) h) AS history"
           if history else "")
        + " FROM engine.chat_sessions s"
        " JOIN engine.persona_instances i ON i.id = s.instance_id"
        " JOIN engine.personas p ON p.id = i.persona_id"
        " WHERE s.id = %(session)s AND s.user_id = %(user)s",
        {"session": session_id, "user": user_id, "history": history},
    ).fetchone()


def find_turn(user_id: str, session_id: UUID, client_turn_id: str) -> TurnMessages:
    """The messages already stored for this turn, by role (a retry finds its first attempt here)."""
    rows = connection().execute(
        "SELECT id, role, content, metadata FROM engine.chat_messages"
        " WHERE user_id = %s AND session_id = %s AND client_turn_id = %s",
        (user_id, session_id, client_turn_id),
    ).fetchall()
    return {row["role"]: row for row in rows}


# A turn's first and last statements are functions in the database (eros/sql/functions/turn.sql, which says what
# each part does and why), so that a connection plans them once, not on every turn; recall's is engine.turn_recall.
_OPEN_TURN = ("SELECT * FROM engine.open_turn_v2(%(user)s::text, %(session)s::uuid, %(turn)s::text, %(content)s::text,"
              " %(history)s::int, %(limited)s::boolean, %(day)s::date, %(window)s::timestamptz, %(rate)s::int,"
              " %(budget)s::bigint, %(at)s::timestamptz, %(reserve)s::bigint, %(until)s::timestamptz)")
_RECORD_TURN = ("SELECT engine.record_turn(%(user)s::text, %(session)s::uuid, %(instance)s::uuid, %(turn)s::text,"
                " %(reply)s::text, %(metadata)s::jsonb, %(content)s::text, %(message)s::bigint, %(embedding)s::vector,"
                " %(utterance_metadata)s::jsonb, %(day)s::date, %(purposes)s::text[], %(models)s::text[],"
                " %(inputs)s::bigint[], %(outputs)s::bigint[], %(reservation)s::uuid) AS id")
# What engine.record_turn raises when the turn's session is gone (an erasure deleted it meanwhile: turn.sql).
SESSION_GONE = "EG409"


class SessionGone(ClientError):
    """The turn's session was deleted while the turn ran (DELETE /v1/me): nothing of the turn was stored or
    counted."""
    status, code = 409, "session_gone"

    def __init__(self) -> None:
        super().__init__("the session was deleted while this turn was running (the user's data was erased); "
                         "nothing was stored", retryable=False)


def open_turn(user_id: str, session_id: UUID, content: str, client_turn_id: str, *, history: int,
              now: datetime, turns_per_minute: int = 0, daily_budget: int = 0, reserve: int = 0) -> OpenedTurn | None:
    """Open a turn in one statement (engine.open_turn_v2): the session (None: not this user's, or none), the
    messages stored under the turn id (the user's message just stored, or a retry's earlier attempt; empty
    when a concurrent sender's came first: see ``claim_turn``), whether the spend limits admitted the turn
    (counting it, and reserving ``reserve`` tokens plus its prompt's text under a budget), and the prompt's
    history."""
    values = {"user": user_id, "session": session_id, "turn": client_turn_id, "content": content,
              "history": history} | usage.admission(now, turns_per_minute, daily_budget, reserve)
    row = connection().execute(_OPEN_TURN, values).fetchone()
    if row is None:
        return None
    claimed, admitted, reservation, reserved, stored, messages = (
        row.pop(k) for k in ("claimed_id", "admitted", "reservation", "reserved", "earlier", "history"))
    if claimed is not None:
        stored = {"user": {"id": claimed, "role": "user", "content": content, "metadata": {}}}
    return {"session": row, "stored": stored, "admitted": admitted, "history": messages,
            "reserved": usage.Admitted(values["day"], reservation), "tokens_reserved": reserved}


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
    and so that the UNIQUE (session_id, client_turn_id, role, user_id) constraint (migration 0013) decides which
    of several concurrent senders of one turn id owns it: exactly one insert wins; the others (they wait for the
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


def record_turn(session: SessionWithPersona, user_id: str, user_message_id: int, content: str, client_turn_id: str,
                reply: str, reply_metadata: dict, embedding: list[float], embed_model: str,
                spent: Sequence[usage.Call], admitted: usage.Admitted) -> RecordedTurn:
    """One statement (engine.record_turn): the ``spent`` provider calls of the turn (on the day that admitted
    it, settling its reservation), the reply to the user's message (stored by ``open_turn``), the session's
    activity and the utterance in the relationship layer. Returns both message ids, or ``replayed`` when a
    concurrent sender of the same message recorded its reply first (keep that one). Raises ``SessionGone``
    when an erasure deleted the session meanwhile: then nothing was written or counted."""
    values = usage.calls(user_id, admitted.day, spent) | {
        "session": session["id"], "instance": session["instance_id"], "turn": client_turn_id, "reply": reply,
        "metadata": Jsonb(reply_metadata), "content": content, "embedding": Vector(embedding),
        "message": user_message_id, "utterance_metadata": Jsonb({"message_id": user_message_id,
                                                                 "embed_model": embed_model}),
        "reservation": admitted.reservation}
    try:
        assistant = one(connection().execute(_RECORD_TURN, values))
    except psycopg.DatabaseError as exc:
        if exc.sqlstate == SESSION_GONE:
            raise SessionGone() from None
        raise
    if assistant["id"] is None:
        return {"replayed": True}
    return {"replayed": False, "user_message_id": user_message_id, "assistant_message_id": assistant["id"]}


_STORED = "SELECT m.id, m.role, m.client_turn_id, m.content, m.sent_at FROM engine.chat_messages m"


def transcript(user_id: str, session_id: UUID, client_ids: Sequence[str]) -> Transcript | None:
    """What an append checks before it pays for anything (eros.ingest.plan): the session's persona instance (None:
    not this user's session), its newest message's time, and its messages stored under ``client_ids``."""
    conn = connection()
    session = conn.execute(
        "SELECT s.instance_id, (SELECT m.sent_at FROM engine.chat_messages m"
        "                       WHERE m.user_id = s.user_id AND m.session_id = s.id ORDER BY m.id DESC LIMIT 1)"
        "   AS newest"
        " FROM engine.chat_sessions s WHERE s.id = %s AND s.user_id = %s", (session_id, user_id)).fetchone()
    if session is None:
        return None
    stored = conn.execute(f"{_STORED} WHERE m.user_id = %s AND m.session_id = %s AND m.client_turn_id = ANY(%s)",
                          (user_id, session_id, list(client_ids))).fetchall()
    return {"instance_id": session["instance_id"], "newest": session["newest"], "stored": stored}


# An append's messages in one statement: the transcript's rows (in the request's order, so their ids follow it;
# ON CONFLICT: a message already stored under its client id and role is kept as it is), and for each new user
# message its utterance in the relationship layer, at the message's time, with the embedding the request paid
# for (as engine.record_turn stores a turn's). A message without a time is stamped when it is stored
# (clock_timestamp(): rows of one statement keep their order).
_APPEND = """
WITH incoming AS (
    SELECT * FROM unnest(%(roles)s::text[], %(contents)s::text[], %(ids)s::text[], %(times)s::timestamptz[])
        WITH ORDINALITY AS i(role, content, client_id, at, place)
), embedded AS (
    SELECT * FROM unnest(%(embedded)s::text[], %(vectors)s::vector[]) AS e(client_id, embedding)
), inserted AS (
    INSERT INTO engine.chat_messages (session_id, user_id, role, content, client_turn_id, sent_at)
    SELECT %(session)s, %(user)s, i.role, i.content, i.client_id, coalesce(i.at, clock_timestamp())
    FROM incoming i ORDER BY i.place
    ON CONFLICT (session_id, client_turn_id, role, user_id) DO NOTHING
    RETURNING id, role, client_turn_id, content, sent_at
), utterances AS (
    INSERT INTO engine.companion_memories (session_id, user_id, instance_id, content, embedding, source,
                                           from_message_id, through_message_id, metadata, created_at)
    SELECT %(session)s, %(user)s, %(instance)s, n.content, e.embedding, 'utterance', n.id, n.id,
           jsonb_build_object('message_id', n.id, 'embed_model', %(model)s::text), n.sent_at
    FROM inserted n JOIN embedded e ON e.client_id = n.client_turn_id
    WHERE n.role = 'user'
)
SELECT n.id, n.role, n.client_turn_id, n.content, n.sent_at FROM inserted n
"""


def append_messages(user_id: str, session_id: UUID, messages: Sequence[tuple[str, str, str, datetime | None]],
                    vectors: Sequence[tuple[str, list[float]]], embed_model: str,
                    check: Callable[[datetime | None], None]) -> dict[tuple[str, str], StoredMessage] | None:
    """Append ``messages`` (role, content, client id, time or None) to the session in one transaction: the
    session's row is locked (appends to one session go one at a time; a turn's KEY SHARE lock does not wait),
    ``check`` is given its newest message's time and may raise (nothing is written then), then the messages and
    the utterances of the new user messages (``vectors``: each one's client id and vector) are written
    (``_APPEND``) and the session is made active again. Returns every message of the request by (client id,
    role), as stored, each with ``inserted``; None: no such session of this user (an erasure deleted it meanwhile)."""
    ids = [m[2] for m in messages]
    with transaction() as conn:
        session = conn.execute(
            "SELECT s.instance_id, (SELECT m.sent_at FROM engine.chat_messages m"
            "                       WHERE m.user_id = s.user_id AND m.session_id = s.id ORDER BY m.id DESC LIMIT 1)"
            "   AS newest"
            " FROM engine.chat_sessions s WHERE s.id = %s AND s.user_id = %s FOR NO KEY UPDATE OF s",
            (session_id, user_id)).fetchone()
        if session is None:
            return None
        check(session["newest"])
        stored = {(r["client_turn_id"], r["role"]): r for r in conn.execute(
            f"{_STORED} WHERE m.user_id = %s AND m.session_id = %s AND m.client_turn_id = ANY(%s)",
            (user_id, session_id, ids)).fetchall()}
        inserted = conn.execute(_APPEND, {
            "roles": [m[0] for m in messages], "contents": [m[1] for m in messages], "ids": ids,
            "times": [m[3] for m in messages],
            "embedded": [i for i, _ in vectors], "vectors": [Vector(v) for _, v in vectors],
            "session": session_id, "user": user_id, "instance": session["instance_id"], "model": embed_model,
        }).fetchall()
        if inserted:
            _touch(conn, user_id, session_id)
    out: dict[tuple[str, str], StoredMessage] = {}
    for rows, fresh in ((stored.values(), False), (inserted, True)):
        for row in rows:
            out[(row["client_turn_id"], row["role"])] = {**row, "inserted": fresh}  # type: ignore[typeddict-item]
    return out


def _insert_message(conn, user_id, session_id, role, content, client_turn_id, metadata) -> dict | None:
    """Insert one message of a turn; None if that turn already has a message of this role."""
    return conn.execute(
        "INSERT INTO engine.chat_messages (session_id, user_id, role, content, client_turn_id, metadata)"
        " VALUES (%s, %s, %s, %s, %s, %s)"
        " ON CONFLICT (session_id, client_turn_id, role, user_id) DO NOTHING RETURNING id",
        (session_id, user_id, role, content, client_turn_id, Jsonb(metadata)),
    ).fetchone()


def _touch(conn, user_id, session_id) -> None:
    conn.execute("SELECT engine.touch_session(%s::text, %s::uuid)", (user_id, session_id))
