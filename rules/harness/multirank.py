"""The referee of a multi-rank task: `multirank.py check ...` and `multirank.py measure ...`. It
must never let a rank reach another rank, nor import rsi or rules.

A binding with `ranks = {world_size, backend, topology}` judges its candidates here instead of
check.py / measure.py, with the same documents (`rsi.check/1`, `rsi.measure/1`, plus per-rank
detail) and the same referee/worker split (rules/harness/SPEC.md, "Multi-rank"):

- One sandbox (mr_sandbox.py) holds a zygote (mr_worker.py) that forks `world_size` fresh
  workers per arm-run, one per rank, on channels made fresh for that arm-run and held by that
  rank alone; each rank is confined and joins the process group before any candidate code,
  then imports the candidate. Two sandboxes per measurement, swapped every pair.
- The referee draws every input (secret seed), computes the oracle on the whole layer
  (`workloads.make_inputs`), hands rank r only its shard (`workloads.shard_inputs(inputs, r,
  world_size)`) when the call starts, and judges every rank's output against
  `oracle.rank_output(reference, r, world_size)` (default: the whole reference).
- A call is lockstep: every rank is armed (the barrier), then the clock starts, every rank's
  input is written and the call published to all; each rank's time is read when the referee
  sees it finish; the sample is the slowest rank's. Any rank's crash, hang (past
  call_timeout_s) or wrong output is the candidate's failure, with the rank in the reason.
  How long the referee and each rank waited for a CPU is read around every timed call
  (contention, as measure.py).

Stdlib + numpy + torch. Exits 2 only for a harness fault before any candidate code ran: from
the candidate's first import on, whatever goes wrong on the referee's side is the candidate's
failure (`referee_error`), with the evidence written; a sandbox an implementation left
unusable is that implementation's failure (`sandbox_damaged`).

This file is the command line; the ranks' split is mr_task.py, a lockstep call mr_lockstep.py,
the sandbox mr_sandbox.py, the check mr_check.py, the measurement mr_measure.py and mr_arm.py.
"""

from __future__ import annotations

import argparse
import runpy
import os
import shutil
import sys
from pathlib import Path


# NB: the harness's one sibling loader (siblings.py), itself run by path: no sys.path here
load_siblings = runpy.run_path(str(Path(__file__).resolve().parent / "siblings.py"))["load"]
C, R, K, D, TASK, CHECK, MEASURE = load_siblings(
    "_common", "referee", "check", "measure_doc", "mr_task", "mr_check", "mr_measure"
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="step", required=True)
    check = sub.add_parser("check")
    check.add_argument("--impl", required=True, type=Path)
    measure = sub.add_parser("measure")
    measure.add_argument("--baseline", required=True, type=Path)
    measure.add_argument("--candidate", required=True, type=Path)
    for p in (check, measure):
        p.add_argument("--task", required=True, type=Path)
        p.add_argument("--spec", required=True, type=Path)
        p.add_argument("--out", required=True, type=Path)
        p.add_argument("--seed", type=int, default=None, help="replay with a revealed seed")
    args = parser.parse_args()
    out_path = args.out.resolve()
    R.harden_self()
    C.become_subreaper()
    load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    outside: dict = {}
    work_dir, alive = C.scratch_dir(f"rsi-mr-{args.step}-")
    try:
        spec = C.load_spec(args.spec)
        C.require_device(spec)
        TASK.ranks_of(spec)
        secret = R.secret_seed() if args.seed is None else int(args.seed)
        # NB: what the judged code imports beyond the judge's identity (rules/harness/imports.py)
        # is not in the action key: judged, recorded, never cached
        judged = (
            [args.task, args.impl]
            if args.step == "check"
            else [args.task, args.baseline, args.candidate]
        )
        outside = K.IMP.outside_identity([p.resolve() for p in judged])
        if args.step == "check":
            if args.seed is not None:
                spec["_seed_given"] = True
            doc = CHECK.run_check(args.task.resolve(), args.impl.resolve(), spec, work_dir, secret)
        else:
            spec["_seed_given"] = args.seed is not None
            doc = MEASURE.run_measure(
                args.task.resolve(),
                args.baseline.resolve(),
                args.candidate.resolve(),
                spec,
                work_dir,
                secret,
            )
            doc["host"]["loadavg_start"] = load_start
        C.kill_descendants()
        doc["imports_outside_identity"] = outside
        try:
            C.write_json(out_path, doc)
        except (ValueError, TypeError, RecursionError) as exc:
            doc = (K if args.step == "check" else D).failure_document(doc, exc)
            C.write_json(out_path, doc)
        busy = C.busy_reason(doc) if args.step == "measure" else None
    except C.HarnessError as exc:
        print(f"rsi harness fault (multirank {args.step}): {exc}", file=sys.stderr)
        return C.INFRA_EXIT
    finally:
        C.kill_descendants()
        shutil.rmtree(work_dir, ignore_errors=True)
        os.close(alive)
    if busy:
        # NB: judged (assess: INCONCLUSIVE host_busy) but never cached, as measure.py
        print(
            f"rsi multirank measure: the host was busy, not to be cached: {busy}", file=sys.stderr
        )
        return C.BUSY_EXIT
    if outside:
        print(
            f"rsi multirank {args.step}: imports outside the judge's identity, not to be "
            f"cached: {outside}",
            file=sys.stderr,
        )
        return C.BUSY_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
