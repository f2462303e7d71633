"""The dreaming claim and the exactly-once extraction, against the real SQL and the real extract handler.

* Concurrent claimers take disjoint sets (FOR UPDATE SKIP LOCKED), every session exactly once.
* Eligibility: idle, unextracted, unclaimed-or-stale; LIMIT and ORDER BY last_active_at; the cut-offs
  are values the application computes and binds (a fake ``now`` far from the database clock works).
* A worker that dies after claiming: the session is re-claimed only after the stale threshold, then
  extracted once.
* Duplicate deliveries (in sequence, concurrently) and a stale worker finishing after a re-claim write
  exactly one set of profile rows.

Providers are the fake OpenRouter and Voyage servers (tests/fakes.py), so provider calls are counted.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest
from helpers import claim_concurrently, instance, utcnow

from eros import db as eros_db
from eros import dreaming, extraction
from eros.config import Settings
from eros.dreaming import session as session_job
from eros.store import claims
from eros.store import dreaming as store
from eros_dev.lambda_runtime import LambdaContext, load_function

IDLE = timedelta(seconds=1800)  # the defaults the SPEC fixes: DREAMING_IDLE_SECS, DREAMING_CLAIM_STALE_SECS
STALE = timedelta(seconds=600)
UTC = UTC


# --- helpers ------------------------------------------------------------------------------------


def bulk_sessions(db, n: int, *, newest: datetime, step_secs: float = 1.0, user: str = "alice") -> list:
    """n sessions in one statement, last active ``newest``, ``newest - step``, ...; ids oldest first."""
    inst = instance(db, user)
    rows = db.execute(
        "INSERT INTO engine.chat_sessions (user_id, instance_id, created_at, last_active_at)"
        " SELECT %(user)s, %(inst)s, %(t)s - make_interval(secs => g * %(step)s),"
        "        %(t)s - make_interval(secs => (g - 1) * %(step)s)"
        " FROM generate_series(1, %(n)s) AS g RETURNING id, last_active_at",
        {"user": user, "inst": inst, "t": newest, "step": step_secs, "n": n},
    ).fetchall()
    return [r["id"] for r in sorted(rows, key=lambda r: r["last_active_at"])]


def session(db, *, last_active: datetime, extracted_at=None, claimed_at=None, user: str = "alice"):
    return db.execute(
        "INSERT INTO engine.chat_sessions (user_id, instance_id, created_at, last_active_at, extracted_at,"
        " extraction_claimed_at) VALUES (%s, %s, %s, %s, %s, %s) RETURNING id",
        (user, instance(db, user), last_active - timedelta(minutes=5), last_active, extracted_at, claimed_at),
    ).fetchone()["id"]


TURNS = [("I worked till ten again today, my boss keeps piling on new demands.", "That sounds exhausting."),
         ("At least Miso my cat was waiting for me.", "Cats know when we need them."),
         ("I could really use a mocha right now.", "A mocha sounds like a good plan.")]


def chat_session(db, *, last_active: datetime, user: str = "alice"):
    """An idle session with a short transcript (user and assistant turns)."""
    sid = session(db, last_active=last_active, user=user)
    for i, (said, reply) in enumerate(TURNS):
        for role, content in (("user", said), ("assistant", reply)):
            db.execute("INSERT INTO engine.chat_messages (session_id, user_id, role, content, client_turn_id)"
                       " SELECT id, user_id, %s, %s, %s FROM engine.chat_sessions WHERE id = %s",
                       (role, content, f"turn-{i}", sid))
    return sid


def answer(tag: str) -> str:
    """The extraction model's answer: three categorised memories, tagged so a test can tell writers apart."""
    return json.dumps({"memories": [
        {"content": f"Is under heavy work pressure; the boss is the source [{tag}]", "category": "emotion",
         "importance": 0.8},
        {"content": f"Has a cat named Miso [{tag}]", "category": "relation", "importance": 0.5},
        {"content": f"Likes mocha [{tag}]", "category": "Vorliebe", "importance": 0.2},  # collapses to fact
    ]})


