"""Recall ranking SQL: one statement per memory layer, for every strategy (``ranked``), and both layers'
statements in one, with the near-duplicates among their rows, for a chat turn (``candidates``).

All three strategies share one statement shape and differ only in the base score expression:

* ``grouped``   base = s                            (nearest first; a quota per category)
* ``recency``   base = s + lambda * d               (a global top-K, optional per-category cap)
* ``composite`` base = s * (floor + (1 - floor) * d) * (ifloor + (1 - ifloor) * importance)
                                                    (likewise)

where ``s = 1 - (embedding <=> query)`` is the cosine similarity, ``d = exp(-age / tau)`` the
decay and ``ifloor`` the importance floor (0: the plain ``s x decay x importance``; see
below for why it exists). ``age`` runs from the row's *event time* to "now" (a bound
parameter, so the evaluation and the tests can ask at any date; the database's statement time
otherwise). The event time is ``occurred_at`` when the session said when the thing happened ("we met
in 2019": 1 January 2019), else ``created_at``; a future event ("my interview is tomorrow") is new until
it has happened. ``grouped`` is the
same statement with the plain similarity as base, the quota as the per-category cap and no
global limit to speak of, so the one statement reproduces the original per-category recall.

On top of the base, for every strategy (the read-time safety net of consolidation):

    score = base + w * coalesce(importance, 0.5) - demotion

* ``w`` (``importance_weight``) is a small *additive* importance term: it breaks near-ties toward
  the important row without multiplying relevance away (a multiplier on e5's compressed cosine
  scale lets an important but unrelated row win every query).
* ``demotion`` is ``penalty`` for an older *profile* row (by event time) that has a newer active row of the same
  category within ``demote_similarity`` cosine of it (an update that write-time consolidation did
  not catch: "lives in Shanghai" under "moved to Tokyo"), else 0. The row is demoted, not hidden.
  The pairwise test runs only inside a bounded candidate pool: the ``pool`` best rows of the layer
  by their undemoted score (base + importance term), pairs of the same category only. Rows outside
  the pool keep their undemoted score (they rank below every pool row before demotion anyway). The
  relationship layer holds raw utterances with no category and is never demoted. With demotion
  off, the statement carries none of this (no pool, no pairwise join).

Every row comes back with its score parts, ``similarity``, ``recency_term``, ``importance_term`` and
``demotion``, with ``score = similarity + recency_term + importance_term - demotion`` for every
strategy (for ``composite`` the multiplicative factors are written as what they add: ``recency_term
= s * decay_factor - s`` and the importance term includes ``s * decay_factor * (importance_factor
- 1)``), so a caller can show why a row ranked.

Ordering is ``score DESC, id``: equal scores fall back to the row's uuid, so the same rows in the
same database always come back in the same order (the tests compare against a brute-force
ranking in Python, ties included).

Why ``composite`` has an importance floor: real embedders compress cosine similarity into a narrow
band (unrelated texts already score ~0.75 with e5, well above 0 with Voyage). Multiplied by a raw
importance in [0, 1], importance then outweighs relevance and the important-but-unrelated fact wins
every query (``bench/results/recall_eval_e5.md`` measures it); ``ifloor`` is what the least important
row keeps, as ``floor`` is what a very old but still-true row ("has a daughter") keeps of its decay.
The knobs and their defaults: ``eros.config.RecallParams``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pgvector import Vector

from ..config import RecallParams
from ..db import connection
from ..memory import MemoryLayer
from .rows import RankedMemory, RecallCandidate

# The score parts, over the columns of the `base` subquery below: (base score, recency term,
# importance term), with base + w * importance = similarity + recency term + importance term.
# Constants of ours only: nothing user-supplied is ever formatted into SQL (all values are bound
# parameters). A row without importance (relationship utterances, rows written before extraction
# gave one) counts as 0.5: neither promoted nor buried.
_IMPORTANCE = "coalesce(importance, 0.5)::float8"
_TERM = f"%(iw)s::float8 * {_IMPORTANCE}"
_DECAY_FACTOR = "(%(floor)s::float8 + (1 - %(floor)s::float8) * decay)"
_IMPORTANCE_FACTOR = f"(%(ifloor)s::float8 + (1 - %(ifloor)s::float8) * {_IMPORTANCE})"
_SCORES: dict[str, tuple[str, str, str]] = {  # strategy -> parts
    "grouped": ("1 - distance", "0::float8", _TERM),
    "recency": ("(1 - distance) + %(lam)s::float8 * decay", "%(lam)s::float8 * decay", _TERM),
    "composite": (f"(1 - distance) * {_DECAY_FACTOR} * {_IMPORTANCE_FACTOR}",
                  f"(1 - distance) * {_DECAY_FACTOR} - (1 - distance)",
                  f"(1 - distance) * {_DECAY_FACTOR} * ({_IMPORTANCE_FACTOR} - 1) + {_TERM}"),
}

# Which rows a layer recalls.
# * profile: the user's rows without an instance. Uncategorised profile rows are the legacy raw
#   turn dump the dreaming design replaced; the prompt renders the profile by category, so such a
#   row could never be shown anyway. Served by companion_memories_profile_idx (user_id, category).
# * relationship: one user x one persona instance. Served by companion_memories_relationship_idx.
# In both, a row that consolidation has superseded (superseded_at set) is history, kept but never
# recalled (the profile index covers active rows only); and a row created after "now" did not
# exist yet at that date.
_LAYERS: dict[MemoryLayer, str] = {
    MemoryLayer.PROFILE: "user_id = %(user)s AND instance_id IS NULL AND category IS NOT NULL"
                         " AND (%(category)s::text IS NULL OR category = %(category)s)",  # a search's filter
    MemoryLayer.RELATIONSHIP: "user_id = %(user)s AND instance_id = %(instance)s",
}

# The read-time demotion, profile layer only, in its own statement (when demotion is off, or for
# the relationship layer, the statement has none of it and costs nothing extra): `pool` is the
# layer's `pool` best rows by undemoted score, `demoted` those of them with a newer row of the same
# category in the pool at least `dsim` cosine-similar. Comparing pool rows only bounds the
# pairwise work at pool^2 / 2 distance computations (same-category pairs only), whatever the
# user's row count. `demoted` is MATERIALIZED: the demotion is read twice (the score in the window
# and in the outer sort), and the pairwise join must run once.
_DEMOTION = ("""
pool AS (
    SELECT id, category, event_time, embedding FROM scored ORDER BY undemoted DESC, id LIMIT %(pool)s
), demoted AS MATERIALIZED (
    SELECT a.id FROM pool a
    WHERE EXISTS (SELECT 1 FROM pool b
                  WHERE b.category = a.category AND b.event_time > a.event_time
                    AND 1 - (a.embedding <=> b.embedding) >= %(dsim)s::float8)
),""", "CASE WHEN id IN (SELECT id FROM demoted) THEN %(penalty)s::float8 ELSE 0::float8 END")
_NO_DEMOTION = ("", "0::float8")

# The lexical part (``lexical_weight`` > 0 and a message to match), in its own CTEs like the demotion: BM25
# of the message's lexemes against each row's (migration 0012: engine.lexemes, the same tokens on both
# sides), over the layer's rows of this user only, so the inverse document frequency is the user's own
# (a word every memory of theirs has is worth nothing; their colleague's rare name is worth a lot), then
# divided by the best row's so that it lies in [0, 1] whatever the message's length. A row's term
# frequency is taken as 1 and its length is not normalised (BM25 with b = 0): memories are a sentence or
# two, a repeated word is not more evidence, and on the dev set b = 0.75 was no better (recall_summary.md).
# * `terms`: the message's lexemes (none for no message: no row matches, every row's lexical part is 0).
#   MATERIALIZED, and in a turn's statement (``candidates``) one CTE that both layers read: engine.lexemes()
#   of a bound message is folded into a constant while the statement is planned, once per reference.
# * `matches`: (row, document frequency) for each of the message's lexemes a row has; ts_delete() drops the
#   message's lexemes from a row's in C, so the rows that match nothing (most of them) are never unnested,
#   and the frequency is a window over the matches, not a second pass and a join.
# * `lexical`: per row, the sum over its matched lexemes of idf = ln(1 + (n - df + 0.5) / (df + 0.5)) over
#   the user's n rows (BM25's (k1 + 1) / (1 + k1) factor is 1 at term frequency 1 and b = 0), divided by
#   the best row's sum. n is `collection`, MATERIALIZED: joined to the bare count, the plan re-counted the
#   rows once per match.
# * The year the message names: a row whose event time (occurred_at) falls in a year that is one of the
#   message's lexemes ("what happened in 2008?", "2018年") gets ``lexical_year_weight`` on top. The year is
#   a word of the row too, but at a tie-breaker's weight it cannot lift the one memory of 2008 over ten
#   closer in meaning, and a year named in the question is rarely a coincidence.
_TERMS = """
terms AS MATERIALIZED (
    SELECT coalesce(array_agg(lexeme), '{}') AS terms FROM unnest(engine.lexemes(%(text)s))
),"""
_LEXICAL = ("""
matches AS (
    SELECT id, count(*) OVER (PARTITION BY lexeme)::float8 AS df
    FROM (SELECT id, unnest(tsvector_to_array(lexemes)) AS lexeme
          FROM base, terms WHERE length(ts_delete(lexemes, terms.terms)) < length(lexemes)) m, terms
    WHERE m.lexeme = ANY (terms.terms)
), collection AS MATERIALIZED (
    SELECT count(*)::float8 AS n FROM base
), bm25 AS (
    SELECT id, sum(ln(1 + (n - df + 0.5) / (df + 0.5))) AS raw FROM matches, collection GROUP BY id
), lexical AS (
    SELECT id, raw / nullif(max(raw) OVER (), 0) AS lexical FROM bm25
),""", "base LEFT JOIN lexical USING (id) CROSS JOIN terms",
            "(%(lw)s::float8 * coalesce(lexical, 0) + CASE WHEN extract(year FROM occurred_at)::int::text = ANY (terms)"
            " THEN %(yw)s::float8 ELSE 0::float8 END)")
_NO_LEXICAL = ("", "base", "0::float8")

# The statement. Why it is shaped like this:
# * `base` computes the distance once per row (pgvector's <=> is the cost that matters) and the
#   decay. `OFFSET 0` keeps it a separate plan node: without it the planner pulls the subquery up
#   and substitutes the distance and decay expressions into every column that reads them, so each
#   row's <=> and exp() would be computed once per reference (the score parts read them several
#   times; measured: ~0.5 ms per statement at 100 rows). The age is clamped at 0 (a row stamped
#   a moment after the statement began is simply "new") and the exponent at 700: exp() of a
#   float8 below about -745 raises "value out of range: underflow" in Postgres instead of
#   returning 0, and a memory many tau old must still be recalled when it is the relevant one.
# * `scored` adds the score parts and the undemoted score; the demotion CTEs (profile only) pick
#   the pool from it; `ranked` subtracts the demotion.
# * `capped` numbers each category's rows by score: the per-category quota of `grouped`, the
#   optional cap of the global strategies. Relationship rows have no category: one partition.
# * The outer ORDER BY ... LIMIT is the global top-K.
# An exact scan of one user's rows (hundreds, thousands) through the per-user index: an
# approximate ANN index could only serve ORDER BY distance, not these scores, and filters by
# user only after its neighbour search (bench/recall_latency.py measures both).
_TEMPLATE = """
WITH base AS (
    SELECT id, content, category, importance, created_at, occurred_at, occurred_precision, embedding, lexemes,
           embedding <=> %(q)s AS distance,
           exp(-least(greatest(extract(epoch FROM (coalesce(%(now)s::timestamptz, statement_timestamp())
                                                   - event_time))::float8, 0)
                      / 86400.0 / %(tau)s::float8, 700)) AS decay,
           event_time
    FROM engine.companion_memories,
         LATERAL (SELECT coalesce(occurred_at::timestamp AT TIME ZONE 'UTC', created_at) AS event_time) t
    WHERE {layer}
      AND superseded_at IS NULL
      AND created_at <= coalesce(%(now)s::timestamptz, statement_timestamp())
    OFFSET 0
),{lexical}
scored AS (
    SELECT *, {base} + {term} + {lexical_term} AS undemoted, {recency} AS recency_term,
           {importance} AS importance_term, {lexical_term} AS lexical_term
    FROM {scored_from}
),{pool}
ranked AS (
    SELECT *, undemoted - demotion AS score FROM (SELECT *, {demotion} AS demotion FROM scored) d
), capped AS (
    SELECT *, row_number() OVER (PARTITION BY category ORDER BY score DESC, id) AS category_rank
    FROM ranked
)
SELECT id, content, category, importance, created_at, occurred_at, occurred_precision, embedding, distance, decay,
       1 - distance AS similarity, recency_term, importance_term, lexical_term, demotion, score
