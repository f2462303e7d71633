"""The memory API as MCP tools, for agents and assistants: a thin adapter over ``AsyncClient`` built on the official
MCP Python SDK (``pip install 'eros-client[mcp]'``).

The server holds no memory and no secret of its own: every tool is one API call made with the user's bearer
token, so the same server works against the local stack (``eros mcp USER``) and a deployed API (``eros-mcp`` with
``EROS_URL`` and ``EROS_TOKEN``), and a token only ever reaches its own user's memories. An app's server may run it
with one of the app's API keys instead (``EROS_API_KEY`` and ``EROS_USER``): it then acts for that user of the key's
app, through the API's ``/server`` routes. Answers are the API's own
JSON (``structuredContent``, and the same JSON as text). A failure is a tool error (``isError``) whose JSON is
``{"code", "message", ...}``: the API's stable ``code`` when the API refused the call; ``invalid_request`` (the
API's code for the same) when the arguments do not fit the tool's input schema; ``api_unreachable`` when the API
could not be reached. The server keeps serving after any of them.

Over stdio only: the deployed API's front door (API Gateway's HTTP API in front of Lambda) cannot hold an MCP
streamable-HTTP session (clients/python/README.md says why, and how to use this server against a deployment).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal
from uuid import UUID

import httpx
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp_types import CallToolResult, InputRequiredResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field, ValidationError

from . import models
from ._client import ApiError, AsyncClient, Token

Category = Literal["fact", "preference", "event", "emotion", "relation"]
Layer = Literal["profile", "relationship"]
MemoryId = Annotated[UUID, Field(description="a memory's id (from search_memories or list_memories)")]
Text = Annotated[str, Field(min_length=1, max_length=4000)]

INSTRUCTIONS = """Long-term memory of one user (the user this server acts for), as the eros memory engine keeps it.
Two layers: 'profile' (facts, preferences, events, emotions, relations about the user, across every companion) and
'relationship' (what was said to one persona, and episodes of each session). Search before you answer from memory;
add what the user states about themselves; edit a memory the user corrects (the old version stays in its history);
forget one the user wants gone. Errors are JSON: branch on "code" (the API's stable codes)."""

READ = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False)
DELETE = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False)


class Refused(Exception):
    """Arguments that fit the schema but not each other: answered as the API's 422 would be."""

    def __init__(self, message: str):
        super().__init__(message)
        self.body = {"code": "invalid_request", "message": message}


class Forgotten(BaseModel):
    """What forget_memory answers: the memory asked for, and every row deleted (its versions, newest first)."""
    id: UUID
    deleted: list[UUID]


def _error(body: dict[str, Any]) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=json.dumps(body, ensure_ascii=False))],
                          structured_content=body, is_error=True)


def _api_error(error: ApiError) -> dict[str, Any]:
    body: dict[str, Any] = {"code": error.code, "message": error.message or f"the API answered {error.status}",
                            "status": error.status, "retryable": error.retryable}
    if error.retry_after is not None:
        body["retry_after"] = error.retry_after
    for key in ("errors", "limit"):  # the fields refused (422), the limit reached (429)
        if key in error.body:
            body[key] = error.body[key]
    return body


def _invalid_arguments(tool: str, error: ValidationError) -> dict[str, Any]:
    """The SDK's refusal of arguments that do not fit the input schema, in the shape of the API's 422."""
    fields = [{"field": ".".join(str(part) for part in e["loc"]) or "(arguments)", "problem": e["msg"]}
              for e in error.errors(include_url=False, include_input=False)]
    listed = "; ".join(f"{f['field']}: {f['problem']}" for f in fields)
    return {"code": "invalid_request", "message": f"{tool} refused its arguments: {listed}", "errors": fields}


