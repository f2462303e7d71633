"""The Docker-free local stack: embedded Postgres, local tokens, and an HTTP server that hands every
request to the chat Lambda's own handler as an API Gateway HTTP API (v2) event.

The server does what API Gateway does in front of the function and nothing more: it verifies the
bearer token (HS256 with a local key, same issuer/audience checks as the JWT authorizer) for every
route but the public ones, and puts the verified claims where the authorizer would. Every method goes
to the function, as the template's ``ANY /{proxy+}`` route sends it: HEAD and OPTIONS too (no CORS is
configured, so API Gateway answers no preflight itself; the function answers 404 for a method it has
no route for, and a HEAD answer carries no body).

Functions run as Lambda runs them: in containers (``Function``), each on its own thread with its own
copy of the function module, one invocation at a time; concurrent requests take concurrent containers,
never the same one. The dreaming fan-out (``InProcessInvoker``, ``sweep_locally``,
``run_local_sweeper``) invokes the sweeper and extract functions the same way.

HTTP framing is checked before anything is read: a negative or malformed Content-Length is a 400, a
chunked body is decoded (within the same size limit), both at once is a 400 (request smuggling), and
the access log carries method, path and status only (a query string can carry a token).
"""

from __future__ import annotations

import base64
import importlib.util
import itertools
import json
import os
import re
import secrets
import signal
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from urllib.parse import parse_qsl, urlsplit

import jwt

from . import json_body
from .config import Settings, settings

ROOT = Path(__file__).resolve().parents[3]


def data_dir() -> Path:
    """Where the local stack keeps its state: EROS_DATA_DIR, else .data/ in the checkout (never committed)."""
    folder = settings().eros_data_dir
    return Path(folder) if folder else ROOT / ".data"


# Routes without the JWT authorizer; template.yaml marks the same ones `Authorizer: NONE` (a test checks).
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


PUBLIC_ROUTES = frozenset({("GET", "/v1/health"), ("GET", "/v1/openapi.json"), ("GET", "/v1/docs")})
# An export file, as eros.records names it: the local stack's stand-in for the presigned S3 URL (the random
# name is the capability, as the URL's signature is in AWS).
_EXPORT_FILE = re.compile(r"^/local/(exports/[0-9a-f]{32}/[0-9]{8}T[0-9]{6}Z-[0-9a-f]{32}\.json)$")


# --- embedded Postgres ------------------------------------------------------------------------
# pgserver asks platformdirs for a runtime folder, which warns on every start where XDG_RUNTIME_DIR is unset
# (containers, CI, ssh sessions) and falls back to /tmp; the fallback is fine, the warning is noise.
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")


def postgres_running(folder: Path | None = None) -> bool:
    """Whether the embedded Postgres of ``folder`` (default .data/pg) is up (its postmaster.pid exists)."""
    return ((folder or data_dir() / "pg") / "postmaster.pid").exists()


def stop_embedded_postgres(folder: Path | None = None) -> bool:
    """Stop the embedded Postgres of ``folder`` (a fast shutdown: sessions are ended, nothing is lost);
    False when it was not running."""
    from pgserver._commands import pg_ctl  # type: ignore[attr-defined]  # made by a factory at import

    folder = folder or data_dir() / "pg"
    if not postgres_running(folder):
        return False
    runs_as = {"user": "pgserver"} if os.geteuid() == 0 else {}  # pgserver runs it as this user under root
    pg_ctl(["-w", "-m", "fast", "stop"], pgdata=folder, **runs_as)
    return True


@contextmanager
def serving() -> Iterator[None]:
    """While ``eros serve`` runs: its process id in .data/serve.pid, for ``eros stop``, and SIGTERM (what
    ``eros stop`` sends) handled as Ctrl-C."""
    pid_file = data_dir() / "serve.pid"
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.write_text(str(os.getpid()))
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if pid_file.exists() and pid_file.read_text().strip() == str(os.getpid()):
            pid_file.unlink()


