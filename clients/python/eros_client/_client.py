"""``Client`` and ``AsyncClient``: one method per API operation (named after its operationId), answers parsed into
the generated models, errors raised as ``ApiError`` with the API's stable ``code``.

Retries: a request the API says may be retried (``retryable: true``: a model timeout or outage, a busy or
unreachable database, a spend limit) is sent again after the ``Retry-After`` the API gave, or after a short
backoff, at most ``max_retries`` times, and never when the wait would exceed ``max_wait`` (a daily budget resets at
midnight: that error is raised at once, with its ``retry_after``). A request whose connection broke is sent again
only when that is safe: reads, deletes, and the writes whose ids make the server store them once (a turn's
``client_turn_id`` and a message's ``client_message_id`` are made once, before the first attempt, when the caller
gives none).

Who calls: an end user, by their bearer token (``token``), or an app's server, by one of the app's API keys
(``api_key``): its requests then go to the ``/server`` routes with the key in ``X-Api-Key``, acting for ``user``
(``X-Eros-User``), or, without one, as the app's operator.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar
from uuid import UUID

import httpx

from . import _operations as op
from . import models
from ._operations import UNSET, Call
from ._stream import AsyncTurnStream, TurnStream, _body, _route_missing

T = TypeVar("T")
Token = str | Callable[[], str]


class ApiError(Exception):
    """An error answer of the API: ``status``, its stable ``code`` (branch on it), ``message`` for people,
    ``retryable`` and, for a limit, ``retry_after`` seconds; ``body`` is the whole answer."""

    def __init__(self, status: int, body: Any, retry_after: float | None):
        body = body if isinstance(body, dict) else {"message": str(body)}
        self.status, self.body, self.retry_after = status, body, retry_after
        self.code: str = str(body.get("code") or ("unauthorized" if status == 401 else "error"))
        self.message: str = str(body.get("message") or "")
        self.retryable: bool = body.get("retryable") is True
        super().__init__(f"{status} {self.code}: {self.message}")


class Unauthorized(ApiError):
    """A 401: no token, a token the API does not accept (expired, another issuer or audience), or one whose subject
    or app it cannot use; with an API key: a key that is not live (revoked, rotated away, of a deleted app) or a
    ``user`` the API cannot use. Two bodies reach a client: API Gateway's JWT authorizer (in AWS; the local stack
    answers the same) refuses the token itself with ``{"message": "Unauthorized"}``, before any function runs; the
    API refuses a verified token whose subject is unusable, and any request with a key it does not accept, with its
    own ``{"code": "unauthorized", "message": ...}``. Either way this is raised, with ``code`` "unauthorized": get a
    new token (or sign in, or use a live key) and try again."""

    def __init__(self, status: int, body: Any, retry_after: float | None):
        super().__init__(status, body, retry_after)
        self.code = "unauthorized"


def _api_error(status: int, body: Any, retry_after: float | None) -> ApiError:
    return (Unauthorized if status == 401 else ApiError)(status, body, retry_after)


class _Policy:
    """When and how long to wait before sending a request again."""

    def __init__(self, max_retries: int, max_wait: float, backoff: float):
        self.max_retries, self.max_wait, self.backoff = max_retries, max_wait, backoff

    def _backoff(self, attempt: int) -> float:
        return self.backoff * 2 ** attempt * random.uniform(0.5, 1.0)

    def after_error(self, error: ApiError, attempt: int) -> float | None:
        if not error.retryable or attempt >= self.max_retries:
            return None
        wait = error.retry_after if error.retry_after is not None else self._backoff(attempt)
        return wait if wait <= self.max_wait else None

    def after_broken_connection(self, call: Call[Any], attempt: int) -> float | None:
        return self._backoff(attempt) if call.resend and attempt < self.max_retries else None


def _retry_after(response: httpx.Response) -> float | None:
    """The Retry-After header in seconds (a number or an HTTP date), or the body's ``retry_after``."""
    value = response.headers.get("retry-after")
    if value:
        try:
            return max(0.0, float(value))
        except ValueError:
            try:
                return max(0.0, (parsedate_to_datetime(value) - datetime.now(parsedate_to_datetime(value).tzinfo))
                           .total_seconds())
            except (TypeError, ValueError):
                return None
    return None


