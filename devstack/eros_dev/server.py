"""API Gateway's side of the local stack: an HTTP server that hands every request to the chat function's own
handler as an API Gateway HTTP API (v2) event, and serves the memory console.

The server does what API Gateway does in front of the function and nothing more: it verifies the
bearer token (HS256 with a local key, same issuer/audience checks as the JWT authorizer) for every
route but the public ones, and puts the verified claims where the authorizer would. Every method goes
to the function, as the template's ``ANY /{proxy+}`` route sends it: HEAD and OPTIONS too (no CORS is
configured, so API Gateway answers no preflight itself; the function answers 404 for a method it has
no route for, and a HEAD answer carries no body).

HTTP framing is checked before anything is read: a negative or malformed Content-Length is a 400, a
chunked body is decoded (within the same size limit), both at once is a 400 (request smuggling), and
the access log carries the time, method, path and status only (a query string can carry a token).
"""

from __future__ import annotations

import base64
import json
import re
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from eros import json_body
from eros.apps import APP_ID, DEFAULT
from eros.config import Settings, settings

from . import ROOT
from .dreaming import sweep_locally
from .lambda_runtime import Function
from .tokens import issue_token, local_jwt_key, verify_token

# The memory console (console/): static files the local stack serves under /console/; the same files work
# against a deployed API (README, "Trying it"; docs/DEPLOY.md). No third-party request: everything comes from
# this origin.
CONSOLE = ROOT / "console"
_CONSOLE_FILE = re.compile(r"^[a-z0-9-]+\.(html|js|css|svg)$")
_CONSOLE_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                  ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
CONSOLE_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                  "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def _bad_local_user(user: object) -> str | None:
    """Why ``user`` cannot be a local user id (a token's subject), or None."""
    if not isinstance(user, str) or not user.strip():
        return "send a JSON object with the user id to sign in as, e.g. {\"user\": \"alice\"}"
    if len(user) > 128 or user != user.strip() or any(not c.isprintable() for c in user):
        return "at most 128 printable characters, no leading or trailing spaces"
    return None


def _bad_local_app(app: object) -> str | None:
    """Why ``app`` cannot be a local token's app (not an app id, or no app this stack serves), or None."""
    if app is None or app == DEFAULT:
        return None
    if not isinstance(app, str) or not APP_ID.fullmatch(app):
        return "an app id is 2 to 40 of a-z 0-9 -, starting with a letter (none, or \"\": the first app, default)"
    from eros import db
    from eros.credentials import database_dsn
    from eros.store import apps as app_store

    with db.connect(database_dsn(settings()), vector=False) as conn:  # a connection of its own: a request thread's
        served = app_store.find(app, conn) is not None
    return None if served else f"there is no app {app!r} on this stack (`eros apps create` makes one)"


EVENTS_SHOWN = 200  # the console's events panel: the user's newest this many
# The streamed turn: sent to the stream function (functions/chat/stream.py), as the stack's StreamUrl is in AWS.
STREAM_ROUTE = re.compile(r"^(/server)?/v1/sessions/[^/]+/turns/stream$")
# Routes without the JWT authorizer; template.yaml marks the same ones `Authorizer: NONE` (a test checks).
PUBLIC_ROUTES = frozenset({("GET", "/v1/health"), ("GET", "/v1/openapi.json"), ("GET", "/v1/docs")})
# An app's servers' routes (eros.apps): no JWT authorizer; the function checks the app's API key (template.yaml too).
SERVER_PREFIX = "/server/"
# An export file, as eros.account names it: the local stack's stand-in for the presigned S3 URL (the random
# name is the capability, as the URL's signature is in AWS).
_EXPORT_FILE = re.compile(r"^/local/(exports/[0-9a-f]{32}/[0-9]{8}T[0-9]{6}Z-[0-9a-f]{32}\.json)$")


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


