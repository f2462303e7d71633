"""Write-time consolidation: inside the extraction that already runs, a changed fact supersedes the
old one, a repeat confirms it, and nothing the model says can reach beyond the user's own active
profile rows that were shown to it -- in the same claim-guarded transaction as the insert."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest
from apiclient import Api
from helpers import extract, go_idle
from pgvector import Vector

from eros import recall
from eros.config import settings
from eros.dreaming import session as session_job
from eros.extraction import MAX_SUPERSEDED_PER_SESSION, Candidate, handles, parse_candidates, plan
from eros.providers.offline import hash_embed
from eros.store import claims
from eros.store import dreaming as store

_KNOWN = re.compile(r"^- (m\d+) \((\w+), noted [0-9-]+(?:; when: [^)]*)?\): (.*)$", re.M)


def known_in(body: dict) -> dict[str, str]:
    """content -> handle, as shown to the model in an extraction request."""
    text = body["messages"][-1]["content"]
    block = text.split("</known_memories>", 1)[0] if "<known_memories>" in text else ""
    return {content: handle for handle, _, content in _KNOWN.findall(block)}


def script(fake, *answers):
    """The extraction model answers each session with the next function of the known memories it was
    shown (content -> handle); chat turns get a plain reply."""
    queue = list(answers)
    seen: list[dict] = []

    def respond(body):
        if not body.get("response_format"):
            return "fake reply"
        known = known_in(body)
        seen.append(known)
        return json.dumps({"memories": queue.pop(0)(known)})

    fake.responder = respond
    return seen


def session_with(db, *texts: str, user: str = "alice", persona: str = "luna") -> tuple[str, dict]:
    """A session with one turn per text, idle and claimed; returns (session id, extract payload)."""
    api = Api()
    sid = api.session(user=user, persona=persona)
    for text in texts:
        status, body = api.call("POST", f"/v1/sessions/{sid}/turns", {"content": text}, user=user)
        assert status == 200, body
    go_idle(db)
    now = datetime.now(UTC)
    rows = [r for r in store.claim(now, now - timedelta(seconds=600), 50) if str(r["id"]) == sid]
    return sid, session_job.event(rows[0])


def dream(db, *texts: str, user: str = "alice") -> dict:
    return extract(session_with(db, *texts, user=user)[1])


def profile(db, user: str = "alice") -> list[dict]:
    return db.execute(
        "SELECT id, content, category, importance, superseded_at, superseded_by, superseded_reason, mention_count,"
        " last_confirmed_at, source, from_message_id, through_message_id FROM engine.companion_memories"
        " WHERE user_id = %s AND instance_id IS NULL ORDER BY created_at, content", (user,)).fetchall()


def active(db, user: str = "alice") -> list[str]:
    return sorted(r["content"] for r in profile(db, user) if r["superseded_at"] is None)


def memory(content, category="fact", importance=0.5, **extra) -> dict:
    return {"content": content, "category": category, "importance": importance, **extra}


# --- a changed fact, a repeat, a related-but-true fact ----------------------------------------------

def test_a_changed_fact_supersedes_the_old_one_in_the_same_extraction(db, providers):
    llm, voyage = providers
    shown = script(llm,
                   lambda known: [memory("Lives in Shanghai"), memory("Has a daughter, Mia", "relation", 0.9)],
                   lambda known: [memory("Lives in Tokyo", supersedes=[known["Lives in Shanghai"]]),
                                  memory("Mia started school", "event")])
    dream(db, "I live in Shanghai with my daughter Mia")
    before = (llm.calls, voyage.calls)
    result = dream(db, "I moved to Tokyo last month, and Mia started school")

    assert (result["outcome"], result["memories"], result["superseded"], result["ignored"]) == ("extracted", 2, 1, 0)
    assert (llm.calls - before[0], voyage.calls - before[1]) == (2, 2)  # chat turn + extraction; query + batch
    assert set(shown[1]) == {"Lives in Shanghai", "Has a daughter, Mia"}  # the known rows, by handle
    rows = {r["content"]: r for r in profile(db)}
    old, new = rows["Lives in Shanghai"], rows["Lives in Tokyo"]
    assert old["superseded_by"] == new["id"] and old["superseded_reason"] == "changed" and old["superseded_at"]
    assert active(db) == ["Has a daughter, Mia", "Lives in Tokyo", "Mia started school"]  # Mia untouched
    assert new["source"] == "dreaming" and new["from_message_id"] <= new["through_message_id"]
    # Recall never brings the old city back; the history row is still there.
    query = hash_embed("Lives in Shanghai")
    recalled = recall.recall("alice", None, query).profile
    assert "Lives in Shanghai" not in [m["content"] for m in recalled] and "Lives in Tokyo" in [
        m["content"] for m in recalled]
    # The user consolidation queue knows the user changed (the deep pass is due).
    assert db.execute("SELECT changed_at FROM engine.user_deep_pass WHERE user_id = 'alice'").fetchone()


def test_a_repeat_confirms_the_known_memory_and_adds_no_row(db, providers):
    llm, voyage = providers
    script(llm, lambda known: [memory("Lives in Shanghai", importance=0.4)],
           lambda known: [memory("Lives in Shanghai (still)", importance=0.7, same_as=known["Lives in Shanghai"])],
           lambda known: [memory("lives in shanghai.", importance=0.1)])  # exact repeat the model did not flag
    dream(db, "I live in Shanghai")
    documents_before = voyage.calls
    second = dream(db, "Still in Shanghai, as always")
    assert (second["outcome"], second["memories"], second["confirmed"]) == ("consolidated", 0, 1)
    assert voyage.calls - documents_before == 1  # the chat turn's query embedding: no document batch
    third = dream(db, "Shanghai is home")
    assert (third["memories"], third["confirmed"]) == (0, 1)

    [row] = profile(db)
    assert row["content"] == "Lives in Shanghai" and row["mention_count"] == 3 and row["last_confirmed_at"]
    assert row["importance"] == pytest.approx(0.7)  # rose with the repeat, never fell


# --- what the model is shown -------------------------------------------------------------------------

def test_the_model_sees_only_the_users_own_active_profile_rows_by_handle_and_at_most_thirty(db, providers):
    llm, _ = providers
    instance = db.execute("INSERT INTO engine.persona_instances (user_id, persona_id) VALUES ('alice', 'kai')"
                          " RETURNING id").fetchone()["id"]

    def add(user, content, *, instance_id=None, superseded=False):
        return db.execute(
            "INSERT INTO engine.companion_memories (user_id, instance_id, content, embedding, category,"
            " superseded_at, superseded_reason) VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id",
            (user, instance_id, content, Vector(hash_embed(content)), None if instance_id else "fact",
             datetime.now(UTC) if superseded else None, "changed" if superseded else None),
        ).fetchone()["id"]

    for i in range(40):
        add("alice", f"Knows fact number {i} about gardening")
    add("alice", "An old gardening fact", superseded=True)
    add("alice", "A gardening utterance to kai", instance_id=instance)
    add("mallory", "Mallory's gardening secret")
    shown = script(llm, lambda known: [])
    dream(db, "Let us talk about gardening facts")

    [known] = shown
    assert len(known) == 30 and sorted(known.values(), key=lambda h: int(h[1:])) == [f"m{i}" for i in range(1, 31)]
    assert all(content.startswith("Knows fact number") for content in known)
    request = next(r for r in llm.requests if r["json"].get("response_format"))
    assert not re.search(r"[0-9a-f]{8}-[0-9a-f]{4}-", request["json"]["messages"][-1]["content"])  # no uuids


def test_rows_at_the_same_distance_go_by_importance_then_the_newest(db, providers):
    """A lexical embedder puts every row that shares no word with the session at one distance: the
    important fact ("lives in", a relation) must win a slot over trivia, not a random uuid."""
    llm, _ = providers
    # The relation sorts after the preferences in the profile index: scan order would leave it out.
    rows = [("Mother pushes her to marry", "relation", 1.0)] + [(f"Likes snack {i}", "preference", 0.2)
                                                                 for i in range(79)]
    for content, category, importance in reversed(rows):  # the fact last: scan order must not decide
        db.execute("INSERT INTO engine.companion_memories (user_id, content, embedding, category, importance)"
                   " VALUES ('alice', %s, %s, %s, %s)", (content, Vector(hash_embed(content)), category, importance))
    shown = script(llm, lambda known: [])
    dream(db, "Got the keys to my new flat in Berlin")
    assert "Mother pushes her to marry" in shown[0] and len(shown[0]) == 30


def test_no_known_memories_means_no_known_block(db, providers):
    llm, _ = providers
    shown = script(llm, lambda known: [memory("Likes tea", "preference")])
    dream(db, "I like tea")
    request = next(r for r in llm.requests if r["json"].get("response_format"))
    assert "<known_memories>" not in request["json"]["messages"][-1]["content"] and shown == [{}]


# --- hostile and confused answers -------------------------------------------------------------------

def test_supersede_everything_is_bounded_and_stray_handles_are_ignored(db, providers):
    llm, _ = providers
    script(llm, lambda known: [memory(f"Fact {i} about the city") for i in range(10)],
           lambda known: [memory("Change 0 about the city", supersedes=[f"m{j}" for j in range(1, 31)])]
           + [memory(f"Change {i} about the city", supersedes=[f"m{3 * i + j}" for j in (1, 2, 3)])
              for i in range(1, 8)]  # 10 candidates in all: the most one extraction keeps
           + [memory("Points nowhere", supersedes=["m99", "m0", "x1", "3f2504e0-4f89-11d3-9a0c-0305e82c3301"]),
              memory("Claims a repeat of nothing", same_as="m77")])
    dream(db, "Facts about the city")
    result = dream(db, "Everything about the city changed")

    assert result["superseded"] == MAX_SUPERSEDED_PER_SESSION
    assert result["ignored"] > 0
    rows = profile(db)
    assert sum(r["superseded_at"] is not None for r in rows) == MAX_SUPERSEDED_PER_SESSION
    # The stray answers are kept as plain new memories: nothing the model said was lost.
    assert {"Points nowhere", "Claims a repeat of nothing"} <= set(active(db))


def test_the_parse_keeps_only_handles_and_bounds_each_memory():
    [c] = parse_candidates(json.dumps({"memories": [
        {"content": "x", "supersedes": ["M1", " m2 ", "m2", "m3", "m4", "m5", 7, None, "DROP TABLE", "m0"],
         "same_as": ["m9"]}]}))
    assert c.supersedes == ["m1", "m2", "m3"] and c.same_as == "m9"
    [c] = parse_candidates('[{"content": "y", "supersedes": "m4", "same_as": {"id": "m1"}}]')
    assert c.supersedes == ["m4"] and c.same_as is None


def test_plan_maps_handles_once_and_never_both_confirms_and_supersedes_a_row():
    a, b = ({"id": i, "content": t, "category": "fact"} for i, t in ((1, "Lives in Paris"), (2, "Works at a bank")))
    shown = {"m1": a, "m2": b}
    decided = plan([Candidate(content="Lives in Rome", supersedes=["m1"]),
                    Candidate(content="Lives in Rome too", supersedes=["m1", "m2"]),
                    Candidate(content="Works at a bank", same_as="m2", supersedes=["m1"]),
                    Candidate(content="Lives in Paris", same_as="m1")], shown)
    # m1 is superseded once; a repeat of a row another candidate just replaced is kept as a new memory.
    assert [(c.content, ids) for c, ids in decided.new] == [
        ("Lives in Rome", [1]), ("Lives in Rome too", [2]), ("Works at a bank", []), ("Lives in Paris", [])]
    assert decided.confirm == [] and decided.ignored == 4


def test_a_row_superseded_meanwhile_is_left_alone_and_counted(db, providers):
    llm, _ = providers

    def change_and_race(known):
        db.execute("UPDATE engine.companion_memories SET superseded_at = now(), superseded_reason = 'changed'"
                   " WHERE content = 'Lives in Shanghai'")  # e.g. the deep pass got there first
        return [memory("Lives in Tokyo", supersedes=[known["Lives in Shanghai"]])]

    script(llm, lambda known: [memory("Lives in Shanghai")], change_and_race)
    dream(db, "I live in Shanghai")
    result = dream(db, "I moved to Tokyo")
    assert (result["memories"], result["superseded"], result["ignored"]) == (1, 0, 1)
    old = next(r for r in profile(db) if r["content"] == "Lives in Shanghai")
    assert old["superseded_by"] is None  # not re-pointed by a second writer


# --- the guarded transaction -------------------------------------------------------------------------

def test_duplicate_delivery_supersedes_nothing_twice(db, providers):
    llm, _ = providers
    script(llm, lambda known: [memory("Lives in Shanghai")],
           lambda known: [memory("Lives in Tokyo", supersedes=[known["Lives in Shanghai"]])])
    dream(db, "I live in Shanghai")
    _, payload = session_with(db, "I moved to Tokyo")
    first, second = extract(payload), extract(payload)
    assert (first["superseded"], second["outcome"], second["llm_calls"]) == (1, "not-claimed", 0)
    assert active(db) == ["Lives in Tokyo"] and len(profile(db)) == 2


def test_a_stale_worker_neither_inserts_nor_supersedes(db, providers):
    llm, _ = providers
    script(llm, lambda known: [memory("Lives in Shanghai")])
    dream(db, "I live in Shanghai")
    sid, stale = session_with(db, "I moved to Tokyo")
    # The claim went stale and another worker re-claimed (and finished) the session.
    later = datetime.now(UTC) + timedelta(seconds=settings().dreaming_claim_stale_secs + 5)
    [row] = store.claim(later, later - timedelta(seconds=settings().dreaming_claim_stale_secs), 10, now=later)
    script(llm, lambda known: [memory("Lives in Tokyo", supersedes=[known["Lives in Shanghai"]])])
    assert extract(session_job.event(row))["superseded"] == 1
    script(llm, lambda known: [memory("Lives in Osaka", supersedes=list(known.values()))])
    assert extract(stale)["outcome"] == "not-claimed"
    assert active(db) == ["Lives in Tokyo"]


def test_concurrent_deliveries_of_one_change_apply_it_once(db, providers):
    llm, _ = providers
    script(llm, lambda known: [memory("Lives in Shanghai")])
    dream(db, "I live in Shanghai")
    _, payload = session_with(db, "I moved to Tokyo")
    script(llm, *[lambda known: [memory("Lives in Tokyo", supersedes=[known["Lives in Shanghai"]])]] * 2)
    with ThreadPoolExecutor(2) as pool:
        outcomes = sorted(r["outcome"] for r in pool.map(extract, [payload, payload]))
    assert outcomes.count("extracted") == 1
    assert [r["content"] for r in profile(db)].count("Lives in Tokyo") == 1 and active(db) == ["Lives in Tokyo"]


def test_another_users_rows_cannot_be_touched_even_by_id(db, providers):
    llm, _ = providers
    script(llm, lambda known: [memory("Bob lives in Lima")])
    dream(db, "I live in Lima", user="bob")
    [bob] = profile(db, "bob")
    # A session of alice's whose (forged) plan names bob's row: the guarded write refuses it.
    sid, payload = session_with(db, "hello there")
    session = claims.held(store.SESSIONS, {"user_id": payload["user_id"], "id": sid},
                          datetime.fromisoformat(payload["claim_token"]))
    counts = store.finish(session, datetime.fromisoformat(payload["claim_token"]),
                          [{"content": "Alice fact", "category": "fact", "importance": 0.5,
                            "embedding": hash_embed("Alice fact"), "supersedes": [bob["id"]], "metadata": {}}],
                          None, None, confirm=[(bob["id"], 1.0)])
    assert (counts["superseded"], counts["confirmed"], counts["ignored"]) == (0, 0, 2)
    assert profile(db, "bob")[0]["superseded_at"] is None and profile(db, "bob")[0]["mention_count"] == 1


def test_relationship_rows_and_history_cannot_be_superseded_or_confirmed_even_by_id(db, providers):
    llm, _ = providers
    script(llm, lambda known: [memory("Lives in Lima")], lambda known: [memory("Lives in Quito",
                                                                                supersedes=[known["Lives in Lima"]])])
    dream(db, "I live in Lima")
    dream(db, "I moved to Quito")
    history = next(r for r in profile(db) if r["content"] == "Lives in Lima")
    utterance = db.execute("SELECT id FROM engine.companion_memories WHERE user_id = 'alice'"
                           " AND instance_id IS NOT NULL AND superseded_at IS NULL LIMIT 1").fetchone()["id"]
    sid, payload = session_with(db, "hello again")
    token = datetime.fromisoformat(payload["claim_token"])
    counts = store.finish(claims.held(store.SESSIONS, {"user_id": "alice", "id": sid}, token), token,
                          [{"content": "Forged", "category": "fact", "importance": 0.5, "embedding": hash_embed("x"),
                            "supersedes": [history["id"], utterance], "metadata": {}}],
                          None, None, confirm=[(history["id"], 1.0), (utterance, 1.0)])
    assert (counts["superseded"], counts["confirmed"], counts["ignored"]) == (0, 0, 4)
    again = next(r for r in profile(db) if r["content"] == "Lives in Lima")
    assert again["superseded_by"] == history["superseded_by"] and again["mention_count"] == 1
    assert db.execute("SELECT superseded_at FROM engine.companion_memories WHERE id = %s",
                      (utterance,)).fetchone()["superseded_at"] is None


def test_handles_are_local_to_one_extraction():
    rows = [{"id": i, "content": f"c{i}", "category": "fact", "created_at": datetime.now(UTC)}
            for i in range(35)]
    shown = handles(rows)
    assert list(shown) == [f"m{i}" for i in range(1, 31)] and shown["m1"]["id"] == 0


# --- offline: what `make run` shows with no keys ------------------------------------------------------

def utterances(db, user: str = "alice") -> dict[str, list]:
    """Relationship-layer rows by content: their supersession states."""
    out: dict[str, list] = {}
    for r in db.execute("SELECT content, superseded_at, superseded_by, superseded_reason FROM engine.companion_memories"
                        " WHERE user_id = %s AND instance_id IS NOT NULL ORDER BY created_at", (user,)):
        out.setdefault(r["content"], []).append(r)
    return out


def recalled_contents(db, body: dict) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {"profile": [], "relationship": []}
    for r in body["recalled"]:
        row = db.execute("SELECT content FROM engine.companion_memories WHERE id = %s", (r["id"],)).fetchone()
        out[r["layer"]].append(row["content"])
    return out


def test_offline_same_statement_twice_is_one_memory_and_a_move_supersedes(db):
    """The issue's scenario with no keys, all with one persona: the later turn about home is reminded
    of Tokyo only, in the profile and in what the user said to the persona."""
    dream(db, "I live in Shanghai.", "I really love mocha.")
    dream(db, "I live in Shanghai.")
    [home, mocha] = sorted(profile(db), key=lambda r: "mocha" in r["content"])
    assert home["mention_count"] == 2 and home["superseded_at"] is None and mocha["mention_count"] == 1

    dream(db, "I moved to Tokyo.")
    assert active(db) == ["Moved to Tokyo", "Really loves mocha"]
    old = next(r for r in profile(db) if "Shanghai" in r["content"])
    assert old["superseded_reason"] == "changed" and old["superseded_by"] is not None
    # Both utterances that stated Shanghai (the first session's and the repeat's) left recall with it;
    # the mocha utterance of the same session did not.
    said = utterances(db)
    assert [(r["superseded_reason"], r["superseded_by"]) for r in said["I live in Shanghai."]] == [
        ("outdated", old["id"])] * 2
    assert [r["superseded_at"] for r in said["I really love mocha."] + said["I moved to Tokyo."]] == [None, None]

    api = Api()
    status, body = api.call("GET", "/v1/memories?include=superseded")  # history, utterances included
    assert status == 200, body
    assert {m["superseded_reason"] for m in body["memories"]} == {None, "changed", "outdated"}
    sid = api.session(persona="luna")
    status, body = api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "Where is home for me these days?"})
    assert status == 200
    recalled = recalled_contents(db, body)
    assert "Moved to Tokyo" in recalled["profile"]
    assert not any("Shanghai" in text for layer in recalled.values() for text in layer)


def test_restoring_the_old_fact_brings_its_utterances_back_and_outdates_the_new_ones(db):
    dream(db, "I live in Shanghai.")
    dream(db, "I moved to Tokyo.")
    old = next(r for r in profile(db) if "Shanghai" in r["content"])
    status, body = Api().call("POST", f"/v1/memories/{old['id']}/restore")
    assert status == 200, body
    said = utterances(db)
    assert said["I live in Shanghai."][0]["superseded_at"] is None
    assert said["I moved to Tokyo."][0]["superseded_reason"] == "outdated"
    assert active(db) == ["Lives in Shanghai"]
    # The history chain of the profile fact shows profile versions only, not the utterances.
    status, body = Api().call("GET", f"/v1/memories/{old['id']}")
    assert {m["layer"] for m in body["history"]} == {"profile"} and body["supersedes"]


def test_restoring_an_outdated_utterance_touches_no_profile_row(db):
    dream(db, "I live in Shanghai.")
    dream(db, "I moved to Tokyo.")
    before = [(r["content"], r["superseded_at"]) for r in profile(db)]
    utterance = db.execute("SELECT id FROM engine.companion_memories WHERE content = 'I live in Shanghai.'"
                           " AND instance_id IS NOT NULL").fetchone()["id"]
    status, body = Api().call("POST", f"/v1/memories/{utterance}/restore")
    assert status == 200 and body["superseded_at"] is None
    assert [(r["content"], r["superseded_at"]) for r in profile(db)] == before


def test_offline_related_but_true_statements_are_both_kept(db):
    dream(db, "I have a daughter named Mia.")
    dream(db, "My daughter Mia started school today.")
    assert len(active(db)) == 2 and all(r["superseded_at"] is None for r in profile(db))
