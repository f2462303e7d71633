"""`eros mcp` (clients/python/eros_client/mcp.py): the memory API as MCP tools over stdio, driven by the official
MCP SDK's own client against `eros mcp` (and `eros-mcp`, the deployed-API entry) run as subprocesses against a
real local stack: the tools and their schemas, a memory's life through them, the context for a message, one
user's token never reaching another's memories, and bad input answered as tool errors with the API's code while
the server keeps serving."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp_types import CallToolResult

# Subprocesses: the MCP server, over stdio.
pytestmark = pytest.mark.e2e

BIN = Path(sys.executable).parent
TOOLS = {"search_memories", "list_memories", "add_memory", "edit_memory", "forget_memory", "memory_history",
         "restore_memory", "list_sessions", "start_session", "get_context"}


@asynccontextmanager
async def connected(args: list[str], *, command: str = "eros", env: dict[str, str] | None = None,
                    errlog: Any = None) -> AsyncIterator[ClientSession]:
    """An SDK client session with the server started as an assistant starts it (command, args, env)."""
    params = StdioServerParameters(command=str(BIN / command), args=args, env={**os.environ, **(env or {})})
    async with stdio_client(params, errlog=errlog or sys.stderr) as (read, write), \
            ClientSession(read, write, read_timeout_seconds=60) as session:
        await session.initialize()
        await session.list_tools()  # the client validates answers against the output schemas it listed
        yield session


def run(args: list[str], body: Callable[[ClientSession], Awaitable[None]], **kwargs: Any) -> None:
    async def go() -> None:
        async with connected(args, **kwargs) as session:
            await body(session)
    asyncio.run(go())


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    assert isinstance(result, CallToolResult)
    assert not result.is_error, f"{tool} failed: {result.content}"
    assert result.structured_content is not None
    return result.structured_content


async def refused(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool error: its JSON (structured, and the same as text, for models that read only text)."""
    import json

    result = await session.call_tool(tool, arguments)
    assert isinstance(result, CallToolResult)
    assert result.is_error, f"{tool} answered {result.structured_content}"
    assert result.structured_content is not None
    assert json.loads(result.content[0].text) == result.structured_content  # type: ignore[union-attr]
    assert result.structured_content["code"] and result.structured_content["message"]
    return result.structured_content


def ids(found: dict[str, Any]) -> list[str]:
    return [r["id"] for r in found["results"]]


@pytest.fixture
def stack(providers, local_server):
    return local_server


def test_the_tools_are_listed_with_typed_schemas_and_output_schemas(stack):
    async def body(session: ClientSession) -> None:
        listed = {t.name: t for t in (await session.list_tools()).tools}
        assert set(listed) == TOOLS
        for tool in listed.values():
            assert tool.description and len(tool.description) > 40, tool.name
            assert tool.output_schema is not None, tool.name  # structured JSON, described
        search = listed["search_memories"].input_schema
        assert search["required"] == ["query"]
        assert search["properties"]["query"]["type"] == "string" and search["properties"]["query"]["minLength"] == 1
        assert search["properties"]["limit"]["type"] == "integer" and search["properties"]["limit"]["maximum"] == 50
        categories = search["properties"]["category"]["anyOf"][0]["enum"]
        assert categories == ["fact", "preference", "event", "emotion", "relation"]
        assert listed["add_memory"].input_schema["required"] == ["content", "category"]
        for name in ("edit_memory", "forget_memory", "memory_history", "restore_memory"):
            assert listed[name].input_schema["properties"]["memory_id"]["format"] == "uuid"
        assert listed["get_context"].input_schema["required"] == ["session_id", "message"]
        assert listed["search_memories"].annotations.read_only_hint is True  # type: ignore[union-attr]
        assert listed["forget_memory"].annotations.destructive_hint is True  # type: ignore[union-attr]
        assert "results" in listed["search_memories"].output_schema["properties"]  # type: ignore[index]
    run(["mcp", "alice", "--url", stack.url], body)


