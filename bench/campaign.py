"""Campaign latencies: one round fresh (check + measure + assess), the same round again
(cached), the same content in another campaign (evidence reused by content), and a regrade of
an N-round campaign under a new assessment policy (goal: <= 1 s, 0 measure actions).

Usage: python bench/campaign.py [--rounds 10] [--pairs 6]
Runs in a temporary workspace (the softmax task with a naive baseline, small measurement
policy) with its own store; writes out/bench/campaign.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOFTMAX = ROOT / "tasks" / "softmax"
RSI = [sys.executable, "-m", "rsi.cli"]

NAIVE = """import numpy as np


def softmax(x):
    rows = x.reshape(-1, x.shape[-1])
    out = np.empty(rows.shape, dtype=x.dtype)
    for i in range(rows.shape[0]):
        r = rows[i].astype(np.float64)
        r = np.exp(r - r.max())
        out[i] = r / r.sum()
    return out.reshape(x.shape)
"""
FAST = """import numpy as np

# variant {n}


def softmax(x):
    xf = x.astype(np.float64)
    xf -= xf.max(axis=-1, keepdims=True)
    np.exp(xf, out=xf)
    xf /= xf.sum(axis=-1, keepdims=True)
    return xf.astype(x.dtype)
"""
BUILD = """\
[task]
rule = "task"
runtime = ["workloads.py", "oracle.py"]
baseline = "baseline"
framework = "numpy"
entry = {{module = "kernel", function = "softmax"}}
editable = ["kernel.py"]
tolerances = {{float32 = {{atol = 1e-06, rtol = 1e-05}}}}
cases = [{{name = "normal_f32", shape = [16, 128], dtype = "float32", kind = "normal"}}]

[small]
rule = "binding"
task = ":task"
measure.workload = {{name = "bench", shape = [64, 1024], dtype = "float32", kind = "normal"}}
measure.warmups = 1
measure.samples = 3
measure.pairs = {pairs}
measure.probes = 4
measure.metric = "latency"
measure.direction = "minimize"
assess = {{min_improvement = 0.05, confidence = 0.95, bootstrap_resamples = 500, min_pairs = 5}}

[campaign]
rule = "campaign"
binding = ":small"
rounds = {{up_to = {rounds}}}

[other]
rule = "campaign"
binding = ":small"
rounds = {{up_to = {rounds}}}
"""


def rsi(ws: Path, *args: str, events: Path | None = None) -> tuple[dict, float, list[str]]:
    extra = ["--events", str(events)] if events else []
    t0 = time.perf_counter()
    run = subprocess.run(
        [*RSI, *args, "--json", *extra], cwd=ws, capture_output=True, text=True, check=False
    )
    took = time.perf_counter() - t0
    if run.returncode != 0:
        raise SystemExit(f"rsi {' '.join(args)}: exit {run.returncode}\n{run.stdout}{run.stderr}")
    ran = []
    if events:
        for line in events.read_text().splitlines():
            e = json.loads(line)
            if e.get("kind") == "action_finished" and e.get("cache") == "miss":
                ran.append(e.get("mnemonic"))
    return json.loads(run.stdout), took, ran


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--pairs", type=int, default=6)
    args = ap.parse_args()
    os.environ.setdefault("RSI_HOST_LOCK", str(Path(tempfile.gettempdir()) / "rsi-bench.lock"))
    tmp = Path(tempfile.mkdtemp(prefix="rsi-bench-campaign-"))
    try:
        ws = tmp / "ws"
        (ws / "tasks" / "sm" / "baseline").mkdir(parents=True)
        (ws / "rsi.toml").write_text("")
        (ws / "tasks" / "sm" / "BUILD.toml").write_text(
            BUILD.format(pairs=args.pairs, rounds=args.rounds)
        )
        for name in ("oracle.py", "workloads.py"):
            shutil.copy(SOFTMAX / name, ws / "tasks" / "sm" / name)
        (ws / "tasks" / "sm" / "baseline" / "kernel.py").write_text(NAIVE)
        cands = []
        for n in range(args.rounds):
            c = tmp / "cands" / f"c{n}"
            c.mkdir(parents=True)
            (c / "kernel.py").write_text(FAST.format(n=n))
            cands.append(c)
        ev = tmp / "events.jsonl"
        fresh = []
        for c in cands:
            doc, took, ran = rsi(ws, "round", "//tasks/sm:campaign", "--from", str(c), events=ev)
            fresh.append({"round": doc["round"], "s": took, "ran": ran, "verdict": doc["verdict"]})
        _, cached_s, cached_ran = rsi(ws, "round", "//tasks/sm:campaign", "--round", "2", events=ev)
        reused, reused_s, reused_ran = rsi(
            ws, "round", "//tasks/sm:other", "--from", str(cands[1]), events=ev
        )
        regrade, regrade_s, regrade_ran = rsi(
            ws, "campaign", "regrade", "//tasks/sm:campaign", "--min-improvement", "0.5", events=ev
        )
        doc = {
            "rounds": args.rounds,
            "pairs": args.pairs,
            "round_fresh_s": [r["s"] for r in fresh[1:]],  # NB: the first also calibrates
            "round_first_s": fresh[0]["s"],
            "round_cached_s": cached_s,
            "round_cached_ran": cached_ran,
            "round_reused_s": reused_s,
            "round_reused_ran": reused_ran,
            "round_reused": reused["reused"],
            "regrade_s": regrade_s,
            "regrade_wall_s_in_build": regrade["wall_s"],
            "regrade_measure_actions": regrade["measure_actions"],
            "regrade_executed": regrade["executed"],
            "regrade_changed": regrade["n_changed"],
        }
        out = ROOT / "out" / "bench"
        out.mkdir(parents=True, exist_ok=True)
        (out / "campaign.json").write_text(json.dumps(doc, indent=1) + "\n")
        med = sorted(doc["round_fresh_s"])[len(doc["round_fresh_s"]) // 2]
        print(f"round fresh (median of {len(doc['round_fresh_s'])}): {med:.2f} s")
        print(f"round first (with calibration): {doc['round_first_s']:.2f} s")
        print(f"round cached: {cached_s:.2f} s (ran: {cached_ran or 'nothing'})")
        print(f"round reused from another campaign: {reused_s:.2f} s (ran: {reused_ran})")
        print(
            f"regrade of {args.rounds} rounds: {regrade_s:.2f} s wall "
            f"({regrade['wall_s']:.2f} s in the build), {regrade['measure_actions']} measure "
            f"actions, ran {regrade['executed']}, {regrade['n_changed']} verdicts changed"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
