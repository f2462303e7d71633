"""A change of embedder is a re-embedding (issue 30, migration 0033, eros.dreaming.reembedding): the sweep queues a
job per user, each embeds the user's rows with the new model beside the old vectors, turns and recall go on with the
old model meanwhile (never two models in one comparison), and one switch makes the new model's vectors current."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from apiclient import Api
from test_consolidation import dream

from eros import calibrated
from eros.config import settings
from eros.dreaming import reembedding
from eros.providers.offline import HashingEmbedder, hash_embed
from eros.store import reembedding as reembedding_store
from eros_dev.dreaming import sweep_locally

OLD = HashingEmbedder.model
NEW = "voyage-3.5-lite"


def new_vector(text: str) -> list[float]:
    """The new model's vectors: unlike the offline model's, so a test sees which model a stored vector is of."""
    return hash_embed(text[::-1] + " reembedded")


def space(db) -> dict:
    return db.execute("SELECT model, next_model FROM engine.embedding_space").fetchone()


def vectors_of(db, user: str) -> dict[str, tuple[list[float], object]]:
    return {r["content"]: (list(r["embedding"]), r["embedding_next"]) for r in db.execute(
        "SELECT content, embedding::real[] AS embedding, embedding_next FROM engine.companion_memories"
        " WHERE user_id = %s", (user,))}


def switched(db) -> None:
    """What a re-embedding's switch leaves: the new model recorded, and every vector the new model's."""
    db.execute("UPDATE engine.embedding_space SET model = %s", (NEW,))
    db.execute("UPDATE engine.companion_memories"
               " SET metadata = jsonb_set(metadata, '{embed_model}', to_jsonb(%s::text))"
               " WHERE metadata ? 'embed_model'", (NEW,))


@pytest.fixture
def stored(db):
    """Two users' memories, utterances and episodes, embedded by the offline model (the local stack without keys)."""
    dream(db, "I live in Lisbon and I work as a nurse.", "I adopted a dog named Biscuit.")
    dream(db, "I play the cello every Sunday.", user="bob")
    assert space(db) == {"model": OLD, "next_model": None}
    return db


@pytest.fixture
def configured(env, fake_voyage):
    """The embedder is now a real one (a fake Voyage on loopback) of another model."""
    fake_voyage.embed_fn = new_vector
    env(EMBED_BASE_URL=fake_voyage.url, VOYAGE_API_KEY="test-key", PROVIDER_MAX_RETRIES=0, EMBED_MODEL=NEW)
    return fake_voyage


def test_recall_keeps_working_with_the_old_model_until_the_switch_then_the_new_ones_vectors_are_current(
        stored, configured):
    db, fake = stored, configured
    api = Api()
    sid = api.session()
    status, body = api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "Where do I live?"})
    assert status == 200, body
    assert body["recalled"], body  # the old model embedded the query: recall works
    assert fake.calls == 0  # ... and the new model was not asked to embed anything compared with old vectors

    reembed = db.execute  # the jobs run one at a time here: the first one leaves alice's job pending
    assert space(db) == {"model": OLD, "next_model": NEW}  # the turn's container started the re-embedding
    first = sweep_locally(workers=1)
    assert first["reembedding_claimed"] == 2
    jobs = [j for j in first["jobs"] if j["kind"] == "reembedding"]
    assert {j["outcome"] for j in jobs} == {"reembedded"}
    assert sorted(j["switch"] or "" for j in jobs) == ["", "switched"]  # the last one switched
    assert space(db) == {"model": NEW, "next_model": None}
    assert reembed("SELECT count(*) AS n FROM engine.companion_memories WHERE embedding_next IS NOT NULL"
                   ).fetchone()["n"] == 0
    for user in ("alice", "bob"):
        for content, (vector, next_vector) in vectors_of(db, user).items():
            assert vector == pytest.approx(new_vector(content), abs=1e-5), content
            assert next_vector is None
    assert db.execute("SELECT count(*) AS n FROM engine.user_reembedding").fetchone()["n"] == 0
    assert {r["model"] for r in db.execute("SELECT metadata->>'embed_model' AS model FROM engine.companion_memories"
                                           " WHERE metadata ? 'embed_model'")} == {NEW}

    calls = fake.calls
    status, body = api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "Where do I live?"})
    assert status == 200 and body["recalled"] and fake.calls == calls + 1  # the new model embeds the query now
    usage = db.execute("SELECT sum(calls) AS calls FROM engine.user_model_usage WHERE purpose = 'reembedding'"
                       ).fetchone()["calls"]
    assert usage >= 2  # the re-embedding's calls are counted, under their own purpose


