"""Recall ranking: the math, the SQL against a brute-force ranking in Python, time injection, ties,
missing importance, empty users, single-row categories, superseded rows, the read-time demotion of an
older near row and the importance term, and cross-layer hygiene."""

from __future__ import annotations

import functools
import math
import random
import re
import uuid
from array import array
from datetime import UTC, datetime, timedelta

import pytest
from helpers import cosine
from pgvector import Vector
from psycopg.types.json import Jsonb

from eros import recall
from eros.config import RecallKnobs
from eros.memory import CATEGORIES, MemoryLayer
from eros.recall import Hygiene, normalised
from eros.store import recall as recall_store

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
DIM = 512


def f32(values: list[float]) -> list[float]:
    """The vector as the database stores it (float4)."""
    return array("f", values).tolist()


def random_vector(rng: random.Random, dim: int = DIM) -> list[float]:
    return f32([rng.gauss(0, 1) for _ in range(dim)])


def near(base: list[float], rng: random.Random, noise: float) -> list[float]:
    return f32([b + rng.gauss(0, noise) for b in base])


def insert(db, user: str, content: str, embedding: list[float], *, category: str | None = "fact",
           importance: float | None = None, age_days: float = 0.0, instance=None, metadata=None,
           memory_id: uuid.UUID | None = None, superseded_by: uuid.UUID | None = None) -> dict:
    row = db.execute(
        "INSERT INTO engine.companion_memories (id, user_id, instance_id, content, embedding, category, importance,"
        " metadata, created_at, superseded_at, superseded_by, superseded_reason)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
        " RETURNING id, content, category, importance, created_at",
        (memory_id or uuid.uuid4(), user, instance, content, Vector(embedding), category, importance,
         Jsonb(metadata or {}), NOW - timedelta(days=age_days), NOW if superseded_by else None, superseded_by,
         "changed" if superseded_by else None),
    ).fetchone()
    return row | {"embedding": embedding}


def instance_for(db, user: str) -> uuid.UUID:
    return db.execute("INSERT INTO engine.persona_instances (user_id, persona_id) VALUES (%s, 'luna') RETURNING id",
                      (user,)).fetchone()["id"]


def replace(params: RecallKnobs, **changes) -> RecallKnobs:
    """The parameters with some changed (unvalidated: a test may switch hygiene off with a threshold above 1)."""
    return params.model_copy(update=changes)


# --- brute force, written independently of the SQL ------------------------------------------------
_MAX_EXPONENT = 700.0  # the SQL clamps exp()'s argument the same way (Postgres raises on underflow)


def decay(age_days: float, tau_days: float) -> float:
    return math.exp(-min(max(age_days, 0.0) / tau_days, _MAX_EXPONENT))


def score(strategy: str, similarity: float, age_days: float, importance: float | None,
          params: RecallKnobs) -> float:
    """A row's undemoted score: the strategy's base score plus the additive importance term."""
    weight = 0.5 if importance is None else importance
    if strategy == "grouped":
        base = similarity
    elif strategy == "recency":
        base = similarity + params.lam * decay(age_days, params.tau_days)
    elif strategy == "composite":
        base = (similarity * (params.floor + (1 - params.floor) * decay(age_days, params.tau_days))
                * (params.importance_floor + (1 - params.importance_floor) * weight))
    else:
        raise ValueError(f"unknown recall strategy {strategy!r}")
    return base + params.importance_weight * weight


def brute_force(rows: list[dict], query: list[float], strategy: str, params: RecallKnobs, k: int,
                cap: int | None, now: datetime = NOW, demote: bool = True) -> list[tuple[uuid.UUID, float]]:
    """The rule as the module docstring of eros.store.recall states it. ``demote``: the layer is demoted
    (the profile layer; never the relationship layer)."""
    undemoted = []
    for r in rows:
        s = cosine(r["embedding"], query)
        age = (now - r["created_at"]).total_seconds() / 86400
        undemoted.append((score(strategy, s, age, r["importance"], params), r["id"], r))
    undemoted.sort(key=lambda t: (-t[0], t[1]))  # uuid order = Postgres uuid order (bytewise)
    on = demote and params.demote_similarity <= 1 and params.demote_penalty > 0
    pool = [r for _, _, r in undemoted[:params.demote_pool]] if on else []
    demoted = {a["id"] for a in pool
               if any(b["category"] == a["category"] and b["created_at"] > a["created_at"]
                      and cosine(a["embedding"], b["embedding"]) >= params.demote_similarity for b in pool)}
    scored = sorted(((value - (params.demote_penalty if memory_id in demoted else 0.0), memory_id, r["category"])
                     for value, memory_id, r in undemoted), key=lambda t: (-t[0], t[1]))
    out: list[tuple[uuid.UUID, float]] = []
    per_category: dict[str, int] = {}
    for value, memory_id, category in scored:
        if len(out) == k:
            break
        if cap and per_category.get(category, 0) >= cap:
            continue
        per_category[category] = per_category.get(category, 0) + 1
        out.append((memory_id, value))
    return out


