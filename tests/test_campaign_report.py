"""The campaign report and the documents behind it: failure reasons are shown, a round that did
not pass never has its speedup presented as counting, unknown numbers are null or said in words
(never "None"), `best` with no round is `none`, a project's samples keep their own unit, and a
relative error where the reference is 0 is unknown."""

from __future__ import annotations

import json
import sys
from importlib import util
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
HARNESS = REPO / "rules" / "harness"


def _harness(stem: str):
    # NB: harness scripts import their siblings (`_common`, `stats`) by name
    if str(HARNESS) not in sys.path:
        sys.path.insert(0, str(HARNESS))
    spec = util.spec_from_file_location(f"rsi_test_report_{stem}", HARNESS / f"{stem}.py")
    module = util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _round(n: int, verdict: str, point: float | None, reasons=(), failure_kind=None) -> dict:
    sp = None if point is None else {"point": point, "lo": point * 0.9, "hi": point * 1.1}
    return {
        "round": n,
        "label": f"//p:c.round-{n}",
        "verdict": verdict,
        "speedup": sp,
        "reasons": [{"code": c, "detail": d} for c, d in reasons],
        "correctness": {"failure_kind": failure_kind},
        "candidate": {"digest": f"d{n}", "files": {}, "hypothesis": f"h{n}"},
        "usage": {},
    }


ROUNDS = [
    _round(1, "PASS", 1.5),
    _round(
        2,
        "FAIL",
        2.4,
        reasons=[("candidate_check_failed", "case normal_f32: max abs err 0.3 > atol")],
        failure_kind="wrong_output",
    ),
    _round(3, "INCONCLUSIVE", 1.02, reasons=[("below_threshold", "1.02x < 1.05x")]),
    _round(4, "FAIL", None, reasons=[("syntax_error", "kernel.py line 3")]),
]


@pytest.mark.fast
def test_the_report_shows_why_rounds_did_not_pass():
    report = _harness("report")
    doc = report.report("//p:c", ROUNDS, {"selected": None, "rule": "r"}, {"state": "pending"})
    why = {r["round"]: r["why"] for r in doc["rounds"]}
    assert why[1] == []
    assert why[2] == [
        {"code": "candidate_check_failed", "detail": "case normal_f32: max abs err 0.3 > atol"}
    ]
    assert why[4][0]["code"] == "syntax_error"
    md = report.markdown(doc)
    assert "## Why rounds did not pass" in md
    assert "- round 2 (FAIL): candidate_check_failed: case normal_f32: max abs err 0.3" in md
    assert "- round 3 (INCONCLUSIVE): below_threshold: 1.02x < 1.05x" in md
    assert "- round 4 (FAIL): syntax_error: kernel.py line 3" in md


@pytest.mark.fast
def test_a_round_that_did_not_pass_never_shows_its_speedup_as_counting():
    report = _harness("report")
    doc = report.report("//p:c", ROUNDS, {"selected": None, "rule": "r"}, {"state": "pending"})
    counts = {r["round"]: r["speedup_counts"] for r in doc["rounds"]}
    assert counts == {1: True, 2: False, 3: False, 4: False}
    rows = {
        line.split("|")[1].strip(): line
        for line in report.markdown(doc).splitlines()
        if line.startswith("| ") and line.split("|")[1].strip().isdigit()
    }
    assert "| 1.500 |" in rows["1"] and "not counted" not in rows["1"]
    assert "(2.400, not counted)" in rows["2"] and "| 2.400 |" not in rows["2"]
    assert "(1.020, not counted)" in rows["3"]
    assert "not counted" not in rows["4"]  # nothing measured: nothing to discount
    assert "only PASS rounds are eligible" in report.markdown(doc)


@pytest.mark.fast
def test_the_verdict_table_never_prints_pairs_none():
    render = _harness("render")
    text = render.render(
        {"verdict": "FAIL", "speedup": None, "noise_floor": None, "n_pairs": None, "reasons": []},
        {"cases": []},
    )
    assert "None" not in text and "nullx" not in text
    assert "pairs: none measured" in text and "threshold: null " in text
    text = render.render({"verdict": "PASS", "n_pairs": 12, "threshold": 1.05}, {"cases": []})
    assert "pairs: 12" in text and "threshold: 1.050x" in text


@pytest.mark.fast
def test_best_with_no_round_is_none_as_documented():
    from rsi.label import Label
    from rules.campaign.documents import best_summary

    best = best_summary(None, None, {}, Label.parse("//p:c.best"))
    assert best["state"] == "none" and best["n_rounds"] == 0
    docs = (REPO / "docs" / "agents.md").read_text()
    assert "`none` (no round passed yet, or no round yet" in " ".join(docs.split())


