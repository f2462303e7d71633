"""The chat turn recalls through eros.recall: the configured strategy, both layers, no repeats."""

from __future__ import annotations

import pytest
from pgvector import Vector

from eros import chat
from eros.config import RecallKnobs, Settings
from eros.providers.offline import hash_embed
from eros.store import chat as chat_store


def remember(db, user, content, category="fact", importance=0.8):
    return db.execute("INSERT INTO engine.companion_memories (user_id, content, embedding, category, importance)"
                      " VALUES (%s, %s, %s, %s, %s) RETURNING id",
                      (user, content, Vector(hash_embed(content)), category, importance)).fetchone()["id"]


@pytest.mark.parametrize("strategy", ["grouped", "recency", "composite"])
def test_a_turn_recalls_profile_and_relationship_without_repeats(db, env, strategy):
    env(RECALL_STRATEGY=strategy)
    tokyo = remember(db, "alice", "Lives in Tokyo with her cat")
    mocha = remember(db, "alice", "Likes mocha in Tokyo cafes", "preference", None)
    remember(db, "bob", "Lives in Tokyo too")  # someone else's
    session = chat_store.create_session("alice", "luna")

    first = chat.take_turn("alice", session["id"], "I walked around Tokyo today", "t1")
    profile = [m.id for m in first.recalled if m.layer == "profile"]
    assert set(profile) == {tokyo, mocha}
    assert not [m for m in first.recalled if m.layer == "relationship"]  # nothing said before

    # The message repeats a profile memory word for word; the first turn's utterance is in the
    # history: neither is injected again. A new utterance of the same session is.
    remember(db, "alice", "Has a sister in Osaka", "relation")
    second = chat.take_turn("alice", session["id"], "lives in Tokyo with her cat!", "t2")
    recalled_ids = {m.id for m in second.recalled}
    assert tokyo not in recalled_ids and mocha in recalled_ids
    assert [m.layer for m in second.recalled].count("relationship") == 0  # "I walked..." is in the history


def test_the_configured_parameters_reach_recall(env):
    env(RECALL_STRATEGY="composite", RECALL_TOP_K="6", RECALL_CATEGORY_CAP="2", RECALL_DECAY_TAU_DAYS="45",
        RECALL_DECAY_FLOOR="0.4", RECALL_IMPORTANCE_FLOOR="0.7", RECALL_DECAY_LAMBDA="0.03",
        RECALL_DEDUPE_SIMILARITY="0.9", RELATIONSHIP_TOP_K="3", RECALL_IMPORTANCE_WEIGHT="0.04",
        RECALL_DEMOTE_SIMILARITY="1.5", RECALL_DEMOTE_PENALTY="0.2", RECALL_DEMOTE_POOL="12")
    from eros.config import settings

    assert settings().recall == RecallKnobs(
        strategy="composite", per_category=2, top_k=6, category_cap=2, relationship_top_k=3, lam=0.03,
        tau_days=45.0, floor=0.4, importance_floor=0.7, dedupe_similarity=0.9, importance_weight=0.04,
        demote_similarity=1.5, demote_penalty=0.2, demote_pool=12)


@pytest.mark.parametrize("bad", [
    {"RECALL_STRATEGY": "newest"}, {"RECALL_DECAY_TAU_DAYS": "0"}, {"RECALL_DECAY_FLOOR": "1.5"},
    {"RECALL_TOP_K": "0"}, {"RECALL_IMPORTANCE_WEIGHT": "-0.01"}, {"RECALL_IMPORTANCE_WEIGHT": "1.5"},
    {"RECALL_DEMOTE_SIMILARITY": "0"}, {"RECALL_DEMOTE_SIMILARITY": "2.5"}, {"RECALL_DEMOTE_PENALTY": "-0.1"},
    {"RECALL_DEMOTE_PENALTY": "2"}, {"RECALL_DEMOTE_POOL": "0"}, {"RECALL_DEMOTE_POOL": "500"},
    {"RELATIONSHIP_TOP_K": "many"}])
def test_bad_recall_settings_are_rejected_naming_the_variable(bad):
    with pytest.raises(ValueError) as refused:
        Settings.from_env(bad)
    assert next(iter(bad)) in str(refused.value)


def test_the_edges_of_the_recall_settings_are_allowed():
    # Demotion off (threshold above 1, or no penalty), no importance term, the largest pool.
    edge = Settings.from_env({"RECALL_DEMOTE_SIMILARITY": "2", "RECALL_DEMOTE_PENALTY": "0",
                              "RECALL_IMPORTANCE_WEIGHT": "0", "RECALL_DEMOTE_POOL": "200"}).recall
    assert (edge.demote_similarity, edge.demote_penalty, edge.importance_weight, edge.demote_pool) == (2, 0, 0, 200)
    assert not edge.demoting


def test_the_recall_defaults_are_defined_once():
    """Settings without any variable carry RecallKnobs' own defaults; the store has none of its own."""
    import inspect

    from eros.store import recall as recall_store

    assert Settings().recall == RecallKnobs() == Settings.from_env({}).recall
    defaults = [p for p in inspect.signature(recall_store.ranked).parameters.values()
                if p.default is not inspect.Parameter.empty]
    # Only what is asked (the message's text), which rows (a persona's, a date, a search's category
    # filter) and the query's model (the guard against comparing two models), never a ranking knob.
    assert [p.name for p in defaults] == ["message", "instance_id", "now", "category", "model"]
