"""The noise floor is the bias an A/A calibration proves, not the width of its interval."""

from __future__ import annotations

import numpy as np
import pytest
from harness_support import load_harness_module

pytestmark = pytest.mark.fast

stats = load_harness_module("stats")


def test_a_noisy_but_unbiased_aa_run_sets_no_floor():
    aa = list(np.random.default_rng(4).normal(0.0, 0.15, 30))
    lo, hi, _ = stats.median_interval(aa, 0.95)
    assert lo < 0 < hi and hi - lo > 0.05  # wide, and holding 0
    floor = stats.noise_floor(aa, 0.95, 0, seed=0)
    assert floor["delta"] == 0.0
    assert stats.pass_threshold(floor["delta"], 0.05) == pytest.approx(1.05)


@pytest.mark.parametrize("bias", [0.12, -0.12])
def test_a_biased_aa_run_raises_the_bar_by_the_bias_it_proves(bias):
    aa = list(np.random.default_rng(5).normal(bias, 0.02, 30))
    lo, hi, _ = stats.median_interval(aa, 0.95)
    assert lo > 0 or hi < 0
    floor = stats.noise_floor(aa, 0.95, 0, seed=0)
    nearer = lo if bias > 0 else -hi
    assert floor["delta"] == pytest.approx(np.expm1(nearer))
    assert 0.08 < floor["delta"] < 0.13  # the least bias the run is sure of, not its far end
    assert stats.pass_threshold(floor["delta"], 0.05) == pytest.approx(1 + floor["delta"])


def test_a_twenty_percent_gain_clears_the_bar_of_a_noisy_unbiased_host():
    rng = np.random.default_rng(6)
    aa = list(rng.normal(0.0, 0.15, 30))
    gain = list(rng.normal(np.log(1.2), 0.15, 30))
    threshold = stats.pass_threshold(stats.noise_floor(aa, 0.95, 0, seed=0)["delta"], 0.05)
    lo = stats.speedup(gain, 0.95, 0, seed=0)["lo"]
    assert lo > threshold
