"""Memory history, undo and provenance through the real chat handler (API Gateway events, embedded
Postgres): listing with and without superseded rows, one memory with its version chain, restore
(and its concurrency guard), deletion of a successor, cross-user isolation, bad input, and recall
before and after a restore.

Setup rows are written in SQL, the way consolidation leaves them: alice's fact chain A -> B -> C
(each 'changed' into the next), a duplicate D merged into E, a stable fact F, one relationship
utterance from a real chat turn; bob has his own chain X -> Y.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass

import pytest
from apiclient import Api
from pgvector import Vector
from psycopg.types.json import Jsonb

from eros.providers.offline import hash_embed

FIELDS = {"id", "layer", "category", "content", "importance", "persona_id", "created_at", "occurred_at",
          "occurred_precision", "source", "session_id",
          "from_message_id", "through_message_id", "model", "last_confirmed_at", "mention_count",
          "superseded_at", "superseded_by", "superseded_reason", "supersedes"}


@pytest.fixture
def api(db):
    return Api()


def insert(db, user: str, content: str, *, days_ago: float, category: str = "fact", source: str = "dreaming",
           metadata: dict | None = None, session_id: str | None = None, messages: tuple[int, int] | None = None,
           importance: float | None = 0.6) -> str:
    row = db.execute(
        "INSERT INTO engine.companion_memories (user_id, content, embedding, category, importance, source, metadata,"
        " session_id, from_message_id, through_message_id, created_at)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, now() - make_interval(secs => %s)) RETURNING id",
        (user, content, Vector(hash_embed(content)), category, importance, source, Jsonb(metadata or {}), session_id,
         *(messages or (None, None)), days_ago * 86400),
    ).fetchone()
    return str(row["id"])


def supersede(db, old: str, new: str | None, reason: str = "changed") -> None:
    db.execute("UPDATE engine.companion_memories SET superseded_at = now(), superseded_by = %s, superseded_reason = %s"
               " WHERE id = %s", (new, reason, old))


@dataclass
class World:
    a: str
    b: str
    c: str
    d: str
    e: str
    f: str
    rel: str
    session: str
    rel_message: int
    x: str
    y: str


@pytest.fixture
def world(api, db) -> World:
    session = api.session("alice")
    status, turn = api.call("POST", f"/v1/sessions/{session}/turns", {"content": "we talked about my garden"})
    assert status == 200
    rel = str(db.execute("SELECT id FROM engine.companion_memories WHERE user_id = 'alice'").fetchone()["id"])
    a = insert(db, "alice", "lives in Berlin", days_ago=30, session_id=session, messages=(1, 1),
               metadata={"model": "anthropic/claude-haiku-4.5"})
    b = insert(db, "alice", "moved to Lisbon", days_ago=20, source="deep_pass")
    c = insert(db, "alice", "moved to Tokyo", days_ago=10)
    d = insert(db, "alice", "likes mocha", days_ago=9, category="preference")
    e = insert(db, "alice", "likes mocha coffee", days_ago=8, category="preference")
    f = insert(db, "alice", "has a daughter, Mia", days_ago=400, category="relation", importance=0.9)
    supersede(db, a, b)
    supersede(db, b, c)
    supersede(db, d, e, "duplicate")
    db.execute("UPDATE engine.companion_memories SET mention_count = 2, last_confirmed_at = now() WHERE id = %s", (e,))
    x = insert(db, "bob", "works at a bakery", days_ago=5)
    y = insert(db, "bob", "works at a bank", days_ago=1)
    supersede(db, x, y)
    return World(a, b, c, d, e, f, rel, session, turn["user_message_id"], x, y)


def ids(memories: list[dict]) -> list[str]:
    return [m["id"] for m in memories]


def snapshot(db) -> list[dict]:
    return db.execute("SELECT id, user_id, content, superseded_at, superseded_by, superseded_reason, last_confirmed_at,"
                      " mention_count FROM engine.companion_memories ORDER BY id").fetchall()


# --- listing --------------------------------------------------------------------------------------
def test_listing_shows_active_memories_only_by_default_with_provenance(api, world):
    status, body = api.call("GET", "/v1/memories")
    assert status == 200
    listed = {m["id"]: m for m in body["memories"]}
    assert set(listed) == {world.c, world.e, world.f, world.rel}
    assert all(set(m) == FIELDS for m in body["memories"])
    assert listed[world.c]["supersedes"] == [world.b] and listed[world.c]["superseded_at"] is None
    assert listed[world.e]["supersedes"] == [world.d]
    assert listed[world.e]["mention_count"] == 2 and listed[world.e]["last_confirmed_at"] is not None
    assert listed[world.f]["supersedes"] == [] and listed[world.f]["source"] == "dreaming"
    rel = listed[world.rel]
    assert (rel["layer"], rel["source"], rel["persona_id"], rel["session_id"]) == (
        "relationship", "utterance", "luna", world.session)
    assert rel["from_message_id"] == rel["through_message_id"] == world.rel_message


def test_include_superseded_lists_history_with_its_links(api, world):
    status, body = api.call("GET", "/v1/memories?include=superseded&layer=profile")
    assert status == 200
    listed = {m["id"]: m for m in body["memories"]}
    assert set(listed) == {world.a, world.b, world.c, world.d, world.e, world.f}
    a, b = listed[world.a], listed[world.b]
    assert (a["superseded_by"], a["superseded_reason"], a["supersedes"]) == (world.b, "changed", [])
    assert a["superseded_at"] is not None
    assert a["model"] == "anthropic/claude-haiku-4.5" and a["session_id"] == world.session
    assert (a["from_message_id"], a["through_message_id"]) == (1, 1)
    assert (b["superseded_by"], b["supersedes"], b["source"]) == (world.c, [world.a], "deep_pass")
    assert (listed[world.d]["superseded_by"], listed[world.d]["superseded_reason"]) == (world.e, "duplicate")
    # Newest first, as without history.
    assert ids(body["memories"]) == [world.e, world.d, world.c, world.b, world.a, world.f]


@pytest.mark.parametrize("include", [False, True])
def test_pages_through_the_before_cursor(api, world, include):
    query = "include=superseded&" if include else ""
    _, whole = api.call("GET", f"/v1/memories?{query}limit=500")
    pages, before = [], None
    while True:
        status, page = api.call("GET", f"/v1/memories?{query}limit=2" + (f"&before={before}" if before else ""))
        assert status == 200 and len(page["memories"]) <= 2
        pages += ids(page["memories"])
        before = page["next_before"]
        if before is None:
            break
    assert pages == ids(whole["memories"]) and len(pages) == (7 if include else 4)


@pytest.mark.parametrize("include", [False, True])
def test_a_page_goes_on_after_its_cursor_memory_is_deleted(api, db, world, include):
    """A client deleting what it reads (the last memory of a page among them) still gets every other memory."""
    query = "include=superseded&" if include else ""
    _, whole = api.call("GET", f"/v1/memories?{query}limit=500")
    seen, deleted, before = [], [], None
    while True:
        status, page = api.call("GET", f"/v1/memories?{query}limit=2" + (f"&before={before}" if before else ""))
        assert status == 200, page
        seen += ids(page["memories"])
        if page["memories"]:
            last = page["memories"][-1]["id"]
            assert api.call("DELETE", f"/v1/memories/{last}")[0] == 204
            deleted.append(last)
        before = page["next_before"]
        if before is None:
            break
    assert seen == ids(whole["memories"]) and len(deleted) == (4 if include else 2)


def test_an_older_clients_memory_id_cursor_still_pages_while_the_memory_exists(api, world):
    _, whole = api.call("GET", "/v1/memories?limit=500")
    first = ids(whole["memories"])
    status, page = api.call("GET", f"/v1/memories?limit=2&before={first[1]}")
    assert status == 200 and ids(page["memories"]) == first[2:4]
    assert api.call("DELETE", f"/v1/memories/{first[1]}")[0] == 204
    status, body = api.call("GET", f"/v1/memories?limit=2&before={first[1]}")
    assert status == 422 and "before" in body["message"] and "next_before" in body["message"]


@pytest.mark.parametrize("cursor", [
    "nope", "e30", "W10", "WyJ4IiwieSJd",  # not base64 JSON, {}, [], ["x", "y"]
    "WyIyMDI2LTAxLTAxVDAwOjAwOjAwIiwiMDAwMDAwMDAtMDAwMC0wMDAwLTAwMDAtMDAwMDAwMDAwMDAwIl0",  # no time zone
    "%00", "a" * 201, "WyIyMDI2LTAxLTAxVDAwOjAwOjAwKzAwOjAwIiw",  # cut short
])
def test_a_malformed_memory_cursor_is_422(api, world, cursor):
    status, body = api.call("GET", f"/v1/memories?before={cursor}")
    assert status == 422 and "before" in body["message"], body


def test_listing_and_history_statements_use_the_indexes(db, world):
    """With realistic statistics (many users, some history), the page is read through the listing index,
    a history through the chain index and ``supersedes`` through the successor index: no per-row scan of a
    user's rows."""
    from eros.store import memories as memory_store

    db.execute("INSERT INTO engine.companion_memories (user_id, content, embedding, category, created_at)"
               " SELECT 'user' || (g %% 100), 'memory ' || g, %s, 'fact', now() - make_interval(secs => g)"
               " FROM generate_series(1, 5000) g", (Vector(hash_embed("filler")),))
    db.execute("UPDATE engine.companion_memories o SET superseded_at = now(), superseded_reason = 'changed',"
               " superseded_by = (SELECT n.id FROM engine.companion_memories n WHERE n.user_id = o.user_id"
               "                  AND n.content = 'memory ' || (substr(o.content, 8)::int - 100))"
               " WHERE o.content ~ '^memory [0-9]+$' AND substr(o.content, 8)::int % 3 = 0"
               " AND substr(o.content, 8)::int > 100")
    # VACUUM too: the tests empty the tables with DELETE, so pages of earlier tests' rows may still count.
    db.execute("VACUUM ANALYZE engine.companion_memories")

    def plan(statement: str, params: dict) -> str:
        return "\n".join(r["QUERY PLAN"] for r in db.execute("EXPLAIN " + statement, params).fetchall())

    cursor = db.execute("SELECT created_at, id FROM engine.companion_memories WHERE user_id = 'user7'"
                        " ORDER BY created_at DESC, id DESC OFFSET 10 LIMIT 1").fetchone()
    for statement in (memory_store._LIST_ACTIVE, memory_store._LIST_ALL):
        for before_at, before_id in [(None, None), (cursor["created_at"], cursor["id"])]:
            listing = plan(statement, {"user": "user7", "layer": None, "category": None, "source": None, "limit": 100,
                                       "before_at": before_at, "before_id": before_id})
            assert "companion_memories_user_listing_idx" in listing, listing
            assert "companion_memories_superseded_by_idx" in listing, listing
            assert "Seq Scan on companion_memories" not in listing, listing
    # The walk of a chain of a user with many rows (user7: 50, some superseded): for alice's handful of rows a
    # scan of her rows is as cheap as the index, so which one the planner picked depended on earlier tests.
    successor = db.execute("SELECT id FROM engine.companion_memories m WHERE user_id = 'user7' AND EXISTS"
                           " (SELECT 1 FROM engine.companion_memories p WHERE p.superseded_by = m.id)"
                           " LIMIT 1").fetchone()["id"]
    history = plan(memory_store._HISTORY, {"id": successor, "user": "user7"})
    assert "companion_memories_chain_idx" in history, history  # the chain's rows, by its name
    assert "companion_memories_superseded_by_idx" in history, history  # each version's ``supersedes``
    assert "Seq Scan on companion_memories" not in history, history


