"""Call the chat Lambda's handler in-process with API Gateway HTTP API v2 events (what AWS sends)."""

from __future__ import annotations

import json

from eros_dev.lambda_runtime import LambdaContext, load_function
from eros_dev.server import http_api_event


class Api:
    def __init__(self):
        self.function = load_function("chat")

    def call(self, method: str, path: str, body=None, *, user: str | None = "alice", raw: bytes | None = None,
             headers: dict | None = None, scope: str | None = None, app: str | None = None):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else b"")
        claims = {"sub": user, "iss": "test", "aud": "test"} if user is not None else None
        if claims is not None and scope is not None:
            claims["scope"] = scope
        if claims is not None and app is not None:  # the user's app (eros.apps): the token's app claim
            claims["eros_app"] = app
        event = http_api_event(method, path, {"content-type": "application/json", **(headers or {})}, data, claims)
        result = self.function.lambda_handler(event, LambdaContext("chat"))
        text = result.get("body") or ""
        return result["statusCode"], (json.loads(text) if text else None)

    def session(self, user: str = "alice", persona: str = "luna", app: str | None = None) -> str:
        status, body = self.call("POST", "/v1/sessions", {"persona_id": persona}, user=user, app=app)
        assert status == 201, body
        return body["id"]
