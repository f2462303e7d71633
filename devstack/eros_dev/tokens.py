"""Local bearer tokens: HS256 with a local key, with the issuer and audience checks of the HTTP API's JWT
authorizer (``eros token``, the console's sign-in, the tests)."""

from __future__ import annotations

import secrets
import time

import jwt

from eros.config import Settings, settings

from . import data_dir


def local_jwt_key() -> str:
    """The local signing key: LOCAL_JWT_SECRET, else one generated once into .data (never committed)."""
    configured = settings().local_jwt_secret
    if configured is not None:
        return configured.get_secret_value()
    path = data_dir() / "jwt-secret"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(32))
        path.chmod(0o600)
    return path.read_text().strip()


def issue_token(user: str, settings: Settings, key: str, ttl_secs: int = 86400, *, operator: bool = False,
                app: str | None = None) -> str:
    """A local token of ``user``: with the operator scope when ``operator``, of ``app`` (the APP_CLAIM claim) when
    one is named (none: the first app's, "default")."""
    now = int(time.time())
    claims = {"sub": user, "iss": settings.jwt_issuer, "aud": settings.jwt_audience, "iat": now,
              "exp": now + ttl_secs, "scope": "chat" + (f" {settings.operator_scope}" if operator else "")}
    if app is not None:
        claims[settings.app_claim] = app
    return jwt.encode(claims, key, algorithm="HS256")


def verify_token(header: str | None, settings: Settings, key: str) -> dict | None:
    if not header or not header.lower().startswith("bearer "):
        return None
    try:
        return jwt.decode(header[7:].strip(), key, algorithms=["HS256"], audience=settings.jwt_audience,
                          issuer=settings.jwt_issuer, options={"require": ["sub", "exp", "iss", "aud"]})
    except jwt.PyJWTError:
        return None