def test_a_memory_is_added_found_edited_with_history_and_forgotten_through_the_tools(stack):
    async def body(session: ClientSession) -> None:
        added = await call(session, "add_memory", content="Plays the cello in a quartet", category="fact",
                           occurred_at="2019")
        memory = added["id"]
        assert added["source"] == "user" and added["layer"] == "profile" and added["occurred_at"] == "2019"
        assert memory in ids(await call(session, "search_memories", query="Plays the cello in a quartet"))
        assert memory in ids(await call(session, "search_memories", query="Plays the cello in a quartet",
                                        category="fact", limit=3))
        assert memory not in ids(await call(session, "search_memories", query="Plays the cello in a quartet",
                                            category="preference"))

        edited = await call(session, "edit_memory", memory_id=memory, content="Plays the viola in a quartet",
                            clear_occurred_at=True)
        assert edited["id"] != memory and edited["content"] == "Plays the viola in a quartet"
        assert edited["occurred_at"] is None
        history = await call(session, "memory_history", memory_id=edited["id"])
        versions = [(v["id"], v["content"], v["superseded_reason"]) for v in history["history"]]
        assert versions == [(memory, "Plays the cello in a quartet", "edited"),
                            (edited["id"], "Plays the viola in a quartet", None)]
        page = await call(session, "list_memories", layer="profile")
        assert [m["id"] for m in page["memories"]] == [edited["id"]] and page["next_before"] is None
        everything = await call(session, "list_memories", include_superseded=True)
        assert {m["id"] for m in everything["memories"]} == {memory, edited["id"]}

        forgotten = await call(session, "forget_memory", memory_id=edited["id"])
        assert forgotten == {"id": edited["id"], "deleted": [edited["id"], memory]}  # every version, newest first
        assert await call(session, "list_memories", include_superseded=True) == {"memories": [], "next_before": None}
        found = await call(session, "search_memories", query="Plays the viola in a quartet")
        assert not {memory, edited["id"]} & set(ids(found))
        gone = await refused(session, "memory_history", memory_id=memory)  # the history went with it
        assert (gone["code"], gone["status"]) == ("not_found", 404)

        # An edit undone: the older version is current again, the newer one history ('reverted').
        old = (await call(session, "add_memory", content="Lives in Lyon", category="fact"))["id"]
        new = (await call(session, "edit_memory", memory_id=old, content="Lives in Nantes"))["id"]
        restored = await call(session, "restore_memory", memory_id=old)
        assert (restored["id"], restored["superseded_at"]) == (old, None)
        assert (await call(session, "memory_history", memory_id=new))["superseded_reason"] == "reverted"
        again = await refused(session, "restore_memory", memory_id=old)
        assert (again["code"], again["status"]) == ("memory_active", 409)
        # include_history=false: the API's own delete, that version alone; the other one stays.
        assert (await call(session, "forget_memory", memory_id=new, include_history=False))["deleted"] == [new]
        kept = await call(session, "memory_history", memory_id=old)
        assert kept["superseded_at"] is None and [v["id"] for v in kept["history"]] == [old]
    run(["mcp", "alice", "--url", stack.url], body)


def test_the_context_tool_answers_what_a_turn_would_put_before_the_model(stack):
    async def body(session: ClientSession) -> None:
        fact = await call(session, "add_memory", content="Is allergic to peanuts", category="fact")
        session_id = (await call(session, "start_session", persona_id="luna"))["id"]
        assert session_id in [s["id"] for s in (await call(session, "list_sessions"))["sessions"]]
        # (A memory that repeats the message word for word is not put in front of the model again.)
        context = await call(session, "get_context", session_id=session_id, message="Can I eat peanuts? Allergic?")
        recalled = {m["id"]: m for m in context["memories"]}
        assert fact["id"] in recalled and recalled[fact["id"]]["score"] > 0
        assert "Is allergic to peanuts" in context["prompt"]
        assert context["message"] is None  # stores nothing: the messages of the session stay empty
        assert stack.client("alice").get(f"/v1/sessions/{session_id}/messages").json()["messages"] == []
        unknown = await refused(session, "get_context", session_id=str(uuid.uuid4()), message="hello")
        assert unknown["code"] == "not_found"
        persona = await refused(session, "start_session", persona_id="nobody-here")
        assert persona["code"] == "not_found"
    run(["mcp", "alice", "--url", stack.url], body)


