"""Chat API (API Gateway HTTP API -> this Lambda). Transport only: each route calls one use-case or store.

The user is the verified JWT's ``sub`` (checked by the HTTP API's JWT authorizer in AWS, and by the
local dev server the same way); no route takes a user id from the request.
"""

# No `from __future__ import annotations` here: pydantic and the resolver would then compile and evaluate
# every annotation of the thirty models and routes from its text at import (~115 evaluations a cold start).
import base64
import binascii
import json
from collections.abc import Mapping
from datetime import date, datetime
from typing import Annotated, Any, Literal
from uuid import UUID

import psycopg
from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response, content_types
from aws_lambda_powertools.event_handler.exceptions import NotFoundError, ServiceError, UnauthorizedError
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Query
from aws_lambda_powertools.logging import correlation_paths
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, model_validator

from eros import chat, curation, errors, json_body, recall, records, snapstart, tracing, usage
from eros import health as health_check
from eros.config import settings
from eros.memory import (
    EVENT_TIME_FORMS,
    Category,
    EventTime,
    MemoryLayer,
    Precision,
    Source,
    SupersededReason,
    event_time_text,
    parse_event_time,
    stored_importance,
)
from eros.observability import logger, metrics
from eros.store import chat as chat_store
from eros.store import memories as memory_store

app = APIGatewayHttpResolver(enable_validation=True)
TITLE = "eros companion memory API"
snapstart.register()  # with SnapStart (template.yaml: ChatColdStart): warm before the snapshot, renew after

# The largest message id a cursor can name (chat_messages.id is a bigint).
MAX_BIGINT = 2**63 - 1


def unstorable(text: str) -> str | None:
    """Why Postgres cannot store this text (a NUL character, a lone surrogate), or None if it can."""
    if "\x00" in text:
        return "contains a NUL character (\\u0000)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (\\ud800-\\udfff): not valid Unicode text"
    return None


def _storable(value):
    """Refuses text Postgres cannot store, before pydantic's own string check (whose message names neither)."""
    problem = unstorable(value) if isinstance(value, str) else None
    if problem:
        raise ValueError(f"must be text that can be stored: it {problem}")
    return value


def _within_limit(value: str) -> str:
    """MAX_CONTENT_CHARS, read per request (a setting, not a constant of the module)."""
    limit = settings().max_content_chars
    if len(value) > limit:
        raise ValueError(f"must be at most {limit} characters (it has {len(value)})")
    return value


Content = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1), BeforeValidator(_storable),
                    AfterValidator(_within_limit)]


def _event_time(value: str) -> str:
    """An event time in one of its four forms, normalised ("2026-w47" -> "2026-W47")."""
    return parse_event_time(value).text()


EventTimeText = Annotated[str, AfterValidator(_event_time), Field(
    description=f"when what the memory is about happened or will happen: {EVENT_TIME_FORMS}",
    examples=["2026-W47", "2019", "2019-03", "2026-12-03"])]


def event_of(text: str | None) -> EventTime | None:
    """A request's validated (so normalised) event time as the domain's, or None."""
    return parse_event_time(text) if text else None


def _as_stored(value):
    """A number as the importance column stores it (``stored_importance``), before the range is checked: what
    rounds to 0 in a float4 (1e-100, -1e-100) is 0, not an underflow error after the embedding was paid for.
    Anything else is left to the type check (strict: no text, no booleans; no NaN or infinity)."""
    return value if isinstance(value, bool) or not isinstance(value, int | float) else stored_importance(value)


Importance = Annotated[float, BeforeValidator(_as_stored), Field(ge=0, le=1, strict=True, allow_inf_nan=False)]


class ApiModel(BaseModel):
    """A request or response shape of this API. Built when first used, not at import: a cold container
    validates with the one or two models its first request needs, not with all thirty (bench/cold_start.py)."""
    model_config = ConfigDict(defer_build=True)


class Strict(ApiModel):
    model_config = ConfigDict(extra="forbid")


class NewSession(Strict):
    persona_id: Annotated[str, StringConstraints(min_length=1, max_length=64), BeforeValidator(_storable)]


