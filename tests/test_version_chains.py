"""One fact, one current version, always (issue 25, items 1, 2 and 5): a version chain never ends with two
active rows, whatever the user, dreaming and the deep pass do to it, in any order, one after another or at
once; and the user's erasure wins against the user's own writes, without a deadlock reaching the client.

* The two reproductions of the red team: a restore racing an edit (made deterministic with a held row lock),
  and v0 <- v1 <- v2 with v1 deleted, then v0 restored.
* The chain-ordering matrix: every ordered pair of eight operations (edit, restore of the oldest and of the
  middle version, delete of the middle and of the current version, a deep-pass merge, a deep-pass change,
  restore of the merged duplicate), and every ordered triple of the five that change the chain most, each
  sequence on a chain of its own, against a model of which rows are versions of one fact.
* The same operations two at a time in threads (each with its own connection, as two Lambda containers),
  erasure among them.
* The database enforces the invariant (a unique index) and keeps the chains (a trigger), whoever writes.
* Erasure racing the user's edits and restores: always 200, nothing left, no deadlock answered as an outage.

The runs use the store functions the handlers call (the handler for the HTTP reproductions): the same
transactions, fewer layers, so that hundreds of sequences run in seconds.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import psycopg
import pytest
from apiclient import Api
from helpers import migrate_before
from pgvector import Vector
from test_memory_history import containers, queued_on_a_held_row
from test_migrations import fresh_database  # noqa: F401 -- the fixture

from eros import db as eros_db
from eros.db import one
from eros.providers.offline import HashingEmbedder, hash_embed
from eros.store import account
from eros.store import deep_pass as deep_store
from eros.store import memories as memory_store

OFFLINE = HashingEmbedder.model  # the configured embedder's model: what an edit through the API embeds with


def vector(text: str) -> list[float]:
    return hash_embed(text)


# --- a chain, and a model of its facts -------------------------------------------------------------------
@dataclass
class Chain:
    """One user's fact F in three versions (v0 <- v1 <- v2, by edits) and a second fact Z; ``fact`` is the
    model: which fact each of the user's rows is a version of (a merge or a change makes F and Z one fact, a
    restored duplicate makes Z its own again)."""

    user: str
    versions: list[UUID]
    z: UUID
    fact: dict[UUID, str] = field(default_factory=dict)
    applied: Counter = field(default_factory=Counter)

    def rows(self, db=None) -> dict[UUID, dict]:
        """The user's profile rows, read on this thread's own connection (the operations run in threads)."""
        return {r["id"]: r for r in eros_db.connection().execute(
            "SELECT id, superseded_at, superseded_by, superseded_reason FROM engine.companion_memories"
            " WHERE user_id = %s AND instance_id IS NULL", (self.user,)).fetchall()}

    def active_of(self, db, fact: str) -> UUID | None:
        active = [i for i, r in self.rows(db).items() if r["superseded_at"] is None and self.fact.get(i) == fact]
        return active[0] if active else None


def edited(user: str, memory_id: UUID, text: str) -> UUID:
    new = memory_store.edit_memory(user, memory_id, {"content": text}, vector(text), OFFLINE)
    assert new is not None
    return new["id"]


def history(user: str, memory_id: UUID) -> list[Any]:
    found = memory_store.get_memory(user, memory_id)
    assert found is not None
    return list(found["history"])


def a_chain(user: str) -> Chain:
    v0 = memory_store.add_memory(user, "Lives in Shanghai", "fact", 0.7, vector("Lives in Shanghai"), OFFLINE)["id"]
    v1 = edited(user, v0, "Lives in Tokyo")
    v2 = edited(user, v1, "Lives in Osaka")
    z = memory_store.add_memory(user, "Lives in Kyoto", "fact", 0.6, vector("Lives in Kyoto"), OFFLINE)["id"]
    return Chain(user, [v0, v1, v2], z, {v0: "F", v1: "F", v2: "F", z: "Z"})


def deep_pass_apply(db, user: str, kind: str, survivor: UUID, target: UUID):
    """The deep pass's one guarded write with a plan of one action, under a claim taken as a sweep takes it."""
    token = one(eros_db.connection().execute(
        "INSERT INTO engine.user_deep_pass (user_id, changed_at, claimed_at) VALUES (%s, now(), clock_timestamp())"
        " ON CONFLICT (user_id) DO UPDATE SET claimed_at = clock_timestamp(), started_at = NULL RETURNING claimed_at",
        (user,)))["claimed_at"]
    snap = deep_store.snapshot(user, 100, 0.75)
    return deep_store.apply(user, token, [(kind, survivor, [target])], snap)