def test_a_token_for_bob_never_reaches_alices_memories_through_the_tools(stack):
    secret = "Keeps the spare key under the blue flowerpot"

    async def go() -> None:
        async with connected(["mcp", "alice", "--url", stack.url]) as alice, \
                connected(["mcp", "bob", "--url", stack.url]) as bob:
            memory = (await call(alice, "add_memory", content=secret, category="fact"))["id"]
            session_id = (await call(alice, "start_session", persona_id="luna"))["id"]

            assert memory not in ids(await call(bob, "search_memories", query=secret))
            assert await call(bob, "list_memories", include_superseded=True) == {"memories": [], "next_before": None}
            for tool, arguments in (("memory_history", {"memory_id": memory}),
                                    ("edit_memory", {"memory_id": memory, "content": "Bob was here"}),
                                    ("forget_memory", {"memory_id": memory}),
                                    ("get_context", {"session_id": session_id, "message": secret})):
                answer = await refused(bob, tool, **arguments)
                assert answer["code"] == "not_found", tool  # the same answer as an id that never existed
                assert secret not in str(answer)
            assert (await call(bob, "list_sessions"))["sessions"] == []

            # Alice's memory is untouched by bob's attempts.
            kept = await call(alice, "memory_history", memory_id=memory)
            assert kept["content"] == secret and len(kept["history"]) == 1
            assert memory in ids(await call(alice, "search_memories", query=secret))
    asyncio.run(go())


def test_bad_input_is_answered_as_tool_errors_with_the_apis_code_and_the_server_keeps_serving(stack):
    async def body(session: ClientSession) -> None:
        unknown = await refused(session, "memory_history", memory_id=str(uuid.uuid4()))
        assert (unknown["code"], unknown["status"], unknown["retryable"]) == ("not_found", 404, False)
        assert (await refused(session, "forget_memory", memory_id=str(uuid.uuid4())))["code"] == "not_found"

        empty = await refused(session, "search_memories", query="")  # refused by the tool's input schema
        assert empty["code"] == "invalid_request" and empty["errors"][0]["field"] == "query"
        blank = await refused(session, "search_memories", query="   ")  # passes the schema; the API refuses it
        assert (blank["code"], blank["status"]) == ("invalid_request", 422)
        assert blank["errors"][0]["field"].endswith("query")

        for tool, arguments, field in (
                ("search_memories", {"query": "cello", "limit": "many"}, "limit"),
                ("search_memories", {"query": "cello", "limit": 51}, "limit"),
                ("search_memories", {"query": "cello", "category": "colour"}, "category"),
                ("list_memories", {"layer": "dreams"}, "layer"),
                ("add_memory", {"content": "Likes tea"}, "category"),
                ("add_memory", {"content": "Likes tea", "category": "preference", "importance": 7}, "importance"),
                ("memory_history", {"memory_id": 42}, "memory_id"),
                ("memory_history", {"memory_id": "not-an-id"}, "memory_id"),
                ("get_context", {"session_id": str(uuid.uuid4())}, "message")):
            answer = await refused(session, tool, **arguments)
            assert answer["code"] == "invalid_request", (tool, arguments)
            assert [e["field"] for e in answer["errors"]] == [field], (tool, arguments)
            assert field in answer["message"]

        # Fits the schema, refused by the API: its code and the field it names.
        when = await refused(session, "add_memory", content="Likes tea", category="preference",
                             occurred_at="someday")
        assert (when["code"], when["status"]) == ("invalid_request", 422) and "occurred_at" in str(when["errors"])
        memory = (await call(session, "add_memory", content="Likes tea", category="preference"))["id"]
        both = await refused(session, "edit_memory", memory_id=memory, occurred_at="2020", clear_occurred_at=True)
        assert both["code"] == "invalid_request"
        nothing = await refused(session, "edit_memory", memory_id=memory)  # no change asked for
        assert (nothing["code"], nothing["status"]) == ("invalid_request", 422)
        unknown_tool = await session.call_tool("drop_database", {})
        assert isinstance(unknown_tool, CallToolResult) and unknown_tool.is_error

        # After all of that, the same server still answers.
        assert memory in ids(await call(session, "search_memories", query="Likes tea"))
    run(["mcp", "alice", "--url", stack.url], body)


