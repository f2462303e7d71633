"""The chat turn recalls through eros.recall: the configured strategy, both layers, no repeats."""

from __future__ import annotations

import pytest
from pgvector import Vector

from eros import chat
from eros.config import Settings
from eros.providers.offline import hash_embed
from eros.recall import RecallParams
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
    profile = [m["id"] for m in first.recalled if m["layer"] == "profile"]
    assert set(profile) == {str(tokyo), str(mocha)}
    assert not [m for m in first.recalled if m["layer"] == "relationship"]  # nothing said before

    # The message repeats a profile memory word for word; the first turn's utterance is in the
    # history: neither is injected again. A new utterance of the same session is.
    remember(db, "alice", "Has a sister in Osaka", "relation")
    second = chat.take_turn("alice", session["id"], "lives in Tokyo with her cat!", "t2")
    recalled_ids = {m["id"] for m in second.recalled}
    assert str(tokyo) not in recalled_ids and str(mocha) in recalled_ids
    assert [m["layer"] for m in second.recalled].count("relationship") == 0  # "I walked..." is in the history


def test_the_configured_parameters_reach_recall(env):
    env(RECALL_STRATEGY="composite", RECALL_TOP_K="6", RECALL_CATEGORY_CAP="2", RECALL_DECAY_TAU_DAYS="45",
        RECALL_DECAY_FLOOR="0.4", RECALL_IMPORTANCE_FLOOR="0.7", RECALL_DECAY_LAMBDA="0.03",
        RECALL_DEDUPE_SIMILARITY="0.9", RELATIONSHIP_TOP_K="3", RECALL_IMPORTANCE_WEIGHT="0.04",
        RECALL_DEMOTE_SIMILARITY="1.5", RECALL_DEMOTE_PENALTY="0.2", RECALL_DEMOTE_POOL="12")
    from eros.config import settings

    assert RecallParams.from_settings(settings()) == RecallParams(
        strategy="composite", per_category=2, top_k=6, category_cap=2, relationship_top_k=3, lam=0.03,
        tau_days=45.0, floor=0.4, importance_floor=0.7, dedupe_similarity=0.9, importance_weight=0.04,
        demote_similarity=1.5, demote_penalty=0.2, demote_pool=12)


def test_bad_recall_settings_are_rejected():
    for bad in ({"recall_strategy": "newest"}, {"recall_decay_tau_days": 0}, {"recall_decay_floor": 1.5},
                {"recall_top_k": 0}, {"recall_importance_weight": -0.01}, {"recall_importance_weight": 1.5},
                {"recall_demote_similarity": 0}, {"recall_demote_similarity": 2.5},
                {"recall_demote_penalty": -0.1}, {"recall_demote_penalty": 2}, {"recall_demote_pool": 0},
                {"recall_demote_pool": 500}):
        with pytest.raises(ValueError):
            Settings.from_env({}, **bad)
    # The edges are allowed: demotion off (threshold above 1, or no penalty), no importance term.
    edge = Settings.from_env({}, recall_demote_similarity=2, recall_demote_penalty=0, recall_importance_weight=0,
                             recall_demote_pool=200)
    assert (edge.recall_demote_similarity, edge.recall_demote_penalty, edge.recall_importance_weight) == (2, 0, 0)


def test_recall_params_defaults_are_the_settings_defaults():
    assert RecallParams() == RecallParams.from_settings(Settings())
