"""Apps on one local stack see nothing of each other (issue 32): every route of the API, every table.

Three apps share one stack: the first ("default") and two made here ("acme", "globex"). Each has its own persona,
made by its own operator, and a user with the same subject in each: "alice". Each alice lives somewhere else and says
so through every route that stores or reads (turns, a streamed turn, appended messages, the context route, an import,
stated memories, her own character), dreaming runs over all of them at once, and then:

* every route answers each alice with her app's rows alone, and a route given another app's id (a session, a memory,
  a persona) answers what it answers for an id that does not exist;
* every table of a user's data holds each app's rows under that app's key, with that app's words only;
* an app's server, with its API key, is the same user as the app's token, and is no one in another app;
* erasing one alice leaves the other two row for row.

The routes are taken from the OpenAPI document: a route added later fails the coverage test until it is exercised
here."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import httpx
import jwt
import pytest

pytestmark = pytest.mark.integration

APPS = ("default", "acme", "globex")
CITY = {"default": "Quito", "acme": "Lisbon", "globex": "Osaka"}
PET = {"default": "iguana", "acme": "ferret", "globex": "axolotl"}
PERSONA = {"default": "luna", "acme": "acme-guide", "globex": "globex-guide"}
PUBLIC = {("GET", "/v1/health"), ("GET", "/v1/health/deep"), ("GET", "/v1/openapi.json"), ("GET", "/v1/docs")}


class Stack:
    """The local server, with a token per (app, user) and a record of the routes each request reached."""

    keys: dict[str, str]  # each app's server's API key (the stack fixture's)

    def __init__(self, server):
        from eros.config import settings
        from eros_dev.tokens import local_jwt_key

        self.server, self.settings, self.key = server, settings(), local_jwt_key()
        self.http = httpx.Client(base_url=server.url, timeout=60)
        document = self.http.get("/v1/openapi.json").json()
        self.routes = {(method.upper(), path) for path, item in document["paths"].items() for method in item}
        self._templates = [(re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", path) + "$"), path)
                           for path in sorted(document["paths"], key=lambda p: p.count("{"))]  # literal ones first
        self.reached: set[tuple[str, str]] = set()

    def token(self, app: str, user: str = "alice", *, operator: bool = False) -> str:
        now = int(time.time())
        claims = {"sub": user, "iss": self.settings.jwt_issuer, "aud": self.settings.jwt_audience, "iat": now,
                  "exp": now + 3600, "scope": "chat" + (f" {self.settings.operator_scope}" if operator else "")}
        if app != "default":
            claims[self.settings.app_claim] = app
        return jwt.encode(claims, self.key, algorithm="HS256")

    def call(self, app: str, method: str, path: str, body: Any = None, *, operator: bool = False,
             headers: dict | None = None) -> tuple[int, Any]:
        sent = {"Authorization": f"Bearer {self.token(app, operator=operator)}"} if app else {}
        return self._send(method, path, body, {**sent, **(headers or {})})

    def keyed(self, key: str, method: str, path: str, body: Any = None, user: str | None = "alice"):
        headers = {"X-Api-Key": key, **({"X-Eros-User": user} if user is not None else {})}
        return self._send(method, "/server" + path, body, headers)

    def _send(self, method: str, path: str, body: Any, headers: dict) -> tuple[int, Any]:
        answer = self.http.request(method, path, headers=headers,
                                   content=None if body is None else json.dumps(body).encode())
        bare = path.split("?")[0].removeprefix("/server")
        template = next((t for pattern, t in self._templates if pattern.match(bare)), None)
        if template and answer.status_code not in (401, 405):
            self.reached.add((method, template))
        kind = answer.headers.get("content-type", "")
        if kind.startswith("text/event-stream"):
            return answer.status_code, answer.text
        return answer.status_code, (answer.json() if answer.content else None)


def ok(result: tuple[int, Any], status: int = 200) -> Any:
    assert result[0] == status, result
    return result[1]


def key_of(app: str, user: str = "alice") -> str:
    from eros import apps

    return apps.user_key(app, user)


@pytest.fixture
def stack(db, env, tmp_path, local_server):
    from eros import apps
    from eros.store import apps as app_store

    env(EXPORT_DIR=str(tmp_path), EXPORT_BASE_URL="http://127.0.0.1:9/local")

    for app in APPS[1:]:
        app_store.create(app, app.title(), {}, db)
    keys = {}
    for app in APPS:
        secret = apps.new_key()
        app_store.add_key(app, "server", secret[:apps.KEY_SHOWN], apps.key_hash(secret), db)
        keys[app] = secret
    s = Stack(local_server)
    s.keys, s.exports = keys, tmp_path
    return s


def _live_a_little(s: Stack, app: str) -> dict:
    """Everything alice of ``app`` does through the API; the ids she got."""
    city, pet, persona = CITY[app], PET[app], PERSONA[app]
    if app != "default":
        ok(s.call(app, "PUT", f"/v1/operator/personas/{persona}",
                  {"name": f"{app} guide", "description": "a guide", "system_prompt": f"You guide {app}'s users."},
                  operator=True))
    session = ok(s.call(app, "POST", "/v1/sessions", {"persona_id": persona}), 201)["id"]
    ok(s.call(app, "POST", f"/v1/sessions/{session}/turns", {"content": f"I live in {city} now, since May."}))
    streamed = s.call(app, "POST", f"/v1/sessions/{session}/turns/stream",
                      {"content": f"My {pet} sleeps all day in {city}."})
    assert streamed[0] == 200 and "event: done" in streamed[1], streamed
    ok(s.call(app, "POST", f"/v1/sessions/{session}/messages",
              {"messages": [{"role": "user", "content": f"The {pet} is called Pip, {city} is hot."},
                            {"role": "assistant", "content": "Pip sounds lovely."}]}))
    ok(s.call(app, "POST", f"/v1/sessions/{session}/context", {"content": f"Where is my {pet}?", "store": True}))
    ok(s.call(app, "POST", "/v1/imports", {"conversations": [{
        "conversation_id": f"old-{app}", "persona_id": persona,
        "messages": [{"role": "user", "content": f"Moving to {city} next month with my {pet}.",
                      "created_at": "2026-01-05T10:00:00Z"},
                     {"role": "assistant", "content": "Exciting!", "created_at": "2026-01-05T10:00:05Z"}]}]}))
    character = ok(s.call(app, "POST", "/v1/personas",
                          {"name": f"{city} friend", "description": "mine", "system_prompt": f"A friend in {city}."}),
                   201)["id"]
    stated = ok(s.call(app, "POST", "/v1/memories", {"content": f"Keeps a {pet} named Pip in {city}",
                                                     "category": "fact"}), 201)["id"]
    return {"session": session, "character": character, "memory": stated}


def _app_personas(app: str) -> set[str]:
    """The app's personas: the two made here, or the first app's, which the package seeds."""
    from eros.migrate import personas

    return {PERSONA[app]} if app != "default" else {p["id"] for p in personas()}


def _dream(s: Stack) -> None:
    answer = s.http.post("/local/sweep", json={"idle_now": True},
                         headers={"Authorization": f"Bearer {s.token('default')}"})
    assert answer.status_code == 200, answer.text


def _others(app: str) -> list[str]:
    return [w for other in APPS if other != app for w in (CITY[other], PET[other])]


def _only_mine(app: str, text: str) -> None:
    assert CITY[app] in text or PET[app] in text, text[:300]
    leaked = [w for w in _others(app) if w in text]
    assert not leaked, f"{app} sees {leaked}"


def test_every_route_answers_each_app_with_its_own_rows_and_every_table_keeps_them_apart(stack, db):
    s = stack
    ids = {app: _live_a_little(s, app) for app in APPS}
    _dream(s)
    for app in APPS:
        mine, theirs = ids[app], [ids[o] for o in APPS if o != app]
        personas = {p["id"] for p in ok(s.call(app, "GET", "/v1/personas"))["personas"]}
        assert personas == _app_personas(app) | {mine["character"]}, "the app's personas and her own, no one else's"
        sessions = ok(s.call(app, "GET", "/v1/sessions"))
        assert {x["id"] for x in sessions["sessions"]} >= {mine["session"]}
        assert not {x["id"] for x in sessions["sessions"]} & {t["session"] for t in theirs}
        _only_mine(app, json.dumps(ok(s.call(app, "GET", f"/v1/sessions/{mine['session']}/messages"))))
        listed = ok(s.call(app, "GET", "/v1/memories?limit=500&include=superseded"))
        assert len(listed["memories"]) >= 3  # stated, dreamt and the utterances
        for memory in listed["memories"]:
            assert not [w for w in _others(app) if w in memory["content"]], (app, memory["content"])
        found = ok(s.call(app, "POST", "/v1/memories/search", {"query": f"where does she live {CITY[app]}",
                                                                "persona_id": PERSONA[app]}))
        _only_mine(app, json.dumps(found))
        _only_mine(app, json.dumps(ok(s.call(app, "GET", f"/v1/memories/{mine['memory']}"))))
        ok(s.call(app, "PATCH", f"/v1/memories/{mine['memory']}", {"content": f"Has a {PET[app]} named Pip"}))
        ok(s.call(app, "POST", f"/v1/memories/{mine['memory']}/restore", {}), 200)
        ok(s.call(app, "GET", "/v1/imports"))
        usage = ok(s.call(app, "GET", "/v1/usage"))
        counted = db.execute("SELECT coalesce(sum(tokens), 0) AS t FROM engine.user_usage WHERE user_id = %s",
                             (key_of(app),)).fetchone()["t"]
        assert usage["totals"]["tokens"] == counted > 0
        link = ok(s.call(app, "GET", "/v1/export"))["url"]
        exported = (s.exports / link.split("/local/", 1)[1]).read_text()
        assert (json.loads(exported)["app"], json.loads(exported)["user_id"]) == (app, "alice")
        _only_mine(app, exported)
        operators = ok(s.call(app, "GET", "/v1/operator/personas", operator=True))["personas"]
        assert {p["id"] for p in operators} == _app_personas(app)
        _the_operator_sees_the_app_alone(s, app, counted)
        # Another app's ids are ids that do not exist.
        for other in theirs:
            session, memory, character = other["session"], other["memory"], other["character"]
            assert s.call(app, "POST", f"/v1/sessions/{session}/turns", {"content": "hi"})[0] == 404
            assert s.call(app, "POST", f"/v1/sessions/{session}/turns/stream", {"content": "hi"})[0] == 404
            assert s.call(app, "GET", f"/v1/sessions/{session}/messages")[0] == 404
            assert s.call(app, "POST", f"/v1/sessions/{session}/messages",
                          {"messages": [{"role": "user", "content": "hi"}]})[0] == 404
            assert s.call(app, "POST", f"/v1/sessions/{session}/context", {"content": "hi"})[0] == 404
            assert s.call(app, "GET", f"/v1/memories/{memory}")[0] == 404
            assert s.call(app, "PATCH", f"/v1/memories/{memory}", {"content": "mine now"})[0] == 404
            assert s.call(app, "POST", f"/v1/memories/{memory}/restore", {})[0] == 404
            assert s.call(app, "DELETE", f"/v1/memories/{memory}")[0] == 404
            assert s.call(app, "PATCH", f"/v1/personas/{character}", {"name": "mine"})[0] == 404
            assert s.call(app, "DELETE", f"/v1/personas/{character}")[0] == 404
        for other in APPS:
            if other in (app, "default"):
                continue
            assert s.call(app, "POST", "/v1/sessions", {"persona_id": PERSONA[other]})[0] == 404
            assert s.call(app, "PUT", f"/v1/operator/personas/{PERSONA[other]}",
                          {"name": "x", "description": "x", "system_prompt": "x"}, operator=True)[0] == 409
            assert s.call(app, "DELETE", f"/v1/operator/personas/{PERSONA[other]}", operator=True)[0] == 404
        if app != "default":
            assert s.call(app, "POST", "/v1/sessions", {"persona_id": "luna"})[0] == 404
        # The memory events the sweep published: the console's panel shows each alice her app's alone.
        shown = ok(s.call(app, "GET", "/local/events"))["events"]
        assert shown and {(e["app"], e["user_id"]) for e in shown} == {(app, "alice")}
    _every_table_keeps_the_apps_apart(db)
    _keys_stay_in_their_app(s)
    _webhooks_stay_in_their_app(s, db)
    # What is left of the routes: deletions, each app's own.
    for app in APPS:
        mine = ids[app]
        ok(s.call(app, "DELETE", f"/v1/memories/{mine['memory']}"), 204)
        ok(s.call(app, "DELETE", "/v1/memories?category=emotion"))
        ok(s.call(app, "DELETE", f"/v1/personas/{mine['character']}"), 204)
        if app != "default":
            ok(s.call(app, "DELETE", f"/v1/operator/personas/{PERSONA[app]}", operator=True), 204)
    before = _rows_by_key(db)
    erased = ok(s.call("acme", "DELETE", "/v1/me"))["erased"]
    assert erased["sessions"] >= 2 and erased["memories"] >= 3
    after = _rows_by_key(db)
    assert not {k for k in after if k[1] == key_of("acme")} - {("memory_events", key_of("acme"))}
    assert {k: v for k, v in after.items() if k[1] != key_of("acme")} == \
        {k: v for k, v in before.items() if k[1] != key_of("acme")}
    unreached = s.routes - s.reached - PUBLIC
    assert not unreached, f"routes this test does not reach (exercise them for every app): {sorted(unreached)}"


def _the_operator_sees_the_app_alone(s: Stack, app: str, tokens: int) -> None:
    """The app, its keys and its users' usage: its operator's, by token or by the app's key, and no other app's."""
    for by_key in (False, True):
        def operator(method: str, path: str, by_key=by_key):
            return s.keyed(s.keys[app], method, path, user=None) if by_key else s.call(app, method, path, operator=True)

        assert ok(operator("GET", "/v1/operator/app"))["id"] == app
        listed = ok(operator("GET", "/v1/operator/keys"))["keys"]
        assert [k["prefix"] for k in listed] == [s.keys[app][:len(listed[0]["prefix"])]]
        users = ok(operator("GET", "/v1/operator/usage"))["users"]
        assert [(u["user_id"], u["tokens"]) for u in users] == [("alice", tokens)]


def _keys_stay_in_their_app(s: Stack) -> None:
    """Another app's key ids are ids that do not exist; an app's own are rotated and revoked."""
    spares = {app: ok(s.call(app, "POST", "/v1/operator/keys", {"name": "spare"}, operator=True), 201)["id"]
              for app in APPS}
    for app in APPS:
        for other in APPS:
            if other != app:
                assert s.call(app, "POST", f"/v1/operator/keys/{spares[other]}/rotate", operator=True)[0] == 404
                assert s.call(app, "DELETE", f"/v1/operator/keys/{spares[other]}", operator=True)[0] == 404
        rotated = ok(s.call(app, "POST", f"/v1/operator/keys/{spares[app]}/rotate", operator=True), 201)["id"]
        ok(s.call(app, "DELETE", f"/v1/operator/keys/{rotated}", operator=True), 204)
        kept = {k["id"]: k["revoked_at"] is not None
                for k in ok(s.call(app, "GET", "/v1/operator/keys", operator=True))["keys"]}
        assert len(kept) == 3 and kept[spares[app]] and kept[rotated]  # and the server's key, live
        assert not set(kept) & {spares[o] for o in APPS if o != app}


def _webhooks_stay_in_their_app(s: Stack, db) -> None:
    """Each app sets its own webhook (migration 0037); its operator, by token or key, sees that one alone, and its
    deletion leaves the others'."""
    secrets = {app: ok(s.call(app, "PUT", "/v1/operator/webhook", {"url": f"https://hooks.{app}.example/eros"},
                              operator=True))["secret"] for app in APPS}
    assert len(set(secrets.values())) == len(APPS)
    for app in APPS:
        assert ok(s.call(app, "GET", "/v1/operator/webhook", operator=True))["url"] == f"https://hooks.{app}.example/eros"
        shown = ok(s.keyed(s.keys[app], "GET", "/v1/operator/webhook", user=None))
        assert shown["url"] == f"https://hooks.{app}.example/eros" and "secret" not in shown
        assert ok(s.call(app, "POST", "/v1/operator/webhook/redrive", operator=True)) == {"redriven": 0}
    ok(s.call("acme", "DELETE", "/v1/operator/webhook", operator=True), 204)
    assert s.call("acme", "GET", "/v1/operator/webhook", operator=True)[0] == 404
    kept = {r["app_id"]: r["url"] for r in db.execute("SELECT app_id, url FROM engine.app_webhooks").fetchall()}
    assert kept == {app: f"https://hooks.{app}.example/eros" for app in APPS if app != "acme"}
    for app in APPS:
        if app != "acme":
            ok(s.call(app, "DELETE", "/v1/operator/webhook", operator=True), 204)


