"""The daily token budget under concurrency (issue 25, item 3): a turn reserves its tokens when it is admitted
(engine.admit, migration 0018) and settles them when it is recorded, so that turns in flight count against the
budget before they have paid. What the day can spend is bounded: below the budget plus the reservation of the
last turn admitted (docs/DESIGN.md, "Usage").

Concurrent turns are threads calling the real chat use-case, each with its own database connection, against
the fake OpenRouter and Voyage on loopback (the fake model answers after a short wait, so that every turn of a
wave is in flight at once)."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from uuid import UUID

import pytest
from fakes import FakeOpenRouter

from eros import chat, db
from eros.store import chat as chat_store
from eros.store import usage as usage_store

BUDGET = 3000
# A long message (~500 tokens to the fake providers, twice: the prompt and the query embedding), so that one turn
# costs about a third of the budget and a wave of concurrent turns many times it.
MESSAGE = " ".join(f"Tonight I walked along the harbour and counted {n} boats under the lights." for n in range(26))
NOON = datetime(2026, 3, 14, 12, 0, 10, tzinfo=UTC)


class Clock:
    def __init__(self, moment: datetime):
        self.moment = moment

    def __call__(self) -> datetime:
        return self.moment


@pytest.fixture
def clock(monkeypatch):
    clock = Clock(NOON)
    monkeypatch.setattr(usage_store, "utcnow", clock)
    return clock


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
    """What each admitted turn reserved (engine.open_turn's answer, as take_turn receives it)."""
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
        except chat.OverLimit as exc:
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
