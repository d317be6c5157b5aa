"""Durable jobs: submit latency (`rsi job submit` until it prints the id, median of N) and the
overhead of a job over the same foreground `rsi build` (a fresh salt each, so every action
runs; ratio in the same run). Results: printed, and saved under out/bench/jobs.json.

    .venv/bin/python bench/jobs.py [--n 15] [--actions 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RSI = [sys.executable, "-m", "rsi.cli"]


def workspace(root: Path, actions: int) -> None:
    (root / "rsi.toml").write_text("")
    lines = []
    for i in range(actions):
        dep = f'deps = [":a{i - 1}"]\n' if i else ""
        lines.append(
            f'[a{i}]\nrule = "command"\nouts = ["a{i}.txt"]\n{dep}'
            f'cmd = "sleep 0.2; echo {i} > $(OUT)"\n'
        )
    (root / "BUILD.toml").write_text("\n".join(lines))


def run(ws: Path, *args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*RSI, *args], cwd=ws, env=env, capture_output=True, text=True, check=True
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=15, help="submits (and build/job pairs: n // 3)")
    ap.add_argument("--actions", type=int, default=8)
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rsi-bench-jobs-") as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        workspace(ws, opts.actions)
        env = dict(os.environ, RSI_HOST_LOCK=str(Path(tmp) / "host.lock"))
        last = f"//:a{opts.actions - 1}"
        run(ws, "build", last, env=env)  # NB: warm: store made, analysis cached
        submit_s, ids = [], []
        for i in range(opts.n):
            t0 = time.perf_counter()
            out = run(ws, "job", "submit", "//:a0", "--salt", f"s{i}", "--json", env=env)
            submit_s.append(time.perf_counter() - t0)
            ids.append(json.loads(out.stdout)["id"])
        for job in ids:
            run(ws, "job", "wait", job, env=env)
        fg, bg = [], []
        for i in range(max(3, opts.n // 3)):
            t0 = time.perf_counter()
            run(ws, "build", last, "--salt", f"fg{i}", env=env)
            fg.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            job = json.loads(
                run(ws, "job", "submit", last, "--salt", f"bg{i}", "--json", env=env).stdout
            )["id"]
            run(ws, "job", "wait", job, env=env)
            bg.append(time.perf_counter() - t0)
    doc = {
        "submit_median_s": round(statistics.median(submit_s), 4),
        "submit_max_s": round(max(submit_s), 4),
        "submits": len(submit_s),
        "foreground_build_median_s": round(statistics.median(fg), 4),
        "job_submit_to_done_median_s": round(statistics.median(bg), 4),
        "job_over_build_ratio": round(statistics.median(bg) / statistics.median(fg), 3),
        "actions": opts.actions,
        "pairs": len(fg),
        "load_avg": os.getloadavg()[0],
    }
    out_dir = ROOT / "out" / "bench"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "jobs.json").write_text(json.dumps(doc, indent=2))
    print(
        f"submit latency: median {doc['submit_median_s'] * 1000:.0f} ms "
        f"(max {doc['submit_max_s'] * 1000:.0f} ms, n={doc['submits']})\n"
        f"{opts.actions}-action chain: foreground build {doc['foreground_build_median_s']:.2f} s, "
        f"job submit-to-done {doc['job_submit_to_done_median_s']:.2f} s: "
        f"ratio {doc['job_over_build_ratio']:.2f} (median of {doc['pairs']} pairs, "
        f"load {doc['load_avg']:.2f})"
    )


if __name__ == "__main__":
    main()