def _user_tables(db) -> dict[str, str]:
    """Every table of schema engine with a user key column (user_id, or owner_id for the personas)."""
    rows = db.execute("SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = 'engine'"
                      " AND column_name IN ('user_id', 'owner_id') AND table_name IN (SELECT table_name FROM"
                      " information_schema.tables WHERE table_schema = 'engine' AND table_type = 'BASE TABLE')"
                      ).fetchall()
    return {r["table_name"]: r["column_name"] for r in rows}


def _rows_by_key(db) -> dict[tuple[str, str], int]:
    counts = {}
    for table, column in _user_tables(db).items():
        for row in db.execute(f"SELECT {column} AS k, count(*) AS n FROM engine.{table}"
                              f" WHERE {column} IS NOT NULL GROUP BY 1").fetchall():
            counts[(table, row["k"])] = row["n"]
    return counts


def _every_table_keeps_the_apps_apart(db) -> None:
    """Each table's rows are under the three keys alone, each app's text in its own rows only; the tables the day
    wrote hold rows of every app."""
    counts = _rows_by_key(db)
    keys = {key_of(app) for app in APPS}
    assert {k for _, k in counts} == keys
    written = {"chat_sessions", "chat_messages", "companion_memories", "persona_instances", "user_usage",
               "user_model_usage", "memory_events", "user_event_sequence", "personas", "relationship_terms"}
    for table in written:
        assert {k for t, k in counts if t == table} == keys, table
    for app in APPS:
        key = key_of(app)
        texts = [r["t"] for r in db.execute(
            "SELECT content AS t FROM engine.companion_memories WHERE user_id = %(k)s UNION ALL"
            " SELECT content FROM engine.chat_messages WHERE user_id = %(k)s UNION ALL"
            " SELECT system_prompt || name FROM engine.personas WHERE owner_id = %(k)s", {"k": key}).fetchall()]
        assert texts
        for text in texts:
            assert not [w for w in _others(app) if w in text], (app, text)
        assert db.execute("SELECT count(*) AS n FROM engine.companion_memories WHERE user_id = %s"
                          " AND engine.app_of(user_id) <> %s", (key, app)).fetchone()["n"] == 0
    apps_personas = {r["id"]: r["app_id"] for r in db.execute(
        "SELECT id, app_id FROM engine.personas WHERE owner_id IS NULL").fetchall()}
    assert apps_personas["acme-guide"] == "acme" and apps_personas["globex-guide"] == "globex"