def sql_rows(layer, strategy, user, query, params: RecallKnobs, k, cap, now=NOW, instance=None):
    return recall_store.ranked(MemoryLayer(layer), replace(params, strategy=strategy), user, query, k=k, cap=cap,
                               instance_id=instance, now=now)


def sql_ids(layer, strategy, user, query, params: RecallKnobs, k, cap, now=NOW, instance=None):
    return [(r["id"], r["score"]) for r in sql_rows(layer, strategy, user, query, params, k, cap, now, instance)]


# --- the math -------------------------------------------------------------------------------------

def test_decay_is_one_now_one_over_e_at_tau_and_never_underflows():
    assert decay(0, 30) == 1.0
    assert decay(30, 30) == pytest.approx(math.exp(-1))
    assert decay(-5, 30) == 1.0  # a row stamped after "now" is simply new
    assert 0 <= decay(10 ** 7, 1) < 1e-300  # clamped exponent, like the SQL


def test_score_formulas():
    p = RecallKnobs(lam=0.2, tau_days=10, floor=0.25, importance_floor=0.0, importance_weight=0.0)
    assert score("grouped", 0.7, 100, 0.9, p) == 0.7
    assert score("recency", 0.7, 10, 0.9, p) == pytest.approx(0.7 + 0.2 * math.exp(-1))
    assert score("composite", 0.7, 10, 0.9, p) == pytest.approx(0.7 * (0.25 + 0.75 * math.exp(-1)) * 0.9)
    assert score("composite", 0.7, 10, None, p) == score("composite", 0.7, 10, 0.5, p)  # missing = 0.5
    soft = RecallKnobs(tau_days=10, floor=0.25, importance_floor=0.8, importance_weight=0.0)
    assert score("composite", 0.7, 10, 0.5, soft) == pytest.approx(0.7 * (0.25 + 0.75 * math.exp(-1)) * 0.9)
    # An old fact keeps at least `floor` of its score: decay alone can never bury it.
    assert score("composite", 0.8, 10_000, 1.0, p) == pytest.approx(0.8 * 0.25)
    with pytest.raises(ValueError):
        score("nearest", 0.7, 1, 1, p)
    # The importance term is added, for every strategy, with 0.5 where importance is missing.
    w = RecallKnobs(lam=0.2, tau_days=10, floor=0.25, importance_floor=0.0, importance_weight=0.1)
    for strategy in ("grouped", "recency", "composite"):
        assert score(strategy, 0.7, 10, 0.9, w) == pytest.approx(score(strategy, 0.7, 10, 0.9, p) + 0.09)
        assert score(strategy, 0.7, 10, None, w) == pytest.approx(score(strategy, 0.7, 10, 0.5, p) + 0.05)


# --- SQL == brute force -----------------------------------------------------------------------------

@functools.cache
def population_spec() -> tuple[list[float], list[tuple[str, str, list[float], dict]]]:
    """The population's query and rows (user, content, embedding, insert options): drawn once per process
    from a fixed seed (drawing the vectors costs more than inserting them), inserted afresh by each test."""
    rng = random.Random(20260601)
    query = random_vector(rng)
    rows: list[tuple[str, str, list[float], dict]] = []
    for i in range(150):
        emb = near(query, rng, rng.uniform(0.6, 3.0))
        rows.append(("alice", f"profile {i}", emb, {
            "category": ("fact", "preference", "event", "emotion", "relation")[i % 5],
            "importance": None if i % 7 == 0 else round(rng.random(), 3), "age_days": rng.uniform(0, 1100)}))
    tie = near(query, rng, 0.8)
    for i in range(3):  # identical rows: equal scores, order by id
        rows.append(("alice", f"tie {i}", tie, {"category": "fact", "importance": 0.75, "age_days": 3}))
    for i in range(40):
        rows.append(("alice", f"utterance {i}", near(query, rng, rng.uniform(0.6, 3.0)),
                     {"category": None, "relationship": True, "age_days": rng.uniform(0, 400)}))
    for i in range(20):
        rows.append(("bob", f"bob {i}", near(query, rng, 0.1), {"category": "fact", "importance": 1.0}))
        rows.append(("bob", f"bob rel {i}", near(query, rng, 0.1), {"category": None, "relationship": True}))
    return query, rows


@pytest.fixture
def population(db):
    """One user with 150 profile rows (5 categories, some without importance, ages up to 3 years, three
    exact ties), 40 relationship rows; another user with rows right next to the query (must never leak)."""
    query, spec = population_spec()
    instances = {user: instance_for(db, user) for user in ("alice", "bob")}
    rows, rel = [], []
    for user, content, embedding, options in spec:
        options = dict(options)
        on_relationship = options.pop("relationship", False)
        row = insert(db, user, content, embedding, instance=instances[user] if on_relationship else None,
                     **options)
        if user == "alice":
            (rel if on_relationship else rows).append(row)
    return {"query": query, "profile": rows, "relationship": rel, "instance": instances["alice"]}


