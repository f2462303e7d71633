"""Recall ranking SQL: one statement per memory layer, for every strategy.

All three strategies share one statement shape and differ only in the score expression:

* ``grouped``   score = s                            (nearest first; a quota per category)
* ``recency``   score = s + lambda * d               (a global top-K, optional per-category cap)
* ``composite`` score = s * (floor + (1 - floor) * d) * (ifloor + (1 - ifloor) * importance)
                                                     (likewise)

where ``s = 1 - (embedding <=> query)`` is the cosine similarity, ``d = exp(-age / tau)`` the
decay and ``ifloor`` the importance floor (0: the plain ``s x decay x importance``; see
``eros.recall`` for why it exists). ``age`` runs from the row's ``created_at`` to "now" (a bound
parameter, so the evaluation and the tests can ask at any date; the database's statement time
otherwise). ``grouped`` is the
same statement with the plain similarity as score, the quota as the per-category cap and no
global limit to speak of, so the one statement reproduces the original per-category recall.

Ordering is ``score DESC, id``: equal scores fall back to the row's uuid, so the same rows in the
same database always come back in the same order (the tests compare against a brute-force
ranking in Python, ties included). ``eros.recall`` holds the Python twin of these formulas.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal
from uuid import UUID

from pgvector import Vector

from ..db import connection

Strategy = Literal["grouped", "recency", "composite"]

# The score expressions, over the columns of the `base` subquery below. Constants of ours only:
# nothing user-supplied is ever formatted into SQL (all values are bound parameters).
_SCORES: dict[str, str] = {
    "grouped": "1 - distance",
    "recency": "(1 - distance) + %(lam)s::float8 * decay",
    # A row without importance (relationship utterances, rows written before extraction gave
    # one) counts as 0.5: neither promoted nor buried.
    "composite": "(1 - distance) * (%(floor)s::float8 + (1 - %(floor)s::float8) * decay)"
                 " * (%(ifloor)s::float8 + (1 - %(ifloor)s::float8) * coalesce(importance, 0.5)::float8)",
}

# Which rows a layer recalls.
# * profile: the user's rows without an instance. Uncategorised profile rows are the legacy raw
#   turn dump the dreaming design replaced; the prompt renders the profile by category, so such a
#   row could never be shown anyway. Served by companion_memories_profile_idx (user_id, category).
# * relationship: one user x one persona instance. Served by companion_memories_relationship_idx.
# In both, a row that consolidation has superseded (superseded_at set) is history, kept but never
# recalled (the profile index covers active rows only); and a row created after "now" did not
# exist yet at that date.
_LAYERS: dict[str, str] = {
    "profile": "user_id = %(user)s AND instance_id IS NULL AND category IS NOT NULL",
    "relationship": "user_id = %(user)s AND instance_id = %(instance)s",
}

# The statement. Why it is shaped like this:
# * `base` computes the distance once per row (pgvector's <=> is the cost that matters) and the
#   decay. The age is clamped at 0 (a row stamped a moment after the statement began is simply
#   "new") and the exponent at 700: exp() of a float8 below about -745 raises "value out of
#   range: underflow" in Postgres instead of returning 0, and a memory many tau old must still
#   be recalled when it is the relevant one.
# * `capped` numbers each category's rows by score: the per-category quota of `grouped`, the
#   optional cap of the global strategies. Relationship rows have no category: one partition.
# * The outer ORDER BY ... LIMIT is the global top-K.
# An exact scan of one user's rows (hundreds, thousands) through the per-user index: an
# approximate ANN index could only serve ORDER BY distance, not these scores, and filters by
# user only after its neighbour search (bench/recall_latency.py measures both).
_TEMPLATE = """
WITH base AS (
    SELECT id, content, category, importance, created_at, embedding,
           embedding <=> %(q)s AS distance,
           exp(-least(greatest(extract(epoch FROM (coalesce(%(now)s::timestamptz, statement_timestamp())
                                                   - created_at))::float8, 0)
                      / 86400.0 / %(tau)s::float8, 700)) AS decay
    FROM engine.companion_memories
    WHERE {layer}
      AND superseded_at IS NULL
      AND created_at <= coalesce(%(now)s::timestamptz, statement_timestamp())
), scored AS (
    SELECT *, {score} AS score FROM base
), capped AS (
    SELECT *, row_number() OVER (PARTITION BY category ORDER BY score DESC, id) AS category_rank
    FROM scored
)
SELECT id, content, category, importance, created_at, embedding, distance, decay, score
FROM capped
WHERE category_rank <= %(cap)s
ORDER BY score DESC, id
LIMIT %(k)s
"""

_STATEMENTS = {(layer, strategy): _TEMPLATE.format(layer=where, score=score)
               for layer, where in _LAYERS.items() for strategy, score in _SCORES.items()}


def ranked(layer: Literal["profile", "relationship"], strategy: Strategy, user_id: str, query: list[float], *,
           k: int, cap: int | None = None, instance_id: UUID | None = None, now: datetime | None = None,
           lam: float = 0.0, tau_days: float = 30.0, floor: float = 0.0, importance_floor: float = 0.0
           ) -> list[dict]:
    """The layer's top ``k`` rows by the strategy's score, at most ``cap`` per category (None: no cap).

    One round trip. Rows carry their embedding (for near-duplicate checks), distance, decay and
    score. ``now`` None means the database's statement time.
    """
    if k <= 0 or (layer == "relationship" and instance_id is None):
        return []
    if tau_days <= 0:
        raise ValueError("tau_days must be positive")
    params = {"q": Vector(list(query)), "user": user_id, "instance": instance_id, "now": now, "lam": lam,
              "tau": tau_days, "floor": floor, "ifloor": importance_floor, "k": k,
              "cap": cap if cap and cap > 0 else k}
    # Binary results: the embeddings come back as packed floats, not 512 numbers in text to parse.
    with connection().cursor(binary=True) as cur:
        return cur.execute(_STATEMENTS[(layer, strategy)], params).fetchall()
