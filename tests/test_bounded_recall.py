"""Recall's bound (issue 27, engine.recall_layer_v2): the window of newest utterances against a brute-force
ranking of exactly that window, the lexical path that still finds an old utterance by a rare name or number,
episodes scored at any age, an imported history without episodes, the sign-bit prefilter (its bits, a row not
filled yet, the nearest row kept from a profile larger than the pool), the unbounded setting as the exact
scan, and the knobs' validation."""

from __future__ import annotations

import random
import uuid

import pytest
from pydantic import ValidationError
from test_recall import NOW, brute_force, insert, instance_for, near, random_vector, replace

from eros.config import RecallKnobs
from eros.memory import MemoryLayer
from eros.store import recall as recall_store
from eros.store.rows import RankedMemory

WINDOW = 50
BOUNDED = RecallKnobs(utterance_window=WINDOW, pool=60, lexical_pool=10, demote_similarity=2.0)
UNBOUNDED = replace(BOUNDED, utterance_window=0)


def utterances(db, user: str, instance: uuid.UUID, count: int, rng: random.Random, query: list[float],
               *, oldest_days: float = 400.0, text=lambda i: f"small talk number {i} about the weather") -> list[dict]:
    """``count`` utterances, one a day apart from ``oldest_days`` ago, each far from ``query``; oldest first."""
    step = oldest_days / count
    return [insert(db, user, text(i), near(random_vector(rng), rng, 0.1), category=None, instance=instance,
                   age_days=oldest_days - i * step) for i in range(count)]


def episode(db, user: str, instance: uuid.UUID, content: str, embedding: list[float], age_days: float) -> dict:
    row = insert(db, user, content, embedding, category=None, instance=instance, age_days=age_days)
    db.execute("UPDATE engine.companion_memories SET source = 'episode' WHERE id = %s", (row["id"],))
    return row


def relationship(db, knobs: RecallKnobs, user: str, instance: uuid.UUID, query: list[float], k: int = 5,
                 message: str | None = None) -> list[RankedMemory]:
    """The layer's top ``k``; with a k larger than the candidate set, every candidate (what is in reach)."""
    return recall_store.ranked(MemoryLayer.RELATIONSHIP, knobs, user, query, k=k, cap=None, instance_id=instance,
                               message=message, now=NOW)


@pytest.mark.parametrize("strategy", ["grouped", "recency", "composite"])
def test_the_window_is_the_newest_utterances_ranked_exactly(db, strategy):
    """80 utterances, a window of 50: the ranking is the brute force over the 50 newest, and differs from the
    exact scan of all 80 (the query is nearest to old ones), which the unbounded setting still gives."""
    rng = random.Random(27)
    query = random_vector(rng)
    instance = instance_for(db, "alice")
    rows = [insert(db, "alice", f"said {i}", near(query, rng, rng.uniform(0.5, 3.0)), category=None,
                   instance=instance, age_days=80 - i) for i in range(80)]
    knobs = replace(BOUNDED, strategy=strategy, lam=0.2, tau_days=20)
    got = [r["id"] for r in relationship(db, knobs, "alice", instance, query, k=10)]
    newest = sorted(rows, key=lambda r: r["created_at"])[-WINDOW:]
    assert got == [i for i, _ in brute_force(newest, query, strategy, knobs, 10, None, demote=False)]
    everything = [i for i, _ in brute_force(rows, query, strategy, knobs, 10, None, demote=False)]
    assert got != everything
    assert [r["id"] for r in relationship(db, replace(knobs, utterance_window=0), "alice", instance, query,
                                          k=10)] == everything