def test_a_spend_limit_is_a_tool_error_with_when_to_try_again(stack, env):
    env(TURNS_PER_MINUTE=1)  # a search embeds its query: it counts as a turn

    async def body(session: ClientSession) -> None:
        await call(session, "search_memories", query="cello")
        # The window is a fixed minute: a second search may fall into the next one, a third cannot also.
        answer = await session.call_tool("search_memories", {"query": "viola"})
        assert isinstance(answer, CallToolResult)
        limited = await refused(session, "search_memories", query="viola") if not answer.is_error \
            else answer.structured_content  # Retry-After up to 60 s: told at once, not waited for
        assert limited is not None
        assert (limited["code"], limited["status"], limited["retryable"]) == ("rate_limited", 429, True)
        assert 0 < limited["retry_after"] <= 60 and limited["limit"]
        assert (await call(session, "list_memories"))["memories"] == []  # reads are not limited
    run(["mcp", "alice", "--url", stack.url], body)


def test_eros_mcp_against_an_api_with_a_users_token_refuses_garbage_and_expired_ones(stack):
    """`eros-mcp` is the entry for a deployed API: EROS_URL and the user's EROS_TOKEN (or a file with it)."""
    from eros.config import settings
    from eros_dev.tokens import issue_token, local_jwt_key

    good = issue_token("carol", settings(), local_jwt_key())
    expired = issue_token("carol", settings(), local_jwt_key(), ttl_secs=-60)

    async def works(session: ClientSession) -> None:
        added = await call(session, "add_memory", content="Grows tomatoes on the balcony", category="fact")
        assert added["id"] in ids(await call(session, "search_memories", query="Grows tomatoes on the balcony"))

    run([], works, command="eros-mcp", env={"EROS_URL": stack.url, "EROS_TOKEN": good})
    assert [m["content"] for m in stack.client("carol").get("/v1/memories").json()["memories"]] == \
        ["Grows tomatoes on the balcony"]

    async def unauthorized(session: ClientSession) -> None:
        for _ in range(2):  # answered, and answered again: the server survives
            answer = await refused(session, "search_memories", query="tomatoes")
            assert (answer["code"], answer["status"]) == ("unauthorized", 401)
            assert (await refused(session, "list_memories"))["code"] == "unauthorized"

    for token in ("garbage", expired):
        run([], unauthorized, command="eros-mcp", env={"EROS_URL": stack.url, "EROS_TOKEN": token})

    with tempfile.NamedTemporaryFile("w", suffix=".jwt") as file:  # a token file, read on each call
        file.write(expired)
        file.flush()

        async def refreshed(session: ClientSession) -> None:
            assert (await refused(session, "list_memories"))["code"] == "unauthorized"
            Path(file.name).write_text(good)
            assert len((await call(session, "list_memories"))["memories"]) == 1
        run([], refreshed, command="eros-mcp", env={"EROS_URL": stack.url, "EROS_TOKEN_FILE": file.name})


@pytest.fixture
def acme(stack, db):
    """A second app, "acme", with a persona of its own and one API key for its server (as `eros apps create` and
    `eros keys create` make them); the first app's alice has a memory of her own."""
    from eros import apps
    from eros.store import apps as app_store
    from eros.store import personas as persona_store

    app_store.create("acme", "Acme", {}, db)
    persona_store.keep_app("acme", "nova", "Nova", "", "You are Nova, a patient tutor.")
    secret = apps.new_key()
    app_store.add_key("acme", "assistant", secret[:apps.KEY_SHOWN], apps.key_hash(secret), db)
    default_alice = stack.client("alice").post("/v1/memories", json={"content": "Lives in Quito", "category": "fact"})
    assert default_alice.status_code == 201, default_alice.text
    return secret


