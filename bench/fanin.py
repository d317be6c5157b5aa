"""Fan-in graph benchmark: rsi against a bare loop of the same subprocess calls, in one run.

The graph is the one of ../shared/peers (N leaves, N/10 mids of 10 leaves, one root). Scenarios:
cold build, no-op rebuild, one leaf changed, one leaf touched; each as wall seconds of the real
`rsi build //:root` command and as a ratio to the bare loop measured in the same run. Also hashing
a 1 GiB file through rsi.digest against the bare blake3 library.

    python bench/fanin.py [--sizes 100 1000] [--repeat 5] [--hash-gib 1]

The no-op at scale (issue 31): `--noop-at DIR` times `rsi build //:root` no-ops of a workspace
this script wrote and built (`--write N DIR`, then one cold build), each beside the floor no
stat-based tool can beat, measured in the same run: one process that `stat`s every source and
every output blob the no-op checks. Prints seconds, us per action, the ratio to the floor, the
peak RSS (GNU time) and the event log's size.

    python bench/fanin.py --write 100000 /tmp/ws100k   # then: cd /tmp/ws100k && rsi build //:root
    python bench/fanin.py --noop-at /tmp/ws100k --repeat 5 [--served]

One changed leaf of a built workspace beside a no-op, with the re-run actions' own time
(issue 31 point 2), and cold builds beside the same commands run by bare `xargs -P2 sh -c`,
interleaved, with the ratio of each size to the last (point 4). A cold build also reports the
machine's busy CPU-seconds during it and during the floor (/proc/stat): the floor keeps every
core busy, so the CPU the engine spends beyond the commands' own sets how near it can come,
and the budget that 1.2x the floor's wall time leaves it; and how long its start-up and
analysis take before the first command:

    python bench/fanin.py --change-at /tmp/ws100k --repeat 5
    python bench/fanin.py --cold 1000 10000 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RSI = [sys.executable, "-m", "rsi.cli"]


def leaf_cmd(i: int) -> str:
    return f"cat in/leaf_{i}.txt > leaf_{i}.out; echo 'leaf {i}' >> leaf_{i}.out"


def write_workspace(ws: Path, n: int) -> None:
    shutil.rmtree(ws, ignore_errors=True)
    (ws / "in").mkdir(parents=True)
    (ws / "rsi.toml").write_text("[workspace]\njobs = %d\n" % (os.cpu_count() or 1))
    parts = []
    for i in range(n):
        (ws / "in" / f"leaf_{i}.txt").write_text(f"input {i} \n")
        parts.append(
            f'[leaf_{i}]\nrule = "command"\nsrcs = ["in/leaf_{i}.txt"]\n'
            f'outs = ["leaf_{i}.out"]\ncmd = "{leaf_cmd(i)}"\n'
        )
    for j in range(n // 10):
        leaves = [f":leaf_{i}" for i in range(10 * j, 10 * j + 10)]
        files = " ".join(f"leaf_{i}.out" for i in range(10 * j, 10 * j + 10))
        parts.append(
            f'[mid_{j}]\nrule = "command"\ndeps = {json.dumps(leaves)}\n'
            f'outs = ["mid_{j}.out"]\ncmd = "cat {files} > mid_{j}.out"\n'
        )
    mids = [f":mid_{j}" for j in range(n // 10)]
    files = " ".join(f"mid_{j}.out" for j in range(n // 10))
    parts.append(
        f'[root]\nrule = "command"\ndeps = {json.dumps(mids)}\nouts = ["root.out"]\n'
        f'cmd = "cat {files} > root.out"\n'
    )
    (ws / "BUILD.toml").write_text("\n".join(parts))


# NB: deleted files are not removed inside a timed run or just before one. On ext4 without a
# journal (this VM), inodes freed in the last 30 s are skipped, one inode-table lookup each, by
# every file creation that follows, which makes creations up to 25x slower for a while. Old
# trees are renamed into a graveyard instead, emptied once all timings are done; the bare loop
# and rsi are timed on the same footing.
GRAVEYARD: Path | None = None


def bury(path: Path) -> None:
    if path.exists():
        assert GRAVEYARD is not None
        path.rename(GRAVEYARD / f"{path.name}-{time.monotonic_ns()}")


def settle() -> None:
    os.sync()
    time.sleep(0.5)


def bare_loop(ws: Path, n: int) -> float:
    """The same commands, one `subprocess.run` each, in dependency order, no engine."""
    work = Path(tempfile.mkdtemp(prefix="bare-", dir=ws.parent))
    shutil.copytree(ws / "in", work / "in")
    env = {"PATH": "/usr/bin:/bin"}
    settle()
    t0 = time.perf_counter()
    for i in range(n):
        subprocess.run(["/bin/sh", "-c", leaf_cmd(i)], cwd=work, env=env, check=True)
    for j in range(n // 10):
        files = " ".join(f"leaf_{i}.out" for i in range(10 * j, 10 * j + 10))
        subprocess.run(
            ["/bin/sh", "-c", f"cat {files} > mid_{j}.out"], cwd=work, env=env, check=True
        )
    files = " ".join(f"mid_{j}.out" for j in range(n // 10))
    subprocess.run(["/bin/sh", "-c", f"cat {files} > root.out"], cwd=work, env=env, check=True)
    dt = time.perf_counter() - t0
    assert len((work / "root.out").read_text().splitlines()) == 2 * n
    bury(work)
    return dt


def rsi_build(ws: Path, n: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    p = subprocess.run([*RSI, "build", "//:root", "--json"], cwd=ws, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"rsi build failed:\n{p.stdout}\n{p.stderr}")
    executed = json.loads(p.stdout)["counts"]["executed"]
    assert len((ws / "out" / "root.out").read_text().splitlines()) == 2 * n
    return dt, executed


def clean(ws: Path) -> None:
    bury(ws / "cache")
    bury(ws / "out")
    settle()


def bench_size(n: int, repeat: int, base: Path) -> dict:
    ws = base / f"ws_{n}"
    write_workspace(ws, n)
    leaf = ws / "in" / f"leaf_{n // 2}.txt"
    res: dict = {"n": n, "actions": n + n // 10 + 1}
    bare = [bare_loop(ws, n) for _ in range(repeat)]
    res["bare_loop_s"] = statistics.median(bare)
    res["bare_loop_samples_s"] = [round(x, 4) for x in bare]
    cold, noop, change, touch = [], [], [], []
    for _ in range(repeat):
        clean(ws)
        dt, ex = rsi_build(ws, n)
        cold.append(dt)
        assert ex == res["actions"], ex
    time.sleep(1.1)  # NB: lets the stat memo record the inputs (it skips files younger than 1 s)
    rsi_build(ws, n)
    for _ in range(repeat):
        dt, ex = rsi_build(ws, n)
        noop.append(dt)
        assert ex == 0, ex
    for r in range(repeat):
        leaf.write_text(f"input changed {r} {time.time()}\n")
        dt, ex = rsi_build(ws, n)
        change.append(dt)
        assert ex == 3, ex
    time.sleep(1.1)
    rsi_build(ws, n)
    for _ in range(repeat):
        os.utime(leaf)
        dt, ex = rsi_build(ws, n)
        touch.append(dt)
        assert ex == 0, ex
    startup = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run([*RSI, "--version"], capture_output=True, check=True)
        startup.append(time.perf_counter() - t0)
    for name, xs in (
        ("cold", cold),
        ("noop", noop),
        ("change_one", change),
        ("touch_one", touch),
        ("startup", startup),
    ):
        med = statistics.median(xs)
        res[f"{name}_samples_s"] = [round(x, 4) for x in xs]
        res[f"{name}_s"] = med
        res[f"{name}_ratio_to_bare"] = med / res["bare_loop_s"]
    return res


def bench_hash(gib: float, base: Path) -> dict:
    import blake3

    from rsi.digest import digest_file

    path = base / "big.bin"
    size = int(gib * (1 << 30))
    with open(path, "wb") as f:
        chunk = os.urandom(1 << 24)
        for _ in range(size // len(chunk)):
            f.write(chunk)
    bare, ours = [], []
    for _ in range(3):
        t0 = time.perf_counter()
        h = blake3.blake3(max_threads=blake3.blake3.AUTO)
        h.update_mmap(str(path))
        want = h.hexdigest()
        bare.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        got = digest_file(path).hash
        ours.append(time.perf_counter() - t0)
        assert got == want
    path.unlink()
    b, o = min(bare), min(ours)
    return {
        "bytes": size,
        "bare_blake3_gib_s": gib / b,
        "rsi_gib_s": gib / o,
        "rsi_fraction_of_bare": b / o,
    }


FLOOR = """
import os, sys
paths = open(sys.argv[1]).read().split("\\n")
for p in paths:
    os.stat(p)