def test_an_old_utterance_is_found_by_a_rare_name_or_number(db):
    """Beyond the window, far in meaning: the lexical path reaches it by a word rare in the window; without the
    word (or with a word the window is full of) it stays out of reach of the vector part."""
    rng = random.Random(28)
    query = random_vector(rng)
    instance = instance_for(db, "alice")
    old = insert(db, "alice", "lunch with Mehmet, flat number 4711", random_vector(rng), category=None,
                 instance=instance, age_days=500)
    utterances(db, "alice", instance, 120, rng, query)
    reach = 500  # more than the candidates: each call returns all it scored
    found = relationship(db, BOUNDED, "alice", instance, query, k=reach, message="what did Mehmet say?")
    assert old["id"] in {r["id"] for r in found} and len(found) == WINDOW + 1
    assert old["id"] in {r["id"] for r in relationship(db, BOUNDED, "alice", instance, query, k=reach,
                                                      message="4711")}
    assert old["id"] not in {r["id"] for r in relationship(db, BOUNDED, "alice", instance, query, k=reach,
                                                          message="tell me about the weather")}
    assert old["id"] not in {r["id"] for r in relationship(db, replace(BOUNDED, lexical_pool=0), "alice", instance,
                                                          query, k=reach, message="what did Mehmet say?")}
    # In reach, the word's BM25 lifts it as much as the lexical weight allows: first at a weight above the
    # random vectors' spread of similarity.
    lifted = relationship(db, replace(BOUNDED, lexical_weight=0.5), "alice", instance, query,
                          message="what did Mehmet say?")
    assert lifted[0]["id"] == old["id"] and lifted[0]["lexical_term"] == pytest.approx(0.5)


def test_a_word_common_in_the_window_is_not_looked_up_in_the_history(db):
    """'weather' is in every row of the window: an old row that shares only that word is not brought in (its
    posting list is the whole history), while the same old row is found by its rare word."""
    rng = random.Random(29)
    query = random_vector(rng)
    instance = instance_for(db, "alice")
    old = insert(db, "alice", "the weather in Zermatt", random_vector(rng), category=None, instance=instance,
                 age_days=600)
    utterances(db, "alice", instance, 100, rng, query)
    assert old["id"] not in {r["id"] for r in relationship(db, BOUNDED, "alice", instance, query, k=500,
                                                          message="weather")}
    assert old["id"] in {r["id"] for r in relationship(db, BOUNDED, "alice", instance, query, k=500,
                                                      message="weather in zermatt")}


def test_the_lexical_path_reads_a_bounded_number_of_rows_per_word_preferring_more_words_then_the_newest(db):
    """A name said 150 times long ago, with lexical_pool 10: the lexical path reads the 100 newest rows of each rare
    word (engine.relationship_terms, 10 x lexical_pool), not all 150, and so never reaches the oldest, which holds
    two more rare words; through those two words' lists it is still found, and first (more words), though older
    than every other; a superseded old row is never brought in. Then the newest rows of the name."""
    rng = random.Random(31)
    query = random_vector(rng)
    instance = instance_for(db, "alice")
    both = insert(db, "alice", "Mehmet showed me flat 4711", random_vector(rng), category=None, instance=instance,
                  age_days=900)
    named = [insert(db, "alice", f"Mehmet again, time {i}", random_vector(rng), category=None, instance=instance,
                    age_days=800 - i) for i in range(150)]
    gone = insert(db, "alice", "Mehmet before the edit", random_vector(rng), category=None, instance=instance,
                  age_days=700)
    db.execute("UPDATE engine.companion_memories SET superseded_at = %s, superseded_reason = 'edited' WHERE id = %s",
               (NOW, gone["id"]))
    utterances(db, "alice", instance, 80, rng, query, oldest_days=300)
    ids = {r["id"] for r in relationship(db, BOUNDED, "alice", instance, query, k=500,
                                         message="Mehmet and flat 4711")}
    older = ids - {r["id"] for r in relationship(db, BOUNDED, "alice", instance, query, k=500, message="hello")}
    newest = {r["id"] for r in sorted(named, key=lambda r: r["created_at"])[-9:]}
    assert both["id"] in older and gone["id"] not in older
    assert older == {both["id"]} | newest  # lexical_pool 10: the row of both words, then the newest of one