OFF = {"importance_weight": 0.0, "demote_similarity": 2.0}  # the ranking before the safety net
PARAMS = [
    ("grouped", RecallKnobs(**OFF), 10, 2),
    ("recency", RecallKnobs(**OFF), 10, None),
    ("composite", RecallKnobs(**OFF), 10, None),
    ("grouped", RecallKnobs(), 10, 2),
    ("grouped", RecallKnobs(), 5, 1),
    ("recency", RecallKnobs(lam=0.1, tau_days=30), 8, None),
    ("recency", RecallKnobs(lam=0.5, tau_days=7), 12, 3),
    ("composite", RecallKnobs(tau_days=30, floor=0.5), 8, None),
    ("composite", RecallKnobs(tau_days=14, floor=0.0), 10, 2),
    ("composite", RecallKnobs(tau_days=365, floor=0.9), 153, None),  # every row: the full order
    ("composite", RecallKnobs(tau_days=60, floor=0.6, importance_floor=0.8), 9, 2),
    # Demotion that fires: the population's rows are ~0.5-0.75 cosine-similar to each other.
    ("grouped", RecallKnobs(demote_similarity=0.6, demote_penalty=0.1, demote_pool=40), 10, 2),
    ("recency", RecallKnobs(lam=0.1, tau_days=30, demote_similarity=0.6, demote_penalty=0.05,
                             demote_pool=25, importance_weight=0.05), 12, None),
    ("recency", RecallKnobs(demote_similarity=0.55, demote_penalty=0.3, demote_pool=8), 12, 3),  # pool < k
    ("composite", RecallKnobs(tau_days=60, floor=0.6, importance_floor=0.8, demote_similarity=0.6,
                               demote_penalty=0.08, demote_pool=200, importance_weight=0.1), 153, None),
]


@pytest.mark.parametrize("strategy,params,k,cap", PARAMS)
def test_sql_top_k_equals_brute_force(population, strategy, params, k, cap):
    q = population["query"]
    got = sql_ids("profile", strategy, "alice", q, params, k, cap)
    want = brute_force(population["profile"], q, strategy, params, k, cap)
    # pgvector sums in float4: scores agree to ~1e-6, and the data has no near-ties that close
    # apart from the exact ties (which both sides break by id).
    assert [i for i, _ in got] == [i for i, _ in want]
    for (_, a), (_, b) in zip(got, want, strict=True):
        assert a == pytest.approx(b, abs=1e-5)
    assert all(row_id in {r["id"] for r in population["profile"]} for row_id, _ in got)  # never bob's


def test_demotion_fires_in_the_population_and_the_score_parts_add_up(population):
    """The brute-force comparison above is only worth something if demotion changes the order there."""
    q = population["query"]
    params = RecallKnobs(strategy="recency", lam=0.1, tau_days=30, demote_similarity=0.6, demote_penalty=0.05,
                          demote_pool=25, importance_weight=0.05)
    on = brute_force(population["profile"], q, "recency", params, 12, None)
    off = brute_force(population["profile"], q, "recency", params, 12, None, demote=False)
    assert [i for i, _ in on] != [i for i, _ in off]
    for strategy in ("grouped", "recency", "composite"):
        rows = sql_rows("profile", strategy, "alice", q, replace(params, floor=0.6, importance_floor=0.8), 153, None)
        assert {r["demotion"] for r in rows} == {0.0, 0.05}
        assert sum(r["demotion"] > 0 for r in rows) <= 25  # only pool rows
        for r in rows:
            assert r["similarity"] == pytest.approx(1 - r["distance"])
            assert r["score"] == pytest.approx(r["similarity"] + r["recency_term"] + r["importance_term"]
                                               - r["demotion"], abs=1e-12)
            if strategy == "grouped":
                assert r["recency_term"] == 0
            if strategy != "composite":
                assert r["importance_term"] == pytest.approx(0.05 * (0.5 if r["importance"] is None
                                                                     else r["importance"]))


@pytest.mark.parametrize("strategy", ["grouped", "recency", "composite"])
def test_relationship_layer_equals_brute_force(population, strategy):
    params = RecallKnobs(lam=0.2, tau_days=20, floor=0.3, demote_similarity=0.5, demote_penalty=0.2)
    rows = sql_rows("relationship", strategy, "alice", population["query"], params, 7, None,
                    instance=population["instance"])
    want = brute_force(population["relationship"], population["query"], strategy, params, 7, None, demote=False)
    assert [r["id"] for r in rows] == [i for i, _ in want]
    assert all(r["demotion"] == 0 for r in rows)  # raw utterances: never demoted


