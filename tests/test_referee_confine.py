"""Hostile candidates against the worker's confinement and the referee's fail-closed reading of
its bytes and CPU (tests/fixtures/referee, issue 29): each must come out not-PASS with its
evidence document written, never a crashed action. Where a private referee switch
(_RSI_TEST_UNCONFINED, which candidate code cannot set) removes a defence, a second test shows
the attack working without it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness_support import TASKS, run_harness, task_spec

pytestmark = pytest.mark.e2e

REFEREE = Path(__file__).resolve().parent / "fixtures" / "referee"
BASELINE = TASKS / "softmax" / "baseline"
MEASURE = {
    "workload": {"name": "bench", "shape": [64, 1024], "dtype": "float32", "kind": "normal"},
    "warmups": 1,
    "samples": 3,
    "pairs": 2,
}


def _spec() -> dict:
    return task_spec("softmax", measure=dict(MEASURE), call_timeout_s=10)


def _run(script: str, tmp: Path, impl: Path):
    """(process, evidence document or None)."""
    tmp.mkdir(parents=True, exist_ok=True)
    spec_path, out = tmp / f"{script}.spec.json", tmp / f"{script}.{impl.name}.json"
    spec_path.write_text(json.dumps(_spec()))
    args = ["--task", str(TASKS / "softmax"), "--spec", str(spec_path), "--out", str(out)]
    if script == "check.py":
        args += ["--impl", str(impl)]
    else:
        args += ["--baseline", str(BASELINE), "--candidate", str(impl)]
    proc = run_harness(script, args, tmp)
    return proc, (json.loads(out.read_text()) if out.exists() else None)


def check(tmp: Path, name: str) -> dict:
    proc, doc = _run("check.py", tmp, REFEREE / name)
    assert proc.returncode == 0 and doc is not None, proc.stderr[-2000:]
    return doc


def measure(tmp: Path, name: str) -> dict:
    proc, doc = _run("measure.py", tmp, REFEREE / name)
    # NB: a measurement on a busy host exits 75 (host_busy, never cached) with its documents
    assert proc.returncode in (0, 75) and doc is not None, proc.stderr[-2000:]
    return doc


def _details(doc: dict) -> str:
    return json.dumps(doc["reasons"])


@pytest.mark.parametrize("name", ["zygote_poisoner", "signaller"])
def test_a_worker_cannot_reach_its_zygote(tmp_path, name):
    """Defence: the zygote and workers are non-dumpable and every worker runs under the seccomp
    filter (confine.py) with no capabilities: process_vm_readv/writev, ptrace, signals and
    scheduling changes aimed at the zygote, its group or kill(-1) are refused. The fixture
    raises REACHED when any got through, and returns zeros when all were refused."""
    doc = check(tmp_path, name)
    assert doc["status"] == "candidate_failure"
    assert doc["failure_kind"] == "wrong_output", _details(doc)
    assert "REACHED" not in _details(doc)
    conf = doc["referee"]["confinement"]
    assert conf["seccomp"] == 2 and conf["dumpable"] is False and conf["cap_eff"] == 0


@pytest.mark.parametrize(
    ("name", "removed"), [("zygote_poisoner", "dump,seccomp"), ("signaller", "seccomp")]
)
def test_without_the_confinement_the_zygote_is_reached(tmp_path, monkeypatch, name, removed):
    """The fixtures above really attack: with the defence switched off they reach the zygote."""
    monkeypatch.setenv("_RSI_TEST_UNCONFINED", removed)
    doc = check(tmp_path, name)
    assert doc["failure_kind"] == "exception" and "REACHED" in _details(doc), _details(doc)
    assert doc["referee"]["unconfined"] == removed.split(",")


def test_truncating_the_shared_buffers_is_refused(tmp_path):
    """Defence: the memfds are sealed (F_SEAL_SHRINK | F_SEAL_GROW) before the worker gets
    them: its ftruncate fails and the referee's mappings never fault."""
    doc = check(tmp_path, "memfd_truncator")
    assert doc["status"] == "candidate_failure" and doc["failure_kind"] == "wrong_output"
    samples = measure(tmp_path, "memfd_truncator")
    assert samples["status"] == "candidate_invalid"


def test_without_seals_the_truncator_kills_the_referee(tmp_path, monkeypatch):
    monkeypatch.setenv("_RSI_TEST_UNCONFINED", "seal")
    proc, doc = _run("check.py", tmp_path, REFEREE / "memfd_truncator")
    assert proc.returncode == -7 and doc is None  # SIGBUS, no verdict


@pytest.mark.parametrize(("name", "why"), [("deep_reply", "nested"), ("nan_reply", "NaN")])
def test_a_forged_reply_the_protocol_refuses_is_the_candidates_crash(tmp_path, name, why):
    """Defence: replies are depth-checked before json.loads, NaN/Infinity refused, every field
    checked (referee.parse_reply); without it the referee raised RecursionError (deep_reply)
    or could not write check.json (nan_reply) and the action ended with no document."""
    doc = check(tmp_path, name)
    assert doc["status"] == "candidate_failure" and doc["failure_kind"] == "crash"
    assert why in doc["reasons"][0]["detail"]
    samples = measure(tmp_path, name)
    assert samples["status"] == "candidate_invalid"
    assert samples["invalid"]["candidate"][0]["code"] == "crash"
    assert why in samples["invalid"]["candidate"][0]["detail"]


def test_a_helper_reparented_to_the_zygote_is_counted_per_call(tmp_path):
    """Defence: each call's CPU is read over the whole sandbox (rooted at its bwrap), not the
    worker's subtree: a double-forked helper re-parented to the zygote is counted. Without it,
    the per-call figures missed the helper and the per-arm total allowed it: a valid arm."""
    assert check(tmp_path, "double_fork_burner")["status"] == "ok"
    doc = measure(tmp_path, "double_fork_burner")
    assert doc["status"] == "candidate_invalid"
    reason = doc["invalid"]["candidate"][0]
    assert reason["code"] == "cpu_overuse" and "during its calls" in reason["detail"], reason
    assert not doc["invalid"]["baseline"]


def test_a_worker_whose_main_thread_exits_cannot_skip_the_cpu_check(tmp_path):
    """Defence: a call whose CPU figures cannot be read (the main thread never went back to
    sleep: it exited) fails the arm as cpu_unread. Without it the per-call checks were
    skipped silently and two threads on a threads = 1 binding went unseen."""
    assert check(tmp_path, "main_thread_exits")["status"] == "ok"
    doc = measure(tmp_path, "main_thread_exits")
    assert doc["status"] == "candidate_invalid"
    reason = doc["invalid"]["candidate"][0]
    assert reason["code"] == "cpu_unread" and "main thread exited" in reason["detail"], reason
    assert not doc["invalid"]["baseline"]