FROM capped
WHERE category_rank <= {cap}
ORDER BY score DESC, id
LIMIT {k}
"""


def _layer_statement(layer: MemoryLayer, strategy: str, demoting: bool, lexical: bool, prefix: str = "",
                     own_terms: bool = True) -> str:
    """One layer's statement; its k and cap parameters are named ``{prefix}k`` and ``{prefix}cap``. With
    ``own_terms`` False, its lexical part reads a `terms` CTE that the enclosing statement defines."""
    base, recency, importance = _SCORES[strategy]
    pool, demotion = _DEMOTION if demoting else _NO_DEMOTION
    ctes, scored_from, lexical_term = _LEXICAL if lexical else _NO_LEXICAL
    if lexical and own_terms:
        ctes = _TERMS + ctes
    return _TEMPLATE.format(layer=_LAYERS[layer], base=base, term=_TERM, recency=recency, importance=importance,
                            lexical=ctes, scored_from=scored_from, lexical_term=lexical_term,
                            pool=pool, demotion=demotion, k=f"%({prefix}k)s", cap=f"%({prefix}cap)s")


# (layer, strategy, demoting, lexical) -> statement; the relationship layer is never demoted.
_STATEMENTS = {(layer, strategy, demoting, lexical): _layer_statement(layer, strategy, demoting, lexical)
               for layer in MemoryLayer for strategy in _SCORES
               for demoting in ((False, True) if layer is MemoryLayer.PROFILE else (False,))
               for lexical in (False, True)}

# Both layers in one statement (``candidates``, what a turn recalls), with what hygiene needs to drop a
# near-duplicate, so that no embedding leaves the database: the two layers' statements above, unchanged
# (so each layer's rows, order and scores are ``ranked``'s), then every candidate in the order hygiene
# walks them (`place`: the profile's by score, then the relationship's) with `near`, the candidates placed
# before it whose embedding is at least `dedupe` cosine-similar to its own. A row is a near-duplicate of
# what the prompt already carries exactly when one of those was kept (eros.recall.Hygiene). At most
# (2k + 2 relationship k)^2 / 2 distances, computed in C: ~435 at the defaults, instead of ~270 dot
# products of 512 floats in Python over 60 KB of shipped vectors.
_BOTH_TEMPLATE = """
WITH {terms}profile AS MATERIALIZED ({profile}
), relationship AS MATERIALIZED ({relationship}
), candidates AS (
    SELECT 'profile' AS layer, row_number() OVER (ORDER BY score DESC, id) AS place, * FROM profile
    UNION ALL
    SELECT 'relationship', (SELECT count(*) FROM profile) + row_number() OVER (ORDER BY score DESC, id), *
    FROM relationship
)
SELECT c.layer, c.id, c.content, c.category, c.importance, c.created_at, c.occurred_at, c.occurred_precision,
       c.distance, c.decay, c.similarity,
       c.recency_term, c.importance_term, c.lexical_term, c.demotion, c.score,
       ARRAY(SELECT b.id FROM candidates b
             WHERE b.place < c.place AND 1 - (b.embedding <=> c.embedding) >= %(dedupe)s::float8
             ORDER BY b.place) AS near
