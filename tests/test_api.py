"""The chat API through its real handler: routes, auth, isolation, and the bad inputs a careless or
hostile client sends. Offline providers (no keys), embedded Postgres."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime

import pytest
from apiclient import Api
from fakes import Delay, Status


@pytest.fixture
def api(db):
    return Api()


def count(db, table: str) -> int:
    return db.execute(f"SELECT count(*) AS n FROM engine.{table}").fetchone()["n"]


def test_health_is_public_and_reports_database_and_offline_providers(api):
    status, body = api.call("GET", "/v1/health", user=None)
    assert status == 200
    assert body["database"] == "ok"
    assert "OFFLINE" in body["providers"]["llm"] and "OFFLINE" in body["providers"]["embedder"]
    assert body["offline"] == ["llm", "embedder"]  # what the console shows its offline notice by


def test_openapi_document_lists_the_routes(api):
    status, body = api.call("GET", "/v1/openapi.json", user=None)
    assert status == 200
    assert body["openapi"].startswith("3.")
    for path in ("/v1/sessions", "/v1/sessions/{session_id}/turns", "/v1/memories/{memory_id}", "/v1/personas"):
        assert path in body["paths"], path


def test_every_operation_has_a_readable_unique_id_and_a_tag(api):
    """What generated clients name their methods and group them by: takeTurn, not
    take_turn_v1_sessions__session_id__turns_post."""
    status, body = api.call("GET", "/v1/openapi.json", user=None)
    operations = [(path, method, op) for path, item in body["paths"].items() for method, op in item.items()]
    ids = [op.get("operationId") for _, _, op in operations]
    assert all(isinstance(i, str) and re.fullmatch(r"[a-z][A-Za-z]{2,30}", i) for i in ids), ids
    assert len(set(ids)) == len(ids)
    assert all(op.get("tags") and set(op["tags"]) <= {"health", "sessions", "chat", "memories", "account",
                                                                     "operator"}
               for _, _, op in operations)
    by_id = {op["operationId"]: (method, path) for path, method, op in operations}
    assert by_id["takeTurn"] == ("post", "/v1/sessions/{session_id}/turns")
    assert by_id["appendMessages"] == ("post", "/v1/sessions/{session_id}/messages")
    assert by_id["getContext"] == ("post", "/v1/sessions/{session_id}/context")


def test_the_docs_page_is_public_self_contained_and_carries_the_document(api):
    import re

    from eros_dev.lambda_runtime import LambdaContext
    from eros_dev.server import http_api_event

    result = api.function.lambda_handler(http_api_event("GET", "/v1/docs", {}, b"", None), LambdaContext("chat"))
    assert result["statusCode"] == 200 and result["headers"]["Content-Type"].startswith("text/html")
    page = result["body"]
    assert "SwaggerUIBundle" in page and "eros companion memory API" in page
    assert "/v1/sessions/{session_id}/turns" in page
    # Script and styles are inline: the page asks no third party for anything.
    assert not re.search(r"""(src|href)=["']?https?://""", page)
    # The document is the page's, whole, and a "</" in it cannot close the page's <script> early.
    spec = page[page.index("    spec: ") + 10:page.index(",\n    presets:")]
    assert "</" not in spec
    assert json.loads(spec) == api.call("GET", "/v1/openapi.json", user=None)[1]
    linked = api.function.lambda_handler(http_api_event("GET", "/v1/docs?format=json", {}, b"", None),
                                         LambdaContext("chat"))
    assert json.loads(linked["body"]) == json.loads(spec)


def test_openapi_documents_the_turns_errors_and_their_codes(api):
    turn = api.call("GET", "/v1/openapi.json", user=None)[1]["paths"]["/v1/sessions/{session_id}/turns"]["post"]
    assert {"200", "404", "409", "422", "502", "503", "504"} <= {str(code) for code in turn["responses"]}
    error = turn["responses"]["503"]["content"]["application/json"]["schema"]
    assert {"statusCode", "code", "message"} <= set(error["required"]) and "retryable" in error["properties"]


