"""A busy host gives no verdict rather than a wrong one: the referee reads how long it and the
worker waited for a CPU (schedstat) around every timed call; a call that waited over half its
wall is contended, and a measurement where most pairs have an arm mostly contended is
INCONCLUSIVE `host_busy`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from harness_support import TASKS, load_harness_module, run_harness, task_spec

assess = load_harness_module("assess")


def _pair(base_ns: float, cand_ns: float, base_c: float | None, cand_c: float | None) -> dict:
    def arm(ns, c):
        return {"samples_ns": [ns] * 5, "contention": c}

    return {
        "complete": True,
        "arms": {"baseline": arm(base_ns, base_c), "candidate": arm(cand_ns, cand_c)},
    }


MEASURE = {"metric": "latency", "direction": "minimize", "units_per_call": None}


@pytest.mark.fast
def test_a_minority_of_contended_pairs_is_counted_not_busy_and_old_evidence_is_quiet():
    doc = {
        "pairs": [
            _pair(100, 50, 0.5, 0.1),  # half its calls contended: still its own median
            _pair(100, 10, 0.6, 0.0),
            _pair(100, 10, 0.0, 0.51),
            _pair(100, 80, None, None),
            {"complete": False, "arms": {}},
        ]
    }
    ratios = assess.pair_log_ratios(doc, MEASURE)
    assert len(ratios) == 4  # contended pairs stay in; a pair without the field is quiet
    assert [assess.contended(p) for p in doc["pairs"][:4]] == [False, True, True, False]
    assert assess._busy(doc) is None  # 2 of 4 complete pairs contended: not most


@pytest.mark.fast
def test_a_mostly_contended_measurement_is_host_busy():
    doc = {"pairs": [_pair(100, 10, 0.8, 0.0)] * 3 + [_pair(100, 100, 0.0, 0.0)] * 2}
    why = assess._busy(doc)
    assert why and why.startswith("3 of 5 pairs had an arm with more than 50%")


@pytest.mark.e2e
def test_cpu_hogs_during_a_measurement_make_the_verdict_host_busy_not_a_pass(tmp_path):
    """Processes spinning on every CPU while a real measurement runs (a fast candidate that
    would PASS on a quiet host): the arms' contention is high and assess says host_busy."""
    spec = task_spec(
        "softmax",
        measure={
            "workload": {"name": "b", "shape": [64, 1024], "dtype": "float32", "kind": "normal"},
            "warmups": 1,
            "samples": 5,
            "pairs": 6,
            "seed": 0,
            "probes": 4,
            "value_checks": 1,
        },
    )
    spec["call_timeout_s"] = 10
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    hog = (
        "import os, time\n"
        "os.nice(0)\n"
        "end = time.monotonic() + 60\n"
        "while time.monotonic() < end:\n"
        "    pass\n"
    )
    hogs = [subprocess.Popen([sys.executable, "-c", hog]) for _ in range(2 * (os.cpu_count() or 1))]
    try:
        time.sleep(0.2)
        out = tmp_path / "samples.json"
        proc = run_harness(
            "measure.py",
            [
                "--task",
                str(TASKS / "softmax"),
                "--baseline",
                str(TASKS / "softmax" / "baseline"),
                "--candidate",
                str(TASKS / "softmax" / "candidates" / "fast"),
                "--spec",
                str(spec_path),
                "--out",
                str(out),
            ],
            tmp_path,
        )
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    # NB: documents written and judged, but the measurement says it must not be cached
    assert proc.returncode == 75, proc.stderr
    assert "the host was busy, not to be cached" in proc.stderr
    doc = json.loads(out.read_text())
    contention = [
        p["arms"][arm]["contention"] for p in doc["pairs"] for arm in p["arms"] if p.get("complete")
    ]
    assert contention and all(c is not None and c >= 0 for c in contention)
    assert assess._busy(doc), f"contention per arm: {contention}"
