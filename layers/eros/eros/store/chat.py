"""Personas, persona instances, sessions and messages."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from uuid import UUID

import psycopg
from pgvector import Vector
from psycopg.types.json import Jsonb

from ..db import connection, one, transaction
from ..errors import ClientError
from . import personas, usage
from .dreaming import NOTHING_TO_REMEMBER
from .rows import (
    Message,
    OpenedTurn,
    RecordedTurn,
    Session,
    SessionWithDreaming,
    SessionWithPersona,
    StoredMessage,
    Transcript,
    TurnMessages,
)


def _instance(conn, user_id: str, persona_id: str) -> dict | None:
    """The user's instance of the persona (made on first use) and the persona's current version, which a new
    session keeps; None: no persona of that id the user may use."""
    return conn.execute(
        "WITH persona AS (SELECT id, version FROM engine.personas WHERE id = %(persona)s AND " + personas.USABLE + "),"
        " instance AS (INSERT INTO engine.persona_instances (user_id, persona_id)"
        "              SELECT %(user)s, id FROM persona"
        "              ON CONFLICT (user_id, persona_id) DO UPDATE SET user_id = EXCLUDED.user_id"
        "              RETURNING id)"
        " SELECT instance.id, persona.version FROM instance, persona",
        {"user": user_id, "persona": persona_id},
    ).fetchone()


def create_session(user_id: str, persona_id: str) -> Session | None:
    """A new session with the user's instance of the persona (created on first use), on the persona's current
    version. None: no such persona the user may use."""
    with transaction() as conn:
        instance = _instance(conn, user_id, persona_id)
        if instance is None:
            return None
        return one(conn.execute(
            "INSERT INTO engine.chat_sessions (user_id, instance_id, persona_version) VALUES (%s, %s, %s)"
            " RETURNING id, instance_id, created_at, last_active_at",
            (user_id, instance["id"], instance["version"]),
        )) | {"persona_id": persona_id}


def import_session(user_id: str, persona_id: str, external_id: str) -> dict | None:
    """The session of an imported conversation (migration 0029): found by its id, else made, with the user's
    instance of the persona. ``{"id", "created"}``; None: no such persona the user may use."""
    with transaction() as conn:
        instance = _instance(conn, user_id, persona_id)
        if instance is None:
            return None
        made = conn.execute(
            "INSERT INTO engine.chat_sessions (user_id, instance_id, external_id, persona_version)"
            " VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (user_id, external_id) WHERE external_id IS NOT NULL DO NOTHING RETURNING id",
            (user_id, instance["id"], external_id, instance["version"])).fetchone()
        if made is not None:
            return {"id": made["id"], "created": True}
        return {"id": one(conn.execute(
            "SELECT id FROM engine.chat_sessions WHERE user_id = %s AND external_id = %s",
            (user_id, external_id)))["id"], "created": False}


def import_progress(user_id: str) -> dict:
    """Where dreaming is in the user's imported sessions (migration 0029): how many wait, are being extracted, are
    extracted or were given up on, the span of their times, and how far (in the conversations' time) dreaming
    has distilled them: a user's imported sessions are extracted oldest first (store.dreaming's claim)."""
    return one(connection().execute(
        "SELECT count(*) AS sessions,"
        " count(*) FILTER (WHERE extracted_at IS NULL AND extraction_claimed_at IS NULL) AS waiting,"
        " count(*) FILTER (WHERE extracted_at IS NULL AND extraction_claimed_at IS NOT NULL) AS in_progress,"
        " count(*) FILTER (WHERE extracted_at IS NOT NULL AND extraction_gave_up IS NULL) AS extracted,"
        " count(*) FILTER (WHERE extraction_gave_up IS NOT NULL) AS failed,"
        " min(last_active_at) AS oldest, max(last_active_at) AS newest,"
        " max(last_active_at) FILTER (WHERE extracted_at IS NOT NULL) AS distilled_through"
        " FROM engine.chat_sessions WHERE user_id = %s AND external_id IS NOT NULL", (user_id,)))


_SESSION_COLUMNS = (
    "s.id, s.instance_id, i.persona_id, s.created_at, s.last_active_at, s.extracted_at"
)

# Where a session is in dreaming, from its bookkeeping columns (migrations 0002, 0005, 0008), first match:
# failed (given up; its error says why), nothing (extracted, with nothing in it to remember: store.dreaming's
# NOTHING_TO_REMEMBER), extracted (through its last message), claimed (a sweep took it),
# retrying (a failure's backoff), active (not quiet for DREAMING_IDLE_SECS yet), else waiting for a sweep.
_DREAMING_STATE = """CASE WHEN s.extraction_gave_up IS NOT NULL THEN 'failed'
    WHEN s.extracted_at IS NOT NULL AND s.extraction_error = %(nothing)s THEN 'nothing'
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
        {"user": user_id, "idle": idle_secs, "limit": limit, "nothing": NOTHING_TO_REMEMBER},
    ).fetchall()
    return [{"id": r["id"], "instance_id": r["instance_id"], "persona_id": r["persona_id"],
             "created_at": r["created_at"], "last_active_at": r["last_active_at"], "extracted_at": r["extracted_at"],
             "dreaming": {"state": r["state"], "error": r["error"], "attempts": r["attempts"], "due_at": r["due_at"]}}
            for r in rows]


