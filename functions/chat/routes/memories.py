"""The caller's memories: listing, one with its history, search, stating, editing, restoring, deleting."""

# No `from __future__ import annotations` here: pydantic and the resolver would then compile and evaluate
# every annotation of the models and routes from its text at import (~115 evaluations a cold start).
from datetime import datetime
from typing import Annotated, Literal
from uuid import UUID

from aws_lambda_powertools.event_handler import Response, content_types
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Query

from eros import curation, errors
from eros.memory import Category, MemoryLayer, Source
from eros.store import memories as memory_store

from models import (
    Deleted,
    MemoryCursor,
    MemoryEdit,
    MemoryPage,
    MemorySearch,
    MemoryWithHistory,
    NewMemory,
    SearchResults,
    event_of,
)
from routes import current_user, documented

router = Router()
_NOT_YOURS = (404, "no such memory of this user (another user's id answers the same)")
_MODEL_FAILURES = ((429, "rate_limited or budget_exhausted: over a per-user limit, as a chat turn (Retry-After)"),
                   (502, "the embedder refused the text (retrying will not help)"),
                   (503, "the embedder is unavailable (retryable)"), (504, "the embedder timed out (retryable)"))


@router.get("/v1/memories", operation_id="listMemories", tags=["memories"],
            summary="the caller's memories, newest first",
            description="The caller's active memories (with `include=superseded`, their history too), never an "
                        "embedding. `next_before` is an opaque cursor of the last row's position, so paging goes on "
                        "when that memory is deleted.",
            responses=documented((200, "a page of memories")))
def memories(layer: Annotated[MemoryLayer | None, Query(description="profile or relationship; default: both")] = None,
             category: Annotated[Category | None, Query(description="default: every category")] = None,
             source: Annotated[Source | None,
                               Query(description="what wrote it ('episode': the sessions' episodes); default: "
                                                 "every source")] = None,
             limit: Annotated[int, Query(ge=1, le=500)] = 100,
             before: Annotated[MemoryCursor | None,
                               Query(description="the next_before of the previous page (a memory id is accepted "
                                                 "too, while that memory exists)")] = None,
             include: Annotated[Literal["superseded"] | None,
                                Query(description="'superseded': list history (superseded rows) too; "
                                                  "default: active memories only")] = None) -> MemoryPage:
    user = current_user(router)
    rows = memory_store.list_memories(user, layer, category, limit, _position(user, before),
                                      include_superseded=include == "superseded", source=source)
    return MemoryPage.model_validate(
        {"memories": rows, "next_before": memory_store.memory_cursor(rows[-1]) if len(rows) == limit else None})


def _position(user: str, before: object) -> tuple[datetime, UUID] | None:
    """Where the listing continues: a validated cursor's position, or an older client's memory id looked up."""
    if isinstance(before, UUID):  # an older client's cursor: the id of the last memory it was shown
        position = memory_store.position_of(user, before)
        if position is None:
            raise RequestValidationError([{"loc": ("query", "before"), "type": "value_error",
                                           "msg": f"no memory {before} (deleted?): pass the next_before of the "
                                                  f"previous page instead"}])
        return position
    return before if isinstance(before, tuple) else None


@router.get("/v1/memories/<memory_id>", operation_id="getMemory", tags=["memories"],
            summary="one memory with its history",
            description="The memory and `history`: every version of it (what it replaced and what replaced it, "
                        "recursively, merged duplicates and itself included), oldest first.",
            responses=documented((200, "the memory"), _NOT_YOURS))
def memory(memory_id: UUID) -> MemoryWithHistory:
    found = memory_store.get_memory(current_user(router), memory_id)
    if found is None:
        raise errors.NotFound("memory not found")
    return MemoryWithHistory.model_validate(found)


@router.post("/v1/memories/<memory_id>/restore", operation_id="restoreMemory", tags=["memories"],
             summary="undo a supersession",
             description="\"I still live in Berlin\": the memory is active again and confirmed now. Unless it had "
                         "been merged as a duplicate, "
                         "its fact's current version, whichever it is by then, is superseded by it (reason "
                         "'reverted'): a fact never has two current versions. A merged duplicate becomes a fact of "
                         "its own again.",
             responses=documented((200, "the restored memory with its history"), _NOT_YOURS,
                                  (409, "memory_active: the memory is active, nothing to restore")))
