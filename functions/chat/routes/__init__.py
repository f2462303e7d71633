"""The chat API's routes, one Powertools ``Router`` per area (``app.py`` includes them all), and what they share:
who the caller is, and how a route documents its answers."""

from typing import cast

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEventV2

from eros import errors
from eros.apps import Caller, from_token  # not `apps`: routes/apps.py is this package's `apps`
from eros.config import settings

PUBLIC: list[dict[str, list[str]]] = [{}]  # OpenAPI: this route needs no token
# The 403 of the operator routes (current_operator).
OPERATORS = (403, "forbidden: neither a token with the operator scope (OPERATOR_SCOPE) nor the app's API key")

# The OpenAPI document's description (its ``info``): what every route shares. app.py writes the error answers.
CONVENTIONS = """\
No request names its user: the user is the token's `sub`, in the app its `eros_app` claim names (none: the \
first app, "default"). An app's servers call the same routes under `/server` (`/server/v1/...`) with one of the \
app's API keys in `X-Api-Key` (no token), naming the user they act for in `X-Eros-User`; without it, they act as \
the app's operator.

## Errors

Every error is a JSON object `{"statusCode", "code", "message", ...}`. `code` is stable: branch on it.
`message` names the problem for people and never carries a provider's text. The codes:

| status | code | when |
| --- | --- | --- |
| 400 | `invalid_request` | the body is not UTF-8 JSON, is nested deeper than 32 levels, or has a number too long \
to read |
| 401 | `unauthorized` | the token's subject is missing, over 255 characters, or has a NUL character, a lone \
surrogate or U+001F; the token's app (its `eros_app` claim, `APP_CLAIM`) is not an app id, unknown or being \
deleted; on the `/server` routes: no `X-Api-Key`, or one that is not a live key of a live app (malformed, \
revoked, rotated away), or an `X-Eros-User` that cannot name a user (empty, over 255 characters, a NUL character, \
a lone surrogate or U+001F), or none on a route that acts for one user |
| 403 | `forbidden` | an operator route without the operator scope in the token (`OPERATOR_SCOPE`); an app's API \
key is its operator's |
| 404 | `not_found` | an unknown route, or an unknown session, memory or persona (another user's id answers the same) |
| 409 | `turn_conflict`, `turn_in_progress`, `message_conflict`, `out_of_order`, `session_gone`, `memory_active`, \
`memory_not_current`, `too_many_personas`, `persona_taken` | as the route says (`turn_in_progress`: \
`retryable: true`) |
| 413 | `payload_too_large` | a body over `MAX_BODY_BYTES` (64 KiB) |
| 422 | `invalid_request` | a field or parameter refused: missing, extra or of the wrong type, text over \
`MAX_CONTENT_CHARS` (4,000 characters) or with a NUL character or a lone surrogate, a malformed id or cursor; \
`errors` lists each `{field, problem, detail?}` |
| 429 | `rate_limited`, `budget_exhausted` | over a per-user limit; `limit`, `retry_after` and the `Retry-After` \
header say until when; nothing was stored or paid for |
| 502 | `model_error` | the model or the embedder refused the request (a 400 or 403, an unusable answer): \
`retryable: false` |
| 503 | `model_unavailable`, `database_unavailable`, `database_busy`, `exports_unavailable`, \
`provider_not_configured`, `provider_misconfigured`, `service_misconfigured` | `retryable: true` but for exports \
and the three configuration codes, which wait for the operator: `service_misconfigured`, a setting of the \
deployment that cannot be used (the function's log names the variable); `provider_not_configured`, a \
deployment whose provider secret lacks a key \
(`/v1/health` names the key); `provider_misconfigured`, a provider that refuses the deployment's key (401), has \
no credit (402) or does not serve the configured model (the message names `CHAT_MODEL`, `EXTRACT_MODEL` or \
`EMBED_MODEL`; `eros doctor` and `/v1/health/deep` check each), or an embedder of another model than the one \
the stored memories were embedded with (`eros doctor` names both); `database_busy`: the change conflicted with \
another each of the three times it was tried, and nothing of it was written |
| 504 | `model_timeout` | `retryable: true` |
| 500 | `internal_error` | a bug; `request_id` names the request in the logs |

A 401 comes in two shapes; branch on the status, not the body. A missing, malformed or expired token, or one of \
another issuer or audience, never reaches the API: in AWS the HTTP API's JWT authorizer answers \
`{"message": "Unauthorized"}` (no `code`), and the local stack answers the same body. A verified token whose \
subject the API cannot use gets the API's own `{"statusCode": 401, "code": "unauthorized", ...}`, everywhere; \
so does every refused request to the `/server` routes (the API checks their key itself). \
The Python client raises `eros_client.Unauthorized` (`code` "unauthorized") for both. \
Bad input is refused before any model call."""