def _answer(call: Call[T], response: httpx.Response) -> T:
    if response.is_success or response.status_code in call.also_ok:
        if call.answer is None or response.status_code == 204:
            return None  # type: ignore[return-value]
        if call.answer is dict:
            return response.json()
        return call.answer.model_validate(response.json())  # type: ignore[attr-defined]
    try:
        body = response.json()
    except ValueError:
        body = {"message": response.text[:500]}
    raise _api_error(response.status_code, body, _retry_after(response))


SERVER = "/server"  # an app's servers' routes: the same routes, with the app's API key


class _Base:
    def __init__(self, base_url: str, token: Token | None, max_retries: int, max_wait: float, backoff: float,
                 stream_url: str | None = None, api_key: str | None = None, user: str | None = None):
        for name, url in (("base_url", base_url), ("stream_url", stream_url or base_url)):
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{name} must start with http:// or https:// (got {url!r})")
        if token is not None and api_key is not None:
            raise ValueError("give a token (an end user's) or an api_key (an app's server), not both")
        if user is not None and api_key is None:
            raise ValueError("user names whom an app's server acts for: it goes with an api_key (a token names its"
                             " own user)")
        self._token, self._api_key, self._user = token, api_key, user
        self._prefix = SERVER if api_key is not None else ""
        self._policy = _Policy(max_retries, max_wait, backoff)
        self._stream_root = (stream_url or "").rstrip("/")  # "": the base_url's
        self._streams = True  # False once the API answered that it has no stream route

    def _headers(self) -> dict[str, str]:
        if self._api_key is not None:
            return {"X-Api-Key": self._api_key, **({"X-Eros-User": self._user} if self._user is not None else {})}
        if self._token is None:
            return {}
        return {"Authorization": f"Bearer {self._token() if callable(self._token) else self._token}"}

    def _request(self, call: Call[Any]) -> dict[str, Any]:
        return {"method": call.method, "url": self._prefix + call.path, "params": call.params or None,
                "json": call.body, "headers": self._headers()}

    def _stream_request(self, url: str, call: Call[Any]) -> dict[str, Any]:
        return {"method": "POST", "url": url, "json": call.body,
                "headers": {**self._headers(), "Accept": "text/event-stream"}}

    def _streamed(self, session_id: UUID | str, content: str,
                  client_turn_id: str | None) -> tuple[Call[models.TurnResult], str]:
        call = op.take_turn(session_id, content, client_turn_id)
        return call, f"{self._stream_root}{self._prefix}{call.path}/stream"

    def _stream_refusal(self, response: httpx.Response, body: Any) -> ApiError | None:
        """The error a stream request was answered with; None when the API has no stream route (remembered)."""
        if _route_missing(response.status_code, body):
            self._streams = False
            return None
        return _api_error(response.status_code, body, _retry_after(response))