def test_exact_ties_are_broken_by_id(db):
    rng = random.Random(1)
    q = random_vector(rng)
    same = near(q, rng, 1.0)
    ids = sorted(uuid.uuid4() for _ in range(6))
    for memory_id in reversed(ids):  # inserted in the opposite order
        insert(db, "alice", f"same {memory_id}", same, importance=0.5, age_days=2, memory_id=memory_id)
    for strategy in ("grouped", "recency", "composite"):
        got = sql_ids("profile", strategy, "alice", q, RecallKnobs(), 4, None)
        assert [i for i, _ in got] == ids[:4]
        assert len({s for _, s in got}) == 1  # and identical rows of one age never demote each other


def test_missing_importance_counts_as_half(db):
    rng = random.Random(2)
    q = random_vector(rng)
    emb = near(q, rng, 1.0)
    low = insert(db, "alice", "low", emb, importance=0.25, age_days=1)
    none = insert(db, "alice", "none", emb, importance=None, age_days=1)
    half = insert(db, "alice", "half", emb, importance=0.5, age_days=1)
    high = insert(db, "alice", "high", emb, importance=0.75, age_days=1)
    got = sql_ids("profile", "composite", "alice", q, RecallKnobs(importance_weight=0.0), 10, None)
    middle = sorted([none["id"], half["id"]])
    assert [i for i, _ in got] == [high["id"], *middle, low["id"]]
    assert got[1][1] == got[2][1]


def test_a_user_with_no_memories_gets_nothing(db):
    rng = random.Random(3)
    q = random_vector(rng)
    insert(db, "bob", "bob's fact", q, importance=1.0)
    for strategy in ("grouped", "recency", "composite"):
        params = RecallKnobs(strategy=strategy)
        result = recall.recall("alice", instance_for(db, f"alice-{strategy}"), q, knobs=params, now=NOW)
        assert result.profile == [] and result.relationship == []


def test_a_category_with_one_row(db):
    rng = random.Random(4)
    q = random_vector(rng)
    lonely = insert(db, "alice", "the only emotion", near(q, rng, 2.5), category="emotion", importance=0.1)
    for i in range(4):
        insert(db, "alice", f"fact {i}", near(q, rng, 0.5), category="fact", importance=0.9)
    grouped = recall.recall("alice", None, q, knobs=RecallKnobs(strategy="grouped", per_category=2), now=NOW)
    assert [m["category"] for m in grouped.profile].count("fact") == 2
    assert lonely["id"] in {m["id"] for m in grouped.profile}
    assert len(grouped.profile) == 3
    capped = recall.recall("alice", None, q, now=NOW,
                           knobs=RecallKnobs(strategy="composite", top_k=5, category_cap=2))
    assert sorted(m["category"] for m in capped.profile) == ["emotion", "fact", "fact"]  # cap 2; nothing else exists
    assert capped.profile[-1]["id"] == lonely["id"]


def test_every_category_the_schema_allows_is_recalled(db):
    """Recall reads the profile one category at a time from a written-out list (recall.sql, `categories`): it is
    the schema's CHECK and eros.memory.CATEGORIES, so a category added to one and not the other is never silently
    left out of every prompt."""
    check = db.execute("SELECT pg_get_constraintdef(oid) AS d FROM pg_constraint"
                       " WHERE conrelid = 'engine.companion_memories'::regclass AND contype = 'c'"
                       " AND pg_get_constraintdef(oid) LIKE '%%category%%'").fetchone()["d"]
    assert sorted(re.findall(r"'(\w+)'::text", check)) == sorted(CATEGORIES)
    rng = random.Random(41)
    q = random_vector(rng)
    rows = {c: insert(db, "alice", f"the one {c}", near(q, rng, 3.0), category=c) for c in CATEGORIES}
    result = recall.recall("alice", None, q, knobs=RecallKnobs(strategy="grouped", per_category=1), now=NOW)
    assert {m["id"] for m in result.profile} == {r["id"] for r in rows.values()}
    for category, row in rows.items():  # and a search's filter by each
        only = recall_store.ranked(MemoryLayer.PROFILE, RecallKnobs(), "alice", q, k=5, cap=None, now=NOW,
                                   category=category)
        assert [m["id"] for m in only] == [row["id"]]


# --- time ------------------------------------------------------------------------------------------

