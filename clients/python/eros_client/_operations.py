"""Each API operation as a request to make: its method, path, query, body, the model of its answer, and whether
sending it again after a lost connection is safe. ``Client`` and ``AsyncClient`` send the same requests; ids that
make a retry safe (``client_turn_id``, ``client_message_id``) are made here, once, before the first attempt."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any, Generic, TypeVar
from uuid import UUID

from pydantic import BaseModel

from . import models

T = TypeVar("T")


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()  # a field left out of an edit (None is a value there: it clears an event time)


@dataclass(frozen=True)
class Call(Generic[T]):
    method: str
    path: str
    answer: type[T] | None  # None: no body (204)
    params: dict[str, Any] = field(default_factory=dict)
    body: Any = None
    # Safe to send again when the connection broke before an answer: reads, deletes, and writes whose ids make
    # the server store them once. A POST that adds a memory is not: it could be stored twice.
    resend: bool = True
    also_ok: tuple[int, ...] = ()  # statuses besides 2xx whose body is the answer (a degraded health report)


def _id() -> str:
    return str(uuid.uuid4())


def _query(**values: Any) -> dict[str, Any]:
    return {k: (v.isoformat() if isinstance(v, date | datetime) else v) for k, v in values.items() if v is not None}


def _message(message: models.NewMessage | Mapping[str, Any]) -> dict[str, Any]:
    data = (message.model_dump(mode="json", exclude_none=True) if isinstance(message, BaseModel)
            else {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in message.items() if v is not None})
    data.setdefault("client_message_id", _id())
    return data


def get_health() -> Call[models.HealthReport]:
    return Call("GET", "/v1/health", models.HealthReport, also_ok=(503,))


def get_deep_health() -> Call[models.DeepHealth]:
    return Call("GET", "/v1/health/deep", models.DeepHealth, also_ok=(503,))


def get_open_api_document() -> Call[dict]:
    return Call("GET", "/v1/openapi.json", dict)


def list_personas() -> Call[models.PersonaList]:
    return Call("GET", "/v1/personas", models.PersonaList)


def create_persona(name: str, system_prompt: str, description: str | None) -> Call[models.PersonaView]:
    body = {"name": name, "system_prompt": system_prompt, **_query(description=description)}
    return Call("POST", "/v1/personas", models.PersonaView, body=body, resend=False)


def edit_persona(persona_id: str, name: str | None, description: str | None,
                 system_prompt: str | None) -> Call[models.PersonaView]:
    body = _query(name=name, description=description, system_prompt=system_prompt)
    return Call("PATCH", f"/v1/personas/{persona_id}", models.PersonaView, body=body, resend=False)


def retire_persona(persona_id: str) -> Call[None]:
    return Call("DELETE", f"/v1/personas/{persona_id}", None)


def list_app_personas() -> Call[models.AppPersonaList]:
    return Call("GET", "/v1/operator/personas", models.AppPersonaList)


def set_app_persona(persona_id: str, name: str, system_prompt: str,
                    description: str | None) -> Call[models.AppPersona]:
    body = {"name": name, "system_prompt": system_prompt, **_query(description=description)}
    return Call("PUT", f"/v1/operator/personas/{persona_id}", models.AppPersona, body=body)


def retire_app_persona(persona_id: str) -> Call[None]:
    return Call("DELETE", f"/v1/operator/personas/{persona_id}", None)


def create_session(persona_id: str) -> Call[models.CreatedSession]:
    return Call("POST", "/v1/sessions", models.CreatedSession, body={"persona_id": persona_id}, resend=False)


def list_sessions() -> Call[models.SessionList]:
    return Call("GET", "/v1/sessions", models.SessionList)


def list_messages(session_id: UUID | str, limit: int | None, before: int | None) -> Call[models.MessagePage]:
    return Call("GET", f"/v1/sessions/{session_id}/messages", models.MessagePage,
                params=_query(limit=limit, before=before))


def take_turn(session_id: UUID | str, content: str, client_turn_id: str | None) -> Call[models.TurnResult]:
    return Call("POST", f"/v1/sessions/{session_id}/turns", models.TurnResult,
                body={"content": content, "client_turn_id": client_turn_id or _id()})


def append_messages(session_id: UUID | str,
                    messages: Sequence[models.NewMessage | Mapping[str, Any]]) -> Call[models.Appended]:
    return Call("POST", f"/v1/sessions/{session_id}/messages", models.Appended,
                body={"messages": [_message(m) for m in messages]})


def get_context(session_id: UUID | str, content: str, store: bool,
                client_message_id: str | None) -> Call[models.ContextResult]:
    body: dict[str, Any] = {"content": content, "store": store}
    if store:
        body["client_message_id"] = client_message_id or _id()
    elif client_message_id is not None:
        body["client_message_id"] = client_message_id  # the API says why that is refused
    return Call("POST", f"/v1/sessions/{session_id}/context", models.ContextResult, body=body)


def import_conversations(conversations: Sequence[Mapping[str, Any]]) -> Call[models.ImportResult]:
    body = {"conversations": [{k: v for k, v in c.items() if k != "user_id"} for c in conversations]}
    return Call("POST", "/v1/imports", models.ImportResult, body=_dated(body))


def get_import_progress() -> Call[models.ImportProgress]:
    return Call("GET", "/v1/imports", models.ImportProgress)


def _dated(value: Any) -> Any:
    """Times as ISO 8601 text, anywhere in a body."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {k: _dated(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_dated(v) for v in value]
    return value


