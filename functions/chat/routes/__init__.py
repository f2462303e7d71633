"""The chat API's routes, one Powertools ``Router`` per area (``app.py`` includes them all), and what they share:
who the caller is, and how a route documents its answers."""

from typing import cast

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.exceptions import UnauthorizedError
from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEventV2

from models import unstorable

PUBLIC: list[dict[str, list[str]]] = [{}]  # OpenAPI: this route needs no token


def current_user(router: Router) -> str:
    """The user: the verified token's ``sub`` (the HTTP API's JWT authorizer checked the token)."""
    event = cast(APIGatewayProxyEventV2, router.current_event)  # the chat function's resolver is an HTTP API's
    sub = event.request_context.authorizer.jwt_claim.get("sub")
    if not isinstance(sub, str) or not sub or len(sub) > 255:
        raise UnauthorizedError("a verified token with a subject is required")
    problem = unstorable(sub)
    if problem:
        raise UnauthorizedError(f"the token's subject {problem}")
    return sub


def documented(ok: tuple[int, str], *errors: tuple[int, str], public: bool = False) -> dict:
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
