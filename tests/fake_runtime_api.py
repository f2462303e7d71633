"""A fake Lambda Runtime API: a real HTTP server on loopback speaking the Runtime API's wire format (version
2018-06-01), for the stream function's runtime loop (eros.stream_runtime).

    api = FakeRuntimeApi([event, ...])   hands each event once to GET /runtime/invocation/next, in order; with
                                         none left, /next blocks until the fake is closed (as Lambda freezes)
    api.address                          "127.0.0.1:port" (AWS_LAMBDA_RUNTIME_API)
    api.responses[request_id]            a streamed or buffered response: {"headers" (lower-cased names),
                                         "chunks": [(time.monotonic() on arrival, bytes), ...] (each HTTP chunk as
                                         it was read), "trailers", "complete" (the terminating chunk came)}
    api.errors[request_id]               an invocation error: {"headers", "json"}
    api.init_errors                      init errors posted: [{"headers", "json"}]
    api.drop_after = n                   the response connection is reset after n chunks (a client gone mid-stream)
    api.trace_id                         the Lambda-Runtime-Trace-Id /next hands out (None: no such header)
    api.wait(request_id)                 until that request's response, or error, has arrived
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import uuid
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PREFIX = "/2018-06-01/runtime/"


class _Server(ThreadingHTTPServer):
    fake: FakeRuntimeApi


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        fake = self.server.fake
        if self.path != PREFIX + "invocation/next":
            return self._answer(404, {"errorMessage": "no such path"})
        while True:
            with fake._done:
                if fake.events:
                    request_id, event = fake.events.popleft()
                    fake.handed.append(request_id)
                    break
            if fake._closed.wait(0.05):
                return self._answer(500, {"errorMessage": "closed"})
        deadline = int((time.time() + fake.deadline_secs) * 1000)
        self._answer(200, event, {
            "Lambda-Runtime-Aws-Request-Id": request_id, "Lambda-Runtime-Deadline-Ms": str(deadline),
            "Lambda-Runtime-Invoked-Function-Arn": "arn:aws:lambda:us-east-1:123456789012:function:stream",
            **({"Lambda-Runtime-Trace-Id": fake.trace_id} if fake.trace_id else {})})

    def do_POST(self):
        fake = self.server.fake
        path = self.path.removeprefix(PREFIX)
        headers = {k.lower(): v for k, v in self.headers.items()}
        if path == "init/error":
            record = {"headers": headers, "json": json.loads(self._body())}
            with fake._done:
                fake.init_errors.append(record)
                fake._done.notify_all()
            return self._answer(202, {"status": "OK"})
        parts = path.split("/")
        if len(parts) != 3 or parts[0] != "invocation" or parts[2] not in ("response", "error"):
            return self._answer(404, {"errorMessage": "no such path"})
        request_id, kind = parts[1], parts[2]
        if kind == "error":
            record = {"headers": headers, "json": json.loads(self._body())}
            with fake._done:
                fake.errors[request_id] = record
                fake._done.notify_all()
            return self._answer(202, {"status": "OK"})
        record = {"headers": headers, "chunks": [], "trailers": {}, "complete": False}
        with fake._done:
            fake.responses[request_id] = record
        if headers.get("transfer-encoding", "").lower() != "chunked":
            record["chunks"].append((time.monotonic(), self._body()))
            record["complete"] = True
        elif not self._read_chunks(record):
            return  # reset: the connection is gone
        with fake._done:
            fake._done.notify_all()
        self._answer(202, {"status": "OK"})

    def _read_chunks(self, record: dict) -> bool:
        fake = self.server.fake
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip(), 16)
            if size == 0:
                break
            data = self.rfile.read(size)
            self.rfile.readline()  # the chunk's CRLF
            record["chunks"].append((time.monotonic(), data))
            if fake.drop_after is not None and len(record["chunks"]) >= fake.drop_after:
                # An abortive close (RST): the writer's next send fails, as a broken stream's does.
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()
                self.close_connection = True
                with fake._done:
                    fake._done.notify_all()
                return False
        while (line := self.rfile.readline().strip()):
            name, _, value = line.decode().partition(":")
            record["trailers"][name.strip().lower()] = value.strip()
        record["complete"] = True
        return True

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _answer(self, status: int, document: Any, headers: dict[str, str] | None = None):
        body = json.dumps(document).encode()
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class FakeRuntimeApi:
    def __init__(self, events: list[Any], *, deadline_secs: float = 30):
        self.events: deque[tuple[str, Any]] = deque((str(uuid.uuid4()), e) for e in events)
        self.request_ids = [rid for rid, _ in self.events]
        self.deadline_secs = deadline_secs
        self.responses: dict[str, dict] = {}
        self.errors: dict[str, dict] = {}
        self.init_errors: list[dict] = []
        self.drop_after: int | None = None
        self.trace_id: str | None = "Root=1-67d1d9de-5f0a1b2c3d4e5f6a7b8c9d0e;Sampled=0"
        self.handed: list[str] = []
        self._done = threading.Condition()
        self._closed = threading.Event()
        self.server = _Server(("127.0.0.1", 0), _Handler)
        self.server.fake = self
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def wait(self, request_id: str | None = None, timeout: float = 10) -> None:
        """Until ``request_id``'s response or error has arrived (or, with None, an init error)."""
        def arrived() -> bool:
            if request_id is None:
                return bool(self.init_errors)
            response = self.responses.get(request_id)
            return request_id in self.errors or bool(response and (response["complete"] or self._dropped(response)))

        with self._done:
            assert self._done.wait_for(arrived, timeout), f"nothing arrived for {request_id}"

    def _dropped(self, response: dict) -> bool:
        return self.drop_after is not None and len(response["chunks"]) >= self.drop_after

    def close(self) -> None:
        self._closed.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FakeRuntimeApi:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