FROM candidates c
ORDER BY c.place
"""
_BOTH = {(strategy, demoting, lexical): _BOTH_TEMPLATE.format(
             terms=_TERMS.lstrip("\n") + "\n" if lexical else "",
             profile=_layer_statement(MemoryLayer.PROFILE, strategy, demoting, lexical, "profile_", own_terms=False),
             relationship=_layer_statement(MemoryLayer.RELATIONSHIP, strategy, False, lexical, "relationship_",
                                           own_terms=False))
         for strategy in _SCORES for demoting in (False, True) for lexical in (False, True)}


def _values(params: RecallParams, user_id: str, query: list[float], text: str | None, instance_id: UUID | None,
            now: datetime | None, category: str | None = None) -> dict[str, Any]:
    """The parameters every layer's statement shares."""
    return {"q": Vector(list(query)), "text": text, "user": user_id, "instance": instance_id, "now": now,
            "category": category, "lam": params.lam,
            "tau": params.tau_days, "floor": params.floor, "ifloor": params.importance_floor,
            "iw": params.importance_weight, "dsim": params.demote_similarity, "penalty": params.demote_penalty,
            "pool": params.demote_pool, "lw": params.lexical_weight, "yw": params.lexical_year_weight}


def _lexical(params: RecallParams, text: str | None) -> bool:
    """Whether the statement carries the lexical part: a weight, and a message with something to match."""
    return (params.lexical_weight > 0 or params.lexical_year_weight > 0) and bool(text and text.strip())