def stop_local_stack(wait_secs: float = 15.0) -> list[str]:
    """``make stop``: ask a running ``eros serve`` to stop (SIGTERM, which it handles as Ctrl-C: it then stops
    the Postgres it started; SIGINT would not reach a stack started in the background, where it is ignored),
    then stop the embedded Postgres if it is still up. Returns what was stopped."""
    stopped = []
    pid_file = data_dir() / "serve.pid"
    pid = int(pid_file.read_text()) if pid_file.exists() and pid_file.read_text().strip().isdigit() else None
    if pid is not None and _alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + wait_secs
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        stopped.append(f"eros serve (pid {pid})")
    pid_file.unlink(missing_ok=True)
    if stop_embedded_postgres():
        stopped.append("the embedded Postgres")
    return stopped


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a process that has exited but not been reaped (a zombie: the parent's Popen has not waited yet)
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc (macOS): kill(0) is all there is
        return True


def embedded_postgres(folder: Path | None = None) -> str:
    """Start (or join) the embedded Postgres 16 + pgvector in ``folder``; returns its URL."""
    import pgserver

    folder = folder or data_dir() / "pg"
    folder.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(str(folder), cleanup_mode=None)
    return server.get_uri()


# --- tokens -----------------------------------------------------------------------------------
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


# Loads run one at a time: a function's folder is on sys.path, and its own modules in sys.modules, while it loads.
_LOADING = threading.Lock()


def load_function(name: str, copy: str | None = None) -> ModuleType:
    """Import functions/<name>/app.py (the same file Lambda runs) under a unique module name; a named
    ``copy`` is a separate module object (a container's own module-level state).

    The modules beside app.py (the chat function's ``routes`` and ``models``) are imported as Lambda does, from
    the function's folder first on sys.path, and afresh for every load: each copy has its own, so its routers are
    included in its own resolver only and read that resolver's request (a Router shared by two copies would read
    the event of whichever copy included it last)."""
    module_name = f"eros_function_{name}" + (f"__{copy}" if copy else "")
    folder = ROOT / "functions" / name
    with _LOADING:
        if module_name in sys.modules:
            return sys.modules[module_name]
        spec = importlib.util.spec_from_file_location(module_name, folder / "app.py")
        if spec is None or spec.loader is None:
            raise ImportError(f"no function {name!r} in functions/")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        sys.path.insert(0, str(folder))
        try:
            spec.loader.exec_module(module)
        finally:
            sys.path.remove(str(folder))
            for own in [key for key, loaded in list(sys.modules.items())
                        if key != module_name and folder in Path(getattr(loaded, "__file__", None) or "/").parents]:
                del sys.modules[own]  # this copy keeps them; the next one imports its own
    return module


def own_resolver_state(module: ModuleType) -> None:
    """Powertools' resolvers keep the current event and Lambda context on a class shared by every
    resolver of the process (``BaseRouter.current_event``; its routing context is per resolver): two
    containers resolving at once read each other's event (another user's token, body, route). The
    resolvers of this module copy get them as their own attributes, set before every resolve."""
    from aws_lambda_powertools.event_handler.api_gateway import ApiGatewayResolver

    for resolver in [value for value in vars(module).values() if isinstance(value, ApiGatewayResolver)]:
        def resolve(event, context, resolver=resolver, resolve=resolver.resolve):
            resolver.current_event = resolver._to_proxy_event(event)
            resolver.lambda_context = context
            return resolve(event, context)

        resolver.resolve = resolve  # type: ignore[method-assign]  # this resolver's own, per container


# Container module copies are numbered across the process: two Function objects of one function (two servers
# of a test run, a server and a test's own) never share a copy, nor what a ``prepare`` did to it.
_CONTAINER_NUMBERS = itertools.count(1)


class Function:
    """Warm containers of one Lambda function. An invocation takes an idle container, or starts a new
    one (a cold start) while fewer than ``concurrency`` exist, else waits for one. A container is a
    thread with its own copy of the function module (module-level state such as the Powertools
    resolver, which keeps the current event), its own database connection (``eros.db`` keeps one per
    thread) and its own log keys and metrics (``eros.observability`` keeps them per thread); it runs
    one invocation at a time, as a Lambda execution environment does."""

    def __init__(self, name: str, *, concurrency: int = 16, timeout_secs: float = 30,
                 prepare: Callable[[ModuleType], None] | None = None):
        self.name, self.timeout_secs, self.prepare = name, timeout_secs, prepare
        self._local = threading.local()
        self._started = 0
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix=f"{name}-container")

    @property
    def containers(self) -> int:
        return self._started

    def _run(self, event: dict):
        module = getattr(self._local, "module", None)
        if module is None:  # this container's cold start
            with self._lock:
                self._started += 1
            module = load_function(self.name, copy=f"container{next(_CONTAINER_NUMBERS)}")
            own_resolver_state(module)
            if self.prepare:
                self.prepare(module)
            self._local.module = module
        return module.lambda_handler(event, LambdaContext(self.name, self.timeout_secs))

    def submit(self, event: dict) -> Future:
        """An asynchronous invocation; the future holds the handler's result or exception."""
        return self._pool.submit(self._run, event)

    def invoke(self, event: dict):
        """A synchronous invocation (what API Gateway does)."""
        return self.submit(event).result()

    def close(self, wait: bool = True) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=not wait)


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
    """A request whose framing cannot be trusted: answered, and the connection closed."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


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
        self.sweeping = threading.Lock()
        self.settings = settings
        self.key = local_jwt_key()
        super().__init__(address, ApiRequestHandler)  # a busy port raises here (after server_close)

    def server_close(self) -> None:
        super().server_close()
        self.chat.close(wait=False)

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
        path = urlsplit(self.path).path
        if self.command in ("GET", "HEAD") and (path == "/console" or path.startswith("/console/")):
            return self._send_console(path)
        if self.command in ("GET", "HEAD") and path == "/local/stack":
            return self._json(200, {"local": True, "dreaming_idle_secs": self.server.settings.dreaming_idle_secs})
        if self.command in ("GET", "HEAD") and path.startswith("/local/"):
            return self._send_export()
        try:
            body = self._body()
        except BadRequest as refused:
            self.close_connection = True  # what follows on this connection cannot be framed
            return self._send(refused.status, {"content-type": "application/json"},
                              json.dumps({"statusCode": refused.status, "message": str(refused)}))
        if self.command == "POST" and path == "/local/token":
            return self._local_token(body)
        claims = verify_token(self.headers.get("authorization"), self.server.settings, self.server.key)
        if claims is None and (self.command, path) not in PUBLIC_ROUTES:
            return self._send(401, {"content-type": "application/json"}, '{"message":"Unauthorized"}')
        if self.command == "POST" and path == "/local/sweep":
            return self._local_sweep(body)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "transfer-encoding"}
        if "transfer-encoding" in self.headers:
            headers["content-length"] = str(len(body))
        self._invoke(http_api_event(self.command, self.path, headers, body, claims))

    def _invoke(self, event: dict) -> None:
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
        """``POST /local/token {"user"}``: a local token for any user (what the console signs in with)."""
        if self._unreadable(body):
            return
        options = json.loads(body or b"null")
        user = options.get("user") if isinstance(options, dict) else None
        problem = _bad_local_user(user)
        if problem or not isinstance(user, str):
            return self._json(422, {"statusCode": 422, "code": "invalid_request", "message": f"user: {problem}"})
        ttl = 86400
        self._json(200, {"user": user, "token": issue_token(user, self.server.settings, self.server.key, ttl),
                         "expires_in": ttl})

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

    def _send_console(self, path: str) -> None:
        """The console's files (``console/``), with a policy that lets the page reach only this origin."""
        if path in ("/console", "/console/"):
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

    # The access log: method, path and status only. Never the query string (it can carry a token)
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
        sys.stderr.write(f"{method} {path} -> {int(outcome) if isinstance(outcome, int) else outcome}\n")


