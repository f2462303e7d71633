"""The one place where logging, tracing and metrics are set up (Powertools, at module scope).

Per-invocation state is kept per thread. Lambda runs one invocation at a time per process, on one
thread, so there this is exactly Powertools' behaviour; the local stack (eros_dev) runs several
"containers" of a function at once, each on its own thread, and Powertools keeps both the logger's
appended keys (correlation id, request id, cold start) and the metrics buffer process-wide: a local
sweep logged with the last chat request's correlation id, and concurrent extract invocations flushed
each other's metrics ("Must contain at least one metric"). Here each thread has its own.

Where the lines go, and in what form, is LOG_FORMAT (``eros.config``): "json" (Lambda's default) is Powertools'
structured lines and the EMF metric blobs, for CloudWatch; "text" (a terminal's default: `make run`, the ``eros``
command) is one readable line per record and no metric blobs. It is read per record, so that a test or a command
that changes the settings changes the logs with them.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.logging.formatter import LambdaPowertoolsFormatter
from aws_lambda_powertools.metrics.provider.cloudwatch_emf.cloudwatch import AmazonCloudWatchEMFProvider

from .userkey import shown as user_shown

SERVICE = "eros"


def text_logs() -> bool:
    """Whether logs are for a person (LOG_FORMAT=text) rather than for CloudWatch. Settings that cannot be read
    log as JSON: the command that reads them says what is wrong."""
    from .config import settings

    try:
        return settings().log_format == "text"
    except Exception:
        return False


# Keys of every record that a person at a terminal does not need (the invocation's context, where in the code,
# the trace), and the short names the text form gives a few others.
_NOT_SHOWN = frozenset({"level", "location", "message", "timestamp", "service", "sampling_rate", "cold_start",
                        "function_name", "function_memory_size", "function_arn", "function_request_id",
                        "correlation_id", "xray_trace_id", "exception", "exception_name", "exception_notes",
                        "stack_trace"})
_SHORT = {"session_id": "session", "user_id": "user"}


class ThreadKeysFormatter(LambdaPowertoolsFormatter):
    """Powertools' JSON log formatter with its appended keys (``log_format``) kept per thread; every
    thread starts from the keys the logger was set up with (``start_here``). With LOG_FORMAT=text, one
    readable line instead (``text``)."""

    def __init__(self, **options):
        self._keys = threading.local()
        self._base: dict = {}
        super().__init__(**options)

    def start_here(self) -> None:
        """The calling thread's keys become every other thread's starting keys."""
        self._base = dict(self.log_format)

    @property
    def log_format(self) -> dict:
        keys = getattr(self._keys, "value", None)
        if keys is None:
            keys = self._keys.value = dict(self._base)
        return keys

    @log_format.setter
    def log_format(self, keys: dict) -> None:
        self._keys.value = keys

    def format(self, record: logging.LogRecord) -> str:
        return self.text(record) if text_logs() else super().format(record)

    def text(self, record: logging.LogRecord) -> str:
        """``16:57:37 WARNING  message  user=alice session=... fault=...``: the time, the level, the message and
        the record's keys that say something (not the invocation's context; no empty or zero value), each
        value cut at 120 characters; an exception's type and message after them (its traceback with
        EROS_DEBUG=1)."""
        keys = self._extract_log_keys(log_record=record)
        if isinstance(keys.get("user_id"), str):
            keys["user_id"] = user_shown(keys["user_id"])  # a user of another app: alice@acme
        shown = " ".join(f"{_SHORT.get(k, k)}={_short(v)}" for k, v in keys.items()
                         if k not in _NOT_SHOWN and v not in (None, "", 0, False, [], {}))
        line = f"{time.strftime('%H:%M:%S', time.localtime(record.created))} {record.levelname:<7} " \
               f"{record.getMessage()}" + (f"  {shown}" if shown else "")
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            line += f"  ! {type(error).__name__}: {_short(str(error))}"
            if _debugging():
                line += "\n" + self.formatException(record.exc_info)
        return line


def _short(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, separators=(",", ":"))
    text = " ".join(text.split())  # one line
    return text if len(text) <= 120 else text[:119] + "…"


def _debugging() -> bool:
    from .config import settings

    try:
        return settings().eros_debug
    except Exception:
        return False


class TerminalAwareEMFProvider(AmazonCloudWatchEMFProvider):
    """Powertools' EMF provider; with LOG_FORMAT=text a flush prints no blob (nor warns that there is none to
    print): the metrics are dropped, as they would be anyway with no CloudWatch to read them."""

    def flush_metrics(self, raise_on_empty_metrics: bool = False) -> None:
        if not text_logs():
            return super().flush_metrics(raise_on_empty_metrics)
        self.clear_metrics()


class ThreadMetrics(Metrics):
    """Powertools Metrics with one buffer (metrics, dimensions, metadata) per thread instead of one per
    process; ``log_metrics`` flushes the buffer of the thread that runs the handler."""

    def __init__(self, namespace: str, service: str):  # no super().__init__: it binds the process-wide buffer
        self._namespace, self._service = namespace, service
        self._local = threading.local()

    @property
    def provider(self) -> AmazonCloudWatchEMFProvider:  # type: ignore[override]  # Powertools' attribute, per thread
        provider = getattr(self._local, "provider", None)
        if provider is None:
            provider = self._local.provider = TerminalAwareEMFProvider(namespace=self._namespace,
                                                                       service=self._service)
        return provider

    # Powertools' Metrics declares these as plain attributes; here they are the calling thread's.
    metric_set = property(lambda self: self.provider.metric_set)
    dimension_set = property(lambda self: self.provider.dimension_set)
    metadata_set = property(lambda self: self.provider.metadata_set)
    default_dimensions = property(lambda self: self.provider.default_dimensions)

    def log_metrics(self, lambda_handler=None, **options):
        if lambda_handler is None:
            return functools.partial(self.log_metrics, **options)

        @functools.wraps(lambda_handler)
        def handler(*args, **kwargs):  # the calling thread's provider, chosen per invocation
            return self.provider.log_metrics(lambda_handler, **options)(*args, **kwargs)

        return handler


def trace_aws_calls() -> None:
    """Patch botocore for X-Ray before the first boto3 client is made (idempotent; nothing when tracing is
    off). A boto3 call then has its subsegment, and an asynchronous Lambda invoke carries the trace on."""
    tracer.patch(["botocore"])


def time_left(context, reserve_secs: float) -> float:
    """Seconds an invocation may still spend, keeping ``reserve_secs`` of Lambda's timeout to write and report."""
    return max(1.0, context.get_remaining_time_in_millis() / 1000 - reserve_secs)


_formatter = ThreadKeysFormatter()
logger = Logger(service=SERVICE, logger_formatter=_formatter)
_formatter.start_here()  # service, sampling_rate: the keys of every thread
# X-Ray subsegments for the provider calls (httpx) from the first request. Powertools' default patches
# every library the X-Ray SDK knows, and patching botocore imports it: ~150 ms of every cold start, in the
# chat function too, which only needs boto3 to read its secrets. AWS calls are traced from the moment the
# code first reaches for boto3 (``trace_aws_calls``).
tracer = Tracer(service=SERVICE, patch_modules=["httpx"])
metrics = ThreadMetrics(namespace="Eros", service=SERVICE)
