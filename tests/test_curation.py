"""The user curating their memory: POST /v1/memories (a memory they state) and PATCH /v1/memories/{id}
(an edit: a new version that supersedes the old, history kept), through the chat handler, with the fake
Voyage on loopback counting what is embedded."""

from __future__ import annotations

import json

import pytest
from apiclient import Api
from fakes import Status
from pgvector import Vector
from test_memory_history import containers, queued_on_a_held_row

from eros.memory import MemoryLayer
from eros.providers.offline import hash_embed


@pytest.fixture
def api(providers):
    return Api()


def documents(fake_voyage) -> list[list[str]]:
    return [r["json"]["input"] for r in fake_voyage.requests if r["json"]["input_type"] == "document"]


def dreamed(db, user: str = "alice", content: str = "Lives in Shanghai") -> str:
    """A profile memory as dreaming writes it, with its provenance."""
    inst = db.execute("INSERT INTO engine.persona_instances (user_id, persona_id) VALUES (%s, 'luna')"
                      " ON CONFLICT (user_id, persona_id) DO UPDATE SET user_id = EXCLUDED.user_id RETURNING id",
                      (user,)).fetchone()["id"]
    sid = db.execute("INSERT INTO engine.chat_sessions (user_id, instance_id) VALUES (%s, %s) RETURNING id",
                     (user, inst)).fetchone()["id"]
    return str(db.execute(
        "INSERT INTO engine.companion_memories (user_id, session_id, content, embedding, category, importance,"
        " source, from_message_id, through_message_id, metadata) VALUES (%s, %s, %s, %s, 'fact', 0.6, 'dreaming',"
        " 11, 14, '{\"model\": \"dreamer\"}') RETURNING id",
        (user, sid, content, Vector(hash_embed(content)))).fetchone()["id"])


def stored(db) -> int:
    return db.execute("SELECT count(*) AS n FROM engine.companion_memories").fetchone()["n"]


# --- POST /v1/memories ---------------------------------------------------------------------------------------

def test_a_stated_memory_is_embedded_once_stored_as_the_users_and_recalled(api, providers, db):
    fake_llm, fake_voyage = providers
    status, memory = api.call("POST", "/v1/memories",
                              {"content": "  My dog is called Biscuit ", "category": "relation"})
    assert status == 201
    assert (memory["content"], memory["category"], memory["layer"], memory["source"]) == (
        "My dog is called Biscuit", "relation", "profile", "user")
    assert memory["importance"] == pytest.approx(0.8) and memory["last_confirmed_at"] is not None
    assert memory["session_id"] is None and memory["history"] == [{k: v for k, v in memory.items() if k != "history"}]
    assert documents(fake_voyage) == [["My dog is called Biscuit"]]
    assert [m["id"] for m in api.call("GET", "/v1/memories")[1]["memories"]] == [memory["id"]]
    assert api.call("GET", f"/v1/memories/{memory['id']}", user="bob")[0] == 404

    sid = api.session()
    reply = api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "what is my dog called?"})[1]
    assert memory["id"] in [r["id"] for r in reply["recalled"]]
    assert "My dog is called Biscuit" in fake_llm.requests[-1]["json"]["messages"][0]["content"]
    assert db.execute("SELECT chat_tokens FROM engine.user_usage WHERE user_id = 'alice'").fetchone()["chat_tokens"] > 0


@pytest.mark.parametrize("body", [
    {}, {"content": "x"}, {"category": "fact"}, {"content": "", "category": "fact"},
    {"content": "   ", "category": "fact"},
    {"content": "x" * 4001, "category": "fact"}, {"content": "a\u0000b", "category": "fact"},
    {"content": "x", "category": "hobby"}, {"content": "x", "category": "fact", "importance": 1.5},
    {"content": "x", "category": "fact", "importance": "high"},
    {"content": "x", "category": "fact", "source": "dreaming"},
    {"content": "x", "category": "fact", "user_id": "bob"}, {"content": ["x"], "category": "fact"},
], ids=lambda b: ",".join(f"{k}={str(v)[:12]}" for k, v in b.items()) or "empty")
def test_a_bad_memory_is_refused_before_anything_is_embedded_or_stored(api, providers, db, body):
    _, fake_voyage = providers
    status, answer = api.call("POST", "/v1/memories", body)
    assert status == 422 and answer["code"] == "invalid_request", answer
    assert fake_voyage.calls == 0 and stored(db) == 0