def test_a_refused_request_answers_the_422_the_document_describes(api):
    """Whatever refuses it (the resolver's validation, or a use-case's BadRange), a 422 is the body the OpenAPI
    document gives every route, and only that: not Powertools' default shape, whose schemas the document drops."""
    import jsonschema_rs  # schemathesis's validator (tests/test_api_fuzz.py)

    document = api.call("GET", "/v1/openapi.json", user=None)[1]
    assert not {"HTTPValidationError", "ValidationError", "ResponseValidationError"} & set(
        document["components"]["schemas"])
    session = api.session()
    for method, target, path, body in (
            ("POST", f"/v1/sessions/{session}/turns", "/v1/sessions/{session_id}/turns", {"content": ""}),
            ("POST", "/v1/sessions", "/v1/sessions", {"persona_id": "luna", "user": "mallory"}),
            ("GET", "/v1/memories?limit=0", "/v1/memories", None),
            ("GET", "/v1/usage?from=2026-02-01&to=2026-01-01", "/v1/usage", None),
            ("DELETE", "/v1/memories", "/v1/memories", None)):
        status, answer = api.call(method, target, body)
        assert status == 422, (target, answer)
        jsonschema_rs.validate(document["paths"][path][method.lower()]["responses"]["422"]["content"][
            "application/json"]["schema"], answer)


def test_personas_are_seeded(api):
    status, body = api.call("GET", "/v1/personas")
    assert status == 200
    assert {p["id"] for p in body["personas"]} >= {"luna", "kai", "mei"}


def test_session_turns_history_and_relationship_memory(api, db):
    sid = api.session()
    status, first = api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "I adopted a cat named Miso"})
    assert status == 200, first
    assert first["reply"] and first["model"].startswith("offline/")
    status, second = api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "Miso the cat knocked my plant over"})
    assert status == 200
    assert second["user_message_id"] > first["assistant_message_id"]

    status, page = api.call("GET", f"/v1/sessions/{sid}/messages?limit=3")
    assert status == 200
    assert [m["role"] for m in page["messages"]] == ["assistant", "user", "assistant"]
    status, rest = api.call("GET", f"/v1/sessions/{sid}/messages?limit=3&before={page['next_before']}")
    assert [m["content"] for m in rest["messages"]] == ["I adopted a cat named Miso"]
    assert rest["next_before"] is None

    status, mems = api.call("GET", "/v1/memories?layer=relationship")
    assert status == 200
    assert sorted(m["content"] for m in mems["memories"]) == sorted(
        ["I adopted a cat named Miso", "Miso the cat knocked my plant over"])
    assert all("embedding" not in m for m in mems["memories"])
    # The raw utterance never lands in the profile layer.
    assert api.call("GET", "/v1/memories?layer=profile")[1]["memories"] == []
    status, sessions = api.call("GET", "/v1/sessions")
    assert [s["id"] for s in sessions["sessions"]] == [sid]


def test_same_client_turn_id_replays_without_a_second_model_call(api, db, monkeypatch):
    from eros.providers import offline

    calls = []
    original = offline.OfflineChat.complete

    def counted(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(offline.OfflineChat, "complete", counted)
    sid = api.session()
    body = {"content": "hello there", "client_turn_id": "turn-1"}
    s1, r1 = api.call("POST", f"/v1/sessions/{sid}/turns", body)
    s2, r2 = api.call("POST", f"/v1/sessions/{sid}/turns", body)
    assert s1 == s2 == 200
    assert r2["replayed"] is True and r1["replayed"] is False
    assert (r1["reply"], r1["assistant_message_id"]) == (r2["reply"], r2["assistant_message_id"])
    assert len(calls) == 1
    assert count(db, "chat_messages") == 2
    # The same turn id with different content is a client bug, not a replay.
    s3, r3 = api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "something else", "client_turn_id": "turn-1"})
    assert s3 == 409 and "client_turn_id" in r3["message"]


