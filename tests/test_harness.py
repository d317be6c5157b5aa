"""Sandbox-side harness: check/measure/assess run as real subprocesses on the shipped tasks."""

from __future__ import annotations

import json
import os
import subprocess
import time
import sys
from pathlib import Path

import numpy as np
import pytest
from harness_support import (
    HARNESS,
    TASKS,
    load_harness_module,
    run_check,
    run_harness,
    run_measure,
    task_spec,
)

HOSTILE = Path(__file__).resolve().parent / "fixtures" / "hostile"
stats = load_harness_module("stats")


def check(tmp_path: Path, task: str, impl: Path, spec: dict, name: str = "check") -> dict:
    proc, out = run_check(tmp_path, task, impl, spec, name)
    doc = json.loads(out.read_text())
    # NB: 75: the judged code imports a package outside the judge's identity (import_error's
    # missing module): judged and written, never cached
    assert proc.returncode == (75 if doc.get("imports_outside_identity") else 0), proc.stderr
    return doc


def measure(
    tmp_path: Path, task: str, baseline: Path, candidate: Path, spec: dict, name: str = "measure"
) -> dict:
    proc, out = run_measure(tmp_path, task, baseline, candidate, spec, name)
    # NB: 75: measured while the host was busy (documents written, judged host_busy, not cached)
    assert proc.returncode in (0, 75), proc.stderr
    return json.loads(out.read_text())


def processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if text.encode() in cmdline:
                found.append(int(entry))
    return found


TINY_MEASURE = {
    "workload": {"name": "tiny", "shape": [8, 64], "dtype": "float32", "kind": "normal"},
    "warmups": 2,
    "samples": 4,
    "pairs": 2,
    "value_checks": 2,
}
SOFTMAX_FAST_CASES = ["normal_f32", "large_f32", "transposed_f32"]


def softmax_spec(cases: list[str] | None = None, **overrides) -> dict:
    overrides = {"measure": dict(TINY_MEASURE), "call_timeout_s": 5, **overrides}
    spec = task_spec("softmax", **overrides)
    if cases is not None:
        spec["cases"] = [c for c in spec["cases"] if c["name"] in cases]
    return spec


# --------------------------------------------------------------------------------- correctness


@pytest.mark.e2e
@pytest.mark.parametrize(
    "impl", ["baseline", "candidates/fast", "candidates/gain20", "candidates/same"]
)
def test_softmax_baseline_and_good_candidates_pass_every_case(tmp_path, impl):
    doc = check(tmp_path, "softmax", TASKS / "softmax" / impl, softmax_spec())
    assert doc["status"] == "ok" and doc["failure_kind"] is None, doc["reasons"]
    assert doc["n_passed"] == doc["n_cases"] == len(softmax_spec()["cases"])
    assert all(len(d) == 64 for d in doc["input_digests"].values())
    assert all(c["max_abs_err"] is not None for c in doc["cases"])


@pytest.mark.e2e
@pytest.mark.parametrize(
    "impl, failing_case, reason",
    [
        ("wrong_axis", "normal_f32", "out_of_tolerance"),
        ("no_max_subtraction", "large_f32", "non_finite"),
    ],
)
def test_softmax_wrong_controls_fail_as_wrong_output(tmp_path, impl, failing_case, reason):
    doc = check(tmp_path, "softmax", TASKS / "softmax" / "candidates" / impl, softmax_spec())
    assert doc["status"] == "candidate_failure"
    assert doc["failure_kind"] == "wrong_output"
    case = next(c for c in doc["cases"] if c["name"] == failing_case)
    assert not case["passed"] and case["reason"] == reason


@pytest.mark.e2e
def test_no_max_subtraction_overflows_on_large_magnitudes_only(tmp_path):
    doc = check(
        tmp_path, "softmax", TASKS / "softmax" / "candidates" / "no_max_subtraction", softmax_spec()
    )
    by_name = {c["name"]: c for c in doc["cases"]}
    assert by_name["normal_f32"]["passed"]
    assert not by_name["large_f64"]["passed"] and not by_name["negative_large_f32"]["passed"]


