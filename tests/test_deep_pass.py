"""The deep pass (issue 7 §3): per-user consolidation across sessions, against the real SQL, the real
extract handler, the fake OpenRouter server (scripted answers, counted calls) and the offline stand-in.

* The claim: due, quiet and free-or-stale users only; concurrent claimers take each user exactly once;
  a stale claim is re-claimed and the stale worker's late write is refused by the token.
* The pass: five copies of a fact become one active row (mention count 5) and four history rows; a
  changed fact supersedes; unrelated rows and other users' rows are never touched; a user with no
  cluster costs no provider call; duplicate deliveries write nothing.
* Hostile answers: unknown handles, another cluster's handle, self-references, raw ids, "supersede
  everything" beyond the cap, garbage text. Provider outages are not stamped; attempts are capped.
* The sweep claims due users after the sessions and invokes the extract function with a deep-pass
  payload (in process, and through moto's Lambda); the handler dispatches on the event's kind.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from uuid import UUID

import pytest
from fakes import Status
from helpers import EVENTS, emitted_metrics, extract, tick, utcnow
from moto_lambda import FUNCTION
from pgvector import Vector
from pydantic import ValidationError

from eros import dreaming
from eros.config import settings
from eros.dreaming import deep_pass, jobs
from eros.providers.offline import hash_embed
from eros.store import consolidation
from eros.store import deep_pass as store
from eros.store.rows import UserClaim
from eros_dev.dreaming import InProcessInvoker, sweep_locally

# --- helpers ------------------------------------------------------------------------------------------

def memory(db, user: str, content: str, *, days_ago: float = 0, category: str = "fact", importance: float = 0.5,
           mentions: int = 1, layer_instance=None) -> UUID:
    """A profile row (or, with ``layer_instance``, a relationship row) with the offline embedder's vector."""
    return db.execute(
        "INSERT INTO engine.companion_memories (user_id, instance_id, content, embedding, category, importance,"
        " mention_count, source, created_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, now() - make_interval(days => %s))"
        " RETURNING id",
        (user, layer_instance, content, Vector(hash_embed(content)), None if layer_instance else category,
         importance, mentions, "utterance" if layer_instance else "dreaming", days_ago),
    ).fetchone()["id"]


def copies(db, user: str, content: str, n: int, *, first_day: int = 10) -> list[UUID]:
    """n copies of one statement, a day apart, oldest first."""
    return [memory(db, user, content, days_ago=first_day - i) for i in range(n)]


def due(db, user: str, *, changed_ago: timedelta = timedelta(hours=2), consolidated_at=None, claimed_at=None,
        attempts: int = 0) -> None:
    db.execute("INSERT INTO engine.user_deep_pass (user_id, changed_at, consolidated_at, claimed_at, attempts)"
               " VALUES (%s, now() - %s, %s, %s, %s)", (user, changed_ago, consolidated_at, claimed_at, attempts))


def claim_all(limit: int = 100, now: datetime | None = None) -> list[UserClaim]:
    cfg, now = settings(), now or utcnow()
    return store.claim_users(quiet_before=now - timedelta(seconds=cfg.deep_pass_quiet_secs),
                             stale_before=now - timedelta(seconds=cfg.deep_pass_claim_stale_secs), limit=limit, now=now)


def claim_one(db, user: str) -> datetime:
    """Claim whoever is due (as a sweep does) and return this user's claim token."""
    claim_all()
    token = state(db, user)["claimed_at"]
    assert token is not None, f"{user} was not claimed"
    return token


def run(user: str, token: datetime) -> jobs.JobResult:
    return deep_pass.run(settings(), user, token)


def rows(db, user: str) -> dict[UUID, dict]:
    return {r["id"]: r for r in db.execute(
        "SELECT id, content, superseded_at, superseded_by, superseded_reason, mention_count, last_confirmed_at,"
        " importance, metadata, created_at FROM engine.companion_memories WHERE user_id = %s AND instance_id IS NULL",
        (user,)).fetchall()}


def active(db, user: str) -> list[dict]:
    return sorted((r for r in rows(db, user).values() if r["superseded_at"] is None), key=lambda r: r["created_at"])


def state(db, user: str) -> dict:
    return db.execute("SELECT *, (consolidated_at IS NULL OR consolidated_at < changed_at) AS is_due"
                      " FROM engine.user_deep_pass WHERE user_id = %s", (user,)).fetchone()


def handle_of(request: dict, content: str) -> list[str]:
    """The handles under which the deep-pass prompt showed rows with this content."""
    prompt = request["messages"][1]["content"]
    return [line.split()[1] for line in prompt.splitlines() if line.startswith("- m") and line.endswith(f": {content}")]


@pytest.fixture
def llm(db, env, fake_llm):
    """The fake OpenRouter as the deep pass's model; each test scripts its answer."""
    env(LLM_BASE_URL=fake_llm.url, OPENROUTER_API_KEY="test-key", PROVIDER_MAX_RETRIES=0)
    fake_llm.responder = lambda body: json.dumps({"actions": []})
    return fake_llm


# --- the claim ----------------------------------------------------------------------------------------