def make_server(settings: Settings, host: str = "127.0.0.1", port: int = 3000,
                concurrency: int = 16) -> LocalHTTPServer:
    """The local API: every request to the chat function, ``concurrency`` containers at most."""
    return LocalHTTPServer((host, port), settings, concurrency)


# --- dreaming locally: the EventBridge schedule, the sweeper and its fan-out --------------------
def scheduled_event() -> dict:
    """What the schedule sends the sweeper (it reads nothing from it)."""
    return {"version": "0", "id": str(uuid.uuid4()), "detail-type": "Scheduled Event", "source": "aws.scheduler",
            "account": "000000000000", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "region": "local", "resources": [], "detail": {}}


class InProcessInvoker:
    """The sweeper's fan-out locally: every job is an asynchronous invocation of the extract function in
    a container of its own, ``workers`` at once (Lambda's concurrency). A failed invocation is logged:
    Lambda would retry it; locally the claim goes stale and a later sweep takes the session again."""

    def __init__(self, workers: int = 4, *, keep_outcomes: bool = False):
        self.extract = Function("extract", concurrency=workers, timeout_secs=120)  # template.yaml: Timeout 120
        self._jobs: list[tuple[dict, Future]] | None = [] if keep_outcomes else None

    def __call__(self, payload: dict) -> None:
        done = self.extract.submit(dict(payload))
        done.add_done_callback(self._report)
        if self._jobs is not None:
            self._jobs.append((payload, done))

    def outcomes(self) -> list[dict]:
        """What each job did (``keep_outcomes``; after ``wait``): the extract function's answer, or the
        exception it raised as ``outcome: crashed``."""
        outcomes = []
        for payload, done in self._jobs or []:
            job = {"kind": payload.get("kind", "session"), "user_id": payload.get("user_id"),
                   "session_id": payload.get("session_id")}
            error = done.exception()
            outcomes.append(job | ({"outcome": "crashed", "error": repr(error)[:300]} if error else done.result()))
        return outcomes

    @staticmethod
    def _report(done: Future) -> None:
        from .observability import logger

        if not done.cancelled() and done.exception() is not None:
            logger.warning("local extract failed", extra={"error": repr(done.exception())[:300]})

    def wait(self) -> None:
        self.extract.close(wait=True)