def _cap(k: int, cap: int | None) -> int:
    return cap if cap and cap > 0 else k


def ranked(layer: MemoryLayer, params: RecallParams, user_id: str, query: list[float], *, k: int,
           cap: int | None, text: str | None = None, instance_id: UUID | None = None, now: datetime | None = None,
           category: str | None = None) -> list[RankedMemory]:
    """The layer's top ``k`` rows by ``params.strategy``'s score, at most ``cap`` per category (None: no cap).

    ``query`` is the embedding of the message and ``text`` the message itself, for the lexical part (None:
    similarity alone). One round trip. Rows carry their embedding, distance, decay, the score parts
    (similarity, recency_term, importance_term, lexical_term, demotion) and score. ``now`` None means the
    database's statement time. Only the profile layer is demoted, and only when ``params.demoting``;
    ``category`` keeps the profile's rows of one category (a search's filter). (A turn recalls through
    ``candidates``, which runs this same statement for each layer.)
    """
    if k <= 0 or (layer is MemoryLayer.RELATIONSHIP and instance_id is None):
        return []
    demoting = layer is MemoryLayer.PROFILE and params.demoting
    values = _values(params, user_id, query, text, instance_id, now, category) | {"k": k, "cap": _cap(k, cap)}
    statement = _STATEMENTS[(layer, params.strategy, demoting, _lexical(params, text))]
    # Binary results: the embeddings come back as packed floats, not 512 numbers in text to parse.
    with connection().cursor(binary=True) as cur:
        return cur.execute(statement, values).fetchall()


def candidates(params: RecallParams, user_id: str, query: list[float], *, k: int, cap: int | None,
               relationship_k: int, instance_id: UUID | None, dedupe: float, text: str | None = None,
               now: datetime | None = None) -> list[RecallCandidate]:
    """Both layers' rows in one round trip (see ``_BOTH_TEMPLATE``): the profile's top ``k`` (at most ``cap``
    per category) and then the relationship layer's top ``relationship_k`` of ``instance_id``, each as
    ``ranked`` ranks them, without their embeddings, each with its ``layer`` and ``near``: the ids of the
    rows before it that are at least ``dedupe`` cosine-similar to it."""
    if instance_id is None:
        relationship_k = 0
    values = _values(params, user_id, query, text, instance_id, now) | {
        "profile_k": max(k, 0), "profile_cap": _cap(k, cap), "relationship_k": max(relationship_k, 0),
        "relationship_cap": _cap(relationship_k, None), "dedupe": dedupe}
    statement = _BOTH[(params.strategy, params.demoting, _lexical(params, text))]
    with connection().cursor(binary=True) as cur:
        return cur.execute(statement, values).fetchall()
