"""Messages produced elsewhere: an app that runs its own chat pipeline appends its turns to a session
(``POST /v1/sessions/{id}/messages``), and they are stored exactly as a chat turn stores its own: each message in
the transcript, each user message also in the relationship layer with its embedding (one embedding batch a
request), the session made active again so that dreaming picks it up like any other.

A request is checked whole before anything is paid for or stored (``plan``): the batch's order and ids, the
session's, and every message already stored under its ``client_message_id`` (the same text again is a retry and is
not stored twice; other text is a 409 ``message_conflict``). Then the new user messages are embedded, admitted by
the spend limits as a chat turn is, and everything is written in one transaction (``record``). A failure of the
embedder stores nothing: retry the request as it was.

Time: a message's ``created_at`` (default: when it is stored) is its time in the transcript and its utterance's
time in the relationship layer, which recall's window and decay read. A session's messages keep their order in
time: a new message older than the session's newest is a 409 ``out_of_order``.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal
from uuid import UUID

from pydantic import BaseModel, Field

from . import calibrated, clock, usage
from .config import settings
from .errors import ClientError, ModelFailed, NotFound
from .observability import logger, metrics, tracer
from .providers import Deadline, ProviderError
from .providers.embed import Embeddings
from .store import chat as chat_store
from .store import usage as usage_store
from .store.rows import Message

MAX_MESSAGES = 100  # a request's messages at most: one embedding batch, one transaction of a few ms
# How far ahead of the server's clock a created_at may be: clients' clocks drift, and a message from the future
# would put every later message of the session out of order.
CLOCK_SKEW = timedelta(minutes=5)

Role = Literal["user", "assistant"]


class MessageConflict(ClientError):
    """A client_message_id already stored with another text."""
    status, code = 409, "message_conflict"


class OutOfOrder(ClientError):
    """A new message older than the session's newest: a session's messages keep their order in time."""
    status, code = 409, "out_of_order"


class BadBatch(ClientError):
    """The batch does not hold together (ids repeated, times going backwards or ahead of the clock)."""
    status, code = 422, "invalid_request"

    def __init__(self, place: int, name: str, problem: str):
        field_name = f"body.messages.{place}.{name}"
        super().__init__(f"invalid request: {field_name}: {problem}",
                         errors=[{"field": field_name, "problem": problem}])


@dataclass(frozen=True)
class Incoming:
    """A message to append, as the app sent it."""
    role: Role
    content: str
    client_message_id: str | None = None
    created_at: datetime | None = None

    @property
    def key(self) -> tuple[str, str]:
        """What the transcript keys it by (its client id and role): every message of a plan has an id."""
        return self.client_message_id or "", self.role


class AppendedMessage(BaseModel):
    """A message of an append, as stored."""
    id: int
    role: Role
    client_message_id: str = Field(description="its id: the client's, or one made for it")
    created_at: datetime = Field(description="its time in the transcript (and its utterance's, for a user message)")
    stored: bool = Field(description="false: an earlier request with this client_message_id and role stored it "
                                     "(a retry): nothing was stored again")


class Appended(BaseModel):
    """What ``POST /v1/sessions/{id}/messages`` answers."""
    messages: list[AppendedMessage] = Field(description="each message of the request, in its order")
    utterances: int = Field(description="user messages this request added to the relationship layer")


@dataclass
class Plan:
    """A checked request: its messages with their ids (made for those without), which are stored already, and
    the session's persona instance."""
    instance_id: UUID
    messages: list[Incoming]
    stored: dict[tuple[str, str], Message] = field(default_factory=dict)  # (client id, role): as stored
    history: list[Message] = field(default_factory=list)  # the session's last messages, when asked for

    def new(self) -> list[Incoming]:
        return [m for m in self.messages if m.key not in self.stored]

    def to_embed(self) -> list[str]:
        """The texts to embed, in order: the new user messages' (what becomes an utterance)."""
        return [m.content for m in self.new() if m.role == "user"]


def _checked_batch(messages: Sequence[Incoming], now: datetime) -> list[Incoming]:
    """The batch with an id for each message (one made for those without); refuses a repeated id and role,
    a time ahead of the clock, and times going backwards (a message without one is at ``now``)."""
    seen: set[tuple[str, str]] = set()
    out: list[Incoming] = []
    latest: datetime | None = None
    for place, message in enumerate(messages):
        if message.client_message_id and message.key in seen:
            raise BadBatch(place, "client_message_id", f"{message.client_message_id!r} is given twice for a "
                                                       f"{message.role} message in this request")
        seen.add(message.key)
        at = message.created_at or now
        if message.created_at and message.created_at > now + CLOCK_SKEW:
            raise BadBatch(place, "created_at", f"{message.created_at.isoformat()} is in the future (the server's "
                                                f"time is {now.isoformat()})")
        if latest is not None and at < latest:
            raise BadBatch(place, "created_at", f"{at.isoformat()} is before the previous message's "
                                                f"({latest.isoformat()}): messages are given in order")
        latest = at
        out.append(message if message.client_message_id else
                   Incoming(message.role, message.content, str(uuid.uuid4()), message.created_at))
    return out