def sweeper(invoker: InProcessInvoker, cfg: Settings | None = None) -> Function:
    """The sweeper function in a container whose fan-out is ``invoker`` instead of the Lambda client (and,
    with ``cfg``, whose settings are those)."""
    def prepare(module: ModuleType) -> None:
        module.invoker = lambda: invoker  # type: ignore[attr-defined]
        if cfg is not None:
            module.settings = lambda: cfg  # type: ignore[attr-defined]

    return Function("sweeper", concurrency=1, timeout_secs=240, prepare=prepare)  # template.yaml: Timeout 240


def sweep_locally(workers: int = 4, *, idle_now: bool = False, event: dict | None = None) -> dict:
    """`eros sweep` and the console's "sweep now": one invocation of the sweeper function now (on ``event``,
    default a scheduled one), waiting for the jobs it started; its answer with ``jobs``, what each did.
    ``idle_now``: every session with new messages counts as idle (DREAMING_IDLE_SECS 0 for this sweep),
    everyone's, not only the caller's."""
    invoker = InProcessInvoker(workers, keep_outcomes=True)
    function = sweeper(invoker, settings().model_copy(update={"dreaming_idle_secs": 0}) if idle_now else None)
    try:
        result = function.invoke(event or scheduled_event())
    finally:
        function.close()
        invoker.wait()
    return result | {"jobs": invoker.outcomes()}


def invoke_locally(function: str, event: dict, context: LambdaContext) -> object:
    """`eros invoke`: one invocation of ``function``'s real handler on ``event`` in this process; the
    sweeper's fan-out goes to local extract containers, and its answer lists what each job did."""
    if function == "sweeper":
        return sweep_locally(event=event)
    return load_function(function).lambda_handler(event, context)


def run_local_sweeper(cfg: Settings, workers: int = 4) -> threading.Thread:
    """The local EventBridge schedule: the sweeper function every DREAMING_TICK_SECS, from a daemon thread."""
    from .observability import logger

    invoker = InProcessInvoker(workers)
    function = sweeper(invoker)

    def loop():
        while True:
            time.sleep(cfg.dreaming_tick_secs)
            try:
                result = function.invoke(scheduled_event())
            except Exception as exc:
                logger.exception("local sweep failed", extra={"error": repr(exc)[:300]})
                continue
            if result.get("claimed"):
                print(f"[dreaming] claimed {result['claimed']} idle session(s), extracting", flush=True)
            if result.get("users_claimed"):
                print(f"[dreaming] claimed {result['users_claimed']} user(s) for a deep pass", flush=True)

    thread = threading.Thread(target=loop, name="schedule", daemon=True)
    thread.start()
    return thread