class GatedAnswers:
    """A responder for the fake LLM: the n-th request answers ``answer(tags[n])``, but only once gate n is
    open, so a test decides exactly when each worker's model call returns (no sleeps, no races)."""

    def __init__(self, *tags: str):
        self.tags = list(tags)
        self.gates = [threading.Event() for _ in tags]
        self._lock = threading.Lock()
        self._next = 0

    def __call__(self, request: dict) -> str:
        with self._lock:
            n, self._next = self._next, self._next + 1
        if n < len(self.gates):
            assert self.gates[n].wait(15), f"gate {n} never opened"
            return answer(self.tags[n])
        return answer(f"extra-{n}")

    def open(self, n: int | None = None) -> None:
        for i, gate in enumerate(self.gates):
            if n is None or i == n:
                gate.set()


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def profile_rows(db, sid) -> list[dict]:
    return db.execute("SELECT content, category, importance, metadata FROM engine.companion_memories"
                      " WHERE session_id = %s AND instance_id IS NULL ORDER BY content", (sid,)).fetchall()


def session_row(db, sid) -> dict:
    return db.execute("SELECT extracted_at, extraction_claimed_at, extraction_attempts, extraction_retries,"
                      " extraction_started_at, extraction_watermark FROM engine.chat_sessions"
                      " WHERE id = %s", (sid,)).fetchone()


def run_extract(payload: dict) -> dict:
    return load_function("extract").lambda_handler(dict(payload), LambdaContext("extract", timeout_secs=120))


def claim_at(moment: datetime, limit: int = 10) -> list[dict]:
    """One claim statement as a sweeper whose clock reads ``moment`` runs it; the payloads it would send."""
    rows = store.claim(idle_before=moment - IDLE, stale_before=moment - STALE, limit=limit)
    return [session_job.event(row) for row in rows]


def token(payload: dict) -> datetime:
    return datetime.fromisoformat(payload["claim_token"])


def sweep_once(cfg: Settings, now: datetime) -> list[dict]:
    """One sweep with a fake clock; returns the session payloads it would have sent to the extract function
    (a day later the users these sessions changed come due for their deep pass: tests/test_deep_pass.py)."""
    sent: list[dict] = []
    dreaming.sweep(cfg, sent.append, now=lambda: now)
    return [p for p in sent if p.get("kind") != "deep_pass"]


# --- the claim ----------------------------------------------------------------------------------


@pytest.fixture
def small_table_plans():
    """The claim's connection plans as it does for a table whose statistics say it is tiny: a nested loop
    that rescans its inner side rather than a hashed or sorted unique-ification of it."""
    conn = eros_db.connection()
    knobs = ("enable_hashagg", "enable_hashjoin", "enable_mergejoin", "enable_material")
    for knob in knobs:
        conn.execute(f"SET {knob} = off")
    yield
    for knob in knobs:
        conn.execute(f"RESET {knob}")


@pytest.mark.parametrize("limit", [1, 2])
def test_a_claim_takes_no_more_than_its_limit_when_the_table_was_analysed_small(db, small_table_plans, limit):
    """Statistics taken while the table was empty make the planner rescan the claim's picking sub-select;
    with ``WHERE id IN (SELECT ... LIMIT ... SKIP LOCKED)`` each rescan skipped the rows already claimed
    and took the next, so one claim took all five (the bad-key test's "1 probe" claimed 3 this way)."""
    db.execute("DELETE FROM engine.chat_sessions")
    db.execute("ANALYZE engine.chat_sessions")
    now = utcnow()
    # Oldest first in every order a scan can take (insertion, primary key): the rescans then meet them in
    # the order the sub-select picks them, and a rescanned claim takes them all.
    inst = instance(db, "alice")
    ids = [f"00000000-0000-4000-8000-00000000000{i}" for i in range(5)]
    for i, sid in enumerate(ids):
        db.execute("INSERT INTO engine.chat_sessions (id, user_id, instance_id, last_active_at)"
                   " VALUES (%s, 'alice', %s, %s)", (sid, inst, now - IDLE - timedelta(minutes=10 - i)))
    taken = store.claim(now - IDLE, now - STALE, limit, now)
    assert {str(r["id"]) for r in taken} == set(ids[:limit])  # the oldest, exactly the limit
    assert db.execute("SELECT count(*) AS n FROM engine.chat_sessions WHERE extraction_claimed_at IS NOT NULL"
                      ).fetchone()["n"] == limit