def test_the_terms_follow_their_row_through_edits_and_deletes(db):
    """engine.relationship_terms is kept by the trigger of migration 0027: an active relationship row's words are
    there (keyed with its instance), an edit of its text replaces them, superseding removes them and a restore
    gives them back, a delete removes them; profile rows have none."""
    rng = random.Random(32)
    instance = instance_for(db, "alice")

    def terms(memory_id) -> set[int]:
        return {r["term_key"] for r in db.execute(
            "SELECT term_key FROM engine.relationship_terms WHERE memory_id = %s AND user_id = 'alice'",
            (memory_id,)).fetchall()}

    def keys(text: str) -> set[int]:
        return set(db.execute("SELECT engine.instance_terms(%s, engine.lexemes(%s)) AS k", (instance, text)
                              ).fetchone()["k"])

    row = insert(db, "alice", "Mehmet lives in flat 4711", random_vector(rng), category=None, instance=instance)
    assert terms(row["id"]) == keys("Mehmet lives in flat 4711") and len(terms(row["id"])) >= 4
    db.execute("UPDATE engine.companion_memories SET content = 'Aylin moved to Izmir' WHERE id = %s", (row["id"],))
    assert terms(row["id"]) == keys("Aylin moved to Izmir")
    db.execute("UPDATE engine.companion_memories SET importance = 0.9 WHERE id = %s", (row["id"],))  # no word
    assert terms(row["id"]) == keys("Aylin moved to Izmir")
    db.execute("UPDATE engine.companion_memories SET superseded_at = now(), superseded_reason = 'edited'"
               " WHERE id = %s", (row["id"],))
    assert terms(row["id"]) == set()
    db.execute("UPDATE engine.companion_memories SET superseded_at = NULL, superseded_reason = NULL WHERE id = %s",
               (row["id"],))
    assert terms(row["id"]) == keys("Aylin moved to Izmir")
    profile = insert(db, "alice", "likes flat whites", random_vector(rng))
    assert terms(profile["id"]) == set()
    db.execute("DELETE FROM engine.companion_memories WHERE id = %s", (row["id"],))
    assert terms(row["id"]) == set()
    assert db.execute("SELECT count(*) AS n FROM engine.relationship_terms").fetchone()["n"] == 0


def test_the_terms_migration_can_run_again_and_then_changes_nothing(db):
    """docs/DEPLOY.md has a large database run migration 0027 beforehand, in one transaction: the deploy's run of it
    then finds the table filled and leaves it as it is (no row twice)."""
    from eros.migrate import migration_files

    rng = random.Random(33)
    instance = instance_for(db, "alice")
    utterances(db, "alice", instance, 20, rng, random_vector(rng))

    def snapshot() -> list[tuple]:
        return [tuple(r.values()) for r in db.execute(
            "SELECT term_key, created_at, memory_id, user_id FROM engine.relationship_terms"
            " ORDER BY term_key, memory_id").fetchall()]

    before = snapshot()
    assert len(before) >= 20 * 4
    [(_, sql)] = [(name, sql) for name, sql in migration_files() if name.startswith("0027_")]
    db.execute(sql)
    assert snapshot() == before


def test_episodes_of_any_age_are_scored(db):
    """An episode older than the whole window, nearest to the query, is recalled first; an old utterance as near
    as it is not (it is beyond the window and shares no word with the message)."""
    rng = random.Random(30)
    query = random_vector(rng)
    instance = instance_for(db, "alice")
    ep = episode(db, "alice", instance, "we planned her trip together", near(query, rng, 0.2), age_days=700)
    buried = insert(db, "alice", "an old remark", near(query, rng, 0.2), category=None, instance=instance,
                    age_days=700)
    for i in range(70):
        episode(db, "alice", instance, f"an evening of small talk {i}", random_vector(rng), age_days=690 - i)
    utterances(db, "alice", instance, 80, rng, query)
    got = relationship(db, BOUNDED, "alice", instance, query, k=5, message="the trip")
    assert got[0]["id"] == ep["id"]
    assert buried["id"] not in {r["id"] for r in got}
    assert {r["id"] for r in relationship(db, UNBOUNDED, "alice", instance, query, k=2)} == {ep["id"], buried["id"]}


def test_an_imported_history_keeps_its_old_facts_reachable(db):
    """A year of utterances imported at once: no episodes yet. Facts said long ago are still found by the words
    that name them, each beyond the window."""
    rng = random.Random(31)
    query = random_vector(rng)
    instance = instance_for(db, "alice")
    facts = {"Oksana": "my sister Oksana lives in Wien", "1987": "I was born in 1987",
             "Kobe": "my dog is called Kobe"}
    spoken = [f"day {i}: nothing special happened at work" for i in range(300)]
    for place, text in zip((10, 120, 200), facts.values(), strict=True):
        spoken[place] = text
    rows = utterances(db, "alice", instance, len(spoken), rng, query, text=lambda i: spoken[i])
    ids = {r["content"]: r["id"] for r in rows}
    knobs = replace(BOUNDED, lexical_weight=0.5)  # above the random vectors' spread of similarity
    for word, text in facts.items():
        got = relationship(db, knobs, "alice", instance, query, message=f"do you remember {word}?")
        assert got[0]["id"] == ids[text], word


