"""What the memory console reads and does, below the browser: a reply's recalled memories with their score
parts, each session's place in dreaming, and the local stack's own routes (sign-in, sweep now, the files)."""

from __future__ import annotations

import json

import httpx
import pytest
from apiclient import Api
from helpers import go_idle
from pgvector import Vector

from eros.providers.offline import hash_embed

EXTRACTED = json.dumps({"memories": [{"content": "Has a dog named Biscuit", "category": "relation",
                                      "importance": 0.8}]})


@pytest.fixture
def online(providers):
    providers[0].responder = lambda body: EXTRACTED if body.get("response_format") else "fake reply"
    return providers


def profile(db, content: str, user: str = "alice", category: str = "fact") -> str:
    return str(db.execute(
        "INSERT INTO engine.companion_memories (user_id, content, embedding, category, importance, source)"
        " VALUES (%s, %s, %s, %s, 0.7, 'dreaming') RETURNING id",
        (user, content, Vector(hash_embed(content)), category)).fetchone()["id"])


# --- a reply's recalled memories ------------------------------------------------------------------------------

def test_a_reply_shows_what_it_recalled_with_the_parts_of_each_score(online, db):
    api = Api()
    mine = profile(db, "Works as a nurse in Leeds")
    profile(db, "Plays the cello", user="bob")
    sid = api.session()
    status, reply = api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "I had a long shift as a nurse"})
    assert status == 200
    [recalled] = reply["recalled"]
    assert (recalled["id"], recalled["layer"], recalled["category"], recalled["content"]) == (
        mine, "profile", "fact", "Works as a nurse in Leeds")
    parts = recalled["parts"]
    assert set(parts) == {"similarity", "recency", "importance", "lexical", "demotion"} and parts["similarity"] > 0
    assert parts["lexical"] > 0  # "nurse": a word the message and the memory share
    assert recalled["score"] == pytest.approx(
        parts["similarity"] + parts["recency"] + parts["importance"] + parts["lexical"] - parts["demotion"], abs=1e-6)

    # The stored turn keeps ids and numbers, never the memory's text (a deleted memory leaves no copy) ...
    stored = db.execute("SELECT metadata FROM engine.chat_messages WHERE role = 'assistant'").fetchone()["metadata"]
    assert "Works as a nurse" not in json.dumps(stored)
    # ... and the history lists them with each reply, the text left to the memory itself.
    status, page = api.call("GET", f"/v1/sessions/{sid}/messages")
    assert status == 200
    reply_row, user_row = page["messages"]
    assert user_row["recalled"] is None
    [listed] = reply_row["recalled"]
    assert (listed["id"], listed["score"], listed["content"]) == (mine, recalled["score"], None)
    assert api.call("GET", f"/v1/sessions/{sid}/messages", user="bob")[0] == 404

    # A replay of the turn answers the same memories, by id.
    again = api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "I had a long shift as a nurse",
                                                            "client_turn_id": reply["client_turn_id"]})[1]
    assert again["replayed"] and [r["id"] for r in again["recalled"]] == [mine]


# --- each session's place in dreaming ----------------------------------------------------------------------------

def states(api: Api, user: str = "alice") -> dict[str, dict]:
    status, body = api.call("GET", "/v1/sessions", user=user)
    assert status == 200
    return {s["id"]: s["dreaming"] for s in body["sessions"]}