# What the importance column (float4) can hold: a number float4 rounds to 0 (below ~1.4e-45) was an underflow
# error in Postgres, a 500 after the embedding was paid for. It is rounded as float4 rounds every other
# number (0.1 is stored as 0.100000001), so what is too small for the column is 0 and -0 is 0.
IMPORTANCE_STORED_AS = [("1e-100", 0.0), ("1e-50", 0.0), ("5e-324", 0.0), ("2.2250738585072014e-308", 0.0),
                        ("1e-46", 0.0), ("7e-46", 0.0), ("1e-40", pytest.approx(1e-40, rel=1e-3)),
                        ("-0.0", 0.0), ("-1e-100", 0.0), ("0.999999999", 1.0), ("1.0000000000000001", 1.0),
                        ("0", 0.0), ("1", 1.0), ("1E0", 1.0), ("1e-1000000", 0.0)]
# And what no float4 in 0..1 is: refused, naming body.importance, before anything is embedded.
IMPORTANCE_REFUSED = ["NaN", "Infinity", "-Infinity", "1e39", "1e400", "1.0000001", "-1e-30", "true", "[0.5]",
                      "\"0.5e-100\""]


@pytest.mark.parametrize(("importance", "stored_as"), IMPORTANCE_STORED_AS, ids=[v for v, _ in IMPORTANCE_STORED_AS])
def test_an_importance_float4_cannot_hold_is_stored_rounded_as_float4(api, providers, db, importance, stored_as):
    raw = f'{{"content": "Likes green tea", "category": "preference", "importance": {importance}}}'
    status, memory = api.call("POST", "/v1/memories", raw=raw.encode())
    assert status == 201, memory
    assert memory["importance"] == stored_as and str(memory["importance"]) != "-0.0"
    assert db.execute("SELECT importance FROM engine.companion_memories").fetchone()["importance"] == stored_as
    edit = f'{{"importance": {importance}}}'
    status, edited = api.call("PATCH", f"/v1/memories/{memory['id']}", raw=edit.encode())
    assert status == 200 and edited["importance"] == stored_as, edited


@pytest.mark.parametrize("importance", IMPORTANCE_REFUSED)
def test_an_importance_no_float4_in_0_to_1_holds_is_refused_before_paying(api, providers, db, importance):
    _, fake_voyage = providers
    raw = f'{{"content": "Likes green tea", "category": "preference", "importance": {importance}}}'
    status, answer = api.call("POST", "/v1/memories", raw=raw.encode())
    assert status in (400, 422) and answer["code"] == "invalid_request", answer
    assert status == 400 or [e["field"] for e in answer["errors"]] == ["body.importance"], answer
    assert fake_voyage.calls == 0 and stored(db) == 0
    kept = api.call("POST", "/v1/memories", {"content": "Likes tea", "category": "preference", "importance": 0.5})[1]
    status, answer = api.call("PATCH", f"/v1/memories/{kept['id']}", raw=f'{{"importance": {importance}}}'.encode())
    assert status in (400, 422) and answer["code"] == "invalid_request", answer
    assert api.call("GET", f"/v1/memories/{kept['id']}")[1]["importance"] == 0.5  # nothing stored is lost


def test_a_memory_without_a_token_is_refused(api, providers, db):
    assert api.call("POST", "/v1/memories", {"content": "x", "category": "fact"}, user=None)[0] == 401
    assert stored(db) == 0


@pytest.mark.parametrize("failure,status,retryable", [(Status(503), 503, True), (Status(400), 502, False)])
def test_an_embedder_failure_stores_nothing_and_says_whether_to_retry(api, providers, db, failure, status, retryable):
    _, fake_voyage = providers
    fake_voyage.push(failure)
    code, answer = api.call("POST", "/v1/memories", {"content": "Likes tea", "category": "preference"})
    assert code == status and answer["retryable"] is retryable and "nothing was stored" in answer["message"]
    assert "fake provider error" not in answer["message"] and stored(db) == 0


# --- PATCH /v1/memories/{id} ---------------------------------------------------------------------------------