# --- one memory and its history -------------------------------------------------------------------
@pytest.mark.parametrize("member", ["a", "b", "c"])
def test_the_whole_chain_from_any_member_oldest_first(api, world, member):
    memory_id = getattr(world, member)
    status, body = api.call("GET", f"/v1/memories/{memory_id}")
    assert status == 200
    assert body["id"] == memory_id and set(body) == FIELDS | {"history"}
    assert ids(body["history"]) == [world.a, world.b, world.c]
    assert all(set(m) == FIELDS for m in body["history"])
    assert [m["superseded_by"] for m in body["history"]] == [world.b, world.c, None]
    assert {k: v for k, v in body.items() if k != "history"} == body["history"][[world.a, world.b, world.c].index(
        memory_id)]


def test_history_of_a_duplicate_and_of_a_stable_fact(api, world):
    assert ids(api.call("GET", f"/v1/memories/{world.d}")[1]["history"]) == [world.d, world.e]
    assert ids(api.call("GET", f"/v1/memories/{world.e}")[1]["history"]) == [world.d, world.e]
    assert ids(api.call("GET", f"/v1/memories/{world.f}")[1]["history"]) == [world.f]
    status, rel = api.call("GET", f"/v1/memories/{world.rel}")
    assert status == 200 and ids(rel["history"]) == [world.rel] and rel["layer"] == "relationship"


