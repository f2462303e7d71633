"""An existing history, imported: a JSONL file of conversations (one a line), each of one user with one persona,
its messages in OpenAI's shape with their times, appended to a session of its own exactly as an app appends its
turns (eros.ingest), so that dreaming then distils them like any other session (``eros import``).

    {"conversation_id": "c-1", "user_id": "alice", "persona_id": "luna",
     "messages": [{"role": "user", "content": "I moved to Lisbon", "created_at": "2025-03-01T09:00:00Z"}, ...]}

* Streamed: one line is read, checked and stored at a time, so a 100 MB file runs in the memory of its longest line.
* Idempotent and resumable: a conversation's session is found again by its ``conversation_id`` (migration 0029)
  and each message by its place in the conversation (its client_message_id), so importing a file again, or again
  after a failure, stores only what is not there yet and pays for no embedding twice.
* Each session is quiet as of its last message (engine.append_messages): dreaming takes the imported sessions
  oldest first, with the transcript's real days, so event times come out right.
* A line that cannot be imported (not JSON, a field refused, an unknown persona, messages out of order) is
  reported with its number and skipped; a provider failure stops the import (run it again to resume).
* ``system`` and ``tool`` messages are skipped: an app's instructions and tool output are not what the user said.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, ValidationError

from . import apps, ingest
from .config import settings
from .errors import ClientError
from .json_body import storable
from .observability import logger
from .store import chat as chat_store

MAX_MESSAGES = 20_000  # of one conversation (a line): its appends go in batches of ingest.MAX_MESSAGES
Text = Annotated[str, StringConstraints(min_length=1, max_length=200)]


class ImportedMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")  # OpenAI's other fields (name, tool_calls, ...) are not memory
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Annotated[str, BeforeValidator(storable)]
    created_at: AwareDatetime


class Conversation(BaseModel):
    model_config = ConfigDict(extra="forbid")
    conversation_id: Annotated[Text, BeforeValidator(storable)]
    user_id: Annotated[str, StringConstraints(min_length=1, max_length=255), BeforeValidator(storable)] | None = None
    persona_id: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    messages: list[ImportedMessage] = Field(min_length=1, max_length=MAX_MESSAGES)


@dataclass
class Imported:
    """What an import did: conversations and messages read, stored now (the rest were there already), skipped
    (``system``/``tool`` messages), and each refused line's number and reason."""
    conversations: int = 0
    sessions_created: int = 0
    messages: int = 0
    stored: int = 0
    skipped: int = 0
    bytes_read: int = 0
    refused: list[tuple[int, str]] = field(default_factory=list)


class LineRefused(Exception):
    pass