class NewTurn(Strict):
    content: Content
    client_turn_id: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._:-]{1,128}$")] | None = None


class Memory(ApiModel):
    """A memory as its owner sees it (never its embedding)."""
    id: UUID
    layer: MemoryLayer
    category: Category | None
    content: str
    importance: float | None
    persona_id: str | None = Field(description="the persona of a relationship memory; null in the profile layer")
    created_at: datetime
    occurred_at: str | None = Field(description=f"its event time, when a session (or the user) said when what "
                                                f"it is about happened or will happen: {EVENT_TIME_FORMS}; null: "
                                                f"none was said")
    occurred_precision: Precision | None = Field(description="the size of that period; null with occurred_at")
    source: Source = Field(
        description="what wrote it: a chat utterance, session-end dreaming, the per-user deep pass, the user")
    session_id: UUID | None = Field(description="the session it came from")
    from_message_id: int | None = Field(description="first message of the range it was distilled from")
    through_message_id: int | None = Field(description="last message of that range")
    model: str | None = Field(description="the model that wrote it, if one did")
    last_confirmed_at: datetime | None = Field(description="when it was last repeated or confirmed")
    mention_count: int
    superseded_at: datetime | None = Field(description="validity end; null while the memory is active")
    superseded_by: UUID | None = Field(description="the memory that replaced it (null once that one is deleted)")
    superseded_reason: SupersededReason | None = Field(
        description="changed: a newer fact replaced it; duplicate: merged into its twin; reverted: the user restored"
                    " an older version; outdated: an utterance that stated a fact which changed (superseded_by"
                    " names that fact)")
    supersedes: list[UUID] = Field(description="ids of the memories this one replaced")

    @model_validator(mode="before")
    @classmethod
    def _event_time_as_text(cls, row):
        """The store's first day and precision as the text form (a week's first day alone would read as a day)."""
        if isinstance(row, Mapping) and isinstance(row.get("occurred_at"), date):
            row = {**row, "occurred_at": event_time_text(row["occurred_at"], row.get("occurred_precision"))}
        return row


class MemoryPage(ApiModel):
    memories: list[Memory]
    next_before: str | None = Field(description="an opaque cursor: pass it as `before` for the next page (it stays "
                                                "valid when the memory it was taken from is deleted); null on the "
                                                "last page")


class MemoryWithHistory(Memory):
    history: list[Memory] = Field(description="every version of this memory (itself included), oldest first: "
                                              "what it replaced and what replaced it, recursively")


MemoryCursor = Annotated[str, StringConstraints(min_length=1, max_length=200),
                         AfterValidator(memory_store.listing_position)]


def current_user() -> str:
    sub = app.current_event.request_context.authorizer.jwt_claim.get("sub")
    if not isinstance(sub, str) or not sub or len(sub) > 255:
        raise UnauthorizedError("a verified token with a subject is required")
    problem = unstorable(sub)
    if problem:
        raise UnauthorizedError(f"the token's subject {problem}")
    return sub


def _session_of(user: str, session_id: UUID) -> None:
    if chat_store.get_session(user, session_id) is None:
        raise errors.NotFound("session not found")


# Every error answer is {"statusCode", "code", "message", ...}: ``code`` is stable (clients branch on it),
# ``message`` is for people. Codes not named where the error is raised come from its status.
_CODES = {400: "invalid_request", 401: "unauthorized", 404: "not_found", 405: "method_not_allowed", 409: "conflict",
          413: "payload_too_large", 429: "rate_limited", 422: "invalid_request", 500: "internal_error",
          503: "unavailable"}


def _error_body(status: int, message: str, code: str | None = None, **extra) -> str:
    return json.dumps({"statusCode": status, "code": code or _CODES.get(status, "error"), "message": message, **extra})


def _error(status: int, message: str, code: str | None = None, **extra) -> Response:
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON,
                    body=_error_body(status, message, code, **extra))