def test_delete_memory(api, db):
    sid = api.session()
    api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "remember this"})
    memory = api.call("GET", "/v1/memories")[1]["memories"][0]
    assert api.call("DELETE", f"/v1/memories/{memory['id']}") == (204, None)
    assert api.call("DELETE", f"/v1/memories/{memory['id']}")[0] == 404
    assert api.call("GET", "/v1/memories")[1]["memories"] == []


def test_bulk_delete_by_layer_and_category_counts_history_and_touches_no_one_else(api, db):
    from pgvector import Vector

    from eros.providers.offline import hash_embed

    def memory(user, content, category, superseded_by=None):
        return db.execute(
            "INSERT INTO engine.companion_memories (user_id, content, embedding, category, superseded_by,"
            " superseded_at, superseded_reason) VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id",
            (user, content, Vector(hash_embed(content)), category, superseded_by,
             datetime.now(UTC) if superseded_by else None, "changed" if superseded_by else None)).fetchone()["id"]

    tokyo = memory("alice", "Lives in Tokyo", "fact")
    memory("alice", "Lives in Shanghai", "fact", superseded_by=tokyo)  # history of the same fact
    memory("alice", "Likes mocha", "preference")
    memory("bob", "Lives in Oslo", "fact")
    sid = api.session()
    api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "I said this to a persona"})  # a relationship row

    assert api.call("DELETE", "/v1/memories?category=fact") == (200, {"deleted": 2})
    assert api.call("DELETE", "/v1/memories?category=fact") == (200, {"deleted": 0})
    left = {m["content"] for m in api.call("GET", "/v1/memories?include=superseded")[1]["memories"]}
    assert left == {"Likes mocha", "I said this to a persona"}
    assert api.call("DELETE", "/v1/memories?layer=relationship") == (200, {"deleted": 1})
    assert api.call("DELETE", "/v1/memories?layer=profile&category=preference") == (200, {"deleted": 1})
    assert api.call("GET", "/v1/memories")[1]["memories"] == []
    assert api.call("GET", "/v1/memories", user="bob")[1]["memories"][0]["content"] == "Lives in Oslo"

    # Careless or hostile filters: no filter at all, an unknown layer or category, a repeated parameter.
    status, body = api.call("DELETE", "/v1/memories")
    assert status == 422 and "name a layer and/or a category" in body["message"] + json.dumps(body)
    assert api.call("DELETE", "/v1/memories?layer=everything")[0] == 422
    assert api.call("DELETE", "/v1/memories?category=%00")[0] == 422
    assert api.call("DELETE", "/v1/memories?category=fact", user=None)[0] == 401
    assert api.call("GET", "/v1/memories", user="bob")[1]["memories"][0]["content"] == "Lives in Oslo"


def test_memories_filter_by_category_and_paginate(api, db):
    from pgvector import Vector

    from eros.providers.offline import hash_embed

    for i, category in enumerate(["fact", "fact", "emotion"]):
        db.execute("INSERT INTO engine.companion_memories (user_id, content, embedding, category, created_at)"
                   " VALUES ('alice', %s, %s, %s, now() - make_interval(mins => %s))",
                   (f"memory {i}", Vector(hash_embed(f"memory {i}")), category, i))
    status, facts = api.call("GET", "/v1/memories?layer=profile&category=fact&limit=1")
    assert status == 200 and [m["content"] for m in facts["memories"]] == ["memory 0"]
    status, more = api.call("GET", f"/v1/memories?layer=profile&category=fact&limit=1&before={facts['next_before']}")
    assert [m["content"] for m in more["memories"]] == ["memory 1"]
    assert api.call("GET", "/v1/memories?category=emotion")[1]["memories"][0]["content"] == "memory 2"


# --- auth and isolation -----------------------------------------------------------------------
def test_no_verified_subject_is_401(api):
    for method, path in [("GET", "/v1/personas"), ("GET", "/v1/sessions"), ("POST", "/v1/sessions"),
                         ("GET", "/v1/memories")]:
        status, body = api.call(method, path, {"persona_id": "luna"} if method == "POST" else None, user=None)
        assert status == 401, (method, path)
        assert "token" in body["message"]


