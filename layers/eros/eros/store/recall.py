"""Recall ranking: one layer's ranked rows (``ranked``), and both layers' with the near-duplicates among their
rows for a chat turn (``candidates``). The statement is in the database, as functions of migration 0015 (one
statement for every layer, strategy and setting; why each part of it is there is commented next to it), so that
a turn's recall is planned once per database connection, not on every turn.

All three strategies share one statement and differ only in the base score expression:

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

# The statements are in the database (sql/functions/recall.sql, whose comments say why each part is shaped so):
# engine.recall_layer() ranks one layer, engine.recall_candidates() both layers for a turn, and
# engine.turn_recall() is recall_candidates() with its plan kept by the database connection (a turn then skips
# the ~2 ms of parsing and planning that a 7 KB statement costs). Values only are bound; nothing is formatted
# into SQL. The knobs travel as one engine.recall_knobs value, in that type's field order.
_KNOBS = ("ROW(%(strategy)s::text, %(lam)s::float8, %(tau_days)s::float8, %(floor)s::float8,"
          " %(importance_floor)s::float8, %(importance_weight)s::float8, %(demote_similarity)s::float8,"
          " %(demote_penalty)s::float8, %(demote_pool)s::int, %(lexical_weight)s::float8,"
          " %(lexical_year_weight)s::float8)::engine.recall_knobs")
_RANKED = ("SELECT * FROM engine.recall_layer(%(layer)s::text, %(user)s::text, %(instance)s::uuid, %(category)s::text,"
           f" %(q)s::vector, %(text)s::text, %(now)s::timestamptz, {_KNOBS}, %(k)s::int, %(cap)s::int)")
_CANDIDATES = ("SELECT * FROM engine.{function}(%(user)s::text, %(instance)s::uuid, %(q)s::vector, %(text)s::text,"
               f" %(now)s::timestamptz, {_KNOBS}, %(profile_k)s::int, %(profile_cap)s::int,"
               " %(relationship_k)s::int, %(dedupe)s::float8)")
TURN_RECALL = _CANDIDATES.format(function="turn_recall")
# The same rows, through the SQL function the planner inlines: EXPLAIN of this shows the plan turn_recall keeps.
CANDIDATES = _CANDIDATES.format(function="recall_candidates")


def _values(params: RecallParams, user_id: str, query: list[float], text: str | None, instance_id: UUID | None,
            now: datetime | None, *, demoting: bool) -> dict[str, Any]:
    """The values every call binds: the knobs, with the demotion's pool 0 when it is off (``demoting``) and no
    message when the lexical part is off (no weight, or nothing in the message to match)."""
    lexical = (params.lexical_weight > 0 or params.lexical_year_weight > 0) and bool(text and text.strip())
    return params.model_dump() | {  # the fields the knobs do not name are not bound
        "demote_pool": params.demote_pool if demoting else 0,
        "q": Vector(list(query)), "text": text if lexical else None, "user": user_id, "instance": instance_id,
        "now": now}


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
    ``candidates``, which ranks each layer with this same function.)
    """
    if k <= 0 or (layer is MemoryLayer.RELATIONSHIP and instance_id is None):
        return []
    values = _values(params, user_id, query, text, instance_id, now, demoting=params.demoting) | {
        "layer": layer.value, "category": category, "k": k, "cap": _cap(k, cap)}
    # Binary results: the embeddings come back as packed floats, not 512 numbers in text to parse.
    with connection().cursor(binary=True) as cur:
        return cur.execute(_RANKED, values).fetchall()


def candidates(params: RecallParams, user_id: str, query: list[float], *, k: int, cap: int | None,
               relationship_k: int, instance_id: UUID | None, dedupe: float, text: str | None = None,
               now: datetime | None = None) -> list[RecallCandidate]:
    """Both layers' rows in one round trip (engine.turn_recall): the profile's top ``k`` (at most ``cap`` per
    category) and then the relationship layer's top ``relationship_k`` of ``instance_id``, each as ``ranked``
    ranks them, without their embeddings, each with its ``layer`` and ``near``: the ids of the rows before it
    that are at least ``dedupe`` cosine-similar to it."""
    if instance_id is None:
        relationship_k = 0
    values = _values(params, user_id, query, text, instance_id, now, demoting=params.demoting) | {
        "profile_k": max(k, 0), "profile_cap": _cap(k, cap), "relationship_k": max(relationship_k, 0),
        "dedupe": dedupe}
    with connection().cursor(binary=True) as cur:
        return cur.execute(TURN_RECALL, values).fetchall()