def test_a_merge_makes_one_fact_whose_history_every_copy_shows(api, db, world):
    # Two copies merged into one are versions of one fact (one version chain, migration 0017): the survivor's
    # history holds both, and so does each copy's (with its sibling, which is a version of the same fact).
    one = insert(db, "alice", "runs on Sundays", days_ago=7)
    two = insert(db, "alice", "runs every Sunday", days_ago=6)
    merged = insert(db, "alice", "goes running on Sundays", days_ago=5)
    supersede(db, one, merged, "duplicate")
    supersede(db, two, merged, "duplicate")
    status, body = api.call("GET", f"/v1/memories/{merged}")
    assert status == 200 and ids(body["history"]) == [one, two, merged] and body["supersedes"] == [one, two]
    assert ids(api.call("GET", f"/v1/memories/{one}")[1]["history"]) == [one, two, merged]


def test_a_cycle_in_the_links_does_not_hang(api, db, world):
    p = insert(db, "alice", "plays the violin", days_ago=3)
    q = insert(db, "alice", "plays the viola", days_ago=2)
    supersede(db, p, q)
    supersede(db, q, p)
    started = time.monotonic()
    status, body = api.call("GET", f"/v1/memories/{p}")
    assert status == 200 and ids(body["history"]) == [p, q]
    assert time.monotonic() - started < 5