@pytest.mark.parametrize("limit", [1, 2])
def test_a_deep_pass_claim_takes_no_more_than_its_limit_when_the_table_was_analysed_small(db, small_table_plans,
                                                                                         limit):
    from eros.store import deep_pass as users_store

    db.execute("DELETE FROM engine.user_deep_pass")
    db.execute("ANALYZE engine.user_deep_pass")
    now = utcnow()
    for i, user in enumerate(["u1", "u2", "u3", "u4", "u5"]):
        db.execute("INSERT INTO engine.user_deep_pass (user_id, changed_at) VALUES (%s, %s)",
                   (user, now - timedelta(hours=3, minutes=-i)))
    taken = users_store.claim_users(now - timedelta(hours=1), now - STALE, limit, now)
    assert {r["user_id"] for r in taken} == set(["u1", "u2"][:limit])
    assert db.execute("SELECT count(*) AS n FROM engine.user_deep_pass WHERE claimed_at IS NOT NULL"
                      ).fetchone()["n"] == limit


def test_16_concurrent_claimers_take_5000_sessions_exactly_once(db):
    now = utcnow()
    ids = bulk_sessions(db, 5000, newest=now - IDLE - timedelta(minutes=1), step_secs=0.5)
    per_worker = claim_concurrently(16, idle_before=now - IDLE, stale_before=now - STALE)

    claimed = [sid for got in per_worker for sid in got]
    assert len(claimed) == len(set(claimed)), f"{len(claimed) - len(set(claimed))} sessions claimed twice"
    assert set(claimed) == set(ids)
    assert sum(1 for got in per_worker if got) >= 2, "the claimers did not actually run concurrently"
    # The database agrees: every session was claimed by exactly one claim statement, and taking a claim
    # counts nothing against the session (only a failure does: issue 8 item 3).
    counts = db.execute("SELECT extraction_attempts AS attempts, extraction_retries AS retries,"
                        " count(*) AS n, count(extraction_claimed_at) AS stamped FROM engine.chat_sessions"
                        " GROUP BY 1, 2").fetchall()
    assert counts == [{"attempts": 0, "retries": 0, "n": 5000, "stamped": 5000}]


def test_claim_skips_rows_another_claimer_holds_without_waiting(db, database_url):
    now = utcnow()
    ids = bulk_sessions(db, 10, newest=now - timedelta(hours=1))
    # another sweeper's claim, in flight, holds the four oldest
    with eros_db.connect(database_url) as other, other.transaction():
        other.execute("SELECT id FROM engine.chat_sessions WHERE id = ANY(%s) FOR UPDATE", (ids[:4],))
        eros_db.connection().execute("SET lock_timeout = '3s'")  # blocking would fail, not hang
        started = time.monotonic()
        rows = store.claim(idle_before=now - IDLE, stale_before=now - STALE, limit=3)
        elapsed = time.monotonic() - started
    assert {r["id"] for r in rows} == set(ids[4:7])
    assert elapsed < 2.0


def test_claim_honours_limit_order_and_returns_the_claim_token(db):
    now = utcnow()
    ids = bulk_sessions(db, 10, newest=now - timedelta(hours=1), step_secs=60)
    first = store.claim(idle_before=now - IDLE, stale_before=now - STALE, limit=3)
    second = store.claim(idle_before=now - IDLE, stale_before=now - STALE, limit=3)
    # ORDER BY decides which sessions a batch takes (the oldest activity first); RETURNING's order is free.
    assert {r["id"] for r in first} == set(ids[:3])
    assert {r["id"] for r in second} == set(ids[3:6])
    for row in first + second:
        stored = session_row(db, row["id"])
        assert row["claim_token"] == stored["extraction_claimed_at"]
        assert stored["extraction_attempts"] == 0  # a claim is not a failure
        assert row["user_id"] == "alice" and row["instance_id"] is not None
    assert all(session_row(db, sid)["extraction_claimed_at"] is None for sid in ids[6:])