async def _acmes_alice(session: ClientSession) -> str:
    """What acme's alice sees through the tools: her own memory, none of the first app's alice's, and acme's
    persona (not the first app's). Her memory's id."""
    added = await call(session, "add_memory", content="Lives in Lisbon", category="fact")
    assert [m["content"] for m in (await call(session, "list_memories"))["memories"]] == ["Lives in Lisbon"]
    found = await call(session, "search_memories", query="Lives in Quito")
    assert "Lives in Quito" not in str(found)
    assert (await call(session, "start_session", persona_id="nova"))["persona_id"] == "nova"
    assert (await refused(session, "start_session", persona_id="luna"))["code"] == "not_found"
    return added["id"]


def _alices(db) -> dict[str, list[str]]:
    rows = db.execute("SELECT user_id, content FROM engine.companion_memories WHERE source = 'user'").fetchall()
    by_key: dict[str, list[str]] = {}
    for row in rows:
        by_key.setdefault(row["user_id"], []).append(row["content"])
    return by_key


def test_eros_mcp_with_an_apps_api_key_acts_for_that_apps_user_alone(stack, acme, db):
    """`eros-mcp` run by an app's server: EROS_API_KEY and EROS_USER reach that user of the key's app through the
    /server routes, and nothing of the first app's user of the same subject."""
    run([], _acmes_alice, command="eros-mcp", env={"EROS_URL": stack.url, "EROS_API_KEY": acme, "EROS_USER": "alice"})
    assert _alices(db) == {"alice": ["Lives in Quito"], "acme\x1falice": ["Lives in Lisbon"]}
    with tempfile.NamedTemporaryFile("w", suffix=".key") as file:  # the key in a file
        file.write(acme + "\n")
        file.flush()

        async def sees(session: ClientSession) -> None:
            assert [m["content"] for m in (await call(session, "list_memories"))["memories"]] == ["Lives in Lisbon"]
        run([], sees, command="eros-mcp", env={"EROS_URL": stack.url, "EROS_API_KEY_FILE": file.name,
                                               "EROS_USER": "alice"})

    async def unauthorized(session: ClientSession) -> None:  # not a live key: every tool says so
        assert (await refused(session, "list_memories"))["code"] == "unauthorized"
    other = acme[:-1] + ("y" if acme.endswith("x") else "x")
    run([], unauthorized, command="eros-mcp", env={"EROS_URL": stack.url, "EROS_API_KEY": other, "EROS_USER": "alice"})


def test_eros_mcp_for_a_user_of_another_app_with_app(stack, acme, db):
    run(["mcp", "alice", "--app", "acme", "--url", stack.url], _acmes_alice)
    assert _alices(db) == {"alice": ["Lives in Quito"], "acme\x1falice": ["Lives in Lisbon"]}


