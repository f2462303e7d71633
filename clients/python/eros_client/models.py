# The API's request and response shapes, generated from its OpenAPI document by .venv/bin/python tools/client_models.py
# (datamodel-code-generator): do not edit; change the API's models, then run it again.

from __future__ import annotations

from uuid import UUID
from typing import Annotated, Any, Literal
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, RootModel
from datetime import date


class ApiKey(BaseModel):
    """
    One of the app's API keys, as listed: never its secret.
    """

    id: Annotated[UUID, Field(title="Id")]
    name: Annotated[str, Field(title="Name")]
    prefix: Annotated[str, Field(title="Prefix")]
    """
    the key's first characters, to tell keys apart
    """
    created_at: Annotated[AwareDatetime, Field(title="Created At")]
    last_used_at: Annotated[AwareDatetime | None, Field(title="Last Used At")]
    """
    when a request last came with it (to the minute)
    """
    revoked_at: Annotated[AwareDatetime | None, Field(title="Revoked At")]
    """
    refused since (null: live)
    """
    replaced_by: Annotated[UUID | None, Field(title="Replaced By")]
    """
    the key a rotation made in its place
    """


class ApiKeyList(BaseModel):
    keys: Annotated[list[ApiKey], Field(title="Keys")]
    """
    newest first, revoked ones too
    """


class AppPersona(BaseModel):
    """
    One of the app's personas, as an operator sees it (its prompt included).
    """

    id: Annotated[str, Field(title="Id")]
    name: Annotated[str, Field(title="Name")]
    description: Annotated[str, Field(title="Description")]
    system_prompt: Annotated[str, Field(title="System Prompt")]
    version: Annotated[int, Field(title="Version")]
    retired_at: Annotated[AwareDatetime | None, Field(title="Retired At")]


class AppPersonaList(BaseModel):
    personas: Annotated[list[AppPersona], Field(title="Personas")]


class TurnsPerMinute(RootModel[int]):
    root: Annotated[int, Field(ge=0, title="Turns Per Minute")]
    """
    a user's turns and memory requests a minute
    """


class DailyTokenBudget(RootModel[int]):
    root: Annotated[int, Field(ge=0, title="Daily Token Budget")]
    """
    a user's provider tokens a UTC day
    """


class ChatModel(RootModel[str]):
    root: Annotated[
        str, Field(max_length=200, min_length=1, pattern="^\\S+$", title="Chat Model")
    ]


class ExtractModel(RootModel[str]):
    root: Annotated[
        str,
        Field(max_length=200, min_length=1, pattern="^\\S+$", title="Extract Model"),
    ]


class TranscriptRetentionDays(RootModel[int]):
    root: Annotated[int, Field(ge=0, title="Transcript Retention Days")]
    """
    messages kept this long once extracted
    """


class HistoryMessages(RootModel[int]):
    root: Annotated[int, Field(ge=0, le=200, title="History Messages")]


class ChatMaxTokens(RootModel[int]):
    root: Annotated[int, Field(ge=16, le=100000, title="Chat Max Tokens")]


class AppSettings(BaseModel):
    """
    What an app may set for itself over the deployment's settings (``engine.apps.settings``): each field is the
    ``Settings`` field of the same name; unset, the deployment's applies.
    """

    model_config = ConfigDict(
        extra="forbid",
    )
    turns_per_minute: Annotated[
        TurnsPerMinute | None, Field(title="Turns Per Minute")
    ] = None
    """
    a user's turns and memory requests a minute
    """
    daily_token_budget: Annotated[
        DailyTokenBudget | None, Field(title="Daily Token Budget")
    ] = None
    """
    a user's provider tokens a UTC day
    """
    chat_model: Annotated[ChatModel | None, Field(title="Chat Model")] = None
    extract_model: Annotated[ExtractModel | None, Field(title="Extract Model")] = None
    transcript_retention_days: Annotated[
        TranscriptRetentionDays | None, Field(title="Transcript Retention Days")
    ] = None
    """
    messages kept this long once extracted
    """
    history_messages: Annotated[
        HistoryMessages | None, Field(title="History Messages")
    ] = None
    chat_max_tokens: Annotated[ChatMaxTokens | None, Field(title="Chat Max Tokens")] = (
        None
    )
    events_include_text: Annotated[bool | None, Field(title="Events Include Text")] = (
        None
    )
    """
    memory events carry the memory's text
    """


class AppView(BaseModel):
    """
    The caller's app (``eros apps`` makes and sets apps).
    """

    id: Annotated[str, Field(title="Id")]
    name: Annotated[str, Field(title="Name")]
    settings: AppSettings
    """
    what the app sets over the deployment's settings (null: the deployment's applies)
    """
    created_at: Annotated[AwareDatetime, Field(title="Created At")]


class AppendedMessage(BaseModel):
    """
    A message of an append, as stored.
    """

    id: Annotated[int, Field(title="Id")]
    role: Annotated[Literal["user", "assistant"], Field(title="Role")]
    client_message_id: Annotated[str, Field(title="Client Message Id")]
    """
    its id: the client's, or one made for it
    """
    created_at: Annotated[AwareDatetime, Field(title="Created At")]
    """
    its time in the transcript (and its utterance's, for a user message)
    """
    stored: Annotated[bool, Field(title="Stored")]
    """
    false: an earlier request with this client_message_id and role stored it (a retry): nothing was stored again
    """


