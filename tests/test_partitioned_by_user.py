"""The store's SQL, unchanged, on the user tables PARTITIONED BY HASH (user_id) (issue 13, "Past one database"):
the shape a database distributed by user needs (Citus, or Postgres's own hash partitions), built by
tests/partitioning.py in a scratch database of the test Postgres from the migrated schema. Production stays
unpartitioned: nothing here is a migration.

* The partitioned schema keeps every index, CHECK, default and generated column of the migrations; what had to
  change is the keys: primary keys carry user_id, and foreign keys to a partitioned table carry it on both sides.
* Recall (``ranked`` for both layers and every strategy, with and without the demotion and the lexical part, and
  ``candidates``) returns the same rows in the same order with the same scores as the unpartitioned test
  database holding the same rows.
* A recall statement reads one partition, its user's (EXPLAIN of the store's own call, and of the generic plan
  that engine.turn_recall keeps); the claim, cross-user by design, reads all of them.
* Concurrent claimers take every idle session exactly once, across partitions.
* Whole turns (``eros.chat.take_turn``, offline providers) and their sessions' extractions (the sweep's claim,
  ``eros.dreaming.extract_session``, a supersession through the self-referencing key) give what they give on
  one table, every row in its user's partition; erasing the user empties them.
* chat_messages is partitioned too since migration 0013 put user_id in its turn key, the conflict target of the
  store's ``INSERT ... ON CONFLICT``: before it, partitioning forced user_id into that key and the turn's
  statements matched no constraint. A retried turn is still a replay on the partitioned table.
"""

from __future__ import annotations

import random
import uuid
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from conftest import clean_schema
from helpers import claim_concurrently, go_idle, utcnow
from partitioning import PARTITIONS, TABLES, create_database, drop_database, explaining, partitions_in
from pgvector import Vector

from eros import chat, dreaming
from eros import db as eros_db
from eros.config import RecallKnobs, settings
from eros.memory import MemoryLayer
from eros.store import account
from eros.store import chat as chat_store
from eros.store import dreaming as dreaming_store
from eros.store import recall as recall_store

pytestmark = pytest.mark.integration

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
DIM = 512
USERS = tuple(f"user-{n:02d}" for n in range(16))
WORDS = ("Tokyo", "mocha", "sister", "piano", "Miso", "nurse", "Berlin", "garden", "rain", "exam")
CATEGORIES = ("fact", "preference", "event", "emotion", "relation")
IDLE = timedelta(seconds=1800)
STALE = timedelta(seconds=600)


@pytest.fixture(scope="module")
def partitioned_url(database_url):
    """A scratch database beside the tests' own, migrated, its user tables hash-partitioned by user_id."""
    url, _ = create_database(database_url, "partitioned_by_user")
    yield url
    drop_database(database_url, "partitioned_by_user")


@pytest.fixture
def partitioned(partitioned_url, db):
    """A connection to the partitioned database, its engine tables emptied (personas kept), as ``db`` does."""
    with eros_db.connect(partitioned_url) as conn:
        conn.execute(clean_schema())
        yield conn


def partition_of(conn, user: str, table: str = "companion_memories") -> str:
    return conn.execute(f"SELECT DISTINCT tableoid::regclass::text AS p FROM engine.{table} WHERE user_id = %s",
                        (user,)).fetchone()["p"].removeprefix("engine.")


# --- the schema -----------------------------------------------------------------------------------