def _documented(ok: tuple[int, str], *errors: tuple[int, str], public: bool = False) -> dict:
    """OpenAPI responses of a route: its success and the errors it answers besides 422 (and 401, unless the
    route is ``public``)."""
    if not public:
        errors = ((401, "no valid bearer token"), *errors)
    error = {"application/json": {"schema": {"type": "object", "required": ["statusCode", "code", "message"],
                                              "properties": {"statusCode": {"type": "integer"},
                                                             "code": {"type": "string"},
                                                             "message": {"type": "string"},
                                                             "retryable": {"type": "boolean"},
                                                             "client_turn_id": {"type": "string"}}}}}
    return {ok[0]: {"description": ok[1]}, **{code: {"description": text, "content": error} for code, text in errors}}


_NOT_YOURS = (404, "no such memory of this user (another user's id answers the same)")


class HealthReport(ApiModel):
    status: Literal["ok", "degraded"]
    database: Literal["ok", "unreachable"]
    providers: dict[str, str] = Field(description="what the chat model and the embedder are (real or offline)")
    dreaming: dict[str, Any] = Field(description="ok, or held while a provider refuses our credentials (and why)")


class Check(ApiModel):
    status: Literal["ok", "failed"]
    detail: str
    ms: float
    age_s: float = Field(description="seconds since the check ran: 0, but for the providers' checks, which a "
                                     "container makes at most once per DEEP_HEALTH_CACHE_SECS")


class DeepHealth(ApiModel):
    status: Literal["ok", "failed"]
    checks: dict[str, Check] = Field(description="database, schema, llm, embedder")


_PUBLIC: list[dict[str, list[str]]] = [{}]  # OpenAPI: this route needs no token


@app.get("/v1/health", summary="is the service up", security=_PUBLIC,
         responses=_documented((200, "healthy"), (503, "degraded: the report says what"), public=True))
def health() -> Response[HealthReport]:
    report = health_check.report()
    return Response(200 if report["status"] == "ok" else 503, content_types.APPLICATION_JSON,
                    HealthReport.model_validate(report))


@app.get("/v1/health/deep", summary="check the database, the schema and each provider",
         description="Times a query, compares the applied migrations with the ones this build ships and makes one "
                     "tiny call to the chat model and the embedder, at most once per DEEP_HEALTH_CACHE_SECS per "
                     "container: meanwhile it answers the provider checks it made last, with their age. Needs a "
                     "token; the provider calls are the deployment's, no user's usage (`eros doctor` always makes "
                     "them).",
         responses=_documented((200, "every check passed"), (503, "a check failed: its detail says why")))
def deep_health() -> Response[DeepHealth]:
    current_user()
    report = health_check.deep_report()
    return Response(200 if report["status"] == "ok" else 503, content_types.APPLICATION_JSON,
                    DeepHealth.model_validate(report))


def openapi_document() -> str:
    """The API's OpenAPI document: every route's parameters, bodies and answers, and the bearer scheme
    every route but the public ones requires (the JWT the authorizer verifies). Powertools' OpenAPI models
    are imported here, on the first request for the document: they cost every cold start ~100 ms."""
    from aws_lambda_powertools.event_handler.openapi.models import HTTPBearer

    bearer = HTTPBearer(bearerFormat="JWT", description="a token of the configured issuer; its `sub` is the user")
    return app.get_openapi_json_schema(title=TITLE, version="1.0.0", security_schemes={"bearer": bearer},
                                       security=[{"bearer": []}])


@app.get("/v1/openapi.json", summary="this document", security=_PUBLIC, compress=True)
def openapi():
    return Response(200, content_types.APPLICATION_JSON, openapi_document())


@app.get("/v1/docs", include_in_schema=False, compress=True)
def docs():
    """The Swagger UI over /v1/openapi.json's document, its script and styles inline (no request to a CDN).
    Built on the first visit: Powertools' ``enable_swagger`` imports its OpenAPI models at start-up, ~100 ms
    of every cold start for a page no chat turn needs."""
    from importlib.resources import files

    from aws_lambda_powertools.event_handler.openapi.swagger_ui import generate_swagger_html

    if app.current_event.get_query_string_value("format") == "json":  # the page's own link to its document
        return openapi()
    assets = files("aws_lambda_powertools.event_handler.openapi.swagger_ui")
    spec = openapi_document().replace("</", "<\\/")  # stays in its <script>
    page = generate_swagger_html(spec, assets.joinpath("swagger-ui-bundle.min.js").read_text("utf-8"),
                                 assets.joinpath("swagger-ui.min.css").read_text("utf-8"), "", None)
    return Response(200, content_types.TEXT_HTML, page)