class CallsUsage(BaseModel):
    purpose: Annotated[
        Literal["chat", "extraction", "deep_pass", "curation", "reembedding"],
        Field(title="Purpose"),
    ]
    """
    chat: turns (reply and query embedding); extraction and deep_pass: dreaming; curation: the memory API's embeddings; reembedding: a change of embedder re-embedding the user's memories
    """
    model: Annotated[str, Field(title="Model")]
    calls: Annotated[int, Field(title="Calls")]
    input_tokens: Annotated[int, Field(title="Input Tokens")]
    output_tokens: Annotated[int, Field(title="Output Tokens")]
    estimated_cost: Annotated[float | None, Field(title="Estimated Cost")]
    """
    USD at the configured list prices; null: the model has no price
    """


class Check(BaseModel):
    status: Annotated[Literal["ok", "warning", "failed"], Field(title="Status")]
    """
    warning: works, but needs an operator's look (an embedder with no calibration)
    """
    detail: Annotated[str, Field(title="Detail")]
    ms: Annotated[float, Field(title="Ms")]
    age_s: Annotated[float, Field(title="Age S")]
    """
    seconds since the check ran: 0, but for the providers' checks, which a container makes at most once per DEEP_HEALTH_CACHE_SECS
    """


class ClientMessageId(RootModel[str]):
    root: Annotated[
        str, Field(pattern="^[A-Za-z0-9._:-]{1,128}$", title="Client Message Id")
    ]
    """
    with store: the message's id, as in POST .../messages (a retry stores it once)
    """


class ContextRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
    )
    content: Annotated[str, Field(min_length=1, title="Content")]
    """
    the user's message to answer
    """
    store: Annotated[bool | None, Field(title="Store")] = False
    """
    also record the message in the session, as an appended user message (POST .../messages): then append only your reply
    """
    client_message_id: Annotated[
        ClientMessageId | None, Field(title="Client Message Id")
    ] = None
    """
    with store: the message's id, as in POST .../messages (a retry stores it once)
    """


class CreatedSession(BaseModel):
    id: Annotated[UUID, Field(title="Id")]
    persona_id: Annotated[str, Field(title="Persona Id")]
    created_at: Annotated[AwareDatetime, Field(title="Created At")]
    last_active_at: Annotated[AwareDatetime, Field(title="Last Active At")]


class DayUsage(BaseModel):
    day: Annotated[date, Field(title="Day")]
    """
    a UTC day
    """
    tokens: Annotated[int, Field(title="Tokens")]
    """
    what the daily token budget counted
    """
    estimated_cost: Annotated[float, Field(title="Estimated Cost")]
    calls: Annotated[list[CallsUsage], Field(title="Calls")]


class Deleted(BaseModel):
    deleted: Annotated[int, Field(title="Deleted")]
    """
    how many memories were deleted (0 when none matched)
    """


class DreamingState(BaseModel):
    state: Annotated[
        Literal[
            "active", "waiting", "claimed", "retrying", "extracted", "nothing", "failed"
        ],
        Field(title="State"),
    ]
    """
    active: not quiet for DREAMING_IDLE_SECS yet; waiting: for the next sweep; claimed: being extracted; retrying: after a failure, at due_at; extracted: its memories are written; nothing: extracted, and nothing in it was worth remembering (no messages, or only questions and small talk); failed: given up (error says why; a new message makes it eligible again)
    """
    error: Annotated[str | None, Field(title="Error")]
    """
    the last failed attempt's error
    """
    attempts: Annotated[int, Field(title="Attempts")]
    due_at: Annotated[AwareDatetime | None, Field(title="Due At")]
    """
    when it is quiet enough to be dreamt about, or retried
    """


class Erased(BaseModel):
    """
    What an erasure deleted, by kind (all 0 when there was nothing, e.g. the second time).
    """

    memories: Annotated[int, Field(title="Memories")]
    """
    both layers, superseded history included
    """
    messages: Annotated[int, Field(title="Messages")]
    sessions: Annotated[int, Field(title="Sessions")]
    persona_instances: Annotated[int, Field(title="Persona Instances")]
    deep_pass: Annotated[int, Field(title="Deep Pass")]
    """
    the user's deep-pass (per-user consolidation) record
    """
    personas: Annotated[int | None, Field(title="Personas")] = 0
    """
    characters the user made, with every version
    """
    reembedding: Annotated[int | None, Field(title="Reembedding")] = 0
    """
    the user's re-embedding job, while a change of embedder is under way
    """
    events: Annotated[int | None, Field(title="Events")] = 0
    """
    memory events about the user not yet published (one `user.erased` event is published in their place)
    """
    webhook_deliveries: Annotated[int | None, Field(title="Webhook Deliveries")] = 0
    """
    the app's webhook deliveries of the user's events, made or not
    """
    usage_days: Annotated[int, Field(title="Usage Days")]
    """
    days of token usage and turn counts
    """
    usage_by_model: Annotated[int, Field(title="Usage By Model")]
    """
    rows of usage per day, purpose and model
    """
    exports: Annotated[int, Field(title="Exports")]
    """
    export files not yet expired
    """


class Erasure(BaseModel):
    erased: Erased


class ExportLink(BaseModel):
    url: Annotated[str, Field(title="Url")]
    """
    where the export is, a JSON document: `user_id`, `exported_at`, `sessions` (each with its `messages`), `memories` of both layers with their history, provenance and event time (never an embedding), `usage` per day and `usage_by_model` per day, purpose and model
    """
    expires_at: Annotated[AwareDatetime, Field(title="Expires At")]
    """
    the link (and, within a day, the file) expires
    """
    bytes: Annotated[int, Field(title="Bytes")]


