"""What a user does with their own memory through the API besides listing it: search it (with the chat
turn's ranking, and why each result ranks where it does), state a memory, or edit one.

The text is embedded once, as a document (what dreaming's memories are embedded as), with the same
embedder and within a turn-sized time budget, admitted by the user's spend limits as a chat turn is (a refusal
is ``usage.OverLimit``, before the call); a provider failure is ``errors.ModelFailed`` and nothing is stored.
The SQL is ``eros.store.memories``'."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from . import calibrated, usage
from .config import settings
from .errors import ModelFailed, NotFound
from .memory import EventTime, MemoryLayer
from .observability import logger
from .providers import Deadline, ProviderError
from .providers.embed import Embeddings, InputType
from .recall import ScoreParts
from .store import memories as memory_store
from .store import recall as recall_store
from .store import usage as usage_store
from .store.rows import MemoryWithHistory

USER_IMPORTANCE = 0.8  # a memory the user states is worth more than most a model infers


def search(user_id: str, query: str, *, layer: MemoryLayer | None, category: str | None, persona_id: str | None,
           k: int) -> list[dict[str, Any]]:
    """The user's ``k`` best memories for ``query`` by the score a chat turn ranks with (its strategy,
    importance, recency, words in common and demotion; no per-category quota: that shapes a prompt, not an
    answer), best first, each a listed memory plus ``score`` and its parts. The relationship layer is a
    persona's: it is searched when ``persona_id`` names one of the user's; a category filter is the profile's."""
    instance = memory_store.instance_of(user_id, persona_id) if persona_id else None
    if persona_id and instance is None:
        raise NotFound(f"no conversation with persona {persona_id!r}")
    layers = [MemoryLayer.PROFILE] if layer is None or layer is MemoryLayer.PROFILE else []
    if instance is not None and layer in (None, MemoryLayer.RELATIONSHIP) and category is None:
        layers.append(MemoryLayer.RELATIONSHIP)
    embedded = _embed(user_id, query, "query")
    knobs = calibrated.effective(settings(), model=embedded.model).recall  # the thresholds of that model's scale
    ranked = sorted((row for each in layers for row in recall_store.ranked(
        each, knobs, user_id, embedded.vectors[0], k=k, cap=None, message=query, instance_id=instance,
        category=category, model=embedded.model)),
        key=lambda row: (-row["score"], str(row["id"])))[:k]
    memories = memory_store.by_ids(user_id, [row["id"] for row in ranked])
    return [memories[row["id"]] | {"score": row["score"], "parts": ScoreParts.of(row)}
            for row in ranked if row["id"] in memories]


def remember(user_id: str, content: str, category: str, importance: float | None,
             occurred: EventTime | None = None) -> MemoryWithHistory:
    """A profile memory the user states directly (source 'user'), with when it happened if they say."""
    vectors = _embed(user_id, content)
    return memory_store.add_memory(user_id, content, category, USER_IMPORTANCE if importance is None else importance,
                                   vectors.vectors[0], vectors.model, occurred)


def edit(user_id: str, memory_id: UUID, changes: dict[str, Any]) -> MemoryWithHistory:
    """A new version of a current profile memory that supersedes it (reason 'edited', history kept), or an
    episode corrected in place (it has no versions: ``store.memories.edit_episode``): ``changes`` as
    ``store.memories.edit_memory`` takes them; the text is embedded again only when it changed."""
    current = memory_store.by_ids(user_id, [memory_id]).get(memory_id)  # the row alone, not its history
    if current is None:
        raise NotFound("memory not found")
    episode = current["source"] == "episode"
    if episode and ("category" in changes or "importance" in changes):
        raise memory_store.NotAnEpisodeField(memory_id)
    if not episode and (current["layer"] != "profile" or current["superseded_at"] is not None):
        raise memory_store.NotCurrent(memory_id)  # before paying for an embedding
    vectors = None
    if "content" in changes and changes["content"] != current["content"]:
        vectors = _embed(user_id, changes["content"])
    write = memory_store.edit_episode if episode else memory_store.edit_memory
    edited = write(user_id, memory_id, changes, vectors.vectors[0] if vectors else None,
                   vectors.model if vectors else None)
    if edited is None:  # deleted meanwhile
        raise NotFound("memory not found")
    return edited


def _embed(user_id: str, content: str, input_type: InputType = "document") -> Embeddings:
    """The text's embedding, paid within the user's spend limits: admitted as a chat turn is (the same rate
    window and budget; refused with OverLimit before the call), and counted after it."""
    with usage.admitted(user_id, usage_store.embedding_reserve(content)) as paid:
        try:
            # compared with and stored beside the stored vectors: their model's embedder
            vectors = calibrated.embedder().embed([content], input_type,
                                                  deadline=Deadline.after(settings().turn_budget_secs))
        except ProviderError as exc:
            failed = ModelFailed(exc)
            logger.warning("a memory's embedding failed", extra={"error_type": type(exc).__name__,
                                                                  "code": failed.code})
            raise failed from None
        paid.append(usage_store.Call.of("curation", vectors))
    return vectors