class PersonaView(ApiModel):
    id: str
    name: str
    description: str


class PersonaList(ApiModel):
    personas: list[PersonaView]


@app.get("/v1/personas", summary="the personas to chat with", responses=_documented((200, "the personas")))
def personas() -> PersonaList:
    current_user()
    return PersonaList.model_validate({"personas": chat_store.list_personas()})


class CreatedSession(ApiModel):
    id: UUID
    persona_id: str
    created_at: datetime
    last_active_at: datetime


@app.post("/v1/sessions", summary="start a session with a persona",
          responses=_documented((201, "the session"), (404, "no such persona")))
def create_session(body: NewSession) -> Response[CreatedSession]:
    session = chat_store.create_session(current_user(), body.persona_id)
    if session is None:
        raise errors.NotFound(f"persona {body.persona_id!r} not found")
    return Response(201, content_types.APPLICATION_JSON, CreatedSession.model_validate(session))


class DreamingState(ApiModel):
    state: Literal["active", "waiting", "claimed", "retrying", "extracted", "failed"] = Field(
        description="active: not quiet long enough yet; waiting: for the next sweep; claimed: being extracted; "
                    "retrying: after a failure, at due_at; extracted: its memories are written; failed: given up "
                    "(error says why; a new message makes it eligible again)")
    error: str | None = Field(description="the last failed attempt's error")
    attempts: int
    due_at: datetime | None = Field(description="when it is quiet enough to be dreamt about, or retried")


class SessionView(CreatedSession):
    extracted_at: datetime | None
    dreaming: DreamingState


class SessionList(ApiModel):
    sessions: list[SessionView] = Field(description="newest first")


@app.get("/v1/sessions", summary="the caller's sessions and where each is in dreaming",
         responses=_documented((200, "the sessions")))
def sessions() -> SessionList:
    rows = chat_store.list_sessions(current_user(), settings().dreaming_idle_secs)
    return SessionList.model_validate({"sessions": rows})


@app.post("/v1/sessions/<session_id>/turns", summary="one chat turn",
          description="The message is stored, claiming `client_turn_id` for it, before the model is called: a "
                      "retry with the same content replays the reply; other content with that id is a 409. On a "
                      "model failure the message is kept; the answer says whether a retry can help (`retryable`).",
          responses=_documented((200, "the reply"), (404, "no such session of this user"),
                                (409, "turn_conflict: client_turn_id already used for another message; "
                                      "session_gone: the user was erased while the turn ran"),
                                (429, "rate_limited or budget_exhausted: over a per-user limit (Retry-After)"),
                                (502, "model_error: the provider refused the request (not retryable)"),
                                (503, "model_unavailable (retryable) or database_unavailable"),
                                (504, "model_timeout (retryable)")))
def take_turn(session_id: UUID, body: NewTurn) -> chat.TurnResult:
    return chat.take_turn(current_user(), session_id, body.content, body.client_turn_id)


class MessageView(ApiModel):
    id: int
    role: Literal["user", "assistant"]
    content: str
    client_turn_id: str | None
    sent_at: datetime
    recalled: list[chat.RecalledMemory] | None = Field(
        description="a reply's: the memories its prompt carried, with their scores (their text is the memories' "
                    "own: look them up by id); null for the user's messages")


class MessagePage(ApiModel):
    messages: list[MessageView] = Field(description="newest first")
    next_before: int | None = Field(description="pass as `before` for the next (older) page; null on the last")


@app.get("/v1/sessions/<session_id>/messages", summary="a page of a session's messages",
         responses=_documented((200, "the page"), (404, "no such session of this user")))