@pytest.mark.e2e
@pytest.mark.usefixtures("torch")  # a torch task
def test_rmsnorm_baseline_and_fast_pass_every_case(tmp_path):
    spec = task_spec("rmsnorm")
    for impl in ("baseline", "candidates/fast"):
        doc = check(
            tmp_path, "rmsnorm", TASKS / "rmsnorm" / impl, spec, name=impl.replace("/", "_")
        )
        assert doc["status"] == "ok", doc["reasons"]
        assert doc["n_passed"] == len(spec["cases"])


@pytest.mark.e2e
@pytest.mark.usefixtures("torch")  # a torch task
@pytest.mark.parametrize(
    "impl, failing_case",
    [
        ("no_eps", "zeros_f32"),
        ("ignore_weight", "normal_f32"),
        ("wrong_axis", "normal_f32"),
        ("zeros", "normal_bf16"),
    ],
)
def test_rmsnorm_wrong_controls_fail_as_wrong_output(tmp_path, impl, failing_case):
    spec = task_spec("rmsnorm")
    spec["cases"] = [
        c
        for c in spec["cases"]
        if c["name"] in ("normal_f32", "normal_bf16", "zeros_f32", "tiny_f32")
    ]
    doc = check(tmp_path, "rmsnorm", TASKS / "rmsnorm" / "candidates" / impl, spec)
    assert doc["status"] == "candidate_failure" and doc["failure_kind"] == "wrong_output"
    assert not next(c for c in doc["cases"] if c["name"] == failing_case)["passed"]


# ----------------------------------------------------------------------------- hostile checks


@pytest.mark.e2e
@pytest.mark.usefixtures("torch")  # a torch task
@pytest.mark.parametrize(
    "name, kind",
    [("rmsnorm_modifies_input", "input_modified"), ("rmsnorm_parameter", "wrong_type")],
)
def test_torch_hostile_candidate_fails_on_a_strided_input(tmp_path, name, kind):
    spec = task_spec("rmsnorm")
    spec["cases"] = [c for c in spec["cases"] if c["name"] == "transposed_f32"]
    doc = check(tmp_path, "rmsnorm", HOSTILE / name, spec)
    assert doc["failure_kind"] == kind


@pytest.mark.e2e
@pytest.mark.parametrize(
    "name, kind, reason",
    [
        ("syntax_error", "syntax_error", "syntax_error"),
        ("import_error", "import_error", "import_error"),
        ("raises", "exception", "exception"),
        ("crash", "crash", "crash"),
        # NB: the seccomp filter refuses the kill (EPERM): the candidate raises
        ("kills_runner", "exception", "exception"),
        ("modifies_input", "input_modified", "input_modified"),
        ("subclass", "wrong_type", "wrong_type"),
        ("lazy", "wrong_type", "wrong_type"),
        ("wrong_type", "wrong_type", "wrong_type"),
        ("wrong_dtype", "wrong_dtype", "wrong_dtype"),
        ("wrong_shape", "wrong_shape", "wrong_shape"),
    ],
)
def test_hostile_candidate_fails_check_with_its_kind(tmp_path, name, kind, reason):
    doc = check(tmp_path, "softmax", HOSTILE / name, softmax_spec(SOFTMAX_FAST_CASES))
    assert doc["status"] == "candidate_failure"
    assert doc["failure_kind"] == kind
    assert doc["reasons"][0]["code"] == reason
    assert doc["reasons"][0]["case"] == "normal_f32"


@pytest.mark.e2e
def test_sleeping_candidate_times_out_and_its_process_is_gone(tmp_path):
    spec = softmax_spec(SOFTMAX_FAST_CASES, call_timeout_s=1)
    doc = check(tmp_path, "softmax", HOSTILE / "sleeps", spec)
    assert doc["failure_kind"] == "timeout"
    assert [c["reason"] for c in doc["cases"]] == ["timeout", "not_run", "not_run"]
    assert processes_mentioning(str(tmp_path)) == []