def get_session(user_id: str, session_id: UUID, *, history: int = 0) -> SessionWithPersona | None:
    """The session with its persona's prompt (the version the session started with), only if it belongs to this
    user; with ``history``, also its last
    ``history`` messages, oldest first (what a prompt's history is, as engine.open_turn_v2 reads it for a turn)."""
    return connection().execute(
        f"SELECT {_SESSION_COLUMNS}, v.name AS persona_name, v.system_prompt"
        + (", (SELECT coalesce(jsonb_agg(h ORDER BY h.id), '[]') FROM ("
           "   SELECT m.id, m.role, m.content FROM engine.chat_messages m"
           "   WHERE m.user_id = s.user_id AND m.session_id = s.id ORDER BY m.id DESC LIMIT %(history)s) h) AS history"
           if history else "")
        + " FROM engine.chat_sessions s"
        " JOIN engine.persona_instances i ON i.id = s.instance_id"
        " JOIN engine.persona_versions v ON v.persona_id = i.persona_id AND v.version = coalesce(s.persona_version, 1)"
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
    return {"session": row, "stored": stored, "claimed": claimed is not None, "admitted": admitted, "history": messages,
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


def claim_turn(user_id: str, session_id: UUID, content: str, client_turn_id: str, *,
               answering_until: datetime) -> tuple[TurnMessages, bool]:
    """Store the user's message of a turn before any model call, claiming ``client_turn_id`` for it: what
    ``open_turn`` does, for the turn whose ``open_turn`` found a concurrent sender's message in its way but
    not in its snapshot (the rare race, at a few round trips more; the turn was admitted already).

    The message is committed first, so that nothing typed is lost whatever happens to the model call,
    and so that the UNIQUE (session_id, client_turn_id, role, user_id) constraint (migration 0013) decides which
    of several concurrent senders of one turn id owns it: exactly one insert wins; the others (they wait for the
    winner's commit) find its message. Returns the turn's messages by role, as ``find_turn`` does: the
    caller compares the stored user message with its own (another content is a conflict) and replays a
    stored reply. And whether this request stored it: then it is marked being answered by it until
    ``answering_until``, as ``open_turn`` marks the message it stores (``start_answering``)."""
    for _ in range(3):
        with transaction() as conn:
            mark = {ANSWERING: answering_until.isoformat()}
            row = _insert_message(conn, user_id, session_id, "user", content, client_turn_id, mark)
            if row is not None:
                _touch(conn, user_id, session_id)
                return {"user": {"id": row["id"], "role": "user", "content": content, "metadata": mark}}, True
        turn = find_turn(user_id, session_id, client_turn_id)
        if "user" in turn:
            return turn, False
        # The conflicting row went away between the two statements (its session was deleted): try again.
    raise RuntimeError(f"could not claim turn {client_turn_id!r}")


# A user message that a request is answering (calling the model for it) carries, in its metadata, until when that
# request may take (a turn's Lambda timeout is shorter: RESERVATION_SECS), so that a second request for the same turn
# (a client retrying a stream that dropped) waits for that reply instead of paying the model again. open_turn marks
# the message it stores (engine.open_turn_v2); a retry marks it with start_answering once the mark has expired or
# its request, failing, took it away (stop_answering). A recorded reply leaves the mark: an answered turn is replayed.
ANSWERING = "answering_until"
_START_ANSWERING = (
    "UPDATE engine.chat_messages SET metadata = coalesce(metadata, '{}') || jsonb_build_object(%(mark)s::text,"
    " %(until)s::timestamptz)"
    " WHERE user_id = %(user)s AND id = %(message)s AND role = 'user'"
    "   AND coalesce((metadata->>%(mark)s)::timestamptz, '-infinity') <= %(now)s"
    " RETURNING id")


def start_answering(user_id: str, message_id: int, *, now: datetime, until: datetime) -> bool:
    """Mark the user's message being answered by this request until ``until``, unless another request's mark holds
    at ``now``: whether it is this request's to answer."""
    return connection().execute(_START_ANSWERING, {"user": user_id, "message": message_id, "mark": ANSWERING,
                                                   "now": now, "until": until}).fetchone() is not None


def stop_answering(user_id: str, message_id: int) -> None:
    """The request answering the message ended without a reply (a model failure): a retry may answer it at once."""
    connection().execute("UPDATE engine.chat_messages SET metadata = metadata - %s WHERE user_id = %s AND id = %s",
                         (ANSWERING, user_id, message_id))


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


def transcript(user_id: str, session_id: UUID, client_ids: Sequence[str], *, history: int = 0) -> Transcript | None:
    """What an append checks before it pays for anything (eros.ingest.plan), in one statement: the session's
    persona instance (None: not this user's session), its newest message's time, its messages stored under
    ``client_ids``, and with ``history`` its last ``history`` messages, oldest first (a context's prompt history,
    as get_session reads it)."""
    return connection().execute(
        "SELECT s.instance_id,"
        " (SELECT m.sent_at FROM engine.chat_messages m"
        "  WHERE m.user_id = s.user_id AND m.session_id = s.id ORDER BY m.id DESC LIMIT 1) AS newest,"
        " (SELECT coalesce(jsonb_agg(jsonb_build_object('id', m.id, 'role', m.role, 'client_turn_id',"
        "                                               m.client_turn_id, 'content', m.content)), '[]')"
        "  FROM engine.chat_messages m"
        "  WHERE m.user_id = s.user_id AND m.session_id = s.id AND m.client_turn_id = ANY(%(ids)s)) AS stored,"
        " (SELECT coalesce(jsonb_agg(h ORDER BY h.id), '[]') FROM ("
        "   SELECT m.id, m.role, m.content FROM engine.chat_messages m"
        "   WHERE m.user_id = s.user_id AND m.session_id = s.id ORDER BY m.id DESC LIMIT %(history)s) h) AS history"
        " FROM engine.chat_sessions s WHERE s.id = %(session)s AND s.user_id = %(user)s",
        {"session": session_id, "user": user_id, "ids": list(client_ids), "history": history}).fetchone()


# What engine.append_messages (turn.sql) raises: a client id and role already holding another text, a new message
# older than the session's newest; its DETAIL names the message's place (and the newest message's time).
MESSAGE_CONFLICT, OUT_OF_ORDER = "EG412", "EG413"
_APPEND = ("SELECT * FROM engine.append_messages(%(user)s::text, %(session)s::uuid, %(roles)s::text[],"
           " %(contents)s::text[], %(ids)s::text[], %(times)s::timestamptz[], %(embedded)s::text[],"
           " %(vectors)s::vector[], %(model)s::text)")


class AppendRefused(Exception):
    """engine.append_messages refused an append (nothing of it was written): ``kind`` is "message_conflict" or
    "out_of_order", ``place`` the message's (0-based), ``newest`` the session's newest message's time."""

    def __init__(self, kind: str, place: int, newest: datetime | None):
        super().__init__(f"{kind} at message {place}")
        self.kind, self.place, self.newest = kind, place, newest


def append_messages(user_id: str, session_id: UUID, messages: Sequence[tuple[str, str, str, datetime | None]],
                    vectors: Sequence[tuple[str, list[float]]], embed_model: str) -> list[StoredMessage] | None:
    """Append ``messages`` (role, content, client id, time or None) to the session in one call
    (engine.append_messages, which says what it checks and writes): the new user messages' utterances with
    ``vectors`` (each one's client id and vector). Returns every message of the request as stored, in order, each
    with ``inserted``; None: no such session of this user (an erasure deleted it meanwhile). Raises
    ``AppendRefused`` when a concurrent request made it a conflict or out of order: nothing was written."""
    values = {"user": user_id, "session": session_id, "roles": [m[0] for m in messages],
              "contents": [m[1] for m in messages], "ids": [m[2] for m in messages],
              "times": [m[3] for m in messages], "embedded": [i for i, _ in vectors],
              "vectors": [Vector(v) for _, v in vectors], "model": embed_model}
    try:
        rows = connection().execute(_APPEND, values).fetchall()
    except psycopg.DatabaseError as exc:
        if exc.sqlstate in (MESSAGE_CONFLICT, OUT_OF_ORDER):
            place, _, newest = ((exc.diag.message_detail or "0") + " ").partition(" ")
            raise AppendRefused("message_conflict" if exc.sqlstate == MESSAGE_CONFLICT else "out_of_order",
                                int(place), datetime.fromisoformat(newest.strip()) if newest.strip() else None
                                ) from None
        raise
    if not rows:
        return None
    return [{"id": r["id"], "role": r["role"], "client_turn_id": r["client_id"], "content": r["content"],
             "sent_at": r["sent_at"], "inserted": r["inserted"]} for r in rows]


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
