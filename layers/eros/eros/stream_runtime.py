"""The streaming function's own runtime loop: Lambda's Runtime API, spoken with the standard library.

Lambda's Python managed runtime sends a handler's return value as one buffered document; it cannot stream. A
function URL with ``InvokeMode: RESPONSE_STREAM`` streams what the *runtime* writes as it writes it, so the
stream function (template.yaml, ``ChatStreamFunction``) keeps the python3.12 managed runtime (its Python, its
boto3, its patches) and replaces only the loop: ``AWS_LAMBDA_EXEC_WRAPPER`` names ``functions/chat/stream-bootstrap``,
which ignores the managed bootstrap it is handed and runs ``python3 -m eros.stream_runtime``. docs/DEPLOY.md,
"Streaming front door", says why this front door and what it costs.

The loop, per execution environment (Lambda's Runtime API, version 2018-06-01, at ``AWS_LAMBDA_RUNTIME_API``):

* once: import the handler ``_HANDLER`` names (``stream.lambda_handler``: module ``stream`` from
  ``LAMBDA_TASK_ROOT``); a failure is posted to ``/runtime/init/error`` and the process exits (Lambda starts a
  new environment for the next request);
* for ever: ``GET /runtime/invocation/next`` (blocks until a request comes; its headers give the request id,
  the deadline, the invoked ARN, the trace id), call the handler with the event and a context object, and
  ``POST /runtime/invocation/{id}/response`` with its ``eros.streaming.Streamed`` as Lambda's streaming response:
  ``Lambda-Runtime-Function-Response-Mode: streaming``, ``Transfer-Encoding: chunked`` and the content type
  ``application/vnd.awslambda.http-integration-response``, whose body is a JSON prelude (``statusCode``,
  ``headers``, ``cookies``), eight NUL bytes, then the HTTP body the client gets. Each chunk of the body is one
  HTTP chunk, written to the socket as the handler yields it (no buffering, Nagle off).

Failures: a handler that raises before its answer exists is posted to ``/runtime/invocation/{id}/error`` (the
Lambda error document; the client gets a 502). A body that raises mid-stream ends the stream with the error in
the trailers Lambda reads (``Lambda-Runtime-Function-Error-Type``, ``Lambda-Runtime-Function-Error-Body``); a
streamed turn does not raise (it writes an ``error`` event), so this is a bug's path. When the Runtime API
connection fails mid-stream the body is not abandoned: ``close()`` is called on it (eros.streaming: the turn then
finishes its work and stores the reply whole before ``close()`` returns), or an iterator without ``close()`` is
drained, so a reply the client could not receive is still stored and a retry with its ``client_turn_id`` replays it.
"""

from __future__ import annotations

import base64
import http.client
import importlib
import json
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from .streaming import Streamed

API_VERSION = "2018-06-01"
PRELUDE_CONTENT_TYPE = "application/vnd.awslambda.http-integration-response"
DELIMITER = b"\0" * 8  # between the prelude and the body
ERROR_TYPE_TRAILER = "Lambda-Runtime-Function-Error-Type"
ERROR_BODY_TRAILER = "Lambda-Runtime-Function-Error-Body"

Handler = Callable[[Any, Any], Any]


