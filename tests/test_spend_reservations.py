"""The daily token budget under concurrency (issue 25, item 3): a turn reserves its tokens when it is admitted
(engine.admit_v2; the reservations came with migration 0018) and settles them when it is recorded, so that turns
in flight count against the budget before they have paid. What the day can spend is bounded: below the budget
plus the reservation of the last turn admitted (docs/DESIGN.md, "Usage").

Concurrent turns are threads calling the real chat use-case, each with its own database connection, against
the fake OpenRouter and Voyage on loopback (the fake model answers after a short wait, so that every turn of a
wave is in flight at once)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from uuid import UUID

import pytest
from apiclient import Api
from fakes import NOON, FakeOpenRouter, Status

from eros import account, chat, db
from eros.store import chat as chat_store
from eros.store import usage as usage_store
from eros.usage import OverLimit

BUDGET = 3000
# A long message (~500 tokens to the fake providers, twice: the prompt and the query embedding), so that one turn
# costs about a third of the budget and a wave of concurrent turns many times it.
MESSAGE = " ".join(f"Tonight I walked along the harbour and counted {n} boats under the lights." for n in range(26))


def answer_slowly(request: dict) -> str:
    time.sleep(0.3)  # every turn of a wave is inside its model call at once (nothing here is timed)
    return "a reply of a few words, as a companion would send"


@pytest.fixture
def slow_llm():
    server = FakeOpenRouter(answer_slowly)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def limited(db, env, slow_llm, fake_voyage, clock):
    env(LLM_BASE_URL=slow_llm.url, OPENROUTER_API_KEY="x", EMBED_BASE_URL=fake_voyage.url, VOYAGE_API_KEY="x",
        PROVIDER_MAX_RETRIES=0, DAILY_TOKEN_BUDGET=BUDGET)
    return slow_llm


@pytest.fixture
def reservations(monkeypatch) -> list[int]:
    """What each admitted turn reserved (engine.open_turn_v2's answer, as take_turn receives it)."""
    seen: list[int] = []
    real = chat_store.open_turn

    def spy(*args, **kwargs):
        opened = real(*args, **kwargs)
        if opened is not None and opened["admitted"]:
            seen.append(opened.get("tokens_reserved", 0))
        return opened

    monkeypatch.setattr(chat_store, "open_turn", spy)
    return seen


def wave(sessions: list[UUID], user: str = "alice") -> list[str]:
    """One turn in each session, all at once: each turn's outcome ("ok", or the refusal's code)."""
    start, outcomes = threading.Barrier(len(sessions)), []

    def sender(sid: UUID) -> None:
        try:
            start.wait(30)
            chat.take_turn(user, sid, MESSAGE, None)
            outcomes.append("ok")
        except OverLimit as exc:
            outcomes.append(exc.code)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            outcomes.append(repr(exc))
        finally:
            db.connection().close()

    threads = [threading.Thread(target=sender, args=(sid,)) for sid in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return outcomes


def spent(conn, user: str = "alice") -> int:
    row = conn.execute("SELECT tokens FROM engine.user_usage WHERE user_id = %s AND day = %s",
                       (user, NOON.date())).fetchone()
    return row["tokens"] if row else 0


@pytest.mark.parametrize("concurrent", [16, 64])
def test_concurrent_turns_overshoot_the_budget_by_at_most_one_reservation(limited, db, reservations, concurrent):
    sessions = [chat_store.create_session("alice", "luna")["id"] for _ in range(concurrent)]
    waves = []
    while not waves or "ok" in waves[-1]:  # until the budget refuses every turn of a wave
        waves.append(wave(sessions))
        assert set(waves[-1]) <= {"ok", "budget_exhausted"}, waves[-1]
        assert len(waves) <= 20, "the budget never refused a whole wave"
    tokens = spent(db)
    answered = sum(w.count("ok") for w in waves)
    print(f"\n{concurrent} concurrent turns, budget {BUDGET}: {tokens} tokens spent by {answered} turns in"
          f" {len(waves)} waves; reservations up to {max(reservations, default=0)}")
    assert tokens >= BUDGET  # the budget was spent: the reservations did not refuse turns it had room for
    assert tokens < BUDGET + max(reservations, default=0)  # the bound: one turn's reservation past the budget
    assert all(r > 0 for r in reservations)
    # Every turn settled: no reservation outlives its turn.
    left = db.execute("SELECT reservations FROM engine.user_usage WHERE user_id = 'alice'").fetchone()
    assert left["reservations"] == {}
    # Usage reports real tokens only: the day's tokens are the itemised calls' sum.
    itemised = db.execute("SELECT sum(input_tokens + output_tokens) AS n, sum(calls) AS calls"
                          " FROM engine.user_model_usage WHERE user_id = 'alice'").fetchone()
    assert itemised["n"] == tokens and itemised["calls"] == 2 * answered


# --- a reservation ends with its turn, however the turn ends -------------------------------------------
def reservations_of(conn, user: str = "alice") -> dict:
    row = conn.execute("SELECT reservations FROM engine.user_usage WHERE user_id = %s", (user,)).fetchone()
    return row["reservations"] if row else {}


def test_a_turn_the_model_fails_releases_its_reservation_and_counts_the_embedding_it_paid(limited, db):
    limited.push(Status(503))
    sid = chat_store.create_session("alice", "luna")["id"]
    with pytest.raises(chat.TurnFailed):
        chat.take_turn("alice", sid, "are you there?", "t-1")
    assert reservations_of(db) == {}
    calls = db.execute("SELECT model, calls, input_tokens FROM engine.user_model_usage").fetchall()
    assert [(c["calls"], c["input_tokens"] > 0) for c in calls] == [(1, True)]  # the query embedding, paid
    assert spent(db) == calls[0]["input_tokens"]
    # Its retry is admitted (nothing holds the budget) and answered.
    assert chat.take_turn("alice", sid, "are you there?", "t-1").reply


def test_a_killed_turns_reservation_holds_the_budget_until_it_expires(limited, db, clock):
    """A Lambda killed mid-turn (at its timeout) never settles: its reservation must not hold the budget for the
    rest of the day. Here the turn is opened as take_turn opens it, and never goes further."""
    sid = chat_store.create_session("alice", "luna")["id"]
    killed = chat_store.open_turn("alice", sid, MESSAGE, "killed", history=12, now=clock(), daily_budget=BUDGET,
                                  reserve=usage_store.turn_reserve(600, 15))
    assert killed["admitted"] and killed["tokens_reserved"] > BUDGET
    assert spent(db) == 0 and list(reservations_of(db)) == [str(killed["reserved"].reservation)]

    with pytest.raises(OverLimit) as refused:  # the budget is held, not spent: a retry in seconds helps
        chat.take_turn("alice", sid, "hello?", None)
    assert refused.value.code == "budget_exhausted" and refused.value.retry_after == usage_store.RESERVATION_SECS
    assert "in progress" in str(refused.value)
    # Usage reports real tokens, never a reservation.
    assert usage_report_tokens() == 0

    clock.moment += timedelta(seconds=usage_store.RESERVATION_SECS)  # the reservation has expired
    assert chat.take_turn("alice", sid, "hello?", None).reply
    assert reservations_of(db) == {}  # the next admission dropped it; the answered turn settled its own
    assert 0 < spent(db) < BUDGET


def usage_report_tokens() -> int:
    from eros import usage

    return usage.report("alice", NOON.date(), NOON.date())["totals"]["tokens"]


def test_dreaming_waits_while_turns_in_flight_hold_the_budget(limited, db, clock):
    from eros import dreaming
    from eros.config import settings

    sid = chat_store.create_session("alice", "luna")["id"]
    chat.take_turn("alice", sid, "I started a new job at a bakery", None)
    chat_store.open_turn("alice", sid, MESSAGE, "in-flight", history=12, now=clock(), daily_budget=BUDGET,
                         reserve=usage_store.turn_reserve(600, 15))
    held = usage_store.held_until("alice", clock(), BUDGET)
    assert held == clock() + timedelta(seconds=usage_store.RESERVATION_SECS)  # not midnight: nothing is spent
    db.execute("UPDATE engine.chat_sessions SET last_active_at = %s, extraction_claimed_at = %s",
               (NOON - timedelta(hours=2), NOON))
    token = db.execute("SELECT extraction_claimed_at FROM engine.chat_sessions").fetchone()["extraction_claimed_at"]
    result = dreaming.extract_session(settings(), "alice", sid, token, now=clock())
    assert result.outcome == "deferred" and result.retry_at == held.isoformat()
    assert limited.calls == 1  # the turn's reply; no extraction call


# --- a turn that loses to an erasure (issue 25, item 6) ---------------------------------------------------
def test_a_turn_running_when_its_user_is_erased_answers_409_and_leaves_nothing(db, env, fake_voyage, clock):
    asked, release = threading.Event(), threading.Event()

    def held(request: dict) -> str:
        asked.set()
        release.wait(30)
        return "a reply to nobody"

    with FakeOpenRouter(held) as llm:
        env(LLM_BASE_URL=llm.url, OPENROUTER_API_KEY="x", EMBED_BASE_URL=fake_voyage.url, VOYAGE_API_KEY="x",
            PROVIDER_MAX_RETRIES=0, DAILY_TOKEN_BUDGET=100_000, TURNS_PER_MINUTE=10)
        api = Api()
        sid = api.session()
        answers = []
        sender = threading.Thread(target=lambda: answers.append(
            api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "I live in Lisbon", "client_turn_id": "t-1"})))
        sender.start()
        assert asked.wait(30)  # the turn is inside its model call
        erased = account.erase("alice")  # what DELETE /v1/me does
        assert erased["sessions"] == 1 and erased["messages"] == 1 and erased["usage_days"] == 1
        release.set()
        sender.join(60)
    [(status, body)] = answers
    assert status == 409, body
    assert body["code"] == "session_gone" and "nothing was stored" in body["message"]
    assert body["retryable"] is False
    # Nothing of the erased user came back: no message, memory, session, usage or reservation.
    for table in ("chat_messages", "companion_memories", "chat_sessions", "user_usage", "user_model_usage"):
        assert db.execute(f"SELECT count(*) AS n FROM engine.{table} WHERE user_id = 'alice'").fetchone()["n"] == 0
