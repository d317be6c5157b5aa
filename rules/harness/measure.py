"""Paired timing of baseline vs candidate (A/A calibration when both are the same tree). It must
never let candidate code run in its own process, nor import rsi or rules.

This process is the referee. It draws a secret seed from the OS, generates every input itself
(warm-up and timed draws differ; both arms of a pair get the identical sequence), hands each
input to the arm's worker only when that call starts, reads its own clock around handing the
input over and taking the output back, and checks every timed output against the oracle
outside the timed region. Pair i runs AB when i is even and BA when odd, in two sandboxes the
arms swap every pair; on a CPU the two arms' timed calls alternate (A B B A ...) with the idle
arm's sandbox stopped (run_pair). Raw per-call nanoseconds are the evidence. Exits 2 only for
a harness fault before any candidate code ran: from the first import on, anything that goes
wrong on the referee's side is the candidate arm's failure `referee_error`, with the evidence
written; a call whose CPU figures could not be read (`cpu_unread`) fails its arm.

This file is the command line; the driving is measure_run.py, an arm's calls measure_arm.py,
what a call is judged by measure_judge.py and the document's parts measure_doc.py.
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
C, R, IMP, D, RUN = load_siblings("_common", "referee", "imports", "measure_doc", "measure_run")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--task", required=True, type=Path)
    parser.add_argument("--baseline", required=True, type=Path)
    parser.add_argument("--candidate", required=True, type=Path)
    parser.add_argument("--spec", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument(
        "--seed", type=int, default=None, help="replay a run: the secret seed its evidence revealed"
    )
    args = parser.parse_args()
    out_path = args.out.resolve()
    R.harden_self()
    C.become_subreaper()
    load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    outside: dict = {}
    swept = False
    work_dir, alive = C.scratch_dir("rsi-measure-")
    try:
        spec = C.load_spec(args.spec)
        C.require_device(spec)
        secret = R.secret_seed() if args.seed is None else int(args.seed)
        spec["_seed_given"] = args.seed is not None
        # NB: what the judged code imports beyond the judge's identity (rules/harness/imports.py)
        # is not in the action key: judged, recorded, never cached
        outside = IMP.outside_identity(
            [args.task.resolve(), args.baseline.resolve(), args.candidate.resolve()]
        )
        R.pin_referee(int(spec["threads"]))
        doc = RUN.run_measure(
            args.task.resolve(),
            args.baseline.resolve(),
            args.candidate.resolve(),
            spec,
            work_dir,
            secret,
        )
        doc["host"]["loadavg_start"] = load_start
        doc["imports_outside_identity"] = outside
        C.kill_descendants()
        swept = True
        try:
            C.write_json(out_path, doc)
        except (ValueError, TypeError, RecursionError) as exc:
            doc = D.failure_document(doc, exc)
            C.write_json(out_path, doc)
        busy = C.busy_reason(doc)
    except C.HarnessError as exc:
        print(f"rsi harness fault (measure): {exc}", file=sys.stderr)
        return C.INFRA_EXIT
    finally:
        # NB: once swept after the run nothing of ours is left to kill; another /proc scan
        # (every process's stat file) would only cost start-up time
        if not swept:
            C.kill_descendants()
        shutil.rmtree(work_dir, ignore_errors=True)
        os.close(alive)
    if busy:
        print(f"rsi measure: the host was busy, not to be cached: {busy}", file=sys.stderr)
        return C.BUSY_EXIT
    if outside:
        print(
            f"rsi measure: imports outside the judge's identity, not to be cached: {outside}",
            file=sys.stderr,
        )
        return C.BUSY_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
