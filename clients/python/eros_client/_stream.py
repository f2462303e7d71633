"""A streamed turn (``POST /v1/sessions/{id}/turns/stream``): the reply's pieces as the model writes them, then the
same answer as ``take_turn``'s.

The route answers Server-Sent Events: ``turn`` once the user's message is stored, ``delta`` for each piece of the
reply, then ``done`` (the JSON route's answer) or ``error`` (the API's error body). A failure before the stream
begins is answered as the JSON route answers it (a status and a JSON body). ``TurnStream`` and
``AsyncTurnStream`` read it:

* errors are the JSON call's: ``ApiError`` (``Unauthorized`` for a 401), retried by the same policy while no piece
  has been given to the caller (a piece given cannot be taken back);
* a stream that breaks off before its last event is asked for again with the same ``client_turn_id`` (the server
  replays the stored reply, or the turn it is still finishing), and only what the caller has not had yet is
  given; after ``max_retries`` breaks the ``httpx.TransportError`` is raised, as the JSON call raises it;
* an API deployed before the route (a 404 "no route", or 405) is asked through the JSON route instead, once per
  client: the whole reply is then one piece.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator
from typing import TYPE_CHECKING, Any

import httpx

from . import _operations as op
from . import models

if TYPE_CHECKING:
    from ._client import AsyncClient, Client


class _Events:
    """Server-Sent Events cut from a body's chunks as they arrive: ``(event, data)`` with data the JSON line."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[tuple[str, Any]]:
        self._buffer += chunk.replace(b"\r\n", b"\n")
        found = []
        while (end := self._buffer.find(b"\n\n")) >= 0:
            block, self._buffer = self._buffer[:end], self._buffer[end + 2:]
            name, data = "message", []
            for line in block.decode("utf-8").split("\n"):
                if line.startswith("event:"):
                    name = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))
            if data:
                found.append((name, json.loads("\n".join(data))))
        return found


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return {"message": response.text[:500]}


def _route_missing(status: int, body: Any) -> bool:
    """An API without the stream route: API Gateway's own 404 (``{"message": "Not Found"}``, no code), the chat
    function's (``"code": "not_found", "message": "Not found"``), or a 405. A 404 that says more ("session not
    found") is the API's answer about the session: raised."""
    if status == 405:
        return True
    if status != 404:
        return False
    body = body if isinstance(body, dict) else {}
    message = str(body.get("message") or "")
    return not body.get("code") or message.lower() == "not found" or message.startswith("no route ")


class _Progress:
    """What a streamed turn has given its caller across its attempts, and its answer once it came."""

    def __init__(self) -> None:
        self.given = ""  # the reply's text given to the caller so far
        self.heard = ""  # this attempt's text
        self.result: models.TurnResult | None = None
        self.user_message_id: int | None = None

    def event(self, name: str, data: Any) -> str:
        """Take one event; the text the caller has not had yet ("" for none). An ``error`` event is raised."""
        from ._client import _api_error

        if name == "turn":
            self.user_message_id = data.get("user_message_id")
        elif name == "delta":
            self.heard += data["delta"]
            if len(self.heard) > len(self.given):
                piece, self.given = self.heard[len(self.given):], self.heard
                return piece
        elif name == "done":
            self.result = models.TurnResult.model_validate(data)
        elif name == "error":
            retry_after = data.get("retry_after")
            raise _api_error(int(data.get("statusCode") or 500), data,
                             float(retry_after) if isinstance(retry_after, int | float) else None)
        return ""

    def rest_of(self, result: models.TurnResult) -> str:
        """The reply of an answer from the JSON route, less what was given already."""
        self.result = result
        return result.reply[len(self.given):] if result.reply.startswith(self.given) else ""


