"""The referee against hostile candidates (tests/fixtures/referee): each tries one way to a PASS
that the referee/worker split closes, and must come out not-PASS with a verdict. Each would get
a PASS (or at least a better number) with its protection removed: the clock in the candidate's
process, inputs from public seeds, a sample of positions checked, public shapes only, advisory
threads, the worker's word or exit status taken as a result."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from harness_support import TASKS, run_harness, task_spec

pytestmark = pytest.mark.e2e

REFEREE = Path(__file__).resolve().parent / "fixtures" / "referee"
BASELINE = TASKS / "softmax" / "baseline"
MEASURE = {
    "workload": {"name": "bench", "shape": [64, 1024], "dtype": "float32", "kind": "normal"},
    "warmups": 2,
    "samples": 10,
    "pairs": 30,
    "seed": 0,
    "probes": 8,
    "value_checks": 2,
}
HIDDEN = {
    "count": 4,
    "ranges": [
        {"shape": [[1, 64], [1, 2048]], "dtype": "float32", "kind": "normal"},
        {"shape": [[2, 48], [2, 512]], "dtype": "float32", "kind": "transposed"},
    ],
}


def spec(**overrides) -> dict:
    overrides = {"measure": dict(MEASURE), "call_timeout_s": 10, "hidden": HIDDEN, **overrides}
    return task_spec("softmax", **overrides)


def _run(script: str, tmp: Path, name: str, args: list[str], spec_doc: dict) -> dict:
    tmp.mkdir(parents=True, exist_ok=True)
    spec_path = tmp / f"{name}.spec.json"
    spec_path.write_text(json.dumps(spec_doc))
    out = tmp / f"{name}.json"
    proc = run_harness(script, [*args, "--spec", str(spec_path), "--out", str(out)], tmp)
    # NB: a measurement on a busy host exits 75 (host_busy, never cached) with its documents
    assert proc.returncode in ((0, 75) if script == "measure.py" else (0,)), proc.stderr
    return json.loads(out.read_text())


def check(tmp: Path, impl: Path, spec_doc: dict | None = None) -> dict:
    return _run(
        "check.py",
        tmp,
        f"check-{impl.name}",
        ["--task", str(TASKS / "softmax"), "--impl", str(impl)],
        spec_doc or spec(),
    )


def measure(tmp: Path, impl: Path, spec_doc: dict | None = None) -> dict:
    return _run(
        "measure.py",
        tmp,
        f"measure-{impl.name}",
        ["--task", str(TASKS / "softmax"), "--baseline", str(BASELINE), "--candidate", str(impl)],
        spec_doc or spec(),
    )


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    """Baseline check and A/A calibration once; then `judge(impl)` -> the assessed verdict."""
    root = tmp_path_factory.mktemp("referee")
    base_check = check(root, BASELINE)
    calibration = measure(root / "aa", BASELINE)
    paths = {"baseline-check": root / "base.json", "calibration": root / "aa.json"}
    paths["baseline-check"].write_text(json.dumps(base_check))
    paths["calibration"].write_text(json.dumps(calibration))

    def run(impl: Path) -> tuple[dict, dict, dict]:
        tmp = root / impl.name
        cand_check, samples = check(tmp, impl), measure(tmp, impl)
        (tmp / "c.json").write_text(json.dumps(cand_check))
        (tmp / "s.json").write_text(json.dumps(samples))
        (tmp / "spec.json").write_text(json.dumps(spec()))
        verdict = _run(
            "assess.py",
            tmp,
            "verdict",
            [
                "--samples",
                str(tmp / "s.json"),
                "--check",
                str(tmp / "c.json"),
                "--baseline-check",
                str(paths["baseline-check"]),
                "--calibration",
                str(paths["calibration"]),
            ],
            spec(),
        )
        return verdict, cand_check, samples

    return run


def candidate_median_ns(samples: dict) -> float:
    return statistics.median(
        ns for p in samples["pairs"] for ns in p["arms"]["candidate"]["samples_ns"]
    )


def test_patched_clocks_do_not_shorten_the_referees_time(judge):
    verdict, cand_check, samples = judge(REFEREE / "patch_clock")
    assert cand_check["status"] == "ok"
    assert verdict["verdict"] != "PASS"
    assert candidate_median_ns(samples) >= 4e6  # the 4 ms sleep is in the referee's clock


def test_introspection_finds_no_oracle_or_later_input(judge):
    verdict, cand_check, samples = judge(REFEREE / "introspect")
    assert cand_check["status"] == "ok"
    assert verdict["verdict"] != "PASS"
    assert candidate_median_ns(samples) >= 4e6  # every call missed and took the slow path


def test_inputs_regenerated_from_public_seeds_never_match(judge):
    verdict, _, samples = judge(REFEREE / "public_seeds")
    assert verdict["verdict"] != "PASS"
    assert candidate_median_ns(samples) >= 4e6
    assert samples["referee"]["seed_source"] == "os.urandom"
    assert samples["referee"]["secret_seed"] != str(MEASURE["seed"])


def test_wrong_values_at_a_few_positions_fail(judge):
    verdict, cand_check, samples = judge(REFEREE / "few_indices")
    assert verdict["verdict"] == "FAIL"
    assert cand_check["failure_kind"] == "wrong_output"
    assert samples["invalid"]["candidate"][0]["code"] == "wrong_output"


def _unless_host_busy(verdict: dict) -> None:
    """A verdict measured while the host monitor saw other load is INCONCLUSIVE `host_busy`
    by design (never cached, retryable): it says nothing about the candidate, so a test of a
    decided verdict skips instead of passing or failing on it."""
    codes = {r["code"] for r in verdict["reasons"]}
    if verdict["verdict"] == "INCONCLUSIVE" and "host_busy" in codes:
        pytest.skip(f"measured on a busy host: {sorted(codes)}")


def test_slow_but_correct_fails_as_slower(judge):
    verdict, cand_check, _ = judge(REFEREE / "slow_correct")
    assert cand_check["status"] == "ok"
    _unless_host_busy(verdict)
    assert verdict["verdict"] == "FAIL"
    assert "slower" in [r["code"] for r in verdict["reasons"]]


def test_a_helper_that_slows_the_next_call_slows_only_its_own_arm(judge):
    """The arms' calls interleave; the other arm's sandbox is stopped while one arm's calls
    run, so a helper woken after each call to burn the CPU slows only the candidate itself."""
    verdict, cand_check, _ = judge(REFEREE / "slows_other_arm")
    assert cand_check["status"] == "ok"
    assert verdict["verdict"] != "PASS", (verdict["speedup"], verdict["reasons"])


def test_a_real_gain_still_passes(judge):
    verdict, _, _ = judge(TASKS / "softmax" / "candidates" / "fast")
    _unless_host_busy(verdict)
    assert verdict["verdict"] == "PASS", verdict["reasons"]


def test_results_of_the_referee_and_the_other_arm_cannot_be_written(tmp_path):
    victim = tmp_path / "victim.json"
    victim.write_text('{"untouched": true}')
    samples = measure(tmp_path, REFEREE / "writes_results")
    cand_check = check(tmp_path, REFEREE / "writes_results")
    assert json.loads(victim.read_text()) == {"untouched": True}
    assert samples["schema"] == "rsi.measure/1" and "forged" not in samples
    assert cand_check["schema"] == "rsi.check/1" and cand_check["status"] == "ok"
    assert samples["referee"]["isolation"]["candidate"] == "namespaces"


def test_special_casing_the_public_shapes_fails_on_hidden_cases(tmp_path):
    doc = check(tmp_path, REFEREE / "public_shapes")
    public = [c for c in doc["cases"] if not c["hidden"]]
    hidden = [c for c in doc["cases"] if c["hidden"]]
    assert all(c["passed"] for c in public)
    assert len(hidden) == 4 and doc["n_hidden"] == 4
    assert doc["status"] == "candidate_failure"
    assert doc["reasons"][0]["case"].startswith("hidden_")
    assert doc["hidden_cases"][0]["shape"] == hidden[0]["shape"]


def test_extra_threads_on_a_one_thread_binding_fail(tmp_path):
    doc = measure(
        tmp_path,
        REFEREE / "extra_threads",
        spec(measure=dict(MEASURE, pairs=2, samples=3, warmups=1)),
    )
    assert doc["status"] == "candidate_invalid"
    assert doc["invalid"]["candidate"][0]["code"] == "cpu_overuse"
    assert not doc["invalid"]["baseline"]


def test_helper_processes_are_caught_however_busy_the_host_is(tmp_path):
    """The same hostile candidate while other processes keep both CPUs busy: its helpers then
    get less than a CPU between them, so their CPU is no longer more than the calls' wall
    time; what is not the calling thread's is counted on its own, and on a threads = 1
    binding it must be nothing."""
    import subprocess
    import sys

    burners = [
        subprocess.Popen(
            [sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<90: pass"]
        )
        for _ in range(3)
    ]
    try:
        doc = measure(
            tmp_path,
            REFEREE / "extra_threads",
            spec(measure=dict(MEASURE, pairs=2, samples=3, warmups=1)),
        )
    finally:
        for b in burners:
            b.kill()
            b.wait()
    assert doc["status"] == "candidate_invalid", doc["invalid"]
    (reason,) = doc["invalid"]["candidate"][:1]
    assert reason["code"] == "cpu_overuse", reason
    assert not doc["invalid"]["baseline"]


def test_two_threads_on_a_one_thread_binding_never_pass(judge):
    """Two threads on calls of a few hundred microseconds: where a spare CPU lets them run at
    once, the worker's CPU clocks read around every call exceed threads x the call's wall
    (cpu_overuse "during its calls"); where the only other CPU is the referee's, they wait for
    it (contended, and slower). Either way, no PASS."""
    verdict, _, samples = judge(REFEREE / "two_threads")
    assert verdict["verdict"] != "PASS", (verdict["speedup"], verdict["reasons"])
    if samples["invalid"]["candidate"]:
        reason = samples["invalid"]["candidate"][0]
        assert reason["code"] == "cpu_overuse" and "during its calls" in reason["detail"]


@pytest.mark.parametrize("name", ["fake_status", "kills_parent"])
def test_a_worker_that_exits_or_kills_its_parent_is_a_candidate_crash(tmp_path, name):
    cand_check = check(tmp_path, REFEREE / name)
    assert cand_check["status"] == "candidate_failure"
    assert cand_check["failure_kind"] == "crash"
    samples = measure(tmp_path, REFEREE / name)
    assert samples["status"] == "candidate_invalid"
    assert samples["invalid"]["candidate"][0]["code"] == "crash"


def test_a_forged_reply_is_judged_by_its_bytes(tmp_path):
    cand_check = check(tmp_path, REFEREE / "forged_reply")
    assert cand_check["status"] == "candidate_failure"
    samples = measure(tmp_path, REFEREE / "forged_reply")
    assert samples["status"] == "candidate_invalid"