def current_caller(router: Router) -> Caller:
    """Who the request is from (eros.apps): an app's server by its API key (the ``/server`` routes: ``app.handle``
    checked the key and put its caller where a Lambda authorizer's context goes), or an end user by the verified
    JWT's ``sub`` and app claim (checked by the HTTP API's JWT authorizer in AWS)."""
    event = cast(APIGatewayProxyEventV2, router.current_event)  # the chat function's resolver is an HTTP API's
    keyed = event.request_context.authorizer.get_lambda
    if keyed:
        return Caller(keyed["app"], keyed.get("user"), True)
    return from_token(event.request_context.authorizer.jwt_claim, settings())


def current_user(router: Router) -> str:
    """The user: the engine's key of the token's ``sub`` in its app, or of the user an app's server names."""
    user = current_caller(router).user
    if user is None:
        raise errors.Unauthorized("this route acts for one user: an app's server names them in X-Eros-User")
    return user


def current_operator(router: Router) -> str:
    """The app whose operator the caller is: a token granting the operator scope (``Settings.operator_scope``
    among the space-separated ``scope`` claim), or the app's API key. Else a 403."""
    caller = current_caller(router)
    if not caller.operator:
        raise errors.Forbidden(f"this route is for operators: the token must grant the {settings().operator_scope!r}"
                               " scope, or the request come with the app's API key")
    return caller.app


def documented(ok: tuple[int, str], *errors: tuple[int, str], public: bool = False) -> dict:
    """OpenAPI responses of a route: its success and the errors it answers besides 422 (``INVALID_REQUEST``, on
    every route) and 401 (unless the route is ``public``)."""
    if not public:
        errors = ((401, "no valid bearer token (under /server: no live API key of the app, or an X-Eros-User that"
                         " cannot name a user)"), *errors)
    error = {"application/json": {"schema": {"type": "object", "required": ["statusCode", "code", "message"],
                                              "properties": {"statusCode": {"type": "integer"},
                                                             "code": {"type": "string"},
                                                             "message": {"type": "string"},
                                                             "retryable": {"type": "boolean"},
                                                             "client_turn_id": {"type": "string"}}}}}
    return {ok[0]: {"description": ok[1]}, **{code: {"description": text, "content": error} for code, text in errors}}


# The 422 every route answers when the resolver's validation refuses a request: app.py's invalid_request body,
# documented in place of Powertools' default shape (which the API never sends), exactly: no other field.
INVALID_REQUEST = {
    "description": "invalid request: a parameter or field the schema refuses",
    "content": {"application/json": {"schema": {
        "type": "object", "additionalProperties": False, "required": ["statusCode", "code", "message", "errors"],
        "properties": {
            "statusCode": {"const": 422}, "code": {"const": "invalid_request"},
            "message": {"type": "string", "description": "invalid request: each field and its problem"},
            "errors": {"type": "array", "description": "each refused field", "items": {
                "type": "object", "additionalProperties": False, "required": ["field", "problem"],
                "properties": {
                    "field": {"type": "string", "description": "where, e.g. body.content or query.limit"},
                    "problem": {"type": "string"},
                    "detail": {"type": "string", "description": "a refused text's reason, when there is one"}}}}}}}},
}
POWERTOOLS_422 = ("HTTPValidationError", "ValidationError", "ResponseValidationError")  # its default shapes: unused