def test_only_idle_unextracted_unclaimed_or_stale_sessions_are_claimed_with_python_cutoffs(db):
    # A clock decades behind the database's: cut-offs taken from the database's now() would claim
    # the not-yet-idle sessions and the fresh claim too; only cut-offs computed from the given `now`
    # and bound leave them alone. (A clock *ahead* would make every claim this sweep stamps look stale
    # at once: the claim stamps the database's now().)
    t = datetime(2001, 1, 1, 12, 0, tzinfo=UTC)
    oldest = session(db, last_active=t - timedelta(hours=3))
    stale_claim = session(db, last_active=t - timedelta(minutes=150), claimed_at=t - STALE - timedelta(seconds=1))
    idle = session(db, last_active=t - timedelta(hours=2))
    idle_recent = session(db, last_active=t - IDLE - timedelta(seconds=1))
    not_idle = session(db, last_active=t - timedelta(minutes=10))
    exactly_idle = session(db, last_active=t - IDLE)  # the cut-off is strict
    extracted = session(db, last_active=t - timedelta(hours=4), extracted_at=t - timedelta(hours=1))
    fresh_claim = session(db, last_active=t - timedelta(hours=5), claimed_at=t - timedelta(minutes=5))
    stale_but_extracted = session(db, last_active=t - timedelta(hours=6), extracted_at=t - timedelta(hours=2),
                                   claimed_at=t - timedelta(hours=3))

    cfg = Settings.from_env(dreaming_batch_size=3)
    sent = []
    result = dreaming.sweep(cfg, sent.append, now=lambda: t)
    assert (result.claimed, result.invoked, result.batches, result.stopped_by) == (4, 4, 2, "drained")
    # Batch one is the three oldest eligible sessions, batch two the rest.
    assert {p["session_id"] for p in sent[:3]} == {str(s) for s in (oldest, stale_claim, idle)}
    assert [p["session_id"] for p in sent[3:]] == [str(idle_recent)]
    for sid in (not_idle, exactly_idle, extracted, fresh_claim, stale_but_extracted):
        assert str(sid) not in {p["session_id"] for p in sent}
    # The untouched sessions kept their state.
    assert session_row(db, fresh_claim)["extraction_claimed_at"] == t - timedelta(minutes=5)
    assert session_row(db, not_idle)["extraction_attempts"] == 0


# --- a worker that dies after claiming ----------------------------------------------------------

def test_dead_worker_claim_is_retaken_only_after_the_stale_threshold_then_extracted_once(db, providers):
    llm, voyage = providers
    llm.responder = lambda request: answer("retaken")
    sid = chat_session(db, last_active=utcnow() - timedelta(hours=2))
    cfg = Settings.from_env()

    lost = sweep_once(cfg, utcnow())  # the worker dies: its payload is never extracted
    assert [p["session_id"] for p in lost] == [str(sid)]
    claimed_at = token(lost[0])
    assert session_row(db, sid)["extraction_claimed_at"] == claimed_at

    assert sweep_once(cfg, claimed_at + STALE - timedelta(seconds=1)) == []  # not stale yet
    assert claim_at(claimed_at + STALE) == []  # exactly at the threshold: still held
    retaken = claim_at(claimed_at + STALE + timedelta(microseconds=1))  # just past it: taken again
    assert [p["session_id"] for p in retaken] == [str(sid)]
    assert token(retaken[0]) > claimed_at
    # No worker ever started the lost claim: our backlog, the world's fault -- a retry, not an attempt.
    assert (session_row(db, sid)["extraction_attempts"], session_row(db, sid)["extraction_retries"]) == (0, 1)

    assert run_extract(retaken[0])["outcome"] == "extracted"
    assert run_extract(lost[0])["outcome"] == "not-claimed"  # the dead worker's event, delivered late
    rows = profile_rows(db, sid)
    assert [(r["content"], r["category"]) for r in rows] == [
        ("Has a cat named Miso [retaken]", "relation"),
        ("Is under heavy work pressure; the boss is the source [retaken]", "emotion"),
        ("Likes mocha [retaken]", "fact")]
    assert (llm.calls, voyage.calls) == (1, 1)
    state = session_row(db, sid)
    assert state["extracted_at"] is not None and state["extraction_claimed_at"] is None
    assert state["extraction_watermark"] is not None
    assert sweep_once(cfg, utcnow() + timedelta(days=1)) == []  # done: never claimed again


