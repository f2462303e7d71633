"""The shapes of the rows that cross the store boundary: what a store function returns is one of these.

They describe what the SQL selects (column names, with the aliases the statements give them); psycopg
returns them as plain dicts, so these are TypedDicts rather than classes, as procrastinate types its
query results. A use-case reads ``session["instance_id"]`` knowing the key exists and what it holds.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict
from uuid import UUID

if TYPE_CHECKING:
    from .usage import Admitted


class Persona(TypedDict):
    """A persona as its user sees it (``store.personas``)."""
    id: str
    name: str
    description: str
    version: int
    own: bool  # a character the user made (else one of the app's)
    system_prompt: str | None  # the user's own character's prompt (the app's are not shown)


class Session(TypedDict):
    """A chat session as its user sees it (``store.chat.list_sessions``, ``create_session``)."""
    id: UUID
    instance_id: UUID
    persona_id: str
    created_at: datetime
    last_active_at: datetime
    extracted_at: NotRequired[datetime | None]


class Dreaming(TypedDict):
    """Where a session is in dreaming (``store.chat.list_sessions``)."""
    state: str  # active | waiting | claimed | retrying | extracted | failed
    error: str | None
    attempts: int
    due_at: datetime | None


class SessionWithDreaming(Session):
    dreaming: Dreaming


class SessionWithPersona(Session):
    """A session with its persona's prompt (``store.chat.get_session``): what a chat turn needs."""
    persona_name: str
    system_prompt: str
    history: NotRequired[list[Message]]  # get_session(history=n): its last n messages, oldest first


class Message(TypedDict):
    id: int
    role: str  # user | assistant
    content: str
    client_turn_id: NotRequired[str]
    sent_at: NotRequired[datetime]
    metadata: NotRequired[dict[str, Any]]
    recalled: NotRequired[list[dict[str, Any]] | None]  # a listed reply's: what its prompt recalled


class StoredMessage(TypedDict):
    """A message as an append stores it (``store.chat.append_messages``)."""
    id: int
    role: str  # user | assistant
    client_turn_id: str  # the message's client_message_id
    content: str
    sent_at: datetime
    inserted: bool  # stored by this request (false: by an earlier one, with the same text)


class Transcript(TypedDict):
    """A session as an append checks it (``store.chat.transcript``)."""
    instance_id: UUID
    newest: datetime | None  # its newest message's time
    stored: list[Message]  # its messages under the ids asked about (id, role, client_turn_id, content)
    history: list[Message]  # its last messages, oldest first (when asked for)


# The messages already stored for one client_turn_id, by role ("user", and "assistant" once answered).
TurnMessages = dict[str, Message]


class OpenedTurn(TypedDict):
    """A turn as ``store.chat.open_turn`` opened it."""
    session: SessionWithPersona
    stored: TurnMessages  # this turn id's messages: the user's just stored, or a retry's earlier attempt
    claimed: bool  # the user's message was stored by this request (and is marked being answered by it)
    admitted: bool  # the spend limits let the turn through (and counted it); always true with no limit on
    reserved: Admitted  # its day and reservation, which record_turn settles (or settle releases)
    tokens_reserved: int  # what it reserved (0: no budget, no reservation)
    history: list[Message]  # the prompt's history, oldest first, the turn's own messages excluded


class RecordedTurn(TypedDict):
    replayed: bool
    user_message_id: NotRequired[int]
    assistant_message_id: NotRequired[int]


class Claim(TypedDict):
    """A session the sweep claimed (``store.claims.claim`` of ``store.dreaming.SESSIONS``): its extract event."""
    id: UUID
    user_id: str
    instance_id: UUID
    claim_token: datetime  # the claim's extraction_claimed_at


class ClaimedJob(TypedDict):
    """A claimed dreaming job as its delivery reads it (``store.claims.start``, ``held``, ``lock``): the lifecycle
    columns under the same names for every kind (``extraction_attempts`` is ``attempts``, ...)."""
    user_id: str
    attempts: int  # its own failures so far
    retries: int  # the world's failures in the current streak
    retrying_since: datetime | None  # the first of that streak
    error: str | None
    lease: datetime | None  # started_at: set by the delivery that started the work


