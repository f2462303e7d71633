"""The embedding space's data access (migration 0032): which model embedded the deployment's vectors, the
calibrations `eros calibrate` stored per model, and the neighbour cosines it derives them from."""

from __future__ import annotations

from typing import Any

from ..calibration import Calibration
from ..db import connection, one

_STATE = """
SELECT (SELECT to_jsonb(s) - 'singleton' FROM engine.embedding_space s) AS space,
       (SELECT to_jsonb(c) FROM engine.embedding_calibrations c
        WHERE c.model = coalesce(%(model)s, (SELECT model FROM engine.embedding_space))
        ORDER BY c.id DESC LIMIT 1) AS calibration
"""


def state(model: str | None) -> dict[str, Any]:
    """One round trip: ``space`` (the model and dimension the stored vectors came from, with ``recorded_at``;
    None before the first vector is written) and ``calibration``, the newest stored row for ``model`` (None: for
    the stored vectors' model), or None."""
    return one(connection().execute(_STATE, {"model": model}))


def save_calibration(calibration: Calibration, dimension: int) -> dict[str, Any]:
    """Store ``calibration`` (the newest row of its model is the one used); the row as stored. The table's CHECKs
    refuse values outside the ranges eros.config.RecallKnobs accepts."""
    c = calibration
    return one(connection().execute(
        "INSERT INTO engine.embedding_calibrations (model, dimension, dedupe_similarity, demote_similarity,"
        " deep_pass_similarity, lexical_weight, importance_weight, demote_penalty, recency_weight,"
        " lexical_year_weight, source, sample)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING to_jsonb(embedding_calibrations) AS row",
        (c.model, dimension, c.dedupe_similarity, c.demote_similarity, c.deep_pass_similarity, c.lexical_weight,
         c.importance_weight, c.demote_penalty, c.recency_weight, c.lexical_year_weight, c.source, c.sample)))["row"]


# Each sampled active profile memory's cosine to its nearest neighbour among the active profile memories of the
# same user and category (other than itself): an exact scan of that user's category through the partial profile
# index (migration 0001), per sampled row. The sample is the first ``limit`` rows in the order of a hash of their
# ids: the same rows on every run of an unchanged deployment, spread over users, and no sort of the whole table's
# vectors. Rows whose model (metadata.embed_model) is not ``model`` are left out on both sides.
_NEIGHBOURS = """
WITH sampled AS (
    SELECT id, user_id, category, embedding FROM engine.companion_memories
    WHERE instance_id IS NULL AND superseded_at IS NULL AND coalesce(metadata->>'embed_model', %(model)s) = %(model)s
    ORDER BY md5(id::text)
    LIMIT %(limit)s
)
SELECT 1 - nearest.distance AS cosine
FROM sampled a
CROSS JOIN LATERAL (
    SELECT b.embedding <=> a.embedding AS distance FROM engine.companion_memories b
    WHERE b.user_id = a.user_id AND b.category = a.category AND b.instance_id IS NULL AND b.superseded_at IS NULL
      AND b.id <> a.id AND coalesce(b.metadata->>'embed_model', %(model)s) = %(model)s
    ORDER BY b.embedding <=> a.embedding
    LIMIT 1
) nearest
"""


def neighbour_cosines(model: str, limit: int) -> list[float]:
    """At most ``limit`` cosines, one per sampled memory that has a neighbour of its user and category."""
    rows = connection().execute(_NEIGHBOURS, {"model": model, "limit": limit}).fetchall()
    return [float(r["cosine"]) for r in rows]



def holds(model: str) -> bool:
    """Whether any stored vector names ``model`` (a scan that stops at the first: the recorded model's rows are
    most rows, but when a model changed under a table of none of them, the whole table)."""
    return one(connection().execute(
        "SELECT EXISTS (SELECT 1 FROM engine.companion_memories WHERE metadata->>'embed_model' = %s) AS held",
        (model,)))["held"]