class HealthReport(BaseModel):
    status: Annotated[Literal["ok", "degraded"], Field(title="Status")]
    database: Annotated[Literal["ok", "unreachable"], Field(title="Database")]
    providers: Annotated[dict[str, str], Field(title="Providers")]
    """
    what the chat model and the embedder are (real or offline)
    """
    offline: Annotated[list[Literal["llm", "embedder"]], Field(title="Offline")]
    """
    the providers this deployment runs offline stand-ins for (no key or base URL set: local runs only): with llm, replies are echoes and memories a crude pick of the user's words; with embedder, recall matches words, not meaning. Empty when real ones are configured
    """
    dreaming: Annotated[dict[str, Any], Field(title="Dreaming")]
    """
    ok, or held while a provider refuses our credentials (and why)
    """


class ImportProgress(BaseModel):
    state: Annotated[Literal["none", "backfilling", "done"], Field(title="State")]
    """
    none: nothing imported; backfilling: dreaming is distilling the imported sessions, oldest first; done: every one is extracted (or given up on)
    """
    sessions: Annotated[int, Field(title="Sessions")]
    waiting: Annotated[int, Field(title="Waiting")]
    in_progress: Annotated[int, Field(title="In Progress")]
    extracted: Annotated[int, Field(title="Extracted")]
    failed: Annotated[int, Field(title="Failed")]
    """
    given up on: GET /v1/sessions says why
    """
    oldest: Annotated[AwareDatetime | None, Field(title="Oldest")]
    """
    the oldest imported conversation's last message
    """
    newest: Annotated[AwareDatetime | None, Field(title="Newest")]
    distilled_through: Annotated[AwareDatetime | None, Field(title="Distilled Through")]
    """
    the newest imported conversation dreaming has extracted: it goes oldest first
    """


class ImportRefusal(BaseModel):
    index: Annotated[int, Field(title="Index")]
    """
    the conversation's place in the request
    """
    conversation_id: Annotated[str, Field(title="Conversation Id")]
    problem: Annotated[str, Field(title="Problem")]


class ImportedConversationView(BaseModel):
    conversation_id: Annotated[str, Field(title="Conversation Id")]
    session_id: Annotated[UUID, Field(title="Session Id")]
    created: Annotated[bool, Field(title="Created")]
    """
    false: an earlier import made its session
    """
    messages: Annotated[int, Field(title="Messages")]
    """
    its user and assistant messages
    """
    stored: Annotated[int, Field(title="Stored")]
    """
    of those, stored by this request (the rest were there already)
    """
    skipped: Annotated[int, Field(title="Skipped")]
    """
    system and tool messages
    """


class ImportedMessage(BaseModel):
    role: Annotated[
        Literal["system", "user", "assistant", "tool", "developer"], Field(title="Role")
    ]
    content: Annotated[str, Field(title="Content")]
    created_at: Annotated[AwareDatetime, Field(title="Created At")]


class IssuedKey(BaseModel):
    id: Annotated[UUID, Field(title="Id")]
    name: Annotated[str, Field(title="Name")]
    prefix: Annotated[str, Field(title="Prefix")]
    """
    the key's first characters, to tell keys apart
    """
    created_at: Annotated[AwareDatetime, Field(title="Created At")]
    last_used_at: Annotated[AwareDatetime | None, Field(title="Last Used At")]
    """
    when a request last came with it (to the minute)
    """
    revoked_at: Annotated[AwareDatetime | None, Field(title="Revoked At")]
    """
    refused since (null: live)
    """
    replaced_by: Annotated[UUID | None, Field(title="Replaced By")]
    """
    the key a rotation made in its place
    """
    secret: Annotated[str, Field(title="Secret")]
    """
    the key: send it in X-Api-Key to the /server routes. Shown this once: only its SHA-256 is kept
    """


class Content(RootModel[str]):
    root: Annotated[str, Field(min_length=1, title="Content")]
    """
    text, trimmed: at most MAX_CONTENT_CHARS (4,000) characters, no NUL character or lone surrogate
    """


class MemoryEdit(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
    )
    content: Annotated[Content | None, Field(title="Content")] = None
    category: Annotated[
        Literal["fact", "preference", "event", "emotion", "relation"] | None,
        Field(title="Category"),
    ] = None
    importance: Annotated[float | None, Field(title="Importance")] = None
    """
    a number 0..1, stored as a float4 (one too small for a float4, such as 1e-100, is 0); NaN, infinities, text and booleans are refused
    """
    occurred_at: Annotated[str | None, Field(title="Occurred At")] = None
    """
    the new event time; null clears it; left out: kept
    """


class PersonaId(RootModel[str]):
    root: Annotated[str, Field(max_length=64, min_length=1, title="Persona Id")]
    """
    the persona whose relationship memories (what was said to it) are searched too: its episodes, its newest utterances and older ones that share a rare word with the query
    """


class MemorySearch(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
    )
    query: Annotated[str, Field(min_length=1, title="Query")]
    """
    text, trimmed: at most MAX_CONTENT_CHARS (4,000) characters, no NUL character or lone surrogate
    """
    layer: Literal["profile", "relationship"] | None = None
    """
    default: both (the relationship layer needs persona_id)
    """
    category: Annotated[
        Literal["fact", "preference", "event", "emotion", "relation"] | None,
        Field(title="Category"),
    ] = None
    """
    profile memories of this category only
    """
    persona_id: Annotated[PersonaId | None, Field(title="Persona Id")] = None
    """
    the persona whose relationship memories (what was said to it) are searched too: its episodes, its newest utterances and older ones that share a rare word with the query
    """
    k: Annotated[int | None, Field(ge=1, le=50, title="K")] = 10
    """
    how many results at most
    """


class NewKey(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
    )
    name: Annotated[str, Field(max_length=100, min_length=1, title="Name")]
    """
    what the key is for, to tell keys apart: 1 to 100 characters
    """