class Client(_Base):
    """The API, synchronously. ``token``: the user's bearer token (a JWT of your issuer), or a function that
    returns a fresh one; or, for an app's server, ``api_key``: one of the app's API keys, and ``user``: the user
    it acts for (none: it acts as the app's operator); ``base_url``: the API's root (the stack's ApiUrl output, or
    http://127.0.0.1:3000); ``stream_url``: where ``stream_turn`` is sent when that is elsewhere (a deployed
    stack's stream URL), by default ``base_url``."""

    def __init__(self, base_url: str, token: Token | None = None, *, api_key: str | None = None,
                 user: str | None = None, timeout: float = 30.0, max_retries: int = 2, max_wait: float = 30.0,
                 backoff: float = 0.5, http: httpx.Client | None = None, stream_url: str | None = None):
        super().__init__(base_url, token, max_retries, max_wait, backoff, stream_url, api_key, user)
        self._http = http or httpx.Client(base_url=base_url, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, call: Call[T]) -> T:
        attempt = 0
        while True:
            try:
                response = self._http.request(**self._request(call))
            except httpx.TransportError:
                wait = self._policy.after_broken_connection(call, attempt)
                if wait is None:
                    raise
            else:
                try:
                    return _answer(call, response)
                except ApiError as error:
                    wait = self._policy.after_error(error, attempt)
                    if wait is None:
                        raise
            time.sleep(wait)
            attempt += 1

    def _open_stream(self, url: str, call: Call[Any]) -> httpx.Response | None:
        """The stream request sent until it is answered with a stream (an error retried as ``_send`` retries
        one), its body unread; None when the API has no stream route."""
        attempt = 0
        while True:
            try:
                response = self._http.send(self._http.build_request(**self._stream_request(url, call)), stream=True)
            except httpx.TransportError:
                wait = self._policy.after_broken_connection(call, attempt)
                if wait is None:
                    raise
            else:
                if response.is_success:
                    return response
                response.read()
                response.close()
                error = self._stream_refusal(response, _body(response))
                if error is None:
                    return None
                wait = self._policy.after_error(error, attempt)
                if wait is None:
                    raise error
            time.sleep(wait)
            attempt += 1

    # --- health
    def get_health(self) -> models.HealthReport:
        return self._send(op.get_health())

    def get_deep_health(self) -> models.DeepHealth:
        return self._send(op.get_deep_health())

    def get_open_api_document(self) -> dict:
        return self._send(op.get_open_api_document())

    # --- sessions
    def list_personas(self) -> models.PersonaList:
        return self._send(op.list_personas())

    def create_persona(self, name: str, system_prompt: str, *,
                       description: str | None = None) -> models.PersonaView:
        """A character of your own (visible to you alone); start sessions with it by its id."""
        return self._send(op.create_persona(name, system_prompt, description))

    def edit_persona(self, persona_id: str, *, name: str | None = None, description: str | None = None,
                     system_prompt: str | None = None) -> models.PersonaView:
        return self._send(op.edit_persona(persona_id, name, description, system_prompt))

    def retire_persona(self, persona_id: str) -> None:
        self._send(op.retire_persona(persona_id))

    # --- operator (a token with the operator scope, or the app's API key)
    def list_app_personas(self) -> models.AppPersonaList:
        return self._send(op.list_app_personas())

    def set_app_persona(self, persona_id: str, name: str, system_prompt: str, *,
                        description: str | None = None) -> models.AppPersona:
        return self._send(op.set_app_persona(persona_id, name, system_prompt, description))

    def retire_app_persona(self, persona_id: str) -> None:
        self._send(op.retire_app_persona(persona_id))

    def create_session(self, persona_id: str) -> models.CreatedSession:
        return self._send(op.create_session(persona_id))

    def list_sessions(self) -> models.SessionList:
        return self._send(op.list_sessions())

    def list_messages(self, session_id: UUID | str, *, limit: int | None = None,
                      before: int | None = None) -> models.MessagePage:
        return self._send(op.list_messages(session_id, limit, before))

    # --- chat
    def take_turn(self, session_id: UUID | str, content: str, *,
                  client_turn_id: str | None = None) -> models.TurnResult:
        return self._send(op.take_turn(session_id, content, client_turn_id))

    def stream_turn(self, session_id: UUID | str, content: str, *, client_turn_id: str | None = None) -> TurnStream:
        """A turn whose reply comes as the model writes it: iterate the answer for the pieces, then read its
        ``result`` (what ``take_turn`` answers). An error before the stream begins is raised here; one after it,
        while iterating. Sent to ``stream_url`` when the client was given one (a deployed API's function URL)."""
        call, url = self._streamed(session_id, content, client_turn_id)
        return TurnStream(self, call, url, self._open_stream(url, call) if self._streams else None)

    def append_messages(self, session_id: UUID | str,
                        messages: Sequence[models.NewMessage | Mapping[str, Any]]) -> models.Appended:
        return self._send(op.append_messages(session_id, messages))

    def get_context(self, session_id: UUID | str, content: str, *, store: bool = False,
                    client_message_id: str | None = None) -> models.ContextResult:
        return self._send(op.get_context(session_id, content, store, client_message_id))

    def import_conversations(self, conversations: Sequence[Mapping[str, Any]]) -> models.ImportResult:
        """Conversations your app already had (each: conversation_id, persona_id, messages with role, content and
        created_at); send a long history in several calls of up to 50: each conversation is stored once."""
        return self._send(op.import_conversations(conversations))

    def get_import_progress(self) -> models.ImportProgress:
        return self._send(op.get_import_progress())

    # --- memories
    def list_memories(self, *, layer: str | None = None, category: str | None = None, source: str | None = None,
                      limit: int | None = None, before: str | None = None,
                      include: str | None = None) -> models.MemoryPage:
        return self._send(op.list_memories(layer, category, source, limit, before, include))

    def get_memory(self, memory_id: UUID | str) -> models.MemoryWithHistory:
        return self._send(op.get_memory(memory_id))

    def restore_memory(self, memory_id: UUID | str) -> models.MemoryWithHistory:
        return self._send(op.restore_memory(memory_id))

    def search_memories(self, query: str, *, layer: str | None = None, category: str | None = None,
                        persona_id: str | None = None, k: int | None = None) -> models.SearchResults:
        return self._send(op.search_memories(query, layer, category, persona_id, k))

    def add_memory(self, content: str, category: str, *, importance: float | None = None,
                   occurred_at: str | None = None) -> models.MemoryWithHistory:
        return self._send(op.add_memory(content, category, importance, occurred_at))

    def edit_memory(self, memory_id: UUID | str, *, content: Any = UNSET, category: Any = UNSET,
                    importance: Any = UNSET, occurred_at: Any = UNSET) -> models.MemoryWithHistory:
        return self._send(op.edit_memory(memory_id, content, category, importance, occurred_at))

    def delete_memories(self, *, layer: str | None = None, category: str | None = None) -> models.Deleted:
        return self._send(op.delete_memories(layer, category))

    def delete_memory(self, memory_id: UUID | str) -> None:
        self._send(op.delete_memory(memory_id))

    # --- account
    def export_account(self) -> models.ExportLink:
        return self._send(op.export_account())

    def erase_account(self) -> models.Erasure:
        return self._send(op.erase_account())

    def get_usage(self, *, first: date | None = None, last: date | None = None) -> models.UsageReport:
        return self._send(op.get_usage(first, last))

    # --- the app's operator: the app, its API keys, its users' usage
    def get_app(self) -> models.AppView:
        return self._send(op.get_app())

    def create_key(self, name: str) -> models.IssuedKey:
        """A new API key of the app; its ``secret`` is in this answer only (keep it: it is never shown again)."""
        return self._send(op.create_key(name))

    def list_keys(self) -> models.ApiKeyList:
        return self._send(op.list_keys())

    def rotate_key(self, key_id: UUID | str) -> models.IssuedKey:
        """A new key (with its ``secret``) in place of a live one, which is refused from this answer on."""
        return self._send(op.rotate_key(key_id))

    def revoke_key(self, key_id: UUID | str) -> None:
        self._send(op.revoke_key(key_id))

    def get_app_usage(self, *, first: date | None = None, last: date | None = None) -> models.AppUsageReport:
        return self._send(op.get_app_usage(first, last))

    # --- the app's webhook (docs/EVENTS.md "Webhooks")
    def set_webhook(self, url: str, *, rotate_secret: bool = False) -> models.WebhookSet:
        """Where the app's memory events are posted, signed; ``secret`` is in the answer only when the webhook is
        made or its secret rotated (keep it: it is never shown again)."""
        return self._send(op.set_webhook(url, rotate_secret))

    def get_webhook(self) -> models.Webhook:
        return self._send(op.get_webhook())

    def delete_webhook(self) -> None:
        self._send(op.delete_webhook())

    def redrive_webhook(self) -> models.Redriven:
        """The dead deliveries due again (the next sweep posts them)."""
        return self._send(op.redrive_webhook())


