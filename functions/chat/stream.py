"""The streamed chat turn (a Lambda function URL in response-streaming mode -> this function, which
``eros.stream_runtime`` runs, since Python's managed runtime does not stream; the local stack's dev server runs it
the same way). Transport only: the token checked (``eros.auth``), then the same guards, route and errors as the
JSON API (``app.handle``), and the turn's events sent as they come (``app.sse_body``).

It serves one route, ``POST /v1/sessions/{session_id}/turns/stream``; the rest of the API is the HTTP API's.
"""

import json
import re
from collections.abc import Iterator

from aws_lambda_powertools.logging import correlation_paths

from eros import auth, streaming
from eros.observability import logger, metrics
from eros.streaming import Streamed

import app

_ROUTE = re.compile(r"^(/server)?/v1/sessions/[^/]+/turns/stream$")  # /server: an app's API key (app.handle)
_JSON = {"Content-Type": "application/json"}


def _whole(status: int, body: dict) -> Streamed:
    return Streamed.whole(status, _JSON, json.dumps(body))


@logger.inject_lambda_context(correlation_id_path=correlation_paths.LAMBDA_FUNCTION_URL)
def lambda_handler(event: dict, context) -> Streamed:
    http = (event.get("requestContext") or {}).get("http") or {}
    if http.get("method") != "POST" or not _ROUTE.match(event.get("rawPath") or ""):
        return _whole(404, {"statusCode": 404, "code": "not_found", "message": "this URL streams chat turns only:"
                            " POST /v1/sessions/{session_id}/turns/stream; the rest of the API is at ApiUrl"})
    if (event.get("rawPath") or "").startswith(app.SERVER + "/"):  # an app's server: app.handle checks its key
        return _answer(event, context)
    try:
        claims = auth.stream_claims(event)
    except auth.IssuerUnavailable as exc:  # nothing decided about the token: retry, do not sign in again
        return _whole(exc.status, {"statusCode": exc.status, "code": exc.code, "message": str(exc), **exc.extra})
    if claims is None:  # what the HTTP API's authorizer answers
        return _whole(401, {"message": "Unauthorized"})
    event.setdefault("requestContext", {})["authorizer"] = {"jwt": {"claims": claims, "scopes": None}}
    return _answer(event, context)


def _answer(event: dict, context) -> Streamed:
    result = app.handle(event, context)
    events = streaming.pending.get()
    if events is None:  # refused before the stream began: the JSON route's answer
        return Streamed.whole(result["statusCode"], result.get("headers") or {}, result.get("body") or "")
    return Streamed(200, dict(streaming.STREAM_HEADERS), _sent(app.sse_body(events)))


def _sent(body: Iterator[bytes]) -> Iterator[bytes]:
    """The body, then the turn's metrics (recorded as it ends, after this handler returned)."""
    try:
        yield from body
    finally:
        metrics.flush_metrics()