def test_a_user_field_in_the_body_is_rejected_not_trusted(api, db):
    status, body = api.call("POST", "/v1/sessions", {"persona_id": "luna", "user_id": "mallory"})
    assert status == 422 and "user_id" in body["message"]
    assert count(db, "chat_sessions") == 0


def test_other_users_cannot_see_or_touch_a_session_or_memories(api, db):
    sid = api.session("alice")
    api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "my secret diary entry"}, user="alice")
    memory_id = api.call("GET", "/v1/memories", user="alice")[1]["memories"][0]["id"]
    before = (count(db, "chat_messages"), count(db, "companion_memories"))

    assert api.call("GET", f"/v1/sessions/{sid}/messages", user="bob")[0] == 404
    status, body = api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "hijack"}, user="bob")
    assert status == 404 and body["message"] == "session not found"
    assert api.call("DELETE", f"/v1/memories/{memory_id}", user="bob")[0] == 404
    assert api.call("GET", "/v1/memories", user="bob")[1]["memories"] == []
    assert api.call("GET", "/v1/sessions", user="bob")[1]["sessions"] == []
    assert (count(db, "chat_messages"), count(db, "companion_memories")) == before


# --- bad input: a clear 4xx, nothing written --------------------------------------------------
BAD_TURNS = [
    (b'{"content": "unterminated', 400, "JSON"),
    (b"not json at all", 400, "JSON"),
    (b"[]", 422, "body"),
    (b'"just a string"', 422, "body"),
    (b"{}", 422, "content"),
    (b'{"content": ""}', 422, "content"),
    (b'{"content": "   "}', 422, "content"),
    (b'{"content": 42}', 422, "content"),
    (b'{"content": null}', 422, "content"),
    (b'{"content": ["a"]}', 422, "content"),
    (b'{"content": "hi", "role": "system"}', 422, "role"),
    (b'{"content": "hi", "client_turn_id": "has spaces and / slashes"}', 422, "client_turn_id"),
    (b'{"content": "hi", "client_turn_id": 7}', 422, "client_turn_id"),
    (json.dumps({"content": "x" * 4001}).encode(), 422, "content"),
    (b"\xff\xfe\x00garbage", 400, "JSON"),
]


@pytest.mark.parametrize("raw,status,names", BAD_TURNS)
def test_bad_turn_bodies_are_4xx_and_write_nothing(api, db, raw, status, names):
    sid = api.session()
    got, body = api.call("POST", f"/v1/sessions/{sid}/turns", raw=raw)
    assert got == status, body
    assert names in body["message"]
    assert count(db, "chat_messages") == 0 and count(db, "companion_memories") == 0


def test_huge_body_is_413(api, db):
    sid = api.session()
    status, body = api.call("POST", f"/v1/sessions/{sid}/turns", raw=b'{"content": "' + b"a" * 200_000 + b'"}')
    assert status == 413 and "larger than" in body["message"]
    assert count(db, "chat_messages") == 0


@pytest.mark.parametrize("path,status", [
    ("/v1/sessions/not-a-uuid/turns", 422),
    ("/v1/sessions/5e24b180-a02a-4066-90f1-878d1fd18cd6/turns", 404),  # a fixed id: the same test ids everywhere
    ("/v1/sessions/'; DROP TABLE engine.chat_sessions; --/turns", 422),
])
def test_bad_session_ids(api, db, path, status):
    got, body = api.call("POST", path, {"content": "hi"})
    assert got == status and body["message"]
    assert count(db, "chat_messages") == 0


@pytest.mark.parametrize("body,status", [
    ({"persona_id": "nobody"}, 404), ({}, 422), ({"persona_id": 5}, 422), ({"persona_id": ""}, 422),
    ({"persona_id": "x" * 1000}, 422),
])
def test_bad_new_sessions(api, db, body, status):
    got, answer = api.call("POST", "/v1/sessions", body)
    assert got == status and answer["message"]
    assert count(db, "chat_sessions") == 0 and count(db, "persona_instances") == 0


