"""Who a streamed request is (placeholder until the in-function JWT verification lands): the claims the local dev
server verified and put where the HTTP API's authorizer puts them."""

from __future__ import annotations

import os


def stream_claims(event: dict) -> dict | None:
    if os.environ.get("JWT_ISSUER"):
        return None
    claims = ((event.get("requestContext") or {}).get("authorizer") or {}).get("jwt", {}).get("claims")
    return claims if isinstance(claims, dict) else None