def test_signs_are_the_embedding_s_sign_bits_and_a_row_without_them_is_still_recalled(db):
    rng = random.Random(32)
    vector = random_vector(rng)
    row = insert(db, "alice", "a fact", vector)
    signs = db.execute("SELECT signs::text FROM engine.companion_memories WHERE id = %s", (row["id"],)).fetchone()
    assert signs["signs"] == "".join("1" if x > 0 else "0" for x in vector)
    db.execute("UPDATE engine.companion_memories SET embedding = %s WHERE id = %s",
               (str([-x for x in vector]), row["id"]))  # an edited vector: the trigger fills its bits again
    flipped = db.execute("SELECT signs::text FROM engine.companion_memories WHERE id = %s", (row["id"],)).fetchone()
    assert flipped["signs"] == "".join("0" if x > 0 else "1" for x in vector)
    # A row the backfill has not reached yet: recall ranks by the vector itself (migration 0025), so it is
    # recalled as any other.
    db.execute("ALTER TABLE engine.companion_memories DISABLE TRIGGER companion_memories_fill_signs")
    try:
        unfilled = insert(db, "alice", "written before the migration", near(vector, rng, 0.05))
    finally:
        db.execute("ALTER TABLE engine.companion_memories ENABLE TRIGGER companion_memories_fill_signs")
    assert db.execute("SELECT signs FROM engine.companion_memories WHERE id = %s",
                      (unfilled["id"],)).fetchone()["signs"] is None
    for i in range(80):
        insert(db, "alice", f"filler {i}", random_vector(rng))
    got = recall_store.ranked(MemoryLayer.PROFILE, BOUNDED, "alice", vector, k=3, cap=None, now=NOW)
    assert unfilled["id"] in {r["id"] for r in got}


def test_a_profile_larger_than_the_pool_keeps_its_nearest_rows(db):
    """300 profile rows, a pool of 60: the rows near the query (spread over the ages) come back, as the exact scan
    ranks them."""
    rng = random.Random(33)
    query = random_vector(rng)
    nearest = [insert(db, "alice", f"close {i}", near(query, rng, 0.3 + 0.1 * i), age_days=30 * i) for i in range(5)]
    for i in range(295):
        insert(db, "alice", f"unrelated {i}", random_vector(rng), age_days=rng.uniform(0, 900))
    got = recall_store.ranked(MemoryLayer.PROFILE, BOUNDED, "alice", query, k=5, cap=None, now=NOW)
    exact = recall_store.ranked(MemoryLayer.PROFILE, UNBOUNDED, "alice", query, k=5, cap=None, now=NOW)
    assert [r["id"] for r in got] == [r["id"] for r in exact] == [r["id"] for r in nearest]


@pytest.mark.parametrize("size", [40, 301])
@pytest.mark.parametrize("strategy", ["grouped", "recency", "composite"])
def test_a_small_and_a_large_profile_rank_as_the_brute_force(db, size, strategy):
    """A profile of at most 300 rows is read from the table by key, a larger one from the covering index one
    category at a time (recall.sql, `sized` and `profile`), each category's best cap + pool by the score without
    its lexical part and demotion: with neither in play, either read ranks as the brute force over every row,
    per-category caps included."""
    rng = random.Random(34)
    query = random_vector(rng)
    categories = ("fact", "preference", "event", "emotion", "relation")
    rows = [insert(db, "alice", f"row {i}", near(query, rng, rng.uniform(0.3, 3.0)), category=categories[i % 5],
                   importance=rng.random(), age_days=rng.uniform(0, 700)) for i in range(size)]
    knobs = replace(BOUNDED, strategy=strategy, lam=0.2, tau_days=60, per_category=2, pool=8)
    k, cap = (10, 2) if strategy == "grouped" else (12, 3)
    got = recall_store.ranked(MemoryLayer.PROFILE, knobs, "alice", query, k=k, cap=cap, now=NOW)
    assert [r["id"] for r in got] == [i for i, _ in brute_force(rows, query, strategy, knobs, k, cap, demote=False)]