class NewMemory(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
    )
    content: Annotated[str, Field(min_length=1, title="Content")]
    """
    text, trimmed: at most MAX_CONTENT_CHARS (4,000) characters, no NUL character or lone surrogate
    """
    category: Annotated[
        Literal["fact", "preference", "event", "emotion", "relation"],
        Field(title="Category"),
    ]
    importance: Annotated[float | None, Field(title="Importance")] = None
    """
    a number 0..1, stored as a float4 (one too small for a float4, such as 1e-100, is 0); NaN, infinities, text and booleans are refused; default 0.8 (what the user states matters)
    """
    occurred_at: Annotated[str | None, Field(title="Occurred At")] = None


class ClientMessageId1(RootModel[str]):
    root: Annotated[
        str, Field(pattern="^[A-Za-z0-9._:-]{1,128}$", title="Client Message Id")
    ]
    """
    your id for the message (1-128 of A-Z a-z 0-9 . _ : -): a retry with the same id and role stores nothing twice; the same id with other text is a 409 message_conflict. Without one, an id is made, and a retry stores the message again
    """


class NewMessage(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
    )
    role: Annotated[Literal["user", "assistant"], Field(title="Role")]
    """
    who said it: the user, or the persona (your model)
    """
    content: Annotated[str, Field(min_length=1, title="Content")]
    """
    text, trimmed: at most MAX_CONTENT_CHARS (4,000) characters, no NUL character or lone surrogate
    """
    client_message_id: Annotated[
        ClientMessageId1 | None, Field(title="Client Message Id")
    ] = None
    """
    your id for the message (1-128 of A-Z a-z 0-9 . _ : -): a retry with the same id and role stores nothing twice; the same id with other text is a 409 message_conflict. Without one, an id is made, and a retry stores the message again
    """
    created_at: Annotated[AwareDatetime | None, Field(title="Created At")] = None
    """
    when it was said, with its time zone (ISO 8601); default: when it is stored. Not ahead of the server's clock by more than 5 minutes, in order within the request, and not before the session's newest message
    """


class NewMessages(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
    )
    messages: Annotated[
        list[NewMessage], Field(max_length=100, min_length=1, title="Messages")
    ]
    """
    in order, 1 to 100
    """


class NewPersona(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
    )
    name: Annotated[str, Field(max_length=64, min_length=1, title="Name")]
    description: Annotated[str | None, Field(max_length=500, title="Description")] = ""
    system_prompt: Annotated[
        str, Field(max_length=8000, min_length=1, title="System Prompt")
    ]
    """
    who the character is and how it talks: 1 to 8,000 characters; what a turn puts first in its system prompt
    """


class NewSession(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
    )
    persona_id: Annotated[str, Field(max_length=64, min_length=1, title="Persona Id")]


class ClientTurnId(RootModel[str]):
    root: Annotated[
        str, Field(pattern="^[A-Za-z0-9._:-]{1,128}$", title="Client Turn Id")
    ]


class NewTurn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
    )
    content: Annotated[str, Field(min_length=1, title="Content")]
    """
    text, trimmed: at most MAX_CONTENT_CHARS (4,000) characters, no NUL character or lone surrogate
    """
    client_turn_id: Annotated[ClientTurnId | None, Field(title="Client Turn Id")] = None


class NewWebhook(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
    )
    url: Annotated[str, Field(max_length=2000, min_length=1, title="Url")]
    """
    where the app's memory events are posted: an https URL, without credentials or fragment, not a private IP address
    """
    rotate_secret: Annotated[bool | None, Field(title="Rotate Secret")] = False
    """
    a new signing secret in place of the current one (the old one signs nothing from this answer on)
    """


class Name(RootModel[str]):
    root: Annotated[str, Field(max_length=64, min_length=1, title="Name")]


class Description(RootModel[str]):
    root: Annotated[str, Field(max_length=500, title="Description")]


class SystemPrompt(RootModel[str]):
    root: Annotated[str, Field(max_length=8000, min_length=1, title="System Prompt")]
    """
    who the character is and how it talks: 1 to 8,000 characters; what a turn puts first in its system prompt
    """


class PersonaEdit(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
    )
    name: Annotated[Name | None, Field(title="Name")] = None
    description: Annotated[Description | None, Field(title="Description")] = None
    system_prompt: Annotated[SystemPrompt | None, Field(title="System Prompt")] = None


class PersonaView(BaseModel):
    id: Annotated[str, Field(title="Id")]
    name: Annotated[str, Field(title="Name")]
    description: Annotated[str, Field(title="Description")]
    version: Annotated[int, Field(title="Version")]
    """
    its current version: a session keeps the one it started with
    """
    own: Annotated[bool, Field(title="Own")]
    """
    a character you made (else one of the app's)
    """
    system_prompt: Annotated[str | None, Field(title="System Prompt")]
    """
    your own character's prompt (null for the app's)
    """


class PurposeUsage(BaseModel):
    purpose: Annotated[str, Field(title="Purpose")]
    calls: Annotated[int, Field(title="Calls")]
    input_tokens: Annotated[int, Field(title="Input Tokens")]
    output_tokens: Annotated[int, Field(title="Output Tokens")]
    estimated_cost: Annotated[float, Field(title="Estimated Cost")]


class Redriven(BaseModel):
    redriven: Annotated[int, Field(title="Redriven")]
    """
    dead deliveries due again, with fresh attempts
    """


class Reembedding(BaseModel):
    """
    How far a change of embedder is (eros.dreaming.reembedding).
    """

    next_model: Annotated[str | None, Field(title="Next Model")]
    """
    the model the stored vectors are being re-embedded with
    """
    users: Annotated[int | None, Field(title="Users")]
    users_pending: Annotated[int | None, Field(title="Users Pending")]
    users_failed: Annotated[int | None, Field(title="Users Failed")]
    """
    users whose job was given up on (`eros doctor` says why)
    """
    rows_done: Annotated[int | None, Field(title="Rows Done")]
    rows_pending: Annotated[int | None, Field(title="Rows Pending")]


