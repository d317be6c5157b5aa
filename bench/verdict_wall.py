"""Wall time of one full verdict (baseline check, A/A calibration, check, measure, assess) now
against an older harness, interleaved in one run on this host: each round builds a task's
`verdict` target from scratch (a fresh store) once with the old tree and once with this one,
alternating which goes first. Usage:

    .venv/bin/python bench/verdict_wall.py [--old 6d2e5f8] [--tasks softmax rmsnorm] [--rounds 3]

The old tree is `git archive`d into a temporary folder and run with this environment
(PYTHONPATH puts its `rsi` and `rules` first). Prints per task the medians and new/old, and
writes out/bench/verdict_wall.json. Each build takes the machine-wide host lock of its own
(a private RSI_HOST_LOCK); run it on a quiet host: a busy one makes measurements host_busy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _tree(commit: str, into: Path) -> Path:
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def _build(tree: Path, task: str, scratch: Path) -> dict:
    store = scratch / "store"
    shutil.rmtree(store, ignore_errors=True)
    shutil.rmtree(tree / "out", ignore_errors=True)
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "RSI_HOST_LOCK": str(scratch / "host.lock"),
    }
    env.pop("RSI_SERVER", None)
    t0 = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "rsi.cli", "--store", str(store)]
        + ["build", f"//tasks/{task}:verdict"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    took = time.monotonic() - t0
    verdict = None
    found = sorted((tree / "out").glob(f"tasks/{task}/**/verdict.json"))
    if found:
        doc = json.loads(found[0].read_text())
        verdict = (doc.get("verdict"), [r.get("code") for r in doc.get("reasons", [])])
    shutil.rmtree(store, ignore_errors=True)
    return {"rc": run.returncode, "s": round(took, 2), "verdict": verdict, "err": run.stderr[-300:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", default="6d2e5f8")
    ap.add_argument("--tasks", nargs="+", default=["softmax", "rmsnorm"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=REPO / "out" / "bench" / "verdict_wall.json")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="rsi-verdict-wall-"))
    try:
        old = _tree(args.old, scratch / "old")
        new = _tree("HEAD", scratch / "new")
        report = {"old": args.old, "new": "HEAD", "tasks": {}}
        for task in args.tasks:
            runs: dict[str, list[dict]] = {"old": [], "new": []}
            for i in range(args.rounds):
                order = ("old", "new") if i % 2 == 0 else ("new", "old")
                for which in order:
                    got = _build(old if which == "old" else new, task, scratch)
                    runs[which].append(got)
                    print(f"{task} {which} #{i + 1}: {got['s']} s rc={got['rc']} {got['verdict']}")
            ok = {k: [r["s"] for r in v if r["rc"] == 0] for k, v in runs.items()}
            med = {k: statistics.median(v) if v else None for k, v in ok.items()}
            ratio = med["new"] / med["old"] if med["new"] and med["old"] else None
            report["tasks"][task] = {"runs": runs, "median_s": med, "new_over_old": ratio}
            print(f"{task}: old {med['old']} s, new {med['new']} s, new/old {ratio}")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
