"""Who is calling a streamed turn: the verified claims of its bearer token.

The JSON routes are behind the HTTP API's JWT authorizer, which verifies the token before the chat function runs
and hands it the claims (``requestContext.authorizer.jwt.claims``). The streamed turn is behind a Lambda function
URL (template.yaml, ``ChatStreamFunction``; docs/DEPLOY.md, "Streaming front door"), which has no JWT authorizer
(its AuthType is NONE or AWS_IAM): the function verifies the token itself, with the checks the HTTP API's
authorizer makes, so both front doors accept exactly the same tokens:

* the signature: RS256 only (no ``none``, no HMAC: a token signed with the issuer's *public* key as an HMAC
  secret is refused), with a key of the issuer's JWKS named by the token's ``kid``. Where the keys are is the
  issuer's OIDC discovery document's ``jwks_uri`` (``{issuer}/.well-known/openid-configuration``, as the HTTP
  API's authorizer finds them; Okta's are not at the usual path), else ``{issuer}/.well-known/jwks.json``. Both are
  fetched once per container; the key set again only for a ``kid`` it does not hold (a key rotation), at most
  once in PyJWKClient's cooldown (30 s), so tokens naming made-up kids do not make the function fetch each time;
* ``iss`` equal to the issuer; ``exp``, ``nbf`` and ``iat`` against the clock with a small leeway for clock skew;
* the audience: one of ``JWT_AUDIENCE`` (comma-separated) in ``aud`` or, for a Cognito access token, which has
  no ``aud``, in ``client_id``. No audience configured: nothing is accepted.

``JWT_ISSUER`` set in the environment (the template sets it on the stream function) turns this on. Unset -- the
local stack, whose dev server verifies its own tokens as the HTTP API would and puts the claims in the event --
the event's ``requestContext.authorizer.jwt.claims`` are the answer.

PyJWT and cryptography are not in ErosLayer, which every function loads, but in AuthLayer (layers/auth), which only
the stream function has: import this module from the stream path alone (functions/chat/stream.py;
tests/test_packaging.py checks that no other handler can reach it).
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from typing import Any

import jwt

from .config import settings
from .errors import ClientError
from .observability import logger

ALGORITHMS = ["RS256"]
LEEWAY_SECS = 30
DISCOVERY_PATH = "/.well-known/openid-configuration"
JWKS_PATH = "/.well-known/jwks.json"
JWKS_TIMEOUT_SECS = 5
JWKS_LIFESPAN_SECS = 3600


class IssuerUnavailable(ClientError):
    """The token's issuer did not give its keys (its JWKS could not be fetched): nothing was decided about the
    token, so the client retries rather than signing in again."""
    status, code = 503, "auth_unavailable"

    def __init__(self) -> None:
        super().__init__("the sign-in service's keys could not be fetched; retry", retryable=True)


_clients: dict[str, jwt.PyJWKClient] = {}
_clients_lock = threading.Lock()


def jwks_client(issuer: str) -> jwt.PyJWKClient:
    """The issuer's key set client, one per container (its keys cached between invocations)."""
    with _clients_lock:
        if issuer not in _clients:
            _clients[issuer] = jwt.PyJWKClient(jwks_uri(issuer), cache_keys=True, lifespan=JWKS_LIFESPAN_SECS,
                                               timeout=JWKS_TIMEOUT_SECS)
        return _clients[issuer]


def jwks_uri(issuer: str) -> str:
    """Where the issuer publishes its keys: its discovery document's ``jwks_uri``; the usual path when it has no
    such document (404, or one without the field). An issuer that cannot be reached is IssuerUnavailable."""
    base = issuer.rstrip("/")
    try:
        with urllib.request.urlopen(base + DISCOVERY_PATH, timeout=JWKS_TIMEOUT_SECS) as response:  # noqa: S310
            document = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        if exc.code >= 500:
            logger.warning("the issuer's discovery document could not be fetched", extra={"status": exc.code})
            raise IssuerUnavailable() from None
        document = {}
    except OSError as exc:  # unreachable, or timed out
        logger.warning("the issuer's discovery document could not be fetched", extra={"error": type(exc).__name__})
        raise IssuerUnavailable() from None
    except ValueError:  # not JSON: no document
        document = {}
    found = document.get("jwks_uri") if isinstance(document, dict) else None
    return found if isinstance(found, str) and found.startswith(("https://", "http://")) else base + JWKS_PATH


def reset() -> None:
    """Forget the cached key sets (tests)."""
    with _clients_lock:
        _clients.clear()


def bearer_token(event: dict) -> str | None:
    """The token of the event's ``Authorization: Bearer`` header (any case), or None."""
    headers = event.get("headers") if isinstance(event, dict) else None
    if not isinstance(headers, dict):
        return None
    value = next((v for k, v in headers.items() if isinstance(k, str) and k.lower() == "authorization"), None)
    if not isinstance(value, str):
        return None
    scheme, _, token = value.strip().partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None


def audiences(configured: str) -> set[str]:
    return {a.strip() for a in configured.split(",") if a.strip()}


def verify(token: str | None, issuer: str, accepted: set[str]) -> dict[str, Any] | None:
    """The claims of ``token`` when it passes every check of the HTTP API's JWT authorizer, else None. Raises
    IssuerUnavailable when the issuer's keys cannot be fetched."""
    if not token or not accepted:
        return None
    try:
        key = jwks_client(issuer).get_signing_key_from_jwt(token)
        claims = jwt.decode(token, key.key, algorithms=ALGORITHMS, issuer=issuer, leeway=LEEWAY_SECS,
                            options={"require": ["exp", "iss", "sub"], "verify_aud": False})
    except jwt.PyJWKClientConnectionError:
        logger.warning("the issuer's keys could not be fetched", extra={"issuer": issuer})
        raise IssuerUnavailable() from None
    except jwt.PyJWTError as exc:
        logger.info("a bearer token was refused", extra={"reason": type(exc).__name__})
        return None
    audience = claims.get("aud")
    named = {audience} if isinstance(audience, str) else set(audience) if isinstance(audience, list) else set()
    if not (named & accepted or claims.get("client_id") in accepted):
        logger.info("a bearer token was refused", extra={"reason": "audience"})
        return None
    return claims


def stream_claims(event: dict) -> dict[str, Any] | None:
    """The caller's verified claims (``sub`` is the user), or None: no token, or one that is refused."""
    config = settings()
    if "jwt_issuer" not in config.model_fields_set:  # the local stack: its dev server verified the token
        claims = _nested(event, "requestContext", "authorizer", "jwt", "claims")
        return claims if isinstance(claims, dict) and claims.get("sub") else None
    return verify(bearer_token(event), config.jwt_issuer, audiences(config.jwt_audience))


def _nested(value: Any, *keys: str) -> Any:
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value
