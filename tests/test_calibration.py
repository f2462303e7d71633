"""Thresholds per embedding model (issue 30): the quantile mapping of eros.calibration."""
from __future__ import annotations

import random

import pytest

from eros.calibration import (
    REFERENCE,
    REFERENCE_QUANTILES,
    SHIPPED,
    Calibration,
    _at_share,
    calibrate,
    map_threshold,
    quantiles,
)


def _like(grid, n=1000):
    """``n`` values whose quantiles are ``grid`` (piecewise linear between them)."""
    return [_at_share(grid, i / (n - 1)) for i in range(n)]


def test_the_reference_distribution_maps_onto_itself():
    same = calibrate("e5-again", _like(REFERENCE_QUANTILES))
    assert same.demote_similarity == pytest.approx(REFERENCE.demote_similarity, abs=0.005)
    assert same.deep_pass_similarity == pytest.approx(REFERENCE.deep_pass_similarity, abs=0.005)
    assert same.lexical_weight == pytest.approx(REFERENCE.lexical_weight, rel=0.05)
    assert same.demote_penalty == pytest.approx(REFERENCE.demote_penalty, rel=0.05)
    assert same.recency_weight == pytest.approx(REFERENCE.recency_weight, rel=0.05)
    assert same.source == "calibrated" and same.sample == 1000


def test_the_reference_quantiles_are_measured_not_the_placeholder():
    assert len(REFERENCE_QUANTILES) == 21 and list(REFERENCE_QUANTILES) == sorted(REFERENCE_QUANTILES)
    # e5 packs a memory and its nearest same-category neighbour between about 0.78 and 0.98 (the dev set)
    assert 0.75 < REFERENCE_QUANTILES[0] < REFERENCE.demote_similarity < REFERENCE_QUANTILES[-1] < 0.99


def test_a_lower_wider_scale_gets_lower_thresholds_in_the_same_order_and_larger_weights():
    rng = random.Random(7)
    wide = calibrate("minilm-like", [rng.uniform(0.3, 0.8) for _ in range(2000)])
    assert wide.deep_pass_similarity < wide.demote_similarity < wide.dedupe_similarity < 1
    assert wide.demote_similarity < REFERENCE.demote_similarity
    for weight in ("lexical_weight", "importance_weight", "demote_penalty", "recency_weight", "lexical_year_weight"):
        assert getattr(wide, weight) > getattr(REFERENCE, weight)


def test_a_threshold_above_the_reference_top_stays_above_the_target_top_and_below_one():
    target = quantiles([0.5 + i / 2000 for i in range(1000)])
    assert target[-1] < map_threshold(0.999, REFERENCE_QUANTILES, target) < 1


def test_a_threshold_below_the_reference_bottom_lands_below_the_target_bottom():
    target = quantiles([0.2 + i / 2000 for i in range(1000)])
    below = map_threshold(REFERENCE_QUANTILES[0] - 0.03, REFERENCE_QUANTILES, target)
    assert below < target[0]
    assert map_threshold(REFERENCE_QUANTILES[0] - 0.03, REFERENCE_QUANTILES, REFERENCE_QUANTILES) == pytest.approx(
        REFERENCE_QUANTILES[0] - 0.03)


def test_the_near_duplicate_cut_stays_above_the_closest_pair_of_the_sample():
    # A model that cannot tell a new related fact from its neighbour: most pairs far apart, a few very close. The
    # quantile mapping alone would put the cut inside that top tail, and drop one of the two true facts.
    sample = [0.3 + 0.4 * i / 1999 for i in range(2000)] + [0.88, 0.9, 0.91, 0.929]
    cal = calibrate("tail", sample)
    assert cal.dedupe_similarity > 0.929
    assert map_threshold(REFERENCE.dedupe_similarity, REFERENCE_QUANTILES, quantiles(sample)) <= 0.929


def test_thresholds_stay_in_what_the_settings_accept():
    cal = calibrate("negative", [-0.2 + i / 5000 for i in range(1000)])
    for cut in (cal.dedupe_similarity, cal.demote_similarity, cal.deep_pass_similarity):
        assert 0 < cut <= 1


def test_the_shipped_calibrations_are_calibrated_values_under_the_model_names():
    for name, cal in SHIPPED.items():
        assert isinstance(cal, Calibration)
        assert cal.model == name or name in ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")
        assert cal.deep_pass_similarity <= cal.demote_similarity < cal.dedupe_similarity < 1
    minilm = SHIPPED["all-MiniLM-L6-v2"]
    assert minilm.demote_similarity < 0.5 < REFERENCE.demote_similarity  # its cosines sit far lower than e5's
    assert minilm.source == "shipped" and minilm.sample > 0


@pytest.mark.parametrize("sample", [[], [0.5] * 10])
def test_too_few_neighbours_is_refused_with_the_count(sample):
    with pytest.raises(ValueError, match=f"there are {len(sample)}$"):
        calibrate("m", sample)
