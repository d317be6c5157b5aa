"""A multi-rank check (`multirank.py check`): every case's inputs drawn by the referee, each
rank handed its shard in one lockstep call, every rank's output judged against its part of the
oracle's (check.py's judging), the case failing on its first failing rank, named.

It must never run candidate code before the ranks are confined, nor let a failure after the
import be a harness fault: from then on it is the candidate's, with the evidence written.
"""

from __future__ import annotations

import runpy
import time
from pathlib import Path

import numpy as np


# NB: the harness's one sibling loader (siblings.py), itself run by path: no sys.path here
load_siblings = runpy.run_path(str(Path(__file__).resolve().parent / "siblings.py"))["load"]
C, R, K, J, S, TASK, LS = load_siblings(
    "_common", "referee", "check", "measure_judge", "mr_sandbox", "mr_task", "mr_lockstep"
)


def prepare_case(case: dict, seed: int, workloads, oracle, world: int) -> dict:
    inputs = J.make_inputs(workloads, case, seed)
    digest = C.inputs_digest(inputs)
    try:
        ref = oracle.reference(**inputs)
    except Exception as exc:  # noqa: BLE001
        raise C.HarnessError(f"oracle.reference failed on case {case['name']!r}: {exc!r}") from exc
    if type(ref) is not np.ndarray or ref.dtype != np.float64 or not np.all(np.isfinite(ref)):
        raise C.HarnessError(f"oracle output must be finite float64 ({case['name']})")
    out_dtype = case.get("out_dtype", case["dtype"])
    ranks = []
    for r, local in enumerate(TASK.shards(workloads, inputs, world)):
        header, packed = R.pack_inputs(C, local)
        expected = TASK.rank_expected(oracle, ref, r, world)
        ranks.append(
            {
                "ref": expected,
                "header": header,
                "packed": packed,
                "out_dtype": out_dtype,
                "nbytes": int(expected.size) * C.dtype_itemsize(out_dtype),
                "digest": C.inputs_digest(local),
            }
        )
    return {"seed": seed, "digest": digest, "ref": ref, "out_dtype": out_dtype, "ranks": ranks}


def _rank_record(rank: int, prep: dict) -> dict:
    return {
        "rank": rank,
        "input_digest": prep["digest"],
        **K.unjudged(prep),
        "output": None,
        "wall_s": None,
    }


def _settle_case(rec: dict) -> None:
    """The case's verdict from its ranks': the first failing rank's reason, naming it."""
    bad = [r for r in rec["ranks"] if not r["passed"]]
    errs = [r["max_abs_err"] for r in rec["ranks"] if r["max_abs_err"] is not None]
    rels = [r["max_rel_err"] for r in rec["ranks"] if r["max_rel_err"] is not None]
    rec["max_abs_err"] = max(errs) if errs else None
    rec["max_rel_err"] = max(rels) if rels else None
    rec["mismatched"] = sum(r["mismatched"] or 0 for r in rec["ranks"])
    walls = [r["wall_s"] for r in rec["ranks"] if r["wall_s"] is not None]
    rec["wall_s"] = max(walls) if walls else None
    rec["output"] = rec["ranks"][0]["output"]
    if not bad:
        rec.update(passed=True, reason="ok", detail=None)
        return
    first = bad[0]
    others = [r["rank"] for r in bad[1:]]
    rec.update(
        passed=False,
        reason=first["reason"],
        detail=f"rank {first['rank']}: {first['detail']}"
        + (f" (also rank(s) {', '.join(map(str, others))})" if others else ""),
        rank=first["rank"],
        failed_ranks=[r["rank"] for r in bad],
    )


def run_check(task_dir: Path, impl_dir: Path, spec: dict, work_dir: Path, secret: int) -> dict:
    started = time.monotonic()
    ranks = TASK.ranks_of(spec)
    world = int(ranks["world_size"])
    workloads, oracle = TASK.task_modules(task_dir)
    impl_digest, impl_files = C.tree_digest(impl_dir)
    cases, drawn = K.draw_cases(spec, secret)
    preps = [
        prepare_case(case, C.derive_seed(secret, "check", case["name"]), workloads, oracle, world)
        for case in cases
    ]
    records = []
    for case, prep in zip(cases, preps, strict=True):
        rec = K._record(case, dict(prep, ref=prep["ref"]))
        rec["ranks"] = [_rank_record(r, p) for r, p in enumerate(prep["ranks"])]
        records.append(rec)
    timeout = float(spec["call_timeout_s"])
    sizes = [
        (
            max(len(p["ranks"][r]["packed"]) for p in preps) + R.ALIGN,
            max(p["ranks"][r]["nbytes"] for p in preps),
        )
        for r in range(world)
    ]
    try:
        (box,) = S.start_sandboxes(1, spec=spec, impls=(impl_dir,), sizes=sizes, work_dir=work_dir)
    except R.WorkerStartError as exc:
        raise C.HarnessError(f"rank sandbox failed before any candidate code ran: {exc}") from exc
    try:
        try:
            box.fork()
        except R.WorkerStartError as exc:
            raise C.HarnessError(f"ranks failed before any candidate code ran: {exc}") from exc
        try:
            if _judge_cases(box, impl_dir, preps, records, spec, timeout):
                try:
                    box.end_ranks()
                except R.WorkerFault as exc:
                    records[-1].update(
                        passed=False, reason="crash", detail=f"after its last call: {exc.detail}"
                    )
        except Exception as exc:  # noqa: BLE001  the candidate was asked to import: its failure
            K.referee_error(records, exc)
    finally:
        box.kill()
    K.add_log_tail(records, R.tail(box.log))
    return dict(
        K.check_document(spec, records, drawn, impl_digest, impl_files),
        ranks=ranks,
        referee={
            "isolation": box.mode,
            "ranks": f"{world} rank workers forked per check in one sandbox, lockstep calls",
            "secret_seed": str(secret),
            "seed_source": "os.urandom" if spec.get("_seed_given") is None else "--seed (replay)",
            "unconfined": S.unconfined() or None,
        },
        wall_s=round(time.monotonic() - started, 3),
    )


def _fail_case(records: list[dict], k: int, code: str, detail: str, rank=None) -> None:
    rec = records[k]
    rec.update(passed=False, reason=code, detail=detail, rank=rank)
    for later in records[k + 1 :]:
        later.update(reason="not_run", detail="an earlier case ended the check")


def _judge_cases(box: S.RankSandbox, impl_dir: Path, preps, records, spec, timeout) -> bool:
    failed = box.import_impl(impl_dir)
    if failed:
        _fail_case(records, 0, failed[0], failed[1])
        return False
    for k, (prep, rec) in enumerate(zip(preps, records, strict=True)):
        try:
            for ch, rp in zip(box.channels, prep["ranks"], strict=True):
                ch.set_layout(rp["header"], timeout)
            res = LS.lockstep_call(
                box,
                k,
                [rp["packed"] for rp in prep["ranks"]],
                [rp["nbytes"] for rp in prep["ranks"]],
                timeout,
            )
        except R.WorkerFault as exc:
            code = exc.code if exc.code in ("timeout", "exception") else "crash"
            rank = getattr(exc, "ranks", [None])[0]
            _fail_case(records, k, code, exc.detail, rank)
            return False
        for rrec, rp, call in zip(rec["ranks"], prep["ranks"], res.calls, strict=True):
            K.judge_reply(spec, rrec, rp, call)
        _settle_case(rec)
    return True
