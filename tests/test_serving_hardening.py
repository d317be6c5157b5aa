"""The serving judge's hardening (issue 29 point 6): each hostile fixture under
tests/fixtures/serving/ comes out not-PASS with a reason, and each test fails with its defence
removed. Unit-level: no vLLM server is started here (tests/test_serving.py holds the e2e ones).
"""

from __future__ import annotations

import importlib.util
import subprocess
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
from test_serving import _run_arm, _serving_env

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


_TEARDOWN_PROBE = """
import json, os, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
import serve_bench as j
j.become_subreaper()
group = subprocess.Popen(
    [sys.executable, sys.argv[2], sys.argv[3]], start_new_session=True
)
group.wait()  # NB: the escaper's first parent exits at once: the helper is an orphan now
for _ in range(100):
    if os.path.exists(sys.argv[3]) and os.path.getsize(sys.argv[3]):
        break
    time.sleep(0.05)
escaped, left = j.end_descendants()
print(json.dumps({"escaped": escaped, "left": left}))
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


@pytest.mark.fast
def test_a_setsid_helper_is_found_and_ended_with_the_arm(tmp_path):
    """The group kill misses a setsid'd, double-forked helper; the judge, as subreaper, still
    finds it among its descendants, ends it, and reports it."""
    pidfile = tmp_path / "escaper.pid"
    try:
        probe = subprocess.run(
            [
                sys.executable,
                "-c",
                _TEARDOWN_PROBE,
                str(PROJECT),
                str(FIXTURES / "setsid_escaper" / "escape.py"),
                str(pidfile),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        pid = int(pidfile.read_text())
        assert probe.returncode == 0, probe.stderr
        doc = json.loads(probe.stdout.strip().splitlines()[-1])
        assert pid in doc["escaped"] and doc["left"] == [], doc
        assert not _alive(pid)
    finally:
        # NB: only the helper this test started, even when the probe timed out
        if pidfile.exists() and pidfile.read_text().strip():
            stray = int(pidfile.read_text())
            if _alive(stray):
                os.kill(stray, signal.SIGKILL)


@pytest.mark.e2e
def test_e2e_a_model_whose_helper_escapes_the_group_is_not_pass_and_ends(tmp_path):
    """One real vLLM arm: the candidate's model file spawns a setsid'd helper inside the
    server; the arm is not ok (escaped_process) and no such helper is alive afterwards."""
    _serving_env()
    proc, doc = _run_arm(tmp_path, "quality", overlay=FIXTURES / "setsid_escaper")
    survivors = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if b"rsi_setsid_escaper_sleep" in cmd and _alive(int(entry)):
                survivors.append(int(entry))
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)  # NB: only the fixture's own marked helper
    assert proc.returncode == 0, proc.stderr
    assert doc["ok"] is False and doc["reason"]["code"] == "escaped_process", doc["reason"]
    assert doc["teardown"]["escaped"] and doc["teardown"]["left"] == []
    # the model itself is right: the public prompts still matched
    assert doc["correctness"]["mismatch"] is None
    assert survivors == []


class _StandIn:
    def __init__(self, url: str) -> None:
        self.url = url


@pytest.mark.fast
def test_a_model_wrong_only_on_benchmark_requests_fails_the_secret_sample(tmp_path):
    """A stand-in server right on the three public prompts and wrong on every trace request:
    the public check passes, the secret sample of benchmark requests does not."""
    judge = _load(PROJECT / "serve_bench.py", "serve_bench_hardening_sample")
    binding = json.loads((PROJECT / "serve.json").read_text())
    trace = judge.parse_trace((PROJECT / "trace.jsonl").read_bytes(), binding)
    script = FIXTURES / "wrong_on_benchmark" / "standin.py"
    for mode in ("hostile", "honest"):
        port = judge.free_port()
        proc = subprocess.Popen(
            [sys.executable, str(script), str(PROJECT / "serve.json"), str(port), mode]
        )
        try:
            server = _StandIn(f"http://127.0.0.1:{port}")
            for _ in range(100):
                try:
                    judge.http(f"{server.url}/v1/completions", {"prompt": "x", "max_tokens": 1})
                    break
                except OSError:
                    time.sleep(0.1)
            c = binding["correctness"]
            got = []
            for prompt in c["prompts"]:
                body = {"prompt": prompt, "max_tokens": c["max_tokens"]}
                doc = json.loads(judge.http(f"{server.url}/v1/completions", body))
                got.append(doc["choices"][0]["token_ids"])
            assert judge.compare_tokens(c["expected_token_ids"], got) is None
            if mode == "hostile":
                with pytest.raises(judge.Invalid) as exc:
                    judge.check_benchmark_sample(server, binding, trace)
                assert exc.value.code == "wrong_output"
            else:
                doc = judge.check_benchmark_sample(server, binding, trace)
                assert len(doc["requests"]) == binding["workload"]["secret_sample"]
        finally:
            proc.kill()
            proc.wait()
    # a binding without the references cannot be checked: not ok, with a reason
    del binding["workload"]["reference_token_ids"]
    with pytest.raises(judge.Invalid) as exc:
        judge.check_benchmark_sample(_StandIn("http://127.0.0.1:9"), binding, trace)
    assert exc.value.code == "sample_unchecked"
