"""The context for one message, without the model call: what the persona is reminded of (the memories recalled,
each with the score that put it there) and the prompt section that carries them.

A chat turn builds its prompt from ``remember`` (eros.chat), and ``POST /v1/sessions/{id}/context`` answers with it
(``context_for``), so an app that runs its own model call gets exactly what a turn would have put in front of the
model: the same recall, the same hygiene, the same rendering (eros.prompt.memory_section). With ``store`` the user's
message is recorded in the same request (eros.ingest, as ``POST /v1/sessions/{id}/messages`` records it), so an app
needs two round trips a turn: this, then its reply appended after its own model call.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from pydantic import BaseModel, Field

from . import apps, ingest, prompt, recall
from .errors import NotFound
from .memory import EVENT_TIME_FORMS, MemoryLayer, Precision, event_time_text
from .observability import metrics, tracer
from .recall import ScoreParts
from .store import chat as chat_store
from .store.rows import Message


class RecalledMemory(BaseModel):
    """A memory the prompt carried, with the score that put it there. Its text is in the answer only: a stored
    turn keeps ids and numbers, so a memory the user deletes leaves no copy."""
    id: UUID
    layer: MemoryLayer
    category: str | None = Field(description="the profile category; null for a relationship utterance")
    content: str | None = Field(None, description="the memory's text (null when the turn is replayed)")
    occurred_at: str | None = Field(None, description=f"its event time, as the prompt showed it: {EVENT_TIME_FORMS} "
                                                      "(null when it has none, and when the turn is replayed)")
    occurred_precision: Precision | None = None
    score: float | None = Field(None,
                                description="what ranked it: similarity + recency + importance + lexical - demotion")
    parts: ScoreParts | None = None


# What a stored turn leaves out of what it recalled: the memory's own data (ids and numbers are kept).
MEMORY_DATA = {"content", "occurred_at", "occurred_precision"}


@dataclass
class Remembered:
    """What one message recalls: the memories, profile first, best first, and the prompt section carrying them."""
    memories: list[RecalledMemory]
    section: str  # eros.prompt.memory_section: "" when nothing was recalled


def remember(user_id: str, instance_id: UUID, query: list[float], *, history: list[Message],
             message: str, model: str | None = None) -> Remembered:
    """Recall for ``message`` (embedded as ``query``, by ``model``) in the persona instance's context, ``history``
    being the prompt's last messages (recalled text that repeats them is left out), and render the prompt's
    section."""
    memories = recall.recall(user_id, instance_id, query, history=history, message=message, model=model)
    recalled = [RecalledMemory(id=m["id"], layer=layer, category=m["category"], content=m["content"],
                               occurred_at=event_time_text(m["occurred_at"], m["occurred_precision"]),
                               occurred_precision=m["occurred_precision"], score=m["score"], parts=ScoreParts.of(m))
                for layer, rows in ((MemoryLayer.PROFILE, memories.profile),
                                    (MemoryLayer.RELATIONSHIP, memories.relationship)) for m in rows]
    return Remembered(recalled, prompt.memory_section(memories.profile, memories.relationship))


class ContextResult(BaseModel):
    """What ``POST /v1/sessions/{id}/context`` answers."""
    memories: list[RecalledMemory] = Field(description="what a chat turn's prompt would carry for this message, "
                                                       "profile first, best first, each with its score and parts")
    prompt: str = Field(description="the same memories as the chat turn renders them for its model: the system "
                                    "prompt's memory section, ready to follow your persona's own system prompt "
                                    "(tagged blocks, each memory on one line, with the rule that they are data); "
                                    "empty when nothing was recalled")
    message: ingest.AppendedMessage | None = Field(
        description="with `store: true`, the user's message as stored (`stored: false` when an earlier request "
                    "with its client_message_id stored it); null otherwise")


@tracer.capture_method(capture_response=False, capture_error=False)  # memories are content
def context_for(user_id: str, session_id: UUID, content: str, *, store: bool = False,
                client_message_id: str | None = None) -> ContextResult:
    """The context a chat turn would give its model for ``content`` in this session, paying one query embedding
    (admitted by the spend limits as a turn is); with ``store``, the message is recorded too, as an appended user
    message (idempotent on ``client_message_id``: a retry recalls again and stores nothing twice)."""
    cfg = apps.settings_for(user_id)  # the history length of the user's app
    if store:  # the session, its history and the message's id checked in one statement
        plan = ingest.plan(user_id, session_id, [ingest.Incoming("user", content, client_message_id)],
                           history=cfg.history_messages)
        instance_id, history = plan.instance_id, plan.history
    else:
        plan, session = None, chat_store.get_session(user_id, session_id, history=cfg.history_messages)
        if session is None:
            raise NotFound("session not found")
        instance_id, history = session["instance_id"], session.get("history", [])
    query = ingest.embed(user_id, [content])
    remembered = remember(user_id, instance_id, query.vectors[0], history=history, message=content,
                          model=query.model)
    stored = None
    if plan:  # the message as an appended one, its utterance with the embedding paid for above (unless a retry)
        stored = ingest.record(user_id, session_id, plan, query.vectors if plan.to_embed() else [], query.model)[0]
    metrics.add_metric(name="ContextRecalls", unit="Count", value=1)
    return ContextResult(memories=remembered.memories, prompt=remembered.section, message=stored)
