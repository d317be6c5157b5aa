"""rsi beside Nix and Bazel on the peers' fan-in graph, in one run, with peak memory.

Run through bench/peers/run.sh, which copies ../shared/peers to a scratch folder, adds
gen_rsi.py, installs the peers when it can, and calls:

    python compare.py --out DIR --peers-at 1000 --rsi-at 1000,10000,100000

For every (tool, N) it times the peers' scenarios with the peers' own `Tool` adapters (the
same graph, the same edits): startup (`--version`), (a) cold, (b) no-op, (c) one leaf changed,
(d) one leaf touched; rsi also gets `rsi build --help`. Each cell is the median of the timed
runs (one untimed warm-up first) and the peak resident memory of the tool's own process tree
as GNU time reports it (Bazel's server is not a child, so its memory is not in the cell). A
tool that is not installed, or whose set-up fails, gets a row saying so instead of numbers.
Writes DIR/peers.json and DIR/peers.md; with --merge, rows of an earlier run for (tool, N)
not run now are kept, marked with that run's date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path.cwd()  # NB: the copied harness (run.sh cds there), not bench/peers itself
sys.path.insert(0, str(HERE))

from common import CHANGED_LEAF, leaf_input, rm  # noqa: E402

SCENARIOS = ("startup", "help", "cold", "noop", "change1", "touch")
LABELS = {
    "startup": "startup",
    "help": "`build --help`",
    "cold": "(a) cold",
    "noop": "(b) no-op",
    "change1": "(c) 1 leaf changed",
    "touch": "(d) 1 leaf touched",
}


TIME = shutil.which("time") or ("/usr/bin/time" if os.path.exists("/usr/bin/time") else None)


def run_once(tool, cmd: list[str], log: Path, rss: bool = True) -> tuple[float, int, str, int]:
    """(wall seconds, peak RSS in KiB, log text, exit status) of one command. The peak comes
    from GNU time (a small parent: a child forked from this big process would otherwise
    report this process' size); without it, or for start-up cells (time's own fork and exec
    would be in the number), 0."""
    rss_file = log.with_suffix(".rss")
    if rss and TIME:
        cmd = [TIME, "-f", "%M", "-o", str(rss_file), *cmd]
    with open(log, "w") as f:
        t0 = time.perf_counter()
        proc = subprocess.run(
            cmd,
            cwd=tool.ws,
            env=tool.env(),
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        dt = time.perf_counter() - t0
    peak = 0
    if rss and TIME:
        try:
            peak = int(rss_file.read_text().split()[-1])
        except (OSError, ValueError, IndexError):
            peak = 0
    return dt, peak, log.read_text(errors="replace"), proc.returncode


def measure(tool, key, prepare, cmd, runs, budget, logdir: Path, check: bool) -> dict:
    samples, rss, executed = [], [], []
    k, warm_s = 0, None
    last_rss, last_exec = 0, None
    print(f"  [{tool.name} N={tool.n}] {key}: ", end="", flush=True)
    while True:
        if k == 1 and warm_s is not None:
            runs = max(1, min(runs, int(budget // max(warm_s, 1e-3))))
            if warm_s > budget:  # NB: a long warm-up is the only sample
                samples, rss, executed = [warm_s], [last_rss], [last_exec]
                break
        if k >= 1 and len(samples) >= runs:
            break
        if prepare is not None:
            prepare(k)
        dt, peak, log, rc = run_once(tool, cmd, logdir / f"{key}_{k}.log", rss=check)
        if rc != 0:
            raise RuntimeError(f"{cmd} exited {rc}: {log[-1500:]}")
        if check:
            tool.check_root()
        last_rss, last_exec = peak, tool.executed(log) if check else None
        if k == 0:
            warm_s = dt
            print(f"w{dt:.3f} ", end="", flush=True)
        else:
            samples.append(dt)
            rss.append(peak)
            executed.append(last_exec)
            print(f"{dt:.3f} ", end="", flush=True)
        k += 1
    cell = {
        "median_s": statistics.median(samples),
        "min_s": min(samples),
        "max_s": max(samples),
        "n": len(samples),
        "samples": samples,
        "peak_rss_mib": round(max(rss) / 1024, 1),
        "executed": executed,
    }
    print(f"| median {cell['median_s']:.3f}s, {cell['peak_rss_mib']} MiB, ran {executed}")
    return cell


def warm_scenarios(tool, n: int) -> list[tuple]:
    """(key, prepare, command) of the scenarios timed on a built workspace."""
    leaf = tool.ws / "in" / f"leaf_{CHANGED_LEAF(n)}.txt"
    state = {"salt": 0, "mtime": time.time()}

    def change(_k: int) -> None:
        state["salt"] += 1
        leaf.write_text(leaf_input(CHANGED_LEAF(n), f"v{state['salt']}-{time.time_ns()}"))

    def touch(_k: int) -> None:
        state["mtime"] = max(state["mtime"] + 2, time.time())
        os.utime(leaf, (state["mtime"], state["mtime"]))

    return [
        ("noop", None, tool.build_cmd()),
        ("change1", change, tool.build_cmd()),
        ("touch", touch, tool.build_cmd()),
    ]


def measure_interleaved(entries: list, key: str, runs: int) -> dict:
    """Time scenario `key` of several built tools in turns: one untimed warm-up each, then
    `runs` rounds, each running every tool once (the order rotating from round to round), so
    a machine busy with other work slows them alike. `entries` are (row, tool, prepare,
    command, logdir); each row gets its cell, and the rsi row its per-round ratio to each
    peer (`paired`: the median of rsi's time over the peer's in the same round)."""
    samples: dict[str, list] = {e[0]["tool"]: [] for e in entries}
    rss: dict[str, list] = {e[0]["tool"]: [] for e in entries}
    executed: dict[str, list] = {e[0]["tool"]: [] for e in entries}
    print(f"  [interleaved] {key}: ", end="", flush=True)
    for k in range(runs + 1):
        turn = entries[k % len(entries) :] + entries[: k % len(entries)]
        for row, tool, prepare, cmd, logdir in turn:
            if prepare is not None:
                prepare(k)
            dt, peak, log, rc = run_once(tool, cmd, logdir / f"{key}_il{k}.log")
            if rc != 0:
                raise RuntimeError(f"{cmd} exited {rc}: {log[-1500:]}")
            tool.check_root()
            if k == 0:
                continue
            samples[row["tool"]].append(dt)
            rss[row["tool"]].append(peak)
            executed[row["tool"]].append(tool.executed(log))
        print(".", end="", flush=True)
    print()
    for row, *_ in entries:
        name = row["tool"]
        row["cells"][key] = {
            "median_s": statistics.median(samples[name]),
            "min_s": min(samples[name]),
            "max_s": max(samples[name]),
            "n": len(samples[name]),
            "samples": samples[name],
            "peak_rss_mib": round(max(rss[name]) / 1024, 1),
            "executed": executed[name],
            "interleaved": True,
        }
        print(f"    {name}: median {row['cells'][key]['median_s']:.3f}s")
    for rsi_row, *_ in entries:
        if not is_rsi(rsi_row["tool"]):
            continue
        ours = samples[rsi_row["tool"]]
        for row, *_ in entries:
            if not is_rsi(row["tool"]):
                theirs = samples[row["tool"]]
                paired = statistics.median([a / b for a, b in zip(ours, theirs, strict=True)])
                rsi_row.setdefault("paired", {}).setdefault(key, {})[row["tool"]] = paired
    return samples


def is_rsi(tool: str) -> bool:
    """rsi, in process or with its build server (`rsi-server`)."""
    return tool == "rsi" or tool.startswith("rsi-")


def bench_tool(
    cls, n: int, runs: int, budget: float, logroot: Path, warm: bool = True
) -> tuple[dict, object]:
    """The tool's row (and the tool, still set up: the caller shuts it down); with `warm`
    False, only start-up and the cold build are timed here (the caller interleaves the
    rest with the other tools)."""
    tool = cls(n)
    logdir = logroot / f"{tool.name}_{n}"
    rm(logdir)
    logdir.mkdir(parents=True)
    row: dict = {"tool": tool.name, "n": n, "actions": n + n // 10 + 1, "cells": {}}
    row["logdir"] = str(logdir)
    try:
        row["version"] = tool.version()
    except Exception as exc:  # NB: not installed: a row saying so, not a failed run
        row["error"] = f"version: {exc}"
        return row, tool
    t0 = time.time()
    try:
        tool.setup()
    except Exception as exc:
        row["error"] = f"set-up failed: {str(exc)[-500:]}"
        return row, tool
    plan = []
    if tool.startup_cmd():
        plan.append(("startup", None, tool.startup_cmd(), False))
    if hasattr(tool, "help_cmd"):
        plan.append(("help", None, tool.help_cmd(), False))
    plan.append(("cold", lambda k: tool.clean(), tool.build_cmd(), True))
    if warm:
        plan += [(key, prep, cmd, True) for key, prep, cmd in warm_scenarios(tool, n)]
    for key, prep, cmd, check in plan:
        # NB: a cold build is long at large N: one sample (its warm-up) is enough
        r = 1 if key == "cold" and n > 1000 else runs
        try:
            row["cells"][key] = measure(tool, key, prep, cmd, r, budget, logdir, check)
        except Exception as exc:
            print(f"\n  !! {key} failed: {exc}", flush=True)
            row["cells"][key] = {"error": str(exc)[-1500:]}
    row["wall_s"] = round(time.time() - t0, 1)
    return row, tool


def fmt_s(cell: dict | None) -> str:
    if not cell:
        return "—"
    if "error" in cell:
        return "error"
    s = cell["median_s"]
    text = f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s"
    return text + (f" (n={cell['n']})" if cell["n"] < 3 else "")


def per_action_us(row: dict, key: str) -> str:
    cell = row["cells"].get(key)
    if not cell or "error" in cell:
        return "—"
    return f"{cell['median_s'] / row['actions'] * 1e6:.1f}"


def render(doc: dict) -> str:
    lines = [
        "# rsi, Nix and Bazel on the peers' fan-in graph",
        "",
        f"One run of `bench/peers/run.sh`, {doc['date']}, {doc['host']}. Medians of the "
        "timed runs after one warm-up; `(n=…)` marks cells with fewer than 3 samples; where "
        "several tools ran at one N, (b)-(d) were timed in turns (each round runs every tool "
        "once, the order rotating), and a ratio is the median of the per-round ratios. "
        f"Load average: {doc.get('load', '?')}. Graph: "
        "N leaves, N/10 mids, 1 root (N + N/10 + 1 actions); (c) rewrites one leaf's input, "
        "(d) bumps its mtime only.",
        "",
    ]
    by_n: dict[int, list] = {}
    for row in doc["rows"]:
        by_n.setdefault(row["n"], []).append(row)
    for n, rows in sorted(by_n.items()):
        lines += [
            f"## N = {n} ({n + n // 10 + 1} actions)",
            "",
            "| tool | startup | `build --help` | (a) cold | (b) no-op | (c) 1 changed | "
            "(d) 1 touched | peak RSS cold / no-op | µs per action: cold / no-op |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for row in rows:
            if "error" in row:
                lines.append(f"| {row['tool']} | {row['error']} |||||||")
                continue
            if row.get("run"):
                lines.append(f"| *(next row: from the run of {row['run']})* |||||||||")
            c = row["cells"]
            rss = " / ".join(
                f"{c[k]['peak_rss_mib']:.0f} MiB" if k in c and "error" not in c[k] else "—"
                for k in ("cold", "noop")
            )
            lines.append(
                f"| {row['tool']} | {fmt_s(c.get('startup'))} | {fmt_s(c.get('help'))} | "
                f"{fmt_s(c.get('cold'))} | {fmt_s(c.get('noop'))} | {fmt_s(c.get('change1'))} "
                f"| {fmt_s(c.get('touch'))} | {rss} | "
                f"{per_action_us(row, 'cold')} / {per_action_us(row, 'noop')} |"
            )
        ratios = _ratios(rows)
        if ratios:
            lines += ["", 'Targets (issue "Incremental speed"): ' + "; ".join(ratios) + "."]
        lines.append("")
    lines += [
        "Versions: "
        + ", ".join(sorted({f"{r['tool']}: {r.get('version', '?')}" for r in doc["rows"]})),
        "",
        "Peak RSS is GNU time's maximum resident set of the tool's process tree (rsi and "
        "nix-build with their actions); for Bazel only the client, since its server is not a "
        "child of the run.",
        "",
    ]
    return "\n".join(lines)


def _ratios(rows: list) -> list[str]:
    out = []
    for row in rows:
        if is_rsi(row["tool"]) and "error" not in row:
            out += _ratios_of(row["tool"], rows)
    return out


def _ratios_of(name: str, rows: list) -> list[str]:
    get = {r["tool"]: r["cells"] for r in rows if "error" not in r}
    rsi, nix, bazel = get.get(name), get.get("nix"), get.get("bazel")
    out = []

    def med(cells, k):
        c = (cells or {}).get(k)
        return c["median_s"] if c and "error" not in c else None

    paired = next((r.get("paired") or {} for r in rows if r["tool"] == name), {})
    for key, peer, cells, goal in (
        ("noop", "Nix", nix, 0.8),
        ("change1", "Nix", nix, 0.8),
        ("touch", "Nix", nix, 0.8),
        ("noop", "Bazel", bazel, None),
        ("change1", "Bazel", bazel, None),
        ("touch", "Bazel", bazel, None),
        ("cold", "Bazel", bazel, 0.5),
    ):
        a, b = med(rsi, key), med(cells, key)
        if a is None or b is None:
            continue
        # NB: timed in turns, the median of the per-round ratios; otherwise of the medians
        ratio = (paired.get(key) or {}).get(peer.lower(), a / b)
        how = ", per-round median" if peer.lower() in (paired.get(key) or {}) else ""
        if goal is None:
            out.append(f"{LABELS[key]} {name}/{peer} = {ratio:.2f}{how}")
            continue
        ok = "met" if ratio <= goal else "MISSED"
        out.append(f"{LABELS[key]} {name}/{peer} = {ratio:.2f}{how} (goal ≤ {goal}: {ok})")
    for key in ("startup", "help"):
        a = med(rsi, key)
        if a is not None:
            out.append(
                f"{name} {LABELS[key]} {a * 1000:.0f} ms (goal ≤ 30 ms: "
                f"{'met' if a <= 0.030 else 'MISSED'})"
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--peers", default="nix,bazel")
    ap.add_argument("--peers-at", default="1000")
    ap.add_argument("--rsi-at", default="1000,10000,100000")
    ap.add_argument(
        "--rsi-tools",
        default="rsi,rsi-server,rsi-watch",
        help="rsi in process, with its build server (RSI_SERVER=1), and the server watching "
        "the sources (RSI_SERVER_WATCH=1)",
    )
    ap.add_argument("--runs", type=int, default=int(os.environ.get("RUNS", 7)))
    ap.add_argument("--budget", type=float, default=float(os.environ.get("BUDGET", 30)))
    ap.add_argument(
        "--sequential",
        action="store_true",
        default=os.environ.get("SEQUENTIAL") == "1",
        help="time each tool's warm scenarios one tool after the other, not in turns",
    )
    ap.add_argument(
        "--merge",
        action="store_true",
        help="keep the rows of an earlier peers.json in --out for (tool, N) not run now",
    )
    args = ap.parse_args()
    import importlib

    tools: dict = {}
    for name in ("gen_rsi", "gen_nix", "gen_bazel"):
        tools.update(getattr(importlib.import_module(name), "TOOLS", {}))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    logroot = Path(os.environ.get("PEERS_ROOT", "/tmp/peers")) / "logs"
    doc = {
        "schema": "rsi.bench.peers/1",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": f"{os.cpu_count()} CPUs, {platform.platform()}, Python {sys.version.split()[0]}",
        "rows": [],
    }
    load_at_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
    earlier = out / "peers.json"
    merged = json.loads(earlier.read_text()) if args.merge and earlier.exists() else None
    sizes = sorted({int(x) for x in (args.peers_at + "," + args.rsi_at).split(",") if x})
    peers_at = {int(x) for x in args.peers_at.split(",") if x}
    rsi_at = {int(x) for x in args.rsi_at.split(",") if x}
    for n in sizes:
        names = ([t for t in args.rsi_tools.split(",") if t] if n in rsi_at else []) + (
            [p for p in args.peers.split(",") if p] if n in peers_at else []
        )
        # NB: with more than one tool at this N, the scenarios on a built workspace run in
        # turns across the tools (measure_interleaved), not one tool after the other
        interleave = len(names) > 1 and not args.sequential
        built: list = []
        for name in names:
            cls = tools.get(name)
            if cls is None:
                doc["rows"].append({"tool": name, "n": n, "error": "no adapter", "cells": {}})
                continue
            if not is_rsi(name) and shutil.which({"nix": "nix-build"}.get(name, name)) is None:
                doc["rows"].append(
                    {
                        "tool": name,
                        "n": n,
                        "cells": {},
                        "error": f"not installed ({os.environ.get('PEERS_INSTALL_NOTE', 'apt')})",
                    }
                )
                continue
            print(f"== {name} N={n}", flush=True)
            row, tool = bench_tool(cls, n, args.runs, args.budget, logroot, warm=not interleave)
            doc["rows"].append(row)
            if interleave and "error" not in row and "error" not in row["cells"].get("cold", {}):
                built.append((row, tool))
            else:
                tool.shutdown()
                if is_rsi(name) and n >= 10000:
                    rm(cls(n).ws)  # NB: a 100,000-leaf workspace and store are large
            write(out, doc, merged)
        if built:
            print(f"== interleaved, N={n}: {', '.join(r['tool'] for r, _ in built)}", flush=True)
            try:
                for key in ("noop", "change1", "touch"):
                    entries = []
                    for row, tool in built:
                        prep, cmd = next((p, c) for k, p, c in warm_scenarios(tool, n) if k == key)
                        entries.append((row, tool, prep, cmd, Path(row["logdir"])))
                    try:
                        measure_interleaved(entries, key, args.runs)
                    except Exception as exc:
                        print(f"\n  !! {key} failed: {exc}", flush=True)
                        for row, _ in built:
                            row["cells"][key] = {"error": str(exc)[-1500:]}
            finally:
                for row, tool in built:
                    tool.shutdown()
                    if is_rsi(row["tool"]) and n >= 10000:
                        rm(tool.ws)
            write(out, doc, merged)
    doc["load"] = (
        f"{load_at_start} at the start, "
        + " ".join(f"{x:.2f}" for x in os.getloadavg())
        + " at the end (1, 5, 15 min)"
    )
    print(render(write(out, doc, merged)))


def write(out: Path, doc: dict, merged: dict | None) -> dict:
    """Write peers.json and peers.md: this run's rows, and with --merge the earlier run's rows
    for (tool, N) not run (yet) now. Called after every row, so a run cut short never loses
    the earlier rows."""
    whole = dict(doc)
    if merged:
        ran = {(r["tool"], r["n"]) for r in doc["rows"]}
        kept = [
            dict(r, run=r.get("run") or merged.get("date"))
            for r in merged.get("rows", [])
            if (r["tool"], r["n"]) not in ran
        ]
        whole["rows"] = sorted(
            doc["rows"] + kept, key=lambda r: (r["n"], not is_rsi(r["tool"]), r["tool"])
        )
    (out / "peers.json").write_text(json.dumps(whole, indent=1))
    (out / "peers.md").write_text(render(whole))
    return whole


if __name__ == "__main__":
    main()