def messages(session_id: UUID, limit: Annotated[int, Query(ge=1, le=200)] = 50,
             before: Annotated[int | None, Query(ge=1, le=MAX_BIGINT)] = None) -> MessagePage:
    user = current_user()
    _session_of(user, session_id)
    page = chat_store.list_messages(user, session_id, limit, before)
    return MessagePage.model_validate({"messages": page, "next_before": page[-1]["id"] if len(page) == limit else None})


@app.get("/v1/memories", summary="the caller's memories, newest first",
         responses=_documented((200, "a page of memories")))
def memories(layer: Annotated[MemoryLayer | None, Query()] = None,
             category: Annotated[Category | None, Query()] = None,
             limit: Annotated[int, Query(ge=1, le=500)] = 100,
             before: Annotated[MemoryCursor | None,
                               Query(description="the next_before of the previous page (a memory id is accepted "
                                                 "too, while that memory exists)")] = None,
             include: Annotated[Literal["superseded"] | None,
                                Query(description="'superseded': list history (superseded rows) too; "
                                                  "default: active memories only")] = None) -> MemoryPage:
    user = current_user()
    rows = memory_store.list_memories(user, layer, category, limit, _position(user, before),
                                      include_superseded=include == "superseded")
    return MemoryPage.model_validate(
        {"memories": rows, "next_before": memory_store.memory_cursor(rows[-1]) if len(rows) == limit else None})


def _position(user: str, before: object) -> tuple[datetime, UUID] | None:
    """Where the listing continues: a validated cursor's position, or an older client's memory id looked up."""
    if isinstance(before, UUID):  # an older client's cursor: the id of the last memory it was shown
        position = memory_store.position_of(user, before)
        if position is None:
            raise RequestValidationError([{"loc": ("query", "before"), "type": "value_error",
                                           "msg": f"no memory {before} (deleted?): pass the next_before of the "
                                                  f"previous page instead"}])
        return position
    return before if isinstance(before, tuple) else None


@app.get("/v1/memories/<memory_id>", summary="one memory with its history",
         description="The memory and `history`: every version of it (what it replaced and what replaced it, "
                     "recursively, itself included), oldest first.",
         responses=_documented((200, "the memory"), _NOT_YOURS))
def memory(memory_id: UUID) -> MemoryWithHistory:
    found = memory_store.get_memory(current_user(), memory_id)
    if found is None:
        raise errors.NotFound("memory not found")
    return MemoryWithHistory.model_validate(found)


@app.post("/v1/memories/<memory_id>/restore", summary="undo a supersession",
          description="The memory is active again and confirmed now. Unless it had been merged as a duplicate, "
                      "its fact's current version, whichever it is by then, is superseded by it (reason "
                      "'reverted'): a fact never has two current versions. A merged duplicate becomes a fact of "
                      "its own again.",
          responses=_documented((200, "the restored memory with its history"), _NOT_YOURS,
                                (409, "the memory is active: nothing to restore")))
def restore_memory(memory_id: UUID) -> MemoryWithHistory:
    restored = memory_store.restore_memory(current_user(), memory_id)
    if restored is None:
        raise errors.NotFound("memory not found")
    return MemoryWithHistory.model_validate(restored)


_MODEL_FAILURES = ((429, "rate_limited or budget_exhausted: over a per-user limit, as a chat turn (Retry-After)"),
                   (502, "the embedder refused the text (retrying will not help)"),
                   (503, "the embedder is unavailable (retryable)"), (504, "the embedder timed out (retryable)"))


class MemorySearch(Strict):
    query: Content
    layer: MemoryLayer | None = Field(None, description="default: both (the relationship layer needs persona_id)")
    category: Category | None = Field(None, description="profile memories of this category only")
    persona_id: Annotated[str, StringConstraints(min_length=1, max_length=64), BeforeValidator(_storable)] | None = \
        Field(None, description="the persona whose relationship memories (what was said to it) are searched too")
    k: Annotated[int, Field(ge=1, le=50)] = 10


class SearchResult(Memory):
    score: float = Field(description="what ranks it: similarity + recency + importance - demotion")
    parts: recall.ScoreParts


