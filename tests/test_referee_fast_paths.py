"""The referee's faster paths (issue 31 point 5) judge exactly as the slower ones did: every
timed output's value check (the count-only `mismatched` against check's `compare`) and the
/proc reads a verdict rests on (read whole, however long)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from harness_support import load_harness_module

pytestmark = pytest.mark.fast

common = load_harness_module("_common")
judge = load_harness_module("measure_judge")
proctree = load_harness_module("proctree")

EDGES = np.array(
    [0.0, -0.0, 1.0, -1.0, np.nan, np.inf, -np.inf, 1e-300, 1e300, 1 + 1e-6, 1 - 1e-5, 1e-6, 2e-6]
)


def _old_mask(actual, expected, atol, rtol):
    """compare()'s pass mask as it was written before the shared one (the reference rule)."""
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(actual - expected)
        ok = (actual == expected) | (err <= atol + rtol * np.abs(expected))
        ok &= ~np.isnan(actual) & ~np.isnan(expected)
    return ok


@pytest.mark.parametrize("atol, rtol", [(1e-6, 1e-5), (0.0, 0.0), (1e-12, 1e-10)])
def test_the_count_only_check_passes_and_fails_exactly_what_compare_does(atol, rtol):
    rng = np.random.default_rng(0)
    actual, expected = rng.choice(EDGES, 50_000), rng.choice(EDGES, 50_000)
    want = int(np.count_nonzero(~_old_mask(actual, expected, atol, rtol)))
    assert common.mismatched(actual, expected, atol, rtol) == want
    assert common.compare(actual, expected, atol, rtol)["mismatched"] == want
    assert (
        common.within_tolerance(actual, expected, atol, rtol)
        == _old_mask(actual, expected, atol, rtol)
    ).all()


@pytest.mark.parametrize("shape", [(), (1,), (3, 0)])
def test_a_scalar_or_empty_output_is_compared_as_an_array(shape):
    """A loss is a 0-d array; numpy's ufuncs return scalars for it, which the shared mask must
    not write into (a kernelbench baseline failed its own check on exactly that)."""
    rng = np.random.default_rng(1)
    for actual, expected in [
        (rng.choice(EDGES, shape), rng.choice(EDGES, shape)) for _ in range(40)
    ]:
        actual, expected = np.asarray(actual), np.asarray(expected)
        want = int(np.count_nonzero(~_old_mask(actual, expected, 1e-6, 1e-5)))
        assert common.mismatched(actual, expected, 1e-6, 1e-5) == want
        assert common.compare(actual, expected, 1e-6, 1e-5)["mismatched"] == want


class _Oracle:
    def reference(self, x):
        return np.asarray(x, dtype=np.float64) * 2.0


def _judge(output: np.ndarray) -> tuple[bool, dict]:
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    expected = {"shape": [8, 8], "dtype": "float32", "device": "cpu", "nbytes": x.nbytes}
    pair = {"index": 0, "timed_inputs": [{"x": x}], "digests": ["d0"]}
    doc = {"output_digests": [], "reasons": []}
    failed = judge.judge_output(
        doc, pair, judge.Oracle(_Oracle()), expected, 0, output.tobytes(), {}, 1e-6, 1e-5
    )
    return failed, doc


def test_a_timed_output_one_value_off_or_nan_fails_and_a_right_one_passes():
    right = (np.arange(64, dtype=np.float32) * 2).reshape(8, 8)
    failed, doc = _judge(right)
    assert not failed and doc["reasons"] == [] and len(doc["output_digests"]) == 1
    for bad in (1e-3, np.nan):
        wrong = right.copy()
        wrong[3, 5] = right[3, 5] + bad
        failed, doc = _judge(wrong)
        assert failed and doc["reasons"][0]["code"] == "wrong_output"
        assert "1 of 64 values" in doc["reasons"][0]["detail"]


def test_a_proc_file_is_read_whole_however_long(tmp_path):
    """A children list can pass one read's 4096 bytes: a short read would hide processes."""
    path = tmp_path / "children"
    text = b" ".join(str(100000 + k).encode() for k in range(3000))
    path.write_bytes(text)
    assert len(text) > 4 * 4096 and proctree._read(str(path)) == text
    assert proctree._read(f"/proc/{os.getpid()}/stat").startswith(b"%d (" % os.getpid())