def list_memories(layer: str | None, category: str | None, source: str | None, limit: int | None,
                  before: str | None, include: str | None) -> Call[models.MemoryPage]:
    return Call("GET", "/v1/memories", models.MemoryPage,
                params=_query(layer=layer, category=category, source=source, limit=limit, before=before,
                              include=include))


def get_memory(memory_id: UUID | str) -> Call[models.MemoryWithHistory]:
    return Call("GET", f"/v1/memories/{memory_id}", models.MemoryWithHistory)


def restore_memory(memory_id: UUID | str) -> Call[models.MemoryWithHistory]:
    return Call("POST", f"/v1/memories/{memory_id}/restore", models.MemoryWithHistory)


def search_memories(query: str, layer: str | None, category: str | None, persona_id: str | None,
                    k: int | None) -> Call[models.SearchResults]:
    body = {"query": query, **_query(layer=layer, category=category, persona_id=persona_id, k=k)}
    return Call("POST", "/v1/memories/search", models.SearchResults, body=body)


def add_memory(content: str, category: str, importance: float | None,
               occurred_at: str | None) -> Call[models.MemoryWithHistory]:
    body = {"content": content, "category": category, **_query(importance=importance, occurred_at=occurred_at)}
    return Call("POST", "/v1/memories", models.MemoryWithHistory, body=body, resend=False)


def edit_memory(memory_id: UUID | str, content: Any, category: Any, importance: Any,
                occurred_at: Any) -> Call[models.MemoryWithHistory]:
    changes = {"content": content, "category": category, "importance": importance, "occurred_at": occurred_at}
    return Call("PATCH", f"/v1/memories/{memory_id}", models.MemoryWithHistory,
                body={k: v for k, v in changes.items() if v is not UNSET}, resend=False)


def delete_memories(layer: str | None, category: str | None) -> Call[models.Deleted]:
    return Call("DELETE", "/v1/memories", models.Deleted, params=_query(layer=layer, category=category))


def delete_memory(memory_id: UUID | str) -> Call[None]:
    return Call("DELETE", f"/v1/memories/{memory_id}", None)


def export_account() -> Call[models.ExportLink]:
    return Call("GET", "/v1/export", models.ExportLink)


def erase_account() -> Call[models.Erasure]:
    return Call("DELETE", "/v1/me", models.Erasure)


def get_usage(first: date | None, last: date | None) -> Call[models.UsageReport]:
    return Call("GET", "/v1/usage", models.UsageReport, params=_query(**{"from": first, "to": last}))


def get_app() -> Call[models.AppView]:
    return Call("GET", "/v1/operator/app", models.AppView)


def create_key(name: str) -> Call[models.IssuedKey]:
    return Call("POST", "/v1/operator/keys", models.IssuedKey, body={"name": name}, resend=False)


def list_keys() -> Call[models.ApiKeyList]:
    return Call("GET", "/v1/operator/keys", models.ApiKeyList)


def rotate_key(key_id: UUID | str) -> Call[models.IssuedKey]:
    return Call("POST", f"/v1/operator/keys/{key_id}/rotate", models.IssuedKey, resend=False)


def revoke_key(key_id: UUID | str) -> Call[None]:
    return Call("DELETE", f"/v1/operator/keys/{key_id}", None)


def get_app_usage(first: date | None, last: date | None) -> Call[models.AppUsageReport]:
    return Call("GET", "/v1/operator/usage", models.AppUsageReport, params=_query(**{"from": first, "to": last}))


def set_webhook(url: str, rotate_secret: bool) -> Call[models.WebhookSet]:
    # Sent again, a rotation would rotate twice (the first answer's secret lost): only a plain set is resent.
    return Call("PUT", "/v1/operator/webhook", models.WebhookSet, body={"url": url, "rotate_secret": rotate_secret},
                resend=not rotate_secret)


def get_webhook() -> Call[models.Webhook]:
    return Call("GET", "/v1/operator/webhook", models.Webhook)


def delete_webhook() -> Call[None]:
    return Call("DELETE", "/v1/operator/webhook", None)


def redrive_webhook() -> Call[models.Redriven]:
    return Call("POST", "/v1/operator/webhook/redrive", models.Redriven)