class SearchResults(ApiModel):
    results: list[SearchResult] = Field(description="best first")


@app.post("/v1/memories/search", summary="search the caller's memories",
          description="The ranking a chat turn recalls with, without its per-category quota, and each result's "
                      "score parts: why it is where it is.",
          responses=_documented((200, "the results, best first"),
                                (404, "persona_id names a persona the caller never talked to"), *_MODEL_FAILURES))
def search_memories(body: MemorySearch) -> SearchResults:
    return SearchResults.model_validate({"results": curation.search(
        current_user(), body.query, layer=body.layer, category=body.category, persona_id=body.persona_id, k=body.k)})


class NewMemory(Strict):
    content: Content
    category: Category
    importance: Importance | None = Field(
        None, description=f"0..1; default {curation.USER_IMPORTANCE} (what the user states matters)")
    occurred_at: EventTimeText | None = None


class MemoryEdit(Strict):
    content: Content | None = None
    category: Category | None = None
    importance: Importance | None = None
    occurred_at: EventTimeText | None = Field(None, description="the new event time; null clears it; left out: "
                                                                "kept")

    @model_validator(mode="after")
    def _changes_something(self):
        if (self.content is None and self.category is None and self.importance is None
                and "occurred_at" not in self.model_fields_set):  # an explicit null clears the event time
            raise ValueError("name at least one of content, category, importance, occurred_at to change")
        return self

    def changes(self) -> dict[str, Any]:
        """What ``curation.edit`` takes: the fields given, the event time as ``occurred`` (None: clear it)."""
        changes = self.model_dump(exclude_none=True, exclude={"occurred_at"})
        if "occurred_at" in self.model_fields_set:
            changes["occurred"] = event_of(self.occurred_at)
        return changes


@app.post("/v1/memories", summary="state a memory",
          description="A profile memory the user states directly (source 'user'), embedded once.",
          responses=_documented((201, "the new memory"), *_MODEL_FAILURES))
def add_memory(body: NewMemory) -> Response[MemoryWithHistory]:
    memory = curation.remember(current_user(), body.content, body.category, body.importance,
                               event_of(body.occurred_at))
    return Response(201, content_types.APPLICATION_JSON, MemoryWithHistory.model_validate(memory))


@app.patch("/v1/memories/<memory_id>", summary="edit a memory",
           description="A new version of the current version of a profile memory: it supersedes the old one "
                       "(reason 'edited'; the history keeps both) and keeps where the memory came from. The text "
                       "is embedded again only when it changed.",
           responses=_documented((200, "the new version with its history"), _NOT_YOURS,
                                 (409, "not the current version of a profile memory (memory_not_current)"),
                                 *_MODEL_FAILURES))
def edit_memory(memory_id: UUID, body: MemoryEdit) -> MemoryWithHistory:
    return MemoryWithHistory.model_validate(curation.edit(current_user(), memory_id, body.changes()))


class Deleted(ApiModel):
    deleted: int = Field(description="how many memories were deleted (0 when none matched)")


@app.delete("/v1/memories", summary="delete the memories of a layer and/or a category",
            description="Every memory of the caller matching both filters, history included. At least one filter "
                        "is required (DELETE /v1/me erases everything). Memories of other kinds that one of them "
                        "had replaced stay history.",
            responses=_documented((200, "how many were deleted")))
def delete_memories(layer: Annotated[MemoryLayer | None, Query()] = None,
                    category: Annotated[Category | None, Query()] = None) -> Deleted:
    user = current_user()
    if layer is None and category is None:
        raise RequestValidationError([{"loc": ("query",), "type": "value_error",
                                       "msg": "name a layer and/or a category to delete (DELETE /v1/me erases "
                                              "everything)"}])
    return Deleted(deleted=memory_store.delete_memories(user, layer, category))


@app.delete("/v1/memories/<memory_id>", summary="delete a memory",
            description="Memories it had replaced stay history (their validity end is kept).",
            responses=_documented((204, "deleted"), _NOT_YOURS))
