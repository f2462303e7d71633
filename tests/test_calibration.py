"""Thresholds per embedding model (issue 30): the quantile mapping of eros.calibration."""
from __future__ import annotations

import random

import pytest

from eros.calibration import REFERENCE, REFERENCE_QUANTILES, calibrate, map_threshold, quantiles


def test_the_reference_distribution_maps_onto_itself():
    same = calibrate("e5-again", [REFERENCE_QUANTILES[0] + (REFERENCE_QUANTILES[-1] - REFERENCE_QUANTILES[0]) * i / 999
                                  for i in range(1000)])
    assert same.demote_similarity == pytest.approx(REFERENCE.demote_similarity, abs=0.005)
    assert same.deep_pass_similarity == pytest.approx(REFERENCE.deep_pass_similarity, abs=0.005)
    assert same.lexical_weight == pytest.approx(REFERENCE.lexical_weight, rel=0.05)
    assert same.source == "calibrated" and same.sample == 1000


def test_a_lower_wider_scale_gets_lower_thresholds_in_the_same_order_and_larger_weights():
    rng = random.Random(7)
    wide = calibrate("minilm-like", [rng.uniform(0.3, 0.8) for _ in range(2000)])
    assert wide.deep_pass_similarity < wide.demote_similarity < wide.dedupe_similarity < 1
    assert wide.demote_similarity < REFERENCE.demote_similarity
    assert wide.lexical_weight > REFERENCE.lexical_weight and wide.importance_weight > REFERENCE.importance_weight


def test_a_threshold_above_the_reference_top_stays_above_the_target_top_and_below_one():
    target = quantiles([0.5 + i / 2000 for i in range(1000)])
    assert target[-1] < map_threshold(0.999, REFERENCE_QUANTILES, target) < 1


@pytest.mark.parametrize("sample", [[], [0.5] * 10])
def test_too_few_neighbours_is_refused_with_the_count(sample):
    with pytest.raises(ValueError, match=f"there are {len(sample)}$"):
        calibrate("m", sample)
