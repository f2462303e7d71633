"""Spend limits (issue 8 item 10): a per-user turn rate and daily token budget kept in Postgres, checked
before any provider call (429 with Retry-After); the tokens of every provider call recorded per user per
day; and a user over the budget is not dreamt about until the budget resets (the session waits)."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from uuid import UUID

import pytest
from apiclient import Api
from fakes import NOON

from eros import chat
from eros.store import usage as usage_store
from eros.usage import OverLimit
from eros_dev.dreaming import sweep_locally
from eros_dev.lambda_runtime import LambdaContext, load_function
from eros_dev.server import http_api_event

EXTRACTED = json.dumps({"memories": [{"content": "Works at a bakery", "category": "fact", "importance": 0.6}]})




@pytest.fixture
def online(providers, clock):
    providers[0].responder = lambda body: EXTRACTED if body.get("response_format") else "fake reply"
    return providers


def turn(sid: str, content: str = "hello", user: str = "alice") -> tuple[int, dict, dict]:
    """One turn through the chat handler: (status, headers, body)."""
    event = http_api_event("POST", f"/v1/sessions/{sid}/turns", {"content-type": "application/json"},
                           json.dumps({"content": content}).encode(), {"sub": user, "iss": "test", "aud": "test"})
    result = load_function("chat").lambda_handler(event, LambdaContext("chat"))
    return result["statusCode"], result.get("headers") or {}, json.loads(result["body"])


def provider_calls(fake_llm, fake_voyage) -> int:
    return len(fake_llm.requests) + len(fake_voyage.requests)


def usage_row(db, user: str, day) -> dict | None:
    return db.execute("SELECT * FROM engine.user_usage WHERE user_id = %s AND day = %s", (user, day)).fetchone()


# --- the turn rate -------------------------------------------------------------------------------------
def test_over_the_turn_rate_is_429_with_retry_after_and_no_provider_call(online, db, env, clock):
    fake_llm, fake_voyage = online
    env(TURNS_PER_MINUTE=2)
    sid = Api().session()
    answered = http_api_event("POST", f"/v1/sessions/{sid}/turns", {"content-type": "application/json"},
                              json.dumps({"content": "first", "client_turn_id": "t-1"}).encode(),
                              {"sub": "alice", "iss": "test", "aud": "test"})
    assert load_function("chat").lambda_handler(dict(answered), LambdaContext("chat"))["statusCode"] == 200
    assert turn(sid)[0] == 200
    paid = provider_calls(fake_llm, fake_voyage)

    status, headers, body = turn(sid, "one more")
    assert status == 429
    assert headers["Retry-After"] == "50"  # the minute window ends 50 s after 12:00:10
    assert body["code"] == "rate_limited" and body["limit"] == 2 and body["retry_after"] == 50
    assert provider_calls(fake_llm, fake_voyage) == paid  # refused before any provider call
    # Nothing of the refused turn was stored.
    assert db.execute("SELECT count(*) AS n FROM engine.chat_messages WHERE content = 'one more'").fetchone()["n"] == 0

    # A client's retry of an answered turn is a free replay, not refused.
    again = load_function("chat").lambda_handler(dict(answered), LambdaContext("chat"))
    assert again["statusCode"] == 200 and json.loads(again["body"])["replayed"] is True
    assert turn(sid, "still no")[0] == 429

    # Other users are not affected.
    assert turn(Api().session(user="bob"), user="bob")[0] == 200
    # The next window admits again.
    clock.moment = NOON + timedelta(seconds=50)
    assert turn(sid, "one more")[0] == 200


def test_concurrent_turns_of_one_user_cannot_exceed_the_rate(online, db, env):
    env(TURNS_PER_MINUTE=5, LLM_BASE_URL=None, OPENROUTER_API_KEY=None, EMBED_BASE_URL=None, VOYAGE_API_KEY=None)
    api = Api()
    sessions = [api.session() for _ in range(16)]
    start, outcomes = threading.Barrier(16), []

    def sender(sid: str) -> None:
        start.wait(10)
        try:
            chat.take_turn("alice", UUID(sid), "hi", None)
            outcomes.append("ok")
        except OverLimit as exc:
            outcomes.append(exc.code)
        except Exception as exc:  # noqa: BLE001 - reported below
            outcomes.append(repr(exc))

    threads = [threading.Thread(target=sender, args=(sid,)) for sid in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(outcomes) == ["ok"] * 5 + ["rate_limited"] * 11, outcomes
    assert usage_row(db, "alice", NOON.date())["turns"] == 5
    assert db.execute("SELECT count(*) AS n FROM engine.chat_messages WHERE role = 'assistant'").fetchone()["n"] == 5
    # Each answered turn's two calls are itemised exactly once, however the 16 statements interleaved.
    itemised = db.execute("SELECT model, calls FROM engine.user_model_usage WHERE user_id = 'alice'").fetchall()
    assert {r["model"]: r["calls"] for r in itemised} == {"offline/echo": 5, "offline/lexical-hash-512": 5}


# --- the daily token budget ------------------------------------------------------------------------
def test_budget_exhausted_is_429_until_midnight_utc_then_resets(online, db, env, clock):
    fake_llm, fake_voyage = online
    env(DAILY_TOKEN_BUDGET=10)
    sid = Api().session()
    status, _, body = turn(sid, "tell me a long story about the sea")
    assert status == 200
    used = usage_row(db, "alice", NOON.date())
    assert used["tokens"] == used["chat_tokens"] >= 10  # the chat model's and the query embedding's tokens
    paid = provider_calls(fake_llm, fake_voyage)

    status, headers, body = turn(sid)
    assert status == 429 and body["code"] == "budget_exhausted" and body["limit"] == 10
    midnight = datetime(2026, 3, 15, tzinfo=UTC)
    assert int(headers["Retry-After"]) == (midnight - NOON).total_seconds() == body["retry_after"]
    assert provider_calls(fake_llm, fake_voyage) == paid
    assert turn(Api().session(user="bob"), user="bob")[0] == 200  # bob has his own budget

    clock.moment = midnight + timedelta(seconds=1)  # a new UTC day: a new budget
    assert turn(sid)[0] == 200
    assert usage_row(db, "alice", midnight.date())["turns"] == 1


def test_chat_turn_usage_matches_what_the_providers_reported(online, db):
    fake_llm, fake_voyage = online
    sid = Api().session()
    assert turn(sid, "how are you today?")[0] == 200
    completion = [r for r in fake_llm.requests if not r["json"].get("response_format")]
    assert len(completion) == 1
    reported = db.execute("SELECT metadata FROM engine.chat_messages WHERE session_id = %s AND role = 'assistant'",
                          (sid,)).fetchone()["metadata"]["usage"]
    llm_tokens = reported["total_tokens"] if "total_tokens" in reported else \
        reported["prompt_tokens"] + reported["completion_tokens"]
    embedded = usage_row(db, "alice", NOON.date())["chat_tokens"] - llm_tokens
    assert embedded >= 1  # the query embedding is counted too


# --- dreaming ------------------------------------------------------------------------------------------
def go_idle(db) -> None:
    db.execute("UPDATE engine.chat_sessions SET last_active_at = %s", (NOON - timedelta(hours=2),))


def test_extraction_usage_is_recorded_per_user_per_day(online, db):
    sid = Api().session()
    assert turn(sid, "I started a new job at a bakery")[0] == 200
    chat_tokens = usage_row(db, "alice", NOON.date())["tokens"]
    go_idle(db)
    assert sweep_locally()["invoked"] == 1
    row = usage_row(db, "alice", NOON.date())
    assert db.execute("SELECT extracted_at FROM engine.chat_sessions WHERE id = %s", (sid,)).fetchone()["extracted_at"]
    assert row["dream_tokens"] > 0  # the extraction call and the new row's embedding
    assert row["tokens"] == chat_tokens + row["dream_tokens"]


def test_a_user_over_budget_is_deferred_not_lost_and_extracted_after_the_reset(online, db, env, clock):
    fake_llm, _ = online
    sid = Api().session()
    bob = Api().session(user="bob")
    assert turn(sid, "I started a new job at a bakery")[0] == 200
    assert turn(bob, "I started a new job at a bakery", user="bob")[0] == 200
    env(DAILY_TOKEN_BUDGET=10)  # alice's turn used more than that; so did bob's: give bob room
    db.execute("UPDATE engine.user_usage SET tokens = 0 WHERE user_id = 'bob'")
    go_idle(db)
    extractions = lambda: len([r for r in fake_llm.requests if r["json"].get("response_format")])  # noqa: E731

    assert sweep_locally()["invoked"] == 2
    assert extractions() == 1  # bob's only: alice's session waits without a provider call
    row = db.execute("SELECT * FROM engine.chat_sessions WHERE id = %s", (sid,)).fetchone()
    midnight = datetime(2026, 3, 15, tzinfo=UTC)
    assert row["extracted_at"] is None and row["extraction_claimed_at"] is None
    assert row["extraction_next_attempt_at"] == midnight
    assert (row["extraction_attempts"], row["extraction_retries"], row["extraction_gave_up"]) == (0, 0, None)

    clock.moment = midnight - timedelta(seconds=1)
    assert sweep_locally()["claimed"] == 0  # still today: not claimed again
    clock.moment = midnight + timedelta(minutes=5)
    assert sweep_locally()["invoked"] == 1
    row = db.execute("SELECT * FROM engine.chat_sessions WHERE id = %s", (sid,)).fetchone()
    assert row["extracted_at"] is not None and row["extraction_error"] is None
    assert extractions() == 2
    assert usage_row(db, "alice", midnight.date())["dream_tokens"] > 0


def test_a_user_over_budget_has_the_deep_pass_deferred_then_run_and_recorded_after_the_reset(online, db, env, clock):
    from test_deep_pass import claim_all, claim_one, copies, due, state

    from eros.config import settings
    from eros.dreaming import deep_pass

    fake_llm, _ = online
    fake_llm.responder = lambda body: json.dumps({"actions": []})
    clock.moment = datetime.now(UTC)
    midnight = usage_store.next_day(clock.moment)
    env(DAILY_TOKEN_BUDGET=10)
    usage_store.record("alice", usage_store.Call("chat", "m", 10), clock.moment)  # the day's budget is spent
    copies(db, "alice", "Lives in Shanghai", 3)
    due(db, "alice")

    result = deep_pass.run(settings(), "alice", claim_one(db, "alice"))
    assert result.outcome == "deferred" and fake_llm.requests == []
    held = state(db, "alice")
    assert held["claimed_at"] is None and held["next_attempt_at"] == midnight
    assert (held["attempts"], held["retries"]) == (0, 0)
    assert claim_all(now=midnight - timedelta(seconds=1)) == []  # waits for the reset

    clock.moment = midnight + timedelta(seconds=1)
    [again] = claim_all(now=clock.moment)
    result = deep_pass.run(settings(), "alice", again["claim_token"])
    assert result.outcome != "deferred" and result.llm_calls == 1
    assert usage_row(db, "alice", midnight.date())["dream_tokens"] > 0


# --- the memory API's embeddings: admitted and counted as turns are (issue 25, item 4) -----------------------
def request(method: str, path: str, body: dict | None = None, user: str = "alice") -> tuple[int, dict, dict | None]:
    """One request through the chat handler: (status, headers, body)."""
    event = http_api_event(method, path, {"content-type": "application/json"},
                           json.dumps(body).encode() if body is not None else b"",
                           {"sub": user, "iss": "test", "aud": "test"})
    result = load_function("chat").lambda_handler(event, LambdaContext("chat"))
    return result["statusCode"], result.get("headers") or {}, json.loads(result["body"]) if result["body"] else None


SEARCH = ("POST", "/v1/memories/search", {"query": "where do I live?"})
STATE = ("POST", "/v1/memories", {"content": "I live in Lisbon", "category": "fact"})


def test_memory_requests_that_embed_share_the_turn_rate_and_a_refusal_is_the_turns_429(online, db, env, clock):
    fake_llm, fake_voyage = online
    env(TURNS_PER_MINUTE=3)
    status, _, memory = request(*STATE)
    assert status == 201
    assert request(*SEARCH)[0] == 200
    assert turn(Api().session())[0] == 200  # three paying requests in this minute: the rate is spent
    assert usage_row(db, "alice", NOON.date())["window_turns"] == 3
    paid = provider_calls(fake_llm, fake_voyage)
    edit = ("PATCH", f"/v1/memories/{memory['id']}", {"content": "I live in Porto"})
    for method, path, body in (SEARCH, STATE, edit):
        status, headers, answer = request(method, path, body)
        assert status == 429, (path, answer)
        assert answer["code"] == "rate_limited" and answer["limit"] == 3 and answer["retry_after"] == 50
        assert headers["Retry-After"] == "50" and answer["retryable"] is True
    assert provider_calls(fake_llm, fake_voyage) == paid  # refused before the embedding
    # Nothing of the refused requests was stored; an edit that pays nothing is not limited.
    stated = db.execute("SELECT content FROM engine.companion_memories WHERE source = 'user'").fetchall()
    assert [m["content"] for m in stated] == ["I live in Lisbon"]
    assert request("PATCH", f"/v1/memories/{memory['id']}", {"importance": 0.9})[0] == 200
    clock.moment = NOON + timedelta(seconds=50)  # the next window
    assert request(*SEARCH)[0] == 200


def test_memory_requests_that_embed_obey_the_budget_and_are_counted(online, db, env, clock):
    fake_llm, fake_voyage = online
    env(DAILY_TOKEN_BUDGET=40)
    assert request(*SEARCH)[0] == 200
    assert request(*STATE)[0] == 201
    curation = db.execute("SELECT calls, input_tokens FROM engine.user_model_usage WHERE purpose = 'curation'"
                          ).fetchone()
    used = usage_row(db, "alice", NOON.date())
    assert curation["calls"] == 2 and used["tokens"] == curation["input_tokens"] > 0
    assert used["reservations"] == {}  # each settled its reservation
    db.execute("UPDATE engine.user_usage SET tokens = 40")  # the day's budget is spent
    paid = provider_calls(fake_llm, fake_voyage)
    for method, path, body in (SEARCH, STATE):
        status, headers, answer = request(method, path, body)
        assert status == 429 and answer["code"] == "budget_exhausted" and answer["limit"] == 40
        assert int(headers["Retry-After"]) == answer["retry_after"] == (datetime(2026, 3, 15, tzinfo=UTC) - NOON
                                                                         ).total_seconds()
    assert provider_calls(fake_llm, fake_voyage) == paid


def test_a_memory_embedding_that_fails_releases_its_reservation(online, db, env, clock):
    from fakes import Status

    _, fake_voyage = online
    env(DAILY_TOKEN_BUDGET=1000)
    fake_voyage.push(Status(503))
    status, _, answer = request(*SEARCH)
    assert status == 503 and answer["code"] == "model_unavailable"
    row = usage_row(db, "alice", NOON.date())
    assert row["reservations"] == {} and row["tokens"] == 0
