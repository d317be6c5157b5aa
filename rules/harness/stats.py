"""Statistics for paired timing evidence: per-pair log ratios, bootstrap intervals, noise floor. It
must never read the clock or a file.

Pure functions of their arguments, stdlib only (an assessment starts no numpy: a regrade runs
one per round); randomness comes only from an explicit seed.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import statistics

METHOD = (
    "distribution-free interval of the median per-pair log ratio from order statistics "
    "(sign-test inversion; exact binomial coverage >= the stated confidence), widened on each "
    "side by the run-to-run shift the binding's A/A calibration shows (|log of its point|)"
)


SEQUENTIAL_METHOD = (
    "group-sequential order-statistic interval of the median per-pair log ratio at the look the "
    "run stopped at (rules/harness/sequential.py), widened on each side by the A/A run shift"
)


def arm_value(samples_ns: Sequence[float], metric: str, units_per_call: float | None) -> float:
    """One arm's summary: median latency in ns, or median throughput in units per second."""
    ns = [float(v) for v in samples_ns]
    if not ns or any(v <= 0 for v in ns):
        raise ValueError("an arm needs at least one positive sample")
    if metric == "latency":
        return float(statistics.median(ns))
    return float(statistics.median(float(units_per_call) / (v * 1e-9) for v in ns))


def log_ratio(baseline_value: float, candidate_value: float, direction: str) -> float:
    """log of the improvement factor: > 0 means the candidate is better."""
    if direction == "minimize":
        return math.log(baseline_value) - math.log(candidate_value)
    if direction == "maximize":
        return math.log(candidate_value) - math.log(baseline_value)
    raise ValueError(f"direction must be minimize or maximize, not {direction!r}")


def seed_from(*blobs: bytes) -> int:
    h = hashlib.sha256(b"rsi-assess-bootstrap-v1\0")
    for blob in blobs:
        h.update(hashlib.sha256(blob).digest())
    return int.from_bytes(h.digest()[:8], "big")


def median_interval(log_ratios: Sequence[float], confidence: float) -> tuple[float, float, float]:
    """(lo, hi, coverage): the order statistics x(k), x(n-k+1) around the median of `log_ratios`
    with the largest k whose exact binomial coverage is still >= `confidence`.

    It assumes only that pairs are independent draws whose median is the true one (no symmetry,
    no normality), which AB/BA-alternated pairs with fresh inputs are. With too few pairs for
    the confidence (n < 6 at 95 %) it is the whole range and `coverage` says how much it holds.
    """
    x = sorted(float(v) for v in log_ratios)
    n = len(x)
    if n == 0:
        raise ValueError("no pairs")
    if not 0 < confidence < 1:
        raise ValueError("confidence must lie in (0, 1)")
    tail = (1.0 - confidence) / 2.0
    pmf = [math.comb(n, i) / 2.0**n for i in range(n + 1)]
    k, below = 1, 0.0  # NB: below = P(B <= k - 1), B ~ Binomial(n, 1/2)
    best = None
    while k <= n // 2:
        below += pmf[k - 1]
        if below > tail:
            break
        best = (k, below)
        k += 1
    if best is None:
        return float(x[0]), float(x[-1]), float(1.0 - 2.0 * pmf[0])
    k, below = best
    return float(x[k - 1]), float(x[n - k]), float(1.0 - 2.0 * below)


def speedup(
    log_ratios: Sequence[float],
    confidence: float,
    resamples: int,
    seed: int,
    run_shift: float = 0.0,
    interval: tuple[float, float, float] | None = None,
) -> dict:
    """Point estimate exp(median log ratio) and its interval, as factors (1.0 = same).

    `run_shift` (log scale, >= 0) widens the interval on both sides. The order-statistic
    interval holds for pairs that are independent draws; the pairs of one run share that run's
    state (its workers' sandboxes, heap layouts, where the host's caches and clocks stand), so
    a whole run can sit off the truth by more than its pairs scatter. An A/A run of the same
    binding shows the size of that shift (its median log ratio, where the truth is 0); it is
    added on each side. bench/measurement_quality.py measures the coverage this gives.
    `interval` (lo, hi, coverage on the log scale) replaces the fixed-n order-statistic one:
    a sequential design's interval at the look the run stopped at (sequential.py)."""
    x = [float(v) for v in log_ratios]
    shift = float(run_shift)
    if not math.isfinite(shift) or shift < 0:
        raise ValueError(f"run_shift must be finite and >= 0, not {run_shift!r}")
    lo, hi, coverage = interval if interval is not None else median_interval(x, confidence)
    return {
        "point": math.exp(statistics.median(x)),
        "lo": math.exp(lo - shift),
        "hi": math.exp(hi + shift),
        "run_shift": math.expm1(shift),
        "confidence": float(confidence),
        "coverage": coverage,
        "method": METHOD if interval is None else SEQUENTIAL_METHOD,
        "resamples": None,
    }


def noise_floor(
    calibration_log_ratios: Sequence[float], confidence: float, resamples: int, seed: int
) -> dict:
    """delta: the bias of this host and policy that the A/A run proves, on the ratio scale.

    An A/A run compares the baseline with itself. When its interval (log scale) holds 0 it
    shows no bias and delta is 0; when it lies wholly on one side, delta is the distance from
    0 to its nearer end (the least bias the run is sure of), and a candidate must clear that
    on top of min_improvement. NB: the A/A interval's width is not added: the candidate's own
    interval already carries the noise (its coverage is measured by
    bench/measurement_quality.py), and counting it twice hid real gains of 20 %.
    """
    lo, hi, _ = median_interval(calibration_log_ratios, confidence)
    x = [float(v) for v in calibration_log_ratios]
    bias = max(0.0, lo, -hi)
    return {
        "delta": math.expm1(bias),
        "aa_point": math.exp(statistics.median(x)),
        "aa_lo": math.exp(lo),
        "aa_hi": math.exp(hi),
        "n_pairs": len(x),
    }


def pass_threshold(delta: float, min_improvement: float) -> float:
    return 1.0 + max(float(delta), float(min_improvement))