def test_an_apps_server_with_its_key_is_that_apps_user_and_no_one_elsewhere(stack, db):
    s = stack
    ids = {app: _live_a_little(s, app) for app in ("acme", "globex")}
    by_token = ok(s.call("acme", "GET", "/v1/memories?limit=500"))
    by_key = ok(s.keyed(s.keys["acme"], "GET", "/v1/memories?limit=500"))
    assert by_key == by_token
    assert s.keyed(s.keys["globex"], "GET", f"/v1/memories/{ids['acme']['memory']}")[0] == 404
    assert s.keyed(s.keys["globex"], "POST", f"/v1/sessions/{ids['acme']['session']}/turns",
                   {"content": "hi"})[0] == 404
    globex = ok(s.keyed(s.keys["globex"], "GET", "/v1/memories?limit=500"))
    assert globex["memories"] and not {m["id"] for m in globex["memories"]} & {m["id"] for m in by_token["memories"]}
    # A key is its app's operator, and only its app's.
    assert {p["id"] for p in ok(s.keyed(s.keys["globex"], "GET", "/v1/operator/personas", user=None))["personas"]} \
        == {"globex-guide"}
    # The server names its user: a user of the app by that subject, made on first use like a token's.
    assert ok(s.keyed(s.keys["acme"], "GET", "/v1/sessions", user="bob"))["sessions"] == []