def test_an_edit_is_a_new_version_that_supersedes_the_old_and_keeps_its_provenance(api, providers, db):
    _, fake_voyage = providers
    old = dreamed(db)
    status, new = api.call("PATCH", f"/v1/memories/{old}", {"content": "Lives in Tokyo"})
    assert status == 200 and new["id"] != old
    assert (new["content"], new["category"], new["importance"], new["source"]) == (
        "Lives in Tokyo", "fact", pytest.approx(0.6), "user")
    assert (new["from_message_id"], new["through_message_id"], new["session_id"]) == (
        11, 14, api.call("GET", f"/v1/memories/{old}")[1]["session_id"])
    assert new["supersedes"] == [old] and [m["id"] for m in new["history"]] == [old, new["id"]]
    previous = api.call("GET", f"/v1/memories/{old}")[1]
    assert (previous["superseded_by"], previous["superseded_reason"]) == (new["id"], "edited")
    assert documents(fake_voyage) == [["Lives in Tokyo"]]  # embedded once
    assert [m["content"] for m in api.call("GET", "/v1/memories")[1]["memories"]] == ["Lives in Tokyo"]

    # Only the category or importance: nothing to embed again; the embedding is the old one.
    status, recategorised = api.call("PATCH", f"/v1/memories/{new['id']}", {"category": "event", "importance": 0.9})
    assert status == 200 and recategorised["content"] == "Lives in Tokyo" and recategorised["category"] == "event"
    assert len(documents(fake_voyage)) == 1
    same = db.execute("SELECT (a.embedding = b.embedding) AS same FROM engine.companion_memories a,"
                      " engine.companion_memories b WHERE a.id = %s AND b.id = %s",
                      (new["id"], recategorised["id"])).fetchone()["same"]
    assert same
    # The user can still go back: restoring the first version supersedes the current one ('reverted').
    assert api.call("POST", f"/v1/memories/{old}/restore")[0] == 200
    assert [m["content"] for m in api.call("GET", "/v1/memories")[1]["memories"]] == ["Lives in Shanghai"]


def test_an_edit_that_changes_the_fact_outdates_what_was_said_of_the_old_one(api, providers, db):
    old = dreamed(db, content="Lives in Shangai")
    place = db.execute("SELECT m.session_id, s.instance_id FROM engine.companion_memories m JOIN engine.chat_sessions s"
                       " ON s.id = m.session_id WHERE m.id = %s", (old,)).fetchone()
    said = db.execute(
        "INSERT INTO engine.companion_memories (user_id, session_id, instance_id, content, embedding, source,"
        " from_message_id, through_message_id) VALUES ('alice', %s, %s, 'I live in Shanghai', %s, 'utterance', 12, 12)"
        " RETURNING id", (place["session_id"], place["instance_id"], Vector(hash_embed("I live in Shanghai")))
    ).fetchone()["id"]

    def outdated() -> bool:
        row = db.execute("SELECT superseded_reason FROM engine.companion_memories WHERE id = %s", (said,)).fetchone()
        return row["superseded_reason"] == "outdated"

    current = api.call("PATCH", f"/v1/memories/{old}", {"category": "event"})[1]["id"]  # the same fact
    assert not outdated()
    current = api.call("PATCH", f"/v1/memories/{current}", {"content": "Lives in Shanghai"})[1]["id"]  # a spelling fix
    assert not outdated()
    api.call("PATCH", f"/v1/memories/{current}", {"content": "Lives in Berlin"})  # another fact
    assert outdated()
    recalled = api.call("POST", "/v1/memories/search", {"query": "I live in Shanghai", "layer": "relationship",
                                                        "persona_id": "luna"})[1]["results"]
    assert str(said) not in [r["id"] for r in recalled]


def test_what_cannot_be_edited_is_refused_and_changes_nothing(api, providers, db):
    _, fake_voyage = providers
    old = dreamed(db)
    theirs = dreamed(db, user="bob", content="Lives in Oslo")
    current = api.call("PATCH", f"/v1/memories/{old}", {"importance": 0.7})[1]["id"]
    before = stored(db)
    cases = [
        (f"/v1/memories/{old}", {"content": "Lives in Kyoto"}, 409, "memory_not_current"),  # history
        (f"/v1/memories/{theirs}", {"content": "mine now"}, 404, "not_found"),  # another user's
        ("/v1/memories/00000000-0000-4000-8000-000000000000", {"importance": 0.1}, 404, "not_found"),
        ("/v1/memories/not-a-uuid", {"importance": 0.1}, 422, "invalid_request"),
        (f"/v1/memories/{current}", {}, 422, "invalid_request"),
        (f"/v1/memories/{current}", {"content": None}, 422, "invalid_request"),
        (f"/v1/memories/{current}", {"content": ""}, 422, "invalid_request"),
        (f"/v1/memories/{current}", {"category": "hobby"}, 422, "invalid_request"),
        (f"/v1/memories/{current}", {"importance": -0.1}, 422, "invalid_request"),
        (f"/v1/memories/{current}", {"superseded_at": None, "importance": 0.2}, 422, "invalid_request"),
    ]
    for path, body, status, code in cases:
        answer = api.call("PATCH", path, body)
        assert (answer[0], answer[1]["code"]) == (status, code), (path, body, answer)
    assert stored(db) == before and fake_voyage.calls == 0
    assert api.call("PATCH", f"/v1/memories/{current}", {"importance": 0.2}, user=None)[0] == 401
    # A relationship utterance is what was said: it is not edited.
    sid = api.session()
    api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "I said this"})
    utterance = api.call("GET", "/v1/memories?layer=relationship")[1]["memories"][0]["id"]
    assert api.call("PATCH", f"/v1/memories/{utterance}", {"importance": 0.3})[1]["code"] == "memory_not_current"


