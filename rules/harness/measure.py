"""Paired timing of baseline vs candidate (A/A calibration when both paths are the same).

Pair i runs its two arms in order AB when i is even and BA when odd, each arm in a fresh child
forked from timer.py's pristine zygote, both on the identical input sequence for that pair. Raw
per-call nanoseconds are the evidence; nothing is averaged away here.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path


def _load_common():
    path = Path(__file__).resolve().parent / "_common.py"
    spec = importlib.util.spec_from_file_location("_rsi_harness_common", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


C = _load_common()
np = C.np

SCHEMA = "rsi.measure/1"
ARMS = ("baseline", "candidate")
OUTCOME_CODE = {"syntax_error": "syntax_error", "import_error": "import_error",
                "exception": "exception"}


class Expectations:
    """Parent-side truth for every timed input: digest and oracle values at the probe indices."""

    def __init__(self, spec: dict, workloads, oracle):
        self.spec, self.workloads, self.oracle = spec, workloads, oracle
        self.case = spec["measure"]["workload"]
        self._cache: dict[int, tuple[str, np.ndarray]] = {}

    def reference(self, seed: int) -> tuple[str, np.ndarray, dict]:
        inputs = self.workloads.make_inputs(dict(self.case), seed)
        digest = C.inputs_digest(inputs)
        ref = self.oracle.reference(**inputs)
        if type(ref) is not np.ndarray or ref.dtype != np.float64 or not np.all(np.isfinite(ref)):
            raise C.HarnessError("oracle.reference must return a finite float64 numpy array")
        return digest, ref, inputs

    def probe(self, seed: int, probe_idx: np.ndarray) -> tuple[str, np.ndarray]:
        if seed not in self._cache:
            digest, ref, _ = self.reference(seed)
            self._cache[seed] = (digest, ref.reshape(-1)[probe_idx])
        return self._cache[seed]


def value_check_indices(n_samples: int, n_checks: int) -> list[int]:
    """Timed samples whose probe values are compared with the oracle: spread, always the last."""
    if n_checks <= 0 or n_checks >= n_samples:
        return list(range(n_samples))
    return sorted({round(k * (n_samples - 1) / max(n_checks - 1, 1)) for k in range(n_checks)})


def judge_arm(spec: dict, item: dict, expect: Expectations, probe_idx: np.ndarray,
              out_dtype: str) -> dict:
    io_dir = Path(item["io_dir"])
    arm = {"impl": item["arm"], "valid": False, "reasons": [], "samples_ns": [],
           "input_digests": [], "warmup_ns": [], "output_digests": [], "wall_s": None,
           "log_tail": None}
    if not (io_dir / "started.json").exists():
        arm["reasons"].append({"code": "not_run", "detail": "an earlier arm ended the measurement"})
        return arm
    arm["log_tail"] = C.tail(io_dir / "log.txt")
    status = C.read_json(io_dir / "status.json") if (io_dir / "status.json").exists() else None
    result = C.read_json(io_dir / "result.json") if (io_dir / "result.json").exists() else None
    if status is None:
        arm["reasons"].append({"code": "crash", "detail": "the arm took the timer down with it"})
        return arm
    arm["wall_s"] = status["wall_s"]
    if status["timed_out"]:
        arm["reasons"].append({"code": "timeout", "detail": f"arm exceeded {item['timeout_s']} s"})
        return arm
    if result is None or status["exit_code"] != 0:
        arm["reasons"].append({"code": "crash", "detail": f"exit {status['exit_code']}, signal "
                               f"{status['signal']}, no result"})
        return arm
    if result["outcome"] == "harness_error":
        err = result.get("error") or {}
        raise C.HarnessError(f"the {item['arm']} arm of pair {item['id']} failed before any "
                             f"implementation code ran: {err.get('type')}: {err.get('message')}")
    arm.update(samples_ns=result["samples_ns"], warmup_ns=result["warmup_ns"],
               output_digests=result["output_digests"], input_digests=result["input_digests"])
    if "wall_ns" in result:
        arm["wall_ns"] = result["wall_ns"]
    if result["outcome"] in OUTCOME_CODE:
        err = result.get("error") or {}
        arm["reasons"].append({"code": OUTCOME_CODE[result["outcome"]], "sample": result["sample"],
                               "detail": f"{err.get('type')}: {err.get('message')}"})
        return arm
    if result["outcome"] == "invalid":
        arm["reasons"].append({"code": result["problem"], "sample": result["sample"],
                               "detail": result["detail"]})
        return arm
    atol, rtol = C.tolerance_for(spec, out_dtype)
    if len(arm["samples_ns"]) != len(item["timed_seeds"]):
        arm["reasons"].append({"code": "crash", "detail": "fewer samples than timed inputs"})
        return arm
    seen: dict[str, str] = {}
    for j, (in_digest, out_digest) in enumerate(zip(result["input_digests"],
                                                    result["output_digests"], strict=True)):
        if seen.setdefault(out_digest, in_digest) != in_digest:
            arm["reasons"].append({"code": "stale_output", "sample": j, "detail": "the same output "
                                   "bytes came back for different inputs"})
            return arm
    for j in value_check_indices(len(item["timed_seeds"]), int(spec["measure"]["value_checks"])):
        digest, expected = expect.probe(item["timed_seeds"][j], probe_idx)
        if result["input_digests"][j] != digest:
            arm["reasons"].append({"code": "input_digest_mismatch", "sample": j,
                                   "detail": "the arm timed an input other than the one prepared"})
            return arm
        got = np.asarray(result["probes"][j], dtype=np.float64)
        if not C.compare(got, expected, atol, rtol)["passed"]:
            arm["reasons"].append({"code": "wrong_output", "sample": j, "detail": "probe values "
                                   "disagree with the oracle (stale, memoised or wrong output)"})
            return arm
    _, ref, _ = expect.reference(item["timed_seeds"][-1])
    last = C.as_float64(np.load(io_dir / "last_out.npy", allow_pickle=False), out_dtype)
    if last.shape != ref.shape or not C.compare(last, ref, atol, rtol)["passed"]:
        arm["reasons"].append({"code": "wrong_output", "sample": len(item["timed_seeds"]) - 1,
                               "detail": "the last timed output disagrees with the oracle"})
        return arm
    arm["valid"] = True
    return arm


def _device_report(items: list[dict]) -> tuple[dict | None, dict | None]:
    """The device facts and L2 flush the first arm that got that far recorded (all share one
    device: the arms of a measurement run one after another in this process tree)."""
    for item in items:
        path = Path(item["io_dir"]) / "result.json"
        if path.exists():
            result = C.read_json(path)
            if result.get("device"):
                return result["device"], result.get("l2_flush")
    return None, None


def _timing(spec: dict, flush: dict | None) -> dict:
    if spec["device"] == "cpu":
        return {"clock": "perf_counter_ns", "sync": None, "l2_flush": None,
                "samples": "host wall time of each call alone"}
    return {"clock": "cuda_event", "sync": "torch.cuda.synchronize() after the end event",
            "l2_flush": flush, "wall_ns": "host wall time from the start event's record to "
            "after the synchronise, per sample",
            "samples": "elapsed time between CUDA events recorded on the current stream "
            "around the call (0.5 us resolution), in ns"}


def _bandwidth(m: dict, tensor_bytes: int, pairs: list[dict], fprint: dict) -> dict:
    """Achieved bandwidth of each arm (bytes per call / median of its valid samples), and its
    fraction of the device's peak (null on a CPU or where the peak is not readable)."""
    import statistics

    bytes_per_call = m.get("bytes_per_call") or tensor_bytes
    peak = fprint.get("gpu_peak_gb_s")
    doc = {"bytes_per_call": bytes_per_call,
           "bytes_source": "measure.bytes_per_call" if m.get("bytes_per_call") else
           "input and output tensor bytes",
           "peak_gb_s": peak, "peak_source": fprint.get("gpu_peak_source")}
    for arm in ARMS:
        samples = [ns for p in pairs for ns in p["arms"][arm]["samples_ns"]
                   if p["arms"][arm]["valid"]]
        median = float(statistics.median(samples)) if samples else None
        doc[arm] = C.bandwidth(bytes_per_call, median, peak)
    return doc