def test_sessions_say_where_each_is_in_dreaming(online, db, env):
    env(DREAMING_IDLE_SECS=1800)
    api = Api()
    sids = {}
    for name in ("active", "waiting", "claimed", "retrying", "extracted", "failed"):
        sids[name] = api.session()
        assert api.call("POST", f"/v1/sessions/{sids[name]}/turns", {"content": f"a {name} session"})[0] == 200
    assert {s["state"] for s in states(api).values()} == {"active"}
    go_idle(db)
    db.execute("UPDATE engine.chat_sessions SET last_active_at = now() WHERE id = %s", (sids["active"],))
    db.execute("UPDATE engine.chat_sessions SET extraction_claimed_at = now() WHERE id = %s", (sids["claimed"],))
    db.execute("UPDATE engine.chat_sessions SET extraction_next_attempt_at = now() + interval '5 minutes',"
               " extraction_error = 'chat completion: HTTP 503', extraction_attempts = 1 WHERE id = %s",
               (sids["retrying"],))
    db.execute("UPDATE engine.chat_sessions SET extracted_at = now(), extraction_gave_up = 'attempts',"
               " extraction_error = 'unparsable model output', extraction_attempts = 5 WHERE id = %s",
               (sids["failed"],))
    db.execute("UPDATE engine.chat_sessions SET extracted_at = now() WHERE id = %s", (sids["extracted"],))

    seen = states(api)
    assert {name: seen[sid]["state"] for name, sid in sids.items()} == {name: name for name in sids}
    assert seen[sids["retrying"]]["error"] == "chat completion: HTTP 503" and seen[sids["retrying"]]["attempts"] == 1
    assert seen[sids["failed"]]["error"] == "unparsable model output"
    assert seen[sids["active"]]["due_at"] > seen[sids["waiting"]]["due_at"]  # quiet 30 min after its last turn
    assert states(api, user="bob") == {}


# --- the local stack's own routes -----------------------------------------------------------------------------

def test_local_sign_in_mints_a_token_for_any_user_and_refuses_bad_ones(local_server):
    with httpx.Client(base_url=local_server.url, timeout=30) as client:
        answer = client.post("/local/token", json={"user": "dora"})
        assert answer.status_code == 200 and answer.json()["user"] == "dora"
        token = answer.json()["token"]
        sessions = client.get("/v1/sessions", headers={"Authorization": f"Bearer {token}"})
        assert sessions.status_code == 200 and sessions.json() == {"sessions": []}
        for body in (b"", b"[]", b'{"user": 7}', b'{"user": ""}', b'{"user": " dora"}',
                     json.dumps({"user": "x" * 129}).encode(), b'{"user": "a\\u0000b"}', b'{"name": "dora"}'):
            refused = client.post("/local/token", content=body, headers={"content-type": "application/json"})
            assert refused.status_code == 422 and "user" in refused.json()["message"], body
        assert client.get("/local/token").status_code == 404  # only POST signs in
        assert client.get("/local/stack").json()["local"] is True


def test_local_sign_in_names_the_users_app_and_refuses_an_app_that_is_not_served(local_server, db):
    import jwt

    from eros.store import apps as app_store
    from eros.store import personas as persona_store

    app_store.create("acme", "Acme", {}, db)
    persona_store.keep_app("acme", "nova", "Nova", "", "You are Nova, a patient tutor.")
    app_store.create("gone", "Gone", {}, db)
    db.execute("UPDATE engine.apps SET deleted_at = now() WHERE id = 'gone'")  # being deleted: served no more
    claim = local_server.settings.app_claim
    with httpx.Client(base_url=local_server.url, timeout=30) as client:
        answer = client.post("/local/token", json={"user": "dora", "app": "acme"})
        assert answer.status_code == 200 and (answer.json()["user"], answer.json()["app"]) == ("dora", "acme")
        token = answer.json()["token"]
        assert jwt.decode(token, options={"verify_signature": False})[claim] == "acme"
        personas = client.get("/v1/personas", headers={"Authorization": f"Bearer {token}"}).json()["personas"]
        assert [p["id"] for p in personas] == ["nova"]  # acme's dora: acme's personas
        for body in ({"user": "dora"}, {"user": "dora", "app": ""}, {"user": "dora", "app": None},
                     {"user": "dora", "app": "default"}):  # the first app's dora, as before apps
            answer = client.post("/local/token", json=body)
            assert answer.status_code == 200 and answer.json()["app"] == "default", body
            assert jwt.decode(answer.json()["token"], options={"verify_signature": False}).get(claim) in \
                (None, "default")
        for app, problem in (("globex", "there is no app 'globex'"), ("gone", "there is no app 'gone'"),
                             ("Acme", "an app id is"), ("a", "an app id is"), ("acme\u001fx", "an app id is"),
                             (7, "an app id is"), (["acme"], "an app id is"), (False, "an app id is")):
            refused = client.post("/local/token", json={"user": "dora", "app": app})
            assert refused.status_code == 422, (app, refused.text)
            assert refused.json()["code"] == "invalid_request" and refused.json()["message"].startswith("app: ")
            assert problem in refused.json()["message"], (app, refused.json())