"""


# NB: the same floor as a bare C loop (one thread): rsi's own check is a C loop over threads
# (rsi/native.py), so it can beat the Python floor above; this says by how much it beats C
FLOOR_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
int main(int argc, char **argv) {
    FILE *f = fopen(argv[1], "r");
    if (!f) return 2;
    char *line = NULL; size_t cap = 0; ssize_t n; struct stat st;
    while ((n = getline(&line, &cap, f)) > 0) {
        if (line[n - 1] == '\n') line[n - 1] = 0;
        stat(line, &st);
    }
    return 0;
}
"""


def _c_floor(where: Path) -> Path | None:
    """The C floor's program, compiled beside the workspace (None: no compiler)."""
    src, exe = where / f".floorc-{os.getpid()}.c", where / f".floorc-{os.getpid()}"
    src.write_text(FLOOR_C)
    try:
        done = subprocess.run(["cc", "-O2", str(src), "-o", str(exe)], capture_output=True)
    except OSError:
        return None
    finally:
        src.unlink()
    return exe if done.returncode == 0 else None


def _timed(cmd: list[str], cwd: Path, env: dict | None = None) -> tuple[float, int, str, float]:
    """(wall seconds, peak RSS KiB from GNU time, stdout, CPU seconds: user + sys of it and its
    children, which a loaded host inflates far less than wall time) of one command."""
    rss = cwd.parent / f".rss-{os.getpid()}"
    t0 = time.perf_counter()
    p = subprocess.run(
        ["/usr/bin/time", "-f", "%U %S %M", "-o", str(rss), *cmd],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env,
    )
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{cmd} failed:\n{p.stdout}\n{p.stderr}")
    user, system, kib = rss.read_text().split()[-3:]
    rss.unlink()
    return dt, int(kib), p.stdout, float(user) + float(system)