class Context:
    """What Lambda's Python runtime gives a handler as ``context``: the invocation's ids and deadline, the
    function's names (Powertools' ``inject_lambda_context`` reads these)."""

    def __init__(self, request_id: str, deadline_ms: int, invoked_function_arn: str,
                 environ: dict[str, str] | None = None, client_context: Any = None, identity: Any = None):
        env = os.environ if environ is None else environ
        self.aws_request_id = request_id
        self.invoked_function_arn = invoked_function_arn
        self.function_name = env.get("AWS_LAMBDA_FUNCTION_NAME", "")
        self.function_version = env.get("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        self.memory_limit_in_mb = int(env.get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "0") or 0)
        self.log_group_name = env.get("AWS_LAMBDA_LOG_GROUP_NAME", "")
        self.log_stream_name = env.get("AWS_LAMBDA_LOG_STREAM_NAME", "")
        self.client_context = client_context
        self.identity = identity
        self._deadline_ms = deadline_ms

    def get_remaining_time_in_millis(self) -> int:
        return max(0, self._deadline_ms - int(time.time() * 1000))


def error_document(exc: BaseException, request_id: str | None = None) -> dict:
    """The Lambda error JSON (what the managed runtime posts): the message, the exception's type, its stack."""
    document: dict[str, Any] = {
        "errorMessage": str(exc) or type(exc).__name__, "errorType": type(exc).__name__,
        "stackTrace": [line.rstrip("\n") for line in traceback.format_tb(exc.__traceback__)]}
    if request_id:
        document["requestId"] = request_id
    return document


class RuntimeApi:
    """The Runtime API at ``address`` (host:port). A connection per call: the API is on the same host, and a
    connection a failed stream left half-written is never reused."""

    def __init__(self, address: str):
        self.address = address

    def _connection(self, timeout: float | None = None) -> http.client.HTTPConnection:
        host, _, port = self.address.rpartition(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
        connection.connect()
        assert connection.sock is not None
        connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a small chunk goes at once
        return connection

    def _post(self, path: str, document: dict, headers: dict[str, str] | None = None) -> int:
        connection = self._connection(timeout=30)
        try:
            connection.request("POST", f"/{API_VERSION}/runtime/{path}", body=json.dumps(document).encode(),
                               headers={"Content-Type": "application/json", **(headers or {})})
            response = connection.getresponse()
            response.read()
            return response.status
        finally:
            connection.close()

    def next(self) -> tuple[dict[str, str], Any]:
        """The next invocation: its headers (lower-cased names) and its event. Blocks until there is one."""
        connection = self._connection()  # no timeout: Lambda answers when a request comes (or freezes us)
        try:
            connection.request("GET", f"/{API_VERSION}/runtime/invocation/next")
            response = connection.getresponse()
            body = response.read()
            if response.status != 200:
                raise RuntimeError(f"the Runtime API answered {response.status} to invocation/next")
            return {k.lower(): v for k, v in response.getheaders()}, json.loads(body)
        finally:
            connection.close()

    def init_error(self, exc: BaseException) -> int:
        kind = ("Runtime.ImportModuleError" if isinstance(exc, ImportError) else
                "Runtime.HandlerNotFound" if isinstance(exc, AttributeError) else "Runtime.Unknown")
        return self._post("init/error", error_document(exc) | {"errorType": kind},
                          {ERROR_TYPE_TRAILER: kind})

    def invocation_error(self, request_id: str, exc: BaseException) -> int:
        return self._post(f"invocation/{request_id}/error", error_document(exc, request_id),
                          {ERROR_TYPE_TRAILER: "Unhandled"})

    def stream(self, request_id: str, answer: Streamed) -> bool:
        """Post ``answer`` as the invocation's streaming response, each body chunk as it comes. True when
        Lambda accepted all of it; False when the connection failed (the body is then closed or drained)."""
        body = iter(answer.body)
        connection: http.client.HTTPConnection | None = None
        try:
            connection = self._connection()
            connection.putrequest("POST", f"/{API_VERSION}/runtime/invocation/{request_id}/response",
                                  skip_accept_encoding=True)
            for name, value in (("Content-Type", PRELUDE_CONTENT_TYPE),
                                ("Lambda-Runtime-Function-Response-Mode", "streaming"),
                                ("Transfer-Encoding", "chunked"),
                                ("Trailer", f"{ERROR_TYPE_TRAILER}, {ERROR_BODY_TRAILER}")):
                connection.putheader(name, value)
            connection.endheaders()
            prelude = json.dumps({"statusCode": answer.status_code, "headers": dict(answer.headers), "cookies": []})
            connection.send(_chunk(prelude.encode() + DELIMITER))
            trailers = b""
            while True:
                try:
                    piece = next(body)
                except StopIteration:
                    break
                except Exception as exc:  # the body failed mid-stream: Lambda reads the error from the trailers
                    trailers = _error_trailers(exc, request_id)
                    break
                if piece:  # an empty chunk would end the body
                    connection.send(_chunk(piece))
            connection.send(b"0\r\n" + trailers + b"\r\n")
            response = connection.getresponse()
            response.read()
            return 200 <= response.status < 300
        except (OSError, http.client.HTTPException) as exc:
            # The Runtime API went away mid-stream: the turn still finishes, and stores its reply.
            print(f"the response stream broke ({type(exc).__name__}: {exc}); finishing the body",
                  file=sys.stderr, flush=True)
            _finish(body)
            return False
        finally:
            _close(body)
            if connection is not None:
                connection.close()


def _error_trailers(exc: Exception, request_id: str) -> bytes:
    traceback.print_exception(exc, file=sys.stderr)
    document = base64.b64encode(json.dumps(error_document(exc, request_id)).encode()).decode()
    return f"{ERROR_TYPE_TRAILER}: {type(exc).__name__}\r\n{ERROR_BODY_TRAILER}: {document}\r\n".encode()


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _close(body: Iterator[bytes]) -> None:
    """Close the body (a no-op once it ended). Its failure is logged, not raised: the container serves on."""
    close = getattr(body, "close", None)
    if callable(close):
        try:
            close()
        except Exception:
            traceback.print_exc(file=sys.stderr)


def _finish(body: Iterator[bytes]) -> None:
    """What a client that went away leaves the body to do: finish its work. ``close()`` when it has one (the
    turn's iterator stores the reply before it returns), else read it to its end."""
    if callable(getattr(body, "close", None)):
        _close(body)
        return
    for _ in body:
        pass


def as_streamed(result: Any) -> Streamed:
    """A handler's answer as a ``Streamed``: one already is; an API Gateway-style dict (``statusCode``, ``headers``,
    ``body``, ``isBase64Encoded``) is sent whole."""
    if isinstance(result, Streamed):
        return result
    if isinstance(result, dict) and isinstance(result.get("statusCode"), int):
        body = result.get("body") or ""
        data = base64.b64decode(body) if result.get("isBase64Encoded") else str(body).encode()
        return Streamed.whole(result["statusCode"], {k: str(v) for k, v in (result.get("headers") or {}).items()},
                              data)
    raise TypeError(f"a streaming handler returns eros.streaming.Streamed, not {type(result).__name__}")


def load_handler(name: str, task_root: str | None) -> Handler:
    """The handler ``name`` ("module.function", the module's dots allowed) from ``task_root`` (first on sys.path)."""
    module_name, _, function_name = name.rpartition(".")
    if not module_name or not function_name:
        raise ValueError(f"_HANDLER must be module.function, not {name!r}")
    if task_root and task_root not in sys.path:
        sys.path.insert(0, task_root)
    handler = getattr(importlib.import_module(module_name), function_name)
    if not callable(handler):
        raise TypeError(f"{name} is not callable")
    return handler


def invoke_once(api: RuntimeApi, handler: Handler, environ: dict[str, str] | None = None) -> bool:
    """One invocation: the next event, the handler, its answer streamed (or its error posted). True when the
    answer reached Lambda whole."""
    headers, event = api.next()
    request_id = headers["lambda-runtime-aws-request-id"]
    if headers.get("lambda-runtime-trace-id"):  # what the X-Ray SDK (Powertools' tracer) reads
        os.environ["_X_AMZN_TRACE_ID"] = headers["lambda-runtime-trace-id"]
    else:  # never the previous invocation's
        os.environ.pop("_X_AMZN_TRACE_ID", None)
    context = Context(request_id, int(headers.get("lambda-runtime-deadline-ms", "0")),
                      headers.get("lambda-runtime-invoked-function-arn", ""), environ,
                      _json_header(headers.get("lambda-runtime-client-context")),
                      _json_header(headers.get("lambda-runtime-cognito-identity")))
    try:
        answer = as_streamed(handler(event, context))
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        api.invocation_error(request_id, exc)
        return False
    return api.stream(request_id, answer)


def _json_header(value: str | None) -> Any:
    try:
        return json.loads(value) if value else None
    except ValueError:
        return None


def main(environ: dict[str, str] | None = None) -> int:
    """The runtime: load the handler once, then serve invocations until Lambda stops the environment."""
    env = dict(os.environ if environ is None else environ)
    api = RuntimeApi(env["AWS_LAMBDA_RUNTIME_API"])
    try:
        handler = load_handler(env.get("_HANDLER", ""), env.get("LAMBDA_TASK_ROOT"))
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        api.init_error(exc)
        return 1
    while True:
        invoke_once(api, handler, env)


if __name__ == "__main__":
    sys.exit(main())