def test_now_is_injectable_and_rows_from_the_future_do_not_exist_yet(db):
    rng = random.Random(5)
    q = random_vector(rng)
    shanghai = insert(db, "alice", "lives in Shanghai", near(q, rng, 0.9), importance=0.8, age_days=400)
    tokyo = insert(db, "alice", "moved to Tokyo", near(q, rng, 0.9), importance=0.8, age_days=7)
    params = RecallKnobs(strategy="recency", lam=1.0, tau_days=30, top_k=5)
    today = recall.recall("alice", None, q, knobs=params, now=NOW)
    assert today.profile[0]["id"] == tokyo["id"]
    before_the_move = recall.recall("alice", None, q, knobs=params, now=NOW - timedelta(days=30))
    assert [m["id"] for m in before_the_move.profile] == [shanghai["id"]]
    # The decay is measured from the injected now: 30 days earlier, Shanghai was 370 days old.
    row = before_the_move.profile[0]
    assert row["decay"] == pytest.approx(math.exp(-370 / 30), rel=1e-9)
    # Without an injected now, the database's clock: both rows exist.
    assert {m["id"] for m in recall.recall("alice", None, q, knobs=params).profile} == {shanghai["id"], tokyo["id"]}


def test_a_very_old_row_is_still_recalled_not_an_underflow_error(db):
    rng = random.Random(6)
    q = random_vector(rng)
    ancient = insert(db, "alice", "has a daughter", near(q, rng, 0.5), importance=1.0, age_days=20 * 365)
    for strategy in ("recency", "composite"):
        got = recall.recall("alice", None, q, now=NOW,
                            knobs=RecallKnobs(strategy=strategy, tau_days=1, floor=0.3))
        assert [m["id"] for m in got.profile] == [ancient["id"]]
        assert got.profile[0]["decay"] == 0 or got.profile[0]["decay"] < 1e-300


def test_the_floor_keeps_an_old_true_fact_above_a_fresh_irrelevant_one(db):
    """'has a daughter', said three years ago, must beat fresh trivia that is far less similar."""
    rng = random.Random(7)
    q = random_vector(rng)
    daughter = insert(db, "alice", "has a daughter", near(q, rng, 0.4), importance=0.9, age_days=3 * 365)
    trivia = insert(db, "alice", "had noodles", near(q, rng, 3.0), importance=0.3, age_days=0)
    assert cosine(daughter["embedding"], q) > 0.8 > 0.4 > cosine(trivia["embedding"], q)
    defaults = recall.settings().recall
    for strategy in ("grouped", "recency", "composite"):
        got = recall.recall("alice", None, q, now=NOW, knobs=replace(defaults, strategy=strategy))
        assert got.profile[0]["id"] == daughter["id"], strategy


# --- what is recalled at all --------------------------------------------------------------------------

def test_superseded_and_uncategorised_profile_rows_are_not_recalled(db):
    rng = random.Random(8)
    q = random_vector(rng)
    current = insert(db, "alice", "works at a bank", near(q, rng, 1.0), age_days=5)
    insert(db, "alice", "works at a school", near(q, rng, 0.2), age_days=300, superseded_by=current["id"])
    insert(db, "alice", "raw turn dump", near(q, rng, 0.2), category=None)
    instance = instance_for(db, "alice")
    old = insert(db, "alice", "old utterance", near(q, rng, 1.0), category=None, instance=instance)
    insert(db, "alice", "older utterance", near(q, rng, 0.2), category=None, instance=instance,
           superseded_by=old["id"])
    kept_rel = insert(db, "alice", "an utterance", near(q, rng, 1.0), category=None, instance=instance)
    for strategy in ("grouped", "recency", "composite"):
        got = recall.recall("alice", instance, q, now=NOW, knobs=RecallKnobs(strategy=strategy))
        assert [m["id"] for m in got.profile] == [current["id"]]
        assert {m["id"] for m in got.relationship} == {kept_rel["id"], old["id"]}


def test_relationship_rows_stay_with_their_persona_instance(db):
    rng = random.Random(9)
    q = random_vector(rng)
    mine, theirs = instance_for(db, "alice"), instance_for(db, "alice2")
    other_persona = db.execute("INSERT INTO engine.persona_instances (user_id, persona_id) VALUES ('alice', 'kai')"
                               " RETURNING id").fetchone()["id"]
    kept = insert(db, "alice", "said to luna", near(q, rng, 1.0), category=None, instance=mine)
    insert(db, "alice", "said to kai", near(q, rng, 0.1), category=None, instance=other_persona)
    insert(db, "alice2", "someone else", near(q, rng, 0.1), category=None, instance=theirs)
    got = recall.recall("alice", mine, q, now=NOW, knobs=RecallKnobs(strategy="composite"))
    assert [m["id"] for m in got.relationship] == [kept["id"]]
    assert recall.recall("alice", None, q, now=NOW).relationship == []


# --- the read-time safety net: demotion and importance ------------------------------------------------

def plane(*coords: float) -> list[float]:
    """A unit vector in the first few dimensions: cosines chosen exactly, as angles."""
    norm = math.sqrt(sum(c * c for c in coords))
    return f32([c / norm for c in coords] + [0.0] * (DIM - len(coords)))


