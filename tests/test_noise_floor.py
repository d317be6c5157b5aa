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


def _run(rng, truth: float, run_sd: float, pair_sd: float, n: int = 30) -> list:
    """The pairs of one run: all share the run's shift (its sandboxes, heaps, caches)."""
    shift = rng.normal(0.0, run_sd)
    return list(rng.normal(truth + shift, pair_sd, n))


def test_a_runs_interval_is_widened_by_the_shift_its_aa_calibration_shows():
    x = list(np.random.default_rng(7).normal(0.1, 0.02, 30))
    plain = stats.speedup(x, 0.95, 0, seed=0)
    shifted = stats.speedup(x, 0.95, 0, seed=0, run_shift=0.03)
    assert shifted["point"] == plain["point"]  # the estimate stays; only its interval widens
    assert shifted["lo"] == pytest.approx(plain["lo"] * np.exp(-0.03))
    assert shifted["hi"] == pytest.approx(plain["hi"] * np.exp(0.03))
    assert shifted["run_shift"] == pytest.approx(np.expm1(0.03)) and plain["run_shift"] == 0.0
    for bad in (-0.01, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="run_shift"):
            stats.speedup(x, 0.95, 0, seed=0, run_shift=bad)


def test_with_run_level_shifts_the_aa_shift_restores_the_intervals_coverage():
    """Pairs of one run are not independent when the run as a whole sits off the truth: the
    plain order-statistic interval then misses 0 in far more than 5 % of A/A runs. Widened by
    the shift of an independent A/A calibration, it covers the stated 95 % while the run shift
    is up to about the scatter of a run's median (0.015 against 0.016 here; this host measured
    0.007 against 0.016 for softmax, docs/evidence.md). Beyond that one A/A draw cannot size
    it: the documented limit, not tested as a promise."""
    rng = np.random.default_rng(8)
    plain = widened = 0
    runs = 1000
    for _ in range(runs):
        calibration = _run(rng, 0.0, run_sd=0.015, pair_sd=0.07)
        aa = _run(rng, 0.0, run_sd=0.015, pair_sd=0.07)
        shift = abs(float(np.median(calibration)))
        p = stats.speedup(aa, 0.95, 0, seed=0)
        w = stats.speedup(aa, 0.95, 0, seed=0, run_shift=shift)
        plain += p["lo"] <= 1.0 <= p["hi"]
        widened += w["lo"] <= 1.0 <= w["hi"]
    assert plain / runs < 0.9  # the failure this guards against
    assert widened / runs >= 0.95


def test_a_twenty_percent_gain_still_clears_the_bar_after_the_run_shift():
    rng = np.random.default_rng(9)
    passed = 0
    for _ in range(50):
        calibration = _run(rng, 0.0, run_sd=0.01, pair_sd=0.05)
        gain = _run(rng, np.log(1.2), run_sd=0.01, pair_sd=0.05)
        floor = stats.noise_floor(calibration, 0.95, 0, seed=0)
        threshold = stats.pass_threshold(floor["delta"], 0.05)
        shift = abs(np.log(floor["aa_point"]))
        passed += stats.speedup(gain, 0.95, 0, seed=0, run_shift=shift)["lo"] > threshold
    assert passed >= 48