def test_claim_takes_users_that_are_due_quiet_and_free_or_stale_oldest_change_first(db):
    now = utcnow()
    due(db, "due-quiet", changed_ago=timedelta(hours=3))
    due(db, "never-consolidated", changed_ago=timedelta(hours=5))
    due(db, "changed-since-pass", changed_ago=timedelta(hours=2), consolidated_at=now - timedelta(hours=4))
    due(db, "stale-claim", changed_ago=timedelta(hours=4), claimed_at=now - timedelta(minutes=30), attempts=1)
    due(db, "still-chatting", changed_ago=timedelta(minutes=5))  # not quiet yet (DEEP_PASS_QUIET_SECS 3600)
    due(db, "consolidated", changed_ago=timedelta(hours=2), consolidated_at=now - timedelta(hours=1))
    due(db, "claimed-now", changed_ago=timedelta(hours=2), claimed_at=now - timedelta(minutes=1), attempts=1)

    first = claim_all(limit=2, now=now)
    assert [r["user_id"] for r in first] in (["never-consolidated", "stale-claim"],
                                             ["stale-claim", "never-consolidated"])
    rest = claim_all(now=now)
    assert sorted(r["user_id"] for r in rest) == ["changed-since-pass", "due-quiet"]
    for row in first + rest:
        assert row["claim_token"] == now
        assert state(db, row["user_id"])["claimed_at"] == now
    # Taking a claim counts nothing; re-taking one that no worker started counts a retry (our backlog),
    # not one of the user's attempts (issue 8 item 3).
    assert (state(db, "stale-claim")["attempts"], state(db, "stale-claim")["retries"]) == (1, 1)
    assert (state(db, "due-quiet")["attempts"], state(db, "due-quiet")["retries"]) == (0, 0)
    assert claim_all(now=now) == []
    assert state(db, "claimed-now")["claimed_at"] == now - timedelta(minutes=1)


def test_concurrent_claimers_take_every_user_exactly_once(db):
    users = [f"user-{i:03d}" for i in range(300)]
    db.execute("INSERT INTO engine.user_deep_pass (user_id, changed_at)"
               " SELECT u, now() - interval '2 hours' FROM unnest(%s::text[]) AS u", (users,))
    start = threading.Barrier(8)

    def claimer(_) -> list[str]:
        start.wait()
        taken: list[str] = []
        while batch := claim_all(limit=7):  # each thread has its own database connection
            taken.extend(r["user_id"] for r in batch)
        return taken

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(claimer, range(8)))
    taken = [u for part in results for u in part]
    assert len(taken) == len(set(taken)) == 300 and set(taken) == set(users)
    assert sum(1 for part in results if part) > 1  # the claimers did run side by side
    assert db.execute("SELECT count(*) AS n FROM engine.user_deep_pass WHERE attempts = 0"
                      " AND claimed_at IS NOT NULL").fetchone()["n"] == 300


def test_a_stale_claim_is_reclaimed_and_the_stale_workers_late_write_is_refused(db, llm):
    ids = copies(db, "alice", "Lives in Shanghai", 3)
    due(db, "alice")
    stale_token = claim_all(now=utcnow() - timedelta(minutes=20))[0]["claim_token"]
    fresh: list[datetime] = []

    def reclaim_while_the_stale_worker_waits_for_its_model(body):
        # The stale worker's model call is slow: meanwhile a sweep finds its claim stale and re-claims.
        fresh.extend(r["claim_token"] for r in claim_all())
        return json.dumps({"actions": [{"keep": "m1", "duplicates": ["m2", "m3"]}]})

    llm.responder = reclaim_while_the_stale_worker_waits_for_its_model
    late = run("alice", stale_token)
    assert (late.outcome, late.llm_calls) == ("lost-claim", 1)  # paid, then refused by the guard
    assert len(fresh) == 1 and fresh[0] != stale_token
    assert len(active(db, "alice")) == 3  # the late write was refused: nothing merged, nothing stamped
    assert state(db, "alice")["claimed_at"] == fresh[0] and state(db, "alice")["consolidated_at"] is None

    llm.responder = lambda body: json.dumps({"actions": [{"keep": "m1", "duplicates": ["m2", "m3"]}]})
    done = run("alice", fresh[0])
    assert (done.outcome, done.merged) == ("consolidated", 2)
    assert [r["id"] for r in active(db, "alice")] == [ids[0]]
    assert run("alice", stale_token).outcome == "not-claimed" and llm.calls == 2


# --- the pass -----------------------------------------------------------------------------------------