def at_angle(degrees: float, axis: int = 1) -> list[float]:
    """cos(degrees) to the query e0, turned towards e<axis>."""
    coords = [0.0] * 4
    coords[0], coords[axis] = math.cos(math.radians(degrees)), math.sin(math.radians(degrees))
    return plane(*coords)


QUERY = plane(1.0)
SAFETY = RecallKnobs(strategy="recency", lam=0.002, tau_days=365, importance_weight=0.0, demote_similarity=0.9,
                      demote_penalty=0.2, demote_pool=32)


def profile_of(got) -> list[uuid.UUID]:
    return [m["id"] for m in got.profile]


def test_an_older_near_row_of_the_same_category_is_demoted_below_the_newer_one(db):
    # Shanghai is nearer the question (cos 0.94) than Tokyo (0.77); they are 20 degrees apart (cos 0.94:
    # close enough to demote, not so close that hygiene takes them for one row).
    shanghai = insert(db, "alice", "Lives in Shanghai", at_angle(20), category="fact", importance=0.7, age_days=300)
    tokyo = insert(db, "alice", "Moved to Tokyo recently", at_angle(40), category="fact", importance=0.7,
                   age_days=10)
    other = insert(db, "alice", "Likes mocha", at_angle(60, axis=2), category="preference", importance=0.7,
                   age_days=400)
    off = recall.recall("alice", None, QUERY, now=NOW, knobs=replace(SAFETY, demote_similarity=2.0))
    assert profile_of(off) == [shanghai["id"], tokyo["id"], other["id"]]
    on = recall.recall("alice", None, QUERY, now=NOW, knobs=SAFETY)
    assert profile_of(on) == [tokyo["id"], shanghai["id"], other["id"]]  # demoted, still there
    by_id = {m["id"]: m for m in on.profile}
    assert by_id[shanghai["id"]]["demotion"] == pytest.approx(0.2)
    assert by_id[tokyo["id"]]["demotion"] == 0 and by_id[other["id"]]["demotion"] == 0
    # Asked before the move, Tokyo did not exist yet: nothing newer, nothing demoted.
    before = recall.recall("alice", None, QUERY, now=NOW - timedelta(days=30), knobs=SAFETY)
    assert profile_of(before) == [shanghai["id"], other["id"]] and before.profile[0]["demotion"] == 0
    # A newer row that consolidation already superseded is history: it demotes nothing.
    db.execute("UPDATE engine.companion_memories SET superseded_at = %s, superseded_reason = 'changed'"
               " WHERE id = %s", (NOW, tokyo["id"]))
    assert recall.recall("alice", None, QUERY, now=NOW, knobs=SAFETY).profile[0]["demotion"] == 0


def test_a_near_row_of_another_category_does_not_demote(db):
    daughter = insert(db, "alice", "Has a daughter, Mia", at_angle(20), category="relation", importance=0.9,
                      age_days=700)
    school = insert(db, "alice", "Mia started school this week", at_angle(40), category="event", importance=0.6,
                    age_days=3)
    got = recall.recall("alice", None, QUERY, now=NOW, knobs=SAFETY)
    assert profile_of(got) == [daughter["id"], school["id"]]
    assert all(m["demotion"] == 0 for m in got.profile)


def test_a_stable_old_fact_with_no_newer_close_row_is_not_buried_by_the_defaults(db):
    """'Has a daughter', said years ago, under many newer rows of its category that are not about it."""
    daughter = insert(db, "alice", "Has a daughter, Lily", at_angle(10), category="relation", importance=0.9,
                      age_days=900)
    newer = [insert(db, "alice", f"friend {i}", plane(math.cos(math.radians(40)), 0, math.sin(math.radians(40)) *
                                                     math.cos(i), math.sin(math.radians(40)) * math.sin(i)),
                    category="relation", importance=0.9, age_days=i + 1) for i in range(8)]
    assert all(cosine(daughter["embedding"], n["embedding"]) < 0.76 for n in newer)
    play = insert(db, "alice", "Daughter's school play is Friday", at_angle(32), category="event", importance=0.5,
                  age_days=1)  # close (cos 0.93), newer, but another category
    assert cosine(daughter["embedding"], play["embedding"]) > 0.92
    defaults = recall.settings().recall
    assert defaults.demote_similarity > 0.76 and defaults.demote_penalty > 0
    for strategy in ("grouped", "recency", "composite"):
        got = recall.recall("alice", None, QUERY, now=NOW, knobs=replace(defaults, strategy=strategy))
        assert got.profile[0]["id"] == daughter["id"] and got.profile[0]["demotion"] == 0, strategy


