"""A chat turn's database round trips (issue 10), counted on the wire by bench/_wire.py's proxy: every turn
path costs at most its number here, with the spend limits off and on, so that a round trip added back is a
decision someone makes here, not an accident. Through RDS Proxy each one costs a Lambda far more than on
this machine's Unix socket. And each statement of a turn is the call of a PL/pgSQL function, whose plan the
database keeps (migrations 0015, 0016): what the turn sends is a call, not SQL to parse and plan again."""

from __future__ import annotations

import re
import sys
import uuid
from pathlib import Path

import pytest
from fakes import Status

from eros import chat
from eros.errors import NotFound
from eros.store import chat as chat_store
from eros.usage import OverLimit

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from _stages import capture_statements  # noqa: E402
from _wire import RoundTrips  # noqa: E402

TURN = 3  # open_turn (session, earlier messages, spend limits, the message, history), the recall, record_turn
REPLAY = 1  # open_turn finds the answered turn (so does a conflicting message, and another user's session)
# open_turn and the recall; the chat model fails: what it paid counted, its reservation released, and its message's
# mark taken away (a retry answers it at once: eros.store.chat.ANSWERING)
FAILED = 4
RETRY = TURN + 1  # a retry of a failed turn marks the stored message being answered by it first
REFUSED = 2  # open_turn, and the usage that says which limit refused the turn
LIMITS = {"TURNS_PER_MINUTE": 100, "DAILY_TOKEN_BUDGET": 10**9}


@pytest.fixture
def wire(providers, database_url, env):
    """The package's connection goes through the counting proxy; the fake providers answer the turns."""
    from eros import db

    with RoundTrips(database_url) as counter:
        env(DATABASE_URL=counter.url)
        yield counter
        db.reset()


def warm() -> None:
    """A warm container: it has read the embedding space and its calibration (eros.calibrated keeps them a minute:
    a round trip a minute, not a turn; test_a_cold_container_reads_the_embedding_space_once counts it), and the
    first app's settings (eros.apps keeps them SETTINGS_CACHE_SECS)."""
    from eros import apps, calibrated, providers

    calibrated.guard(providers.embedder().model)
    apps.app_settings(apps.DEFAULT)


@pytest.fixture(params=[False, True], ids=["no limits", "spend limits"])
def limits(request, env):
    if request.param:
        env(**LIMITS)
    return request.param


def counted(wire: RoundTrips, *args) -> tuple[chat.TurnResult, int]:
    """One turn (``take_turn``'s arguments) and the round trips it made, in a warm container."""
    warm()
    wire.reset()
    result = chat.take_turn(*args)
    return result, wire.count


def test_the_counter_counts_what_waits_for_the_server(wire):
    import psycopg

    with psycopg.connect(wire.url, autocommit=True) as conn:
        wire.reset()
        conn.execute("SELECT 1").fetchone()
        assert wire.count == 1
        wire.reset()
        with conn.transaction():
            conn.execute("SELECT 1")
        assert wire.count == 3  # BEGIN, the statement, COMMIT
        wire.reset()
        with conn.pipeline():
            cursors = [conn.execute("SELECT %s::int AS n", (n,)) for n in range(3)]
        assert wire.count == 1 and [c.fetchone() for c in cursors] == [(0,), (1,), (2,)]
        wire.reset()
        with conn.pipeline():
            conn.execute("SELECT 1").fetchone()  # its rows before the sync: a wait of its own
            conn.execute("SELECT 2")
        assert wire.count == 2


def test_a_turn_and_its_replay(wire, limits, db):
    session = chat_store.create_session("alice", "luna")["id"]
    first, trips = counted(wire, "alice", session, "I adopted a cat named Miso", "t-1")
    assert not first.replayed and 0 < trips <= TURN
    again, trips = counted(wire, "alice", session, "I adopted a cat named Miso", "t-1")
    assert again.replayed and again.reply == first.reply and 0 < trips <= REPLAY
    other, trips = counted(wire, "alice", session, "Miso knocked my plant over", None)
    assert not other.replayed and 0 < trips <= TURN
    # What the three turns wrote: two turns (the replay wrote nothing), their utterances, their usage.
    assert db.execute("SELECT count(*) AS n FROM engine.chat_messages").fetchone()["n"] == 4
    assert db.execute("SELECT count(*) AS n FROM engine.companion_memories").fetchone()["n"] == 2
    spent = db.execute("SELECT turns, chat_tokens FROM engine.user_usage WHERE user_id = 'alice'").fetchone()
    assert spent["chat_tokens"] > 0 and spent["turns"] == (2 if limits else 0)


