"""Measurement zygote: imports the framework and the task's workloads once, then runs each arm
of each pair in a forked, pristine child.

An arm generates all its inputs (warmup and timed, from the seeds it is given) before it imports
the implementation, then times each call alone with perf_counter_ns. Output checks, digests and
probes happen between calls, outside the timed region.
"""

from __future__ import annotations

import gc
import hashlib
import importlib.util
import sys
import time
import traceback
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


def _error(exc: BaseException) -> dict:
    return {"type": type(exc).__name__, "message": str(exc)[:2000],
            "traceback": traceback.format_exc()[-4000:]}


def _output_problem(out, job: dict) -> tuple[np.ndarray | None, str | None, str | None]:
    arr, meta = C.materialise_output(out, job["framework"])
    exp = job["expected"]
    if meta["problem"] == "wrong_type":
        return None, "wrong_type", f"returned {meta['type']}"
    if meta.get("device") != exp["device"]:
        return None, "wrong_type", f"output on device {meta.get('device')}"
    if list(meta["shape"]) != exp["shape"]:
        return None, "wrong_shape", f"shape {meta['shape']}, expected {exp['shape']}"
    if meta["problem"] == "wrong_dtype" or meta["dtype"] != exp["dtype"]:
        return None, "wrong_dtype", f"dtype {meta.get('dtype')}, expected {exp['dtype']}"
    return arr, None, None


def run_arm(job: dict, item: dict, workloads, io_dir: Path) -> None:
    C.set_threads(job["framework"], job["threads"])
    case = job["workload"]
    warm = [workloads.make_inputs(dict(case), s) for s in item["warmup_seeds"]]
    timed = [workloads.make_inputs(dict(case), s) for s in item["timed_seeds"]]
    input_digests = [C.inputs_digest(inp) for inp in timed]
    result: dict = {"outcome": None, "problem": None, "detail": None, "sample": None,
                    "input_digests": input_digests, "samples_ns": [], "warmup_ns": [],
                    "output_digests": [], "probes": []}
    probe_idx = np.asarray(job["probe_indices"], dtype=np.int64)
    try:
        fn = C.load_impl_entry(Path(item["impl_dir"]), job["entry"])
    except SyntaxError as exc:
        result.update(outcome="syntax_error", error=_error(exc))
    except BaseException as exc:  # noqa: BLE001
        result.update(outcome="import_error", error=_error(exc))
    else:
        result["outcome"] = "ok"
        try:
            for inp in warm:
                t0 = time.perf_counter_ns()
                out = fn(**inp)
                t1 = time.perf_counter_ns()
                result["warmup_ns"].append(t1 - t0)
                _, code, detail = _output_problem(out, job)
                del out
                if code:
                    result.update(outcome="invalid", problem=code, detail=f"warmup: {detail}")
                    break
            if result["outcome"] == "ok":
                gc.collect()
                gc.disable()
                for j, inp in enumerate(timed):
                    t0 = time.perf_counter_ns()
                    out = fn(**inp)
                    t1 = time.perf_counter_ns()
                    result["samples_ns"].append(t1 - t0)
                    arr, code, detail = _output_problem(out, job)
                    del out
                    if code is None and C.inputs_digest(inp) != input_digests[j]:
                        code, detail = "input_modified", "an input changed during the call"
                    if code:
                        result.update(outcome="invalid", problem=code, detail=detail, sample=j)
                        break
                    result["output_digests"].append(hashlib.sha256(arr.tobytes()).hexdigest())
                    flat = arr.reshape(-1)
                    result["probes"].append(C.as_float64(flat[probe_idx], job["expected"]["dtype"])
                                            .tolist())
                    if j == len(timed) - 1:
                        np.save(io_dir / "last_out.npy", arr, allow_pickle=False)
                    del arr, flat
                gc.enable()
        except BaseException as exc:  # noqa: BLE001
            gc.enable()
            result.update(outcome="exception", error=_error(exc),
                          sample=len(result["samples_ns"]))
    C.write_json(io_dir / "result.json", result)


def run_job(job: dict) -> None:
    workloads = C.load_module_from_path(Path(job["workloads_path"]), "workloads")
    work_root = Path(job["work_dir"])
    for item in job["items"]:
        io_dir = Path(item["io_dir"])
        io_dir.mkdir(parents=True, exist_ok=True)
        C.write_json(io_dir / "started.json", {"started": True})
        status = C.fork_item(lambda item=item, io_dir=io_dir: run_arm(job, item, workloads, io_dir),
                             float(job["arm_timeout_s"]), work_root, io_dir / "log.txt")
        C.write_json(io_dir / "status.json", status)
        result_path = io_dir / "result.json"
        if status["timed_out"] or status["exit_code"] != 0 or not result_path.exists():
            break
        if C.read_json(result_path)["outcome"] != "ok":
            break


if __name__ == "__main__":
    sys.exit(C.zygote_main(__doc__, run_job))
