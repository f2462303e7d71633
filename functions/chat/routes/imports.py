"""Importing an existing history through the API: conversations in batches, and where dreaming is in them
(``eros import FILE`` is the operator's way, for a whole file)."""

# No `from __future__ import annotations` here (routes/sessions.py says why).
from aws_lambda_powertools.event_handler.api_gateway import Router

from eros import importing
from eros.store import chat as chat_store

from models import ImportProgress, ImportResult, NewImport
from routes import current_user, documented

router = Router()


@router.post("/v1/imports", operation_id="importConversations", tags=["chat"],
             summary="import conversations your app already had",
             description="Each conversation becomes a session of the caller's with the persona, its messages stored "
                         "as POST .../messages stores them (their times kept, the user's messages embedded and "
                         "admitted by the spend limits), and dreaming distils the imported sessions oldest first. "
                         "Idempotent: a conversation is found again by its `conversation_id` and each message by "
                         "its place, so a request can be sent again, or a history sent in several, and nothing is "
                         "stored twice. A conversation that cannot be imported is listed in `refused` with why; the "
                         "others are imported. A provider failure or a spend limit stops the request (send it "
                         "again: what was stored stays).",
             responses=documented((200, "what was imported and what was refused"),
                                  (429, "rate_limited or budget_exhausted: over a per-user limit (Retry-After)"),
                                  (502, "model_error: the embedder refused the request: not retryable"),
                                  (503, "model_unavailable (retryable), database_unavailable or database_busy"),
                                  (504, "model_timeout (retryable)")))
def import_conversations(body: NewImport) -> ImportResult:
    conversations = [importing.Conversation(conversation_id=c.conversation_id, persona_id=c.persona_id,
                                            messages=c.messages) for c in body.conversations]
    done, refused = importing.import_batch(current_user(router), conversations)
    return ImportResult.model_validate({
        "imported": [vars(d) for d in done],
        "refused": [{"index": i, "conversation_id": c, "problem": p} for i, c, p in refused]})


@router.get("/v1/imports", operation_id="getImportProgress", tags=["chat"],
            summary="where dreaming is in the caller's imported history",
            responses=documented((200, "the progress")))
def import_progress() -> ImportProgress:
    row = chat_store.import_progress(current_user(router))
    state = "none" if not row["sessions"] else "backfilling" if row["waiting"] or row["in_progress"] else "done"
    return ImportProgress.model_validate(row | {"state": state})