def test_five_copies_become_one_active_row_confirmed_five_times_offline(db):
    """No keys: the offline stand-in answers the deep-pass prompt."""
    ids = copies(db, "alice", "Lives in Shanghai", 5)
    cat = memory(db, "alice", "Has a cat named Miso", days_ago=3, category="relation")
    bob = copies(db, "bob", "Lives in Shanghai", 2)
    due(db, "alice")
    token = claim_one(db, "alice")

    result = run("alice", token)
    assert (result.outcome, result.clusters, result.shown, result.merged, result.superseded, result.ignored,
            result.llm_calls) == ("consolidated", 1, 5, 4, 0, 0, 1)
    stored = rows(db, "alice")
    kept = stored[ids[0]]  # all mentioned once: the oldest is kept
    assert kept["superseded_at"] is None and kept["mention_count"] == 5 and kept["last_confirmed_at"] is not None
    for i in ids[1:]:
        assert stored[i]["superseded_by"] == ids[0] and stored[i]["superseded_reason"] == "duplicate"
        assert stored[i]["superseded_at"] is not None and stored[i]["metadata"]["superseded_in"] == "deep_pass"
    assert stored[cat]["superseded_at"] is None and stored[cat]["mention_count"] == 1  # unrelated: untouched
    assert [r["id"] for r in active(db, "bob")] == bob  # another user's copies: untouched
    after = state(db, "alice")
    assert after["claimed_at"] is None and after["attempts"] == 0 and not after["is_due"] and after["error"] is None
    assert claim_all() == []


def test_a_changed_fact_supersedes_the_old_one_offline(db, env):
    # The offline embedder scores by word overlap: "lives in X" vs "lives in Y" share half their words.
    env(DEEP_PASS_SIMILARITY=0.45)
    old = memory(db, "alice", "Lives in Shanghai", days_ago=40)
    twin = memory(db, "alice", "Lives in Shanghai", days_ago=30)
    new = memory(db, "alice", "Lives in Tokyo", days_ago=2)
    daughter = memory(db, "alice", "Has a daughter, Mia", days_ago=50, category="relation")
    school = memory(db, "alice", "Mia started school", days_ago=1, category="event")
    due(db, "alice")
    result = run("alice", claim_one(db, "alice"))
    assert (result.outcome, result.merged, result.superseded) == ("consolidated", 1, 1)
    stored = rows(db, "alice")
    assert (stored[twin]["superseded_by"], stored[twin]["superseded_reason"]) == (old, "duplicate")
    assert (stored[old]["superseded_by"], stored[old]["superseded_reason"]) == (new, "changed")
    assert stored[old]["mention_count"] == 2  # confirmed by its twin before it was replaced: history keeps it
    assert {r["id"] for r in active(db, "alice")} == {new, daughter, school}  # related but true: both stay


def test_the_model_sees_handles_never_ids_and_changes_apply_as_it_says(db, llm, env):
    env(DEEP_PASS_SIMILARITY=0.45)  # the offline embedder: the two job statements share half their words
    old = memory(db, "alice", "Works as a nurse at the city hospital", days_ago=90)
    new = memory(db, "alice", "Works as a teacher at the city school", days_ago=1)
    memory(db, "alice", "Likes mocha", days_ago=5)
    due(db, "alice")
    llm.responder = lambda body: json.dumps({"actions": [{"current": "m2", "supersedes": ["m1"]}]})
    result = run("alice", claim_one(db, "alice"))
    assert (result.outcome, result.superseded, result.shown, result.llm_calls) == ("consolidated", 1, 2, 1)
    [request] = llm.requests
    assert request["json"]["model"] == settings().extract_model
    assert request["json"]["messages"][0]["content"] == deep_pass.SYSTEM_PROMPT
    prompt = request["json"]["messages"][1]["content"]
    assert str(old) not in prompt and str(new) not in prompt and "Likes mocha" not in prompt
    assert handle_of(request["json"], "Works as a nurse at the city hospital") == ["m1"]  # oldest first
    stored = rows(db, "alice")
    assert (stored[old]["superseded_by"], stored[old]["superseded_reason"]) == (new, "changed")
    assert stored[new]["superseded_at"] is None and stored[new]["mention_count"] == 1


def test_a_user_without_a_cluster_costs_no_provider_call_and_is_stamped(db, llm):
    memory(db, "alice", "Lives in Shanghai", days_ago=3)
    memory(db, "alice", "Has a cat named Miso", days_ago=2)
    due(db, "alice")
    due(db, "nobody")  # no rows at all
    for user in ("alice", "nobody"):
        result = run(user, claim_one(db, user))
        assert (result.outcome, result.llm_calls, result.clusters) == ("nothing", 0, 0)
        assert not state(db, user)["is_due"] and state(db, user)["claimed_at"] is None
    assert llm.calls == 0


def test_relationship_rows_and_history_rows_are_never_clustered(db, llm):
    inst = db.execute("INSERT INTO engine.persona_instances (user_id, persona_id) VALUES ('alice', 'luna')"
                      " RETURNING id").fetchone()["id"]
    kept = memory(db, "alice", "Lives in Shanghai", days_ago=5)
    memory(db, "alice", "Lives in Shanghai", days_ago=4, layer_instance=inst)  # an utterance, same words
    gone = memory(db, "alice", "Lives in Shanghai", days_ago=3)
    db.execute("UPDATE engine.companion_memories SET superseded_at = now(), superseded_by = %s,"
               " superseded_reason = 'duplicate' WHERE id = %s", (kept, gone))
    due(db, "alice")
    assert run("alice", claim_one(db, "alice")).llm_calls == 0 and llm.calls == 0