class MemoryServer(MCPServer[Any]):
    """MCPServer whose tool failures are JSON with a stable ``code`` (see the module's docstring)."""

    def __init__(self, api: AsyncClient, base_url: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.api, self.base_url = api, base_url

    async def call_tool(self, name: str, arguments: dict[str, Any],
                        context: Context[Any, Any] | None = None) -> CallToolResult | InputRequiredResult:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:  # the SDK wraps what a tool raised (its __cause__), and refuses bad arguments
            cause = exc.__cause__
            if isinstance(cause, Refused):
                return _error(cause.body)
            if isinstance(cause, ApiError):
                return _error(_api_error(cause))
            if isinstance(cause, ValidationError) and not isinstance(exc, UnexpectedToolError):
                return _error(_invalid_arguments(name, cause))  # the arguments (inside a tool: a crash)
            if isinstance(cause, httpx.TransportError):
                return _error({"code": "api_unreachable", "retryable": True,
                               "message": f"cannot reach the eros API at {self.base_url} ({type(cause).__name__})"})
            raise


def build_server(api: AsyncClient, base_url: str) -> MemoryServer:
    """The MCP server over ``api`` (an ``AsyncClient`` with the user's token); closed with the server."""

    @asynccontextmanager
    async def lifespan(_: MCPServer[Any]) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await api.aclose()

    server = MemoryServer(api, base_url, name="eros-memory", title="eros memory", instructions=INSTRUCTIONS,
                          lifespan=lifespan, log_level="WARNING")
    _memory_tools(server, api)
    _session_tools(server, api)
    return server


def _edit(content: str | None, category: str | None, importance: float | None, occurred_at: str | None,
          clear_occurred_at: bool) -> dict[str, Any]:
    """The PATCH body of edit_memory: what was given; an event time is cleared only when asked for."""
    changes: dict[str, Any] = {k: v for k, v in (("content", content), ("category", category),
                                                  ("importance", importance), ("occurred_at", occurred_at))
                               if v is not None}
    if clear_occurred_at:
        if occurred_at is not None:
            raise Refused("give occurred_at or clear_occurred_at, not both")
        changes["occurred_at"] = None
    return changes


async def _forget(api: AsyncClient, memory_id: UUID, include_history: bool) -> Forgotten:
    """Delete the memory, or every version of it, newest first."""
    versions = [memory_id]
    if include_history:
        versions = [v.id for v in reversed((await api.get_memory(memory_id)).history)] or [memory_id]
    deleted = []
    for version in versions:
        try:
            await api.delete_memory(version)
        except ApiError as error:  # deleted meanwhile (another call, a merge): gone is what was asked
            if error.code != "not_found" or version == memory_id:
                raise
        else:
            deleted.append(version)
    return Forgotten(id=memory_id, deleted=deleted)


def _memory_tools(server: MemoryServer, api: AsyncClient) -> None:
    @server.tool(annotations=READ)
    async def search_memories(
            query: Annotated[Text, Field(description="what to look for, in plain words")],
            category: Annotated[Category | None, Field(description="only profile memories of this category")] = None,
            persona_id: Annotated[str | None, Field(
                min_length=1, max_length=64,
                description="also search what the user said to this persona (its relationship memories)")] = None,
            limit: Annotated[int, Field(ge=1, le=50, description="how many results at most")] = 10,
    ) -> models.SearchResults:
        """Search the user's memories by meaning, best first, as a chat turn recalls them: each result with its
        score and the score's parts (similarity, recency, importance, lexical)."""
        return await api.search_memories(query, category=category, persona_id=persona_id, k=limit)

    @server.tool(annotations=READ)
    async def list_memories(
            layer: Annotated[Layer | None, Field(description="one layer; default both")] = None,
            category: Annotated[Category | None, Field(description="one category; default every one")] = None,
            limit: Annotated[int, Field(ge=1, le=500, description="memories on this page")] = 50,
            cursor: Annotated[str | None, Field(
                min_length=1, max_length=200,
                description="the next_before of the previous page, for the next one")] = None,
            include_superseded: Annotated[bool, Field(
                description="also list older versions that were replaced (history)")] = False,
    ) -> models.MemoryPage:
        """List the user's current memories, newest first, a page at a time (next_before: the next page's
        cursor, null on the last page)."""
        return await api.list_memories(layer=layer, category=category, limit=limit, before=cursor,
                                       include="superseded" if include_superseded else None)

    @server.tool(annotations=WRITE)
    async def add_memory(
            content: Annotated[Text, Field(description="the memory, one fact in a sentence")],
            category: Annotated[Category, Field(description="what kind of memory it is")],
            importance: Annotated[float | None, Field(ge=0, le=1, description="0..1; default 0.8")] = None,
            occurred_at: Annotated[str | None, Field(
                description="when what it is about happened or will: YYYY-MM-DD, YYYY-Www, YYYY-MM or YYYY")] = None,
    ) -> models.MemoryWithHistory:
        """Remember something the user states about themselves (a profile memory, source 'user')."""
        return await api.add_memory(content, category, importance=importance, occurred_at=occurred_at)

    @server.tool(annotations=WRITE)
    async def edit_memory(
            memory_id: MemoryId,
            content: Annotated[Text | None, Field(description="the corrected text; omitted: kept")] = None,
            category: Annotated[Category | None, Field(description="omitted: kept")] = None,
            importance: Annotated[float | None, Field(ge=0, le=1, description="omitted: kept")] = None,
            occurred_at: Annotated[str | None, Field(
                description="the new event time (YYYY-MM-DD, YYYY-Www, YYYY-MM or YYYY); omitted: kept")] = None,
            clear_occurred_at: Annotated[bool, Field(description="remove the event time")] = False,
    ) -> models.MemoryWithHistory:
        """Correct a memory: its new version replaces it (reason 'edited'), and the old one stays in its history.
        Answers the new version with its history."""
        return await api.edit_memory(memory_id, **_edit(content, category, importance, occurred_at,
                                                         clear_occurred_at))

    @server.tool(annotations=DELETE)
    async def forget_memory(
            memory_id: MemoryId,
            include_history: Annotated[bool, Field(
                description="also delete every other version of it (what it replaced and what replaced it); "
                            "false: this version alone, older ones stay history")] = True,
    ) -> Forgotten:
        """Forget a memory for good: by default the whole memory, every version of it (what a user who asks to
        be forgotten means); answers every id deleted."""
        return await _forget(api, memory_id, include_history)

    @server.tool(annotations=READ)
    async def memory_history(memory_id: MemoryId) -> models.MemoryWithHistory:
        """A memory with every version of it, oldest first (history): what it replaced and what replaced it,
        with why (superseded_reason: changed, duplicate, reverted, edited, outdated)."""
        return await api.get_memory(memory_id)

    @server.tool(annotations=WRITE)
    async def restore_memory(
            memory_id: Annotated[UUID, Field(description="an older version's id (from memory_history)")],
    ) -> models.MemoryWithHistory:
        """Undo a change: an older version of a memory is current again ("I still live in Berlin"), and the
        version that had replaced it becomes history (reason 'reverted'). Refused (memory_active) when the memory
        is current already."""
        return await api.restore_memory(memory_id)


def _session_tools(server: MemoryServer, api: AsyncClient) -> None:
    @server.tool(annotations=READ)
    async def list_sessions() -> models.SessionList:
        """The user's chat sessions, newest first (each with its persona): a session id for get_context."""
        return await api.list_sessions()

    @server.tool(annotations=WRITE)
    async def start_session(
            persona_id: Annotated[str, Field(min_length=1, max_length=64,
                                             description="the persona (companion) to talk with, e.g. 'luna'")],
    ) -> models.CreatedSession:
        """Start a chat session with a persona: its id is what get_context needs."""
        return await api.create_session(persona_id)

    @server.tool(annotations=READ)
    async def get_context(
            session_id: Annotated[UUID, Field(description="the session the message is sent in")],
            message: Annotated[Text, Field(description="the user's message to answer")],
    ) -> models.ContextResult:
        """What a chat turn would put in front of the model for this message: the recalled memories (profile
        first, best first, each with score and parts) and 'prompt', the system prompt's memory section. Stores
        nothing."""
        return await api.get_context(session_id, message)


def _file_reader(variable: str, path: str) -> Callable[[], str]:
    def read() -> str:
        with open(path, encoding="utf-8") as file:
            return file.read().strip()
    try:
        read()
    except OSError as exc:
        raise SystemExit(f"eros-mcp: {variable} {path!r} cannot be read ({exc.strerror})") from None
    return read


def _token_from_env(environ: os._Environ[str] | dict[str, str]) -> Token:
    token, path = environ.get("EROS_TOKEN", "").strip(), environ.get("EROS_TOKEN_FILE", "").strip()
    if token and path:
        raise SystemExit("eros-mcp: set EROS_TOKEN or EROS_TOKEN_FILE, not both")
    if token:
        return token
    if path:
        return _file_reader("EROS_TOKEN_FILE", path)  # read on every call: a token refreshed in the file is used
    raise SystemExit("eros-mcp: no token: set EROS_TOKEN (the user's bearer token) or EROS_TOKEN_FILE")


def credentials_from_env(environ: os._Environ[str] | dict[str, str]) -> dict[str, Any]:
    """The ``AsyncClient`` credentials the environment names: a user's token (``EROS_TOKEN`` or ``EROS_TOKEN_FILE``,
    read on each call), or an app's API key (``EROS_API_KEY`` or ``EROS_API_KEY_FILE``, read once) with the user it
    acts for (``EROS_USER``, the app's id for the user). Exactly one of the two; anything else is refused."""
    def given(name: str) -> str:
        return environ.get(name, "").strip()

    tokened = bool(given("EROS_TOKEN") or given("EROS_TOKEN_FILE"))
    key, key_path, user = given("EROS_API_KEY"), given("EROS_API_KEY_FILE"), given("EROS_USER")
    if tokened and (key or key_path):
        raise SystemExit("eros-mcp: set a user's token (EROS_TOKEN or EROS_TOKEN_FILE) or an app's API key "
                         "(EROS_API_KEY or EROS_API_KEY_FILE, with EROS_USER), not both")
    if not key and not key_path:
        if not tokened:
            raise SystemExit("eros-mcp: no credential: set EROS_TOKEN (the user's bearer token) or EROS_TOKEN_FILE,"
                             " or an app's EROS_API_KEY (or EROS_API_KEY_FILE) with EROS_USER")
        if user:
            raise SystemExit("eros-mcp: EROS_USER goes with an app's EROS_API_KEY: a token names its own user "
                             "(unset EROS_USER)")
        return {"token": _token_from_env(environ)}
    if key and key_path:
        raise SystemExit("eros-mcp: set EROS_API_KEY or EROS_API_KEY_FILE, not both")
    if not user:
        raise SystemExit("eros-mcp: an app's API key acts for a user of the app: set EROS_USER (the app's id for "
                         "the user, its tokens' subject)")
    return {"api_key": key or _file_reader("EROS_API_KEY_FILE", key_path)(), "user": user}


def serve(base_url: str, token: Token | None = None, *, api_key: str | None = None, user: str | None = None,
          timeout: float = 30.0) -> None:
    """Serve the tools over stdio until the client closes stdin, with the user's ``token``, or an app's
    ``api_key`` acting for ``user``. A retryable refusal is tried again only when the API asks for a short wait (at
    most 10 s): an agent waiting on a tool is better told ``retry_after``."""
    api = AsyncClient(base_url, token, api_key=api_key, user=user, timeout=timeout, max_wait=10.0)
    build_server(api, base_url).run("stdio")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="eros-mcp", description="The eros memory API as MCP tools over stdio, for one user: the token's. "
                                     "EROS_TOKEN (or EROS_TOKEN_FILE, read on each call) is that user's token; "
                                     "or, for an app's server, EROS_API_KEY (or EROS_API_KEY_FILE) is one of the "
                                     "app's API keys and EROS_USER the user of the app it acts for.")
    parser.add_argument("--url", default=os.environ.get("EROS_URL", ""),
                        help="the API's base URL (EROS_URL): a stack's ApiUrl, or http://127.0.0.1:3000")
    args = parser.parse_args(argv)
    if not args.url.lower().startswith(("http://", "https://")):
        parser.error(f"--url (or EROS_URL) must be the API's http:// or https:// address (got {args.url!r})")
    serve(args.url.rstrip("/"), **credentials_from_env(os.environ))
    return 0


if __name__ == "__main__":
    sys.exit(main())