class ScoreParts(BaseModel):
    """
    Why a ranked memory is where it is: its score is similarity + recency + importance + lexical - demotion.
    """

    similarity: Annotated[float, Field(title="Similarity")]
    """
    cosine similarity of the memory to the query
    """
    recency: Annotated[float, Field(title="Recency")]
    """
    what its age adds (or, composite strategy, takes away)
    """
    importance: Annotated[float, Field(title="Importance")]
    """
    what its importance adds
    """
    lexical: Annotated[float, Field(title="Lexical")]
    """
    what its words shared with the message add (names, numbers, rare words)
    """
    demotion: Annotated[float, Field(title="Demotion")]
    """
    taken away when a newer, similar memory of its category outranks it
    """


class SearchResult(BaseModel):
    id: Annotated[UUID, Field(title="Id")]
    layer: Annotated[Literal["profile", "relationship"], Field(title="MemoryLayer")]
    """
    Which of the two memory layers a memory is in (not to be confused with the Lambda layer).
    """
    category: Annotated[
        Literal["fact", "preference", "event", "emotion", "relation"] | None,
        Field(title="Category"),
    ]
    content: Annotated[str, Field(title="Content")]
    importance: Annotated[float | None, Field(title="Importance")]
    persona_id: Annotated[str | None, Field(title="Persona Id")]
    """
    the persona of a relationship memory; null in the profile layer
    """
    created_at: Annotated[AwareDatetime, Field(title="Created At")]
    occurred_at: Annotated[str | None, Field(title="Occurred At")]
    """
    its event time, when a session (or the user) said when what it is about happened or will happen: a day YYYY-MM-DD, an ISO week YYYY-Www, a month YYYY-MM or a year YYYY; null: none was said
    """
    occurred_precision: Annotated[
        Literal["day", "week", "month", "year"] | None,
        Field(title="Occurred Precision"),
    ]
    """
    the size of that period; null with occurred_at
    """
    source: Annotated[
        Literal["utterance", "dreaming", "deep_pass", "user", "episode"],
        Field(title="Source"),
    ]
    """
    what wrote it: a chat utterance, session-end dreaming, the per-user deep pass, the user, or 'episode': a session's account of what happened between the user and the persona (relationship layer, one per session, rewritten when the session resumes)
    """
    session_id: Annotated[UUID | None, Field(title="Session Id")]
    """
    the session it came from
    """
    from_message_id: Annotated[int | None, Field(title="From Message Id")]
    """
    first message of the range it was distilled from
    """
    through_message_id: Annotated[int | None, Field(title="Through Message Id")]
    """
    last message of that range
    """
    model: Annotated[str | None, Field(title="Model")]
    """
    the model that wrote it, if one did
    """
    last_confirmed_at: Annotated[AwareDatetime | None, Field(title="Last Confirmed At")]
    """
    when it was last repeated or confirmed
    """
    mention_count: Annotated[int, Field(title="Mention Count")]
    superseded_at: Annotated[AwareDatetime | None, Field(title="Superseded At")]
    """
    validity end; null while the memory is active
    """
    superseded_by: Annotated[UUID | None, Field(title="Superseded By")]
    """
    the memory that replaced it (null once that one is deleted)
    """
    superseded_reason: Annotated[
        Literal["changed", "duplicate", "reverted", "edited", "outdated"] | None,
        Field(title="Superseded Reason"),
    ]
    """
    changed: a newer fact replaced it; duplicate: merged into its twin; reverted: the user restored an older version; edited: the user edited it (its new version replaced it); outdated: an utterance that stated a fact which changed (superseded_by names that fact)
    """
    supersedes: Annotated[list[UUID], Field(title="Supersedes")]
    """
    ids of the memories this one replaced
    """
    score: Annotated[float, Field(title="Score")]
    """
    what ranks it: similarity + recency + importance + lexical - demotion
    """
    parts: ScoreParts


class SearchResults(BaseModel):
    results: Annotated[list[SearchResult], Field(title="Results")]
    """
    best first
    """


class SessionView(BaseModel):
    id: Annotated[UUID, Field(title="Id")]
    persona_id: Annotated[str, Field(title="Persona Id")]
    created_at: Annotated[AwareDatetime, Field(title="Created At")]
    last_active_at: Annotated[AwareDatetime, Field(title="Last Active At")]
    extracted_at: Annotated[AwareDatetime | None, Field(title="Extracted At")]
    dreaming: DreamingState


class UsageTotals(BaseModel):
    tokens: Annotated[int, Field(title="Tokens")]
    calls: Annotated[int, Field(title="Calls")]
    input_tokens: Annotated[int, Field(title="Input Tokens")]
    output_tokens: Annotated[int, Field(title="Output Tokens")]
    estimated_cost: Annotated[float, Field(title="Estimated Cost")]


class UserUsage(BaseModel):
    user_id: Annotated[str, Field(title="User Id")]
    """
    the user's subject, as the app names them
    """
    tokens: Annotated[int, Field(title="Tokens")]
    """
    what the daily token budget counted
    """
    calls: Annotated[int, Field(title="Calls")]
    input_tokens: Annotated[int, Field(title="Input Tokens")]
    output_tokens: Annotated[int, Field(title="Output Tokens")]
    estimated_cost: Annotated[float, Field(title="Estimated Cost")]
    purposes: Annotated[dict[str, int], Field(title="Purposes")]
    """
    tokens (input and output) per purpose
    """