def test_duplicate_deliveries_write_nothing(db, llm):
    ids = copies(db, "alice", "Lives in Shanghai", 3)
    due(db, "alice")
    token = claim_one(db, "alice")
    llm.responder = lambda body: json.dumps({"actions": [{"keep": "m3", "duplicates": ["m1", "m2"]}]})
    payload = deep_pass.event({"user_id": "alice", "claim_token": token})
    assert extract(payload)["merged"] == 2
    before = rows(db, "alice")
    again = extract(payload)
    assert (again["outcome"], again["llm_calls"]) == ("not-claimed", 0)
    assert rows(db, "alice") == before and llm.calls == 1
    assert [r["id"] for r in active(db, "alice")] == [ids[2]] and before[ids[2]]["mention_count"] == 3


def test_concurrent_duplicate_deliveries_apply_once_and_pay_one_call(db, llm):
    copies(db, "alice", "Lives in Shanghai", 4)
    due(db, "alice")
    token = claim_one(db, "alice")
    asked, release = threading.Event(), threading.Event()

    def answer(body):
        asked.set()  # the first delivery holds the lease and is in its model call
        assert release.wait(10)
        return json.dumps({"actions": [{"keep": "m1", "duplicates": ["m2", "m3", "m4"]}]})

    llm.responder = answer
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(run, "alice", token)
        try:
            assert asked.wait(10)
            duplicate = run("alice", token)  # returns before calling the model (issue 8 item 5)
        finally:
            release.set()
        results = [first.result(), duplicate]
    assert [(r.outcome, r.llm_calls) for r in results] == [("consolidated", 1), ("duplicate", 0)]
    assert sum(r.merged for r in results) == 3 and llm.calls == 1
    [kept] = active(db, "alice")
    assert kept["mention_count"] == 4


def test_a_change_committed_during_the_pass_makes_the_user_due_again(db, llm):
    copies(db, "alice", "Lives in Shanghai", 2)
    due(db, "alice")
    token = claim_one(db, "alice")

    def answer_while_a_session_writes(body):
        from eros.db import transaction

        with transaction() as conn:  # write-time dreaming commits a new row for alice meanwhile
            conn.execute("INSERT INTO engine.companion_memories (user_id, content, embedding, category)"
                         " VALUES ('alice', 'Adopted a dog', %s, 'event')", (Vector(hash_embed("Adopted a dog")),))
            consolidation.mark_changed(conn, "alice")
        return json.dumps({"actions": [{"keep": "m1", "duplicates": ["m2"]}]})

    llm.responder = answer_while_a_session_writes
    assert run("alice", token).merged == 1
    after = state(db, "alice")
    assert after["is_due"] and after["claimed_at"] is None and after["consolidated_at"] is not None


# --- hostile and confused answers ---------------------------------------------------------------------------

@pytest.fixture
def two_clusters(db, llm):
    """alice: three copies of one fact, two of another, one unrelated row; bob: the same three copies."""
    a = copies(db, "alice", "Lives in Shanghai", 3, first_day=30)
    b = copies(db, "alice", "Has a cat named Miso", 2, first_day=20)
    lone = memory(db, "alice", "Likes mocha", days_ago=1)
    bob = copies(db, "bob", "Lives in Shanghai", 3, first_day=30)
    due(db, "alice")
    due(db, "bob")
    return {"a": a, "b": b, "lone": lone, "bob": bob, "token": claim_one(db, "alice")}


def answer_with(llm, answer) -> None:
    llm.responder = lambda body: answer if isinstance(answer, str) else json.dumps(answer)


def test_unknown_handles_ids_and_self_references_are_ignored_and_counted(db, llm, two_clusters):
    c = two_clusters
    answer_with(llm, {"actions": [
        {"keep": "m1", "duplicates": ["m99", "m1", str(c["a"][1]), "m2", "m2", 7, "zzz"]},
        {"keep": "m42", "duplicates": ["m4"]},  # a survivor that was never shown: the whole action goes
        {"current": str(c["b"][0]), "supersedes": ["m5"]},
        {"forget": "m3"},  # not an action: skipped
    ]})
    result = run("alice", c["token"])
    # m1 keeps m2; ignored: m99, m1 (self), the raw id, the second m2, 7, zzz, m4 (no survivor), m5 (raw-id survivor)
    assert (result.outcome, result.merged, result.superseded, result.ignored) == ("consolidated", 1, 0, 8)
    stored = rows(db, "alice")
    assert stored[c["a"][1]]["superseded_by"] == c["a"][0]
    assert {r["id"] for r in active(db, "alice")} == {c["a"][0], c["a"][2], *c["b"], c["lone"]}


def test_another_clusters_handle_is_ignored(db, llm, two_clusters):
    c = two_clusters
    answer_with(llm, {"actions": [{"keep": "m1", "duplicates": ["m4", "m5"]}, {"current": "m4", "supersedes": ["m2"]}]})
    result = run("alice", c["token"])
    assert (result.merged, result.superseded, result.ignored) == (0, 0, 3)
    assert len(active(db, "alice")) == 6


