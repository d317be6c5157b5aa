"""Correctness check: judge one implementation against the task's float64 oracle on every case. It
must never import rsi or rules, nor let candidate code run in its own process.

This process is the referee: it draws a secret seed from the OS, generates every case's inputs
(the public cases and hidden ones drawn from the declared shape ranges), computes the oracle and
judges raw output bytes. The implementation is imported only in a worker (referee.py, worker.py)
that gets each case's input when its call starts. Writes one evidence document; exits 2 only
for a harness fault before any candidate code ran: from the candidate's import on, anything
that goes wrong on the referee's side (an exception, a document that will not serialise) is
the candidate's failure `referee_error`, with the evidence written.
"""

from __future__ import annotations

import argparse
import os
import runpy
import shutil
import sys
import time
from pathlib import Path

import numpy as np

# NB: the harness's one sibling loader (siblings.py), itself run by path: no sys.path here
load_siblings = runpy.run_path(str(Path(__file__).resolve().parent / "siblings.py"))["load"]
C, R, IMP = load_siblings("_common", "referee", "imports")

SCHEMA = "rsi.check/1"
# per-case reason code -> top-level failure_kind
FAILURE_KIND = {
    "syntax_error": "syntax_error",
    "import_error": "import_error",
    "missing_entry": "import_error",
    "exception": "exception",
    "timeout": "timeout",
    "crash": "crash",
    "wrong_type": "wrong_type",
    "wrong_device": "wrong_type",
    "wrong_shape": "wrong_shape",
    "wrong_dtype": "wrong_dtype",
    "input_modified": "input_modified",
    "non_finite": "wrong_output",
    "out_of_tolerance": "wrong_output",
    "referee_error": "referee_error",
}


