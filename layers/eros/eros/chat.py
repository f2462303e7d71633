"""The chat turn use-case: recall -> prompt -> chat model -> persist -> reply."""

from __future__ import annotations

import time
import uuid
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from datetime import timedelta
from uuid import UUID

from pydantic import BaseModel, Field

from . import apps, calibrated, clock, prompt, recall
from .config import Settings
from .context import MEMORY_DATA, RecalledMemory, remember
from .errors import ClientError, ModelFailed, NotFound, provider_status
from .observability import logger, metrics, tracer
from .providers import Deadline, ProviderError, chat_client
from .providers.embed import Embeddings
from .providers.llm import Completion
from .store import chat as chat_store
from .store import usage as usage_store
from .store.rows import Message, OpenedTurn, SessionWithPersona, TurnMessages
from .usage import refuse, release


class TurnConflict(ClientError):
    """A client_turn_id reused for different content."""
    status, code = 409, "turn_conflict"


class TurnFailed(ModelFailed):
    """The model (or embedder) failed a turn; the user's message is kept and the turn can be retried with
    its ``client_turn_id`` (``ModelFailed`` says what the client is told)."""

    def __init__(self, cause: ProviderError, client_turn_id: str, paid: list[usage_store.Call]):
        super().__init__(cause, client_turn_id=client_turn_id)
        self.client_turn_id = client_turn_id
        self.paid = paid  # the calls that answered before the one that failed (counted all the same)

    def outcome(self) -> str:
        advice = ("retry with the same client_turn_id" if self.retryable
                  else "retrying will not help until the service is fixed")
        return f"your message was kept, {advice}"


class TurnResult(BaseModel):
    """What a chat turn answers (the route's response model)."""
    reply: str
    client_turn_id: str = Field(description="the turn's id: the client's, or one made for it")
    user_message_id: int
    assistant_message_id: int
    recalled: list[RecalledMemory] = Field(description="what the prompt carried, profile first, best first")
    model: str = Field(description="the model that answered")
    usage: dict = Field(default_factory=dict, description="the tokens the model reported for the reply (OpenAI's "
                        "prompt_tokens, completion_tokens, total_tokens): a streamed reply's are what was streamed")
    replayed: bool = Field(False, description="true when this is the stored reply of an earlier attempt")


class TurnInProgress(ClientError):
    """Another request is answering this turn (same ``client_turn_id``, same message) and has not finished within
    the wait: retry with the same id to get its reply (no second model call is paid for)."""
    status, code = 409, "turn_in_progress"


# A turn that finds its message being answered by another request (a client's retry while the first attempt still
# streams) waits for that reply, asking this often, for at most the turn's budget and this margin.
ANSWER_POLL_SECS = 0.2
ANSWER_WAIT_MARGIN_SECS = 5.0

# What a turn yields as it goes (stream_turn; take_turn ignores them): (event, data), as eros.streaming writes them.
Event = tuple[str, dict]


def _replay(stored: TurnMessages, client_turn_id: str) -> TurnResult:
    meta = stored["assistant"].get("metadata") or {}
    return TurnResult(reply=stored["assistant"]["content"], client_turn_id=client_turn_id,
                      user_message_id=stored["user"]["id"], assistant_message_id=stored["assistant"]["id"],
                      recalled=[RecalledMemory.model_validate(r) for r in meta.get("recalled", [])],
                      model=meta.get("model", ""), usage=meta.get("usage") or {}, replayed=True)


def _answered(stored: TurnMessages, content: str) -> bool:
    """The turn is a retry of an answered one with the same message: its reply is replayed."""
    return "assistant" in stored and stored["user"]["content"] == content


@tracer.capture_method(capture_response=False, capture_error=False)  # a reply is content
def take_turn(user_id: str, session_id: UUID, content: str, client_turn_id: str | None) -> TurnResult:
    """One chat turn: the message is stored (claiming its turn id) before any model call; a retry of an
    answered turn replays its reply; a model failure keeps the message and raises ``TurnFailed``.

    Three database round trips: ``open_turn`` (the session, the turn id's earlier messages, the spend
    limits and the turn's reservation, the message, the history), the recall, and ``record_turn`` (which
    settles the reservation); a replay costs the first alone, a failure the release of its reservation instead
    of the record."""
    turn = _turn(user_id, session_id, content, client_turn_id, streaming=False)
    while True:
        try:
            next(turn)
        except StopIteration as done:
            return done.value