def test_a_row_outside_the_pool_is_not_compared(db):
    """The pairwise check is bounded: only the pool's best rows are compared with each other."""
    old = insert(db, "alice", "Works at a bank", at_angle(60), category="fact", importance=0.5, age_days=300)
    new = insert(db, "alice", "Works at a school", at_angle(65), category="fact", importance=0.5, age_days=5)
    for i in range(3):  # better rows that fill a pool of 3
        insert(db, "alice", f"close {i}", at_angle(10 + i, axis=2), category="preference", importance=0.5)
    small = recall.recall("alice", None, QUERY, now=NOW, knobs=replace(SAFETY, demote_pool=3, dedupe_similarity=2))
    assert {m["id"]: m["demotion"] for m in small.profile}[old["id"]] == 0
    assert profile_of(small)[-2:] == [old["id"], new["id"]]
    large = recall.recall("alice", None, QUERY, now=NOW, knobs=replace(SAFETY, demote_pool=5, dedupe_similarity=2))
    assert {m["id"]: m["demotion"] for m in large.profile}[old["id"]] == pytest.approx(0.2)
    assert profile_of(large)[-2:] == [new["id"], old["id"]]


def test_importance_breaks_a_tie(db):
    same = at_angle(30)
    low_id, high_id = sorted(uuid.uuid4() for _ in range(2))  # without importance, low would win the tie on id
    low = insert(db, "alice", "Mother likes gardening", same, category="relation", importance=0.2, age_days=20,
                 memory_id=low_id)
    high = insert(db, "alice", "Mother keeps pushing her to marry", same, category="relation", importance=0.9,
                  age_days=20, memory_id=high_id)
    for strategy in ("grouped", "recency"):
        plain = recall.recall("alice", None, QUERY, now=NOW,
                              knobs=replace(SAFETY, strategy=strategy, importance_weight=0.0, dedupe_similarity=2))
        assert profile_of(plain) == [low["id"], high["id"]]
        weighted = recall.recall("alice", None, QUERY, now=NOW,
                                 knobs=replace(SAFETY, strategy=strategy, importance_weight=0.02,
                                                dedupe_similarity=2))
        assert profile_of(weighted) == [high["id"], low["id"]]
        top = weighted.profile[0]
        assert top["importance_term"] == pytest.approx(0.02 * 0.9)
        assert top["score"] - weighted.profile[1]["score"] == pytest.approx(0.02 * 0.7)


# --- hygiene ------------------------------------------------------------------------------------------

def test_normalised_folds_case_punctuation_and_space():
    assert normalised("  I moved to TOKYO!! ") == normalised("i moved, to tokyo") == "i moved to tokyo"
    assert normalised("我搬到东京了！") == normalised("我搬到东京了")


def with_near(rows: list[dict], similarity: float) -> list[dict]:
    """The rows as the recall SQL gives them to hygiene: each with ``near``, the ids of the rows before it
    (in this order) at least ``similarity`` cosine-similar to it."""
    return [r | {"near": [b["id"] for b in rows[:i] if cosine(b["embedding"], r["embedding"]) >= similarity]}
            for i, r in enumerate(rows)]


def test_hygiene_drops_repeats_of_history_across_layers_and_near_identical_embeddings():
    rng = random.Random(10)
    base = random_vector(rng)
    other = random_vector(rng)
    profile = [
        {"id": 1, "content": "Lives in Tokyo", "category": "fact", "embedding": base},
        {"id": 2, "content": "lives in tokyo.", "category": "fact", "embedding": other},  # same text
        {"id": 3, "content": "Lives in Tokyo now", "category": "fact", "embedding": near(base, rng, 0.05)},
        {"id": 4, "content": "likes mocha", "category": "preference", "embedding": other},
        {"id": 5, "content": "what I said a minute ago", "category": "event", "embedding": random_vector(rng)},
    ]
    relationship = [
        {"id": 6, "content": "LIVES IN TOKYO", "category": None, "embedding": random_vector(rng)},
        {"id": 7, "content": "something new", "category": None, "embedding": random_vector(rng)},
        {"id": 8, "content": "the message itself", "category": None, "embedding": random_vector(rng)},
        {"id": 9, "content": "I live in Tokyo now", "category": None, "embedding": near(base, rng, 0.05)},
    ]
    assert cosine(profile[2]["embedding"], base) > 0.95
    rows = with_near(profile + relationship, 0.95)
    assert rows[3]["near"] == [2]  # 4 repeats 2's embedding, but 2 is dropped (its text): 4 is kept
    hygiene = Hygiene(["What I said a minute ago!", "the message itself"])
    kept_profile = hygiene.take(rows[:5], 10)
    kept_rel = hygiene.take(rows[5:], 10)
    assert [m["id"] for m in kept_profile] == [1, 4]
    assert [m["id"] for m in kept_rel] == [7]