class ClaimedSession(ClaimedJob):
    """A claimed session as its extraction reads it (``store.dreaming.SESSIONS``)."""
    id: UUID
    instance_id: UUID
    extraction_watermark: int | None  # the last message extraction has read; None: none yet


class EpisodeContext(TypedDict):
    """What a session's episode is written with (``store.dreaming.episode_context``): the persona's name, and the
    session's episode so far, if one was written."""
    persona_name: str
    episode_id: UUID | None
    episode: str | None
    occurred_at: date | None
    occurred_precision: str | None


class KnownMemory(TypedDict):
    """An active profile memory shown to extraction (``store.dreaming.touched_memories``)."""
    id: UUID
    content: str
    category: str
    importance: float | None
    created_at: datetime
    occurred_at: date | None  # its event time, shown so that a repeat at another time is not taken for the same
    occurred_precision: str | None
    distance: float


class Scored(TypedDict):
    """What a ranked row carries: the memory, its distance and decay, the score parts and the score."""
    id: UUID
    content: str
    category: str | None
    importance: float | None
    created_at: datetime
    occurred_at: date | None  # when what it is about happened (the start of the period), if the session said
    occurred_precision: str | None  # day | week | month | year
    distance: float
    decay: float
    similarity: float
    recency_term: float
    importance_term: float
    demotion: float
    score: float
    lexical_term: float


class RankedMemory(Scored):
    """A recalled row (``store.recall.ranked``) with its score and the parts that make it up."""
    embedding: Any  # pgvector's Vector


class RecallCandidate(Scored):
    """A row of a turn's recall (``store.recall.candidates``): as ``RankedMemory`` but without its embedding,
    with its layer and the near-duplicates placed before it."""
    layer: str  # MemoryLayer
    near: list[UUID]  # candidates placed before this one (the profile's first) at least dedupe-similar to it


class Memory(TypedDict):
    """A memory as its owner sees it (``store.memories``): never its embedding."""
    id: UUID
    layer: str  # MemoryLayer
    category: str | None
    content: str
    importance: float | None
    persona_id: str | None
    created_at: datetime
    occurred_at: date | None  # its event time: the start of the period (eros.memory.EventTime), if a session said
    occurred_precision: str | None  # day | week | month | year
    source: str  # eros.memory.Source
    session_id: UUID | None
    from_message_id: int | None
    through_message_id: int | None
    model: str | None
    last_confirmed_at: datetime | None
    mention_count: int
    superseded_at: datetime | None
    superseded_by: UUID | None
    superseded_reason: str | None
    supersedes: list[UUID]


class MemoryWithHistory(Memory):
    history: list[Memory]


class UserClaim(TypedDict):
    """A user the sweep claimed for a deep pass (``store.claims.claim`` of ``store.deep_pass.USERS``)."""
    user_id: str
    claim_token: datetime  # the claim's user_deep_pass.claimed_at


class ReembeddingJob(ClaimedJob):
    """A claimed user's re-embedding row (``store.reembedding.USERS``)."""
    model: str  # the model the user's rows are re-embedded with
    rows_done: int


class ClaimedUser(ClaimedJob):
    """A claimed user's consolidation row (``store.deep_pass.USERS``)."""
    changed_at: datetime


class UsageCount(TypedDict):
    """The tokens the budget counted (migration 0007) in a user's range of days (``store.usage.tokens_by_user``)."""
    tokens: int


class UsageDay(UsageCount):
    """A user's day of spend (``store.usage.days``)."""
    day: date


class UsageCalls(TypedDict):
    """Provider calls of one purpose and model (``store.usage.calls_by_day``, ``calls_by_user``): a user's
    day (``day``) or, for an operator, a user's whole range (``user_id``)."""
    day: NotRequired[date]
    user_id: NotRequired[str]
    purpose: str
    model: str
    calls: int
    input_tokens: int
    output_tokens: int