class Webhook(BaseModel):
    """
    The app's webhook (docs/EVENTS.md "Webhooks"): never its secret.
    """

    url: Annotated[str, Field(title="Url")]
    created_at: Annotated[AwareDatetime, Field(title="Created At")]
    secret_rotated_at: Annotated[AwareDatetime | None, Field(title="Secret Rotated At")]
    """
    when the secret was last rotated (null: never)
    """
    pending: Annotated[int | None, Field(title="Pending")] = 0
    """
    deliveries waiting (a first attempt or a retry)
    """
    dead: Annotated[int | None, Field(title="Dead")] = 0
    """
    deliveries given up on after every attempt: POST /v1/operator/webhook/redrive sends them again
    """


class WebhookSet(BaseModel):
    url: Annotated[str, Field(title="Url")]
    created_at: Annotated[AwareDatetime, Field(title="Created At")]
    secret_rotated_at: Annotated[AwareDatetime | None, Field(title="Secret Rotated At")]
    secret: Annotated[str | None, Field(title="Secret")] = None
    """
    the signing secret (whsec_ and base64 of 32 bytes), only when the webhook was made or its secret rotated: shown this once
    """


class AppUsageReport(BaseModel):
    from_: Annotated[date, Field(alias="from", title="From")]
    to: Annotated[date, Field(title="To")]
    currency: Annotated[str, Field(title="Currency")]
    app: Annotated[str, Field(title="App")]
    users: Annotated[list[UserUsage], Field(title="Users")]
    """
    users with any usage, costliest first
    """
    totals: UsageTotals
    unpriced_models: Annotated[list[str], Field(title="Unpriced Models")]
    """
    models with no configured price: their cost is not in a total
    """


class Appended(BaseModel):
    """
    What ``POST /v1/sessions/{id}/messages`` answers.
    """

    messages: Annotated[list[AppendedMessage], Field(title="Messages")]
    """
    each message of the request, in its order
    """
    utterances: Annotated[int, Field(title="Utterances")]
    """
    user messages this request added to the relationship layer
    """


class Calibration(BaseModel):
    """
    The similarity thresholds and score weights the engine uses for the embedding model (issue 30).
    """

    model: Annotated[str, Field(title="Model")]
    """
    the model they are for: the stored vectors' (the configured embedder's before any vector is stored)
    """
    source: Annotated[
        Literal["env", "calibrated", "shipped", "default"], Field(title="Source")
    ]
    """
    env: every one set in the environment; calibrated: stored by `eros calibrate`; shipped: measured for this model and shipped with the build; default: none for this model, the defaults tuned on e5 (a warning)
    """
    base: Annotated[Literal["calibrated", "shipped", "default"], Field(title="Base")]
    """
    where the values the environment does not set come from
    """
    values: Annotated[dict[str, float], Field(title="Values")]
    """
    dedupe_similarity, demote_similarity, lexical_weight, importance_weight, demote_penalty, recency_weight (recency's lambda), lexical_year_weight, deep_pass_similarity
    """
    sources: Annotated[
        dict[str, Literal["env", "calibrated", "shipped", "default"]],
        Field(title="Sources"),
    ]
    """
    where each value comes from
    """
    sample: Annotated[int, Field(title="Sample")]
    """
    calibrated: the memories it was derived from
    """
    refused: Annotated[str | None, Field(title="Refused")]
    """
    a stored calibration that failed validation (not used), and why
    """
    calibrated_at: Annotated[str | None, Field(title="Calibrated At")]
    """
    calibrated: when `eros calibrate` stored it
    """
    configured_model: Annotated[str, Field(title="Configured Model")]
    """
    the configured embedder's model
    """
    stored_model: Annotated[str | None, Field(title="Stored Model")]
    """
    the model the stored vectors came from (null: none stored yet)
    """
    stored_dimension: Annotated[int | None, Field(title="Stored Dimension")]
    mismatch: Annotated[bool, Field(title="Mismatch")]
    """
    the stored vectors came from another model than the configured embedder's: a re-embedding toward it runs (`reembedding` says how far)
    """
    reembedding: Reembedding | None = None
    """
    while a change of embedder is under way
    """


class DeepHealth(BaseModel):
    status: Annotated[Literal["ok", "failed"], Field(title="Status")]
    """
    failed when any check failed (a warning does not fail)
    """
    checks: Annotated[dict[str, Check], Field(title="Checks")]
    """
    database, schema, chat, extraction, embedder, calibration
    """
    calibration: Calibration | None
    """
    the embedder's similarity thresholds and where they come from (null when the embedder or the database cannot be read)
    """


class ImportConversation(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
    )
    conversation_id: Annotated[
        str, Field(max_length=200, min_length=1, title="Conversation Id")
    ]
    """
    your id for the conversation: importing it again finds its session (stores nothing twice)
    """
    persona_id: Annotated[str, Field(max_length=64, min_length=1, title="Persona Id")]
    messages: Annotated[
        list[ImportedMessage], Field(max_length=20000, min_length=1, title="Messages")
    ]
    """
    in order, OpenAI-style (`role`, `content`, and `created_at` with its time zone); system and tool messages are skipped, other fields ignored
    """


class ImportResult(BaseModel):
    imported: Annotated[list[ImportedConversationView], Field(title="Imported")]
    refused: Annotated[list[ImportRefusal], Field(title="Refused")]
    """
    conversations not imported, each with why; the others were
    """