def _problem(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
    return f"{where}: {first.get('msg', 'invalid')}{more}"


def _conversation(line: str, user: str | None, app: str = apps.DEFAULT) -> tuple[Conversation, str]:
    """The line's conversation, and the engine's key of its user: ``user`` (or the line's user_id), a subject of
    ``app``."""
    try:
        data = json.loads(line)
    except ValueError as exc:
        raise LineRefused(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise LineRefused("not a JSON object (one conversation a line)")
    try:
        conversation = Conversation.model_validate(data)
    except ValidationError as exc:
        raise LineRefused(_problem(exc)) from None
    owner = user or conversation.user_id
    if owner is None:
        raise LineRefused("no user_id (name one on the line, or give --user)")
    if user and conversation.user_id and conversation.user_id != user:
        raise LineRefused(f"user_id {conversation.user_id!r} is not {user!r}, the user this import is for")
    problem = apps.unusable_subject(owner)  # such a subject would name another app's user
    if problem:
        raise LineRefused(f"user_id {problem}")
    return conversation, apps.user_key(app, owner)


def import_conversations(lines: Iterable[bytes], *, user: str | None = None, app: str = apps.DEFAULT,
                         progress: Callable[[Imported], None] = lambda done: None) -> Imported:
    """Import each line of ``lines`` (the module's docstring says how); ``user``: every conversation is this
    user's (a line naming another is refused); the lines' user_id and ``user`` are subjects of ``app`` (eros.apps).
    ``progress`` is called after each line."""
    done = Imported()
    limit = settings().max_content_chars
    for number, raw in enumerate(lines, start=1):
        done.bytes_read += len(raw)
        text = raw.decode("utf-8", errors="replace").strip()
        if not text:
            continue
        try:
            _import_line(text, user, app, limit, done)
        except LineRefused as refused:
            done.refused.append((number, str(refused)))
        progress(done)
    logger.info("history imported", extra={"conversations": done.conversations, "stored": done.stored,
                                           "refused": len(done.refused)})
    return done


def _import_line(text: str, user: str | None, app: str, limit: int, done: Imported) -> None:
    conversation, owner = _conversation(text, user, app)
    made = import_conversation(owner, conversation, limit=limit, limited=False)
    done.conversations += 1
    done.sessions_created += int(made.created)
    done.messages += made.messages
    done.stored += made.stored
    done.skipped += made.skipped


@dataclass
class ImportedConversation:
    """One conversation imported: its session, whether it was made now, its messages (user and assistant),
    those stored now (the rest were there already) and those skipped (system, tool)."""
    conversation_id: str
    session_id: UUID
    created: bool
    messages: int
    stored: int
    skipped: int


def import_conversation(owner: str, conversation: Conversation, *, limit: int,
                        limited: bool) -> ImportedConversation:
    """One conversation into its session (made on its first import, found again after), its messages appended
    in batches as an app's are (``limited``: admitted by the user's spend limits, as an API request is; an
    operator's import is counted, not limited). Raises LineRefused for what cannot be imported, before the
    session is made when it can tell; a provider's or the database's failure propagates."""
    said = [(place, m) for place, m in enumerate(conversation.messages) if m.role in ("user", "assistant")]
    too_long = next((place for place, m in said if len(m.content.strip()) > limit), None)
    if too_long is not None:
        raise LineRefused(f"messages.{too_long}.content: longer than MAX_CONTENT_CHARS ({limit} characters)")
    backwards = next((place for (_, a), (place, b) in zip(said, said[1:], strict=False)
                      if b.created_at < a.created_at), None)
    if backwards is not None:  # refused before its session is made
        raise LineRefused(f"messages.{backwards}.created_at: before the previous message's: messages are given "
                          f"in order")
    session = chat_store.import_session(owner, conversation.persona_id, conversation.conversation_id)
    if session is None:
        raise LineRefused(f"persona_id: no persona {conversation.persona_id!r}")
    incoming = [ingest.Incoming(m.role, m.content.strip(), str(place), m.created_at)  # type: ignore[arg-type]
                for place, m in said if m.content.strip()]
    stored = 0
    try:
        for start in range(0, len(incoming), ingest.MAX_MESSAGES):
            appended = ingest.append(owner, session["id"], incoming[start:start + ingest.MAX_MESSAGES],
                                     limited=limited)
            stored += sum(1 for m in appended.messages if m.stored)
    except ClientError as refused:
        if refused.status >= 500 or refused.status == 429:
            raise  # a provider, the database or a spend limit: stop; a re-run resumes
        raise LineRefused(str(refused)) from None
    return ImportedConversation(conversation.conversation_id, session["id"], session["created"], len(incoming),
                                stored, len(conversation.messages) - len(incoming))


def import_batch(user_id: str, conversations: list[Conversation]) -> tuple[list[ImportedConversation],
                                                                          list[tuple[int, str, str]]]:
    """``POST /v1/imports``: the user's conversations (the user is the token's), each imported as a line of
    ``eros import`` is, but admitted by the user's spend limits as an API request is. Returns those imported and
    those refused (their index, id and why); a provider failure or a spend limit stops the batch (a re-run
    stores each conversation once)."""
    limit = settings().max_content_chars
    done, refused = [], []
    for index, conversation in enumerate(conversations):
        try:
            done.append(import_conversation(user_id, conversation, limit=limit, limited=True))
        except LineRefused as problem:
            refused.append((index, conversation.conversation_id, str(problem)))
    return done, refused


def describe(done: Imported) -> dict[str, Any]:
    return {"conversations": done.conversations, "sessions_created": done.sessions_created,
            "messages": done.messages, "stored": done.stored, "skipped": done.skipped,
            "refused": [{"line": n, "problem": p} for n, p in done.refused]}