def test_supersede_everything_is_bounded_and_leaves_every_cluster_a_row(db, llm, env):
    env(DEEP_PASS_MAX_SUPERSESSIONS=20)
    ids = [memory(db, "alice", f"Enjoys hiking in the hills, trip {i}", days_ago=60 - i) for i in range(30)]
    due(db, "alice")
    token = claim_one(db, "alice")
    handles = [f"m{i}" for i in range(1, 31)]
    answer_with(llm, {"actions": [{"current": h, "supersedes": handles} for h in handles]
                      + [{"keep": h, "duplicates": handles} for h in handles]})
    result = run("alice", token)
    assert result.shown == 30 and result.clusters == 1
    assert result.superseded == 20 and result.merged == 0  # the cap, however much was asked
    assert len(active(db, "alice")) == 10
    assert result.ignored == 30 * 30 * 2 - 20
    assert {r["id"] for r in active(db, "alice")} <= set(ids)


def test_a_chain_of_actions_never_supersedes_a_whole_cluster(db, llm, two_clusters):
    c = two_clusters
    answer_with(llm, {"actions": [{"current": "m1", "supersedes": ["m2"]}, {"current": "m2", "supersedes": ["m1"]},
                                  {"current": "m3", "supersedes": ["m1"]}, {"current": "m1", "supersedes": ["m3"]}]})
    result = run("alice", c["token"])
    assert (result.superseded, result.ignored) == (2, 2)  # m2 -> m1, then m1 -> m3; the cycles are refused
    assert [r["id"] for r in active(db, "alice") if r["content"] == "Lives in Shanghai"] == [c["a"][2]]


@pytest.mark.parametrize("garbage", ["I'm sorry, I can't help with that.", "", "{\"actions\": \"all\"}[",
                                     "```json\n{not json}\n```"])
def test_garbage_is_stamped_with_the_reason_and_changes_nothing(db, llm, two_clusters, garbage):
    answer_with(llm, garbage)
    before = rows(db, "alice")
    result = run("alice", two_clusters["token"])
    assert (result.outcome, result.llm_calls) == ("unparsable", 1)
    assert rows(db, "alice") == before
    after = state(db, "alice")
    assert not after["is_due"] and after["claimed_at"] is None and after["error"].startswith("unparsable")


def test_answers_in_fences_or_prose_are_read(db, llm, two_clusters):
    answer_with(llm, 'Sure! Here is the plan:\n```json\n{"actions": [{"KEEP": "M1", "duplicates": "m2"}]}\n```\nDone.')
    assert run("alice", two_clusters["token"]).merged == 1


def test_cross_user_isolation_whatever_the_model_names(db, llm, two_clusters):
    c = two_clusters
    everything = [f"m{i}" for i in range(1, 41)] + [str(i) for i in c["bob"]]
    answer_with(llm, {"actions": [{"keep": h, "duplicates": everything} for h in everything]})
    run("alice", c["token"])
    assert [r["id"] for r in active(db, "bob")] == c["bob"]
    assert all(r["mention_count"] == 1 for r in active(db, "bob"))
    assert state(db, "bob")["claimed_at"] is not None  # bob's own claim (taken with alice's) is left alone
    request = llm.requests[0]["json"]["messages"][1]["content"]
    assert request.count("Lives in Shanghai") == 3  # alice's three copies, none of bob's


# --- failures ------------------------------------------------------------------------------------------------

def test_provider_outage_is_backed_off_not_stamped_not_counted_and_the_retry_consolidates(db, llm, two_clusters):
    # Policy change (issue 8 item 3): no raise for Lambda's hot retries; the claim goes back with a backoff,
    # counted as a retry (the world's fault), never as one of the user's attempts.
    c = two_clusters
    answer_with(llm, {"actions": [{"keep": "m1", "duplicates": ["m2", "m3"]}]})
    llm.push(Status(503))
    result = extract(deep_pass.event({"user_id": "alice", "claim_token": c["token"]}))
    assert (result["outcome"], result["fault"]) == ("retry-later", "world")
    held = state(db, "alice")
    assert held["claimed_at"] is None and held["consolidated_at"] is None
    assert (held["attempts"], held["retries"]) == (0, 1) and "HTTP 503" in held["error"]
    assert held["next_attempt_at"] > utcnow()
    assert len(active(db, "alice")) == 6
    assert extract(deep_pass.event({"user_id": "alice", "claim_token": c["token"]}))["outcome"] == "not-claimed"
    assert claim_all(now=held["next_attempt_at"] - timedelta(seconds=1)) == []  # still backing off
    [again] = claim_all(now=held["next_attempt_at"])
    result = extract(deep_pass.event(again))
    assert (result["outcome"], result["merged"]) == ("consolidated", 2)
    done = state(db, "alice")
    assert done["error"] is None and done["retries"] == 0 and done["next_attempt_at"] is None