# The operations. Each looks at the chain as it is when it runs and does nothing when it does not apply (no
# current version to edit, nothing superseded to restore, a row already deleted), as a user would find.
def op_edit(db, c: Chain) -> None:
    head = c.active_of(db, "F")
    if head is None:
        return
    text = f"Lives in city {len(c.fact)}"
    try:
        new = memory_store.edit_memory(c.user, head, {"content": text}, vector(text), OFFLINE)
    except memory_store.NotCurrent:
        return
    if new is not None:
        c.fact[new["id"]] = c.fact[head]
        c.applied["edit"] += 1


def _restore(db, c: Chain, row: UUID, name: str) -> None:
    try:
        restored = memory_store.restore_memory(c.user, row)
    except memory_store.NotSuperseded:
        return
    if restored is None:
        return
    c.applied[name] += 1
    if name == "restore_z":
        c.fact[c.z] = "Z"  # the merged duplicate is its own fact again


def op_restore_oldest(db, c: Chain) -> None:
    _restore(db, c, c.versions[0], "restore_oldest")


def op_restore_middle(db, c: Chain) -> None:
    _restore(db, c, c.versions[1], "restore_middle")


def op_restore_z(db, c: Chain) -> None:
    row = c.rows(db).get(c.z)
    if row is not None and row["superseded_reason"] == "duplicate":
        _restore(db, c, c.z, "restore_z")


def _delete(c: Chain, row: UUID | None, name: str) -> None:
    if row is not None and memory_store.delete_memory(c.user, row):
        c.fact.pop(row, None)
        c.applied[name] += 1


def op_delete_middle(db, c: Chain) -> None:
    _delete(c, c.versions[1], "delete_middle")


def op_delete_head(db, c: Chain) -> None:
    _delete(c, c.active_of(db, "F"), "delete_head")


def _two_facts(db, c: Chain) -> tuple[UUID, UUID] | None:
    head, z = c.active_of(db, "F"), c.active_of(db, "Z")
    return (head, z) if head is not None and z is not None else None


def op_merge(db, c: Chain) -> None:
    """The deep pass merges Z into F's current version as a duplicate."""
    both = _two_facts(db, c)
    if both is None:
        return
    done = deep_pass_apply(db, c.user, "duplicate", both[0], both[1])
    if done is not None and done.merged:
        c.fact[c.z] = c.fact[both[0]]
        c.applied["merge"] += 1


def op_deep_changed(db, c: Chain) -> None:
    """The deep pass finds that Z replaces F's current version (a changed fact)."""
    both = _two_facts(db, c)
    if both is None:
        return
    done = deep_pass_apply(db, c.user, "changed", both[1], both[0])
    if done is not None and done.superseded:
        c.fact[c.z] = "F"  # Z is F's current version now
        c.applied["deep_changed"] += 1


OPS: dict[str, Callable[..., None]] = {
    "edit": op_edit, "restore_oldest": op_restore_oldest, "restore_middle": op_restore_middle,
    "delete_middle": op_delete_middle, "delete_head": op_delete_head, "merge": op_merge,
    "deep_changed": op_deep_changed, "restore_z": op_restore_z,
}
CORE = ("edit", "restore_oldest", "delete_middle", "merge", "deep_changed")


