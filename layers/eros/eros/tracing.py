"""Tracing without content: X-Ray sees ids, counts, outcomes and timings, never what people wrote.

Two leaks are closed here (issue 8, item 11):

* Powertools' ``capture_lambda_handler`` / ``capture_method`` put the decorated function's return value
  and its exception into the segment as metadata by default: a chat reply, a page of history, a memory
  listing, a transcript-bearing error. The decorators below pass ``capture_response=False`` and
  ``capture_error=False`` and annotate what a trace is for instead (``annotations`` of each handler).
* The X-Ray SDK records the *message* of every exception that leaves a subsegment (its own, a patched
  client's, a database cursor's), and a message can carry content: a database error's DETAIL echoes
  the row, a validation error its input, a provider error its body. Every entity leaves the process
  through ``RedactingEmitter``, which keeps the exception's type and stack and drops its message.

Annotation values are only ids (UUIDs), numbers, booleans and a few fixed vocabularies (outcome, route,
model); user ids are left out (some identity providers put an e-mail address in ``sub``).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from typing import Any

from aws_xray_sdk.core import xray_recorder

from .observability import logger, tracer

Annotations = dict[str, str | int | float | bool | None]

# Fields of a handler's result dict that are safe to annotate as they are (fixed vocabularies).
_WORD_FIELDS = ("outcome", "stopped_by", "kind")
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
# The chat API's routes as templates (a raw path is client text: only a known shape is annotated).
_ROUTES = [(re.compile(pattern), template) for pattern, template in [
    (r"^/v1/sessions/([^/]+)/turns$", "/v1/sessions/{session_id}/turns"),
    (r"^/v1/sessions/([^/]+)/messages$", "/v1/sessions/{session_id}/messages"),
    (r"^/v1/sessions/([^/]+)/context$", "/v1/sessions/{session_id}/context"),
    (r"^/v1/memories/([^/]+)/restore$", "/v1/memories/{memory_id}/restore"),
    (r"^/v1/memories/([^/]+)$", "/v1/memories/{memory_id}"),
    (r"^/v1/personas/([^/]+)$", "/v1/personas/{persona_id}"),
    (r"^/v1/(health|openapi\.json|docs|personas|sessions|memories|imports)$", None),
]]
_LISTS = ("messages", "memories", "sessions", "personas")


class RedactingEmitter:
    """Wraps the recorder's emitter: removes exception messages from an entity and its subsegments."""

    def __init__(self, inner):
        self.inner = inner

    def send_entity(self, entity) -> None:
        redact_exception_messages(entity)
        self.inner.send_entity(entity)

    def __getattr__(self, name: str):  # set_daemon_address, ip, port, ...
        return getattr(self.inner, name)


def redact_exception_messages(entity) -> None:
    cause = getattr(entity, "cause", None)
    if isinstance(cause, dict):
        for throwable in cause.get("exceptions", []):
            if hasattr(throwable, "message"):
                del throwable.message
    for child in list(getattr(entity, "subsegments", None) or []):
        redact_exception_messages(child)


def install(recorder=xray_recorder) -> None:
    """Route the recorder's entities through ``RedactingEmitter`` (idempotent)."""
    if not isinstance(recorder.emitter, RedactingEmitter):
        recorder.emitter = RedactingEmitter(recorder.emitter)


install()


def _annotate(values: Annotations) -> None:
    for key, value in values.items():
        if value is not None:
            tracer.put_annotation(key=key, value=value)  # type: ignore[arg-type]  # int and float are Numbers


def lambda_handler(annotations: Callable[[Any, Any], Annotations]):
    """``tracer.capture_lambda_handler`` that captures neither response nor error, and annotates the
    handler's subsegment with ``annotations(event, result)`` (or the error's type)."""

    def decorate(handler):
        @functools.wraps(handler)
        def annotated(event, context, **kwargs):
            try:
                result = handler(event, context, **kwargs)
            except Exception as error:
                failure = type(error).__name__
                _safely(lambda: _annotate({"outcome": "error", "error_type": failure}))
                raise
            if not tracer.disabled:  # reading the response for annotations is work only a trace wants
                _safely(lambda: _annotate(annotations(event, result)))
            return result

        return tracer.capture_lambda_handler(annotated, capture_response=False, capture_error=False)

    return decorate


def _safely(work: Callable[[], None]) -> None:
    try:
        work()
    except Exception as error:  # noqa: BLE001 - a trace annotation never fails a request
        logger.debug("trace annotation failed", extra={"error_type": type(error).__name__})


# --- what each function annotates ----------------------------------------------------------------

def _numbers_and_words(result: Any) -> Annotations:
    if not isinstance(result, dict):
        return {}
    out: Annotations = {}
    for key, value in result.items():
        if isinstance(value, (bool, int, float)) or key in _WORD_FIELDS and isinstance(value, str) and len(value) <= 40:
            out[key] = value
    return out


def _uuid(value: Any) -> str | None:
    return value if isinstance(value, str) and _UUID.match(value) else None


def extract_annotations(event: Any, result: Any) -> Annotations:
    """The extract function: the job's kind and session id, the result's counts and outcome."""
    event = event if isinstance(event, dict) else {}
    return {"kind": "deep_pass" if event.get("kind") == "deep_pass" else "session",
            "session_id": _uuid(event.get("session_id")), **_numbers_and_words(result)}


def sweeper_annotations(event: Any, result: Any) -> Annotations:
    """The sweeper: what it claimed and invoked, and what stopped it."""
    return _numbers_and_words(result)


def chat_annotations(event: Any, result: Any) -> Annotations:
    """The chat API: route, status, the session or memory id; a turn's model, recalled count and replay;
    a listing's item count. Read from the response without keeping any of its text."""
    event = event if isinstance(event, dict) else {}
    path = str(event.get("rawPath") or "")
    http = (event.get("requestContext") or {}).get("http") or {}
    out: Annotations = {"http_method": str(http.get("method", ""))[:10] or None, "route": "other"}
    for pattern, template in _ROUTES:
        match = pattern.match(path)
        if match:
            out["route"] = template or path
            if template and "{session_id}" in template:
                out["session_id"] = _uuid(match.group(1))
            elif template and "{memory_id}" in template:
                out["memory_id"] = _uuid(match.group(1))
            break
    status = result.get("statusCode") if isinstance(result, dict) else None
    if isinstance(status, int):
        out["status_code"] = status
        out["outcome"] = "ok" if status < 400 else "client_error" if status < 500 else "server_error"
    body = _json_body(result)
    if isinstance(body, dict):
        out |= _body_annotations(out, body)
    return out


def _body_annotations(out: Annotations, body: dict) -> Annotations:
    """What the chat API's answer adds: a turn's model, recalled count and replay; a listing's item count;
    a new session's id."""
    found: Annotations = {}
    if out["route"] == "/v1/sessions/{session_id}/turns" and "reply" in body:
        recalled = body.get("recalled")
        found["recalled"] = len(recalled) if isinstance(recalled, list) else None
        model = body.get("model")
        found["model"] = model[:100] if isinstance(model, str) else None
        found["replayed"] = body.get("replayed") if isinstance(body.get("replayed"), bool) else None
    else:
        found["items"] = next((len(body[key]) for key in _LISTS if isinstance(body.get(key), list)), None)
    if out["route"] == "/v1/sessions" and out.get("http_method") == "POST":
        found["session_id"] = _uuid(body.get("id"))
    return found


def _json_body(result: Any) -> Any:
    if not isinstance(result, dict) or result.get("isBase64Encoded"):
        return None
    body = result.get("body")
    if not isinstance(body, str) or not body.startswith("{"):
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None