def test_a_bad_key_holds_the_deep_pass_counts_nothing_and_a_probe_resumes_it(db, llm, two_clusters):
    c = two_clusters
    answer_with(llm, {"actions": [{"keep": "m1", "duplicates": ["m2", "m3"]}]})
    llm.push(Status(402))  # no credit
    result = run("alice", c["token"])
    assert (result.outcome, result.fault) == ("blocked", "configuration")
    held = state(db, "alice")
    assert (held["attempts"], held["retries"], held["claimed_at"], held["consolidated_at"]) == (0, 0, None, None)
    [block] = db.execute("SELECT provider, status FROM engine.provider_blocks").fetchall()
    assert block == {"provider": "llm", "status": 402}
    cfg, now = settings(), utcnow()
    sent: list[dict] = []
    assert dreaming.sweep(cfg, sent.append, now=lambda: now).users_claimed == 0  # held: no probe due yet
    probe_at = now + timedelta(seconds=cfg.dreaming_config_probe_secs)
    result = dreaming.sweep(cfg, sent.append, now=lambda: probe_at)
    assert (result.users_claimed, result.budget) == (1, 1)  # one probe (alice or bob)
    assert extract(sent[0])["outcome"] == "consolidated"  # credit is back
    assert db.execute("SELECT count(*) AS n FROM engine.provider_blocks").fetchone()["n"] == 0
    assert dreaming.sweep(cfg, sent.append, now=lambda: probe_at).blocked is None  # no longer held


def test_the_users_own_failures_are_capped_the_worlds_are_not(db, llm, env):
    env(DEEP_PASS_MAX_ATTEMPTS=2)
    copies(db, "alice", "Lives in Shanghai", 2)
    due(db, "alice")
    llm.push(Status(400), Status(503), Status(503), Status(400))  # 400: this prompt's fault; 503: the world's
    for n, expected in enumerate(["retry-later"] * 3 + ["gave-up"], 1):  # each claimed after the backoff
        token = claim_all(now=utcnow() + timedelta(hours=2 * n))[0]["claim_token"]
        assert run("alice", token).outcome == expected
        if expected == "retry-later":
            assert state(db, "alice")["consolidated_at"] is None and state(db, "alice")["attempts"] == 1
    given_up = state(db, "alice")
    assert not given_up["is_due"] and given_up["attempts"] == 0 and "gave up after 2 attempts" in given_up["error"]
    assert len(active(db, "alice")) == 2 and llm.calls == 4


def test_a_claim_beyond_the_attempts_cap_gives_up_without_a_model_call(db, llm, env):
    env(DEEP_PASS_MAX_ATTEMPTS=2)
    copies(db, "alice", "Lives in Shanghai", 2)
    due(db, "alice", attempts=2, claimed_at=utcnow() - timedelta(hours=1))  # two workers died mid-pass
    token = claim_one(db, "alice")
    assert run("alice", token).outcome == "gave-up" and llm.calls == 0
    assert not state(db, "alice")["is_due"]


# --- the sweep and the handler ---------------------------------------------------------------------------------

def test_sweep_claims_due_users_after_sessions_and_runs_their_pass_in_process(db, env):
    env(DEEP_PASS_TICK_CAP=2, DREAMING_BATCH_SIZE=1)
    for user in ("alice", "bob", "carol"):
        copies(db, user, "Lives in Shanghai", 3)
        due(db, user)
    invoker = InProcessInvoker()
    result = dreaming.sweep(settings(), invoker)
    invoker.wait()
    assert (result.claimed, result.users_claimed, result.deep_pass_invoked, result.deep_pass_invoke_failures) == (
        0, 2, 2, 0)
    assert sorted(u for u in ("alice", "bob", "carol") if len(active(db, u)) == 1) == ["alice", "bob"]
    assert sweep_locally()["users_claimed"] == 1  # the tick cap left carol for the next tick
    assert len(active(db, "carol")) == 1 and active(db, "carol")[0]["mention_count"] == 3
    assert sweep_locally()["users_claimed"] == 0


def test_no_user_is_claimed_when_the_sessions_part_of_the_tick_failed_or_ran_out_of_time(db, env):
    copies(db, "alice", "Lives in Shanghai", 2)
    due(db, "alice")
    inst = db.execute("INSERT INTO engine.persona_instances (user_id, persona_id) VALUES ('bob', 'luna')"
                      " RETURNING id").fetchone()["id"]
    db.execute("INSERT INTO engine.chat_sessions (user_id, instance_id, last_active_at)"
               " VALUES ('bob', %s, now() - interval '2 hours')", (inst,))

    def throttled(payload):
        raise RuntimeError("Rate exceeded")

    result = dreaming.sweep(settings(), throttled)
    assert (result.stopped_by, result.users_claimed) == ("invoke failures", 0)
    result = dreaming.sweep(settings(), lambda payload: None, time_budget_secs=-1)
    assert (result.stopped_by, result.claimed, result.users_claimed) == ("time budget", 0, 0)
    assert state(db, "alice")["claimed_at"] is None
    sent = []
    result = dreaming.sweep(settings(), sent.append)
    assert (result.claimed, result.users_claimed) == (1, 1)
    assert [p.get("kind") for p in sent] == [None, "deep_pass"]  # sessions first, then users


