"""Dreaming-lite end to end: the SPEC's "trying it" scenario over HTTP, the failure policy (poison pills,
provider outages, the attempts cap), resumed sessions, windowing, and the forgiving parse."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from apiclient import Api
from fakes import Delay, Status
from helpers import go_idle

from eros import dreaming
from eros.config import settings
from eros.dreaming import session
from eros.extraction import Unparsable, normalise_category, parse_candidates, windows
from eros_dev.dreaming import sweep_locally

EXTRACTED = json.dumps({"memories": [
    {"content": "Lives in Shanghai", "category": "fact", "importance": 0.6},
    {"content": "Her mother pushes her to marry", "category": "relation", "importance": 0.95},
    {"content": "Likes mocha", "category": "preference", "importance": 0.2},
]})


def extraction_requests(fake) -> list[dict]:
    return [r["json"] for r in fake.requests if r["json"].get("response_format")]


def chat_requests(fake) -> list[dict]:
    return [r["json"] for r in fake.requests if not r["json"].get("response_format")]


@pytest.fixture
def online(providers, env):
    """Real HTTP providers (the fakes), extraction answers EXTRACTED unless a test says otherwise."""
    answer_extraction_with(providers[0], EXTRACTED)
    env(DREAMING_IDLE_SECS=1800)
    return providers


def sweep_now() -> dict:
    return sweep_locally()


def session_row(db, sid) -> dict:
    return db.execute("SELECT * FROM engine.chat_sessions WHERE id = %s", (sid,)).fetchone()


def profile_rows(db) -> list[dict]:
    return db.execute("SELECT content, category, importance, session_id FROM engine.companion_memories"
                      " WHERE instance_id IS NULL ORDER BY content").fetchall()


def answer_extraction_with(fake_llm, answer: str) -> None:
    """The fake model answers ``answer`` to extraction requests and "fake reply" to chat turns."""
    fake_llm.responder = lambda body: answer if body.get("response_format") else "fake reply"


def chat_then_dream(db, content: str) -> str:
    """One turn in a new session, silence, one sweep. Returns the session id."""
    api = Api()
    sid = api.session()
    api.call("POST", f"/v1/sessions/{sid}/turns", {"content": content})
    go_idle(db)
    assert sweep_now()["invoked"] == 1
    return sid


# --- the SPEC's "trying it" scenario, through the local HTTP server --------------------------------
def test_two_turns_silence_then_categorised_profile_rows_recalled_next_turn(online, db, local_server):
    fake_llm, fake_voyage = online
    client = local_server.client("alice")
    sid = client.post("/v1/sessions", json={"persona_id": "luna"}).json()["id"]
    for text in ("I live in Shanghai and my mother keeps pushing me to marry", "I had a mocha today, love it"):
        assert client.post(f"/v1/sessions/{sid}/turns", json={"content": text}).status_code == 200
    assert sweep_now()["claimed"] == 0  # not idle yet: nothing happens
    go_idle(db)

    result = sweep_now()
    assert (result["claimed"], result["invoked"], result["invoke_failures"]) == (1, 1, 0)
    extraction = extraction_requests(fake_llm)
    assert len(extraction) == 1
    transcript = extraction[0]["messages"][-1]["content"]
    assert "user: I live in Shanghai" in transcript and "assistant: fake reply" in transcript
    assert extraction[0]["model"] == "anthropic/claude-haiku-4.5"

    memories = client.get("/v1/memories?layer=profile").json()["memories"]
    assert sorted((m["category"], m["content"]) for m in memories) == [
        ("fact", "Lives in Shanghai"), ("preference", "Likes mocha"), ("relation", "Her mother pushes her to marry")]
    assert session_row(db, sid)["extracted_at"] is not None
    # The document embeddings came in one batch.
    batches = [r["json"] for r in fake_voyage.requests if r["json"]["input_type"] == "document"]
    assert len(batches) == 1 and len(batches[0]["input"]) == 3

    # The next turn (a new session, another persona) recalls them under their categories.
    other = client.post("/v1/sessions", json={"persona_id": "kai"}).json()["id"]
    reply = client.post(f"/v1/sessions/{other}/turns", json={"content": "Should I visit my mother in Shanghai?"})
    assert reply.status_code == 200
    recalled = reply.json()["recalled"]
    assert {(r["layer"], r["category"]) for r in recalled} >= {("profile", "fact"), ("profile", "relation")}
    system = chat_requests(fake_llm)[-1]["messages"][0]["content"]
    assert "[fact]\n- Lives in Shanghai" in system
    assert "[relation]\n- Her mother pushes her to marry" in system
    assert sweep_now()["claimed"] == 0  # extracted: not claimed again


def test_offline_extractor_makes_categorised_rows_with_no_keys(db):
    api = Api()
    sid = api.session()
    api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "My boss keeps piling on new demands. I love hiking."})
    go_idle(db)
    assert sweep_now()["invoked"] == 1
    rows = profile_rows(db)
    assert {r["category"] for r in rows} == {"relation", "preference"}
    assert all(r["session_id"] == session_row(db, sid)["id"] for r in rows)
    status, body = api.call("GET", "/v1/memories?layer=profile")
    assert status == 200 and len(body["memories"]) == 2


# --- failure policy -------------------------------------------------------------------------------
POISON = {
    "garbage": "I'm sorry, I can't help with that.",
    "empty array": "[]",
    "empty object": '{"memories": []}',
    "one megabyte": "{" + "x" * 1_000_000,
    "wrong shape": '{"memories": "none"}',
}


@pytest.mark.parametrize("answer", POISON.values(), ids=POISON.keys())
def test_poison_pills_are_stamped_with_a_reason_and_never_loop(online, db, answer):
    fake_llm, _ = online
    answer_extraction_with(fake_llm, answer)
    sid = chat_then_dream(db, "hello")
    row = session_row(db, sid)
    assert row["extracted_at"] is not None and row["extraction_claimed_at"] is None
    assert row["extraction_error"]  # why it produced nothing
    assert profile_rows(db) == []
    assert sweep_now()["claimed"] == 0  # no loop
    assert len(extraction_requests(fake_llm)) == 1


def test_fifty_candidates_keep_the_ten_most_important(online, db):
    fake_llm, _ = online
    answer = json.dumps([{"content": f"memory number {i}", "category": "fact", "importance": i / 50}
                         for i in range(50)])
    answer_extraction_with(fake_llm, answer)
    sid = chat_then_dream(db, "lots to say")
    rows = profile_rows(db)
    assert sorted(r["content"] for r in rows) == sorted(f"memory number {i}" for i in range(40, 50))
    assert session_row(db, sid)["extracted_at"] is not None and sweep_now()["claimed"] == 0


def test_categories_in_other_languages_collapse_to_fact(online, db):
    fake_llm, _ = online
    answer = json.dumps({"memories": [
        {"content": "住在上海", "category": "事实", "importance": 0.5},
        {"content": "Aime le café", "category": "préférence", "importance": 0.3},
        {"content": "Is sad lately", "category": "Emotion", "importance": 0.7},
    ]}, ensure_ascii=False)
    answer_extraction_with(fake_llm, answer)
    chat_then_dream(db, "我住在上海")
    assert {(r["content"], r["category"]) for r in profile_rows(db)} == {
        ("住在上海", "fact"), ("Aime le café", "fact"), ("Is sad lately", "emotion")}


def _claimed_session(api, db):
    sid = api.session()
    api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "I started a new job at a bakery"})
    go_idle(db)
    from eros.store import dreaming as store

    now = datetime.now(UTC)
    [row] = store.claim(now, now - timedelta(seconds=600), 10)
    return sid, session.event(row)


@pytest.mark.parametrize("failure", [Status(500), Status(429, retry_after=0), Delay(2)], ids=["500", "429", "timeout"])
def test_provider_outage_is_backed_off_not_stamped_not_counted_then_extracted(online, db, env, failure):
    # Policy change (issue 8 item 3): an outage no longer raises for Lambda's hot retries of the same event;
    # the claim goes back with a backoff (the world's fault: a retry, never one of the session's attempts)
    # and a sweep after the backoff extracts it.
    fake_llm, _ = online
    env(LLM_TIMEOUT_SECS=0.5)
    api = Api()
    sid, payload = _claimed_session(api, db)
    fake_llm.push(failure)
    from eros_dev.lambda_runtime import LambdaContext, load_function

    result = load_function("extract").lambda_handler(payload, LambdaContext("extract"))
    assert (result["outcome"], result["fault"]) == ("retry-later", "world")
    row = session_row(db, sid)
    assert row["extracted_at"] is None and row["extraction_claimed_at"] is None
    assert (row["extraction_attempts"], row["extraction_retries"]) == (0, 1)
    assert row["extraction_error"].startswith("Provider") and "fake provider error" not in row["extraction_error"]
    retry_at = row["extraction_next_attempt_at"]
    assert retry_at.isoformat() == result["retry_at"]
    assert 30 <= (retry_at - row["extraction_retrying_since"]).total_seconds() <= 60  # base 60 s, jittered
    assert profile_rows(db) == []
    # Lambda's async retry of the same event costs nothing: the claim is no longer its.
    assert load_function("extract").lambda_handler(payload, LambdaContext("extract"))["outcome"] == "not-claimed"
    sent = []
    assert dreaming.sweep(settings(), sent.append, now=lambda: retry_at - timedelta(seconds=1)).claimed == 0
    dreaming.sweep(settings(), sent.append, now=lambda: retry_at)  # the backoff is over
    result = load_function("extract").lambda_handler(sent[0], LambdaContext("extract"))
    assert result["outcome"] == "extracted" and len(profile_rows(db)) == 3
    row = session_row(db, sid)
    assert row["extraction_error"] is None and row["extraction_retries"] == 0
    assert row["extraction_next_attempt_at"] is None and row["extraction_retrying_since"] is None


def test_embedding_outage_writes_nothing(online, db):
    _, fake_voyage = online
    api = Api()
    sid, payload = _claimed_session(api, db)
    fake_voyage.push(Status(503))
    result = dreaming.extract_session(settings(), "alice", session_row(db, sid)["id"],
                                      datetime.fromisoformat(payload["claim_token"]))
    assert (result.outcome, result.fault, result.llm_calls) == ("retry-later", "world", 1)
    assert profile_rows(db) == [] and session_row(db, sid)["extracted_at"] is None
    assert "from the embedder" in session_row(db, sid)["extraction_error"]


def test_the_sessions_own_failures_are_counted_and_capped_the_worlds_are_not(online, db, env):
    # A 400 on this transcript is the session's own fault: counted, backed off, capped at
    # DREAMING_MAX_ATTEMPTS and stamped with the reason. 500s in between count nothing.
    fake_llm, _ = online
    env(DREAMING_MAX_ATTEMPTS=2)
    fake_llm.responder = lambda body: "unused"
    api = Api()
    sid = api.session()
    api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "I have a sister in Berlin"})
    go_idle(db)
    clock = datetime.now(UTC)
    for failure, attempts, retries in ((Status(400), 1, 0), (Status(500), 1, 1), (Status(500), 1, 2)):
        fake_llm.push(failure)
        sent = []
        assert dreaming.sweep(settings(), sent.append, now=lambda at=clock: at).claimed == 1
        result = dreaming.extract_session(settings(), "alice", sid, datetime.fromisoformat(sent[0]["claim_token"]),
                                          now=clock)
        assert result.outcome == "retry-later"
        row = session_row(db, sid)
        assert (row["extraction_attempts"], row["extraction_retries"]) == (attempts, retries)
        assert row["extracted_at"] is None and f"HTTP {failure.code}" in row["extraction_error"]
        clock = row["extraction_next_attempt_at"]
    fake_llm.push(Status(400))
    sent = []
    dreaming.sweep(settings(), sent.append, now=lambda: clock)
    result = dreaming.extract_session(settings(), "alice", sid, datetime.fromisoformat(sent[0]["claim_token"]),
                                      now=clock)
    assert (result.outcome, result.fault) == ("gave-up", "own")
    row = session_row(db, sid)
    assert row["extracted_at"] is not None and row["extraction_gave_up"] == "attempts"
    assert "gave up after 2 attempts" in row["extraction_error"]
    assert dreaming.sweep(settings(), sent.append, now=lambda: clock + timedelta(days=2)).claimed == 0
    assert profile_rows(db) == []


def test_an_extracted_importance_float4_cannot_hold_is_stored_as_0_not_a_failed_extraction(online, db):
    fake_llm, _ = online
    answer_extraction_with(fake_llm, json.dumps({"memories": [
        {"content": "Lives in Shanghai", "category": "fact", "importance": 1e-100},
        {"content": "Likes mocha", "category": "preference", "importance": 5e-324},
        {"content": "Has a cat", "category": "fact", "importance": -0.0}]}))
    sid = chat_then_dream(db, "I live in Shanghai")
    assert session_row(db, sid)["extraction_error"] is None
    assert [(r["content"], r["importance"]) for r in profile_rows(db)] == [
        ("Has a cat", 0.0), ("Likes mocha", 0.0), ("Lives in Shanghai", 0.0)]
    # A repeat confirms with the model's importance: the same rounding.
    answer_extraction_with(fake_llm, '{"memories": [{"content": "Lives in Shanghai", "category": "fact",'
                                     ' "importance": 1e-50, "same_as": "m1"}]}')
    sid = chat_then_dream(db, "Still in Shanghai")
    assert session_row(db, sid)["extraction_error"] is None


# --- resumed sessions and long transcripts --------------------------------------------------------
def test_resumed_session_extracts_only_new_turns_with_marked_context(online, db):
    fake_llm, _ = online
    api = Api()
    sid = api.session()
    api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "I live in Shanghai"})
    go_idle(db)
    sweep_now()
    assert len(profile_rows(db)) == 3

    fake_llm.responder = lambda body: (json.dumps([{"content": "Moved to Tokyo", "category": "event",
                                                     "importance": 0.8}]) if body.get("response_format")
                                       else "fake reply")
    status, _ = api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "Big news: I moved to Tokyo"})
    assert status == 200 and session_row(db, sid)["extracted_at"] is None  # eligible again
    go_idle(db)
    assert sweep_now()["invoked"] == 1
    second = extraction_requests(fake_llm)[-1]["messages"][-1]["content"]
    context, new = second.split("<session>")
    assert "I live in Shanghai" in context and "<earlier_context>" in context
    assert "I moved to Tokyo" in new and "Shanghai" not in new
    rows = profile_rows(db)
    assert len(rows) == 4 and [r["content"] for r in rows].count("Lives in Shanghai") == 1
    assert sweep_now()["claimed"] == 0


def test_turn_arriving_during_extraction_keeps_the_session_eligible(online, db):
    fake_llm, _ = online
    api = Api()
    sid, payload = _claimed_session(api, db)

    def answer(body):
        if body.get("response_format"):  # a new turn lands while the model is thinking
            api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "oh and I adopted a dog"})
            return EXTRACTED
        return "fake reply"

    fake_llm.responder = answer
    token = datetime.fromisoformat(payload["claim_token"])
    assert dreaming.extract_session(settings(), "alice", session_row(db, sid)["id"], token).outcome == "extracted"
    row = session_row(db, sid)
    assert row["extracted_at"] is None  # the new turn is not lost: next sweep takes it
    assert row["extraction_claimed_at"] is None


def test_long_transcript_is_windowed_not_truncated(online, db, monkeypatch):
    fake_llm, _ = online
    monkeypatch.setattr(session, "WINDOW_CHARS", 400)
    monkeypatch.setattr(session, "MAX_WINDOWS", 2)
    api = Api()
    sid = api.session()
    for i in range(6):
        api.call("POST", f"/v1/sessions/{sid}/turns", {"content": f"turn {i}: " + "words " * 20})
    go_idle(db)
    sweep_now()
    first = extraction_requests(fake_llm)
    assert len(first) == 2  # two windows in this invocation
    assert session_row(db, sid)["extracted_at"] is None  # more to read: still eligible
    while sweep_now()["claimed"]:
        pass
    seen = "".join(r["messages"][-1]["content"].split("<session>")[-1] for r in extraction_requests(fake_llm))
    for i in range(6):
        assert f"turn {i}:" in seen
    assert session_row(db, sid)["extracted_at"] is not None


# --- the parse ------------------------------------------------------------------------------------
@pytest.mark.parametrize("answer", [
    '{"memories": [{"content": "Lives in Paris", "category": "fact", "importance": 0.5}]}',
    'Sure! Here you go:\n```json\n[{"content": "Lives in Paris", "category": "fact"}]\n```\nAnything else?',
    'The memories are [{"content": "Lives in Paris"}] as requested.',
    '```\n{"memories": [{"content": "  Lives   in Paris ", "importance": "high"}]}\n```',
    '{"content": "Lives in Paris", "category": "FACT"}',
    '["Lives in Paris"]',
])
def test_parse_finds_memories_wherever_the_model_puts_them(answer):
    [candidate] = parse_candidates(answer)
    assert (candidate.content, candidate.category) == ("Lives in Paris", "fact")
    assert 0 <= candidate.importance <= 1


def test_parse_drops_bad_items_and_clamps_fields():
    got = parse_candidates(json.dumps([
        {"content": ""}, {"content": "   "}, {"category": "fact"}, {"content": None}, {"content": ["x"]}, 7, None,
        {"content": "Keeps a cat", "category": 3, "importance": 7},
        {"content": "keeps a cat"},  # duplicate, case-folded
        {"content": "Dislikes rain", "category": "dislikes", "importance": -2},
        {"content": "x" * 5000, "category": "event", "importance": "nan"},
    ]))
    assert [(c.content[:13], c.category, c.importance) for c in got] == [
        ("Keeps a cat", "fact", 1.0), ("Dislikes rain", "preference", 0.0), ("x" * 13, "event", 0.5)]
    assert len(got[2].content) == 500


@pytest.mark.parametrize("answer", ["", "no json here", "{broken", "42", '"text"', "{" * 100_000])
def test_parse_rejects_answers_without_a_list(answer):
    with pytest.raises(Unparsable):
        parse_candidates(answer)


@pytest.mark.parametrize("value,expected", [
    ("fact", "fact"), ("Preference", "preference"), (" EVENT ", "event"), ("emotions", "emotion"),
    ("relationship", "relation"), ("hobby", "fact"), ("情绪", "fact"), (None, "fact"), (3, "fact"), ("", "fact"),
])
def test_normalise_category(value, expected):
    assert normalise_category(value) == expected


def test_windows_keep_order_and_clip_only_a_single_oversized_message():
    messages = [{"id": i, "role": "user", "content": "a" * 100} for i in range(5)] + \
               [{"id": 5, "role": "user", "content": "b" * 1000}]
    parts = windows(messages, 250)
    assert [m["id"] for p in parts for m in p] == list(range(6))
    assert all(sum(len(m["content"]) + 16 for m in p) <= 250 for p in parts)
    assert parts[-1][0]["content"].endswith("[message clipped: too long]")


def test_an_application_clock_ahead_of_the_database_does_not_reclaim_fresh_claims(db, env):
    env(DREAMING_CLAIM_STALE_SECS=600, EXTRACT_FUNCTION_NAME=None)
    api = Api()
    for _ in range(3):
        api.call("POST", f"/v1/sessions/{api.session()}/turns", {"content": "hello"})
    ahead = lambda: datetime.now(UTC) + timedelta(hours=2)  # noqa: E731 (skewed app clock)
    invoked = []
    first = dreaming.sweep(settings(), invoked.append, now=ahead)
    assert first.claimed == 3 and first.batches == 1
    assert dreaming.sweep(settings(), invoked.append, now=ahead).claimed == 0
    assert len(invoked) == 3


def test_eros_sweep_command_runs_one_sweep_now(db, capsys):
    from eros_dev import cli

    api = Api()
    api.call("POST", f"/v1/sessions/{api.session()}/turns", {"content": "I play the cello every evening"})
    go_idle(db)
    assert cli.main(["sweep"]) == 0
    assert "claimed 1 session(s)" in capsys.readouterr().out
    assert [r["category"] for r in profile_rows(db)] == ["fact"]
