"""Lambda's side of the local stack: functions run as Lambda runs them, in containers (``Function``), each on its
own thread with its own copy of the function module, one invocation at a time; concurrent invocations take
concurrent containers, never the same one."""

from __future__ import annotations

import importlib.util
import itertools
import queue
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

from . import ROOT


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


def load_function(name: str, copy: str | None = None, entry: str = "app") -> ModuleType:
    """Import functions/<name>/<entry>.py (the same file Lambda runs: app.py, or the chat function's stream.py)
    under a unique module name; a named ``copy`` is a separate module object (a container's own module-level
    state).

    The modules beside app.py (the chat function's ``routes`` and ``models``) are imported as Lambda does, from
    the function's folder first on sys.path, and afresh for every load: each copy has its own, so its routers are
    included in its own resolver only and read that resolver's request (a Router shared by two copies would read
    the event of whichever copy included it last)."""
    module_name = f"eros_function_{name}" + ("" if entry == "app" else f"_{entry}") + (f"__{copy}" if copy else "")
    folder = ROOT / "functions" / name
    with _LOADING:
        if module_name in sys.modules:
            return sys.modules[module_name]
        spec = importlib.util.spec_from_file_location(module_name, folder / f"{entry}.py")
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
                 prepare: Callable[[ModuleType], None] | None = None, entry: str = "app"):
        self.name, self.timeout_secs, self.prepare, self.entry = name, timeout_secs, prepare, entry
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
            module = load_function(self.name, copy=f"container{next(_CONTAINER_NUMBERS)}", entry=self.entry)
            own_resolver_state(module)
            if isinstance(getattr(module, "app", None), ModuleType):  # stream.py: its app module's resolver
                own_resolver_state(module.app)
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

    def invoke_streaming(self, event: dict) -> tuple[int, dict, Iterator[bytes]]:
        """An invocation of a streaming handler (one that returns ``eros.streaming.Streamed``), as a function URL in
        response-streaming mode makes it: the status and headers once the handler returned, then the body's chunks
        as the container writes them. The container iterates the body itself (its own database connection), to
        the end whether or not the caller reads on, as Lambda runs a function whose client went away."""
        chunks: queue.Queue = queue.Queue()
        head: Future = Future()

        def run(streamed) -> None:
            head.set_result((streamed.status_code, dict(streamed.headers)))
            try:
                for chunk in streamed.body:
                    chunks.put(chunk)
            finally:
                chunks.put(None)

        def invoke(event: dict) -> None:
            try:
                streamed = self._run(event)
            except BaseException as exc:
                head.set_exception(exc)
                return
            run(streamed)

        self._pool.submit(invoke, event)
        status, headers = head.result()

        def body() -> Iterator[bytes]:
            while (chunk := chunks.get()) is not None:
                yield chunk

        return status, headers, body()

    def close(self, wait: bool = True) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=not wait)
