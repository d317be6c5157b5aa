"""What the referee costs: wall time of one verdict's check + measure + assess with the
referee/worker harness against the harness before it (the in-process one, taken from git at
BEFORE), on the same spec, host and run, alternating; and the per-call hand-over (IPC) cost the
referee measures before any candidate code is imported.

Usage: python bench/referee.py [--task softmax] [--reps 5] [--before a42cfc8]
Writes out/bench/referee.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "tasks"
OLD_SCRIPTS = (
    "check.py",
    "measure.py",
    "assess.py",
    "stats.py",
    "_common.py",
    "runner.py",
    "timer.py",
)


def export_old(before: str, dest: Path) -> Path:
    dest.mkdir(parents=True)
    for name in OLD_SCRIPTS:
        blob = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{before}:rules/harness/{name}"],
            capture_output=True,
            check=True,
        ).stdout
        (dest / name).write_bytes(blob)
    return dest


def verdict_wall(harness: Path, task: str, candidate: Path, spec: Path, work: Path) -> dict:
    """check (candidate), measure (baseline vs candidate), assess against a fresh A/A; the wall
    time of check + measure + assess (the calibration is the binding's, shared, not counted)."""
    tdir = TASKS / task
    py = [sys.executable, "-I", "-B"]

    def run(script: str, *args: str) -> float:
        started = time.perf_counter()
        proc = subprocess.run(
            [*py, str(harness / script), *args],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if proc.returncode not in (0, 75):  # NB: 75: measured on a busy host
            raise SystemExit(f"{harness}/{script} failed: {proc.stderr[-2000:]}")
        return time.perf_counter() - started

    common = ["--task", str(tdir)]
    run(
        "check.py",
        *common,
        "--impl",
        str(tdir / "baseline"),
        "--spec",
        str(spec),
        "--out",
        str(work / "base.json"),
    )
    run(
        "measure.py",
        *common,
        "--baseline",
        str(tdir / "baseline"),
        "--candidate",
        str(tdir / "baseline"),
        "--spec",
        str(spec),
        "--out",
        str(work / "aa.json"),
    )
    t_check = run(
        "check.py",
        *common,
        "--impl",
        str(candidate),
        "--spec",
        str(spec),
        "--out",
        str(work / "check.json"),
    )
    t_measure = run(
        "measure.py",
        *common,
        "--baseline",
        str(tdir / "baseline"),
        "--candidate",
        str(candidate),
        "--spec",
        str(spec),
        "--out",
        str(work / "samples.json"),
    )
    t_assess = run(
        "assess.py",
        "--spec",
        str(spec),
        "--samples",
        str(work / "samples.json"),
        "--check",
        str(work / "check.json"),
        "--baseline-check",
        str(work / "base.json"),
        "--calibration",
        str(work / "aa.json"),
        "--out",
        str(work / "verdict.json"),
    )
    samples = json.loads((work / "samples.json").read_text())
    verdict = json.loads((work / "verdict.json").read_text())
    return {
        "wall_s": t_check + t_measure + t_assess,
        "check_s": t_check,
        "measure_s": t_measure,
        "verdict": verdict["verdict"],
        "reasons": [r["code"] for r in verdict.get("reasons", [])],
        "speedup": (verdict.get("speedup") or {}).get("point"),
        "ipc_overhead_ns": (samples.get("referee") or {}).get("ipc_overhead_ns"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--task", default="softmax")
    parser.add_argument("--candidate", default="candidates/fast")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--before", default="a42cfc8")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "bench" / "referee.json")
    args = parser.parse_args()
    spec = TASKS / args.task / "harness_spec.example.json"
    candidate = TASKS / args.task / args.candidate
    runs: dict[str, list[dict]] = {"before": [], "referee": []}
    with tempfile.TemporaryDirectory(prefix="rsi-bench-referee-") as tmp:
        old = export_old(args.before, Path(tmp) / "old")
        for k in range(args.reps):
            order = [("before", old), ("referee", ROOT / "rules" / "harness")]
            for name, harness in order if k % 2 == 0 else reversed(order):
                work = Path(tmp) / f"{name}-{k}"
                work.mkdir()
                runs[name].append(verdict_wall(harness, args.task, candidate, spec, work))
    med = {name: statistics.median(r["wall_s"] for r in rs) for name, rs in runs.items()}
    ipc = [v for r in runs["referee"] for v in (r["ipc_overhead_ns"] or {}).values()]
    doc = {
        "task": args.task,
        "candidate": args.candidate,
        "reps": args.reps,
        "before": args.before,
        "median_wall_s": med,
        "ratio_referee_to_before": med["referee"] / med["before"],
        "ipc_overhead_us_median": statistics.median(ipc) / 1e3 if ipc else None,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    print(
        f"{args.task} {args.candidate}: one verdict (check + measure + assess), median of "
        f"{args.reps}: before {med['before']:.2f} s, referee {med['referee']:.2f} s "
        f"({doc['ratio_referee_to_before']:.2f}x); IPC per call "
        f"{doc['ipc_overhead_us_median']:.0f} us"
    )
    for name, rs in runs.items():
        print(
            f"  {name:8s} verdicts {[r['verdict'] for r in rs]} speedups "
            f"{[round(r['speedup'], 3) if r['speedup'] else None for r in rs]}"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
