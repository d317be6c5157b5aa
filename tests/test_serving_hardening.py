"""The serving judge's hardening (issue 29 point 6): each hostile fixture under
tests/fixtures/serving/ comes out not-PASS with a reason, and each test fails with its defence
removed. Unit-level: no vLLM server is started here (tests/test_serving.py holds the e2e ones).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ROOT / "tasks" / "serve_tiny" / "project"
HARNESS = ROOT / "rules" / "harness"
FIXTURES = ROOT / "tests" / "fixtures" / "serving"


def _load(path: Path, name: str):
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.fast
def test_a_rewritten_trace_is_refused_before_any_candidate_code_runs(tmp_path):
    judge = _load(PROJECT / "serve_bench.py", "serve_bench_hardening")
    tree = tmp_path / "tree"
    shutil.copytree(PROJECT, tree)
    judge.HERE = tree
    binding = json.loads((tree / "serve.json").read_text())
    # the shipped trace is bound and passes
    data = judge.load_trace(binding)
    assert judge.parse_trace(data, binding)
    # the trace rewriter halves every timestamp (and so the window)
    shutil.copy(FIXTURES / "trace_rewriter" / "trace.jsonl", tree / "trace.jsonl")
    with pytest.raises(judge.Invalid) as exc:
        judge.load_trace(binding)
    assert exc.value.code == "trace_mismatch"
    # a binding without a digest is not checked, so it is not PASS either
    del binding["workload"]["trace_sha256"]
    with pytest.raises(judge.Invalid) as exc:
        judge.load_trace(binding)
    assert exc.value.code == "trace_unchecked"


@pytest.mark.fast
def test_the_trace_is_read_before_the_model_is_built(tmp_path, monkeypatch):
    """arm() checks the trace first: a rewrite made by candidate code later cannot be read."""
    judge = _load(PROJECT / "serve_bench.py", "serve_bench_hardening_order")
    tree = tmp_path / "tree"
    shutil.copytree(PROJECT, tree)
    shutil.copy(FIXTURES / "trace_rewriter" / "trace.jsonl", tree / "trace.jsonl")
    judge.HERE = tree
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(judge, "engine_env_dir", lambda: tmp_path / "no-env")

    def never(*a, **k):
        raise AssertionError("candidate-reachable code ran before the trace was checked")

    monkeypatch.setattr(judge.subprocess, "run", never)
    doc = judge.arm("bench")
    assert doc["ok"] is False and doc["reason"]["code"] == "trace_mismatch", doc


@pytest.mark.fast
def test_samples_forged_onto_the_bench_stdout_are_refused_not_parsed():
    project = _load(HARNESS / "project.py", "rsi_test_serving_project")
    forged = (FIXTURES / "stdout_forger" / "stdout.txt").read_text()
    with pytest.raises(ValueError, match="interference|other output"):
        project.parse_samples(forged)
    # the documented formats still parse
    assert project.parse_samples('{"samples": [812.5], "ok": true}') == [812.5]
    assert project.parse_samples("1.5\n2.5\n") == [1.5, 2.5]
    assert project.parse_samples("[3.0]") == [3.0]


@pytest.mark.fast
def test_a_run_that_writes_the_pristine_baseline_tree_makes_the_candidate_invalid(tmp_path):
    project = _load(HARNESS / "project.py", "rsi_test_serving_project_bench")
    base = tmp_path / "base"
    base.mkdir()
    (base / "bench.py").write_text('import json\nprint(json.dumps({"samples": [2.0]}))\n')
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    shutil.copy(FIXTURES / "baseline_writer" / "bench.py", overlay / "bench.py")
    work = tmp_path / "work"
    work.mkdir()
    spec = {
        "seed": 1,
        "benchmark": {"cmd": "python3 bench.py", "timeout_s": 60},
        "measure": {"pairs": 3},
    }
    doc = project.bench(spec, base, overlay, work)
    assert doc["status"] == "candidate_invalid", doc["invalid"]
    codes = [r["code"] for r in doc["invalid"]["candidate"]]
    assert "pristine_tree_changed" in codes, codes
    # no run copied the tampered tree: the pairs stop at the first change seen
    assert doc["n_pairs"] == 3 and len(doc["pairs"]) < 3