def hidden_cases(spec: dict, secret: int) -> list[dict]:
    """Cases drawn with the secret seed from the declared ranges (`spec["hidden"]`): a candidate
    that special-cases the public shapes meets shapes it has never seen."""
    hidden = spec.get("hidden") or {}
    ranges = hidden.get("ranges") or []
    count = int(hidden.get("count", 0)) if ranges else 0
    rng = np.random.default_rng(C.derive_seed(secret, "hidden"))
    cases = []
    for k in range(count):
        template = dict(ranges[int(rng.integers(len(ranges)))])
        bounds = template.pop("shape")
        shape = []
        for bound in bounds:
            lo, hi = int(bound[0]), int(bound[1])
            step = int(bound[2]) if len(bound) > 2 else 1
            shape.append(lo + step * int(rng.integers((hi - lo) // step + 1)))
        cases.append(dict(template, name=f"hidden_{k}", shape=shape, hidden=True))
    return cases


def prepare_case(case: dict, seed: int, workloads, oracle) -> dict:
    try:
        inputs = workloads.make_inputs(dict(case), seed)
    except Exception as exc:  # noqa: BLE001  any task error is a harness fault
        raise C.HarnessError(
            f"workloads.make_inputs failed on case {case['name']!r}: {exc!r}"
        ) from exc
    digest = C.inputs_digest(inputs)
    header, packed = R.pack_inputs(C, inputs)
    try:
        ref = oracle.reference(**inputs)
    except Exception as exc:  # noqa: BLE001  any task error is a harness fault
        raise C.HarnessError(f"oracle.reference failed on case {case['name']!r}: {exc!r}") from exc
    if type(ref) is not np.ndarray or ref.dtype != np.float64:
        raise C.HarnessError(f"oracle.reference must return a float64 numpy array ({case['name']})")
    if not np.all(np.isfinite(ref)):
        raise C.HarnessError(f"oracle output is not finite on case {case['name']!r}")
    if C.inputs_digest(inputs) != digest:
        raise C.HarnessError(f"oracle.reference modified its inputs on case {case['name']!r}")
    out_dtype = case.get("out_dtype", case["dtype"])
    nbytes = int(ref.size) * C.dtype_itemsize(out_dtype)
    return {
        "seed": seed,
        "digest": digest,
        "ref": ref,
        "header": header,
        "packed": packed,
        "out_dtype": out_dtype,
        "nbytes": nbytes,
    }


def unjudged(prep: dict) -> dict:
    """What judging one call fills in (a case's record here, a rank's in multirank.py)."""
    return {
        "passed": False,
        "reason": None,
        "detail": None,
        "max_abs_err": None,
        "max_rel_err": None,
        "mismatched": None,
        "expected_shape": list(prep["ref"].shape),
    }


def _record(case: dict, prep: dict) -> dict:
    return {
        "name": case["name"],
        "seed": prep["seed"],
        "input_digest": prep["digest"],
        "hidden": bool(case.get("hidden")),
        "shape": case.get("shape"),
        **unjudged(prep),
        "expected_dtype": prep["out_dtype"],
        "output": None,
        "wall_s": None,
        "log_tail": None,
    }


def raw_output(raw: bytes, dtype: str, shape) -> np.ndarray:
    """The referee's reading of output bytes: dtype and shape from the spec, never the worker."""
    np_dtype = np.uint16 if dtype == "bfloat16" else np.dtype(dtype)
    return np.frombuffer(raw, dtype=np_dtype).reshape(shape)


def judge_reply(spec: dict, record: dict, prep: dict, call) -> None:
    reply = call.reply
    record["wall_s"] = round(call.elapsed_ns / 1e9, 6)
    op = reply.get("op")
    if op == "raised":
        err = reply.get("error") if isinstance(reply.get("error"), dict) else {}
        record.update(reason="exception", detail=f"{err.get('type')}: {err.get('message')}")
        return
    if op != "done" or not isinstance(reply.get("out"), dict):
        record.update(reason="crash", detail=f"protocol: unexpected reply {str(reply)[:200]}")
        return
    meta = reply["out"]
    record["output"] = {k: meta.get(k) for k in ("type", "dtype", "shape", "device")}
    expected_shape = list(prep["ref"].shape)
    if meta.get("problem") == "wrong_type":
        wanted = "numpy.ndarray" if spec["framework"] == "numpy" else "torch.Tensor"
        record.update(
            reason="wrong_type",
            detail=f"returned {meta.get('type')}; the contract needs exactly {wanted}",
        )
        return
    if meta.get("problem") == "wrong_device" or meta.get("device") != spec["device"]:
        record.update(
            reason="wrong_device",
            detail=f"output on {meta.get('device')}, expected {spec['device']}",
        )
        return
    if meta.get("shape") != expected_shape:
        record.update(
            reason="wrong_shape", detail=f"shape {meta.get('shape')}, expected {expected_shape}"
        )
        return
    if meta.get("problem") == "wrong_dtype" or meta.get("dtype") != prep["out_dtype"]:
        record.update(
            reason="wrong_dtype", detail=f"dtype {meta.get('dtype')}, expected {prep['out_dtype']}"
        )
        return
    if call.output is None:
        record.update(
            reason="wrong_shape",
            detail=f"{meta.get('nbytes')} output bytes, expected {prep['nbytes']}",
        )
        return
    if not call.inputs_intact:
        record.update(reason="input_modified", detail="an input changed during the call")
        return
    actual = C.as_float64(
        raw_output(call.output, prep["out_dtype"], expected_shape), prep["out_dtype"]
    )
    atol, rtol = C.tolerance_for(spec, prep["out_dtype"])
    cmp = C.compare(actual, prep["ref"], atol, rtol)
    record.update(
        max_abs_err=cmp["max_abs_err"], max_rel_err=cmp["max_rel_err"], mismatched=cmp["mismatched"]
    )
    if cmp["nonfinite"]:
        record.update(
            reason="non_finite",
            detail=f"{cmp['nonfinite']} non-finite values where the oracle is finite",
        )
    elif not cmp["passed"]:
        record.update(
            reason="out_of_tolerance",
            detail=f"{cmp['mismatched']} of {actual.size} values outside atol={atol} rtol={rtol}",
        )
    else:
        record.update(passed=True, reason="ok")


def run_check(task_dir: Path, impl_dir: Path, spec: dict, work_dir: Path, secret: int) -> dict:
    started = time.monotonic()
    workloads = C.load_task_module(task_dir, "workloads")
    oracle = C.load_task_module(task_dir, "oracle")
    impl_digest, impl_files = C.tree_digest(impl_dir)
    cases, drawn = draw_cases(spec, secret)
    preps = [
        prepare_case(case, C.derive_seed(secret, "check", case["name"]), workloads, oracle)
        for case in cases
    ]
    records = [_record(case, prep) for case, prep in zip(cases, preps, strict=True)]
    timeout = float(spec["call_timeout_s"])
    log_path = work_dir / "worker.log"
    try:
        worker = R.start_worker(
            framework=spec["framework"],
            device=spec["device"],
            threads=spec["threads"],
            impl_dir=impl_dir,
            entry=C.worker_entry(spec, workloads),
            in_size=max(len(p["packed"]) for p in preps) + R.ALIGN,
            out_size=max(p["nbytes"] for p in preps),
            work_dir=work_dir,
            log_path=log_path,
            startup_timeout_s=float(spec["startup_timeout_s"]),
        )
        worker.fork()
    except R.WorkerStartError as exc:
        raise C.HarnessError(f"check worker failed before any candidate code ran: {exc}") from exc
    isolation = worker.mode
    confinement = worker.confinement
    try:
        if _judge_cases(worker, preps, records, spec, timeout):
            try:
                worker.end_child(timeout)
            except R.WorkerFault as exc:
                records[-1].update(
                    passed=False, reason="crash", detail=f"after its last call: {exc.detail}"
                )
    except Exception as exc:  # noqa: BLE001  after candidate code ran: its failure, with evidence
        referee_error(records, exc)
    finally:
        worker.kill()
    add_log_tail(records, R.tail(log_path))
    doc = check_document(spec, records, drawn, impl_digest, impl_files)
    return dict(
        doc,
        referee={
            "isolation": isolation,
            "secret_seed": str(secret),
            "seed_source": "os.urandom" if spec.get("_seed_given") is None else "--seed (replay)",
            "confinement": confinement,
            "unconfined": R.unconfined() or None,
        },
        wall_s=round(time.monotonic() - started, 3),
    )


def draw_cases(spec: dict, secret: int) -> tuple[list[dict], list[dict]]:
    """(every case, the hidden ones): the spec's cases and those drawn from its shape ranges
    with the secret seed, each of which must have a tolerance for its output dtype."""
    drawn = hidden_cases(spec, secret)
    for case in drawn:
        if case.get("out_dtype", case.get("dtype")) not in spec["tolerances"]:
            raise C.HarnessError(f"no tolerance for the output dtype of hidden range {case!r}")
    return list(spec["cases"]) + drawn, drawn


def add_log_tail(records: list[dict], log: str | None) -> None:
    """The worker's log tail goes with the first case that failed (not one left unrun)."""
    for rec in records:
        if rec["reason"] not in (None, "ok", "not_run"):
            rec["log_tail"] = log
            break


def check_document(
    spec: dict, records: list[dict], drawn: list[dict], impl_digest: str, impl_files: list[str]
) -> dict:
    """The `rsi.check/1` document of judged `records` (check.py's and multirank.py's alike; the
    caller adds `referee` and `wall_s`): the first failure decides its kind, and a case left
    unjudged without any failure is the harness's fault, never a pass."""
    reasons = [
        {"code": c["reason"], "case": c["name"], "detail": c["detail"]}
        | ({"rank": c.get("rank")} if "ranks" in c else {})
        for c in records
        if not c["passed"] and c["reason"] != "not_run"
    ]
    failure_kind = FAILURE_KIND[reasons[0]["code"]] if reasons else None
    if failure_kind is None and not all(c["passed"] for c in records):
        raise C.HarnessError("cases were left unjudged without a failure")
    return {
        "schema": SCHEMA,
        "status": "ok" if failure_kind is None else "candidate_failure",
        "failure_kind": failure_kind,
        "reasons": reasons,
        "impl": {
            "digest": impl_digest,
            "files": impl_files,
            "extra_files": sorted(set(impl_files) - set(spec["editable"])),
            "missing_files": sorted(set(spec["editable"]) - set(impl_files)),
        },
        "entry": spec["entry"],
        "framework": spec["framework"],
        "cases": records,
        "input_digests": {c["name"]: c["input_digest"] for c in records},
        "n_cases": len(records),
        "n_passed": sum(c["passed"] for c in records),
        "n_hidden": len(drawn),
        "hidden_cases": drawn,
        "device": spec["device"],
        "fingerprint": C.fingerprint(
            spec, C.device_facts(spec), C.nvidia_smi() if spec["device"] != "cpu" else None
        ),
    }


def referee_error(records: list[dict], exc: BaseException) -> None:
    """The first case not yet judged (else the last) fails as `referee_error`; later ones were
    not run."""
    pending = [r for r in records if r["reason"] in (None, "not_run")] or records[-1:]
    pending[0].update(passed=False, reason="referee_error", detail=C.error_summary(exc))
    for rec in records[records.index(pending[0]) + 1 :]:
        rec.update(passed=False, reason="not_run", detail="an earlier case ended the check")


def failure_document(doc: dict, exc: BaseException) -> dict:
    """`doc` made writable (JSON-safe) and failed as `referee_error`: what to write when the
    judged document itself could not be written."""
    safe = C.json_safe(doc)
    reason = {"code": "referee_error", "case": None, "detail": C.error_summary(exc)}
    safe.update(status="candidate_failure", failure_kind="referee_error")
    safe["reasons"] = [reason, *(safe.get("reasons") or [])]
    return safe


def _judge_cases(worker, preps, records, spec, timeout) -> bool:
    """Judge every case in order; False when the worker ended early (later cases not run)."""

    def not_run_after(k: int) -> None:
        for rec in records[k + 1 :]:
            rec.update(reason="not_run", detail="an earlier case ended the check")

    try:
        imported = worker.import_impl(timeout)
    except R.WorkerFault as exc:
        records[0].update(
            reason="crash" if exc.code != "timeout" else "timeout",
            detail=f"while importing the implementation: {exc.detail}",
        )
        not_run_after(0)
        return False
    if imported.get("op") == "import_failed":
        kind = imported.get("kind")
        kind = kind if kind in ("syntax_error", "import_error", "missing_entry") else "import_error"
        err = imported.get("error") if isinstance(imported.get("error"), dict) else {}
        records[0].update(reason=kind, detail=f"{err.get('type')}: {err.get('message')}")
        not_run_after(0)
        return False
    if imported.get("op") != "imported":
        records[0].update(reason="crash", detail=f"protocol: import answered {str(imported)[:200]}")
        not_run_after(0)
        return False
    for k, (prep, rec) in enumerate(zip(preps, records, strict=True)):
        try:
            worker.layout(prep["header"], timeout)
            call = R.timed_call(worker, k, prep["packed"], prep["nbytes"], timeout)
        except R.WorkerFault as exc:
            code = {"timeout": "timeout"}.get(exc.code, "crash")
            detail = (
                f"no result within {timeout} s; the worker was killed"
                if code == "timeout"
                else exc.detail
            )
            rec.update(reason=code, detail=detail)
            not_run_after(k)
            return False
        if call.reply.get("op") == "done" and call.reply.get("i") != k:
            rec.update(reason="crash", detail="protocol: a reply for another call")
            not_run_after(k)
            return False
        judge_reply(spec, rec, prep, call)
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--task", required=True, type=Path)
    parser.add_argument("--impl", required=True, type=Path)
    parser.add_argument("--spec", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument(
        "--seed", type=int, default=None, help="replay a run: the secret seed its evidence revealed"
    )
    args = parser.parse_args()
    out_path = args.out.resolve()
    R.harden_self()
    C.become_subreaper()
    outside: dict = {}
    swept = False
    work_dir, alive = C.scratch_dir("rsi-check-")
    try:
        spec = C.load_spec(args.spec)
        C.require_device(spec)
        secret = R.secret_seed() if args.seed is None else int(args.seed)
        if args.seed is not None:
            spec["_seed_given"] = True
        # NB: what the judged code imports beyond the judge's identity (rules/harness/imports.py)
        # is not in the action key: judged, recorded, never cached
        outside = IMP.outside_identity([args.task.resolve(), args.impl.resolve()])
        doc = run_check(args.task.resolve(), args.impl.resolve(), spec, work_dir, secret)
        C.kill_descendants()
        swept = True
        doc["imports_outside_identity"] = outside
        try:
            C.write_json(out_path, doc)
        except (ValueError, TypeError, RecursionError) as exc:
            C.write_json(out_path, failure_document(doc, exc))
    except C.HarnessError as exc:
        print(f"rsi harness fault (check): {exc}", file=sys.stderr)
        return C.INFRA_EXIT
    finally:
        # NB: once swept after the run nothing of ours is left to kill; another /proc scan
        # (every process's stat file) would only cost start-up time
        if not swept:
            C.kill_descendants()
        shutil.rmtree(work_dir, ignore_errors=True)
        os.close(alive)
    if outside:
        print(
            f"rsi check: imports outside the judge's identity, not to be cached: {outside}",
            file=sys.stderr,
        )
        return C.BUSY_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