def test_a_turns_statements_are_calls_of_functions_that_keep_their_plans(limits, providers, db):
    session = chat_store.create_session("alice", "luna")["id"]
    warm()
    with capture_statements() as sent:
        chat.take_turn("alice", session, "I adopted a cat named Miso", "t-1")
        chat.take_turn("alice", session, "I adopted a cat named Miso", "t-1")  # the replay
    called = [re.fullmatch(r"SELECT (?:\* FROM )?engine\.(\w+)\(.*\)(?: AS \w+)?", str(sql), re.S) for sql, _ in sent]
    assert all(called), [str(sql)[:80] for (sql, _), match in zip(sent, called, strict=True) if not match]
    names = [match[1] for match in called if match]
    assert names == ["open_turn_v2", "turn_recall_v3", "record_turn", "open_turn_v2"]
    kept = db.execute("SELECT p.proname AS name, l.lanname AS language, p.proconfig AS config FROM pg_proc p"
                      " JOIN pg_language l ON l.oid = p.prolang WHERE p.pronamespace = 'engine'::regnamespace"
                      " AND p.proname = ANY (%s)", (names,)).fetchall()
    assert {(f["name"], f["language"], tuple(f["config"] or ())) for f in kept} == {
        (name, "plpgsql", ("plan_cache_mode=force_generic_plan",)) for name in names}


def test_a_retry_of_a_turn_the_model_failed(wire, limits, providers, db):
    fake_llm, _ = providers
    session = chat_store.create_session("alice", "luna")["id"]
    fake_llm.push(Status(503))
    warm()
    wire.reset()
    with pytest.raises(chat.TurnFailed):
        chat.take_turn("alice", session, "are you there?", "t-1")
    assert 0 < wire.count <= FAILED
    retried, trips = counted(wire, "alice", session, "are you there?", "t-1")
    assert not retried.replayed and 0 < trips <= RETRY


def test_a_conflict_and_another_users_session_cost_one_round_trip(wire, limits):
    session = chat_store.create_session("alice", "luna")["id"]
    chat.take_turn("alice", session, "hello", "t-1")
    wire.reset()
    with pytest.raises(chat.TurnConflict):
        chat.take_turn("alice", session, "something else", "t-1")
    assert 0 < wire.count <= REPLAY
    for user, sid in (("bob", session), ("alice", uuid.uuid4())):
        wire.reset()
        with pytest.raises(NotFound):
            chat.take_turn(user, sid, "hello", None)
        assert 0 < wire.count <= REPLAY


def test_a_turn_the_spend_limits_refuse(wire, env):
    env(TURNS_PER_MINUTE=1, DAILY_TOKEN_BUDGET=10**9)
    session = chat_store.create_session("alice", "luna")["id"]
    chat.take_turn("alice", session, "hello", None)
    wire.reset()
    with pytest.raises(OverLimit):
        chat.take_turn("alice", session, "hello again", None)
    assert 0 < wire.count <= REFUSED


def test_a_cold_container_reads_the_embedding_space_once(wire, db):
    """Issue 30: the turn checks that its embedder is the stored vectors' model and uses that model's thresholds;
    what the database says of them costs a container's first turn one round trip, and no turn after it (until
    eros.calibrated.TTL_SECS have passed)."""
    from eros import apps, calibrated

    session = chat_store.create_session("alice", "luna")["id"]
    calibrated.reset()  # a new container
    apps.forget()
    wire.reset()
    first = chat.take_turn("alice", session, "I adopted a cat named Miso", "t-1")
    assert not first.replayed and wire.count == TURN + 2  # and its app's settings (eros.apps), once as well
    wire.reset()
    second = chat.take_turn("alice", session, "Miso knocked my plant over", "t-2")
    assert not second.replayed and wire.count == TURN