# NB: the command people run (the console script): `rsi build TARGET` with no option takes the
# incremental build's own path (rsi/entry.py), and the build server's when RSI_SERVER=1
_SCRIPT = Path(sys.executable).parent / "rsi"
PLAIN = (
    [str(_SCRIPT)]
    if os.access(_SCRIPT, os.X_OK)
    else [*RSI[:1], "-c", "import rsi.entry as e; e.run()"]
)


def bench_noop(ws: Path, repeat: int, served: bool = False, watch: bool = False) -> dict:
    """No-ops of a built workspace, each followed by the stat floor, in one run. `served`:
    through the build server (RSI_SERVER=1; its peak RSS is not the client's, so not shown);
    `watch`: a server that watches the sources' folders (RSI_SERVER_WATCH=1)."""
    env = {**os.environ, "RSI_SERVER": "1" if served else "0"}
    if watch:
        env["RSI_SERVER_WATCH"] = "1"
    sources = sorted(str(p) for p in (ws / "in").iterdir())
    cas = ws / "cache" / "cas"
    blobs = [str(p) for d in cas.iterdir() if d.is_dir() for p in d.iterdir()]
    listing = ws.parent / f".floor-{os.getpid()}"
    listing.write_text("\n".join(sources + blobs))
    noop, floor, floor_c, rss, log_bytes = [], [], [], [], []
    c_floor = _c_floor(ws.parent)
    # NB: bytecode as installed (PYTHONDONTWRITEBYTECODE would compile rsi on every run)
    for tree, flags in ((ROOT / "rsi", ["-q"]), (ROOT / "rules", ["-q", "-x", "/rules/harness/"])):
        subprocess.run([sys.executable, "-m", "compileall", *flags, str(tree)], capture_output=True)
    try:
        for _ in range(3 if served else 1):  # NB: untimed: settles the state (and the server)
            _timed([*PLAIN, "build", "//:root"], ws, env)
        for _ in range(repeat):
            dt, kib, out, _ = _timed([*PLAIN, "build", "//:root"], ws, env)
            m = re.search(r"(\d+) actions: (\d+) cached, (\d+) executed", out)
            assert m is not None and m.group(3) == "0", out
            noop.append(dt)
            rss.append(kib)
            logs = ws / "cache" / "events"
            log_bytes.append(max(logs.iterdir(), key=lambda q: q.stat().st_mtime).stat().st_size)
            floor.append(_timed([sys.executable, "-S", "-c", FLOOR, str(listing)], ws)[0])
            if c_floor is not None:
                floor_c.append(_timed([str(c_floor), str(listing)], ws)[0])
    finally:
        listing.unlink()
        if c_floor is not None:
            c_floor.unlink()
    actions = int(m.group(1))
    n, f = statistics.median(noop), statistics.median(floor)
    return {
        "actions": actions,
        "stat_paths": len(sources) + len(blobs),
        "noop_s": n,
        "noop_us_per_action": 1e6 * n / actions,
        "floor_s": f,
        "ratio_to_floor": n / f,
        "c_floor_s": statistics.median(floor_c) if floor_c else None,
        "ratio_to_c_floor": n / statistics.median(floor_c) if floor_c else None,
        "peak_rss_mib": max(rss) / 1024,
        "event_log_bytes": max(log_bytes),
        "noop_samples_s": [round(x, 4) for x in noop],
        "floor_samples_s": [round(x, 4) for x in floor],
    }