def restore_memory(memory_id: UUID) -> MemoryWithHistory:
    restored = memory_store.restore_memory(current_user(router), memory_id)
    if restored is None:
        raise errors.NotFound("memory not found")
    return MemoryWithHistory.model_validate(restored)


@router.post("/v1/memories/search", operation_id="searchMemories", tags=["memories"],
             summary="search the caller's memories",
             description="The ranking a chat turn recalls with, without its per-category quota, and each result's "
                         "score parts: why it is where it is. The query is embedded once. What it covers is what a "
                         "turn recalls from: every current profile memory; of a persona's relationship memories, the "
                         "newest utterances (RECALL_UTTERANCE_WINDOW, 1,000 by default), as many of its newest "
                         "episodes (one per session), and older utterances and episodes that share a rare word with "
                         "the query (a name, a place, a number; at most RECALL_LEXICAL_POOL). Older utterances are "
                         "kept, listed by GET /v1/memories, exported and erased like every memory; only this search "
                         "and a turn's recall reach them through their episode and their words instead of their "
                         "vectors.",
             responses=documented((200, "the results, best first"),
                                  (404, "persona_id names a persona the caller never talked to"), *_MODEL_FAILURES))
def search_memories(body: MemorySearch) -> SearchResults:
    results = curation.search(current_user(router), body.query, layer=body.layer, category=body.category,
                              persona_id=body.persona_id, k=body.k)
    return SearchResults.model_validate({"results": results})


@router.post("/v1/memories", operation_id="addMemory", tags=["memories"], summary="state a memory",
             description="A profile memory the user states directly (source 'user'), embedded once; when the embedder "
                         "fails, nothing is stored.",
             responses=documented((201, "the new memory"), *_MODEL_FAILURES))
def add_memory(body: NewMemory) -> Response[MemoryWithHistory]:
    memory = curation.remember(current_user(router), body.content, body.category, body.importance,
                               event_of(body.occurred_at))
    return Response(201, content_types.APPLICATION_JSON, MemoryWithHistory.model_validate(memory))


@router.patch("/v1/memories/<memory_id>", operation_id="editMemory", tags=["memories"], summary="edit a memory",
              description="A new version of the current version of a profile memory: it supersedes the old one "
                          "(reason 'edited'; the history keeps both) and keeps where the memory came from (its session "
                          "and message range) and its event time unless `occurred_at` is given. The text is embedded "
                          "again only when it changed. Restoring the old version undoes the edit. An episode (source "
                          "'episode') is corrected in place instead (its content and `occurred_at`; it has no "
                          "versions), and stays its session's episode: a later extraction goes on from the correction.",
              responses=documented((200, "the new version with its history"), _NOT_YOURS,
                                   (409, "memory_not_current: history or a relationship utterance (edit the current "
                                          "version of a profile memory)"),
                                   (422, "not_an_episode_field: a category or an importance for an episode"),
                                   *_MODEL_FAILURES))
def edit_memory(memory_id: UUID, body: MemoryEdit) -> MemoryWithHistory:
    return MemoryWithHistory.model_validate(curation.edit(current_user(router), memory_id, body.changes()))


@router.delete("/v1/memories", operation_id="deleteMemories", tags=["memories"],
               summary="delete the memories of a layer and/or a category",
               description="Every memory of the caller matching both filters, history included. At least one filter "
                           "is required: a 422 without (DELETE /v1/me erases everything). Memories of other kinds "
                           "that one of them "
                           "had replaced stay history.",
               responses=documented((200, "how many were deleted")))
def delete_memories(layer: Annotated[MemoryLayer | None, Query()] = None,
                    category: Annotated[Category | None, Query()] = None) -> Deleted:
    user = current_user(router)
    if layer is None and category is None:
        raise RequestValidationError([{"loc": ("query",), "type": "value_error",
                                       "msg": "name a layer and/or a category to delete (DELETE /v1/me erases "
                                              "everything)"}])
    return Deleted(deleted=memory_store.delete_memories(user, layer, category))


@router.delete("/v1/memories/<memory_id>", operation_id="deleteMemory", tags=["memories"], summary="delete a memory",
               description="Memories it had replaced stay history (their validity end is kept).",
               responses=documented((204, "deleted"), _NOT_YOURS))
def delete_memory(memory_id: UUID):
    if not memory_store.delete_memory(current_user(router), memory_id):
        raise errors.NotFound("memory not found")
    return Response(204, None, "")