def assert_one_current_version(db, c: Chain, where: str) -> None:
    """The model's facts each have at most one active row, and the engine's own chains agree: every active
    memory's history (its chain, as the API shows it) holds no other active row."""
    rows = c.rows(db)
    per_fact = Counter(c.fact[i] for i, r in rows.items() if r["superseded_at"] is None and i in c.fact)
    assert all(n <= 1 for n in per_fact.values()), (where, per_fact, rows)
    for row_id, row in rows.items():
        if row["superseded_at"] is None:
            others = [m["id"] for m in history(c.user, row_id) if m["superseded_at"] is None and m["id"] != row_id]
            assert not others, (where, row_id, others)


# --- the red team's two reproductions, through the handler -----------------------------------------------
@pytest.fixture
def api(db):
    return Api()


def versions_over_http(api: Api, user: str) -> list[str]:
    status, v0 = api.call("POST", "/v1/memories", {"content": "Works at a bakery", "category": "fact"}, user=user)
    assert status == 201, v0
    status, v1 = api.call("PATCH", f"/v1/memories/{v0['id']}", {"content": "Works at a bank"}, user=user)
    assert status == 200, v1
    return [v0["id"], v1["id"]]


def active_ids(api: Api, user: str) -> list[str]:
    return [m["id"] for m in api.call("GET", "/v1/memories", user=user)[1]["memories"]]


def test_a_restore_racing_an_edit_of_the_head_leaves_one_current_version(api, db, database_url):
    """v0 <- v1; PATCH v1 and restore v0 at once. The PATCH queues first on v1's row (held by a third
    connection), the restore after it: before the fix the edit made v2 while the restore, having read v1 as
    the head, retired nothing, and v0 and v2 were both current."""
    v0, v1 = versions_over_http(api, "racer")
    edit, restore = containers(2)
    results: dict[str, tuple[int, dict]] = {}
    with psycopg.connect(database_url, autocommit=True) as holder, holder.transaction():
        holder.execute("SELECT 1 FROM engine.companion_memories WHERE id = %s FOR UPDATE", (v1,))
        editing = threading.Thread(target=lambda: results.__setitem__(
            "edit", edit.call("PATCH", f"/v1/memories/{v1}", {"content": "Works at a school"}, user="racer")))
        editing.start()
        _wait_for_lock_waiters(db, 1, "the edit")
        restoring = threading.Thread(target=lambda: results.__setitem__(
            "restore", restore.call("POST", f"/v1/memories/{v0}/restore", user="racer")))
        restoring.start()
        _wait_for_lock_waiters(db, 2, "the restore")
    editing.join(30)
    restoring.join(30)
    assert results["edit"][0] == 200 and results["restore"][0] == 200, results
    assert active_ids(api, "racer") == [v0]  # the restore, last, retired the edit's new version
    v2 = results["edit"][1]["id"]
    status, history = api.call("GET", f"/v1/memories/{v0}", user="racer")
    assert [m["id"] for m in history["history"]] == [v0, v1, v2]
    assert {m["id"]: m["superseded_reason"] for m in history["history"]} == {v0: None, v1: "edited", v2: "reverted"}