def test_sweep_invokes_deep_pass_payloads_through_lambda_and_releases_failed_ones(aws, db, capsys):
    copies(db, "alice", "Lives in Shanghai", 2)
    copies(db, "bob", "Lives in Shanghai", 2)
    due(db, "alice", changed_ago=timedelta(hours=3))
    due(db, "bob", changed_ago=timedelta(hours=2))
    aws.fail = lambda payload: payload["user_id"] == "bob"
    capsys.readouterr()
    result = tick()
    assert (result["users_claimed"], result["deep_pass_invoked"], result["deep_pass_invoke_failures"]) == (2, 1, 1)
    found = emitted_metrics(capsys.readouterr().out)
    assert (found["UsersClaimed"], found["DeepPassInvoked"], found["DeepPassInvokeFailures"]) == (2, 1, 1)
    [call] = aws.calls
    assert (call["function"], call["type"], call["status"]) == (FUNCTION, "Event", 202)
    sent = call["received"]
    assert sent == {"kind": "deep_pass", "user_id": "alice", "claim_token": sent["claim_token"]}
    assert datetime.fromisoformat(sent["claim_token"]) == state(db, "alice")["claimed_at"]
    assert state(db, "bob")["claimed_at"] is None and state(db, "bob")["attempts"] == 0  # released
    # What moto's Lambda received is what the extract function runs on.
    assert extract(sent)["merged"] == 1 and len(active(db, "alice")) == 1
    aws.fail = None
    assert tick()["deep_pass_invoked"] == 1 and aws.calls[-1]["received"]["user_id"] == "bob"


def test_the_sample_deep_pass_event_is_what_the_sweeper_sends(db):
    sample = json.loads((EVENTS / "extract_deep_pass.json").read_text())
    sent = deep_pass.event({"user_id": sample["user_id"],
                              "claim_token": datetime.fromisoformat(sample["claim_token"])})
    assert sent == sample


def test_the_extract_handler_dispatches_on_the_events_kind(db):
    session_sample = json.loads((EVENTS / "extract_session.json").read_text())
    as_session = extract(session_sample)  # no kind: a session extraction, as the sweeper has always sent
    assert (as_session["session_id"], as_session["outcome"]) == (session_sample["session_id"], "not-claimed")
    assert as_session["kind"] == "session"  # dispatched to the session's extraction, not a deep pass
    assert extract(session_sample | {"kind": "session"})["session_id"] == session_sample["session_id"]
    copies(db, "alice", "Lives in Shanghai", 2)
    due(db, "alice")
    token = claim_one(db, "alice")
    result = extract({"kind": "deep_pass", "user_id": "alice", "claim_token": token.isoformat()})
    assert (result["kind"], result["user_id"], result["outcome"], result["merged"]) == (
        "deep_pass", "alice", "consolidated", 1)


@pytest.mark.parametrize("bad", [
    {"kind": "deep_pass"},
    {"kind": "deep_pass", "user_id": "", "claim_token": "2025-03-12T19:05:01+00:00"},
    {"kind": "deep_pass", "user_id": "alice", "claim_token": "2025-03-12T19:05:01"},  # naive: not a token
    {"kind": "deep_pass", "user_id": "alice", "claim_token": "soon"},
    {"kind": "deep-pass", "user_id": "alice", "claim_token": "2025-03-12T19:05:01+00:00"},
    {"kind": "dream", "session_id": "6f1d2c3b-4a5e-4f60-8a7b-9c0d1e2f3a4b", "user_id": "u",
     "instance_id": "0b9e8d7c-6a5f-4e3d-9c2b-1a0f9e8d7c6b", "claim_token": "2025-03-12T19:05:01+00:00"},
])
def test_malformed_deep_pass_events_raise_for_the_dead_letter_queue(db, bad):
    with pytest.raises(ValidationError):
        extract(bad)


# --- units: clusters, parse, resolve, the offline planner ---------------------------------------------------------

def _row(i: int, day: int, content: str = "x", mentions: int = 1) -> dict:
    return {"id": UUID(int=i), "content": content, "category": "fact", "mention_count": mentions,
            "created_at": datetime(2025, 1, day, tzinfo=UTC)}


def test_clusters_are_connected_components_biggest_first_within_the_budget():
    rows_ = {UUID(int=i): _row(i, i) for i in range(1, 10)}
    pairs = [(UUID(int=1), UUID(int=2), .9), (UUID(int=2), UUID(int=3), .9),  # 1-2-3 chained
             (UUID(int=4), UUID(int=5), .9), (UUID(int=6), UUID(int=7), .9), (UUID(int=7), UUID(int=8), .8),
             (UUID(int=8), UUID(int=6), .8)]
    chosen = deep_pass.clusters(rows_, pairs, 40)
    assert [[r["id"].int for r in g] for g in chosen] == [[6, 7, 8], [1, 2, 3], [4, 5]]  # ties: newest first
    assert [[r["id"].int for r in g] for g in deep_pass.clusters(rows_, pairs, 5)] == [[6, 7, 8], [4, 5]]
    assert [[r["id"].int for r in g] for g in deep_pass.clusters(rows_, pairs, 2)] == [[7, 8]]  # cut: most recent
    assert deep_pass.clusters(rows_, [], 40) == []
    shown = deep_pass.handles(chosen)
    assert shown["m1"] == (UUID(int=6), 0) and shown["m8"] == (UUID(int=5), 2)


