"""The campaign dashboard's cost: how long the HTML report of a 50-round campaign takes to build,
and how heavy the page is.

Default: a synthetic 50-round campaign (tests/dashboard_support.py: round documents, verdicts and
a report shaped like the harness's, seeded) rendered by the Dashboard action's own command line
(`python3 -I -B dashboard.py ...`, a fresh process as in the sandbox), plus the in-process
render. `--real N` also runs a real N-round campaign of a tiny softmax binding (every round
judged by the referee: about 3-5 s a round on a 2-core machine) and times `rsi build
<campaign>.dashboard` cold (report and dashboard actions to run) and cached.

    .venv/bin/python bench/dashboard.py [--rounds 50] [--real N]

Prints the figures and saves them to out/bench/dashboard.json.
"""

from __future__ import annotations

import argparse
import gzip
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
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

import dashboard_support as S


def synthetic(rounds: int, repeats: int) -> dict:
    dash = S.harness("dashboard")
    c = S.campaign(rounds, seed=11)
    t0 = time.perf_counter()
    for _ in range(repeats):
        v = dash.view(c["report"], c["docs"], c["verdicts"], c["meta"])
        html = dash.render_html(v)
    in_process = (time.perf_counter() - t0) / repeats
    with tempfile.TemporaryDirectory(prefix="rsi-bench-dashboard-") as tmp:
        d = Path(tmp)
        args = []
        for name in ("report", "meta"):
            (d / f"{name}.json").write_text(json.dumps(c[name]))
            args += [f"--{name}", str(d / f"{name}.json")]
        for doc in c["docs"]:
            n = doc["round"]
            (d / f"r{n}.json").write_text(json.dumps(doc))
            (d / f"v{n}.json").write_text(json.dumps(c["verdicts"][n]))
            args += ["--round", str(d / f"r{n}.json"), "--verdict", str(d / f"v{n}.json")]
        outs = ["--out-html", str(d / "index.html"), "--out-json", str(d / "dashboard.json")]
        outs += ["--out-txt", str(d / "summary.txt")]
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            subprocess.run(
                [sys.executable, "-I", "-B", str(S.HARNESS / "dashboard.py"), *args, *outs],
                check=True,
                cwd=tmp,
            )
            times.append(time.perf_counter() - t0)
        page = (d / "index.html").read_bytes()
        assert page.decode() == html
    return {
        "rounds": rounds,
        "action_process_s_median": round(statistics.median(times), 4),
        "in_process_render_s": round(in_process, 4),
        "page_bytes": len(page),
        "page_gzip_bytes": len(gzip.compress(page, 9)),
        "external_requests": 0,
    }


def real(rounds: int) -> dict:
    """A real campaign of `rounds` rounds, then `rsi build <campaign>.dashboard`."""
    sys.path.insert(0, str(REPO / "tests"))
    import test_dashboard as T

    tmp = Path(tempfile.mkdtemp(prefix="rsi-bench-dashboard-real-"))
    try:
        ws = tmp / "ws"
        ws.mkdir()
        (ws / "rsi.toml").write_text("")
        files = T.workspace_files()
        files["tasks/sm/BUILD.toml"] = files["tasks/sm/BUILD.toml"].replace(
            "rounds = {up_to = 6}", f"rounds = {{up_to = {rounds}}}"
        )
        for rel, text in files.items():
            p = ws / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(text if isinstance(text, bytes) else text.encode())
        env = dict(os.environ, RSI_HOST_LOCK=str(tmp / "host.lock"))
        rsi = [sys.executable, "-m", "rsi.cli"]
        t0 = time.perf_counter()
        for n in range(1, rounds + 1):
            src = ws / "cands" / f"r{n}"
            src.mkdir(parents=True)
            base = T.CANDIDATES["vectorised" if n % 3 else "wrong"]
            (src / "kernel.py").write_text(base + f"\n# variant {n}\n")
            usage = tmp / "usage.json"
            usage.write_text(json.dumps({"tokens": {"input": 1000 * n, "output": 200}, "calls": 1}))
            subprocess.run(
                [*rsi, "round", T.C, "--from", str(src), "--usage", str(usage), "--json"],
                cwd=ws,
                env=env,
                check=True,
                capture_output=True,
            )
        rounds_s = time.perf_counter() - t0

        def build() -> float:
            t = time.perf_counter()
            subprocess.run(
                [*rsi, "build", f"{T.C}.dashboard"],
                cwd=ws,
                env=env,
                check=True,
                capture_output=True,
            )
            return time.perf_counter() - t

        cold, cached = build(), build()
        page = (ws / "out" / "tasks" / "sm" / "campaign.dashboard" / "index.html").read_bytes()
        return {
            "rounds": rounds,
            "judging_all_rounds_s": round(rounds_s, 1),
            "rsi_build_dashboard_cold_s": round(cold, 3),
            "rsi_build_dashboard_cached_s": round(cached, 3),
            "page_bytes": len(page),
            "page_gzip_bytes": len(gzip.compress(page, 9)),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--real", type=int, default=0, metavar="N")
    args = ap.parse_args()
    out = {"synthetic": synthetic(args.rounds, args.repeats)}
    print(f"synthetic {args.rounds}-round campaign:")
    for k, v in out["synthetic"].items():
        print(f"  {k}: {v}")
    if args.real:
        out["real"] = real(args.real)
        print(f"real {args.real}-round campaign:")
        for k, v in out["real"].items():
            print(f"  {k}: {v}")
    dest = REPO / "out" / "bench" / "dashboard.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"saved {dest.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