def _wait_for_lock_waiters(db, n: int, what: str) -> None:
    import time

    deadline = time.monotonic() + 20
    while db.execute("SELECT count(*) AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                     " AND datname = current_database()").fetchone()["n"] < n:
        assert time.monotonic() < deadline, f"{what} never queued"
        time.sleep(0.02)


def test_restoring_v0_after_the_middle_version_was_deleted_retires_the_current_one(api, db):
    """v0 <- v1 <- v2, DELETE v1, restore v0: the chain outlives the deleted link, so v2 is retired."""
    v0, v1 = versions_over_http(api, "deleter")
    status, v2 = api.call("PATCH", f"/v1/memories/{v1}", {"content": "Works at a school"}, user="deleter")
    assert status == 200
    assert api.call("DELETE", f"/v1/memories/{v1}", user="deleter")[0] == 204
    status, restored = api.call("POST", f"/v1/memories/{v0}/restore", user="deleter")
    assert status == 200, restored
    assert active_ids(api, "deleter") == [v0]
    assert [(m["id"], m["superseded_reason"]) for m in restored["history"]] == [(v0, None), (v2["id"], "reverted")]


def test_the_queued_restores_of_the_older_tests_still_serialise(api, db, database_url):
    """Two restores of two versions at once, both queued on the head's held row (as test_memory_history
    does for the restore lock this change replaced): one current version."""
    v0, v1 = versions_over_http(api, "twice")
    status, v2 = api.call("PATCH", f"/v1/memories/{v1}", {"content": "Works at a school"}, user="twice")
    results: list[int] = []
    queued_on_a_held_row(db, database_url, v2["id"], [
        lambda c=c, m=m: results.append(c.call("POST", f"/v1/memories/{m}/restore", user="twice")[0])
        for c, m in zip(containers(2), (v0, v1), strict=True)], "the two restores")
    assert sorted(results) == [200, 200]
    assert len(active_ids(api, "twice")) == 1


# --- the database enforces it --------------------------------------------------------------------------
def test_a_second_current_version_is_refused_by_the_database_whoever_writes_it(db):
    c = a_chain("direct")
    with pytest.raises(psycopg.errors.UniqueViolation, match="companion_memories_one_current_version"):
        db.execute("UPDATE engine.companion_memories SET superseded_at = NULL, superseded_by = NULL,"
                   " superseded_reason = NULL WHERE id = %s", (c.versions[0],))
    assert sorted(r for r, v in c.rows(db).items() if v["superseded_at"] is None) == sorted([c.versions[2], c.z])


def test_the_database_joins_chains_whoever_links_two_rows(db):
    """A repair script that links rows by hand (UPDATE or INSERT with superseded_by) makes them one chain."""
    c = a_chain("linker")
    db.execute("UPDATE engine.companion_memories SET superseded_at = now(), superseded_by = %s,"
               " superseded_reason = 'changed' WHERE id = %s", (c.versions[2], c.z))
    assert {m["id"] for m in history("linker", c.z)} == {*c.versions, c.z}
    imported = db.execute(
        "INSERT INTO engine.companion_memories (user_id, content, embedding, category, source, superseded_at,"
        " superseded_by, superseded_reason) VALUES ('linker', 'Lived in Nara', %s, 'fact', 'user', now(), %s,"
        " 'changed') RETURNING id", (Vector(vector("Lived in Nara")), c.versions[2])).fetchone()["id"]
    assert imported in {m["id"] for m in history("linker", c.versions[0])}
    # Relationship rows are never versions: an utterance outdated by a fact does not join its chain.
    assert db.execute("SELECT count(*) AS n FROM engine.companion_memories WHERE instance_id IS NOT NULL"
                      " AND chain_id IS NOT NULL").fetchone()["n"] == 0


# --- every ordering, one after another ---------------------------------------------------------------
SEQUENCES = sorted(set(itertools.product(OPS, repeat=2)) | set(itertools.product(CORE, repeat=3)))


def test_every_ordering_of_the_chain_operations_keeps_one_current_version(db):
    applied: Counter = Counter()
    for n, sequence in enumerate(SEQUENCES):
        c = a_chain(f"seq{n}")
        for step, name in enumerate(sequence):
            OPS[name](db, c)
            assert_one_current_version(db, c, f"{sequence} after step {step}")
        applied.update(c.applied)
    # Every operation really ran somewhere (a matrix of no-ops would prove nothing).
    assert set(applied) == set(OPS), applied
    assert len(SEQUENCES) == 8 * 8 + 5 ** 3


# --- two at a time ------------------------------------------------------------------------------------
def op_erase(db, c: Chain) -> None:
    account.erase(c.user)
    c.fact.clear()
    c.applied["erase"] += 1


CONCURRENT = {**OPS, "erase": op_erase}


def run_together(db, c: Chain, names: tuple[str, str]) -> list[BaseException]:
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def run(name: str) -> None:
        try:
            barrier.wait(10)
            CONCURRENT[name](db, c)
        except BaseException as exc:  # noqa: BLE001 -- every failure is the test's to report
            errors.append(exc)
        finally:
            eros_db.reset()  # this thread's connection

    threads = [threading.Thread(target=run, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return errors


def test_the_chain_operations_two_at_a_time_keep_one_current_version(db, monkeypatch):
    retries: list[str] = []
    original = eros_db.logger.warning
    monkeypatch.setattr(eros_db.logger, "warning", lambda msg, *a, **k: (retries.append(msg), original(msg, *a, **k)))
    pairs = list(itertools.combinations_with_replacement(sorted(CONCURRENT), 2))
    for n, names in enumerate(pairs * 2):
        c = a_chain(f"pair{n}")
        errors = run_together(db, c, names)
        assert not errors, (names, errors)
        if "erase" in names:
            assert not c.rows(db), names  # whatever ran with it, before or after, nothing is left
            continue
        # The model cannot know the order the two ran in; what must hold whatever it was: each of the engine's
        # chains has one current version, and the user has no more current rows than facts (F and Z, or one
        # fact once a merge or a change applied and no restore split it again).
        facts = 2 - bool(c.applied["merge"] or c.applied["deep_changed"]) + bool(c.applied["restore_z"])
        rows = c.rows(db)
        assert sum(r["superseded_at"] is None for r in rows.values()) <= facts, (names, rows)
        for row_id, row in rows.items():
            if row["superseded_at"] is None:
                versions = history(c.user, row_id)
                assert [m["id"] for m in versions if m["superseded_at"] is None] == [row_id], (names, versions)
    print(f"deadlock retries observed: {len(retries)} in {len(pairs) * 2} concurrent pairs")


# --- erasure wins ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("rival", ["edit", "restore", "delete"])
def test_erasure_racing_the_users_own_writes_always_erases(api, db, rival):
    """DELETE /v1/me against the same user's PATCH / restore / DELETE of a memory, ten rounds: erasure answers
    200 every time and nothing of the user is left (before the lock order, 7 of 10 rounds were a deadlock
    answered 503 database_unavailable, and nothing was erased)."""
    statuses: Counter = Counter()
    eraser, writer = containers(2)
    for n in range(10):
        user = f"erase-{rival}-{n}"
        c = a_chain(user)
        request = {"edit": ("PATCH", f"/v1/memories/{c.versions[2]}", {"content": "Lives in Nara"}),
                   "restore": ("POST", f"/v1/memories/{c.versions[0]}/restore", None),
                   "delete": ("DELETE", f"/v1/memories/{c.versions[2]}", None)}[rival]
        results: dict[str, int] = {}
        barrier = threading.Barrier(2)

        def call(name: str, container: Api, method: str, path: str, body, user=user, barrier=barrier,
                 results=results) -> None:
            barrier.wait(10)
            results[name] = container.call(method, path, body, user=user)[0]
            eros_db.reset()

        threads = [threading.Thread(target=call, args=("erase", eraser, "DELETE", "/v1/me", None)),
                   threading.Thread(target=call, args=("write", writer, *request))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        statuses[(results["erase"], results["write"])] += 1
        assert results["erase"] == 200, results
        assert results["write"] in (200, 204, 404), results
        assert db.execute("SELECT count(*) AS n FROM engine.companion_memories WHERE user_id = %s",
                          (user,)).fetchone()["n"] == 0, (rival, n, results)
    print(f"erasure vs {rival}: {dict(statuses)}")


# --- the net under the lock order: a deadlock is retried inside the request --------------------------------
def test_a_real_deadlock_is_tried_again_and_both_transactions_complete(db):
    """Two transactions lock two rows in opposite orders: Postgres aborts one (after deadlock_timeout) and
    ``retried`` runs it again. Nothing reaches the caller, and each change is made once."""
    c = a_chain("deadlock")
    first, second = c.versions[2], c.z
    attempts: Counter = Counter()
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    @eros_db.retried
    def lock_both(name: str, one: UUID, other: UUID) -> None:
        attempts[name] += 1
        with eros_db.transaction() as conn:
            conn.execute("SELECT 1 FROM engine.companion_memories WHERE id = %s FOR UPDATE", (one,))
            if attempts[name] == 1:
                barrier.wait(10)  # both hold their first row before either asks for its second
            conn.execute("UPDATE engine.companion_memories SET mention_count = mention_count + 1 WHERE id = %s",
                         (other,))

    def run(name: str, one: UUID, other: UUID) -> None:
        try:
            lock_both(name, one, other)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            eros_db.reset()

    threads = [threading.Thread(target=run, args=("a", first, second)),
               threading.Thread(target=run, args=("b", second, first))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    assert sum(attempts.values()) >= 3 and max(attempts.values()) >= 2, attempts  # aborted, and tried again
    counts = db.execute("SELECT id, mention_count FROM engine.companion_memories WHERE id = ANY(%s)",
                        ([first, second],)).fetchall()
    assert sorted(r["mention_count"] for r in counts) == [2, 2]  # both updates happened, once each


def test_a_conflict_that_outlasts_the_retries_is_503_database_busy_and_writes_nothing(api, db, monkeypatch):
    """Every try of the restore aborted as a deadlock: ATTEMPTS tries, then a clear 503 with its own code (not
    'database unavailable'), and the chain as it was."""
    v0, v1 = versions_over_http(api, "busy")
    tries: list[str] = []

    def deadlocked(conn, user_id):
        tries.append(user_id)
        raise psycopg.errors.DeadlockDetected("deadlock detected")

    monkeypatch.setattr(memory_store.consolidation, "hold_user", deadlocked)
    status, body = api.call("POST", f"/v1/memories/{v0}/restore", user="busy")
    assert (status, body["code"], body["retryable"]) == (503, "database_busy", True), body
    assert len(tries) == eros_db.ATTEMPTS
    monkeypatch.undo()
    assert active_ids(api, "busy") == [v1]


# --- a database migrated before the chains ---------------------------------------------------------------
def test_migration_0017_names_the_chains_of_existing_rows(fresh_database):  # noqa: F811 -- the fixture
    """Rows written before 0017: a chain is named after where its links lead; a chain already broken by a
    deletion and a restored duplicate are chains of their own; the invariant's index is built over them (it
    would fail on two current rows in one chain)."""
    from eros.migrate import migrate

    with psycopg.connect(fresh_database, autocommit=True) as conn:
        migrate_before(conn, "0017")

        def row(content: str) -> UUID:
            return one(conn.execute(
                "INSERT INTO engine.companion_memories (user_id, content, embedding, category, source)"
                " VALUES ('old', %s, %s::vector, 'fact', 'dreaming') RETURNING id", (content, str(vector(content)))))[0]

        def link(old: UUID, new: UUID | None, reason: str = "changed") -> None:
            conn.execute("UPDATE engine.companion_memories SET superseded_at = now(), superseded_by = %s,"
                         " superseded_reason = %s WHERE id = %s", (new, reason, old))

        a, b, c = row("Lives in Berlin"), row("Lives in Lisbon"), row("Lives in Tokyo")
        link(a, b)
        link(b, c)
        broken0, broken2 = row("Works at a bakery"), row("Works at a school")
        link(broken0, None)  # its successor, the middle version, was deleted before 0017
        twin, duplicate = row("Likes mocha"), row("Likes mocha coffee")  # restored after a merge: both active
    assert [n for n in migrate(fresh_database) if n.startswith("0017")] == ["0017_one_current_version"]
    with psycopg.connect(fresh_database) as conn:
        chains = dict(conn.execute("SELECT id, coalesce(chain_id, id) FROM engine.companion_memories").fetchall())
        assert chains[a] == chains[b] == chains[c] == c
        assert chains[broken0] == broken0 and chains[broken2] == broken2
        assert chains[twin] == twin and chains[duplicate] == duplicate
        # And the trigger works on the migrated rows: linking the school to the bakery joins them.
        conn.execute("UPDATE engine.companion_memories SET superseded_at = now(), superseded_by = %s,"
                     " superseded_reason = 'changed' WHERE id = %s", (broken0, broken2))
        assert len({cid for (cid,) in conn.execute(
            "SELECT coalesce(chain_id, id) FROM engine.companion_memories WHERE id = ANY(%s)",
            ([broken0, broken2],)).fetchall()}) == 1