@pytest.mark.parametrize("query", ["limit=0", "limit=201", "limit=abc", "before=-1", "before=x"])
def test_bad_message_paging(api, db, query):
    sid = api.session()
    status, body = api.call("GET", f"/v1/sessions/{sid}/messages?{query}")
    assert status == 422 and body["message"].startswith("invalid request")


@pytest.mark.parametrize("query", ["layer=everything", "category=gossip", "limit=100000", "before=nope"])
def test_bad_memory_queries(api, query):
    status, body = api.call("GET", f"/v1/memories?{query}")
    assert status == 422 and body["message"]


def test_unknown_route_and_bad_memory_ids(api):
    assert api.call("GET", "/v1/nothing-here")[0] == 404
    assert api.call("DELETE", "/v1/memories/123")[0] == 422
    assert api.call("DELETE", f"/v1/memories/{uuid.uuid4()}")[0] == 404


def test_database_down_is_503_not_500(api, env):
    env(DATABASE_URL="postgresql://postgres@127.0.0.1:9/postgres?connect_timeout=1")
    status, body = api.call("GET", "/v1/health", user=None)
    assert status == 503 and body["database"] == "unreachable"
    status, body = api.call("GET", "/v1/sessions")
    assert status == 503 and "database" in body["message"]


def test_an_unexpected_error_is_a_json_500_without_internals(api, monkeypatch):
    from eros.store import personas as persona_store

    def broken(*args, **kwargs):
        raise RuntimeError("secret internals")

    monkeypatch.setattr(persona_store, "usable", broken)
    status, body = api.call("GET", "/v1/personas")
    assert status == 500 and body["message"] == "internal error" and "secret" not in json.dumps(body)


# --- provider failures: a stable error for the client, no provider text anywhere --------------------
@pytest.fixture
def online(providers, env):
    env(LLM_TIMEOUT_SECS=0.5)
    return dict(zip(("llm", "embed"), providers, strict=True))


ECHO = "provider says: you sent 'my secret diary entry'"


@pytest.mark.parametrize("provider,behaviour,status,code,retryable", [
    ("llm", Status(400, body={"error": {"message": ECHO, "code": 400}}), 502, "model_error", False),
    ("llm", Status(401, body={"error": {"message": ECHO, "code": 401}}), 503, "provider_misconfigured", False),
    ("llm", Status(402, body={"error": {"message": ECHO, "code": 402}}), 503, "provider_misconfigured", False),
    ("llm", Status(404, body={"error": {"message": ECHO, "code": 404}}), 503, "provider_misconfigured", False),
    ("llm", Status(403, body={"error": {"message": ECHO, "code": 403}}), 502, "model_error", False),
    ("llm", Status(429, body={"error": {"message": ECHO, "code": 429}}), 503, "model_unavailable", True),
    ("llm", Status(500, body={"error": {"message": ECHO, "code": 500}}), 503, "model_unavailable", True),
    ("llm", Delay(2), 504, "model_timeout", True),
    ("embed", Status(400, body={"detail": ECHO}), 502, "model_error", False),
    ("embed", Status(401, body={"detail": ECHO}), 503, "provider_misconfigured", False),
    ("embed", Status(503, body={"detail": ECHO}), 503, "model_unavailable", True),
])
def test_a_provider_failure_is_a_stable_error_without_the_providers_text(api, db, online, caplog, capfd, provider,
                                                                          behaviour, status, code, retryable):
    sid = api.session()
    turn = {"content": "my secret diary entry", "client_turn_id": "t-1"}
    online[provider].push(behaviour)
    got, body = api.call("POST", f"/v1/sessions/{sid}/turns", turn)
    assert got == status, body
    assert (body["code"], body["retryable"], body["client_turn_id"]) == (code, retryable, "t-1")
    assert "kept" in body["message"] and "secret" not in json.dumps(body)
    # Logs name the provider's status and the error type, never its text (it can echo the user's message).
    failures = [r for r in caplog.records if r.getMessage() == "chat turn failed at a provider"]
    assert len(failures) == 1 and failures[0].levelname == "WARNING"
    logged = failures[0].__dict__
    assert logged["error_type"].startswith(("Provider", "ModelNotFound")) and logged["code"] == code
    assert logged["provider_status"] == (None if isinstance(behaviour, Delay) else behaviour.code)
    assert logged["stage"] == ("chat" if provider == "llm" else "embed")
    out, err = capfd.readouterr()
    assert "secret" not in out + err and all("secret" not in r.getMessage() + str(r.__dict__) for r in caplog.records)
    # The message is kept; a retry with the same turn id, once the provider is back, gets the reply.
    assert [m["content"] for m in db.execute("SELECT content FROM engine.chat_messages").fetchall()] == [
        "my secret diary entry"]
    online[provider].reset()
    got, body = api.call("POST", f"/v1/sessions/{sid}/turns", turn)
    assert got == 200 and body["reply"] == "fake reply"