@pytest.mark.parametrize("headers, why", [
    ({}, "X-Api-Key"),
    ({"X-Api-Key": "ek_" + "A" * 43}, "not a live key"),
    ({"X-Api-Key": "not-a-key"}, "not a live key"),
    ({"X-Api-Key": "ek_" + "A" * 4000}, "not a live key"),
])
def test_a_server_route_without_a_live_key_is_refused_and_stores_nothing(stack, db, headers, why):
    answer = stack.http.post("/server/v1/memories", headers={**headers, "X-Eros-User": "alice"},
                             json={"content": "I am someone else", "category": "fact"})
    assert answer.status_code == 401 and answer.json()["code"] == "unauthorized" and why in answer.json()["message"]
    assert db.execute("SELECT count(*) AS n FROM engine.companion_memories").fetchone()["n"] == 0


@pytest.mark.parametrize("user, why", [("", "1 to 255"), ("a" * 256, "1 to 255"), ("acme\x1falice", "U+001F")])
def test_a_server_naming_a_user_the_engine_cannot_hold_is_refused(stack, user, why):
    answer = stack.http.get("/server/v1/sessions", headers={"X-Api-Key": stack.keys["acme"], "X-Eros-User": user})
    assert answer.status_code == 401 and why in answer.json()["message"], answer.text


