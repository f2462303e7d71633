"""Recall ranking: one layer's ranked rows (``ranked``), and both layers' with the near-duplicates among their
rows for a chat turn (``candidates``). The statement is in the database: ``engine.recall_layer_v2`` and the
functions around it, in ``eros/sql/functions/recall.sql``, which writes down the score of each strategy, its
parts (similarity, recency, importance, lexical, demotion) and why each part of the statement is shaped so.
One statement serves every layer, strategy and setting, so that a turn's recall is planned once per database
connection. Ordering is ``score DESC, id``, so the same rows always come back in the same order (the tests
compare with a brute-force ranking in Python, ties included). The knobs: ``eros.config.RecallKnobs``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pgvector import Vector

from ..config import RecallKnobs
from ..db import connection
from ..memory import MemoryLayer
from .rows import RankedMemory, RecallCandidate

# The statements are in the database (sql/functions/recall.sql, whose comments say why each part is shaped so):
# engine.recall_layer_v2() ranks one layer, engine.recall_candidates_v2() both layers for a turn, and
# engine.turn_recall_v3() is recall_candidates_v2() with its plan kept by the database connection (a turn then skips
# the ~2 ms of parsing and planning that a 7 KB statement costs). Values only are bound; nothing is formatted
# into SQL. The knobs travel as one engine.recall_knobs_v2 value, in that type's field order (its field sign_pool
# is RECALL_POOL, the knob's name since migration 0025). The query's sign bits are no longer read (NULL).
_KNOBS = ("ROW(%(strategy)s::text, %(lam)s::float8, %(tau_days)s::float8, %(floor)s::float8,"
          " %(importance_floor)s::float8, %(importance_weight)s::float8, %(demote_similarity)s::float8,"
          " %(demote_penalty)s::float8, %(demote_pool)s::int, %(lexical_weight)s::float8,"
          " %(lexical_year_weight)s::float8, %(utterance_window)s::int, %(pool)s::int,"
          " %(lexical_pool)s::int)::engine.recall_knobs_v2")
_RANKED = ("SELECT * FROM engine.recall_layer_v2(%(layer)s::text, %(user)s::text, %(instance)s::uuid,"
           " %(category)s::text, %(q)s::vector, NULL::bit(512), %(message)s::text,"
           f" %(now)s::timestamptz, {_KNOBS}, %(k)s::int, %(cap)s::int)")
_CANDIDATES = ("SELECT * FROM engine.{function}(%(user)s::text, %(instance)s::uuid, %(q)s::vector,"
               " NULL::bit(512), %(message)s::text,"
               f" %(now)s::timestamptz, {_KNOBS}, %(profile_k)s::int, %(profile_cap)s::int,"
               " %(relationship_k)s::int, %(dedupe)s::float8)")
# ... refused (SQLSTATE EM001) when the query's model is not the stored vectors' (sql/functions/embedding.sql).
_RANKED_EMBEDDED_WITH = _RANKED + " WHERE engine.embedded_with(%(model)s::text)"
# A turn's: refused the same way, by its last argument (engine.turn_recall_v3 checks it before it ranks).
TURN_RECALL = _CANDIDATES.format(function="turn_recall_v3")[:-1] + ", %(model)s::text)"
# The same rows, through the SQL function the planner inlines: EXPLAIN of this shows the plan turn_recall keeps.
CANDIDATES = _CANDIDATES.format(function="recall_candidates_v2")


def _values(knobs: RecallKnobs, user_id: str, query: list[float], message: str | None, instance_id: UUID | None,
            now: datetime | None, *, demoting: bool) -> dict[str, Any]:
    """The values every call binds: the knobs, with the demotion's pool 0 when it is off (``demoting``) and no
    message when the lexical part is off (no weight, or nothing in the message to match)."""
    lexical = (knobs.lexical_weight > 0 or knobs.lexical_year_weight > 0) and bool(message and message.strip())
    return knobs.model_dump() | {  # the fields the knobs do not name are not bound
        "demote_pool": knobs.demote_pool if demoting else 0,
        "q": Vector(list(query)), "message": message if lexical else None, "user": user_id,
        "instance": instance_id, "now": now}


def _cap(k: int, cap: int | None) -> int:
    return cap if cap and cap > 0 else k


def ranked(layer: MemoryLayer, knobs: RecallKnobs, user_id: str, query: list[float], *, k: int,
           cap: int | None, message: str | None = None, instance_id: UUID | None = None, now: datetime | None = None,
           category: str | None = None, model: str | None = None) -> list[RankedMemory]:
    """The layer's top ``k`` rows by ``knobs.strategy``'s score, at most ``cap`` per category (None: no cap).

    ``query`` is the embedding of the message and ``message`` the message itself, for the lexical part (None:
    similarity alone). One round trip. Rows carry their embedding, distance, decay, the score parts
    (similarity, recency_term, importance_term, lexical_term, demotion) and score. ``now`` None means the
    database's statement time. Only the profile layer is demoted, and only when ``knobs.demoting``;
    ``category`` keeps the profile's rows of one category (a search's filter); ``model``, the one that embedded
    ``query``: refused (EM001) if the stored vectors are another's. (A turn recalls through ``candidates``, which
    ranks each layer with this same function and is refused the same way.)
    """
    if k <= 0 or (layer is MemoryLayer.RELATIONSHIP and instance_id is None):
        return []
    values = _values(knobs, user_id, query, message, instance_id, now, demoting=knobs.demoting) | {
        "layer": layer.value, "category": category, "k": k, "cap": _cap(k, cap), "model": model}
    # Binary results: the embeddings come back as packed floats, not 512 numbers in text to parse.
    with connection().cursor(binary=True) as cur:
        return cur.execute(_RANKED_EMBEDDED_WITH if model else _RANKED, values).fetchall()


def candidates(knobs: RecallKnobs, user_id: str, query: list[float], *, k: int, cap: int | None,
               relationship_k: int, instance_id: UUID | None, dedupe: float, message: str | None = None,
               now: datetime | None = None, model: str | None = None) -> list[RecallCandidate]:
    """Both layers' rows in one round trip (engine.turn_recall_v3): the profile's top ``k`` (at most ``cap`` per
    category) and then the relationship layer's top ``relationship_k`` of ``instance_id``, each as ``ranked``
    ranks them, without their embeddings, each with its ``layer`` and ``near``: the ids of the rows before it
    that are at least ``dedupe`` cosine-similar to it. ``model``, the one that embedded ``query``: refused (EM001)
    if the stored vectors are another's (None: not checked)."""
    if instance_id is None:
        relationship_k = 0
    values = _values(knobs, user_id, query, message, instance_id, now, demoting=knobs.demoting) | {
        "profile_k": max(k, 0), "profile_cap": _cap(k, cap), "relationship_k": max(relationship_k, 0),
        "dedupe": dedupe, "model": model}
    with connection().cursor(binary=True) as cur:
        return cur.execute(TURN_RECALL, values).fetchall()