def test_every_error_has_a_stable_code(api, db):
    sid = api.session()
    assert api.call("GET", "/v1/nothing")[1]["code"] == "not_found"
    assert api.call("GET", "/v1/sessions", user=None)[1]["code"] == "unauthorized"
    assert api.call("POST", f"/v1/sessions/{sid}/turns", raw=b"{")[1]["code"] == "invalid_request"
    assert api.call("POST", f"/v1/sessions/{sid}/turns", {"content": ""})[1]["code"] == "invalid_request"
    assert api.call("POST", f"/v1/sessions/{sid}/turns", raw=b'{"content": "' + b"a" * 200_000 + b'"}')[1][
        "code"] == "payload_too_large"
    api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "one", "client_turn_id": "t"})
    assert api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "two", "client_turn_id": "t"})[1][
        "code"] == "turn_conflict"


# --- input Postgres or Python cannot take: a clear 4xx at the edge, before any paid call --------------
DEEP = b'{"content": ' + b"[" * 6000 + b"]" * 6000 + b"}"
UNSPEAKABLE_TURNS = [
    (json.dumps({"content": "hello\u0000world"}).encode(), 422, "NUL"),
    (b'{"content": "hello \\u0000 world"}', 422, "NUL"),
    (b'{"content": "lone \\ud800 surrogate"}', 422, "surrogate"),
    (b'{"content": "lone \\udfff"}', 422, "surrogate"),
    (b'{"content": "ok", "client_turn_id": "a\\u0000b"}', 422, "client_turn_id"),
    (DEEP, 400, "nested"),
    (b"[" * 6000 + b"]" * 6000, 400, "nested"),
    (b'{"content": ' + b"1" * 5000 + b"}", 400, "JSON"),
    (b'{"content": 1e999}', 422, "content"),
    (b'{"content": NaN}', 422, "content"),
    (b'{"\\u0000": "x", "content": "hi"}', 422, "invalid request"),
]


@pytest.mark.parametrize("raw,status,names", UNSPEAKABLE_TURNS)
def test_turn_bodies_postgres_cannot_store_are_refused_before_any_provider_call(api, db, online, raw, status, names):
    sid = api.session()
    got, body = api.call("POST", f"/v1/sessions/{sid}/turns", raw=raw)
    assert got == status, body
    assert names in body["message"] and body["code"] in ("invalid_request",)
    assert online["llm"].calls == online["embed"].calls == 0
    assert count(db, "chat_messages") == 0 and count(db, "companion_memories") == 0


@pytest.mark.parametrize("raw,names", [
    (json.dumps({"persona_id": "lu\u0000na"}).encode(), "NUL"),
    (b'{"persona_id": "\\ud800"}', "surrogate"),
    (b'{"persona_id": ' + b"[" * 6000 + b"]" * 6000 + b"}", "nested"),
])
def test_session_bodies_postgres_cannot_store_are_refused(api, db, raw, names):
    status, body = api.call("POST", "/v1/sessions", raw=raw)
    assert status in (400, 422) and names in body["message"], body
    assert count(db, "chat_sessions") == 0 and count(db, "persona_instances") == 0