def claimed(db) -> dict[str, object]:
    now = datetime.now(UTC)
    return {r["user_id"]: r["claim_token"] for r in reembedding_store.claim_users(now - timedelta(minutes=10), 10, now)}


def test_rows_written_after_their_user_was_done_are_re_embedded_by_the_last_job_before_the_switch(stored, configured):
    db = stored
    assert calibrated.start_reembedding(NEW) == 2
    tokens = claimed(db)
    assert reembedding.run(settings(), "bob", tokens["bob"]).outcome == "reembedded"  # alice's is pending
    api = Api()
    sid = api.session(user="bob")
    assert api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "I moved to Porto"}, user="bob")[0] == 200
    late = [r["content"] for r in db.execute("SELECT content FROM engine.companion_memories"
                                              " WHERE embedding_next IS NULL AND user_id = 'bob'")]
    assert late == ["I moved to Porto"]  # written with the old model after bob's job was done
    last = reembedding.run(settings(), "alice", tokens["alice"])
    assert (last.outcome, last.switch) == ("reembedded", "switched")
    assert space(db) == {"model": NEW, "next_model": None}
    [(vector, _)] = [v for content, v in vectors_of(db, "bob").items() if content in late]
    assert vector == pytest.approx(new_vector(late[0]), abs=1e-5)


def test_the_switch_embeds_what_was_written_under_its_lock_or_queues_its_users_again(stored, configured):
    db = stored
    calibrated.start_reembedding(NEW)
    tokens = claimed(db)
    for user in ("bob", "alice"):
        reembedding_store.pause({"user_id": user}, tokens[user])  # nobody runs them: done by hand below
    db.execute("UPDATE engine.companion_memories SET embedding_next = embedding")  # every row "re-embedded"
    db.execute("UPDATE engine.user_reembedding SET done_at = now()")
    api = Api()
    sid = api.session(user="bob")
    assert api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "I moved to Porto"}, user="bob")[0] == 200
    assert reembedding_store.switch(NEW) == "waiting"  # a late row and nothing to embed it with: bob queued
    assert [r["user_id"] for r in db.execute("SELECT user_id FROM engine.user_reembedding WHERE done_at IS NULL")
            ] == ["bob"]
    db.execute("UPDATE engine.user_reembedding SET done_at = now()")
    seen = []

    def embed(rows):
        seen.extend(r["content"] for r in rows)
        return [(r["id"], r["user_id"], new_vector(r["content"])) for r in rows]

    assert reembedding_store.switch(NEW, embed, most=0) == "waiting"  # more late rows than it may embed
    db.execute("UPDATE engine.user_reembedding SET done_at = now()")
    assert reembedding_store.switch(NEW, embed) == "switched"
    assert seen == ["I moved to Porto"] and space(db) == {"model": NEW, "next_model": None}
    assert reembedding_store.switch(NEW, embed) == "stale"


def test_a_new_model_the_server_does_not_serve_holds_and_recall_goes_on_with_the_old(stored, configured):
    db, fake = stored, configured
    fake.served = {"voyage-3-large"}  # NEW is not served: a configuration fault, never counted against a user
    calibrated.embedder()  # what a turn or an extraction asks first: it starts the re-embedding
    result = sweep_locally()
    assert {j["outcome"] for j in result["jobs"] if j["kind"] == "reembedding"} == {"blocked"}
    assert space(db) == {"model": OLD, "next_model": NEW}
    assert db.execute("SELECT max(attempts) AS n FROM engine.user_reembedding").fetchone()["n"] == 0
    api = Api()
    sid = api.session()
    status, body = api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "Where do I live?"})
    assert status == 200 and body["recalled"]
    status, body = api.call("POST", "/v1/memories/search", {"query": "dog"})
    assert status == 200 and body["results"], body