class TurnStream:
    """A turn whose reply arrives in pieces: iterate it for them (``str``), then read ``result`` (the
    ``TurnResult`` take_turn would have answered; reading it first waits for the whole reply). Made by
    ``Client.stream_turn``, which has already raised any error answered before the stream began."""

    def __init__(self, client: Client, call: op.Call[models.TurnResult], url: str, first: httpx.Response | None):
        self._client, self._call, self._url = client, call, url
        self.client_turn_id: str = call.body["client_turn_id"]
        self._progress = _Progress()
        self._pieces = self._run(first)

    @property
    def user_message_id(self) -> int | None:
        """The user's message's id, once the server said it is stored (the ``turn`` event)."""
        return self._progress.user_message_id

    def __iter__(self) -> Iterator[str]:
        return self._pieces

    def __enter__(self) -> TurnStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop reading (the server still finishes the turn and stores its reply)."""
        self._pieces.close()

    @property
    def result(self) -> models.TurnResult:
        for _ in self._pieces:
            pass
        if self._progress.result is None:
            raise RuntimeError("the stream was closed before its answer")
        return self._progress.result

    def _read(self, response: httpx.Response) -> Iterator[str]:
        """One attempt's pieces; it ends at ``done`` (the result is there) or where the stream broke off."""
        self._progress.heard, events = "", _Events()
        try:
            for chunk in response.iter_bytes():
                for name, data in events.feed(chunk):
                    if piece := self._progress.event(name, data):
                        yield piece
                    if self._progress.result is not None:
                        return
        except httpx.TransportError:
            return
        finally:
            response.close()

    def _run(self, response: httpx.Response | None) -> Generator[str, None, None]:
        from ._client import ApiError

        progress, policy = self._progress, self._client._policy
        errors = breaks = 0
        while True:
            if response is None:  # no stream route: the JSON route, with the same client_turn_id
                if piece := progress.rest_of(self._client._send(self._call)):
                    yield piece
                return
            try:
                yield from self._read(response)
            except ApiError as error:  # an error event: retried only while nothing was given
                wait = None if progress.given else policy.after_error(error, errors)
                if wait is None:
                    raise
                errors += 1
            else:
                if progress.result is not None:
                    return
                wait = policy.after_broken_connection(self._call, breaks)
                if wait is None:
                    raise httpx.RemoteProtocolError("the turn's stream broke off before its end")
                breaks += 1
            time.sleep(wait)
            response = self._client._open_stream(self._url, self._call)


class AsyncTurnStream:
    """``TurnStream`` for ``AsyncClient``: ``async for piece in stream``, then ``await stream.answer()``."""

    def __init__(self, client: AsyncClient, call: op.Call[models.TurnResult], url: str,
                 first: httpx.Response | None):
        self._client, self._call, self._url = client, call, url
        self.client_turn_id: str = call.body["client_turn_id"]
        self._progress = _Progress()
        self._pieces = self._run(first)

    @property
    def user_message_id(self) -> int | None:
        return self._progress.user_message_id

    def __aiter__(self) -> AsyncIterator[str]:
        return self._pieces

    async def __aenter__(self) -> AsyncTurnStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._pieces.aclose()

    async def answer(self) -> models.TurnResult:
        """The turn's ``TurnResult``, once the whole reply has come."""
        async for _ in self._pieces:
            pass
        if self._progress.result is None:
            raise RuntimeError("the stream was closed before its answer")
        return self._progress.result

    async def _read(self, response: httpx.Response) -> AsyncIterator[str]:
        self._progress.heard, events = "", _Events()
        try:
            async for chunk in response.aiter_bytes():
                for name, data in events.feed(chunk):
                    if piece := self._progress.event(name, data):
                        yield piece
                    if self._progress.result is not None:
                        return
        except httpx.TransportError:
            return
        finally:
            await response.aclose()

    async def _run(self, response: httpx.Response | None) -> AsyncGenerator[str, None]:
        from ._client import ApiError

        progress, policy = self._progress, self._client._policy
        errors = breaks = 0
        while True:
            if response is None:
                if piece := progress.rest_of(await self._client._send(self._call)):
                    yield piece
                return
            try:
                async for piece in self._read(response):
                    yield piece
            except ApiError as error:
                wait = None if progress.given else policy.after_error(error, errors)
                if wait is None:
                    raise
                errors += 1
            else:
                if progress.result is not None:
                    return
                wait = policy.after_broken_connection(self._call, breaks)
                if wait is None:
                    raise httpx.RemoteProtocolError("the turn's stream broke off before its end")
                breaks += 1
            await asyncio.sleep(wait)
            response = await self._client._open_stream(self._url, self._call)