# --- duplicate deliveries and stale writers -----------------------------------------------------

def test_same_event_delivered_twice_in_sequence_writes_one_set(db, providers):
    llm, voyage = providers
    llm.responder = lambda request: answer("once")
    sid = chat_session(db, last_active=utcnow() - timedelta(hours=1))
    [payload] = sweep_once(Settings.from_env(), utcnow())

    first, second = run_extract(payload), run_extract(payload)
    assert (first["outcome"], first["memories"]) == ("extracted", 3)
    assert (second["outcome"], second["memories"], second["llm_calls"]) == ("not-claimed", 0, 0)
    assert len(profile_rows(db, sid)) == 3
    assert (llm.calls, voyage.calls) == (1, 1)  # the retry paid for nothing


def test_same_event_delivered_twice_concurrently_writes_one_set_and_pays_one_call(db, providers):
    llm, voyage = providers
    llm.responder = gate = GatedAnswers("first", "second")
    sid = chat_session(db, last_active=utcnow() - timedelta(hours=1))
    [payload] = sweep_once(Settings.from_env(), utcnow())

    with ThreadPoolExecutor(2) as pool:
        try:
            first = pool.submit(run_extract, payload)
            wait_for(lambda: llm.calls == 1)  # the first delivery holds the lease and is in its model call
            # The duplicate finds the lease taken and returns before paying for anything (issue 8 item 5).
            duplicate = run_extract(payload)
            assert (duplicate["outcome"], duplicate["llm_calls"]) == ("duplicate", 0)
            assert llm.calls == 1
        finally:
            gate.open()
        outcomes = sorted([first.result()["outcome"], duplicate["outcome"]])

    assert outcomes == ["duplicate", "extracted"]
    assert (llm.calls, voyage.calls) == (1, 1)
    rows = profile_rows(db, sid)
    assert len(rows) == 3
    assert len({r["content"].rsplit("[", 1)[1] for r in rows}) == 1  # all from one writer
    state = session_row(db, sid)
    assert state["extracted_at"] is not None and state["extraction_claimed_at"] is None


@pytest.mark.parametrize("stale_finishes", ["after the re-claimer", "while the re-claimer is in flight"])
def test_stale_worker_finishing_after_a_reclaim_writes_nothing(db, providers, stale_finishes):
    llm, voyage = providers
    llm.responder = gate = GatedAnswers("stale", "reclaimer")
    sid = chat_session(db, last_active=utcnow() - timedelta(hours=1))
    cfg = Settings.from_env()
    [old] = sweep_once(cfg, utcnow())

    with ThreadPoolExecutor(2) as pool:
        try:
            stale = pool.submit(run_extract, old)
            wait_for(lambda: llm.calls == 1)  # the slow worker is waiting on its model call
            [new] = claim_at(token(old) + STALE + timedelta(seconds=1))  # its claim went stale: re-claimed
            assert new["session_id"] == str(sid) and new["claim_token"] != old["claim_token"]
            if stale_finishes == "after the re-claimer":
                gate.open(1)
                assert run_extract(new)["outcome"] == "extracted"
                gate.open(0)
                assert stale.result()["outcome"] == "lost-claim"  # its write was refused by the guard
            else:
                reclaimer = pool.submit(run_extract, new)
                wait_for(lambda: llm.calls == 2)
                gate.open(0)
                assert stale.result()["outcome"] == "lost-claim"
                assert profile_rows(db, sid) == []  # the stale worker wrote nothing
                assert session_row(db, sid)["extraction_claimed_at"] == token(new)  # nor the live claim
                gate.open(1)
                assert reclaimer.result()["outcome"] == "extracted"
        finally:
            gate.open()

    rows = profile_rows(db, sid)
    assert len(rows) == 3 and all(r["content"].endswith("[reclaimer]") for r in rows)
    assert llm.calls == 2 and voyage.calls == 2  # both paid; only one wrote
    state = session_row(db, sid)
    assert state["extracted_at"] is not None and state["extraction_claimed_at"] is None