@pytest.mark.e2e
def test_background_processes_are_killed_when_the_check_ends(tmp_path):
    doc = check(tmp_path, "softmax", HOSTILE / "background", softmax_spec(["normal_f32"]))
    assert doc["status"] == "ok"
    assert processes_mentioning("rsi-hostile-background-marker") == []


@pytest.mark.fast
def test_scratch_sweep_removes_only_folders_whose_run_is_dead(tmp_path):
    """A run killed with SIGKILL never reaches its `finally`: its scratch folder stayed in /tmp
    (CI left 28 of them). The next run removes a folder whose lock no process holds, and
    never one whose run is alive (a real process holds its lock) or one still being made."""
    common = load_harness_module("_common")
    dead, alive_fd = common.scratch_dir("rsi-check-", tmp_path)
    os.close(alive_fd)  # NB: what the kernel does for a killed run
    (dead / "worker.log").write_text("left behind")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; sys.path.insert(0, sys.argv[1]); import _common as c; from pathlib "
            "import Path; w, fd = c.scratch_dir('rsi-check-', Path(sys.argv[2])); print(w, "
            "flush=True); sys.stdin.read()",
            str(HARNESS),
            str(tmp_path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        live = Path(holder.stdout.readline().strip())
        assert live.is_dir() and not dead.exists()  # NB: the holder's own start swept it
        dead.mkdir()  # NB: a folder still being made: no lock yet
        other = tmp_path / "rsi-measure-kept"
        other.mkdir()
        (other / common.SCRATCH_LOCK).write_text("")  # NB: another prefix: not this sweep's
        mine, fd = common.scratch_dir("rsi-check-", tmp_path)
        assert live.is_dir() and dead.is_dir() and other.is_dir()
        assert sorted(common.sweep_scratch("rsi-check-", tmp_path)) == []
    finally:
        holder.communicate("", timeout=30)
    # NB: the holder has ended: its lock is free; mine is still held
    assert common.sweep_scratch("rsi-check-", tmp_path) == [live.name]
    assert mine.is_dir() and dead.is_dir()
    os.close(fd)
    assert common.sweep_scratch("rsi-check-", tmp_path) == [mine.name]


@pytest.mark.e2e
def test_a_check_killed_with_sigkill_leaves_scratch_the_next_run_removes(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    spec = softmax_spec(["normal_f32"], call_timeout_s=60)
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    args = ["--task", str(TASKS / "softmax"), "--spec", str(spec_path)]
    env = dict(os.environ, TMPDIR=str(scratch))
    cmd = [sys.executable, "-I", "-B", str(HARNESS / "check.py"), *args]
    proc = subprocess.Popen(
        [*cmd, "--impl", str(HOSTILE / "sleeps"), "--out", str(tmp_path / "a.json")],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not list(scratch.glob("rsi-check-*/.rsi-alive")) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)
    os.killpg(proc.pid, 9)  # NB: the run and its worker, as an OOM kill or a lost node would
    proc.wait(timeout=30)
    left = list(scratch.glob("rsi-check-*"))
    assert len(left) == 1
    done = subprocess.run(
        [*cmd, "--impl", str(TASKS / "softmax" / "baseline"), "--out", str(tmp_path / "b.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "b.json").read_text())["status"] == "ok"
    assert list(scratch.iterdir()) == []


@pytest.mark.e2e
def test_planted_modules_in_cwd_change_nothing(tmp_path):
    for name in ("numpy.py", "oracle.py", "workloads.py", "kernel.py", "_common.py", "stats.py"):
        (tmp_path / name).write_text("raise SystemExit('planted module imported')\n")
    (tmp_path / "kernel").mkdir()
    (tmp_path / "kernel" / "__init__.py").write_text("raise SystemExit('planted')\n")
    spec = softmax_spec(SOFTMAX_FAST_CASES)
    writer = check(tmp_path, "softmax", HOSTILE / "writes_files", spec, name="writer")
    assert writer["status"] == "ok"
    after = check(tmp_path, "softmax", TASKS / "softmax" / "baseline", spec, name="after")
    assert after["status"] == "ok"
    assert not (TASKS / "softmax" / "numpy.py").exists()
    assert not (HOSTILE / "writes_files" / "numpy.py").exists()


@pytest.mark.e2e
def test_check_without_an_oracle_is_a_harness_fault(tmp_path):
    task = tmp_path / "task"
    task.mkdir()
    (task / "workloads.py").write_text((TASKS / "softmax" / "workloads.py").read_text())
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(softmax_spec(["normal_f32"])))
    proc = run_harness(
        "check.py",
        [
            "--task",
            str(task),
            "--impl",
            str(TASKS / "softmax" / "baseline"),
            "--spec",
            str(spec_path),
            "--out",
            str(tmp_path / "out.json"),
        ],
        tmp_path,
    )
    assert proc.returncode != 0 and "oracle.py" in proc.stderr
    assert not (tmp_path / "out.json").exists()


# ----------------------------------------------------------------------------- hostile timing


@pytest.mark.e2e
def test_measure_records_paired_raw_samples_with_alternating_order(tmp_path):
    base = TASKS / "softmax" / "baseline"
    doc = measure(
        tmp_path,
        "softmax",
        base,
        TASKS / "softmax" / "candidates" / "fast",
        softmax_spec(measure=dict(TINY_MEASURE, pairs=3)),
    )
    assert doc["status"] == "ok" and not doc["calibration"]
    assert [p["order"][0] for p in doc["pairs"]] == ["baseline", "candidate", "baseline"]
    for pair in doc["pairs"]:
        b, c = pair["arms"]["baseline"], pair["arms"]["candidate"]
        assert len(b["samples_ns"]) == len(c["samples_ns"]) == 4
        assert b["input_digests"] == c["input_digests"]
        assert len(set(b["input_digests"])) == 4
    seeds = [s for p in doc["pairs"] for s in p["timed_seeds"] + p["warmup_seeds"]]
    assert len(set(seeds)) == len(seeds)


@pytest.mark.e2e
@pytest.mark.parametrize(
    "name, code",
    [
        ("replay", "stale_output"),
        ("modifies_input", "input_modified"),
        ("raises", "exception"),
        ("wrong_type", "wrong_type"),
    ],
)
def test_hostile_candidate_arm_is_invalid(tmp_path, name, code):
    doc = measure(
        tmp_path, "softmax", TASKS / "softmax" / "baseline", HOSTILE / name, softmax_spec()
    )
    assert doc["status"] == "candidate_invalid"
    # NB: a replayed warm-up output meets the oracle before any timed output it could repeat
    allowed = {code, "wrong_output"} if code == "stale_output" else {code}
    assert doc["invalid"]["candidate"][0]["code"] in allowed
    assert doc["invalid"]["baseline"] == []


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["memo_identity", "memo_content"])
def test_memoising_candidate_gains_nothing(tmp_path, name):
    spec = softmax_spec(
        measure=dict(
            TINY_MEASURE,
            pairs=4,
            samples=6,
            workload={"name": "m", "shape": [64, 1024], "dtype": "float32", "kind": "normal"},
        )
    )
    doc = measure(tmp_path, "softmax", TASKS / "softmax" / "baseline", HOSTILE / name, spec)
    # NB: every timed input is a fresh draw, so a memo hit (by identity: ids of dropped inputs
    # are reused) returns an earlier call's output, and the referee fails it
    if doc["status"] == "candidate_invalid":
        assert doc["invalid"]["candidate"][0]["code"] in {"stale_output", "wrong_output"}
        assert doc["invalid"]["baseline"] == []
        return
    assert doc["status"] == "ok"
    # NB: no timed input repeats (within the arm, across pairs, or a warm-up's), so a memo
    # keyed by content never hits; how fast a miss is is not asserted (a timed test)
    timed = [d for p in doc["pairs"] for d in p["arms"]["candidate"]["input_digests"]]
    assert len(timed) == 4 * 6 and len(set(timed)) == len(timed)


# ----------------------------------------------------------------------------- assess end to end


def _assess(tmp_path, spec, samples, cand_check, base_check, calib):
    paths = {}
    for name, doc in (
        ("spec", spec),
        ("samples", samples),
        ("check", cand_check),
        ("baseline_check", base_check),
        ("calibration", calib),
    ):
        paths[name] = tmp_path / f"assess_{name}.json"
        paths[name].write_text(json.dumps(doc))
    out = tmp_path / "verdict.json"
    proc = run_harness(
        "assess.py",
        [
            "--spec",
            str(paths["spec"]),
            "--samples",
            str(paths["samples"]),
            "--check",
            str(paths["check"]),
            "--baseline-check",
            str(paths["baseline_check"]),
            "--calibration",
            str(paths["calibration"]),
            "--out",
            str(out),
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text()), out.read_bytes()


@pytest.mark.e2e
def test_assess_gives_fail_inconclusive_and_is_deterministic(tmp_path):
    spec = softmax_spec(
        ["normal_f32", "large_f32"],
        measure=dict(TINY_MEASURE, pairs=5, samples=4),
        assess={"min_pairs": 3, "bootstrap_resamples": 500},
    )
    base_dir = TASKS / "softmax" / "baseline"
    wrong_dir = TASKS / "softmax" / "candidates" / "no_max_subtraction"
    base_check = check(tmp_path, "softmax", base_dir, spec, name="bc")
    wrong_check = check(tmp_path, "softmax", wrong_dir, spec, name="wc")
    calib = measure(tmp_path, "softmax", base_dir, base_dir, spec, name="cal")
    assert calib["calibration"]
    aa = measure(tmp_path, "softmax", base_dir, base_dir, spec, name="aa")
    wrong = measure(tmp_path, "softmax", base_dir, wrong_dir, spec, name="wrong")

    verdict, raw = _assess(tmp_path, spec, aa, base_check, base_check, calib)
    assert verdict["verdict"] == "INCONCLUSIVE"
    assert verdict["speedup"]["lo"] <= verdict["speedup"]["point"] <= verdict["speedup"]["hi"]
    assert verdict["noise_floor"]["delta"] >= 0 and verdict["n_pairs"] == 5
    assert _assess(tmp_path, spec, aa, base_check, base_check, calib)[1] == raw

    verdict, _ = _assess(tmp_path, spec, wrong, wrong_check, base_check, calib)
    assert verdict["verdict"] == "FAIL"
    assert verdict["reasons"][0]["code"] == "candidate_check_failed"

    verdict, _ = _assess(tmp_path, spec, aa, base_check, wrong_check, calib)
    assert verdict["verdict"] == "INCONCLUSIVE"
    assert "baseline_check_failed" in [r["code"] for r in verdict["reasons"]]

    verdict, _ = _assess(tmp_path, spec, aa, base_check, base_check, wrong)
    assert verdict["verdict"] == "INCONCLUSIVE"
    assert verdict["noise_floor"] is None and verdict["threshold"] is None


# ----------------------------------------------------------------------------- statistics


@pytest.mark.fast
def test_identical_samples_give_speedup_one_and_an_interval_containing_one():
    ratios = [0.0] * 12
    result = stats.speedup(ratios, 0.95, 1000, seed=7)
    assert result["point"] == 1.0 and result["lo"] <= 1.0 <= result["hi"]
    assert stats.noise_floor(ratios, 0.95, 1000, seed=7)["delta"] == 0.0


@pytest.mark.fast
def test_synthetic_twenty_percent_gain_is_detected_and_aa_noise_is_not():
    rng = np.random.default_rng(3)

    def noise():
        return rng.normal(0.0, 0.03, 15)

    gain = [
        stats.log_ratio(
            stats.arm_value(1e5 * np.exp(noise()), "latency", None),
            stats.arm_value(1e5 / 1.2 * np.exp(noise()), "latency", None),
            "minimize",
        )
        for _ in range(12)
    ]
    same = [
        stats.log_ratio(
            stats.arm_value(1e5 * np.exp(noise()), "latency", None),
            stats.arm_value(1e5 * np.exp(noise()), "latency", None),
            "minimize",
        )
        for _ in range(12)
    ]
    floor = stats.noise_floor(same, 0.95, 2000, seed=1)
    threshold = stats.pass_threshold(floor["delta"], 0.05)
    assert stats.speedup(gain, 0.95, 2000, seed=2)["lo"] > threshold
    assert stats.speedup(same, 0.95, 2000, seed=2)["lo"] <= threshold
    assert abs(stats.speedup(gain, 0.95, 2000, seed=2)["point"] - 1.2) < 0.05


@pytest.mark.fast
def test_median_interval_is_order_statistics_with_exact_coverage_and_throughput_inverts():
    x = list(np.random.default_rng(0).normal(0.1, 0.05, 30))
    lo, hi, coverage = stats.median_interval(x, 0.95)
    ordered = sorted(x)
    # NB: n = 30 at 95 %: the 10th and 21st order statistics, P(B <= 9) = 0.0214 per side
    assert (lo, hi) == (ordered[9], ordered[20])
    assert coverage == pytest.approx(1 - 2 * 0.021386, abs=1e-5)
    assert stats.median_interval(x[:5], 0.95)[:2] == (min(x[:5]), max(x[:5]))
    assert stats.median_interval(x[:5], 0.95)[2] < 0.95
    assert stats.seed_from(b"a", b"b") == stats.seed_from(b"a", b"b") != stats.seed_from(b"b", b"a")
    assert stats.log_ratio(2.0, 1.0, "minimize") == pytest.approx(np.log(2))
    assert stats.log_ratio(1.0, 2.0, "maximize") == pytest.approx(np.log(2))
    assert stats.arm_value([1e9, 1e9], "throughput", 10) == pytest.approx(10.0)


@pytest.mark.e2e
def test_a_slow_but_correct_candidate_is_measured_not_cut_off(tmp_path):
    """`call_timeout_s` is the only per-call limit: a correct candidate far slower than the
    baseline (2 s a call) is measured in full, its samples are the referee's clock, and the
    measurement ends well inside the action's own limit (no hidden 1 s arm cap)."""
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "kernel.py").write_text(
        "import time\nimport numpy as np\n\n\ndef softmax(x):\n    time.sleep(2.0)\n"
        "    e = np.exp(x - x.max(axis=-1, keepdims=True))\n"
        "    return e / e.sum(axis=-1, keepdims=True)\n"
    )
    spec = json.loads((TASKS / "softmax" / "harness_spec.example.json").read_text())
    spec["measure"].update(pairs=2, samples=2, warmups=0)
    spec["call_timeout_s"] = 30
    spec["action_timeout_s"] = 200
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    out = tmp_path / "samples.json"
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-I",
            "-B",
            str(HARNESS / "measure.py"),
            "--task",
            str(TASKS / "softmax"),
            "--baseline",
            str(TASKS / "softmax" / "baseline"),
            "--candidate",
            str(slow),
            "--spec",
            str(spec_path),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    # NB: 75: measured while the host was busy (host_busy): the documents are written in full
    assert proc.returncode in (0, 75), proc.stderr
    assert time.monotonic() - started < 0.9 * 200
    doc = json.loads(out.read_text())
    assert doc["status"] == "ok", doc["invalid"]
    samples = [ns for p in doc["pairs"] for ns in p["arms"]["candidate"]["samples_ns"]]
    assert len(samples) == 4 and min(samples) >= 2e9


@pytest.mark.e2e
def test_a_call_past_call_timeout_is_the_candidates_timeout(tmp_path):
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "kernel.py").write_text("import time\n\n\ndef softmax(x):\n    time.sleep(60)\n")
    spec = softmax_spec(call_timeout_s=1.5)
    started = time.monotonic()
    doc = measure(tmp_path, "softmax", TASKS / "softmax" / "baseline", slow, spec)
    assert time.monotonic() - started < 40
    assert doc["status"] == "candidate_invalid"
    assert doc["invalid"]["candidate"][0]["code"] == "timeout"
    assert "call_timeout_s = 1.5" in doc["invalid"]["candidate"][0]["detail"]
    assert not doc["invalid"]["baseline"]