def test_a_server_route_without_a_user_is_the_apps_operator_only(stack):
    answer = stack.http.get("/server/v1/sessions", headers={"X-Api-Key": stack.keys["acme"]})
    assert answer.status_code == 401 and "X-Eros-User" in answer.json()["message"]


def test_a_token_of_an_app_not_served_here_or_being_deleted_is_refused(stack, db):
    assert stack.call("initech", "GET", "/v1/sessions")[0] == 401
    ok(stack.call("acme", "GET", "/v1/sessions"))
    db.execute("UPDATE engine.apps SET deleted_at = now() WHERE id = 'acme'")
    refused = stack.call("acme", "GET", "/v1/sessions")
    assert refused[0] == 401 and "acme" in refused[1]["message"]
    assert stack.keyed(stack.keys["acme"], "GET", "/v1/sessions")[0] == 401
    ok(stack.call("globex", "GET", "/v1/sessions"))


@pytest.mark.parametrize("claim", ["ACME", "a", "acme\x1f", 42, "x" * 41])
def test_a_token_whose_app_claim_is_not_an_app_id_is_refused(stack, claim):
    now = int(time.time())
    token = jwt.encode({"sub": "alice", "iss": stack.settings.jwt_issuer, "aud": stack.settings.jwt_audience,
                        "iat": now, "exp": now + 60, stack.settings.app_claim: claim}, stack.key, algorithm="HS256")
    answer = stack.http.get("/v1/sessions", headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 401 and answer.json()["code"] == "unauthorized", answer.text


def test_a_subject_with_the_apps_separator_is_refused_so_no_token_can_name_another_apps_user(stack):
    """A first-app token whose subject were 'acme<U+001F>alice' would be acme's alice: refused."""
    now = int(time.time())
    token = jwt.encode({"sub": "acme\x1falice", "iss": stack.settings.jwt_issuer, "aud": stack.settings.jwt_audience,
                        "iat": now, "exp": now + 60}, stack.key, algorithm="HS256")
    answer = stack.http.get("/v1/sessions", headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 401 and "U+001F" in answer.json()["message"]
