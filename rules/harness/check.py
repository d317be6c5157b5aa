"""Correctness check: judge one implementation against the task's float64 oracle on every case.

Inputs are generated and the oracle is computed here; the implementation runs only in a child
(runner.py). Writes one evidence document; exits non-zero only for a harness fault.
"""

from __future__ import annotations

import argparse
import importlib.util
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

SCHEMA = "rsi.check/1"
# per-case reason code -> top-level failure_kind
FAILURE_KIND = {
    "syntax_error": "syntax_error", "import_error": "import_error",
    "missing_entry": "import_error", "exception": "exception", "timeout": "timeout",
    "crash": "crash", "wrong_type": "wrong_type", "wrong_device": "wrong_type",
    "wrong_shape": "wrong_shape", "wrong_dtype": "wrong_dtype",
    "input_modified": "input_modified", "non_finite": "wrong_output",
    "out_of_tolerance": "wrong_output",
}


def prepare_case(spec: dict, case: dict, workloads, oracle, io_dir: Path) -> dict:
    seed = int(case.get("seed", C.derive_seed(spec["seed"], "check", case["name"])))
    try:
        inputs = workloads.make_inputs(dict(case), seed)
    except Exception as exc:  # noqa: BLE001  any task error is a harness fault
        raise C.HarnessError(
            f"workloads.make_inputs failed on case {case['name']!r}: {exc!r}") from exc
    manifest = C.write_inputs(inputs, io_dir)
    digest = C.inputs_digest(inputs)
    sent = {n: np.load(io_dir / f"in_{n}.npy") for n, m in manifest.items() if m["kind"] == "array"}
    try:
        ref = oracle.reference(**inputs)
    except Exception as exc:  # noqa: BLE001  any task error is a harness fault
        raise C.HarnessError(
            f"oracle.reference failed on case {case['name']!r}: {exc!r}") from exc
    if type(ref) is not np.ndarray or ref.dtype != np.float64:
        raise C.HarnessError(f"oracle.reference must return a float64 numpy array ({case['name']})")
    if not np.all(np.isfinite(ref)):
        raise C.HarnessError(f"oracle output is not finite on case {case['name']!r}")
    if C.inputs_digest(inputs) != digest:
        raise C.HarnessError(f"oracle.reference modified its inputs on case {case['name']!r}")
    return {"seed": seed, "digest": digest, "ref": ref, "sent": sent, "manifest": manifest}


def judge_case(spec: dict, case: dict, prep: dict, io_dir: Path) -> dict:
    out_dtype = case.get("out_dtype", case["dtype"])
    record = {"name": case["name"], "seed": prep["seed"], "input_digest": prep["digest"],
              "passed": False, "reason": None, "detail": None, "max_abs_err": None,
              "max_rel_err": None, "mismatched": None, "expected_shape": list(prep["ref"].shape),
              "expected_dtype": out_dtype, "output": None, "wall_s": None, "log_tail": None}
    if not (io_dir / "started.json").exists():
        record.update(reason="not_run", detail="an earlier case ended the check")
        return record
    record["log_tail"] = C.tail(io_dir / "log.txt")
    status = C.read_json(io_dir / "status.json") if (io_dir / "status.json").exists() else None
    result = C.read_json(io_dir / "result.json") if (io_dir / "result.json").exists() else None
    if status is None:
        record.update(reason="crash", detail="the case child took the check runner down with it")
        return record
    record["wall_s"] = status["wall_s"]
    if status["timed_out"]:
        record.update(reason="timeout", detail=f"no result within {spec['call_timeout_s']} s; "
                      "the process group was killed")
        return record
    if result is None or status["exit_code"] != 0:
        record.update(reason="crash", detail=f"child ended (exit {status['exit_code']}, signal "
                      f"{status['signal']}) without a result")
        return record
    if result["outcome"] == "harness_error":
        err = result.get("error") or {}
        raise C.HarnessError(f"case {case['name']!r} failed before any implementation code ran: "
                             f"{err.get('type')}: {err.get('message')}")
    if result["outcome"] != "returned":
        err = result.get("error") or {}
        record.update(reason=result["outcome"],
                      detail=f"{err.get('type')}: {err.get('message')}")
        return record
    meta = result["output"]
    record["output"] = {k: meta.get(k) for k in ("type", "dtype", "shape", "device")}
    if meta["problem"] == "wrong_type":
        wanted = "numpy.ndarray" if spec["framework"] == "numpy" else "torch.Tensor"
        record.update(reason="wrong_type", detail=f"returned {meta['type']}; the contract needs "
                      f"exactly {wanted}")
        return record
    if meta.get("device") != spec["device"]:
        record.update(reason="wrong_device", detail=f"output on {meta.get('device')}, expected "
                      f"{spec['device']}")
        return record
    if list(meta["shape"]) != list(prep["ref"].shape):
        record.update(reason="wrong_shape", detail=f"shape {meta['shape']}, expected "
                      f"{list(prep['ref'].shape)}")
        return record
    if meta["problem"] == "wrong_dtype" or meta["dtype"] != out_dtype:
        record.update(reason="wrong_dtype", detail=f"dtype {meta['dtype']}, expected {out_dtype}")
        return record
    for name, sent in prep["sent"].items():
        after_path = io_dir / f"after_{name}.npy"
        after = np.load(after_path) if after_path.exists() else None
        if after is None or after.tobytes() != sent.tobytes():
            record.update(reason="input_modified", detail=f"input {name!r} changed during the call")
            return record
    raw = np.load(io_dir / "out.npy", allow_pickle=False)
    if list(raw.shape) != list(prep["ref"].shape):
        record.update(reason="wrong_shape", detail="materialised output has the wrong shape")
        return record
    actual = C.as_float64(raw, meta["dtype"])
    atol, rtol = C.tolerance_for(spec, out_dtype)
    cmp = C.compare(actual, prep["ref"], atol, rtol)
    record.update(max_abs_err=cmp["max_abs_err"], max_rel_err=cmp["max_rel_err"],
                  mismatched=cmp["mismatched"])
    if cmp["nonfinite"]:
        record.update(reason="non_finite", detail=f"{cmp['nonfinite']} non-finite values where "
                      "the oracle is finite")
    elif not cmp["passed"]:
        record.update(reason="out_of_tolerance", detail=f"{cmp['mismatched']} of {actual.size} "
                      f"values outside atol={atol} rtol={rtol}")
    else:
        record.update(passed=True, reason="ok")
    return record