class BadRequest(Exception):
    """A request whose framing cannot be trusted: answered, and the connection closed. Its ``code`` is the API's
    for the status (functions/chat/app.py: every error is ``{"statusCode", "code", "message"}``)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.code = "payload_too_large" if status == 413 else "invalid_request"


def read_chunked(stream, limit: int) -> bytes:
    """A ``Transfer-Encoding: chunked`` body (RFC 9112 §7.1): chunks, then trailer lines up to an
    empty line. Larger than ``limit`` -> 413, malformed -> 400."""
    body = bytearray()
    while True:
        line = stream.readline(1026)
        size = line.split(b";", 1)[0].strip()
        if not line.endswith(b"\n") or not size or size.strip(b"0123456789abcdefABCDEF"):
            raise BadRequest(400, "invalid request: malformed chunked body")
        size = int(size, 16)
        if size == 0:
            break
        if len(body) + size > limit:
            raise BadRequest(413, f"request body is larger than {limit} bytes")
        chunk = stream.read(size)
        if len(chunk) != size or stream.readline(3) not in (b"\r\n", b"\n"):
            raise BadRequest(400, "invalid request: malformed chunked body")
        body += chunk
    for _ in range(64):  # trailer fields, ignored
        line = stream.readline(8192)
        if line in (b"\r\n", b"\n"):
            return bytes(body)
        if not line.endswith(b"\n"):
            break
    raise BadRequest(400, "invalid request: malformed chunked body")


def content_length(headers) -> int:
    """The declared body length: digits only (no sign, no list of differing values) -> else 400."""
    values = {v.strip() for v in headers.get_all("content-length", [])}
    if not values:
        return 0
    if len(values) > 1 or not all(v.isdigit() and v.isascii() for v in values):
        raise BadRequest(400, "invalid request: invalid Content-Length")
    return int(values.pop())


class LocalHTTPServer(ThreadingHTTPServer):
    """What API Gateway is in front of the chat function: ``concurrency`` containers at most."""
    request_queue_size = 128  # the listen backlog; socketserver's 5 reset concurrent connects
    daemon_threads = True

    def __init__(self, address: tuple[str, int], settings: Settings, concurrency: int):
        self.chat = Function("chat", concurrency=concurrency, timeout_secs=29)  # template.yaml: Timeout 29
        # The streamed turn's function (template.yaml: ChatStreamFunction, behind its function URL).
        self.chat_stream = Function("chat", concurrency=concurrency, timeout_secs=29, entry="stream")
        self.sweeping = threading.Lock()
        self.settings = settings
        self.key = local_jwt_key()
        super().__init__(address, ApiRequestHandler)  # a busy port raises here (after server_close)

    def server_close(self) -> None:
        super().server_close()
        self.chat.close(wait=False)
        self.chat_stream.close(wait=False)

    def handle_error(self, request, client_address) -> None:
        """A client that went away before its answer was written is not the server's error: no traceback."""
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