def delete_memory(memory_id: UUID):
    if not memory_store.delete_memory(current_user(), memory_id):
        raise errors.NotFound("memory not found")
    return Response(204, None, "")


class Erased(ApiModel):
    """What an erasure deleted, by kind (all 0 when there was nothing, e.g. the second time)."""
    memories: int = Field(description="both layers, superseded history included")
    messages: int
    sessions: int
    persona_instances: int
    deep_pass: int = Field(description="the user's deep-pass (per-user consolidation) record")
    usage_days: int = Field(description="days of token usage and turn counts")
    usage_by_model: int = Field(description="rows of usage per day, purpose and model")
    exports: int = Field(description="export files not yet expired")


class Erasure(ApiModel):
    erased: Erased


class ExportLink(ApiModel):
    url: str = Field(description="where the export is, a JSON document: sessions with their messages, memories with "
                                 "their history, usage per day")
    expires_at: datetime = Field(description="the link (and, within a day, the file) expires")
    bytes: int


@app.get("/v1/export", summary="everything the engine holds about the caller",
         description="Writes the caller's whole record as one JSON document and answers a link to it (a document "
                     "can be far larger than an API answer may be). The link expires; the file is deleted within a "
                     "day, and by DELETE /v1/me.",
         responses=_documented((200, "the link"), (503, "exports are not configured here")))
def export_record() -> ExportLink:
    done = records.export(current_user())
    metrics.add_metric(name="ExportsWritten", unit="Count", value=1)
    return ExportLink(url=done.url, expires_at=done.expires_at, bytes=done.bytes)


@app.delete("/v1/me", summary="erase everything of the caller",
            description="Messages, sessions, persona instances, both memory layers with their history, usage, and "
                        "any dreaming queued for them, in one transaction. Dreaming that is running writes nothing "
                        "after it. Idempotent: erasing again answers zeros.",
            responses=_documented((200, "what was erased")))
def erase_me() -> Erasure:
    erased = records.erase(current_user())
    logger.info("user erased", extra={"erased": erased})  # counts only: never the user id or any content
    metrics.add_metric(name="UsersErased", unit="Count", value=1)
    return Erasure(erased=Erased(**erased))


class CallsUsage(ApiModel):
    purpose: Literal["chat", "extraction", "deep_pass", "curation"] = Field(
        description="chat: turns (reply and query embedding); extraction and deep_pass: dreaming; curation: the "
                    "memory API's embeddings")
    model: str
    calls: int
    input_tokens: int
    output_tokens: int
    estimated_cost: float | None = Field(description="USD at the configured list prices; null: the model has no price")


class DayUsage(ApiModel):
    day: date = Field(description="a UTC day")
    tokens: int = Field(description="what the daily token budget counted")
    estimated_cost: float
    calls: list[CallsUsage]


class PurposeUsage(ApiModel):
    purpose: str
    calls: int
    input_tokens: int
    output_tokens: int
    estimated_cost: float


class UsageTotals(ApiModel):
    tokens: int
    calls: int
    input_tokens: int
    output_tokens: int
    estimated_cost: float


class UsageReport(ApiModel):
    model_config = ConfigDict(populate_by_name=True)
    first: date = Field(alias="from")
    last: date = Field(alias="to")
    currency: str
    daily_token_budget: int | None = Field(description="tokens a day the caller may spend (null: no budget)")
    days: list[DayUsage] = Field(description="days with any usage, oldest first")
    purposes: list[PurposeUsage] = Field(description="the range per purpose")
    totals: UsageTotals
    unpriced_models: list[str] = Field(description="models with no configured price: their cost is not in a total")


@app.get("/v1/usage", summary="the caller's usage and its estimated cost",
         description="Tokens and provider calls per UTC day, purpose and model, with a cost estimated at the "
                     f"configured list prices. Without dates: the last {usage.DEFAULT_DAYS} days; at most "
                     f"{usage.MAX_DAYS} days at a time.",
         responses=_documented((200, "the report")))
