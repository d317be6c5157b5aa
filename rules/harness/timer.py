"""Measurement zygote: imports the framework and the task's workloads once, then runs each arm
of each pair in a forked, pristine child.

An arm generates all its inputs (warmup and timed, from the seeds it is given) before it imports
the implementation, then times each call alone with perf_counter_ns. Output checks, digests and
probes happen between calls, outside the timed region.

On a `cuda` spec the arm initialises CUDA itself (the zygote never does, so forking stays safe),
copies every input to the device before importing the implementation, and brackets each call by
CUDA events, with an L2 flush (a write of 2x the L2 size) queued before every call and a device
synchronise before the output is read.
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
    arr, meta = C.materialise_output(out, job["framework"], job.get("device", "cpu"))
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
    if job.get("device", "cpu") != "cpu":
        run_arm_cuda(job, item, workloads, io_dir)
        return
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


def _record(result: dict, out, j: int, inp_digest: str, check_inputs, job: dict,
            probe_idx, io_dir: Path, last: bool) -> bool:
    """Untimed checks of one timed call's output; False (with the reason in result) if invalid."""
    arr, code, detail = _output_problem(out, job)
    if code is None and check_inputs() != inp_digest:
        code, detail = "input_modified", "an input changed during the call"
    if code:
        result.update(outcome="invalid", problem=code, detail=detail, sample=j)
        return False
    result["output_digests"].append(hashlib.sha256(arr.tobytes()).hexdigest())
    flat = arr.reshape(-1)
    result["probes"].append(C.as_float64(flat[probe_idx], job["expected"]["dtype"]).tolist())
    if last:
        np.save(io_dir / "last_out.npy", arr, allow_pickle=False)
    return True


def run_arm_cuda(job: dict, item: dict, workloads, io_dir: Path) -> None:
    """One arm on the GPU: device inputs and the flush buffer exist before the implementation is
    imported; every call is timed alone by CUDA events on the current stream."""
    result: dict = {"outcome": None, "problem": None, "detail": None, "sample": None,
                    "input_digests": [], "samples_ns": [], "warmup_ns": [], "wall_ns": [],
                    "output_digests": [], "probes": [], "device": None, "l2_flush": None}
    dev = job["device"]
    try:
        torch = C.import_torch()
        C.set_threads(job["framework"], job["threads"])
        torch.cuda.init()
        facts = C.cuda_device_facts(torch)
        result["device"] = facts
        flush_bytes, l2_bytes, l2_source = C.l2_flush_bytes(facts)
        flush_buf = torch.empty(flush_bytes // 4, dtype=torch.int32, device=dev)
        result["l2_flush"] = {"bytes": flush_bytes, "l2_cache_bytes": l2_bytes,
                              "l2_source": l2_source, "op": "zero_", "when": "before every call"}
        case = job["workload"]
        warm = []
        for s in item["warmup_seeds"]:
            moved, _, _ = C.inputs_to_device(workloads.make_inputs(dict(case), s), dev)
            warm.append(moved)
        timed = []
        for s in item["timed_seeds"]:
            host = workloads.make_inputs(dict(case), s)
            result["input_digests"].append(C.inputs_digest(host))
            timed.append(C.inputs_to_device(host, dev))
            del host
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
    except BaseException as exc:  # noqa: BLE001  no candidate code has run: the harness's fault
        result.update(outcome="harness_error", error=_error(exc))
        C.write_json(io_dir / "result.json", result)
        return
    probe_idx = np.asarray(job["probe_indices"], dtype=np.int64)

    def timed_call(inp: dict) -> tuple[object, int, int]:
        flush_buf.zero_()  # NB: queued before the start event, so outside the timed region
        t0 = time.perf_counter_ns()
        start.record()
        out = fn(**inp)
        end.record()
        torch.cuda.synchronize()
        t1 = time.perf_counter_ns()
        return out, round(start.elapsed_time(end) * 1e6), t1 - t0

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
                out, ns, _ = timed_call(inp)
                result["warmup_ns"].append(ns)
                _, code, detail = _output_problem(out, job)
                del out
                if code:
                    result.update(outcome="invalid", problem=code, detail=f"warmup: {detail}")
                    break
            del warm
            if result["outcome"] == "ok":
                gc.collect()
                gc.disable()
                for j, (inp, spans, header) in enumerate(timed):
                    out, ns, wall = timed_call(inp)
                    result["samples_ns"].append(ns)
                    result["wall_ns"].append(wall)
                    ok = _record(result, out, j, result["input_digests"][j],
                                 lambda h=header, sp=spans: C.device_inputs_digest(h, sp), job,
                                 probe_idx, io_dir, j == len(timed) - 1)
                    del out
                    if not ok:
                        break
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