# What Python's parser cannot read without failing: nesting that exhausts its recursion (a RecursionError that
# dropped the connection unanswered), a number past its digit limit; and what is not JSON at all.
UNREADABLE = [(b"[" * 60_000, "nested deeper than 32 levels"),
              (b'{"user": ' + b"[" * 33 + b'"dora"' + b"]" * 33 + b"}", "nested deeper than 32 levels"),
              (b'{"idle_now": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5000 + b"}", "nested deeper than 32 levels"),
              (b'{"user": ' + b"9" * 5000 + b"}", "too many digits"),
              (b"not json", "not valid JSON"), (b"{", "not valid JSON"), (b'{"user": "dora"', "not valid JSON"),
              (b'{"user": "\xff"}', "not UTF-8")]


@pytest.mark.parametrize("route", ["/local/token", "/local/sweep"])
@pytest.mark.parametrize(("body", "problem"), UNREADABLE, ids=[p for _, p in UNREADABLE])
def test_an_unreadable_body_to_a_local_route_is_answered_400_saying_why(local_server, route, body, problem):
    with local_server.client("alice") as client:
        refused = client.post(route, content=body, headers={"content-type": "application/json"})
        assert refused.status_code == 400, refused.text
        answer = refused.json()
        assert answer["code"] == "invalid_request" and problem in answer["message"], answer
        assert client.get("/local/stack").status_code == 200  # and the server goes on serving


def test_sweep_now_extracts_a_session_that_is_not_quiet_yet_and_says_what_each_job_did(online, db, local_server):
    user = local_server.client("alice")
    sid = user.post("/v1/sessions", json={"persona_id": "luna"}).json()["id"]
    assert user.post(f"/v1/sessions/{sid}/turns", json={"content": "My dog is called Biscuit"}).status_code == 200

    assert httpx.post(f"{local_server.url}/local/sweep", json={}).status_code == 401
    assert user.post("/local/sweep", json={"idle_now": "yes"}).status_code == 422
    waited = user.post("/local/sweep", json={}).json()  # the session is not quiet yet: nothing to do
    assert waited["claimed"] == 0 and waited["jobs"] == []

    done = user.post("/local/sweep", json={"idle_now": True})
    assert done.status_code == 200
    result = done.json()
    assert result["claimed"] == 1
    [job] = result["jobs"]
    assert (job["kind"], job["session_id"], job["outcome"], job["memories"]) == ("session", sid, "extracted", 1)
    memories = user.get("/v1/memories?layer=profile").json()["memories"]
    assert [m["content"] for m in memories] == ["Has a dog named Biscuit"]
    assert [s["dreaming"]["state"] for s in user.get("/v1/sessions").json()["sessions"]] == ["extracted"]


@pytest.mark.parametrize("path", ["/console/../template.yaml", "/console/nope.js", "/console/index.html.bak",
                                  "/console/%2e%2e/README.md", "/console/Index.html", "/console/.hidden"])
def test_the_console_serves_its_own_files_and_nothing_else(local_server, path):
    answer = httpx.get(f"{local_server.url}{path}")  # (a client may fold "..": then the API refuses it)
    assert answer.status_code in (401, 404) and "Transform" not in answer.text and "eros" not in answer.text


def test_the_console_page_may_reach_only_its_own_origin(local_server):
    page = httpx.get(f"{local_server.url}/console/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy and "script-src 'self'" in policy
    assert "<script" in page.text and "http" not in page.text.split("<body", 1)[0].replace("http-equiv", "")
    script = httpx.get(f"{local_server.url}/console/console.js")
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")


@pytest.mark.parametrize("query", ["", "?api=http://127.0.0.1:9"])
def test_the_console_without_its_trailing_slash_is_redirected_to_it(local_server, query):
    """/console would load the page with its styles and script resolved against / (not found): it redirects."""
    for method in ("GET", "HEAD"):
        answer = httpx.request(method, f"{local_server.url}/console{query}")
        assert answer.status_code == 308 and answer.headers["location"] == f"/console/{query}", method
    page = httpx.get(f"{local_server.url}/console{query}", follow_redirects=True)
    assert page.status_code == 200 and str(page.url) == f"{local_server.url}/console/{query}"
    assert '<link rel="stylesheet" href="console.css">' in page.text