def usage_report(first: Annotated[date | None, Query(alias="from", description="first UTC day (YYYY-MM-DD)")] = None,
                 last: Annotated[date | None, Query(alias="to", description="last UTC day, included")] = None
                 ) -> UsageReport:
    first, last = usage.days_of(first, last)
    return UsageReport.model_validate(usage.report(current_user(), first, last))


@app.exception_handler(RequestValidationError)
def invalid_request(error: RequestValidationError):
    problems = [{"field": ".".join(str(p) for p in e.get("loc", ())), "problem": e.get("msg", "invalid"),
                 **({"detail": e["ctx"]["error"]} if isinstance(e.get("ctx", {}).get("error"), str) else {})}
                for e in error.errors()]
    summary = "; ".join(f"{p['field']}: {p['problem']}" for p in problems)
    malformed = any(e.get("type") == "json_invalid" for e in error.errors())
    return _error(400 if malformed else 422, f"invalid request: {summary}", errors=problems)


@app.exception_handler(errors.ClientError)
def client_error(error: errors.ClientError):
    response = _error(error.status, str(error), error.code, **error.extra)
    if "retry_after" in error.extra:  # seconds until a limit lifts, also as the header clients know
        response.headers["Retry-After"] = str(error.extra["retry_after"])
    return response


@app.exception_handler(psycopg.OperationalError)
def database_unavailable(error: psycopg.OperationalError):
    if isinstance(error, psycopg.errors.DeadlockDetected | psycopg.errors.SerializationFailure):
        # Not an outage: the change conflicted with another one each of the times it was tried (eros.db.retried).
        logger.warning("a change kept conflicting with another", extra={"error": type(error).__name__})
        return _error(503, "this change conflicted with another one each time it was tried; nothing of it was"
                      " written: retry", "database_busy", retryable=True)
    logger.warning("database unavailable", extra={"error": type(error).__name__})
    return _error(503, "the database is unavailable; retry later", "database_unavailable", retryable=True)


@app.exception_handler(ServiceError)
def service_error(error: ServiceError):
    return _error(error.status_code, str(error.msg))


@app.exception_handler(Exception)
def unexpected(error: Exception):
    logger.exception("unhandled error")
    return _error(500, "internal error", request_id=app.lambda_context.aws_request_id)


@app.not_found
def not_found_error(error: NotFoundError):
    # Powertools sends both unknown routes (no message) and NotFoundError raised by routes here.
    event = app.current_event
    return _error(404, str(error.msg) if getattr(error, "msg", "") else f"no route {event.http_method} {event.path}")


def _refuse(status: int, message: str) -> dict:
    """An error answered before routing (API Gateway-shaped result)."""
    return {"statusCode": status, "headers": {"Content-Type": content_types.APPLICATION_JSON},
            "body": _error_body(status, message)}


def _as_json_request(event: dict) -> dict | None:
    """Size-check and normalise the body; returns a refusal, or None when the event may be routed."""
    limit = settings().max_body_bytes
    body = event.get("body") or ""
    if len(body) > limit * (4 / 3 if event.get("isBase64Encoded") else 1):
        return _refuse(413, f"request body is larger than {limit} bytes")
    if event.get("isBase64Encoded") and body:
        try:
            event["body"] = base64.b64decode(body, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return _refuse(400, "invalid request: the body is not UTF-8 JSON")
        event["isBase64Encoded"] = False
    method = (event.get("requestContext") or {}).get("http", {}).get("method", "")
    if event.get("body") and method.upper() in ("POST", "PUT", "PATCH"):
        problem = json_body.unreadable(event["body"])
        if problem:
            return _refuse(400, f"invalid request: {problem}")
    # The API speaks JSON only: a body is read as JSON whatever Content-Type a client sent (curl's -d
    # says form-urlencoded), so a wrong header cannot route it to another parser.
    event.setdefault("headers", {})["content-type"] = content_types.APPLICATION_JSON
    return None


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_HTTP)
@tracing.lambda_handler(tracing.chat_annotations)  # no reply, page or listing in traces
@metrics.log_metrics
def lambda_handler(event: dict, context) -> dict:
    return _as_json_request(event) or app.resolve(event, context)
