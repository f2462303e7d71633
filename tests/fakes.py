"""Fake OpenRouter and Voyage servers: real HTTP servers on loopback speaking the providers' wire formats.

Each fake is a stdlib ``ThreadingHTTPServer`` (HTTP/1.1, keep-alive, proper Content-Length) running in a
daemon thread on ``127.0.0.1`` with an ephemeral port. Point the engine at one with its ``.url``
(``LLM_BASE_URL`` / ``EMBED_BASE_URL``, or the clients' ``base_url``).

    fake.url         base URL ending in "/v1"
    fake.requests    recorded requests (copies): {"method", "path", "headers" (lower-cased), "json",
                     "at" (time.monotonic() on arrival), "client" ((host, port) of the connection)}
    fake.calls       how many requests arrived
    fake.push(...)   queue one-shot behaviours, consumed in order by the next requests
    fake.pending     how many pushed behaviours are still queued
    fake.close()     stop the server (idempotent; also a context manager)

Behaviours: ``Status(code, retry_after=None, body=None)``, ``Delay(seconds)`` (then answer normally),
``Malformed(body="not json", status=200)``, ``Raw(body, status=200, headers=None)`` (any body verbatim),
``Disconnect()`` (close the connection without answering) and, for the LLM only, ``Reply(text)``.

Pytest fixtures ``fake_llm`` and ``fake_voyage`` start one server per test and close it afterwards;
``skipped_sleeps`` makes the providers' retry loop skip its waits (a ``SkippingClock``: every sleep is
recorded in ``.sleeps`` and returns at once, moving the loop's clocks on by as much).
"""

from __future__ import annotations

import json
import math
import re
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

import eros.clock
from eros.providers.offline import hash_embed

__all__ = ["Status", "Delay", "Malformed", "Raw", "Reply", "Disconnect", "BreakStream", "FakeServer", "FakeOpenRouter",
           "FakeVoyage", "SkippingClock", "fake_llm", "fake_voyage", "skipped_sleeps", "NOON", "Clock", "clock"]


# --- behaviours -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Status:
    """Answer with this HTTP status (e.g. 429, 500, 400), an optional Retry-After header and an error body."""

    code: int
    retry_after: float | int | str | None = None
    body: Any = None  # None: an OpenAI/Voyage-style {"error": {...}} JSON body


@dataclass(frozen=True)
class Delay:
    """Sleep this long before answering normally (to trigger client timeouts)."""

    seconds: float


@dataclass(frozen=True)
class Raw:
    """Send this body verbatim: str/bytes as they are, anything else JSON-encoded."""

    body: Any
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Malformed:
    """A body the client cannot use: not JSON at all, or JSON of the wrong shape (pass a dict/list)."""

    body: Any = "not json"
    status: int = 200


@dataclass(frozen=True)
class Reply:
    """The LLM answers this exact completion text (once)."""

    text: str


@dataclass(frozen=True)
class Disconnect:
    """Close the connection without sending any response (a transport failure for the client)."""


@dataclass(frozen=True)
class BreakStream:
    """A streamed answer (``"stream": true``) that fails after ``after`` pieces of the reply: the connection is
    dropped, or, with ``error``, the stream ends with that error chunk (how OpenRouter reports an upstream failure
    after the answer began: HTTP 200, then ``data: {"error": {...}}``)."""

    after: int
    error: dict | None = None


Behaviour = Status | Delay | Raw | Malformed | Reply | Disconnect | BreakStream


@dataclass
class _Stream:
    """What a streamed completion sends: the chunks' JSON objects, and where it breaks (``BreakStream``)."""

    chunks: list[dict]
    pieces_before_break: int | None = None
    error: dict | None = None


# --- the HTTP machinery -----------------------------------------------------------------------------------