@pytest.mark.parametrize("answer, expected", [
    ('{"actions": [{"keep": "m1", "duplicates": ["m2"]}]}', [("duplicate", "m1", ["m2"])]),
    ('[{"current": " M3 ", "supersedes": "m4"}]', [("changed", "m3", ["m4"])]),
    ('Plan: {"keep": "m1", "duplicates": ["m2", "x"]} ok', [("duplicate", "m1", ["m2", None])]),
    ('{"actions": []}', []),
    ('{"plan": [{"keep": "m0", "duplicates": ["m1"]}, "noise", {"other": 1}]}', [("duplicate", None, ["m1"])]),
])
def test_parse_actions(answer, expected):
    assert deep_pass.parse_actions(answer) == expected


@pytest.mark.parametrize("answer", ["", "no", '{"actions": "all"}', "[}", '"m1"'])
def test_parse_rejects_answers_without_a_list_of_actions(answer):
    with pytest.raises(deep_pass.Unparsable):
        deep_pass.parse_actions(answer)


def test_offline_planner_merges_repeats_and_lets_the_newest_slot_value_win():
    groups = [[_row(1, 1, "Lives in Shanghai"), _row(2, 2, "lives in shanghai."), _row(3, 3, "Lives in Tokyo"),
               _row(4, 4, "Has a daughter, Mia")],
              [_row(5, 5, "Likes mocha", mentions=1), _row(6, 6, "Likes mocha", mentions=3)]]
    from eros.providers.offline import offline_actions

    assert offline_actions(deep_pass.render(groups)) == [
        {"keep": "m1", "duplicates": ["m2"]}, {"current": "m3", "supersedes": ["m1"]},
        {"keep": "m6", "duplicates": ["m5"]}]


def test_template_parameters_are_the_codes_defaults():
    import yaml
    from test_template import CfnLoader

    from eros.config import Settings

    template = yaml.load((EVENTS.parent / "template.yaml").read_text(), Loader=CfnLoader)
    params, defaults = template["Parameters"], Settings()
    assert params["DeepPassQuietSecs"]["Default"] == defaults.deep_pass_quiet_secs == 3600
    assert params["DeepPassTickCap"]["Default"] == defaults.deep_pass_tick_cap
    variables = template["Globals"]["Function"]["Environment"]["Variables"]
    assert variables["DEEP_PASS_QUIET_SECS"] == {"Ref": "DeepPassQuietSecs"}
    assert variables["DEEP_PASS_TICK_CAP"] == {"Ref": "DeepPassTickCap"}
    assert variables["DEEP_PASS_CLAIM_STALE_SECS"] == {"Ref": "DreamingClaimStaleSecs"}  # >= extract's lifetime


# --- end to end ---------------------------------------------------------------------------------------------

def test_what_two_sessions_wrote_twice_is_merged_by_the_next_quiet_sweep(db, env, fake_llm, fake_voyage):
    """Chat, dreaming and the deep pass through the real handlers: the extraction model misses that a fact
    is already known (two rows); once the user has been quiet for DEEP_PASS_QUIET_SECS a sweep runs the
    pass, one LLM call, and one row is left, confirmed twice."""
    from apiclient import Api

    wordings = iter(["Lives in Shanghai", "Lives in Shanghai, China"])

    def model(body):
        if body["messages"][0]["content"] == deep_pass.SYSTEM_PROMPT:
            return json.dumps({"actions": [{"keep": "m1", "duplicates": ["m2"]}]})
        if body.get("response_format"):
            return json.dumps({"memories": [{"content": next(wordings), "category": "fact", "importance": 0.6}]})
        return "fake reply"

    fake_llm.responder = model
    env(LLM_BASE_URL=fake_llm.url, OPENROUTER_API_KEY="k", EMBED_BASE_URL=fake_voyage.url, VOYAGE_API_KEY="k",
        PROVIDER_MAX_RETRIES=0)
    api = Api()
    for said in ("I live in Shanghai.", "Shanghai is home for me."):
        sid = api.session()
        assert api.call("POST", f"/v1/sessions/{sid}/turns", {"content": said})[0] == 200
        db.execute("UPDATE engine.chat_sessions SET last_active_at = last_active_at - interval '1 hour'")
        assert sweep_locally()["invoked"] == 1
    assert len(active(db, "alice")) == 2 and state(db, "alice")["is_due"]
    assert sweep_locally()["users_claimed"] == 0  # changed just now: not quiet yet

    db.execute("UPDATE engine.user_deep_pass SET changed_at = changed_at - interval '2 hours'")
    calls = fake_llm.calls
    result = sweep_locally()
    assert (result["claimed"], result["users_claimed"], result["deep_pass_invoked"]) == (0, 1, 1)
    assert fake_llm.calls == calls + 1
    [kept] = active(db, "alice")
    assert (kept["content"], kept["mention_count"]) == ("Lives in Shanghai", 2)
    assert sweep_locally()["users_claimed"] == 0