def test_a_long_chain_is_read_whole_from_its_name_not_walked(api, db, world):
    # History reads the chain by its name (no walk of links that a cap would have to cut): 120 versions, from
    # either end, are all there.
    chain = [insert(db, "alice", f"version {i}", days_ago=100 - i / 10) for i in range(120)]
    for old, new in zip(chain, chain[1:], strict=False):
        supersede(db, old, new)
    for end in (chain[0], chain[-1]):
        status, body = api.call("GET", f"/v1/memories/{end}")
        assert status == 200 and ids(body["history"]) == chain


# --- restore --------------------------------------------------------------------------------------
def active_ids(api, user: str = "alice") -> set[str]:
    return set(ids(api.call("GET", "/v1/memories", user=user)[1]["memories"]))


def due_for_deep_pass(db, user: str) -> bool:
    return db.execute("SELECT 1 FROM engine.user_deep_pass WHERE user_id = %s", (user,)).fetchone() is not None


def test_restore_undoes_a_change_and_retires_the_version_that_replaced_it(api, db, world):
    status, body = api.call("POST", f"/v1/memories/{world.b}/restore")
    assert status == 200, body
    assert body["id"] == world.b and body["superseded_at"] is None and body["superseded_by"] is None
    assert body["superseded_reason"] is None and body["last_confirmed_at"] is not None
    assert body["supersedes"] == [world.a, world.c]
    c = body["history"][ids(body["history"]).index(world.c)]
    assert (c["superseded_by"], c["superseded_reason"]) == (world.b, "reverted") and c["superseded_at"] is not None
    assert ids(body["history"]) == [world.a, world.b, world.c]
    assert active_ids(api) == {world.b, world.e, world.f, world.rel}
    a = api.call("GET", f"/v1/memories/{world.a}")[1]
    assert (a["superseded_by"], a["superseded_reason"]) == (world.b, "changed")
    assert due_for_deep_pass(db, "alice") and not due_for_deep_pass(db, "bob")