class ApiRequestHandler(BaseHTTPRequestHandler):
    """One HTTP request: framing checked, the token verified, then the chat function invoked with the
    API Gateway event and its result written back."""
    server: LocalHTTPServer
    protocol_version = "HTTP/1.1"
    timeout = 60  # a client that stops sending mid-request frees its thread
    # Headers and body are two writes: with Nagle's algorithm the body waited for the client's delayed ACK
    # of the headers, ~40 ms added to every response (API Gateway adds no such stall).
    disable_nagle_algorithm = True

    def _body(self) -> bytes:
        limit = self.server.settings.max_body_bytes
        if "transfer-encoding" in self.headers:
            if "content-length" in self.headers:  # the request-smuggling shape (RFC 9112 §6.3)
                raise BadRequest(400, "invalid request: both Transfer-Encoding and Content-Length")
            if self.headers["transfer-encoding"].strip().lower() != "chunked":
                raise BadRequest(501, "only the chunked transfer coding is supported")
            return read_chunked(self.rfile, limit)
        length = content_length(self.headers)
        if length > limit:  # API Gateway refuses oversized payloads itself; do the same without reading them
            raise BadRequest(413, f"request body is larger than {limit} bytes")
        return self.rfile.read(length) if length else b""

    def _handle(self) -> None:
        url = urlsplit(self.path)
        path = url.path
        if self.command in ("GET", "HEAD") and path == "/console":  # the page's files are relative to /console/
            return self._send(308, {"location": f"/console/{'?' if url.query else ''}{url.query}"}, b"")
        if self.command in ("GET", "HEAD") and path.startswith("/console/"):
            return self._send_console(path)
        if self.command in ("GET", "HEAD") and path == "/local/stack":
            return self._json(200, {"local": True, "dreaming_idle_secs": self.server.settings.dreaming_idle_secs})
        if self.command in ("GET", "HEAD") and path.startswith("/local/") and path != "/local/events":
            return self._send_export()
        try:
            body = self._body()
        except BadRequest as refused:
            self.close_connection = True  # what follows on this connection cannot be framed
            return self._json(refused.status, {"statusCode": refused.status, "code": refused.code,
                                               "message": str(refused)})
        if self.command == "POST" and path == "/local/token":
            return self._local_token(body)
        keyed = path.startswith(SERVER_PREFIX)
        claims = None if keyed else verify_token(self.headers.get("authorization"), self.server.settings,
                                                 self.server.key)
        if claims is None and not keyed and (self.command, path) not in PUBLIC_ROUTES:
            return self._send(401, {"content-type": "application/json"}, '{"message":"Unauthorized"}')
        local = {("POST", "/local/sweep"): lambda: self._local_sweep(body),
                 ("GET", "/local/events"): lambda: self._local_events(claims)}.get((self.command, path))
        if local:
            return local()
        headers = {k: v for k, v in self.headers.items() if k.lower() != "transfer-encoding"}
        if "transfer-encoding" in self.headers:
            headers["content-length"] = str(len(body))
        self._invoke(http_api_event(self.command, self.path, headers, body, claims))

    def _invoke_streaming(self, event: dict) -> None:
        """The streamed turn: its function's status and headers, then each chunk as the function writes it (chunked
        transfer coding, each chunk flushed), as its function URL sends it in AWS. A client that goes away stops
        nothing but the writing: the function runs the turn to its end."""
        try:
            status, headers, body = self.server.chat_stream.invoke_streaming(event)
        except Exception:  # what a function URL answers when the function itself fails
            return self._send(500, {"content-type": "application/json"}, '{"message":"Internal Server Error"}')
        if not headers.get("Content-Type", "").startswith("text/event-stream"):
            return self._send(status, headers, b"".join(body))  # refused before the stream began: one piece
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for chunk in body:
                self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:  # the client went away: the turn goes on (its container drains the body)
            self.close_connection = True

    def _invoke(self, event: dict) -> None:
        if event["requestContext"]["http"]["method"] == "POST" and STREAM_ROUTE.match(event["rawPath"]):
            return self._invoke_streaming(event)
        try:
            result = self.server.chat.invoke(event)
        except Exception:  # what API Gateway answers when the function itself fails
            return self._send(500, {"content-type": "application/json"}, '{"message":"Internal Server Error"}')
        payload = result.get("body") or ""
        if result.get("isBase64Encoded"):
            payload = base64.b64decode(payload)
        headers = dict(result.get("headers") or {})
        for name, values in (result.get("multiValueHeaders") or {}).items():
            headers[name] = ", ".join(values)
        self._send(result["statusCode"], headers, payload)

    # --- the local stack's own routes: the console, its sign-in and its "sweep now" (never deployed) ----------
    def _json(self, status: int, value: object) -> None:
        self._send(status, {"content-type": "application/json"}, json.dumps(value, default=str))

    def _unreadable(self, body: bytes) -> bool:
        """Answers 400 when the body is not JSON that can be read (``eros.json_body``: the chat function's own
        guard), as the API would; True if it did. Nothing else here parses a body."""
        problem = json_body.unreadable(body) if body else None
        if problem:
            self._json(400, {"statusCode": 400, "code": "invalid_request", "message": f"invalid request: {problem}"})
        return problem is not None

    def _local_token(self, body: bytes) -> None:
        """``POST /local/token {"user", "app"?}``: a local token for any user of any app this stack serves (what the
        console signs in with); no app, or "": the first app's user (a token without the app claim)."""
        if self._unreadable(body):
            return
        options = json.loads(body or b"null")
        user = options.get("user") if isinstance(options, dict) else None
        problem = _bad_local_user(user)
        if problem or not isinstance(user, str):
            return self._json(422, {"statusCode": 422, "code": "invalid_request", "message": f"user: {problem}"})
        app = options.get("app")
        app = None if app == "" else app  # the console's empty field: the first app
        problem = _bad_local_app(app)
        if problem:
            return self._json(422, {"statusCode": 422, "code": "invalid_request", "message": f"app: {problem}"})
        ttl = 86400
        token = issue_token(user, self.server.settings, self.server.key, ttl, app=app)
        self._json(200, {"user": user, "app": app or DEFAULT, "token": token, "expires_in": ttl})

    def _local_sweep(self, body: bytes) -> None:
        """``POST /local/sweep {"idle_now"?}``: one dreaming sweep now, answered when its jobs are done."""
        if self._unreadable(body):
            return
        options = json.loads(body or b"{}")
        idle_now = options.get("idle_now", False) if isinstance(options, dict) else None
        if not isinstance(idle_now, bool):
            return self._json(422, {"statusCode": 422, "code": "invalid_request",
                                    "message": "send a JSON object, with idle_now true or false"})
        with self.server.sweeping:  # one sweep at a time, as one schedule would
            self._json(200, sweep_locally(idle_now=idle_now))

    def _local_events(self, claims: dict | None) -> None:
        """``GET /local/events``: the signed-in user's memory events the local sweeps published (eros.events, the
        file `eros events` reads), oldest first, each once, the last EVENTS_SHOWN of them."""
        from . import events_log, logged_events

        events, _ = logged_events(events_log())
        app = (claims or {}).get(self.server.settings.app_claim) or "default"  # the user's app (eros.apps)
        mine = [e for e in events if claims and e["user_id"] == claims.get("sub") and e.get("app", "default") == app]
        self._json(200, {"events": mine[-EVENTS_SHOWN:]})

    def _send_console(self, path: str) -> None:
        """The console's files (``console/``), with a policy that lets the page reach only this origin."""
        if path == "/console/":
            path = "/console/index.html"
        name = path.removeprefix("/console/")
        file = CONSOLE / name
        if not _CONSOLE_FILE.match(name) or not file.is_file():
            return self._send(404, {"content-type": "application/json"}, '{"message":"Not Found"}')
        self._send(200, {"content-type": _CONSOLE_TYPES[file.suffix], "cache-control": "no-cache",
                         "x-content-type-options": "nosniff", "content-security-policy": CONSOLE_POLICY,
                         "referrer-policy": "no-referrer"}, file.read_bytes())

    def _send_export(self) -> None:
        """An export file from EXPORT_DIR, streamed (it can be larger than memory should hold)."""
        match, folder = _EXPORT_FILE.match(urlsplit(self.path).path), settings().export_dir
        file = Path(folder) / match[1] if match and folder else None
        if file is None or not file.is_file():
            return self._send(404, {"content-type": "application/json"}, '{"message":"Not Found"}')
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Disposition", 'attachment; filename="eros-export.json"')
        self.send_header("Content-Length", str(file.stat().st_size))
        self.end_headers()
        if self.command == "GET":
            with file.open("rb") as data:
                while chunk := data.read(65536):
                    self.wfile.write(chunk)

    def _send(self, status: int, headers: dict, payload: str | bytes) -> None:
        data = payload.encode() if isinstance(payload, str) else payload
        self.send_response(status)
        for name, value in headers.items():
            if name.lower() not in ("content-length", "connection", "transfer-encoding"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":  # a HEAD answer has headers only
            self.wfile.write(data)

    do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = do_HEAD = do_OPTIONS = _handle

    # The access log: the time, method, path and status only. Never the query string (it can carry a token)
    # nor the request line that http.server quotes in its error messages.
    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        self._log(code)

    def log_error(self, format: str, *args) -> None:
        self._log(args[0] if args and isinstance(args[0], int) else "error")

    def log_message(self, format: str, *args) -> None:
        self._log("-")

    def _log(self, outcome) -> None:
        method = getattr(self, "command", None) or "-"
        path = urlsplit(getattr(self, "path", None) or "").path or "-"
        outcome = int(outcome) if isinstance(outcome, int) else outcome
        sys.stderr.write(f"{time.strftime('%H:%M:%S')} {method} {path} -> {outcome}\n")  # the time as the logs


def make_server(settings: Settings, host: str = "127.0.0.1", port: int = 3000,
                concurrency: int = 16) -> LocalHTTPServer:
    """The local API: every request to the chat function, ``concurrency`` containers at most."""
    return LocalHTTPServer((host, port), settings, concurrency)