def plan(user_id: str, session_id: UUID, messages: Sequence[Incoming], *, history: int = 0) -> Plan:
    """Check a request before anything is paid for or stored: the batch (``_checked_batch``: 422), the session
    (404: not this user's), messages already stored under their ids (the same text: a retry, not stored again;
    another: 409 ``message_conflict``) and the order in time of the new ones after the session's newest (409
    ``out_of_order``). With ``history``, the plan also carries the session's last ``history`` messages (what a
    context's prompt history is), read in the same statement."""
    batch = _checked_batch(messages, clock.now())
    state = chat_store.transcript(user_id, session_id, sorted({m.key[0] for m in batch}),
                                  history=history)
    if state is None:
        raise NotFound("session not found")
    stored = {(m.get("client_turn_id", ""), m["role"]): m for m in state["stored"]}
    for place, message in enumerate(batch):
        earlier = stored.get(message.key)
        if earlier is not None and earlier["content"] != message.content:
            raise MessageConflict(f"messages.{place}: client_message_id {message.client_message_id!r} was already "
                                  f"used in this session for a {message.role} message with another text",
                                  place=place)
    result = Plan(state["instance_id"], batch, stored, state["history"])
    _check_order(result, state["newest"])
    return result


def _check_order(planned: Plan, newest: datetime | None) -> None:
    for place, message in enumerate(planned.messages):
        at = message.created_at
        if newest is not None and at is not None and at < newest and message.key not in planned.stored:
            raise OutOfOrder(f"messages.{place}: created_at {at.isoformat()} is before the session's "
                             f"newest message ({newest.isoformat()}); a session's messages keep their order in time",
                             place=place, newest=newest.isoformat())


def record(user_id: str, session_id: UUID, planned: Plan, vectors: Sequence[list[float]],
           embed_model: str) -> list[AppendedMessage]:
    """Write a planned request in one call (eros.store.chat.append_messages): its new messages, each new user
    message's utterance with its vector (``vectors``: in the order of ``planned.to_embed()``), the session's
    activity. Returns every message of the request as stored, in order. What a concurrent request changed
    meanwhile is refused as ``plan`` refuses it, and nothing is written."""
    embedded = [m.key[0] for m in planned.new() if m.role == "user"]
    try:
        rows = chat_store.append_messages(
            user_id, session_id,
            [(m.role, m.content, m.key[0], m.created_at) for m in planned.messages],
            list(zip(embedded, vectors, strict=True)), embed_model)
    except chat_store.AppendRefused as refused:
        message = planned.messages[refused.place]
        if refused.kind == "message_conflict":
            raise MessageConflict(f"messages.{refused.place}: client_message_id {message.client_message_id!r} was "
                                  f"stored meanwhile by another request with another text",
                                  place=refused.place) from None
        _check_order(planned, refused.newest)
        raise  # the order held after all: not a refusal this module knows
    if rows is None:
        raise chat_store.SessionGone()
    return [AppendedMessage(id=row["id"], role=message.role, client_message_id=message.key[0],
                            created_at=row["sent_at"], stored=row.get("inserted", False))
            for message, row in zip(planned.messages, rows, strict=True)]


@tracer.capture_method(capture_response=False, capture_error=False)  # messages are content
def append(user_id: str, session_id: UUID, messages: Sequence[Incoming], *, limited: bool = True) -> Appended:
    """Append messages produced elsewhere to the user's session (the module's docstring says how). ``limited``:
    admitted by the user's spend limits (a request); an operator's import (eros.importing) is counted, not
    limited."""
    planned = plan(user_id, session_id, messages)
    texts = planned.to_embed()
    vectors: list[list[float]] = []
    model = ""
    if texts:  # nothing new from the user (a retry, a reply alone): nothing to pay, nothing to limit
        embedded = embed(user_id, texts, limited=limited)
        vectors, model = embedded.vectors, embedded.model
    appended = record(user_id, session_id, planned, vectors, model)
    added = sum(1 for m in appended if m.stored and m.role == "user")
    metrics.add_metric(name="AppendedMessages", unit="Count", value=sum(1 for m in appended if m.stored))
    logger.info("messages appended", extra={"session_id": str(session_id), "messages": len(appended),
                                            "stored": sum(1 for m in appended if m.stored), "utterances": added})
    return Appended(messages=appended, utterances=added)


def embed(user_id: str, texts: list[str], *, limited: bool = True) -> Embeddings:
    """User messages' embeddings, one batch, as a turn embeds its message (a query), paid as a chat request's:
    admitted by the spend limits first when ``limited``, counted either way (eros.context embeds its message with
    it too). An embedder's failure is a ``ModelFailed``."""
    reserve = sum(usage_store.embedding_reserve(t) for t in texts)
    admission: contextlib.AbstractContextManager[list[usage_store.Call]] = (
        usage.admitted(user_id, reserve) if limited else contextlib.nullcontext([]))
    with admission as paid:
        try:
            # compared with and stored beside the stored vectors: their model's embedder
            embedded = calibrated.embedder().embed(texts, "query",
                                                   deadline=Deadline.after(settings().turn_budget_secs))
        except ProviderError as exc:
            failed = ModelFailed(exc)
            logger.warning("a message's embedding failed", extra={"error_type": type(exc).__name__,
                                                                   "code": failed.code, "texts": len(texts)})
            raise failed from None
        paid.append(usage_store.Call.of("chat", embedded))
    if not limited:
        usage.spend(user_id, usage_store.Call.of("chat", embedded))
    return embedded
