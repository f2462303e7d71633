"""The Docker-free local stack: embedded Postgres, local tokens, and an HTTP server that hands every
request to the chat Lambda's own handler as an API Gateway HTTP API (v2) event.

The server does what API Gateway does in front of the function and nothing more: it verifies the
bearer token (HS256 with a local key, same issuer/audience checks as the JWT authorizer) for every
route but the public ones, and puts the verified claims where the authorizer would.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import secrets as pysecrets
import sys
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from urllib.parse import parse_qsl, urlsplit

import jwt

from .config import Settings

ROOT = Path(__file__).resolve().parents[3]
DATA = Path(os.environ.get("EROS_DATA_DIR", ROOT / ".data"))
# Routes without the JWT authorizer; template.yaml marks the same ones `Authorizer: NONE` (a test checks).
PUBLIC_ROUTES = frozenset({("GET", "/v1/health"), ("GET", "/v1/openapi.json"), ("GET", "/v1/docs")})


# --- embedded Postgres ------------------------------------------------------------------------
def embedded_postgres(folder: Path | None = None) -> str:
    """Start (or join) the embedded Postgres 16 + pgvector in ``folder``; returns its URL."""
    import pgserver

    folder = folder or DATA / "pg"
    folder.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(str(folder), cleanup_mode=None)
    return server.get_uri()


# --- tokens -----------------------------------------------------------------------------------
def local_jwt_key() -> str:
    """The local signing key: LOCAL_JWT_SECRET, else one generated once into .data (never committed)."""
    if os.environ.get("LOCAL_JWT_SECRET"):
        return os.environ["LOCAL_JWT_SECRET"]
    path = DATA / "jwt-secret"
    if not path.exists():
        DATA.mkdir(parents=True, exist_ok=True)
        path.write_text(pysecrets.token_urlsafe(32))
        path.chmod(0o600)
    return path.read_text().strip()


def issue_token(user: str, settings: Settings, key: str, ttl_secs: int = 86400) -> str:
    now = int(time.time())
    claims = {"sub": user, "iss": settings.jwt_issuer, "aud": settings.jwt_audience, "iat": now,
              "exp": now + ttl_secs, "scope": "chat"}
    return jwt.encode(claims, key, algorithm="HS256")


def verify_token(header: str | None, settings: Settings, key: str) -> dict | None:
    if not header or not header.lower().startswith("bearer "):
        return None
    try:
        return jwt.decode(header[7:].strip(), key, algorithms=["HS256"], audience=settings.jwt_audience,
                          issuer=settings.jwt_issuer, options={"require": ["sub", "exp", "iss", "aud"]})
    except jwt.PyJWTError:
        return None


# --- Lambda plumbing --------------------------------------------------------------------------
class LambdaContext:
    """Just enough of Lambda's context object for Powertools and our handlers."""

    def __init__(self, function_name: str, timeout_secs: float = 30):
        self.function_name = function_name
        self.function_version = "$LATEST"
        self.invoked_function_arn = f"arn:aws:lambda:local:000000000000:function:{function_name}"
        self.memory_limit_in_mb = 512
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = "local"
        self._deadline = time.monotonic() + timeout_secs

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def load_function(name: str) -> ModuleType:
    """Import functions/<name>/app.py (the same file Lambda runs) under a unique module name."""
    module_name = f"eros_function_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, ROOT / "functions" / name / "app.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def http_api_event(method: str, target: str, headers: dict[str, str], body: bytes,
                   claims: dict | None) -> dict:
    """The API Gateway HTTP API payload format 2.0 for one request."""
    url = urlsplit(target)
    query: dict[str, str] = {}
    for k, v in parse_qsl(url.query, keep_blank_values=True):
        query[k] = f"{query[k]},{v}" if k in query else v  # API Gateway joins repeated keys with commas
    try:
        text, is_b64 = body.decode("utf-8"), False
    except UnicodeDecodeError:
        text, is_b64 = base64.b64encode(body).decode(), True
    lower = {k.lower(): v for k, v in headers.items()}
    context: dict = {
        "accountId": "000000000000", "apiId": "local", "domainName": "127.0.0.1", "stage": "$default",
        "requestId": str(uuid.uuid4()), "routeKey": "$default", "time": time.strftime("%d/%b/%Y:%H:%M:%S +0000"),
        "timeEpoch": int(time.time() * 1000),
        "http": {"method": method, "path": url.path, "protocol": "HTTP/1.1", "sourceIp": "127.0.0.1",
                 "userAgent": lower.get("user-agent", "")},
    }
    if claims is not None:
        context["authorizer"] = {"jwt": {"claims": {k: str(v) for k, v in claims.items()},
                                         "scopes": None}}
    event = {"version": "2.0", "routeKey": "$default", "rawPath": url.path, "rawQueryString": url.query,
             "headers": lower, "requestContext": context, "isBase64Encoded": is_b64}
    if query:
        event["queryStringParameters"] = query
    if body:
        event["body"] = text
    return event


def make_server(settings: Settings, host: str = "127.0.0.1", port: int = 3000) -> ThreadingHTTPServer:
    chat_function = load_function("chat")
    key = local_jwt_key()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _handle(self):
            length = int(self.headers.get("content-length") or 0)
            if length > settings.max_body_bytes:
                # API Gateway refuses oversized payloads itself; do the same without reading them.
                self.close_connection = True
                return self._send(413, {"content-type": "application/json"},
                                  json.dumps({"statusCode": 413, "message":
                                              f"request body is larger than {settings.max_body_bytes} bytes"}))
            body = self.rfile.read(length) if length else b""
            path = urlsplit(self.path).path
            claims = verify_token(self.headers.get("authorization"), settings, key)
            if claims is None and (self.command, path) not in PUBLIC_ROUTES:
                return self._send(401, {"content-type": "application/json"}, '{"message":"Unauthorized"}')
            event = http_api_event(self.command, self.path, dict(self.headers), body, claims)
            try:
                result = chat_function.lambda_handler(event, LambdaContext("chat"))
            except Exception:  # what API Gateway answers when the function itself fails
                return self._send(500, {"content-type": "application/json"}, '{"message":"Internal Server Error"}')
            payload = result.get("body") or ""
            if result.get("isBase64Encoded"):
                payload = base64.b64decode(payload)
            headers = dict(result.get("headers") or {})
            for name, values in (result.get("multiValueHeaders") or {}).items():
                headers[name] = ", ".join(values)
            self._send(result["statusCode"], headers, payload)

        def _send(self, status: int, headers: dict, payload: str | bytes):
            data = payload.encode() if isinstance(payload, str) else payload
            self.send_response(status)
            for name, value in headers.items():
                if name.lower() not in ("content-length", "connection"):
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _handle

        def log_message(self, format, *args):  # one short line per request on stderr
            sys.stderr.write(f"{self.command} {self.path} -> {args[1] if len(args) > 1 else ''}\n")

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server