def test_hygiene_quota_drops_do_not_shadow_later_rows():
    rng = random.Random(11)
    v = random_vector(rng)
    profile = [{"id": 1, "content": "a", "category": "fact", "embedding": random_vector(rng)},
               {"id": 2, "content": "b", "category": "fact", "embedding": v}]  # over the cap
    relationship = [{"id": 3, "content": "b", "category": None, "embedding": v}]
    rows = with_near(profile + relationship, 0.95)
    hygiene = Hygiene()
    assert [m["id"] for m in hygiene.take(rows[:2], 5, cap=1)] == [1]
    assert [m["id"] for m in hygiene.take(rows[2:], 5)] == [3]


@pytest.mark.parametrize("strategy,params,k,cap", PARAMS)
def test_both_layers_in_one_statement_are_each_layers_ranking_with_its_near_duplicates(population, strategy,
                                                                                        params, k, cap):
    """``candidates`` (what a turn recalls, both layers in one statement) returns each layer's rows exactly as
    ``ranked`` ranks them, and for each row the rows before it that are at least ``dedupe`` cosine-similar,
    as Python computes it from the vectors."""
    q, instance, dedupe = population["query"], population["instance"], 0.6  # fires: rows are ~0.5-0.75 apart
    params = replace(params, strategy=strategy)
    both = recall_store.candidates(params, "alice", q, k=k, cap=cap, relationship_k=7, instance_id=instance,
                                   dedupe=dedupe, now=NOW)
    ranked = [recall_store.ranked(MemoryLayer.PROFILE, params, "alice", q, k=k, cap=cap, now=NOW),
              recall_store.ranked(MemoryLayer.RELATIONSHIP, params, "alice", q, k=7, cap=None, instance_id=instance,
                                  now=NOW)]
    walk = ranked[0] + ranked[1]
    assert [(r["layer"], r["id"]) for r in both] == [
        (layer, r["id"]) for layer, rows in zip(("profile", "relationship"), ranked, strict=True) for r in rows]
    for got, want in zip(both, walk, strict=True):
        assert {key: value for key, value in got.items() if key not in ("layer", "near")} == {
            key: value for key, value in want.items() if key != "embedding"}
    vectors = [r["embedding"].to_list() for r in walk]
    fired = 0
    for i, got in enumerate(both):
        similar = {b: cosine(vectors[b], vectors[i]) for b in range(i)}
        clear = {walk[b]["id"] for b, s in similar.items() if abs(s - dedupe) > 1e-5}  # float4 vs float8 sums
        want = [walk[b]["id"] for b, s in similar.items() if s >= dedupe]
        assert [n for n in got["near"] if n in clear] == [n for n in want if n in clear]
        fired += len(want)
    assert fired > 0


def test_recall_drops_a_near_duplicate_across_layers(db):
    rng = random.Random(13)
    q = random_vector(rng)
    fact = insert(db, "alice", "Lives in Tokyo with her cat", near(q, rng, 0.3), importance=0.8)
    instance = instance_for(db, "alice")
    said = insert(db, "alice", "I live in Tokyo with my cat", near(fact["embedding"], rng, 0.005), category=None,
                  instance=instance)
    other = insert(db, "alice", "something else", near(q, rng, 1.0), category=None, instance=instance)
    assert cosine(said["embedding"], fact["embedding"]) > 0.97
    got = recall.recall("alice", instance, q, now=NOW)
    assert [m["id"] for m in got.profile] == [fact["id"]]
    assert [m["id"] for m in got.relationship] == [other["id"]]  # the utterance repeats the fact: dropped
    off = recall.recall("alice", instance, q, now=NOW, knobs=replace(RecallKnobs(), dedupe_similarity=2))
    assert {m["id"] for m in off.relationship} == {said["id"], other["id"]}


def test_recall_refills_the_quota_after_dropping_duplicates(db):
    rng = random.Random(12)
    q = random_vector(rng)
    dup = near(q, rng, 0.3)
    for i in range(4):  # five copies of "lives in Shanghai" before consolidation merges them
        insert(db, "alice", "Lives in Shanghai" + "." * i, near(dup, rng, 0.01), importance=0.8)
    others = [insert(db, "alice", f"fact {i}", near(q, rng, 1.5), importance=0.8) for i in range(6)]
    instance = instance_for(db, "alice")
    insert(db, "alice", "lives in shanghai", near(q, rng, 0.5), category=None, instance=instance)
    said = insert(db, "alice", "I said this earlier", near(q, rng, 0.2), category=None, instance=instance)
    fresh = insert(db, "alice", "something else", near(q, rng, 2.0), category=None, instance=instance)
    got = recall.recall("alice", instance, q, now=NOW, history=[{"role": "user", "content": said["content"]}],
                        knobs=RecallKnobs(strategy="composite", top_k=5))
    texts = [m["content"] for m in got.profile]
    assert len(texts) == 5 and sum(normalised(t) == "lives in shanghai" for t in texts) == 1
    assert {m["id"] for m in got.profile} - {o["id"] for o in others} != set()
    assert [m["id"] for m in got.relationship] == [fresh["id"]]