@pytest.mark.fast
def test_max_rel_err_is_null_where_the_reference_is_zero():
    common = _harness("_common")
    ref = np.array([0.0, 1.0, 2.0], dtype=np.float64)
    # an error only where the reference is 0: its relative size is unbounded, so unknown
    cmp = common.compare(np.array([1e-3, 1.0, 2.0]), ref, atol=1e-2, rtol=1e-5)
    assert cmp["passed"] and cmp["max_abs_err"] == pytest.approx(1e-3)
    assert cmp["max_rel_err"] is None
    # an exact match: a real 0.0
    exact = common.compare(ref.copy(), ref, atol=0.0, rtol=0.0)
    assert exact["max_rel_err"] == 0.0 and exact["max_abs_err"] == 0.0
    # an all-zero reference with an error: null too
    zeros = np.zeros(3)
    assert common.compare(np.full(3, 1e-9), zeros, atol=1e-6, rtol=0.0)["max_rel_err"] is None
    # errors only where the reference is not 0: the ordinary relative error
    cmp = common.compare(np.array([0.0, 1.1, 2.0]), ref, atol=0.0, rtol=0.2)
    assert cmp["max_rel_err"] == pytest.approx(0.1)


@pytest.mark.fast
def test_a_projects_samples_keep_their_own_unit_and_still_assess():
    project = _harness("project")
    doc = {
        "pairs": [
            {
                "index": 0,
                "arms": {
                    "baseline": {"valid": True, "samples": [0.5, 0.6]},
                    "candidate": {"valid": True, "samples": [0.25, 0.3]},
                },
            }
        ]
    }
    seen = project._as_task_samples(doc)
    assert seen["pairs"][0]["arms"]["candidate"]["samples_ns"] == [0.25, 0.3]
    assert "samples_ns" not in doc["pairs"][0]["arms"]["candidate"]  # evidence unchanged
    assert project._as_task_samples({"status": "x"}) == {"status": "x"}
    text = (HARNESS / "project.py").read_text()
    assert 'record["samples_ns"]' not in text and '"sample_unit"' in text
    json.dumps(seen)


@pytest.mark.fast
def test_a_bench_runs_printed_evidence_is_kept_per_arm_also_when_the_run_is_invalid(tmp_path):
    """Latency percentiles, an engine's version and a server log tail printed beside the samples
    are each arm's evidence in the measure document; an invalid run keeps its printed reason and
    says why in the pair's reason; output too large to keep is named, not kept."""
    import subprocess

    base = tmp_path / "base"
    base.mkdir()
    (base / "bench.py").write_text(
        "import json, os, sys\n"
        "mode = open('mode').read().strip()\n"
        "doc = {'samples': [1.5, 1.25], 'ttft_ms': {'p50': 15.2, 'p99': 22.8},\n"
        "       'engine': {'version': '0.32.0'}, 'server_log_tail': ['ready'], 'ok': True}\n"
        "if mode == 'bad':\n"
        "    doc = {'ok': False, 'reason': {'code': 'run_invalid', 'detail': '1 errored'}}\n"
        "    print(json.dumps(doc)); print('bench: run invalid: 1 errored', file=sys.stderr)\n"
        "    sys.exit(1)\n"
        "if mode == 'huge':\n"
        "    doc['server_log_tail'] = ['x' * 1000] * 100\n"
        "print(json.dumps(doc))\n"
    )
    (base / "mode").write_text("good\n")
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    spec = {
        "schema": "rsi.project.spec/1",
        "editable": ["mode"],
        "protocol": ["bench.py"],
        "quality": {"cmd": "true", "field": "ok", "timeout_s": 30},
        "benchmark": {"cmd": "python3 bench.py", "timeout_s": 30},
        "measure": {"pairs": 2, "metric": "tokens_per_s", "direction": "maximize"},
        "assess": {},
        "env": {},
        "seed": 7,
        "threads": None,
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))

    def bench(mode: str) -> dict:
        (overlay / "mode").write_text(mode + "\n")
        out = tmp_path / f"samples-{mode}.json"
        proc = subprocess.run(
            [sys.executable, "-I", str(HARNESS / "project.py"), "bench"]
            + ["--spec", str(tmp_path / "spec.json"), "--base", str(base)]
            + ["--overlay", str(overlay), "--out", str(out)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        return json.loads(out.read_text())

    good = bench("good")
    assert good["status"] == "ok" and good["n_complete_pairs"] == 2
    for pair in good["pairs"]:
        for arm in pair["arms"].values():
            assert arm["samples"] == [1.5, 1.25]
            assert arm["output"]["ttft_ms"] == {"p50": 15.2, "p99": 22.8}
            assert arm["output"]["engine"] == {"version": "0.32.0"}
            assert arm["output"]["server_log_tail"] == ["ready"]
            assert "samples" not in arm["output"]  # kept once, as the samples

    bad = bench("bad")
    assert bad["status"] == "candidate_invalid" and bad["n_complete_pairs"] == 0
    arm = bad["pairs"][0]["arms"]["candidate"]
    assert arm["valid"] is False and arm["samples"] == []
    assert arm["output"]["reason"] == {"code": "run_invalid", "detail": "1 errored"}
    assert arm["reasons"][0]["code"] == "bench_command_failed"
    assert "run invalid: 1 errored" in arm["reasons"][0]["detail"]
    assert bad["pairs"][0]["arms"]["baseline"]["output"]["ttft_ms"]["p99"] == 22.8

    huge = bench("huge")
    arm = huge["pairs"][0]["arms"]["candidate"]
    assert arm["valid"] is True and arm["samples"] == [1.5, 1.25]
    assert "not_kept" in arm["output"] and "server_log_tail" in arm["output"]["keys"]