@tracer.capture_method(capture_response=False, capture_error=False)
def stream_turn(user_id: str, session_id: UUID, content: str, client_turn_id: str | None) -> Iterator[Event]:
    """``take_turn`` as it happens (eros.streaming says how it is written): ``turn`` once the message is stored,
    ``delta`` for each piece of the reply as the model writes it, then ``done`` with ``take_turn``'s result. What
    ``take_turn`` refuses without storing the message (no such session, a conflict, a limit) raises from the
    first ``next``; a failure after that raises from a later one (the transport writes it as an ``error`` event).
    The same turn, so the same guarantees: the reply is stored once, whole, in the turn's transaction; a model
    failure mid-stream stores no part of it; a retry with the same ``client_turn_id`` replays it."""
    result = yield from _turn(user_id, session_id, content, client_turn_id, streaming=True)
    yield "done", result.model_dump(mode="json")


def _turn(user_id: str, session_id: UUID, content: str, client_turn_id: str | None, *,
          streaming: bool) -> Generator[Event, None, TurnResult]:
    cfg = apps.settings_for(user_id)  # the deployment's, with the user's app's limits, budget and model over them
    turn_id = client_turn_id or str(uuid.uuid4())
    now = clock.now()
    # Of concurrent senders of one turn id, exactly one stores its message; the others are a conflict or,
    # with the same message, its replay.
    reserve = usage_store.turn_reserve(cfg.chat_max_tokens, recall.most_recalled(cfg.recall))
    opened = chat_store.open_turn(user_id, session_id, content, turn_id, history=cfg.history_messages, now=now,
                                  turns_per_minute=cfg.turns_per_minute, daily_budget=cfg.daily_token_budget,
                                  reserve=reserve)
    if opened is None:
        raise NotFound("session not found")
    stored = opened["stored"]
    if _answered(stored, content):
        return (yield from _replayed(_replay(stored, turn_id)))  # a retry of an answered turn: never limited
    _check_conflict(stored, content)  # neither counted nor limited: it pays nothing
    if not opened["admitted"]:
        refuse(cfg, user_id, now)  # nothing was stored or paid for
    paid: list[usage_store.Call] = []
    recorded, answering = False, None
    try:
        stored, answering = _claim(cfg, user_id, session_id, content, turn_id, opened)
        yield "turn", {"client_turn_id": turn_id, "user_message_id": stored["user"]["id"]}
        if answering is None:  # another request answered it meanwhile: its reply
            return (yield from _replayed(_replay(stored, turn_id), announced=True))
        result, recorded = yield from _admitted_turn(cfg, user_id, session_id, content, turn_id, opened, stored,
                                                     streaming=streaming)
        return result
    except TurnFailed as failed:
        paid = failed.paid
        raise
    finally:
        if not recorded:  # it ended before its record: release the reservation (counting what it paid)
            release(user_id, opened["reserved"], paid)
            if answering is not None:  # and let a retry answer the message
                chat_store.stop_answering(user_id, answering)


def _replayed(result: TurnResult, *, announced: bool = False) -> Generator[Event, None, TurnResult]:
    """A stored reply, as a streamed turn sends it: its message's ids, then the whole reply as one piece."""
    if not announced:
        yield "turn", {"client_turn_id": result.client_turn_id, "user_message_id": result.user_message_id}
    yield "delta", {"delta": result.reply}
    return result


def _check_conflict(stored: TurnMessages, content: str) -> None:
    if "user" in stored and stored["user"]["content"] != content:
        raise TurnConflict("client_turn_id was already used in this session for a different message")


def _claim(cfg: Settings, user_id: str, session_id: UUID, content: str, turn_id: str,
           opened: OpenedTurn) -> tuple[TurnMessages, int | None]:
    """The turn's message, stored, and the right to answer it: the id of the message this request answers, or None
    when another request's reply to it is in ``stored`` (a replay). A message this request stored is its own to
    answer (open_turn marks it being answered); one an earlier attempt stored (a retry) is answered once its
    earlier answerer gave up (it failed, or its mark expired), else this request waits for that one's reply
    (a client that retries a dropped stream pays for one model call, not two)."""
    stored, claimed = opened["stored"], opened["claimed"]
    if "user" not in stored:  # a concurrent sender's message came first, after open_turn's snapshot
        stored, claimed = chat_store.claim_turn(user_id, session_id, content, turn_id, answering_until=clock.now()
                                                + timedelta(seconds=usage_store.RESERVATION_SECS))
        _check_conflict(stored, content)
    if "assistant" in stored:
        return stored, None
    message_id = stored["user"]["id"]
    if claimed:
        return stored, message_id
    give_up = time.monotonic() + cfg.turn_budget_secs + ANSWER_WAIT_MARGIN_SECS
    while True:
        now = clock.now()
        if chat_store.start_answering(user_id, message_id, now=now,
                                      until=now + timedelta(seconds=usage_store.RESERVATION_SECS)):
            return stored, message_id
        stored = chat_store.find_turn(user_id, session_id, turn_id)
        if "assistant" in stored:
            return stored, None
        if time.monotonic() >= give_up:
            raise TurnInProgress("another request is answering this turn: retry with the same client_turn_id for "
                                 "its reply", retryable=True, retry_after=2)
        time.sleep(ANSWER_POLL_SECS)


