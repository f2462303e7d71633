"""Chat API (API Gateway HTTP API -> this Lambda). Transport only: each route (``routes/``, one Router per area)
calls one use-case or store; here are the resolver, the JSON guard before routing and every error answer.

The user is the verified JWT's ``sub`` (checked by the HTTP API's JWT authorizer in AWS, and by the
local dev server the same way); no route takes a user id from the request.
"""

import base64
import binascii
import json
from collections.abc import Iterator

import psycopg
from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response, content_types
from aws_lambda_powertools.event_handler.exceptions import NotFoundError, ServiceError
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.logging import correlation_paths

from eros import apps, errors, json_body, snapstart, streaming, tracing
from eros.config import SettingsError, settings
from eros.db import embedding_switched
from eros.observability import logger, metrics

from routes import account, health, imports, memories, personas, sessions
from routes import apps as app_routes

app = APIGatewayHttpResolver(enable_validation=True)
for area in (health, personas, sessions, imports, memories, account, app_routes):
    app.include_router(area.router)
snapstart.register()  # with SnapStart (template.yaml: ChatColdStart): warm before the snapshot, renew after

# Every error answer is {"statusCode", "code", "message", ...}: ``code`` is stable (clients branch on it),
# ``message`` is for people. Codes not named where the error is raised come from its status.
_CODES = {400: "invalid_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
          409: "conflict", 413: "payload_too_large", 429: "rate_limited", 422: "invalid_request", 500: "internal_error",
          503: "unavailable"}


def _error_body(status: int, message: str, code: str | None = None, **extra) -> str:
    return json.dumps({"statusCode": status, "code": code or _CODES.get(status, "error"), "message": message, **extra})


def _error(status: int, message: str, code: str | None = None, **extra) -> Response:
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON,
                    body=_error_body(status, message, code, **extra))


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


@app.exception_handler(SettingsError)
def misconfigured(error: SettingsError):
    return _error(503, *_misconfigured(error))


def _misconfigured(error: SettingsError) -> tuple[str, str]:
    """A setting of the deployment cannot be used (``DREAMING_IDLE_SECS=abc``): the operator's to fix, so a 503 that
    says so, never a 500 as for a bug; the log names the variable, the answer does not (it is no client's business)."""
    logger.error("a setting cannot be used: fix it in the function's environment", extra={"error": str(error)})
    return "the service is misconfigured: its operator must fix a setting (the logs name it)", "service_misconfigured"


@app.exception_handler(Exception)
def unexpected(error: Exception):
    if embedding_switched(error):  # a re-embedding switched models under this request: nothing was written
        logger.warning("the embedding model was switched while the request ran")
        return _error(503, "the memory's embedding model was switched while this request ran; nothing of it was"
                      " written: retry", "database_busy", retryable=True)
    logger.exception("unhandled error")
    return _error(500, "internal error", request_id=app.lambda_context.aws_request_id)


@app.not_found
def not_found_error(error: NotFoundError):
    # Powertools sends both unknown routes (no message) and NotFoundError raised by routes here.
    event = app.current_event
    return _error(404, str(error.msg) if getattr(error, "msg", "") else f"no route {event.http_method} {event.path}")


def _refuse(status: int, message: str, code: str | None = None) -> dict:
    """An error answered before routing (API Gateway-shaped result)."""
    return {"statusCode": status, "headers": {"Content-Type": content_types.APPLICATION_JSON},
            "body": _error_body(status, message, code)}


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


SERVER = "/server"  # an app's servers: the same routes under this prefix, with the app's API key (eros.apps)


def _as_server_request(event: dict) -> dict | None:
    """A request to ``/server/...``: its API key checked (template.yaml routes these without the JWT authorizer),
    its caller put where a Lambda authorizer's context goes (``routes.current_caller`` reads it), and the prefix
    taken off so the same routes answer. A refusal, or None when the event may be routed."""
    path = event.get("rawPath") or ""
    if path != SERVER and not path.startswith(SERVER + "/"):
        return None
    context = event.setdefault("requestContext", {})
    context.pop("authorizer", None)  # only what this function verifies below speaks for the caller
    headers = event.get("headers") or {}
    try:
        caller, _ = apps.from_key(headers.get("x-api-key"), headers.get("x-eros-user"))
    except errors.Unauthorized as refused:
        return _refuse(401, str(refused))
    except psycopg.OperationalError:
        return _refuse(503, "the database is unavailable; retry later", "database_unavailable")
    event["rawPath"] = path[len(SERVER):] or "/"
    context.setdefault("http", {})["path"] = event["rawPath"]
    context["authorizer"] = {"lambda": {"app": caller.app, "user": caller.user}}
    return None


def handle(event: dict, context) -> dict:
    """A request through the guards and the routes: the API Gateway-shaped answer. A streamed turn's route answers
    its status and headers, and leaves its events in ``eros.streaming.pending`` for the caller to send."""
    streaming.pending.set(None)
    try:
        refused = _as_json_request(event) or _as_server_request(event)  # the first to read the settings
    except SettingsError as error:
        return _refuse(503, *_misconfigured(error))
    return refused or app.resolve(event, context)


def sse_body(events: Iterator[streaming.Event]) -> Iterator[bytes]:
    """A streamed turn's events as Server-Sent Events. A failure after the stream began is its last event,
    ``error``, with the body the JSON route would answer it with (the same handlers above). A client that goes
    away (``close()``) does not stop the turn: the rest is run, unsent, so its reply is stored whole."""
    gone = False
    try:
        for name, data in events:
            if gone:
                continue
            try:
                yield streaming.sse(name, data)
            except GeneratorExit:
                gone = True
                logger.info("the client went away mid-stream: the turn goes on to store its reply")
    except Exception as error:  # noqa: BLE001 - each is answered by the handler the JSON route uses for it
        answer = app.exception_handler_manager.lookup_exception_handler(type(error))  # as resolve() dispatches
        body = json.loads(answer(error).body) if answer else json.loads(_error_body(500, "internal error"))
        if not gone:
            yield streaming.sse("error", body)


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_HTTP)
@tracing.lambda_handler(tracing.chat_annotations)  # no reply, page or listing in traces
@metrics.log_metrics
def lambda_handler(event: dict, context) -> dict:
    result = handle(event, context)
    events = streaming.pending.get()
    if events is not None:  # the HTTP API cannot stream: the same events, whole (StreamUrl streams them)
        result["body"] = b"".join(sse_body(events)).decode()
    return result