def test_erasure_takes_the_users_job_and_going_back_to_the_recorded_model_cancels_nothing_stored(
        stored, configured, env):
    db = stored
    assert calibrated.start_reembedding(NEW) == 2
    assert calibrated.start_reembedding(NEW) is None  # already the target: nothing started twice
    status, body = Api().call("DELETE", "/v1/me", user="bob")
    assert status == 200 and body["erased"]["reembedding"] == 1
    assert db.execute("SELECT user_id FROM engine.user_reembedding").fetchall() == [{"user_id": "alice"}]
    env(EMBED_BASE_URL=None, VOYAGE_API_KEY=None, EMBED_MODEL=None)  # back to the recorded (offline) model
    api = Api()
    sid = api.session()
    status, body = api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "Where do I live?"})
    assert status == 200 and body["recalled"]
    assert space(db) == {"model": OLD, "next_model": None}  # that turn's container stopped the re-embedding
    assert db.execute("SELECT count(*) AS n FROM engine.user_reembedding").fetchone()["n"] == 0


def test_health_shows_how_far_a_re_embedding_is(stored, configured):
    from eros.health import deep_report

    calibrated.embedder()  # a turn's first step: it starts the re-embedding
    report = deep_report(fresh=True)
    check = report["checks"]["calibration"]
    assert check["status"] == "warning" and report["status"] == "ok", check
    assert f"re-embedding the stored vectors of '{OLD}' with '{NEW}': 0 rows done" in check["detail"]
    assert "turns, recall and dreaming go on with" in check["detail"]
    progress = report["calibration"]["reembedding"]
    assert progress["next_model"] == NEW and progress["users_pending"] == 2 and progress["rows_pending"] > 0


def test_a_turn_that_embedded_with_the_old_model_just_before_the_switch_is_a_retryable_503(stored, monkeypatch):
    """What the trigger refuses after a switch (SQLSTATE EM001) reaches a client as 'retry', never a 500."""
    import psycopg

    from eros.db import embedding_switched
    from eros.store import chat as chat_store

    with pytest.raises(psycopg.DatabaseError) as refused:
        stored.execute("DO $$ BEGIN RAISE EXCEPTION 'switched' USING ERRCODE = 'EM001'; END $$")
    stored.rollback() if not stored.autocommit else None
    assert embedding_switched(refused.value)

    def switched_meanwhile(*args, **kwargs):
        raise refused.value

    monkeypatch.setattr(chat_store, "record_turn", switched_meanwhile)
    api = Api()
    sid = api.session()
    status, body = api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "Where do I live?"})
    assert (status, body["code"], body["retryable"]) == (503, "database_busy", True), body


def test_a_search_embedded_with_a_model_the_store_no_longer_records_is_refused_not_compared(stored):
    """A container that has not yet seen a switch (it asks again within a second) embeds a search with the old model:
    the statement refuses it (EM001, a retryable 503) before it reads a row, instead of comparing two models."""
    import psycopg

    from eros.db import embedding_switched
    from eros.memory import MemoryLayer
    from eros.store import recall as recall_store

    query = hash_embed("dog")
    rows = recall_store.ranked(MemoryLayer.PROFILE, settings().recall, "alice", query, k=3, cap=None, model=OLD)
    assert rows  # the recorded model: compared as ever
    switched(stored)
    with pytest.raises(psycopg.DatabaseError) as refused:
        recall_store.ranked(MemoryLayer.PROFILE, settings().recall, "alice", query, k=3, cap=None, model=OLD)
    assert embedding_switched(refused.value)


def test_a_turns_recall_embedded_with_a_model_the_store_no_longer_records_is_refused_not_compared(stored):
    """The same for a turn's recall (engine.turn_recall_v3), and so for a read-only context, the one path that writes
    no vector: in the second before a container sees a switch it answers a retryable 503, never a ranking that
    compared two models' vectors."""
    import psycopg

    from eros.db import embedding_switched
    from eros.store import recall as recall_store

    query = hash_embed("dog")
    rows = recall_store.candidates(settings().recall, "alice", query, k=3, cap=None, relationship_k=0,
                                   instance_id=None, dedupe=0.97, model=OLD)
    assert rows  # the recorded model: ranked as ever
    api = Api()
    sid = api.session()
    assert api.call("POST", f"/v1/sessions/{sid}/context", {"content": "Where do I live?"})[0] == 200  # cached: OLD
    switched(stored)
    with pytest.raises(psycopg.DatabaseError) as refused:
        recall_store.candidates(settings().recall, "alice", query, k=3, cap=None, relationship_k=0,
                                instance_id=None, dedupe=0.97, model=OLD)
    assert embedding_switched(refused.value)
    status, body = api.call("POST", f"/v1/sessions/{sid}/context", {"content": "Where do I live?"})
    assert (status, body["code"], body["retryable"]) == (503, "database_busy", True), body
