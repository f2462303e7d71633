"""Sessions with personas: starting one, listing them with where each is in dreaming, a chat turn, the messages;
and for an app with its own chat pipeline, messages it appends and the context for a message."""

# No `from __future__ import annotations` here: pydantic and the resolver would then compile and evaluate
# every annotation of the models and routes from its text at import (~115 evaluations a cold start).
import itertools
from typing import Annotated
from uuid import UUID

from aws_lambda_powertools.event_handler import Response, content_types
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Query

from eros import chat, context, errors, ingest, streaming
from eros.config import settings
from eros.store import chat as chat_store

from models import (
    ContextRequest,
    CreatedSession,
    MessagePage,
    NewMessages,
    NewSession,
    NewTurn,
    SessionList,
)
from routes import current_user, documented

router = Router()

# The largest message id a cursor can name (chat_messages.id is a bigint).
MAX_BIGINT = 2**63 - 1


def _session_of(user: str, session_id: UUID) -> None:
    if chat_store.get_session(user, session_id) is None:
        raise errors.NotFound("session not found")


@router.post("/v1/sessions", operation_id="createSession", tags=["sessions"], summary="start a session with a persona",
             responses=documented((201, "the session"), (404, "no such persona")))
def create_session(body: NewSession) -> Response[CreatedSession]:
    session = chat_store.create_session(current_user(router), body.persona_id)
    if session is None:
        raise errors.NotFound(f"persona {body.persona_id!r} not found")
    return Response(201, content_types.APPLICATION_JSON, CreatedSession.model_validate(session))


@router.get("/v1/sessions", operation_id="listSessions", tags=["sessions"],
            summary="the caller's sessions and where each is in dreaming",
            description="Newest first; each with `dreaming`: its state in the background extraction, its last "
                        "error, its attempts and when it is due.",
            responses=documented((200, "the sessions")))
def sessions() -> SessionList:
    rows = chat_store.list_sessions(current_user(router), settings().dreaming_idle_secs)
    return SessionList.model_validate({"sessions": rows})


@router.post("/v1/sessions/<session_id>/turns", operation_id="takeTurn", tags=["chat"], summary="one chat turn",
             description="The message is stored, claiming `client_turn_id` for it, before the model is called: a "
                         "retry or a concurrent duplicate with the same content gets the one reply (`replayed: "
                         "true`; the model is called once: a duplicate sent while the first is still answered waits "
                         "for its reply); other content with that id is a 409 `turn_conflict` and calls no model. On "
                         "a model failure the message is kept and the answer says whether a retry can help "
                         "(`retryable`): after a 503 `model_unavailable` or a 504 `model_timeout`, retry with the "
                         "same `client_turn_id`. A 409 `session_gone` means the user was erased while the turn "
                         "ran: nothing was stored or counted.",
             responses=documented((200, "the reply"), (404, "no such session of this user"),
                                  (409, "turn_conflict: client_turn_id already used for another message; "
                                         "turn_in_progress: another request is still answering this turn "
                                         "(retryable); session_gone: the user was erased while the turn ran"),
                                   (429, "rate_limited or budget_exhausted: over a per-user limit (Retry-After)"),
                                   (502, "model_error: the provider refused the request (a 400/401/402/403, or an "
                                         "unusable answer): not retryable"),
                                   (503, "model_unavailable (retryable), database_unavailable or database_busy"),
                                   (504, "model_timeout (retryable)")))
def take_turn(session_id: UUID, body: NewTurn) -> chat.TurnResult:
    return chat.take_turn(current_user(router), session_id, body.content, body.client_turn_id)


@router.post("/v1/sessions/<session_id>/turns/stream", operation_id="streamTurn", tags=["chat"],
             summary="one chat turn, its reply streamed as the model writes it",
             description="The turn of `POST /v1/sessions/{session_id}/turns` (the same body, limits, replay and "
                         "errors), its reply sent as it is written, as Server-Sent Events (`text/event-stream`): "
                         "`turn` (`client_turn_id`, `user_message_id`) once the message is stored, `delta` (`delta`: "
                         "a piece of the reply) as the model writes, then `done` with the JSON route's answer, or "
                         "`error` with its error body (`code`, `message`, `retryable`): a model that fails "
                         "mid-stream stores no part of the reply, and the message is kept for a retry. What is "
                         "refused before the message is stored (no such session, a conflict, a limit, an invalid "
                         "body) is answered as the JSON route answers it. A client that goes away mid-stream does "
                         "not stop the turn: its reply is stored, and a retry with the same `client_turn_id` gets "
                         "it (`replayed: true`), waiting for it if it is still being written. In AWS the stream "
                         "comes from the stack's StreamUrl (docs/DEPLOY.md); behind the HTTP API this route answers "
                         "the same events in one piece.",
             responses=documented((200, "the reply as Server-Sent Events: turn, delta..., then done or error"),
                                  (404, "no such session of this user"),
                                  (409, "turn_conflict: client_turn_id already used for another message; "
                                        "turn_in_progress: another request is still answering this turn "
                                        "(retryable)"),
                                  (429, "rate_limited or budget_exhausted: over a per-user limit (Retry-After)"),
                                  (503, "database_unavailable or database_busy")))