def _admitted_turn(cfg: Settings, user_id: str, session_id: UUID, content: str, turn_id: str, opened: OpenedTurn,
                   stored: TurnMessages, *, streaming: bool) -> Generator[Event, None, tuple[TurnResult, bool]]:
    """The turn once admitted and its message this request's to answer: the model's answer, recorded (settling
    the reservation); the result, and whether it was recorded (a replay of a concurrent sender's reply is not)."""
    session = opened["session"]
    answer = yield from _answer(cfg, user_id, session, content, turn_id, opened["history"], streaming=streaming)
    spent = [usage_store.Call.of("chat", answer.completion), usage_store.Call.of("chat", answer.query)]
    recorded = chat_store.record_turn(
        session, user_id, stored["user"]["id"], content, turn_id, answer.completion.text,
        {"recalled": [r.model_dump(mode="json", exclude=MEMORY_DATA) for r in answer.recalled],
         "model": answer.completion.model,
         "usage": answer.completion.usage, "offline": answer.completion.offline},
        answer.query.vectors[0], answer.query.model,
        spent, opened["reserved"],
    )
    metrics.add_metric(name="ProviderTokens", unit="Count", value=sum(c.tokens for c in spent))
    if recorded["replayed"]:  # a concurrent duplicate of this turn finished first
        return _replay(chat_store.find_turn(user_id, session_id, turn_id), turn_id), True
    metrics.add_metric(name="Turns", unit="Count", value=1)
    metrics.add_metric(name="RecallRows", unit="Count", value=len(answer.recalled))
    logger.info("chat turn", extra={"session_id": str(session_id), "recalled": len(answer.recalled),
                                    "model": answer.completion.model, "usage": answer.completion.usage,
                                    "reserved": opened["tokens_reserved"], "streamed": streaming})
    return TurnResult(reply=answer.completion.text, client_turn_id=turn_id,
                      user_message_id=recorded["user_message_id"],
                      assistant_message_id=recorded["assistant_message_id"],
                      recalled=answer.recalled, model=answer.completion.model,
                      usage=answer.completion.usage), True


@dataclass
class _Answer:
    query: Embeddings  # the message's embedding (stored with the utterance)
    completion: Completion
    recalled: list[RecalledMemory]


def _answer(cfg: Settings, user_id: str, session: SessionWithPersona, content: str, turn_id: str,
            history: list[Message], *, streaming: bool) -> Generator[Event, None, _Answer]:
    """Embed the message, recall, build the prompt (with ``history``) and call the chat model, within the
    turn's budget; ``streaming``: the model's reply as it writes it, each piece a ``delta``."""
    deadline = Deadline.after(cfg.turn_budget_secs)
    stage, paid, stream = "embed", [], None
    try:
        # compared with the stored vectors, then stored beside them: their model's embedder
        query = calibrated.embedder().embed([content], "query", deadline=deadline)
        paid.append(usage_store.Call.of("chat", query))
        remembered = remember(user_id, session["instance_id"], query.vectors[0], history=history, message=content,
                              model=query.model)
        messages = prompt.build_messages(session["system_prompt"], remembered.section, history, content)
        stage = "chat"
        if not streaming:
            completion = chat_client().complete(cfg.chat_model, messages, max_tokens=cfg.chat_max_tokens,
                                                deadline=deadline)
        else:
            stream = chat_client().stream(cfg.chat_model, messages, max_tokens=cfg.chat_max_tokens,
                                          deadline=deadline)
            for piece in stream:
                yield "delta", {"delta": piece}
            assert stream.completion is not None  # set by the last piece
            completion = stream.completion
    except ProviderError as exc:
        if stream is not None:  # what was streamed before the failure is billed all the same
            paid.append(usage_store.Call.of("chat", Completion(text="", model=cfg.chat_model, usage=stream.paid())))
        failed = TurnFailed(exc, turn_id, paid)
        metrics.add_metric(name="TurnProviderFailures", unit="Count", value=1)
        # The provider's status and error type, never its text: an error body can echo the user's message.
        logger.warning("chat turn failed at a provider", extra={
            "session_id": str(session["id"]), "stage": stage, "error_type": type(exc).__name__,
            "provider_status": provider_status(exc), "code": failed.code, "retryable": failed.retryable,
            "streamed": streaming})
        raise failed from None
    return _Answer(query, completion, remembered.memories)