def test_eros_mcp_refuses_an_app_the_stack_does_not_serve_or_that_is_not_an_app_id(stack):
    import subprocess

    unknown = subprocess.run([str(BIN / "eros"), "mcp", "alice", "--app", "globex", "--url", stack.url],
                             capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert unknown.returncode == 1 and not unknown.stdout
    assert "refused the token" in unknown.stderr and "'globex'" in unknown.stderr, unknown.stderr
    bad = subprocess.run([str(BIN / "eros"), "mcp", "alice", "--app", "Not An App", "--url", stack.url],
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert bad.returncode == 2 and "not an app id" in bad.stderr and not bad.stdout


def test_eros_mcp_without_the_stack_says_so_and_answers_api_unreachable(tmp_path):
    import socket

    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    log = tmp_path / "stderr.txt"

    async def body(session: ClientSession) -> None:
        answer = await refused(session, "list_memories")
        assert answer["code"] == "api_unreachable" and url in answer["message"] and answer["retryable"] is True
        assert (await refused(session, "list_sessions"))["code"] == "api_unreachable"

    with log.open("w") as errlog:
        run(["mcp", "alice", "--url", url], body, errlog=errlog)
    assert "start the local stack with `make run`" in log.read_text()


def test_the_server_refuses_to_start_without_a_url_or_a_token():
    import subprocess

    base = {k: v for k, v in os.environ.items()
            if k not in ("EROS_URL", "EROS_TOKEN", "EROS_TOKEN_FILE", "EROS_API_KEY", "EROS_API_KEY_FILE", "EROS_USER")}
    no_url = subprocess.run([str(BIN / "eros-mcp")], env={**base, "EROS_TOKEN": "t"}, capture_output=True,
                            text=True, timeout=60)
    assert no_url.returncode == 2 and "EROS_URL" in no_url.stderr and not no_url.stdout
    no_token = subprocess.run([str(BIN / "eros-mcp"), "--url", "http://127.0.0.1:9"], env=base,
                              capture_output=True, text=True, timeout=60)
    assert no_token.returncode == 1 and "EROS_TOKEN" in no_token.stderr and not no_token.stdout
    unreadable = subprocess.run([str(BIN / "eros-mcp"), "--url", "http://127.0.0.1:9"],
                                env={**base, "EROS_TOKEN_FILE": "/nonexistent/token"}, capture_output=True,
                                text=True, timeout=60)
    assert unreadable.returncode == 1 and "/nonexistent/token" in unreadable.stderr
    assert "Traceback" not in unreadable.stderr and not unreadable.stdout
    for given, said in (
            ({}, "no credential"),
            ({"EROS_TOKEN": "t", "EROS_API_KEY": "ek_x"}, "not both"),
            ({"EROS_TOKEN_FILE": "/nonexistent/token", "EROS_API_KEY_FILE": "/nonexistent/key"}, "not both"),
            ({"EROS_API_KEY": "ek_x"}, "set EROS_USER"),
            ({"EROS_API_KEY": "ek_x", "EROS_API_KEY_FILE": "/nonexistent/key", "EROS_USER": "alice"}, "not both"),
            ({"EROS_API_KEY_FILE": "/nonexistent/key", "EROS_USER": "alice"}, "/nonexistent/key"),
            ({"EROS_TOKEN": "t", "EROS_USER": "alice"}, "EROS_USER goes with an app's EROS_API_KEY")):
        refused = subprocess.run([str(BIN / "eros-mcp"), "--url", "http://127.0.0.1:9"], env={**base, **given},
                                 capture_output=True, text=True, timeout=60)
        assert refused.returncode == 1 and said in refused.stderr, (given, refused.stderr)
        assert "Traceback" not in refused.stderr and not refused.stdout
    scheme = subprocess.run([str(BIN / "eros"), "mcp", "--url", "127.0.0.1:3000"], env=base, capture_output=True,
                            text=True, timeout=60)
    assert scheme.returncode == 2 and "http://" in scheme.stderr and not scheme.stdout


def test_stdout_carries_json_rpc_alone(stack, tmp_path):
    """stdout is the MCP channel: a log line or a banner there would break a client that does not skip it."""
    import json
    import subprocess

    requests = [{"jsonrpc": "2.0", "id": 1, "method": "initialize",
                 "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                            "clientInfo": {"name": "test", "version": "0"}}},
                {"jsonrpc": "2.0", "method": "notifications/initialized"},
                {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                 "params": {"name": "add_memory", "arguments": {"content": "Swims at dawn", "category": "fact"}}},
                {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                 "params": {"name": "memory_history", "arguments": {"memory_id": str(uuid.uuid4())}}}]
    log = tmp_path / "stderr.txt"
    with log.open("w") as stderr:
        server = subprocess.Popen([str(BIN / "eros"), "mcp", "alice", "--url", stack.url], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=stderr, text=True)
        assert server.stdin is not None and server.stdout is not None
        try:
            answers = {}
            for request in requests:  # one at a time: stdin closed early would cut the calls in flight
                server.stdin.write(json.dumps(request) + "\n")
                server.stdin.flush()
                if "id" in request:
                    answer = json.loads(server.stdout.readline())  # the next line is JSON-RPC, nothing else
                    answers[answer["id"]] = answer
            server.stdin.close()
            assert server.wait(timeout=60) == 0
            assert server.stdout.read() == ""
        finally:
            if server.poll() is None:
                server.kill()
    assert answers[2]["result"]["isError"] is False
    assert answers[2]["result"]["structuredContent"]["content"] == "Swims at dawn"
    assert answers[3]["result"]["isError"] is True
    assert answers[3]["result"]["structuredContent"]["code"] == "not_found"
    assert f"alice's memories at {stack.url}" in log.read_text()  # what people read goes to stderr