class Memory(BaseModel):
    """
    A memory as its owner sees it (never its embedding).
    """

    id: Annotated[UUID, Field(title="Id")]
    layer: Annotated[Literal["profile", "relationship"], Field(title="MemoryLayer")]
    """
    Which of the two memory layers a memory is in (not to be confused with the Lambda layer).
    """
    category: Annotated[
        Literal["fact", "preference", "event", "emotion", "relation"] | None,
        Field(title="Category"),
    ]
    content: Annotated[str, Field(title="Content")]
    importance: Annotated[float | None, Field(title="Importance")]
    persona_id: Annotated[str | None, Field(title="Persona Id")]
    """
    the persona of a relationship memory; null in the profile layer
    """
    created_at: Annotated[AwareDatetime, Field(title="Created At")]
    occurred_at: Annotated[str | None, Field(title="Occurred At")]
    """
    its event time, when a session (or the user) said when what it is about happened or will happen: a day YYYY-MM-DD, an ISO week YYYY-Www, a month YYYY-MM or a year YYYY; null: none was said
    """
    occurred_precision: Annotated[
        Literal["day", "week", "month", "year"] | None,
        Field(title="Occurred Precision"),
    ]
    """
    the size of that period; null with occurred_at
    """
    source: Annotated[
        Literal["utterance", "dreaming", "deep_pass", "user", "episode"],
        Field(title="Source"),
    ]
    """
    what wrote it: a chat utterance, session-end dreaming, the per-user deep pass, the user, or 'episode': a session's account of what happened between the user and the persona (relationship layer, one per session, rewritten when the session resumes)
    """
    session_id: Annotated[UUID | None, Field(title="Session Id")]
    """
    the session it came from
    """
    from_message_id: Annotated[int | None, Field(title="From Message Id")]
    """
    first message of the range it was distilled from
    """
    through_message_id: Annotated[int | None, Field(title="Through Message Id")]
    """
    last message of that range
    """
    model: Annotated[str | None, Field(title="Model")]
    """
    the model that wrote it, if one did
    """
    last_confirmed_at: Annotated[AwareDatetime | None, Field(title="Last Confirmed At")]
    """
    when it was last repeated or confirmed
    """
    mention_count: Annotated[int, Field(title="Mention Count")]
    superseded_at: Annotated[AwareDatetime | None, Field(title="Superseded At")]
    """
    validity end; null while the memory is active
    """
    superseded_by: Annotated[UUID | None, Field(title="Superseded By")]
    """
    the memory that replaced it (null once that one is deleted)
    """
    superseded_reason: Annotated[
        Literal["changed", "duplicate", "reverted", "edited", "outdated"] | None,
        Field(title="Superseded Reason"),
    ]
    """
    changed: a newer fact replaced it; duplicate: merged into its twin; reverted: the user restored an older version; edited: the user edited it (its new version replaced it); outdated: an utterance that stated a fact which changed (superseded_by names that fact)
    """
    supersedes: Annotated[list[UUID], Field(title="Supersedes")]
    """
    ids of the memories this one replaced
    """


class MemoryPage(BaseModel):
    memories: Annotated[list[Memory], Field(title="Memories")]
    next_before: Annotated[str | None, Field(title="Next Before")]
    """
    an opaque cursor: pass it as `before` for the next page (it stays valid when the memory it was taken from is deleted); null on the last page
    """


class MemoryWithHistory(BaseModel):
    id: Annotated[UUID, Field(title="Id")]
    layer: Annotated[Literal["profile", "relationship"], Field(title="MemoryLayer")]
    """
    Which of the two memory layers a memory is in (not to be confused with the Lambda layer).
    """
    category: Annotated[
        Literal["fact", "preference", "event", "emotion", "relation"] | None,
        Field(title="Category"),
    ]
    content: Annotated[str, Field(title="Content")]
    importance: Annotated[float | None, Field(title="Importance")]
    persona_id: Annotated[str | None, Field(title="Persona Id")]
    """
    the persona of a relationship memory; null in the profile layer
    """
    created_at: Annotated[AwareDatetime, Field(title="Created At")]
    occurred_at: Annotated[str | None, Field(title="Occurred At")]
    """
    its event time, when a session (or the user) said when what it is about happened or will happen: a day YYYY-MM-DD, an ISO week YYYY-Www, a month YYYY-MM or a year YYYY; null: none was said
    """
    occurred_precision: Annotated[
        Literal["day", "week", "month", "year"] | None,
        Field(title="Occurred Precision"),
    ]
    """
    the size of that period; null with occurred_at
    """
    source: Annotated[
        Literal["utterance", "dreaming", "deep_pass", "user", "episode"],
        Field(title="Source"),
    ]
    """
    what wrote it: a chat utterance, session-end dreaming, the per-user deep pass, the user, or 'episode': a session's account of what happened between the user and the persona (relationship layer, one per session, rewritten when the session resumes)
    """
    session_id: Annotated[UUID | None, Field(title="Session Id")]
    """
    the session it came from
    """
    from_message_id: Annotated[int | None, Field(title="From Message Id")]
    """
    first message of the range it was distilled from
    """
    through_message_id: Annotated[int | None, Field(title="Through Message Id")]
    """
    last message of that range
    """
    model: Annotated[str | None, Field(title="Model")]
    """
    the model that wrote it, if one did
    """
    last_confirmed_at: Annotated[AwareDatetime | None, Field(title="Last Confirmed At")]
    """
    when it was last repeated or confirmed
    """
    mention_count: Annotated[int, Field(title="Mention Count")]
    superseded_at: Annotated[AwareDatetime | None, Field(title="Superseded At")]
    """
    validity end; null while the memory is active
    """
    superseded_by: Annotated[UUID | None, Field(title="Superseded By")]
    """
    the memory that replaced it (null once that one is deleted)
    """
    superseded_reason: Annotated[
        Literal["changed", "duplicate", "reverted", "edited", "outdated"] | None,
        Field(title="Superseded Reason"),
    ]
    """
    changed: a newer fact replaced it; duplicate: merged into its twin; reverted: the user restored an older version; edited: the user edited it (its new version replaced it); outdated: an utterance that stated a fact which changed (superseded_by names that fact)
    """
    supersedes: Annotated[list[UUID], Field(title="Supersedes")]
    """
    ids of the memories this one replaced
    """
    history: Annotated[list[Memory], Field(title="History")]
    """
    every version of this memory (itself included), oldest first: what it replaced and what replaced it, recursively
    """


