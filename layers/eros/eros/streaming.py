"""A streamed answer: what a streaming handler returns, and the Server-Sent Events it is written in.

A streaming route (``functions/chat/stream.py``: a chat turn whose reply is sent as the model writes it) returns a
``Streamed``: the status and headers, known before the first byte, then the body as an iterator of byte chunks.
Whoever carries it to the client writes each chunk as it comes: in AWS the function's own runtime loop
(``eros.stream_runtime``, Lambda's response streaming behind a function URL), in the local stack the dev server.
Neither may stop iterating early: a client that goes away is told to the iterator by ``close()``, and the turn's
iterator then finishes its work (the reply is stored whole) before ``close()`` returns.

The events (``text/event-stream``; each ``data`` is one JSON object on one line):

* ``turn``  once, first: ``{"client_turn_id", "user_message_id"}``, as soon as the message is stored (a client whose
  connection drops retries with this id and gets the stored reply).
* ``delta`` ``{"delta": "..."}`` each piece of the reply as the model writes it; the pieces joined are the reply.
* ``done``  last, on success: the same fields as the JSON route's answer (``eros.chat.TurnResult``).
* ``error`` last, on failure after the stream began: the JSON route's error body (``statusCode``, ``code``,
  ``message``, ``retryable``, ...); a failure before it began is answered as the JSON route answers it, with its
  status and a JSON body.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

EVENT_STREAM = "text/event-stream; charset=utf-8"
# no-transform: a proxy must not buffer or compress the stream; X-Accel-Buffering: nginx-style proxies likewise.
STREAM_HEADERS = {"Content-Type": EVENT_STREAM, "Cache-Control": "no-cache, no-transform",
                  "X-Accel-Buffering": "no"}


# The events of the streamed turn the current request's route began (functions/chat/routes/sessions.py), for its
# handler to send after the resolver answered the status and headers; None when the route answered whole.
Event = tuple[str, dict]
pending: ContextVar[Iterator[Event] | None] = ContextVar("pending_stream", default=None)


def sse(event: str, data: dict) -> bytes:
    """One Server-Sent Event: its name and one line of JSON (JSON escapes every newline inside a string)."""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False, separators=(',', ':'), default=str)}\n\n" \
        .encode()


@dataclass
class Streamed:
    """A streaming handler's answer: ``status_code`` and ``headers`` first, then ``body``'s chunks as they come."""
    status_code: int
    headers: dict[str, str] = field(default_factory=dict)
    body: Iterator[bytes] = field(default_factory=lambda: iter(()))

    @classmethod
    def whole(cls, status_code: int, headers: dict[str, str], body: str | bytes) -> Streamed:
        """An answer that is not streamed (an error before the stream began): one chunk."""
        data = body.encode() if isinstance(body, str) else body
        return cls(status_code, headers, iter([data] if data else []))


def events(data: bytes) -> Iterator[tuple[str, dict]]:
    """The (event, data) pairs of a complete Server-Sent Events text (what tests and clients read back)."""
    for block in data.decode().split("\n\n"):
        name, payload = "message", None
        for line in block.splitlines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                payload = json.loads(line[5:].strip())
        if payload is not None:
            yield name, payload