def busy_cpu_s() -> float:
    """CPU-seconds every core of this machine has spent busy since boot (/proc/stat): a run's
    share is the difference across it, sandboxed and detached processes included, which a
    parent's rusage misses."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # NB: idle and iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


CPU_FLOOR: list[float] = []  # NB: the xargs floor's busy CPU-seconds, one per run


def xargs_floor(ws: Path, n: int) -> float:
    """The same commands by bare `xargs -P2 sh -c`, one level at a time (leaves, mids, the
    root), in a fresh copy of the inputs: the floor a cold build is held to (issue 31 point 4)."""
    work = Path(tempfile.mkdtemp(prefix="xargs-", dir=ws.parent))
    shutil.copytree(ws / "in", work / "in")
    levels = [
        [leaf_cmd(i) for i in range(n)],
        [
            "cat "
            + " ".join(f"leaf_{i}.out" for i in range(10 * j, 10 * j + 10))
            + f" > mid_{j}.out"
            for j in range(n // 10)
        ],
        ["cat " + " ".join(f"mid_{j}.out" for j in range(n // 10)) + " > root.out"],
    ]
    env = {"PATH": "/usr/bin:/bin"}
    settle()
    c0 = busy_cpu_s()
    t0 = time.perf_counter()
    for cmds in levels:
        subprocess.run(
            ["xargs", "-0", "-P2", "-n1", "sh", "-c"],
            input="\0".join(cmds).encode(),
            cwd=work,
            env=env,
            check=True,
        )
    dt = time.perf_counter() - t0
    CPU_FLOOR.append(busy_cpu_s() - c0)
    assert len((work / "root.out").read_text().splitlines()) == 2 * n
    bury(work)
    return dt


def first_action_s(ws: Path, t0_epoch: float) -> float:
    """Seconds from the rsi process' start to its first action_started event: its start-up
    and the analysis, before any command runs."""
    log = max((ws / "cache" / "events").iterdir(), key=lambda q: q.stat().st_mtime)
    with open(log) as f:
        for line in f:
            if '"action_started"' in line:
                return json.loads(line)["time"] - t0_epoch
    return float("nan")


def bench_cold(n: int, repeat: int, base: Path, jobs: int = 2) -> dict:
    """Cold builds of `n` leaves (`jobs` jobs, a fresh store each) and the xargs floor, one
    after the other, `repeat` times, in one run; the medians and their ratio."""
    ws = base / f"cold_{n}"
    write_workspace(ws, n)
    (ws / "rsi.toml").write_text("[workspace]\njobs = %d\n" % jobs)
    cold, floor, cpu, first = [], [], [], []
    CPU_FLOOR.clear()
    for _ in range(repeat):
        floor.append(xargs_floor(ws, n))
        clean(ws)
        c0 = busy_cpu_s()
        e0 = time.time()
        t0 = time.perf_counter()
        p = subprocess.run([*PLAIN, "build", "//:root"], cwd=ws, capture_output=True, text=True)
        cold.append(time.perf_counter() - t0)
        cpu.append(busy_cpu_s() - c0)
        if p.returncode != 0:
            raise SystemExit(f"rsi build failed:\n{p.stdout}\n{p.stderr}")
        m = re.search(r"(\d+) actions: (\d+) cached, (\d+) executed", p.stdout)
        assert m is not None and int(m.group(3)) == n + n // 10 + 1, p.stdout
        first.append(first_action_s(ws, e0))
    c, f = statistics.median(cold), statistics.median(floor)
    actions = n + n // 10 + 1
    cores = len(os.sched_getaffinity(0))
    cpu_floor, cpu_rsi = statistics.median(CPU_FLOOR), statistics.median(cpu)
    return {
        "n": n,
        "actions": actions,
        "cold_s": c,
        "xargs_floor_s": f,
        "ratio_to_floor": c / f,
        # NB: the machine's busy CPU-seconds during each (the commands' own, and the engine's:
        # rsi with its sandboxes). With the floor keeping every core busy, 1.2x its wall time
        # leaves the engine at most `engine_cpu_budget_s` beyond the commands' own
        "xargs_cpu_s": cpu_floor,
        "cold_cpu_s": cpu_rsi,
        "engine_cpu_s": cpu_rsi - cpu_floor,
        "engine_cpu_per_action_ms": 1000 * (cpu_rsi - cpu_floor) / actions,
        "engine_cpu_budget_s": 1.2 * f * cores - cpu_floor,
        "start_to_first_action_s": statistics.median(first),
        "cold_samples_s": [round(x, 3) for x in cold],
        "floor_samples_s": [round(x, 3) for x in floor],
    }


def bench_change(ws: Path, repeat: int, served: bool = False, watch: bool = False) -> dict:
    """One changed leaf of a built workspace (the middle one), `repeat` times, each beside a
    no-op of the same workspace, in one run: wall seconds of each and the re-run actions' own
    time (their `wall_s` in the event log). Goal (issue 31 point 2): change <= no-op + 1.2 x
    the re-run actions' own time. Each round also changes the leaf with prepared input trees
    off (RSI_STAGE_TREES=0: the root's inputs copied into a pooled slot), for the comparison.
    `served`, `watch`: through the build server (watching), as `bench_noop`; CPU seconds are
    then the client's only."""
    n = len(list((ws / "in").iterdir()))
    leaf = ws / "in" / f"leaf_{n // 2}.txt"
    env = {**os.environ, "RSI_SERVER": "1" if served or watch else "0"}
    if watch:
        env["RSI_SERVER_WATCH"] = "1"
    if served or watch:
        env["RSI_STAGE_TREES"] = "1"  # NB: as the change sets it: one server for both
    for tree, flags in ((ROOT / "rsi", ["-q"]), (ROOT / "rules", ["-q", "-x", "/rules/harness/"])):
        subprocess.run([sys.executable, "-m", "compileall", *flags, str(tree)], capture_output=True)
    for _ in range(3 if served or watch else 1):  # NB: untimed: settles the state (server)
        _timed([*PLAIN, "build", "//:root"], ws, env)
    names = ("noop", "change", "own", "copy", "copy_own", "noop_cpu", "change_cpu", "copy_cpu")
    rows: dict[str, list[float]] = {k: [] for k in names}

    def change(name: str, tag: str, trees: bool) -> None:
        leaf.write_text(f"input changed {tag} {time.time()}\n")
        time.sleep(1.1)  # NB: past the racy window, as an edit between two builds would be
        e = {**env, "RSI_STAGE_TREES": "1" if trees else "0"}
        dt, _, out, cpu = _timed([*PLAIN, "build", "//:root"], ws, e)
        assert " 3 executed" in out, out
        rows[name].append(dt)
        rows[f"{name}_cpu"].append(cpu)
        logs = ws / "cache" / "events"
        log = max(logs.iterdir(), key=lambda q: q.stat().st_mtime)
        done = [json.loads(x) for x in log.read_text().splitlines() if '"action_finished"' in x]
        rows["own" if trees else "copy_own"].append(sum(d.get("wall_s") or 0.0 for d in done))

    for r in range(repeat):
        time.sleep(1.1)
        dt, _, out, cpu = _timed([*PLAIN, "build", "//:root"], ws, env)
        assert " 0 executed" in out, out
        rows["noop"].append(dt)
        rows["noop_cpu"].append(cpu)
        change("change", f"{r}", True)
        if not (served or watch):  # NB: another environment is another server
            change("copy", f"{r} copied", False)
    med = {k: statistics.median(v) if v else 0.0 for k, v in rows.items()}
    goal = med["noop"] + 1.2 * med["own"]
    return {
        "noop_s": med["noop"],
        "change_one_s": med["change"],
        "rerun_own_s": med["own"],
        "goal_s": goal,
        "change_over_goal": med["change"] / goal,
        "change_one_copied_s": med["copy"],
        "rerun_own_copied_s": med["copy_own"],
        # NB: CPU seconds (rsi and the actions it ran): the same comparison, robust to load
        "noop_cpu_s": med["noop_cpu"],
        "change_one_cpu_s": med["change_cpu"],
        "change_minus_noop_cpu_s": med["change_cpu"] - med["noop_cpu"],
        **{f"{k}_samples_s": [round(x, 4) for x in v] for k, v in rows.items()},
    }


def main() -> None:
    global GRAVEYARD
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--hash-gib", type=float, default=1.0)
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "bench" / "fanin.json")
    ap.add_argument("--write", nargs=2, metavar=("N", "DIR"), help="write a workspace, exit")
    ap.add_argument("--noop-at", type=Path, metavar="DIR", help="no-ops of a built workspace")
    ap.add_argument("--served", action="store_true", help="--noop-at through the build server")
    ap.add_argument("--watch", action="store_true", help="--served, the server watching sources")
    ap.add_argument("--change-at", type=Path, metavar="DIR", help="one changed leaf vs a no-op")
    ap.add_argument("--cold", type=int, nargs="+", metavar="N", help="cold builds vs xargs -P2")
    args = ap.parse_args()
    if args.change_at:
        r = bench_change(args.change_at.resolve(), args.repeat, args.served, args.watch)
        print(
            f"one changed leaf {r['change_one_s']:.3f}s | no-op {r['noop_s']:.3f}s | re-run "
            f"actions' own time {r['rerun_own_s']:.3f}s | goal (no-op + 1.2 x own) "
            f"{r['goal_s']:.3f}s: {r['change_over_goal']:.2f}x the goal | without prepared "
            f"trees {r['change_one_copied_s']:.3f}s (own {r['rerun_own_copied_s']:.3f}s) | CPU: "
            f"no-op {r['noop_cpu_s']:.3f}s, one change {r['change_one_cpu_s']:.3f}s",
            flush=True,
        )
        print(json.dumps(r))
        return
    if args.cold:
        base = Path(tempfile.mkdtemp(prefix="rsi-cold-"))
        GRAVEYARD = base / "graveyard"
        GRAVEYARD.mkdir()
        try:
            rows = [bench_cold(n, args.repeat, base) for n in args.cold]
        finally:
            shutil.rmtree(base, ignore_errors=True)
        for r in rows:
            print(
                f"N={r['n']} ({r['actions']} actions): cold {r['cold_s']:.2f}s | xargs -P2 "
                f"{r['xargs_floor_s']:.2f}s | {r['ratio_to_floor']:.2f}x the floor | busy CPU: "
                f"xargs {r['xargs_cpu_s']:.2f}s, rsi {r['cold_cpu_s']:.2f}s, so the engine "
                f"{r['engine_cpu_s']:.2f}s ({r['engine_cpu_per_action_ms']:.2f} ms/action) against "
                f"the {r['engine_cpu_budget_s']:.2f}s 1.2x leaves it | first action after "
                f"{r['start_to_first_action_s']:.2f}s",
                flush=True,
            )
        for a, b in zip(rows, rows[1:], strict=False):
            print(f"cold N={b['n']} / N={a['n']}: {b['cold_s'] / a['cold_s']:.2f}x")
        print(json.dumps(rows))
        return
    if args.write:
        write_workspace(Path(args.write[1]), int(args.write[0]))
        return
    if args.noop_at:
        served = args.served or args.watch
        r = bench_noop(args.noop_at.resolve(), args.repeat, served, args.watch)
        how = "watched " if args.watch else "served " if served else ""
        print(
            f"{r['actions']} actions: {how}no-op {r['noop_s']:.3f}s "
            f"({r['noop_us_per_action']:.2f} us/action), stat floor {r['floor_s']:.3f}s "
            f"({r['stat_paths']} paths): {r['ratio_to_floor']:.2f}x"
            + (
                f", C floor {r['c_floor_s']:.3f}s: {r['ratio_to_c_floor']:.2f}x"
                if r["c_floor_s"]
                else ""
            )
            + " | peak RSS "
            f"{r['peak_rss_mib']:.0f} MiB | event log {r['event_log_bytes']} bytes",
            flush=True,
        )
        print(json.dumps(r))
        return
    base = Path(tempfile.mkdtemp(prefix="rsi-bench-"))
    GRAVEYARD = base / "graveyard"
    GRAVEYARD.mkdir()
    results = {"sizes": [], "hash": None}
    try:
        for n in args.sizes:
            r = bench_size(n, args.repeat, base)
            results["sizes"].append(r)
            print(
                f"N={n} ({r['actions']} actions): bare loop {r['bare_loop_s']:.2f}s | "
                f"cold {r['cold_s']:.2f}s ({r['cold_ratio_to_bare']:.2f}x) | "
                f"no-op {r['noop_s']:.3f}s | change one {r['change_one_s']:.3f}s | "
                f"touch one {r['touch_one_s']:.3f}s | startup {r['startup_s']:.3f}s",
                flush=True,
            )
        if args.hash_gib > 0:
            h = bench_hash(args.hash_gib, base)
            results["hash"] = h
            print(
                f"hash {args.hash_gib:g} GiB: bare blake3 {h['bare_blake3_gib_s']:.2f} GiB/s, "
                f"rsi {h['rsi_gib_s']:.2f} GiB/s ({100 * h['rsi_fraction_of_bare']:.0f}% of bare)"
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