@pytest.mark.parametrize("changes,message", [
    ({"utterance_window": 10}, r"RECALL_UTTERANCE_WINDOW must be 0 \(no bound\) or at least 50"),
    ({"utterance_window": -1}, "utterance_window"),
    ({"utterance_window": 1_000_000}, "utterance_window"),
    ({"pool": -1}, "pool"),
    ({"lexical_pool": -5}, "lexical_pool"),
])
def test_bad_bounds_are_refused_by_the_configuration(changes, message):
    with pytest.raises(ValidationError, match=message):
        RecallKnobs(**changes)


def test_the_bounds_read_from_the_environment(monkeypatch):
    fields = {"RECALL_UTTERANCE_WINDOW": "0", "RECALL_POOL": "300", "RECALL_LEXICAL_POOL": "0"}
    knobs = RecallKnobs.model_validate(fields)
    assert (knobs.utterance_window, knobs.pool, knobs.lexical_pool) == (0, 300, 0)


def test_extraction_s_candidate_search_shortlists_by_signs_and_ranks_exactly(db, monkeypatch):
    """The known memories a session touches (store.dreaming.touched_memories) from 400 profile rows with a
    shortlist of 50 per turn: the nearest rows to the session's turn, in exact order."""
    from eros.store import dreaming

    rng = random.Random(34)
    instance = instance_for(db, "alice")
    session = db.execute("INSERT INTO engine.chat_sessions (user_id, instance_id) VALUES ('alice', %s) RETURNING id",
                         (instance,)).fetchone()["id"]
    turn = random_vector(rng)
    said = insert(db, "alice", "what I said", turn, category=None, instance=instance)
    db.execute("UPDATE engine.companion_memories SET session_id = %s, from_message_id = 1, through_message_id = 1"
               " WHERE id = %s", (session, said["id"]))
    nearest = [insert(db, "alice", f"close {i}", near(turn, rng, 0.4 + 0.15 * i)) for i in range(5)]
    for i in range(395):
        insert(db, "alice", f"unrelated {i}", random_vector(rng))
    monkeypatch.setattr(dreaming, "TOUCHED_SHORTLIST", 50)
    got = dreaming.touched_memories("alice", session, None, 5)
    assert [r["id"] for r in got] == [r["id"] for r in nearest]


@pytest.mark.parametrize("strategy", ["grouped", "recency", "composite"])
def test_a_history_within_the_bound_is_recalled_as_the_exact_scan(db, strategy):
    """What tests/test_recall.py's and tests/test_lexical_recall.py's brute-force rankings rely on: a user whose
    rows all fit in the bound (at most the window's utterances, at most the pool's candidates per layer) gets
    exactly the exact scan, rows, order and scores, message and episodes included."""
    rng = random.Random(35)
    query = random_vector(rng)
    instance = instance_for(db, "alice")
    for i in range(150):
        insert(db, "alice", f"profile {i} about Lisbon" if i % 9 == 0 else f"profile {i}",
               near(query, rng, rng.uniform(0.6, 3.0)), category=("fact", "event", "relation")[i % 3],
               importance=round(rng.random(), 3), age_days=rng.uniform(0, 900))
    for i in range(40):
        insert(db, "alice", f"said {i} in Lisbon" if i % 7 == 0 else f"said {i}",
               near(query, rng, rng.uniform(0.6, 3.0)), category=None, instance=instance, age_days=400 - i)
    for i in range(5):
        episode(db, "alice", instance, f"episode {i}", near(query, rng, 1.0), age_days=300 - i)
    knobs = RecallKnobs(strategy=strategy)
    assert knobs.utterance_window >= 45  # the window holds all of it, and k + pool every row of a layer
    for layer in (MemoryLayer.PROFILE, MemoryLayer.RELATIONSHIP):
        bounded, exact = (recall_store.ranked(layer, chosen, "alice", query, k=200, cap=None, instance_id=instance,
                                              message="back in Lisbon", now=NOW)
                          for chosen in (knobs, replace(knobs, utterance_window=0)))
        assert [(r["id"], r["score"]) for r in bounded] == [(r["id"], r["score"]) for r in exact]
        assert any(r["lexical_term"] > 0 for r in bounded)
