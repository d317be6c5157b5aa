"""Per-action overhead of the Slurm executor against the local executor, and a verdict's wall
time through each, measured in the same run against a real one-node Slurm started on loopback
(tests/slurm_support.py; needs slurmctld, slurmd, munged: scripts/setup.sh --test).

Usage: python bench/slurm.py [--actions 8] [--rounds 3]
Writes out/bench/slurm.json and prints a table.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from slurm_support import SlurmCluster, missing  # noqa: E402
from small_task import BUILD as TASK  # noqa: E402
from small_task import FAST, NAIVE, SOFTMAX  # noqa: E402

RSI = [sys.executable, "-m", "rsi.cli"]


def workspace(root: Path, executor: str, n: int, salt: str) -> Path:
    ws = root / f"ws-{executor}"
    shutil.rmtree(ws, ignore_errors=True)
    (ws / "tasks" / "sm" / "baseline").mkdir(parents=True)
    (ws / "tasks" / "sm" / "cands" / "fast").mkdir(parents=True)
    (ws / "rsi.toml").write_text(
        f'[workspace]\nexecutor = "{executor}"\nsalt = "{salt}"\n'
        + ("\n[slurm]\npoll_s = 0.05\n" if executor == "slurm" else "")
    )
    (ws / "BUILD.toml").write_text(
        "".join(
            f'[a{i}]\nrule = "command"\nouts = ["a{i}.txt"]\ncmd = "echo {i} > $(OUT)"\n\n'
            for i in range(n)
        )
    )
    (ws / "tasks" / "sm" / "BUILD.toml").write_text(TASK)
    for name in ("oracle.py", "workloads.py"):
        shutil.copy(SOFTMAX / name, ws / "tasks" / "sm" / name)
    (ws / "tasks" / "sm" / "baseline" / "kernel.py").write_text(NAIVE)
    (ws / "tasks" / "sm" / "cands" / "fast" / "kernel.py").write_text(FAST)
    return ws


def timed_build(ws: Path, env: dict, *targets: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [*RSI, "build", "-j", "1", *targets],
        cwd=ws,
        env={**os.environ, **env},
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--actions", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if missing():
        raise SystemExit(f"Slurm is not installed (missing {', '.join(missing())})")
    os.environ.setdefault("RSI_HOST_LOCK", str(Path(tempfile.gettempdir()) / "rsi-bench.lock"))
    root = Path(tempfile.mkdtemp(prefix="rsi-bench-slurm-"))
    cluster = SlurmCluster().start()
    rows: dict[str, list[float]] = {"local": [], "slurm": []}
    verdict: dict[str, list[float]] = {"local": [], "slurm": []}
    try:
        targets = [f"//:a{i}" for i in range(args.actions)]
        for r in range(args.rounds):
            # NB: in turns, a fresh salt each round so every action runs
            for executor in ("local", "slurm") if r % 2 == 0 else ("slurm", "local"):
                ws = workspace(root, executor, args.actions, f"r{r}")
                took = timed_build(ws, cluster.env, *targets)
                rows[executor].append(took / args.actions)
                verdict[executor].append(timed_build(ws, cluster.env, "//tasks/sm:verdict"))
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in rows.items()}
    vmed = {k: statistics.median(v) for k, v in verdict.items()}
    doc = {
        "actions_per_build": args.actions,
        "rounds": args.rounds,
        "per_action_s": med,
        "per_action_overhead_s": med["slurm"] - med["local"],
        "per_action_ratio": med["slurm"] / med["local"],
        "verdict_wall_s": vmed,
        "verdict_ratio": vmed["slurm"] / vmed["local"],
        "load_average": os.getloadavg(),
    }
    out = ROOT / "out" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    (out / "slurm.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"per action (-j 1, {args.actions} actions, median of {args.rounds}):")
    print(
        f"  local {med['local'] * 1000:.0f} ms, slurm {med['slurm'] * 1000:.0f} ms "
        f"(+{doc['per_action_overhead_s'] * 1000:.0f} ms, {doc['per_action_ratio']:.1f}x)"
    )
    print(
        f"verdict wall: local {vmed['local']:.1f} s, slurm {vmed['slurm']:.1f} s "
        f"({doc['verdict_ratio']:.2f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