def test_restoring_twice_is_409_and_changes_nothing(api, db, world):
    assert api.call("POST", f"/v1/memories/{world.b}/restore")[0] == 200
    before = snapshot(db)
    status, body = api.call("POST", f"/v1/memories/{world.b}/restore")
    assert status == 409 and "active" in body["message"] and "nothing to restore" in body["message"]
    assert snapshot(db) == before


def test_restoring_the_oldest_version_retires_the_current_one_not_the_middle(api, world):
    # A -> B -> C: B is already history; the current version of the fact is C, and it is C that the
    # restored A replaces (otherwise Berlin and Tokyo would both be active).
    status, body = api.call("POST", f"/v1/memories/{world.a}/restore")
    assert status == 200 and body["superseded_at"] is None and body["supersedes"] == [world.c]
    chain = {m["id"]: m for m in body["history"]}
    assert set(chain) == {world.a, world.b, world.c}
    assert (chain[world.b]["superseded_by"], chain[world.b]["superseded_reason"]) == (world.c, "changed")
    assert (chain[world.c]["superseded_by"], chain[world.c]["superseded_reason"]) == (world.a, "reverted")
    assert active_ids(api) == {world.a, world.e, world.f, world.rel}


def test_restoring_a_duplicate_only_reactivates_it(api, world):
    _, e_before = api.call("GET", f"/v1/memories/{world.e}")
    status, body = api.call("POST", f"/v1/memories/{world.d}/restore")
    assert status == 200 and body["superseded_at"] is None and body["supersedes"] == []
    assert active_ids(api) == {world.c, world.d, world.e, world.f, world.rel}
    _, e_after = api.call("GET", f"/v1/memories/{world.e}")
    assert e_after["superseded_at"] is None and e_after["supersedes"] == []
    assert e_after["mention_count"] == e_before["mention_count"]


def test_restoring_an_active_memory_is_409(api, db, world):
    before = snapshot(db)
    for memory_id in (world.c, world.f, world.rel):
        status, body = api.call("POST", f"/v1/memories/{memory_id}/restore")
        assert status == 409 and memory_id in body["message"] and "active" in body["message"]
    assert snapshot(db) == before


def containers(n: int) -> list[Api]:
    """n Lambda containers of the chat function, as the local stack makes them: each its own copy of
    functions/chat/app.py whose resolver keeps the request it is handling in its own state, so
    concurrent requests (which AWS gives to different containers) do not share one."""
    from eros_dev.lambda_runtime import load_function, own_resolver_state

    apis = []
    for i in range(n):
        module = load_function("chat", copy=f"history_container_{i}")
        own_resolver_state(module)
        api = Api()
        api.function = module
        apis.append(api)
    return apis