def _device_facts(items: list[dict]) -> dict | None:
    for item in items:
        path = Path(item["io_dir"]) / "result.json"
        if path.exists():
            facts = C.read_json(path).get("device")
            if facts:
                return facts
    return None


def run_check(task_dir: Path, impl_dir: Path, spec: dict, work_dir: Path) -> dict:
    started = time.monotonic()
    zygote = C.Zygote(Path(__file__).resolve().parent / "runner.py", spec["framework"],
                      work_dir / "job.json", work_dir, spec["threads"])
    try:
        return _run_check(task_dir, impl_dir, spec, work_dir, zygote, started)
    finally:
        zygote.kill()


def _run_check(task_dir: Path, impl_dir: Path, spec: dict, work_dir: Path, zygote,
               started: float) -> dict:
    workloads = C.load_task_module(task_dir, "workloads")
    oracle = C.load_task_module(task_dir, "oracle")
    impl_digest, impl_files = C.tree_digest(impl_dir)
    items, preps = [], {}
    for i, case in enumerate(spec["cases"]):
        io_dir = work_dir / f"case{i:03d}"
        io_dir.mkdir()
        preps[case["name"]] = prepare_case(spec, case, workloads, oracle, io_dir)
        items.append({"id": case["name"], "io_dir": str(io_dir)})
    job = {"framework": spec["framework"], "device": spec["device"],
           "impl_dir": str(impl_dir.resolve()),
           "entry": spec["entry"], "threads": spec["threads"],
           "call_timeout_s": spec["call_timeout_s"], "work_dir": str(work_dir), "items": items}
    zygote.submit(job)
    zyg = zygote.finish(spec["startup_timeout_s"]
                        + len(items) * (float(spec["call_timeout_s"]) + 10.0))
    if not (Path(items[0]["io_dir"]) / "started.json").exists():
        raise C.HarnessError(f"check runner failed before the first case (exit "
                             f"{zyg['returncode']}): {zyg['stderr_tail']}")
    if zyg["returncode"] != 0 and not zyg["timed_out"]:
        # NB: a case child cannot make the runner exit non-zero except by killing it, which
        # leaves that case without a status and is judged a crash below.
        last = [it for it in items if (Path(it["io_dir"]) / "started.json").exists()][-1]
        if (Path(last["io_dir"]) / "status.json").exists():
            raise C.HarnessError(f"check runner failed: {zyg['stderr_tail']}")
    cases = [judge_case(spec, case, preps[case["name"]], Path(items[i]["io_dir"]))
             for i, case in enumerate(spec["cases"])]
    fprint = C.fingerprint(spec, _device_facts(items),
                           C.nvidia_smi() if spec["device"] != "cpu" else None)
    reasons = [{"code": c["reason"], "case": c["name"], "detail": c["detail"]}
               for c in cases if not c["passed"] and c["reason"] != "not_run"]
    failure_kind = FAILURE_KIND[reasons[0]["code"]] if reasons else None
    if failure_kind is None and not all(c["passed"] for c in cases):
        raise C.HarnessError("cases were left unjudged without a failure")
    return {
        "schema": SCHEMA,
        "status": "ok" if failure_kind is None else "candidate_failure",
        "failure_kind": failure_kind,
        "reasons": reasons,
        "impl": {"digest": impl_digest, "files": impl_files,
                 "extra_files": sorted(set(impl_files) - set(spec["editable"])),
                 "missing_files": sorted(set(spec["editable"]) - set(impl_files))},
        "entry": spec["entry"],
        "framework": spec["framework"],
        "cases": cases,
        "input_digests": {c["name"]: c["input_digest"] for c in cases},
        "n_cases": len(cases),
        "n_passed": sum(c["passed"] for c in cases),
        "device": spec["device"],
        "fingerprint": fprint,
        "wall_s": round(time.monotonic() - started, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--task", required=True, type=Path)
    parser.add_argument("--impl", required=True, type=Path)
    parser.add_argument("--spec", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    out_path = args.out.resolve()
    C.become_subreaper()
    work_dir = Path(tempfile.mkdtemp(prefix="rsi-check-"))
    try:
        spec = C.load_spec(args.spec)
        C.require_device(spec)
        doc = run_check(args.task.resolve(), args.impl.resolve(), spec, work_dir)
        C.write_json(out_path, doc)
    except C.HarnessError as exc:
        print(f"rsi harness fault (check): {exc}", file=sys.stderr)
        return C.INFRA_EXIT
    finally:
        C.kill_descendants()
        shutil.rmtree(work_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