# --- every outcome says what happened (issue 8 item 5) ------------------------------------------

@pytest.mark.parametrize("path", ["write rows", "nothing new", "provider failure", "own attempts exhausted"])
def test_a_delivery_whose_claim_was_taken_over_before_its_write_reports_lost_claim(db, providers, env, monkeypatch,
                                                                                   path):
    # Before, such deliveries reported "nothing" or "gave-up" although the guard had refused their write.
    llm, voyage = providers
    llm.responder = lambda request: answer("late")
    env(DREAMING_MAX_ATTEMPTS=2)
    sid = chat_session(db, last_active=utcnow() - timedelta(hours=1))
    if path == "nothing new":
        db.execute("UPDATE engine.chat_sessions SET extraction_watermark ="
                   " (SELECT max(id) FROM engine.chat_messages WHERE session_id = %s) WHERE id = %s", (sid, sid))
    if path == "own attempts exhausted":
        db.execute("UPDATE engine.chat_sessions SET extraction_attempts = 2 WHERE id = %s", (sid,))
    if path == "provider failure":
        from fakes import Status

        llm.push(Status(503))
    [payload] = sweep_once(Settings.from_env(), utcnow())
    taken_over: list[dict] = []

    def reclaim_first(original):
        def write(*args, **kwargs):  # another sweep found the claim stale and took it just before the write
            taken_over.extend(claim_at(token(payload) + STALE + timedelta(seconds=1)))
            return original(*args, **kwargs)
        return write

    monkeypatch.setattr(store, "finish", reclaim_first(store.finish))
    for name in ("give_up", "retry_later"):
        monkeypatch.setattr(claims, name, reclaim_first(getattr(claims, name)))
    result = run_extract(payload)
    assert result["outcome"] == "lost-claim"
    assert [p["session_id"] for p in taken_over] == [str(sid)]
    state = session_row(db, sid)
    assert state["extraction_claimed_at"] == token(taken_over[0]) and state["extracted_at"] is None
    assert state["extraction_started_at"] is None  # the new claim's worker has not started yet
    assert profile_rows(db, sid) == []


def test_nothing_unparsable_and_a_crash_are_reported_as_such(db, providers, monkeypatch):
    llm, voyage = providers
    cfg = Settings.from_env()
    nothing = chat_session(db, last_active=utcnow() - timedelta(hours=3))
    llm.responder = lambda request: json.dumps({"memories": []})
    [payload] = sweep_once(cfg, utcnow())
    assert run_extract(payload)["outcome"] == "nothing"

    unparsable = chat_session(db, last_active=utcnow() - timedelta(hours=2))
    llm.responder = lambda request: "I'd rather not say."
    [payload] = sweep_once(cfg, utcnow())
    assert (run_extract(payload)["outcome"], session_row(db, unparsable)["extracted_at"] is not None) == (
        "unparsable", True)

    crashing = chat_session(db, last_active=utcnow() - timedelta(hours=1))
    llm.responder = lambda request: answer("crash")
    [payload] = sweep_once(cfg, utcnow())

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in our code")

    monkeypatch.setattr(extraction, "plan", broken)
    with pytest.raises(RuntimeError):  # a crash is seen (Lambda's error metric), after being counted
        run_extract(payload)
    state = db.execute("SELECT extraction_attempts AS attempts, extraction_retries AS retries,"
                       " extraction_claimed_at, extraction_next_attempt_at, extraction_error"
                       " FROM engine.chat_sessions WHERE id = %s", (crashing,)).fetchone()
    assert (state["attempts"], state["retries"], state["extraction_claimed_at"]) == (1, 0, None)
    assert state["extraction_next_attempt_at"] is not None and state["extraction_error"] == "RuntimeError"
    assert run_extract(payload)["outcome"] == "not-claimed"  # Lambda's retry of the crashed event: no cost
    assert session_row(db, nothing)["extracted_at"] is not None