@pytest.mark.parametrize("subject", ["ali\u0000ce", "\ud800", "alice\udfff"])
def test_a_token_subject_postgres_cannot_store_is_401(api, db, online, subject):
    sid = api.session()
    for method, path, data in [("GET", "/v1/sessions", None), ("POST", "/v1/sessions", {"persona_id": "luna"}),
                               ("GET", "/v1/memories", None), ("GET", f"/v1/sessions/{sid}/messages", None),
                               ("POST", f"/v1/sessions/{sid}/turns", {"content": "hi"})]:
        status, body = api.call(method, path, data, user=subject)
        assert status == 401 and "subject" in body["message"], (method, path, body)
    assert online["llm"].calls == online["embed"].calls == 0
    assert count(db, "chat_sessions") == 1 and count(db, "chat_messages") == 0


@pytest.mark.parametrize("query,names", [
    ("before=9223372036854775808", "before"), ("before=99999999999999999999999999", "before"),
    ("limit=9223372036854775808", "limit"), ("before=%00", "before"), ("limit=1%00", "limit"),
])
def test_message_paging_out_of_range_is_422(api, db, query, names):
    sid = api.session()
    status, body = api.call("GET", f"/v1/sessions/{sid}/messages?{query}")
    assert status == 422 and names in body["message"], body


@pytest.mark.parametrize("query", ["layer=%00", "category=fact%00", "before=%00", "include=%00",
                                   "limit=9223372036854775808", "before=\ud800"])
def test_memory_queries_with_unstorable_text_are_422(api, query):
    status, body = api.call("GET", f"/v1/memories?{query}")
    assert status == 422 and body["message"].startswith("invalid request"), body


@pytest.mark.parametrize("path", ["/v1/sessions/%00/turns", "/v1/sessions/\ud800/messages", "/v1/memories/%00",
                                  "/v1/memories/\u0000"])
def test_paths_with_unstorable_text_are_4xx(api, path):
    status, body = api.call("POST" if path.endswith("turns") else "GET", path, {"content": "hi"})
    assert 400 <= status < 500, body


def test_the_message_cursor_does_not_depend_on_its_row(api, db):
    """next_before of the history is a message id compared by value: the page goes on if that message is gone."""
    sid = api.session()
    for text in ("one", "two", "three"):
        assert api.call("POST", f"/v1/sessions/{sid}/turns", {"content": text})[0] == 200
    status, page = api.call("GET", f"/v1/sessions/{sid}/messages?limit=2")
    db.execute("DELETE FROM engine.chat_messages WHERE id = %s", (page["next_before"],))
    status, rest = api.call("GET", f"/v1/sessions/{sid}/messages?limit=10&before={page['next_before']}")
    assert status == 200 and [m["content"] for m in rest["messages"] if m["role"] == "user"] == ["two", "one"]


def test_brackets_inside_text_are_not_nesting(api, db):
    sid = api.session()
    text = "[{" * 1000 + ' \\" ' + "}]" * 500
    status, body = api.call("POST", f"/v1/sessions/{sid}/turns", {"content": text})
    assert status == 200, body
    assert db.execute("SELECT content FROM engine.chat_messages WHERE role = 'user'").fetchone()["content"] == text
    status, body = api.call("POST", f"/v1/sessions/{sid}/turns", raw=b'{"content": "ok", "x": ' + b"[" * 33 + b"]" * 33
                            + b"}")
    assert status == 400 and "nested deeper than 32" in body["message"]
    status, body = api.call("POST", f"/v1/sessions/{sid}/turns", raw=b'{"content": "ok", "x": ' + b"[" * 31 + b"]" * 31
                            + b"}")
    assert status == 422 and "x" in body["message"]  # 32 levels deep is read, and refused for what it says
