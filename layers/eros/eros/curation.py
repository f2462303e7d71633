"""What a user does to their own memory through the API besides reading it: state a memory, or edit one.

The text is embedded once, as a document (what dreaming's memories are embedded as), with the same
embedder and within a turn-sized time budget; a provider failure is ``errors.ModelFailed`` and nothing is
stored. The SQL is ``eros.store.memories``'."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from .config import settings
from .errors import ModelFailed, NotFound
from .observability import logger
from .providers import Deadline, ProviderError, embedder
from .providers.embed import Embeddings
from .store import memories as memory_store
from .store import usage as usage_store
from .store.rows import MemoryWithHistory

USER_IMPORTANCE = 0.8  # a memory the user states is worth more than most a model infers


def remember(user_id: str, content: str, category: str, importance: float | None) -> MemoryWithHistory:
    """A profile memory the user states directly (source 'user')."""
    vectors = _embed(user_id, content)
    return memory_store.add_memory(user_id, content, category, USER_IMPORTANCE if importance is None else importance,
                                   vectors.vectors[0], vectors.model)


def edit(user_id: str, memory_id: UUID, changes: dict[str, Any]) -> MemoryWithHistory:
    """A new version of a current profile memory that supersedes it (reason 'edited', history kept); the
    text is embedded again only when it changed."""
    current = memory_store.get_memory(user_id, memory_id)
    if current is None:
        raise NotFound("memory not found")
    if current["layer"] != "profile" or current["superseded_at"] is not None:  # before paying for an embedding
        raise memory_store.NotCurrent(memory_id)
    vectors = None
    if "content" in changes and changes["content"] != current["content"]:
        vectors = _embed(user_id, changes["content"])
    edited = memory_store.edit_memory(user_id, memory_id, changes, vectors.vectors[0] if vectors else None,
                                      vectors.model if vectors else None)
    if edited is None:  # deleted meanwhile
        raise NotFound("memory not found")
    return edited


def _embed(user_id: str, content: str) -> Embeddings:
    try:
        vectors = embedder().embed([content], "document", deadline=Deadline.after(settings().turn_budget_secs))
    except ProviderError as exc:
        failed = ModelFailed(exc)
        logger.warning("a memory's embedding failed", extra={"error_type": type(exc).__name__, "code": failed.code})
        raise failed from None
    usage_store.record(user_id, usage_store.tokens_of(vectors.usage), "chat", usage_store.utcnow())
    return vectors