class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as real providers (and httpx's pool) expect
    timeout = 30  # an idle keep-alive connection is dropped eventually even if nobody closes the fake
    # Headers and body go out in two writes: with Nagle's algorithm the body waits for the client's delayed
    # ACK of the headers, ~40 ms a response on loopback. Real providers answer without that stall.
    disable_nagle_algorithm = True
    server_version = "FakeProvider/1.0"
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.fake._track(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass
        finally:
            self.server.fake._untrack(self.connection)

    def do_POST(self) -> None:  # noqa: N802 (stdlib naming)
        self.server.fake._serve(self)

    def _not_allowed(self) -> None:
        self.server.fake._record(self, None)
        self.server.fake._send(self, 405, {"error": {"message": "method not allowed", "code": 405}})

    do_GET = do_PUT = do_DELETE = do_PATCH = _not_allowed  # noqa: N815

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - keep test output quiet
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # a real provider takes many connections at once (socketserver's default backlog: 5)
    block_on_close = False  # never wait for idle keep-alive connections on close
    allow_reuse_address = True
    fake: FakeServer

    def handle_error(self, request, client_address) -> None:
        # A client that timed out and went away, or close() cutting a connection, is not an error.
        import sys

        exc = sys.exc_info()[1]
        if isinstance(exc, OSError) or self.fake.closed:
            return
        super().handle_error(request, client_address)


class FakeServer:
    """What both fakes share: the server thread, request recording and the behaviour queue."""

    path: ClassVar[str]  # the one route the fake serves, e.g. "/v1/embeddings"
    supported: ClassVar[tuple[type, ...]] = (Status, Delay, Raw, Malformed, Disconnect)

    def __init__(self, *, api_key: str | None = None):
        self.api_key = api_key  # when set, requests without "Authorization: Bearer <api_key>" get 401
        self._lock = threading.Lock()
        self._requests: list[dict] = []
        self._queue: deque[Behaviour] = deque()
        self._connections: set[socket.socket] = set()
        self._stopping = threading.Event()
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.fake = self
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.01},
                                        name=f"{type(self).__name__}-server", daemon=True)
        self._thread.start()

    # -- public API ----------------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def requests(self) -> list[dict]:
        with self._lock:
            return [dict(r, headers=dict(r["headers"])) for r in self._requests]

    @property
    def calls(self) -> int:
        with self._lock:
            return len(self._requests)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    @property
    def closed(self) -> bool:
        return self._stopping.is_set()

    def push(self, *behaviours: Behaviour) -> FakeServer:
        for behaviour in behaviours:
            if not isinstance(behaviour, self.supported):
                raise TypeError(f"{type(self).__name__} does not support {behaviour!r}")
        with self._lock:
            self._queue.extend(behaviours)
        return self

    def reset(self) -> None:
        """Forget recorded requests and queued behaviours."""
        with self._lock:
            self._requests.clear()
            self._queue.clear()

    def close(self) -> None:
        if self._stopping.is_set():
            return
        self._stopping.set()  # wakes any Delay in progress
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:  # wake handler threads blocked reading an idle keep-alive connection
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(timeout=2)

    def __enter__(self) -> FakeServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url} calls={self.calls}>"

    # -- to be provided by the concrete fakes -----------------------------------------------------------------
    def _answer(self, body: Any, behaviour: Behaviour | None) -> tuple[int, Any]:
        raise NotImplementedError

    # -- internals -------------------------------------------------------------------------------------------
    def _track(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.add(conn)

    def _untrack(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.discard(conn)

    def _record(self, handler: BaseHTTPRequestHandler, body: Any) -> None:
        record = {"method": handler.command, "path": handler.path,
                  "headers": {k.lower(): v for k, v in handler.headers.items()}, "json": body,
                  "at": time.monotonic(), "client": handler.client_address}
        with self._lock:
            self._requests.append(record)

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        """Record the request, then act out the next pushed behaviour, else answer as the provider would."""
        length = handler.headers.get("Content-Length")
        if length is None:
            self._record(handler, None)
            return self._send(handler, 411, {"error": {"message": "Content-Length required", "code": 411}})
        raw = handler.rfile.read(int(length)) if int(length) > 0 else b""
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        self._record(handler, body)
        if handler.path.split("?", 1)[0] != self.path:
            return self._send(handler, 404, {"error": {"message": f"no route {handler.path}", "code": 404}})
        with self._lock:
            behaviour = self._queue.popleft() if self._queue else None
        if isinstance(behaviour, Delay):
            if self._stopping.wait(behaviour.seconds):
                handler.close_connection = True
                return None
            behaviour = None
        if behaviour is not None and not isinstance(behaviour, Reply | BreakStream):
            return self._misbehave(handler, behaviour)
        return self._answer_normally(handler, body, behaviour)

    def _misbehave(self, handler: BaseHTTPRequestHandler, behaviour: Any) -> None:
        """A pushed failure: a dropped connection, an error status, or a body sent verbatim."""
        if isinstance(behaviour, Disconnect):
            handler.close_connection = True
            try:
                handler.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return None
        if isinstance(behaviour, Status):
            error = behaviour.body if behaviour.body is not None else {
                "error": {"message": f"fake provider error {behaviour.code}", "code": behaviour.code}}
            headers = {} if behaviour.retry_after is None else {"Retry-After": str(behaviour.retry_after)}
            return self._send(handler, behaviour.code, error, headers)
        if isinstance(behaviour, Raw):
            return self._send(handler, behaviour.status, behaviour.body, behaviour.headers)
        if isinstance(behaviour, Malformed):
            return self._send(handler, behaviour.status, behaviour.body)
        raise TypeError(f"not a behaviour: {behaviour!r}")

    def _answer_normally(self, handler: BaseHTTPRequestHandler, body: Any,
                         behaviour: Reply | BreakStream | None) -> None:
        if self.api_key is not None and handler.headers.get("Authorization") != f"Bearer {self.api_key}":
            return self._send(handler, 401, {"error": {"message": "invalid or missing API key", "code": 401}})
        if not isinstance(body, dict):
            return self._send(handler, 400, {"error": {"message": "request body is not a JSON object",
                                                       "code": 400}})
        try:
            status, payload = self._answer(body, behaviour)
        except Exception as exc:  # a broken responder: make it visible to the test as a 500
            status, payload = 500, {"error": {"message": f"fake responder failed: {exc!r}", "code": 500}}
        return self._send(handler, status, payload)

    def _send(self, handler: BaseHTTPRequestHandler, status: int, body: Any,
              headers: dict[str, str] | None = None) -> None:
        if isinstance(body, _Stream):
            return self._send_stream(handler, body)
        if isinstance(body, bytes):
            data, content_type = body, "application/octet-stream"
        elif isinstance(body, str):
            data, content_type = body.encode(), "text/plain; charset=utf-8"
        else:
            data, content_type = json.dumps(body, ensure_ascii=False).encode(), "application/json"
        try:
            handler.send_response(status)
            handler.send_header("Content-Type", content_type)
            handler.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                handler.send_header(name, value)
            handler.end_headers()
            handler.wfile.write(data)
            handler.wfile.flush()
        except OSError:  # the client gave up (timeout) and closed its end
            handler.close_connection = True


    first_token_delay = 0.0  # a streamed answer: seconds before its first piece (FakeOpenRouter)
    token_interval = 0.0  # and between pieces

    def _send_stream(self, handler: BaseHTTPRequestHandler, stream: _Stream) -> None:
        """Server-Sent Events as OpenAI-compatible servers stream a completion: one ``data:`` line a chunk, each sent
        in its own HTTP chunk when it is ready, then ``data: [DONE]``; a break drops the connection."""
        def write(data: bytes) -> None:
            handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            handler.wfile.flush()

        try:
            handler.send_response(200)
            handler.send_header("Content-Type", "text/event-stream")
            handler.send_header("Transfer-Encoding", "chunked")
            handler.end_headers()
            pieces = 0
            for chunk in stream.chunks:
                content = (chunk.get("choices") or [{}])[0].get("delta", {}).get("content")
                if content:
                    if stream.pieces_before_break is not None and pieces >= stream.pieces_before_break:
                        if stream.error is None:
                            handler.close_connection = True
                            handler.connection.shutdown(socket.SHUT_RDWR)
                            return None
                        write(b"data: " + json.dumps({"error": stream.error}).encode() + b"\n\n")
                        break
                    if self._stopping.wait(self.first_token_delay if pieces == 0 else self.token_interval):
                        handler.close_connection = True
                        return None
                    pieces += 1
                write(b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + b"\n\n")
            else:
                write(b"data: [DONE]\n\n")
            write(b"")  # the last chunk
        except OSError:  # the client went away
            handler.close_connection = True
        return None


def pieces_of(text: str) -> list[str]:
    """A reply as a model streams it: word by word, each with the spaces after it (joined: the text exactly)."""
    return re.findall(r"\s*\S+\s*|\s+", text) if text else []


def _bad_request(message: str) -> tuple[int, dict]:
    return 400, {"error": {"message": message, "code": 400}}


# --- OpenRouter (OpenAI-compatible chat completions) ------------------------------------------------------

def _default_reply(request: dict) -> str:
    return "fake reply"


class FakeOpenRouter(FakeServer):
    """``POST /v1/chat/completions``. ``responder(request_json) -> text`` decides replies (settable)."""

    path = "/v1/chat/completions"
    supported = FakeServer.supported + (Reply, BreakStream)

    def __init__(self, responder: Callable[[dict], str] | None = None, *, api_key: str | None = None,
                 served: set[str] | None = None):
        self.responder: Callable[[dict], str] = responder or _default_reply
        # When set, the only models this server has; another is answered as Ollama (and vLLM, with its own words)
        # answer a model they do not have: 404 with an OpenAI-style error.
        self.served = served
        self._generation = 0
        super().__init__(api_key=api_key)

    def _answer(self, body: dict, behaviour: Behaviour | None) -> tuple[int, Any]:
        model, messages = body.get("model"), body.get("messages")
        if not isinstance(model, str) or not model:
            return _bad_request("model is required")
        if self.served is not None and model not in self.served:
            return 404, {"error": {"message": f'model "{model}" not found, try pulling it first', "type": "api_error",
                                   "param": None, "code": None}}
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m for m in messages):
            return _bad_request("messages must be a non-empty list of {role, content}")
        text = behaviour.text if isinstance(behaviour, Reply) else self.responder(body)
        prompt_tokens = sum(_tokens(str(m.get("content") or "")) for m in messages)
        completion_tokens = _tokens(text)
        with self._lock:
            self._generation += 1
            generation = self._generation
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                 "total_tokens": prompt_tokens + completion_tokens}
        if body.get("stream") is True:
            head = {"id": f"gen-fake-{generation}", "object": "chat.completion.chunk", "created": int(time.time()),
                    "model": model}
            chunks = [head | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                           "finish_reason": None}]}]
            chunks += [head | {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
                       for piece in pieces_of(text)]
            chunks.append(head | {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            if (body.get("stream_options") or {}).get("include_usage"):
                chunks.append(head | {"choices": [], "usage": usage})
            broken = behaviour if isinstance(behaviour, BreakStream) else None
            return 200, _Stream(chunks, broken.after if broken else None, broken.error if broken else None)
        return 200, {
            "id": f"gen-fake-{generation}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": usage,
        }


# --- Voyage embeddings ------------------------------------------------------------------------------------

VOYAGE_DIMENSIONS = (256, 512, 1024, 2048)
VOYAGE_DEFAULT_DIMENSION = 1024  # what Voyage answers when output_dimension is not sent
VOYAGE_MAX_INPUTS = 1000


class FakeVoyage(FakeServer):
    """``POST /v1/embeddings``. ``embed_fn(text) -> vector`` makes the vectors (settable; default hash_embed,
    so cosine similarity is meaningful). Vectors are fitted to the requested ``output_dimension``."""

    path = "/v1/embeddings"

    def __init__(self, embed_fn: Callable[[str], list[float]] | None = None, *, api_key: str | None = None,
                 served: set[str] | None = None):
        self.embed_fn: Callable[[str], list[float]] = embed_fn or hash_embed
        self.served = served  # when set, the only models; another is a 400 naming it, as Voyage answers
        super().__init__(api_key=api_key)

    def _answer(self, body: dict, behaviour: Behaviour | None) -> tuple[int, Any]:
        inputs = body.get("input")
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not inputs or not all(isinstance(t, str) for t in inputs):
            return _bad_request("input must be a string or a non-empty list of strings")
        if len(inputs) > VOYAGE_MAX_INPUTS:
            return _bad_request(f"at most {VOYAGE_MAX_INPUTS} inputs per request")
        if not isinstance(body.get("model"), str) or not body["model"]:
            return _bad_request("model is required")
        if self.served is not None and body["model"] not in self.served:
            return 400, {"detail": f"Model {body['model']} is not supported. Supported models are"
                                   f" {sorted(self.served)}."}
        if body.get("input_type") not in (None, "query", "document"):
            return _bad_request("input_type must be query, document or null")
        dimension = body.get("output_dimension") or VOYAGE_DEFAULT_DIMENSION
        if dimension not in VOYAGE_DIMENSIONS:
            return _bad_request(f"output_dimension must be one of {VOYAGE_DIMENSIONS}")
        data = [{"object": "embedding", "embedding": _fit(self.embed_fn(text), dimension), "index": i}
                for i, text in enumerate(inputs)]
        return 200, {"object": "list", "data": data, "model": body["model"],
                     "usage": {"total_tokens": sum(_tokens(t) for t in inputs)}}


def _fit(vector: list[float], dimension: int) -> list[float]:
    """Pad with zeros or truncate (and re-normalise) to the requested dimension."""
    vector = [float(x) for x in vector]
    if len(vector) >= dimension:
        vector = vector[:dimension]
        norm = math.sqrt(sum(x * x for x in vector)) or 1.0
        return [x / norm for x in vector]
    return vector + [0.0] * (dimension - len(vector))


def _tokens(text: str) -> int:
    """A rough token count (about four characters a token), never zero for non-empty text."""
    return max(1, math.ceil(len(text) / 4)) if text else 0


# --- pytest fixtures --------------------------------------------------------------------------------------

@pytest.fixture
def fake_llm():
    """A fake OpenRouter for one test; ``fake_llm.url`` is the LLM_BASE_URL."""
    server = FakeOpenRouter()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def fake_voyage():
    """A fake Voyage for one test; ``fake_voyage.url`` is the EMBED_BASE_URL."""
    server = FakeVoyage()
    try:
        yield server
    finally:
        server.close()


class SkippingClock:
    """Real time, except that a sleep returns at once: it is recorded, and the clocks jump by as much as it
    asked for. What a deadline sees is then exact -- real time spent on requests plus the skipped waits."""

    def __init__(self, wall: float | None = None):
        self.sleeps: list[float] = []
        self.skipped = 0.0
        self._wall = wall  # a frozen wall clock (Retry-After dates), else the real one

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.skipped += max(0.0, seconds)

    def monotonic(self) -> float:
        return time.monotonic() + self.skipped

    def time(self) -> float:
        return (time.time() if self._wall is None else self._wall) + self.skipped


@pytest.fixture
def skipped_sleeps(monkeypatch):
    """The providers' retry loop (eros.providers.base) on a ``SkippingClock``: backoffs and Retry-Afters are
    recorded in ``skipped_sleeps.sleeps`` instead of waited for. The wall clock is frozen on a known
    fraction of a second (0.25) so that Retry-After dates give exact waits."""
    from eros.providers import base

    clock = SkippingClock(wall=math.floor(time.time()) + 0.25)
    monkeypatch.setattr(base, "sleep", clock.sleep)
    monkeypatch.setattr(base, "monotonic", clock.monotonic)
    monkeypatch.setattr(base, "wall_time", clock.time)
    return clock


# --- the application's clock ---------------------------------------------------------------------------------
NOON = datetime(2026, 3, 14, 12, 0, 10, tzinfo=UTC)


class Clock:
    """The application's clock (``eros.clock.now``), stopped at a moment the test moves."""

    def __init__(self, moment: datetime):
        self.moment = moment

    def __call__(self) -> datetime:
        return self.moment


@pytest.fixture
def clock(monkeypatch) -> Clock:
    """``eros.clock.now`` stopped at NOON (a Saturday, ten seconds into a minute); move it with ``clock.moment``."""
    stopped = Clock(NOON)
    monkeypatch.setattr(eros.clock, "now", stopped)
    return stopped