def run_measure(task_dir: Path, baseline: Path, candidate: Path, spec: dict,
                work_dir: Path) -> dict:
    started = time.monotonic()
    zygote = C.Zygote(Path(__file__).resolve().parent / "timer.py", spec["framework"],
                      work_dir / "job.json", work_dir, spec["threads"])
    try:
        return _run_measure(task_dir, baseline, candidate, spec, work_dir, zygote, started)
    finally:
        zygote.kill()


def _run_measure(task_dir: Path, baseline: Path, candidate: Path, spec: dict, work_dir: Path,
                 zygote, started: float) -> dict:
    m = spec["measure"]
    if "workload" not in m:
        raise C.HarnessError("spec measure section lacks 'workload'")
    workloads = C.load_task_module(task_dir, "workloads")
    oracle = C.load_task_module(task_dir, "oracle")
    impls = {"baseline": baseline, "candidate": candidate}
    digests = {arm: C.tree_digest(path) for arm, path in impls.items()}
    expect = Expectations(spec, workloads, oracle)
    mseed = int(m["seed"])
    n_pairs, n_samples, n_warm = int(m["pairs"]), int(m["samples"]), int(m["warmups"])
    if n_pairs < 1 or n_samples < 1 or n_warm < 0:
        raise C.HarnessError("measure needs pairs >= 1, samples >= 1, warmups >= 0")
    first_seed = C.derive_seed(mseed, "timed", 0, 0)
    _, ref0, inputs0 = expect.reference(first_seed)
    out_dtype = m["workload"].get("out_dtype", m["workload"]["dtype"])
    C.tolerance_for(spec, out_dtype)
    n_probe = min(int(m["probes"]), ref0.size)
    probe_rng = np.random.default_rng(C.derive_seed(mseed, "probes"))
    probe_idx = np.sort(probe_rng.choice(ref0.size, size=n_probe, replace=False))
    arm_timeout = m["arm_timeout_s"] or (float(spec["call_timeout_s"]) * (n_warm + n_samples) + 60)
    if spec.get("action_timeout_s"):
        # NB: every arm must fit in the action's own limit, or a merely slow candidate would
        # time the whole action out: an infrastructure fault, retried forever. Capped, a slow
        # arm is that arm's timeout: the candidate's failure (or an inconclusive baseline).
        budget = 0.9 * float(spec["action_timeout_s"]) - 30 - float(spec["startup_timeout_s"])
        arm_timeout = max(1.0, min(arm_timeout, budget / (2 * n_pairs) - 10))
    items, pairs = [], []
    for i in range(n_pairs):
        order = list(ARMS) if i % 2 == 0 else list(reversed(ARMS))
        timed_seeds = [C.derive_seed(mseed, "timed", i, j) for j in range(n_samples)]
        warmup_seeds = [C.derive_seed(mseed, "warmup", i, k) for k in range(n_warm)]
        pair = {"index": i, "order": order, "timed_seeds": timed_seeds,
                "warmup_seeds": warmup_seeds, "items": {}}
        for arm in order:
            item = {"id": f"p{i:03d}-{arm}", "arm": arm, "impl_dir": str(impls[arm]),
                    "io_dir": str(work_dir / f"p{i:03d}-{arm}"), "timed_seeds": timed_seeds,
                    "warmup_seeds": warmup_seeds, "timeout_s": arm_timeout}
            items.append(item)
            pair["items"][arm] = item
        pairs.append(pair)
    call_bytes = C.tensor_bytes(inputs0, ref0.shape, out_dtype)
    del inputs0
    job = {"framework": spec["framework"], "device": spec["device"], "entry": spec["entry"],
           "threads": spec["threads"],
           "workload": m["workload"], "workloads_path": str(task_dir / "workloads.py"),
           "probe_indices": probe_idx.tolist(), "arm_timeout_s": arm_timeout,
           "expected": {"shape": list(ref0.shape), "dtype": out_dtype, "device": spec["device"]},
           "work_dir": str(work_dir), "items": items}
    zygote.submit(job)
    zyg = zygote.finish(spec["startup_timeout_s"] + len(items) * (arm_timeout + 10))
    if not (Path(items[0]["io_dir"]) / "started.json").exists():
        raise C.HarnessError(f"timer failed before the first arm (exit {zyg['returncode']}): "
                             f"{zyg['stderr_tail']}")
    facts, flush = _device_report(items)
    fprint = C.fingerprint(spec, facts, C.nvidia_smi() if spec["device"] != "cpu" else None)
    judge_started = time.monotonic()
    out_pairs, invalid = [], {"baseline": [], "candidate": []}
    for pair in pairs:
        arms = {}
        for arm in ARMS:
            judged = judge_arm(spec, pair["items"][arm], expect, probe_idx, out_dtype)
            arms[arm] = judged
            real = [r for r in judged["reasons"] if r["code"] != "not_run"]
            invalid[arm].extend(dict(r, pair=pair["index"]) for r in real)
        if any(r["code"] == "input_digest_mismatch" for r in invalid["baseline"]):
            raise C.HarnessError("the baseline arm timed inputs other than the parent prepared: "
                                 "workloads.make_inputs is not deterministic")
        complete = all(a["valid"] for a in arms.values())
        if complete and arms["baseline"]["input_digests"] != arms["candidate"]["input_digests"]:
            raise C.HarnessError("the two arms of a pair timed different inputs: "
                                 "workloads.make_inputs is not deterministic")
        out_pairs.append({"index": pair["index"], "order": pair["order"], "complete": complete,
                          "timed_seeds": pair["timed_seeds"],
                          "warmup_seeds": pair["warmup_seeds"],
                          "inputs_identical": complete,
                          "arms": arms})
    # NB: an identical tree at another path is an A/A run too; its digest says so.
    calibration = baseline == candidate or digests["baseline"][0] == digests["candidate"][0]
    status = "ok"
    if invalid["candidate"]:
        status = "candidate_invalid"
    elif invalid["baseline"]:
        status = "baseline_invalid"
    if zyg["timed_out"]:
        raise C.HarnessError("the timer exceeded its overall deadline")
    return {
        "schema": SCHEMA,
        "status": status,
        "calibration": calibration,
        "invalid": invalid,
        "baseline": {"digest": digests["baseline"][0], "files": digests["baseline"][1]},
        "candidate": {"digest": digests["candidate"][0], "files": digests["candidate"][1]},
        "measure": m,
        "threads": spec["threads"],
        "framework": spec["framework"],
        "expected_output": job["expected"],
        "probe_indices": probe_idx.tolist(),
        "n_pairs": n_pairs,
        "n_complete_pairs": sum(p["complete"] for p in out_pairs),
        "pairs": out_pairs,
        "timing": _timing(spec, flush),
        "device": facts,
        "fingerprint": fprint,
        "bandwidth": _bandwidth(m, call_bytes, out_pairs, fprint),
        "host": {"node": platform.node(), "machine": platform.machine(),
                 "python": platform.python_version(), "numpy": np.__version__,
                 "cpu_count": os.cpu_count(),
                 "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                 else None,
                 "loadavg_start": None},
        "wall_s": round(time.monotonic() - started, 3),
        "phases_s": {"timer": zyg["wall_s"],
                     "judge": round(time.monotonic() - judge_started, 3)},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--task", required=True, type=Path)
    parser.add_argument("--baseline", required=True, type=Path)
    parser.add_argument("--candidate", required=True, type=Path)
    parser.add_argument("--spec", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    out_path = args.out.resolve()
    C.become_subreaper()
    load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    work_dir = Path(tempfile.mkdtemp(prefix="rsi-measure-"))
    try:
        spec = C.load_spec(args.spec)
        C.require_device(spec)
        doc = run_measure(args.task.resolve(), args.baseline.resolve(), args.candidate.resolve(),
                          spec, work_dir)
        doc["host"]["loadavg_start"] = load_start
        C.write_json(out_path, doc)
    except C.HarnessError as exc:
        print(f"rsi harness fault (measure): {exc}", file=sys.stderr)
        return C.INFRA_EXIT
    finally:
        C.kill_descendants()
        shutil.rmtree(work_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