def _catalog(conn) -> dict[str, set[str]]:
    return {
        "partitioned": {r["t"] for r in conn.execute(
            "SELECT relname AS t FROM pg_class WHERE relkind = 'p' AND relnamespace = 'engine'::regnamespace")},
        "partitions": {r["t"] for r in conn.execute(
            "SELECT c.relname AS t FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " JOIN pg_class p ON p.oid = i.inhparent WHERE p.relkind = 'p'")},
        "indexes": {r["d"].replace(" ON ONLY ", " ON ") for r in conn.execute(
            "SELECT pg_get_indexdef(i.indexrelid) AS d FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid"
            " WHERE c.relnamespace = 'engine'::regnamespace AND c.relispartition IS NOT TRUE"
            "   AND NOT EXISTS (SELECT 1 FROM pg_constraint k"
            "                   WHERE k.conindid = i.indexrelid AND k.contype IN ('p', 'u'))")},
        "triggers": {r["d"] for r in conn.execute(
            "SELECT pg_get_triggerdef(t.oid) AS d FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
            " WHERE c.relnamespace = 'engine'::regnamespace AND NOT t.tgisinternal AND t.tgparentid = 0")},
        "checks": {f"{r['t']}.{r['name']}: {r['d']}" for r in conn.execute(
            "SELECT conrelid::regclass::text AS t, conname AS name, pg_get_constraintdef(oid) AS d FROM pg_constraint"
            " WHERE contype = 'c' AND connamespace = 'engine'::regnamespace"
            "   AND NOT (SELECT relispartition FROM pg_class WHERE oid = conrelid)")},
        "keys": {f"{r['name']}: {r['d']}" for r in conn.execute(
            "SELECT conname AS name, pg_get_constraintdef(oid) AS d FROM pg_constraint"
            " WHERE contype IN ('p', 'u', 'f') AND connamespace = 'engine'::regnamespace AND conparentid = 0"
            "   AND NOT (SELECT relispartition FROM pg_class WHERE oid = conrelid)")},
        "columns": {f"{r['t']}.{r['c']} {r['type']} null={r['n']} default={r['def']} generated={r['g']}"
                    for r in conn.execute(
            "SELECT table_name AS t, column_name AS c, data_type AS type, is_nullable AS n, column_default AS def,"
            "       generation_expression AS g FROM information_schema.columns WHERE table_schema = 'engine'"
            "   AND table_name NOT LIKE '%%\\_p_'")},
        "grants": {f"{r['t']} {r['p']}" for r in conn.execute(
            "SELECT table_name AS t, privilege_type AS p FROM information_schema.role_table_grants"
            " WHERE grantee = 'eros_app' AND table_schema = 'engine' AND table_name NOT LIKE '%%\\_p_'")},
    }


# What partitioning by user changed, and nothing else: every primary key carries user_id (chat_sessions' is
# migration 0010's UNIQUE (id, user_id), now one index), and every foreign key to a partitioned table carries it
# on both sides (chat_messages' two keys to its session are one now: 0010's). ON DELETE SET NULL names its column.
CHANGED_KEYS = {
    "removed": {
        "persona_instances_pkey: PRIMARY KEY (id)", "chat_sessions_pkey: PRIMARY KEY (id)",
        "chat_messages_pkey: PRIMARY KEY (id)",
        "companion_memories_pkey: PRIMARY KEY (id)", "chat_sessions_id_user_key: UNIQUE (id, user_id)",
        "chat_messages_session_id_fkey: FOREIGN KEY (session_id) REFERENCES engine.chat_sessions(id) ON DELETE CASCADE",
        "chat_sessions_instance_id_fkey: FOREIGN KEY (instance_id) REFERENCES engine.persona_instances(id)",
        "companion_memories_instance_id_fkey: FOREIGN KEY (instance_id) REFERENCES engine.persona_instances(id)"
        " ON DELETE CASCADE",
        "companion_memories_session_id_fkey: FOREIGN KEY (session_id) REFERENCES engine.chat_sessions(id)"
        " ON DELETE SET NULL",
        "companion_memories_superseded_by_fkey: FOREIGN KEY (superseded_by) REFERENCES engine.companion_memories(id)"
        " ON DELETE SET NULL",
    },
    "added": {
        "persona_instances_pkey: PRIMARY KEY (id, user_id)", "chat_sessions_pkey: PRIMARY KEY (id, user_id)",
        "chat_messages_pkey: PRIMARY KEY (id, user_id)",
        "companion_memories_pkey: PRIMARY KEY (id, user_id)",
        "chat_sessions_instance_id_fkey: FOREIGN KEY (instance_id, user_id)"
        " REFERENCES engine.persona_instances(id, user_id)",
        "companion_memories_instance_id_fkey: FOREIGN KEY (instance_id, user_id)"
        " REFERENCES engine.persona_instances(id, user_id) ON DELETE CASCADE",
        "companion_memories_session_id_fkey: FOREIGN KEY (session_id, user_id)"
        " REFERENCES engine.chat_sessions(id, user_id) ON DELETE SET NULL (session_id)",
        "companion_memories_superseded_by_fkey: FOREIGN KEY (superseded_by, user_id)"
        " REFERENCES engine.companion_memories(id, user_id) ON DELETE SET NULL (superseded_by)",
    },
}


def test_the_partitioned_schema_keeps_every_index_and_check_and_puts_the_user_in_every_key(db, partitioned):
    plain, hashed = _catalog(db), _catalog(partitioned)
    assert plain["partitioned"] == set() and hashed["partitioned"] == set(TABLES)
    assert hashed["partitions"] == {f"{t}_p{n}" for t in TABLES for n in range(PARTITIONS)}
    for kind in ("checks", "columns", "grants", "triggers"):  # grants: the application role's, as migrate gives them
        assert hashed[kind] == plain[kind], kind
    # Every index as it is: each unique one names the user already (migrations 0024 and 0026 for the episodes').
    assert hashed["indexes"] == plain["indexes"]
    assert {"removed": plain["keys"] - hashed["keys"], "added": hashed["keys"] - plain["keys"]} == CHANGED_KEYS
    # The storage parameter of migration 0003 is on every partition of the memories.
    options = partitioned.execute("SELECT relname, reloptions FROM pg_class WHERE relname LIKE 'companion_memories_p_'"
                                  ).fetchall()
    assert {r["relname"]: r["reloptions"] for r in options} == {
        f"companion_memories_p{n}": ["toast_tuple_target=8160"] for n in range(PARTITIONS)}


# --- recall ---------------------------------------------------------------------------------------


def dataset(seed: int = 13) -> tuple[list[tuple], list[tuple]]:
    """(persona instances, memories) for USERS: both layers, clustered embeddings (near-duplicates that the
    demotion and hygiene act on), missing importances, event times, superseded rows, a few words in common."""
    rng = random.Random(seed)
    topics = [[rng.gauss(0, 1) for _ in range(DIM)] for _ in range(6)]
    instances: list[tuple] = []
    memories: list[tuple] = []
    for user in USERS:
        instance = uuid.UUID(int=rng.getrandbits(128), version=4)
        instances.append((instance, user))
        latest = None
        for j in range(36):
            relationship = j % 3 == 2
            noise = rng.choice((0.05, 0.4, 1.0))
            memory_id = uuid.UUID(int=rng.getrandbits(128), version=4)
            superseded = not relationship and latest is not None and j % 7 == 6
            occurred = date(2020, 1, 1) + timedelta(days=rng.randrange(2000)) if j % 5 == 0 else None
            memories.append((
                memory_id, user, instance if relationship else None,
                f"{rng.choice(WORDS)} and {rng.choice(WORDS)}, note {j}",
                Vector([t + rng.gauss(0, noise) for t in topics[rng.randrange(len(topics))]]),
                None if relationship else CATEGORIES[j % 5], None if j % 4 == 0 else rng.random(),
                NOW - timedelta(days=rng.uniform(0, 400)), occurred, occurred and "day",
                NOW - timedelta(days=1) if superseded else None, latest if superseded else None,
                "changed" if superseded else None, "utterance" if relationship else "dreaming"))
            if not relationship:
                latest = memory_id
    return instances, memories


def load(conn, instances: list[tuple], memories: list[tuple]) -> None:
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO engine.persona_instances (id, user_id, persona_id) VALUES (%s, %s, 'luna')",
                        instances)
        cur.executemany(
            "INSERT INTO engine.companion_memories (id, user_id, instance_id, content, embedding, category,"
            " importance, created_at, occurred_at, occurred_precision, superseded_at, superseded_by,"
            " superseded_reason, source) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)", memories)
    conn.execute("ANALYZE")


def queries(instances: list[tuple], memories: list[tuple], seed: int = 5) -> list[tuple]:
    """(user, instance, embedding, message) for every fourth user: near one of their rows, words in common."""
    rng = random.Random(seed)
    out = []
    for instance, user in instances[::4]:
        row = rng.choice([m for m in memories if m[1] == user])
        out.append((user, instance, [x + rng.gauss(0, 0.3) for x in row[4].to_list()],
                    f"what about {rng.choice(WORDS)} and {row[3].split()[0]}?"))
    return out


STRATEGIES = ("grouped", "recency", "composite")


def recall_everything(asked: list[tuple]) -> list[list[Any]]:
    """Every recall the store can run for these queries: each layer through ``ranked`` and both through
    ``candidates``, for every strategy, with the demotion off and on, with and without the message's words."""
    results: list[list[Any]] = []
    for user, instance, query, message in asked:
        for strategy in STRATEGIES:
            for penalty in (0.0, 0.05):
                params = RecallKnobs(strategy=strategy, demote_penalty=penalty, category_cap=3)
                cap = params.per_category if strategy == "grouped" else params.category_cap
                for text in (None, message):
                    results.append(recall_store.ranked(MemoryLayer.PROFILE, params, user, query, k=8, cap=cap,
                                                       message=text, now=NOW))
                    results.append(recall_store.ranked(MemoryLayer.RELATIONSHIP, params, user, query, k=5, cap=None,
                                                       instance_id=instance, message=text, now=NOW))
                    results.append(recall_store.candidates(params, user, query, k=8, cap=cap, relationship_k=5,
                                                           instance_id=instance, dedupe=0.97, message=text, now=NOW))
        results.append(recall_store.ranked(MemoryLayer.PROFILE, RecallKnobs(), user, query, k=8, cap=None,
                                           message=message, now=NOW, category="fact"))
    return results


def test_recall_returns_the_same_rows_in_the_same_order_with_the_same_scores(db, partitioned, env, database_url,
                                                                            partitioned_url):
    instances, memories = dataset()
    load(db, instances, memories)
    load(partitioned, instances, memories)
    assert len({partition_of(partitioned, user) for user in USERS}) == PARTITIONS  # the users are spread
    asked = queries(instances, memories)
    env(DATABASE_URL=database_url)
    one_table = recall_everything(asked)
    env(DATABASE_URL=partitioned_url)
    hashed = recall_everything(asked)
    assert len(hashed) == len(one_table) == len(asked) * (len(STRATEGIES) * 2 * 2 * 3 + 1)
    assert hashed == one_table  # ids, order, every score part, embeddings: exactly, not approximately
    rows = [row for result in hashed for row in result]
    # Nothing trivial: the rows came back, and the demotion, the lexical part and hygiene's near-duplicates acted.
    assert all(result for result in hashed)
    assert any(row["demotion"] > 0 for row in rows) and any(row["lexical_term"] > 0 for row in rows)
    assert any(row.get("near") for row in rows)


def test_a_recall_statement_reads_only_its_users_partition(partitioned, env, partitioned_url):
    instances, memories = dataset()
    load(partitioned, instances, memories)
    env(DATABASE_URL=partitioned_url)
    params = RecallKnobs()
    seen = set()
    for user, instance, query, message in queries(instances, memories):
        own = partition_of(partitioned, user)
        seen.add(own)
        with explaining(eros_db.connection()):
            plans = [recall_store.candidates(params, user, query, k=8, cap=None, relationship_k=5, instance_id=instance,
                                             dedupe=0.97, message=message),
                     recall_store.ranked(MemoryLayer.PROFILE, params, user, query, k=8, cap=None, message=message),
                     recall_store.ranked(MemoryLayer.RELATIONSHIP, params, user, query, k=5, cap=None,
                                         instance_id=instance)]
        # And the plan a turn's recall keeps (engine.turn_recall: planned once without the values): the
        # partitions are pruned when it starts, by the user it is given.
        with explaining(eros_db.connection(), generic=True):
            plans.append(recall_store.candidates(params, user, query, k=8, cap=None, relationship_k=5,
                                                 instance_id=instance, dedupe=0.97, message=message))
        assert any("Subplans Removed" in r["QUERY PLAN"] for r in plans[-1])
        for plan in plans:
            assert partitions_in(plan, "companion_memories") == {own}, "\n".join(r["QUERY PLAN"] for r in plan)
    assert len(seen) >= 2  # the users asked live in different partitions
    # The claim is cross-user by design (tests/test_shard_ready.py): it reads every partition, as it would run on
    # every shard of a distributed database.
    with explaining(eros_db.connection()):
        plan = dreaming_store.claim(idle_before=NOW, stale_before=NOW, limit=10)
    assert partitions_in(plan, "chat_sessions") == {f"chat_sessions_p{n}" for n in range(PARTITIONS)}


# --- the claim ------------------------------------------------------------------------------------


def test_concurrent_claimers_take_every_idle_session_across_partitions_exactly_once(partitioned, env,
                                                                                   partitioned_url):
    now = utcnow()
    partitioned.execute("INSERT INTO engine.persona_instances (user_id, persona_id)"
                        " SELECT 'claimer-' || g, 'luna' FROM generate_series(1, 40) AS g")
    ids = {r["id"] for r in partitioned.execute(
        "INSERT INTO engine.chat_sessions (user_id, instance_id, created_at, last_active_at)"
        " SELECT i.user_id, i.id, %(t)s - interval '1 hour' - g * interval '1 s', %(t)s - g * interval '1 s'"
        " FROM generate_series(1, 25) AS g, engine.persona_instances i RETURNING id",
        {"t": now - IDLE - timedelta(minutes=1)}).fetchall()}
    assert len(ids) == 1000
    assert partitioned.execute("SELECT count(DISTINCT tableoid) AS n FROM engine.chat_sessions").fetchone()["n"] == 4
    env(DATABASE_URL=partitioned_url)
    per_worker = claim_concurrently(8, idle_before=now - IDLE, stale_before=now - STALE)
    claimed = [sid for got in per_worker for sid in got]
    assert len(claimed) == len(set(claimed)), f"{len(claimed) - len(set(claimed))} sessions claimed twice"
    assert set(claimed) == ids
    assert sum(1 for got in per_worker if got) >= 2, "the claimers did not actually run concurrently"
    counts = partitioned.execute("SELECT extraction_attempts AS attempts, count(*) AS n, count(extraction_claimed_at)"
                                 " AS stamped FROM engine.chat_sessions GROUP BY 1").fetchall()
    assert counts == [{"attempts": 0, "n": 1000, "stamped": 1000}]


# --- a turn and its extraction --------------------------------------------------------------------

SESSIONS = (("I live in Shanghai with my cat Miso.", "My sister Anna works as a nurse in Berlin."),
            ("I moved to Tokyo last month.", "I love mocha in the rain."),
            ("Do you remember where I live and what my sister does?",))


def extract_idle_sessions(conn) -> list[str]:
    """The sweep's claim, then one extraction per claimed session (what the extract function runs)."""
    go_idle(conn)
    sent: list[dict] = []
    dreaming.sweep(settings(), sent.append, now=utcnow)
    outcomes = []
    for payload in (p for p in sent if p.get("kind") != "deep_pass"):
        outcomes.append(dreaming.extract_session(settings(), payload["user_id"], uuid.UUID(payload["session_id"]),
                                                 datetime.fromisoformat(payload["claim_token"])).outcome)
    return outcomes


def converse(conn, user: str = "alice") -> dict:
    """Three sessions of turns, each extracted after it went idle: what a user sees, without ids and times."""
    recalled, outcomes = [], []
    for turns in SESSIONS:
        session = chat_store.create_session(user, "luna")
        assert session is not None
        for n, content in enumerate(turns):
            result = chat.take_turn(user, session["id"], content, f"t{n}")
            recalled.append([(m.layer, m.content) for m in result.recalled])
        outcomes += extract_idle_sessions(conn)
    memories = conn.execute("SELECT content, category, source, superseded_reason, (superseded_by IS NOT NULL) AS"
                            " replaced FROM engine.companion_memories WHERE user_id = %s ORDER BY content, source",
                            (user,)).fetchall()
    return {"recalled": recalled, "outcomes": outcomes, "memories": memories}


def test_turns_and_their_extraction_work_unchanged_and_stay_in_the_users_partition(db, partitioned, env, database_url,
                                                                                   partitioned_url):
    env(DATABASE_URL=database_url)
    one_table = converse(db)
    env(DATABASE_URL=partitioned_url)
    hashed = converse(partitioned)
    assert hashed == one_table
    assert hashed["outcomes"] == ["extracted"] * 3
    assert any(m["replaced"] and m["superseded_reason"] == "changed" for m in hashed["memories"])  # Shanghai -> Tokyo
    assert any("Tokyo" in content for layer, content in hashed["recalled"][-1] if layer == "profile")
    homes = {r["p"] for table in TABLES for r in partitioned.execute(
        f"SELECT DISTINCT tableoid::regclass::text AS p FROM engine.{table} WHERE user_id = 'alice'")}
    assert len(homes) >= 5 and {name.rsplit("_p", 1)[1] for name in homes} == {partition_of(partitioned, "alice")[-1]}
    # A memory's key to its session nulls the session alone (ON DELETE SET NULL (session_id)): the row stays its user's.
    first = partitioned.execute("SELECT session_id FROM engine.companion_memories WHERE user_id = 'alice'"
                                " AND session_id IS NOT NULL ORDER BY created_at LIMIT 1").fetchone()["session_id"]
    theirs = "SELECT id, user_id, session_id FROM engine.companion_memories WHERE id = ANY (%s) ORDER BY id"
    kept = [r["id"] for r in partitioned.execute("SELECT id FROM engine.companion_memories WHERE session_id = %s",
                                                  (first,))]
    partitioned.execute("DELETE FROM engine.chat_sessions WHERE id = %s AND user_id = 'alice'", (first,))
    assert partitioned.execute(theirs, (kept,)).fetchall() == [
        {"id": i, "user_id": "alice", "session_id": None} for i in sorted(kept)] != []
    # Erasure deletes through the composite keys and leaves nothing behind.
    erased = account.erase("alice")
    assert erased["sessions"] == 2 and erased["memories"] == len(hashed["memories"])
    for table in TABLES:
        assert partitioned.execute(f"SELECT count(*) AS n FROM engine.{table} WHERE user_id = 'alice'"
                                   ).fetchone()["n"] == 0, table


def test_a_retried_turn_is_a_replay_on_partitioned_messages(partitioned, env, partitioned_url):
    """Migration 0013's turn key names user_id, so it is a key the partitioned table can have, and the turn's
    ON CONFLICT target matches it: the same client_turn_id again answers the stored reply, one pair of rows."""
    env(DATABASE_URL=partitioned_url)
    session = chat_store.create_session("alice", "luna")
    first = chat.take_turn("alice", session["id"], "hello", "t1")
    again = chat.take_turn("alice", session["id"], "hello", "t1")
    assert not first.replayed and again.replayed and again.reply == first.reply
    rows = partitioned.execute("SELECT role, tableoid::regclass::text AS p FROM engine.chat_messages"
                               " WHERE user_id = 'alice' AND client_turn_id = 't1' ORDER BY role").fetchall()
    assert [r["role"] for r in rows] == ["assistant", "user"]
    home = partition_of(partitioned, "alice", "chat_sessions").rsplit("_p", 1)[1]
    assert {r["p"] for r in rows} == {f"engine.chat_messages_p{home}"}  # with its session