class NewImport(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
    )
    conversations: Annotated[
        list[ImportConversation],
        Field(max_length=50, min_length=1, title="Conversations"),
    ]
    """
    1 to 50
    """


class PersonaList(BaseModel):
    personas: Annotated[list[PersonaView], Field(title="Personas")]


class RecalledMemory(BaseModel):
    """
    A memory the prompt carried, with the score that put it there. Its text is in the answer only: a stored
    turn keeps ids and numbers, so a memory the user deletes leaves no copy.
    """

    id: Annotated[UUID, Field(title="Id")]
    layer: Annotated[Literal["profile", "relationship"], Field(title="MemoryLayer")]
    """
    Which of the two memory layers a memory is in (not to be confused with the Lambda layer).
    """
    category: Annotated[str | None, Field(title="Category")]
    """
    the profile category; null for a relationship utterance
    """
    content: Annotated[str | None, Field(title="Content")] = None
    """
    the memory's text (null when the turn is replayed)
    """
    occurred_at: Annotated[str | None, Field(title="Occurred At")] = None
    """
    its event time, as the prompt showed it: a day YYYY-MM-DD, an ISO week YYYY-Www, a month YYYY-MM or a year YYYY (null when it has none, and when the turn is replayed)
    """
    occurred_precision: Annotated[
        Literal["day", "week", "month", "year"] | None,
        Field(title="Occurred Precision"),
    ] = None
    score: Annotated[float | None, Field(title="Score")] = None
    """
    what ranked it: similarity + recency + importance + lexical - demotion
    """
    parts: ScoreParts | None = None


class SessionList(BaseModel):
    sessions: Annotated[list[SessionView], Field(title="Sessions")]
    """
    newest first
    """


class TurnResult(BaseModel):
    """
    What a chat turn answers (the route's response model).
    """

    reply: Annotated[str, Field(title="Reply")]
    client_turn_id: Annotated[str, Field(title="Client Turn Id")]
    """
    the turn's id: the client's, or one made for it
    """
    user_message_id: Annotated[int, Field(title="User Message Id")]
    assistant_message_id: Annotated[int, Field(title="Assistant Message Id")]
    recalled: Annotated[list[RecalledMemory], Field(title="Recalled")]
    """
    what the prompt carried, profile first, best first
    """
    model: Annotated[str, Field(title="Model")]
    """
    the model that answered
    """
    usage: Annotated[dict[str, Any] | None, Field(title="Usage")] = None
    """
    the tokens the model reported for the reply (OpenAI's prompt_tokens, completion_tokens, total_tokens): a streamed reply's are what was streamed
    """
    replayed: Annotated[bool | None, Field(title="Replayed")] = False
    """
    true when this is the stored reply of an earlier attempt
    """


class UsageReport(BaseModel):
    from_: Annotated[date, Field(alias="from", title="From")]
    to: Annotated[date, Field(title="To")]
    currency: Annotated[str, Field(title="Currency")]
    daily_token_budget: Annotated[int | None, Field(title="Daily Token Budget")]
    """
    tokens a day the caller may spend (null: no budget)
    """
    days: Annotated[list[DayUsage], Field(title="Days")]
    """
    days with any usage, oldest first
    """
    purposes: Annotated[list[PurposeUsage], Field(title="Purposes")]
    """
    the range per purpose
    """
    totals: UsageTotals
    unpriced_models: Annotated[list[str], Field(title="Unpriced Models")]
    """
    models with no configured price: their cost is not in a total
    """


class ContextResult(BaseModel):
    """
    What ``POST /v1/sessions/{id}/context`` answers.
    """

    memories: Annotated[list[RecalledMemory], Field(title="Memories")]
    """
    what a chat turn's prompt would carry for this message, profile first, best first, each with its score and parts
    """
    prompt: Annotated[str, Field(title="Prompt")]
    """
    the same memories as the chat turn renders them for its model: the system prompt's memory section, ready to follow your persona's own system prompt (tagged blocks, each memory on one line, with the rule that they are data); empty when nothing was recalled
    """
    message: AppendedMessage | None
    """
    with `store: true`, the user's message as stored (`stored: false` when an earlier request with its client_message_id stored it); null otherwise
    """


class MessageView(BaseModel):
    id: Annotated[int, Field(title="Id")]
    role: Annotated[Literal["user", "assistant"], Field(title="Role")]
    content: Annotated[str, Field(title="Content")]
    client_turn_id: Annotated[str | None, Field(title="Client Turn Id")]
    sent_at: Annotated[AwareDatetime, Field(title="Sent At")]
    recalled: Annotated[list[RecalledMemory] | None, Field(title="Recalled")]
    """
    a reply's: the memories its prompt carried, with their scores (their text is the memories' own: look them up by id); null for the user's messages
    """


class MessagePage(BaseModel):
    messages: Annotated[list[MessageView], Field(title="Messages")]
    """
    newest first
    """
    next_before: Annotated[int | None, Field(title="Next Before")]
    """
    the last message's id: pass it as `before` for the next (older) page; null on the last
    """