def test_two_edits_of_one_version_at_once_make_one_successor(api, providers, db, database_url):
    old = dreamed(db)
    results: list[int] = []
    queued_on_a_held_row(db, database_url, old, [
        lambda c=c, i=i: results.append(c.call("PATCH", f"/v1/memories/{old}", {"content": f"Lives in city {i}"})[0])
        for i, c in enumerate(containers(2))], "the two edits")
    assert sorted(results) == [200, 409]
    assert len(api.call("GET", "/v1/memories")[1]["memories"]) == 1


# --- POST /v1/memories/search --------------------------------------------------------------------------------

def test_search_ranks_like_a_turn_and_says_why(api, providers, db):
    from eros.config import settings
    from eros.store import recall as recall_store

    fake_llm, fake_voyage = providers
    for content, category in (("Has a dog named Biscuit", "relation"), ("Works as a nurse", "fact"),
                              ("Loves hiking", "preference")):
        assert api.call("POST", "/v1/memories", {"content": content, "category": category})[0] == 201
    dreamed(db, user="bob", content="Has a dog named Rex")
    status, body = api.call("POST", "/v1/memories/search", {"query": "dog", "k": 2})
    assert status == 200 and len(body["results"]) == 2
    best = body["results"][0]
    parts = best["parts"]
    assert best["score"] == pytest.approx(parts["similarity"] + parts["recency"] + parts["importance"]
                                          + parts["lexical"] - parts["demotion"])
    # "dog" is a word of the best row only: its lexical part is the whole weight, the other's nothing.
    assert best["content"] == "Has a dog named Biscuit"
    assert parts["lexical"] == pytest.approx(settings().recall.lexical_weight)
    assert body["results"][1]["parts"]["lexical"] == 0
    assert best["source"] == "user" and "Rex" not in json.dumps(body)  # provenance shown; bob's never
    # The same order and scores as the statement a turn recalls with, for the same query vector.
    query = fake_voyage.requests[-1]["json"]
    assert query["input_type"] == "query" and query["input"] == ["dog"]
    rows = recall_store.ranked(MemoryLayer.PROFILE, settings().recall, "alice", hash_embed("dog"), k=2, cap=None,
                               message="dog")
    assert [(str(r["id"]), r["score"]) for r in rows] == [(r["id"], pytest.approx(r["score"])) for r in body["results"]]
    scores = [r["score"] for r in body["results"]]
    assert scores == sorted(scores, reverse=True)
    # A category filter and a layer: only those.
    facts = api.call("POST", "/v1/memories/search", {"query": "dog", "category": "fact"})[1]["results"]
    assert [r["content"] for r in facts] == ["Works as a nurse"]


def test_search_of_a_personas_relationship_layer_and_its_bad_inputs(api, providers, db):
    _, fake_voyage = providers
    sid = api.session(persona="luna")
    api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "I walked the dog by the river"})
    found = api.call("POST", "/v1/memories/search", {"query": "river", "layer": "relationship",
                                                    "persona_id": "luna"})[1]["results"]
    assert [r["layer"] for r in found] == ["relationship"] and found[0]["persona_id"] == "luna"
    assert api.call("POST", "/v1/memories/search", {"query": "river", "persona_id": "kai"})[0] == 404
    calls = fake_voyage.calls
    for body in ({}, {"query": ""}, {"query": "x", "k": 0}, {"query": "x", "k": 51}, {"query": "x", "layer": "all"},
                 {"query": "x", "category": "hobby"}, {"query": "a\u0000b"}, {"query": "x", "user_id": "bob"},
                 {"query": "x" * 4001}):
        status, answer = api.call("POST", "/v1/memories/search", body)
        assert status == 422 and answer["code"] == "invalid_request", (body, answer)
    assert fake_voyage.calls == calls  # nothing refused was embedded
    assert api.call("POST", "/v1/memories/search", {"query": "x"}, user=None)[0] == 401
    fake_voyage.push(Status(503))
    status, answer = api.call("POST", "/v1/memories/search", {"query": "river"})
    assert status == 503 and answer["retryable"] is True