def queued_on_a_held_row(db, database_url: str, row_id, requests: list, what: str) -> None:
    """Run ``requests`` (callables), each in a thread of its own, while another connection holds the memory
    row ``row_id`` FOR UPDATE; let the row go only once every one of them waits on a lock, then wait for them
    all. The waits are polled from ``db``: inside the holder's transaction pg_stat_activity is a snapshot
    frozen at its first read."""
    from eros import db as eros_db
    from eros.db import connect

    def run(request):
        try:
            request()
        finally:
            eros_db.reset()  # this thread's connection

    with connect(database_url) as holder, holder.transaction():
        holder.execute("SELECT 1 FROM engine.companion_memories WHERE id = %s FOR UPDATE", (row_id,))
        threads = [threading.Thread(target=run, args=(request,)) for request in requests]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 20
        while db.execute("SELECT count(*) AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                         " AND datname = current_database()").fetchone()["n"] < len(requests):
            assert time.monotonic() < deadline, f"{what} never queued"
            time.sleep(0.05)
    for thread in threads:
        thread.join(30)


def test_concurrent_restores_of_one_memory_one_wins(api, db, database_url, world):
    results: list[int] = []
    # Hold the row so that both requests are inside their transaction, waiting (for the row or for the
    # user's restore lock), before either reads it: without the locks and the re-check, both would find
    # it superseded and both "restore".
    queued_on_a_held_row(db, database_url, world.b, [
        lambda c=c: results.append(c.call("POST", f"/v1/memories/{world.b}/restore")[0]) for c in containers(2)],
        "the two restores")
    assert sorted(results) == [200, 409]
    assert active_ids(api) == {world.b, world.e, world.f, world.rel}
    c = api.call("GET", f"/v1/memories/{world.c}")[1]
    assert (c["superseded_by"], c["superseded_reason"]) == (world.b, "reverted")


def test_concurrent_restores_of_two_versions_leave_one_active(api, db, database_url, world):
    # A -> B -> C; "restore A" and "restore B" at once. Each alone would retire C; together, each must see
    # the other's outcome, or both A and B end up active.
    results: dict[str, int] = {}

    def restore(container: Api, memory_id: str):
        results[memory_id] = container.call("POST", f"/v1/memories/{memory_id}/restore")[0]

    queued_on_a_held_row(db, database_url, world.c, [
        lambda c=c, m=m: restore(c, m) for c, m in zip(containers(2), (world.a, world.b), strict=True)],
        "the two restores")
    assert results == {world.a: 200, world.b: 200}
    active = active_ids(api) & {world.a, world.b, world.c}
    assert len(active) == 1 and active <= {world.a, world.b}, active


def test_restoring_the_retired_version_again_swaps_back(api, world):
    assert api.call("POST", f"/v1/memories/{world.b}/restore")[0] == 200  # C retired: 'reverted' by B
    status, body = api.call("POST", f"/v1/memories/{world.c}/restore")  # "no, Tokyo after all"
    assert status == 200 and body["superseded_at"] is None
    b = body["history"][ids(body["history"]).index(world.b)]
    assert (b["superseded_by"], b["superseded_reason"]) == (world.c, "reverted")
    assert active_ids(api) == {world.c, world.e, world.f, world.rel}


# --- deletion -------------------------------------------------------------------------------------
def test_deleting_a_successor_leaves_its_predecessor_history_not_current(api, db, world):
    assert api.call("DELETE", f"/v1/memories/{world.c}") == (204, None)
    status, b = api.call("GET", f"/v1/memories/{world.b}")
    assert status == 200
    assert b["superseded_at"] is not None and b["superseded_by"] is None and b["superseded_reason"] == "changed"
    assert ids(b["history"]) == [world.a, world.b]
    assert active_ids(api) == {world.e, world.f, world.rel}
    # The user can still bring it back: nothing to retire, it is simply active again.
    status, restored = api.call("POST", f"/v1/memories/{world.b}/restore")
    assert status == 200 and restored["superseded_at"] is None
    assert active_ids(api) == {world.b, world.e, world.f, world.rel}
    assert api.call("GET", f"/v1/memories/{world.c}")[0] == 404


# --- isolation and bad input ----------------------------------------------------------------------
def test_another_users_ids_are_404_everywhere_and_change_nothing(api, db, world):
    before = snapshot(db)
    for memory_id in (world.a, world.b, world.c, world.rel):
        assert api.call("GET", f"/v1/memories/{memory_id}", user="bob") == (
            404, {"statusCode": 404, "code": "not_found", "message": "memory not found"})
        assert api.call("POST", f"/v1/memories/{memory_id}/restore", user="bob")[0] == 404
        assert api.call("DELETE", f"/v1/memories/{memory_id}", user="bob")[0] == 404
    for memory_id in (world.x, world.y):
        assert api.call("GET", f"/v1/memories/{memory_id}", user="alice")[0] == 404
        assert api.call("POST", f"/v1/memories/{memory_id}/restore", user="alice")[0] == 404
    assert snapshot(db) == before
    assert not due_for_deep_pass(db, "alice") and not due_for_deep_pass(db, "bob")
    # bob's listing and history hold his rows only, even where a link pointed elsewhere.
    _, bobs = api.call("GET", "/v1/memories?include=superseded", user="bob")
    assert set(ids(bobs["memories"])) == {world.x, world.y}
    db.execute("UPDATE engine.companion_memories SET superseded_at = now(), superseded_by = %s,"
               " superseded_reason = 'changed' WHERE id = %s", (world.y, world.f))  # a forged cross-user link
    _, y = api.call("GET", f"/v1/memories/{world.y}", user="bob")
    assert y["supersedes"] == [world.x] and ids(y["history"]) == [world.x, world.y]
    _, f = api.call("GET", f"/v1/memories/{world.f}", user="alice")
    assert ids(f["history"]) == [world.f]


@pytest.mark.parametrize("method,path,names", [
    ("GET", "/v1/memories/not-a-uuid", "memory_id"),
    ("POST", "/v1/memories/not-a-uuid/restore", "memory_id"),
    ("GET", "/v1/memories/'; DROP TABLE engine.companion_memories; --", "memory_id"),
    ("GET", "/v1/memories?include=everything", "include"),
    ("GET", "/v1/memories?include=", "include"),
])
def test_bad_input_is_422_naming_the_problem(api, db, world, method, path, names):
    before = snapshot(db)
    status, body = api.call(method, path)
    assert status == 422 and body["message"].startswith("invalid request") and names in body["message"]
    assert snapshot(db) == before


def test_unknown_ids_are_404(api, db, world):
    before = snapshot(db)
    unknown = uuid.uuid4()
    assert api.call("GET", f"/v1/memories/{unknown}") == (
        404, {"statusCode": 404, "code": "not_found", "message": "memory not found"})
    assert api.call("POST", f"/v1/memories/{unknown}/restore")[0] == 404
    assert snapshot(db) == before


def test_no_token_is_401(api, db, world):
    before = snapshot(db)
    for method, path in [("GET", "/v1/memories?include=superseded"), ("GET", f"/v1/memories/{world.a}"),
                         ("POST", f"/v1/memories/{world.a}/restore")]:
        status, body = api.call(method, path, user=None)
        assert status == 401 and "token" in body["message"], (method, path)
    assert snapshot(db) == before


# --- recall ---------------------------------------------------------------------------------------
def test_recall_skips_superseded_rows_and_brings_a_restored_one_back(api, world):
    from eros.recall import recall

    def recalled() -> set[str]:
        return {str(m["id"]) for m in recall("alice", None, hash_embed("where does she live: Berlin?")).profile}

    assert world.c in recalled() and not {world.a, world.b} & recalled()
    assert api.call("POST", f"/v1/memories/{world.a}/restore")[0] == 200
    assert world.a in recalled() and not {world.b, world.c} & recalled()


# --- the documented API ---------------------------------------------------------------------------
def test_openapi_documents_history_restore_and_include(api):
    status, doc = api.call("GET", "/v1/openapi.json", user=None)
    assert status == 200
    listing = doc["paths"]["/v1/memories"]["get"]
    include = next(p for p in listing["parameters"] if p["name"] == "include")
    assert include["in"] == "query" and "superseded" in str(include["schema"])
    one = doc["paths"]["/v1/memories/{memory_id}"]
    assert {"get", "delete"} <= set(one) and "404" in {str(code) for code in one["get"]["responses"]}
    restore = doc["paths"]["/v1/memories/{memory_id}/restore"]["post"]
    assert {"200", "404", "409", "422"} <= {str(code) for code in restore["responses"]}
    schemas = doc["components"]["schemas"]
    assert {"history"} <= set(schemas["MemoryWithHistory"]["properties"])
    assert set(schemas["Memory"]["properties"]) >= FIELDS