class AsyncClient(_Base):
    """The API, with asyncio: the same methods as ``Client``, awaited."""

    def __init__(self, base_url: str, token: Token | None = None, *, api_key: str | None = None,
                 user: str | None = None, timeout: float = 30.0, max_retries: int = 2, max_wait: float = 30.0,
                 backoff: float = 0.5, http: httpx.AsyncClient | None = None, stream_url: str | None = None):
        super().__init__(base_url, token, max_retries, max_wait, backoff, stream_url, api_key, user)
        self._http = http or httpx.AsyncClient(base_url=base_url, timeout=timeout)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _send(self, call: Call[T]) -> T:
        attempt = 0
        while True:
            try:
                response = await self._http.request(**self._request(call))
            except httpx.TransportError:
                wait = self._policy.after_broken_connection(call, attempt)
                if wait is None:
                    raise
            else:
                try:
                    return _answer(call, response)
                except ApiError as error:
                    wait = self._policy.after_error(error, attempt)
                    if wait is None:
                        raise
            await asyncio.sleep(wait)
            attempt += 1

    async def _open_stream(self, url: str, call: Call[Any]) -> httpx.Response | None:
        attempt = 0
        while True:
            try:
                response = await self._http.send(self._http.build_request(**self._stream_request(url, call)),
                                                 stream=True)
            except httpx.TransportError:
                wait = self._policy.after_broken_connection(call, attempt)
                if wait is None:
                    raise
            else:
                if response.is_success:
                    return response
                await response.aread()
                await response.aclose()
                error = self._stream_refusal(response, _body(response))
                if error is None:
                    return None
                wait = self._policy.after_error(error, attempt)
                if wait is None:
                    raise error
            await asyncio.sleep(wait)
            attempt += 1

    # --- health
    async def get_health(self) -> models.HealthReport:
        return await self._send(op.get_health())

    async def get_deep_health(self) -> models.DeepHealth:
        return await self._send(op.get_deep_health())

    async def get_open_api_document(self) -> dict:
        return await self._send(op.get_open_api_document())

    # --- sessions
    async def list_personas(self) -> models.PersonaList:
        return await self._send(op.list_personas())

    async def create_persona(self, name: str, system_prompt: str, *,
                             description: str | None = None) -> models.PersonaView:
        return await self._send(op.create_persona(name, system_prompt, description))

    async def edit_persona(self, persona_id: str, *, name: str | None = None, description: str | None = None,
                           system_prompt: str | None = None) -> models.PersonaView:
        return await self._send(op.edit_persona(persona_id, name, description, system_prompt))

    async def retire_persona(self, persona_id: str) -> None:
        await self._send(op.retire_persona(persona_id))

    # --- operator (a token with the operator scope, or the app's API key)
    async def list_app_personas(self) -> models.AppPersonaList:
        return await self._send(op.list_app_personas())

    async def set_app_persona(self, persona_id: str, name: str, system_prompt: str, *,
                              description: str | None = None) -> models.AppPersona:
        return await self._send(op.set_app_persona(persona_id, name, system_prompt, description))

    async def retire_app_persona(self, persona_id: str) -> None:
        await self._send(op.retire_app_persona(persona_id))

    async def create_session(self, persona_id: str) -> models.CreatedSession:
        return await self._send(op.create_session(persona_id))

    async def list_sessions(self) -> models.SessionList:
        return await self._send(op.list_sessions())

    async def list_messages(self, session_id: UUID | str, *, limit: int | None = None,
                            before: int | None = None) -> models.MessagePage:
        return await self._send(op.list_messages(session_id, limit, before))

    # --- chat
    async def take_turn(self, session_id: UUID | str, content: str, *,
                        client_turn_id: str | None = None) -> models.TurnResult:
        return await self._send(op.take_turn(session_id, content, client_turn_id))

    async def stream_turn(self, session_id: UUID | str, content: str, *,
                          client_turn_id: str | None = None) -> AsyncTurnStream:
        """``Client.stream_turn``: ``async for piece in await eros.stream_turn(...)``, then ``await
        stream.answer()``."""
        call, url = self._streamed(session_id, content, client_turn_id)
        return AsyncTurnStream(self, call, url, await self._open_stream(url, call) if self._streams else None)

    async def append_messages(self, session_id: UUID | str,
                              messages: Sequence[models.NewMessage | Mapping[str, Any]]) -> models.Appended:
        return await self._send(op.append_messages(session_id, messages))

    async def get_context(self, session_id: UUID | str, content: str, *, store: bool = False,
                          client_message_id: str | None = None) -> models.ContextResult:
        return await self._send(op.get_context(session_id, content, store, client_message_id))

    async def import_conversations(self, conversations: Sequence[Mapping[str, Any]]) -> models.ImportResult:
        return await self._send(op.import_conversations(conversations))

    async def get_import_progress(self) -> models.ImportProgress:
        return await self._send(op.get_import_progress())

    # --- memories
    async def list_memories(self, *, layer: str | None = None, category: str | None = None,
                            source: str | None = None, limit: int | None = None, before: str | None = None,
                            include: str | None = None) -> models.MemoryPage:
        return await self._send(op.list_memories(layer, category, source, limit, before, include))

    async def get_memory(self, memory_id: UUID | str) -> models.MemoryWithHistory:
        return await self._send(op.get_memory(memory_id))

    async def restore_memory(self, memory_id: UUID | str) -> models.MemoryWithHistory:
        return await self._send(op.restore_memory(memory_id))

    async def search_memories(self, query: str, *, layer: str | None = None, category: str | None = None,
                              persona_id: str | None = None, k: int | None = None) -> models.SearchResults:
        return await self._send(op.search_memories(query, layer, category, persona_id, k))

    async def add_memory(self, content: str, category: str, *, importance: float | None = None,
                         occurred_at: str | None = None) -> models.MemoryWithHistory:
        return await self._send(op.add_memory(content, category, importance, occurred_at))

    async def edit_memory(self, memory_id: UUID | str, *, content: Any = UNSET, category: Any = UNSET,
                          importance: Any = UNSET, occurred_at: Any = UNSET) -> models.MemoryWithHistory:
        return await self._send(op.edit_memory(memory_id, content, category, importance, occurred_at))

    async def delete_memories(self, *, layer: str | None = None, category: str | None = None) -> models.Deleted:
        return await self._send(op.delete_memories(layer, category))

    async def delete_memory(self, memory_id: UUID | str) -> None:
        await self._send(op.delete_memory(memory_id))

    # --- account
    async def export_account(self) -> models.ExportLink:
        return await self._send(op.export_account())

    async def erase_account(self) -> models.Erasure:
        return await self._send(op.erase_account())

    async def get_usage(self, *, first: date | None = None, last: date | None = None) -> models.UsageReport:
        return await self._send(op.get_usage(first, last))

    # --- the app's operator: the app, its API keys, its users' usage
    async def get_app(self) -> models.AppView:
        return await self._send(op.get_app())

    async def create_key(self, name: str) -> models.IssuedKey:
        return await self._send(op.create_key(name))

    async def list_keys(self) -> models.ApiKeyList:
        return await self._send(op.list_keys())

    async def rotate_key(self, key_id: UUID | str) -> models.IssuedKey:
        return await self._send(op.rotate_key(key_id))

    async def revoke_key(self, key_id: UUID | str) -> None:
        await self._send(op.revoke_key(key_id))

    async def get_app_usage(self, *, first: date | None = None,
                            last: date | None = None) -> models.AppUsageReport:
        return await self._send(op.get_app_usage(first, last))

    # --- the app's webhook
    async def set_webhook(self, url: str, *, rotate_secret: bool = False) -> models.WebhookSet:
        return await self._send(op.set_webhook(url, rotate_secret))

    async def get_webhook(self) -> models.Webhook:
        return await self._send(op.get_webhook())

    async def delete_webhook(self) -> None:
        await self._send(op.delete_webhook())

    async def redrive_webhook(self) -> models.Redriven:
        return await self._send(op.redrive_webhook())