def stream_turn(session_id: UUID, body: NewTurn) -> Response[str]:
    events = chat.stream_turn(current_user(router), session_id, body.content, body.client_turn_id)
    first = next(events)  # what the JSON route refuses before storing the message is raised here, answered as there
    streaming.pending.set(itertools.chain([first], events))  # the handler sends them (app.py, stream.py)
    return Response(200, streaming.EVENT_STREAM, "", headers=dict(streaming.STREAM_HEADERS))


@router.get("/v1/sessions/<session_id>/messages", operation_id="listMessages", tags=["sessions"],
            summary="a page of a session's messages",
            description="Newest first; each reply with the memories its prompt recalled (ids, scores and their parts: "
                        "the text is the memory's own, looked up by id).",
            responses=documented((200, "the page"), (404, "no such session of this user")))
def messages(session_id: UUID, limit: Annotated[int, Query(ge=1, le=200)] = 50,
             before: Annotated[int | None, Query(ge=1, le=MAX_BIGINT)] = None) -> MessagePage:
    user = current_user(router)
    _session_of(user, session_id)
    page = chat_store.list_messages(user, session_id, limit, before)
    return MessagePage.model_validate({"messages": page, "next_before": page[-1]["id"] if len(page) == limit else None})


@router.post("/v1/sessions/<session_id>/messages", operation_id="appendMessages", tags=["chat"],
             summary="append messages your own chat pipeline produced",
             description="Stored as a chat turn stores its own: each message in the transcript, each user message "
                         "also in the relationship layer with its embedding (one embedding batch a request, admitted "
                         "by the spend limits as a turn is; a request with no new user message pays nothing), and "
                         "the session made active, so dreaming picks it up like any other. The request is checked "
                         "whole before anything is paid for or stored, and is stored whole or not at all. A message "
                         "already stored under its `client_message_id` and role with the same text is not stored "
                         "again (`stored: false`): retry a failed request as it was.",
             responses=documented((200, "each message as stored, in order"), (404, "no such session of this user"),
                                  (409, "message_conflict: a client_message_id already used for another text; "
                                        "out_of_order: a new message older than the session's newest; "
                                        "session_gone: the user was erased meanwhile"),
                                  (429, "rate_limited or budget_exhausted: over a per-user limit (Retry-After)"),
                                  (502, "model_error: the embedder refused the request: not retryable"),
                                  (503, "model_unavailable (retryable), database_unavailable or database_busy"),
                                  (504, "model_timeout (retryable)")))
def append_messages(session_id: UUID, body: NewMessages) -> ingest.Appended:
    incoming = [ingest.Incoming(m.role, m.content, m.client_message_id, m.created_at) for m in body.messages]
    return ingest.append(current_user(router), session_id, incoming)


@router.post("/v1/sessions/<session_id>/context", operation_id="getContext", tags=["chat"],
             summary="the memories for a message, without the model call",
             description="What a chat turn would recall for this message in this session, as memories (layer, "
                         "category, event time, score and its parts) and as `prompt`: the section a chat turn puts "
                         "in its system prompt after the persona's own, built by the same function. Put it in front "
                         "of your model, then append your reply with POST .../messages. With `store: true` the user's "
                         "message is recorded in the same call (idempotent on `client_message_id`). Pays one query "
                         "embedding, admitted by the spend limits as a turn is.",
             responses=documented((200, "the context"), (404, "no such session of this user"),
                                  (409, "message_conflict (with store): the client_message_id holds another text; "
                                        "session_gone: the user was erased meanwhile"),
                                  (429, "rate_limited or budget_exhausted: over a per-user limit (Retry-After)"),
                                  (502, "model_error: the embedder refused the request: not retryable"),
                                  (503, "model_unavailable (retryable), database_unavailable or database_busy"),
                                  (504, "model_timeout (retryable)")))
def message_context(session_id: UUID, body: ContextRequest) -> context.ContextResult:
    return context.context_for(current_user(router), session_id, body.content, store=body.store,
                               client_message_id=body.client_message_id)
