"""Fault matrix: inject one fault at a time into a real temporary workspace, driven through the
real `rsi` CLI (subprocesses), and record what happened and what remained afterwards.

Each scenario is one function registered with `@scenario`; it builds a small workspace under a
fresh temporary folder, injects its fault, checks the outcome and returns a `Row`. Faults that
need the inside of rsi (a copy stopped halfway, a full disk on write) are injected by starting
the same CLI through a two-line launcher that patches one function. Every file is small (the
largest is 1.5 MB), and every folder and mount is removed afterwards.

    python bench/fault_matrix.py [--only NAME ...] [--list]

Prints a Markdown table (fault, what happened, what remained, held) and writes
out/bench/fault_matrix.json. Exit status 1 when a scenario did not hold.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").is_dir() else sys.executable
RSI = [PYTHON, "-m", "rsi.cli"]
OUT = ROOT / "out" / "bench" / "fault_matrix.json"


@dataclass
class Row:
    fault: str
    happened: str
    remained: str
    held: bool
    details: dict = field(default_factory=dict)


SCENARIOS: list[Callable[[Path], Row]] = []


def scenario(fn: Callable[[Path], Row]) -> Callable[[Path], Row]:
    """Register a scenario: `fn(tmp) -> Row`, `tmp` a fresh folder removed afterwards."""
    SCENARIOS.append(fn)
    return fn


# ------------------------------------------------------------------------------------ helpers


def command(name: str, cmd: str, outs: list[str], **extra) -> str:
    lines = [
        f"[{name}]",
        'rule = "command"',
        f"outs = {json.dumps(outs)}",
        f"cmd = {json.dumps(cmd)}",
    ]
    lines += [f"{k} = {json.dumps(v)}" for k, v in extra.items()]
    return "\n".join(lines) + "\n\n"


def workspace(tmp: Path, name: str, build: str, config: str = "", files=None) -> Path:
    ws = tmp / name
    ws.mkdir(parents=True)
    (ws / "rsi.toml").write_text(config)
    (ws / "BUILD.toml").write_text(build)
    for rel, text in (files or {}).items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)
    return ws


@dataclass
class Run:
    rc: int
    stdout: str
    stderr: str

    @property
    def traceback(self) -> bool:
        return "Traceback" in self.stderr

    def json(self) -> dict:
        return json.loads(self.stdout)

    def error(self) -> str:
        """The first line of rsi's error message."""
        for line in self.stderr.splitlines():
            if line.startswith("rsi: error:"):
                return line[len("rsi: error: ") :]
        return self.stderr.strip().splitlines()[-1] if self.stderr.strip() else ""


def rsi(ws: Path, *args: str, launcher: str | None = None, env=None, timeout: float = 120) -> Run:
    argv = [PYTHON, "-c", launcher, *args] if launcher else [*RSI, *args]
    proc = subprocess.run(
        argv,
        cwd=ws,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    return Run(proc.returncode, proc.stdout, proc.stderr)


def build_events(ws: Path, *targets: str) -> tuple[Run, list[dict]]:
    events = ws.parent / f"events-{time.monotonic_ns()}.jsonl"
    run = rsi(ws, "build", "--events", str(events), "--events-hits", *targets)
    found = [json.loads(x) for x in events.read_text().splitlines()] if events.exists() else []
    events.unlink(missing_ok=True)
    return run, found


def ran(events: list[dict]) -> set[str]:
    return {
        e["label"]
        for e in events
        if e["kind"] == "action_finished" and e.get("cache") == "miss" and e["status"] == "ok"
    }


def cached(events: list[dict]) -> set[str]:
    return {e["label"] for e in events if e["kind"] == "action_finished" and e["cache"] == "hit"}


def key_of(events: list[dict], label: str) -> str:
    return next(e["key"] for e in events if e["kind"] == "action_finished" and e["label"] == label)


def tree(root: Path) -> dict[str, tuple[bytes, float]]:
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def verify(ws: Path) -> str:
    v = rsi(ws, "cache", "verify", "--json")
    if v.traceback or v.rc not in (0, 1):
        return f"cache verify crashed (exit {v.rc})"
    doc = v.json()
    return "verify clean" if doc["clean"] else f"verify found corruption: {doc}"


def launcher(patch: str) -> str:
    """A `python -c` program: `patch`, then the real CLI with the remaining arguments."""
    return (
        textwrap.dedent(patch)
        + '\nimport runpy, sys\nsys.argv = ["rsi", *sys.argv[1:]]\n'
        + 'runpy.run_module("rsi.cli", run_name="__main__")\n'
    )


# NB: a large file's copy into the store stops halfway and waits to be killed
STALLED_COPY = launcher(
    """
    import os, shutil, time
    real_copyfile = shutil.copyfile
    def stalled_copyfile(src, dst, *args, **kw):
        if os.path.basename(dst).startswith(".tmp-") and os.path.getsize(src) > (1 << 20):
            with open(src, "rb") as f, open(dst, "wb") as g:
                g.write(f.read(1 << 19))
            with open(os.environ["FAULT_MARKER"], "w") as m:
                m.write(dst)
            time.sleep(120)
        return real_copyfile(src, dst, *args, **kw)
    shutil.copyfile = stalled_copyfile
    """
)

# NB: every fsync fails as on a full disk (gc's writes fsync; its removals need no space)
NO_SPACE = launcher(
    """
    import errno, os
    def no_space(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    os.fsync = no_space
    """
)


# ---------------------------------------------------------------------------------- scenarios


@scenario
def kill_9_during_large_copy(tmp: Path) -> Row:
    ws = workspace(
        tmp,
        "ws",
        command("big", "head -c 1500000 /dev/zero > $(OUT)", ["big.bin"])
        + command("small", "echo small > $(OUT)", ["small.txt"]),
    )
    rsi(ws, "build", "//:small")
    marker = tmp / "copying"
    proc = subprocess.Popen(
        [PYTHON, "-c", STALLED_COPY, "build", "//:big"],
        cwd=ws,
        env={**os.environ, "FAULT_MARKER": str(marker)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    if not marker.exists():
        return Row(
            "kill -9 while a 1.5 MB output is copied into the CAS",
            "the copy never happened on this host (outputs moved, not copied)",
            "-",
            True,
        )
    temporary = Path(marker.read_text())
    where = temporary.parent.relative_to(ws / "cache")
    readers = {a: rsi(ws, "cache", a, "--json") for a in ("stats", "ls")}
    crashed = [a for a, r in readers.items() if r.rc != 0 or r.traceback]
    gc = rsi(ws, "cache", "gc", "--json")
    removed = gc.rc == 0 and str(temporary) in gc.json().get("removed_temporaries", [])
    state = verify(ws)
    again, events = build_events(ws, "//:big")
    rebuilt = again.rc == 0 and ran(events) == {"//:big"}
    right = (ws / "out" / "big.bin").read_bytes() == b"\0" * 1500000
    held = not crashed and removed and state == "verify clean" and rebuilt and right
    return Row(
        "kill -9 while a 1.5 MB output is copied into the CAS",
        f"half-copied temporary left in {where}/; cache stats/ls "
        + ("crashed: " + ", ".join(crashed) if crashed else "exit 0")
        + f"; cache gc {'removed it' if removed else f'did not remove it (exit {gc.rc})'}",
        f"{state}; {'the temporary remains' if temporary.exists() else 'no temporary'}; rebuild "
        + ("ran //:big, output right" if rebuilt and right else "FAILED"),
        held,
        {"temporary": str(temporary), "gc": gc.stdout[-2000:] + gc.stderr[-2000:]},
    )


@scenario
def swapped_ac_entries(tmp: Path) -> Row:
    ws = workspace(
        tmp,
        "ws",
        command("a", "echo alpha > $(OUT)", ["a.txt"])
        + command("b", "echo beta > $(OUT)", ["b.txt"]),
    )
    _, events = build_events(ws, "//...")
    ka, kb = (key_of(events, lb).split("/")[0] for lb in ("//:a", "//:b"))
    pa, pb = (ws / "cache" / "ac" / k[:2] / k for k in (ka, kb))
    a, b = pa.read_bytes(), pb.read_bytes()

    def swap() -> None:
        pa.write_bytes(b)
        pb.write_bytes(a)

    swap()
    v = rsi(ws, "cache", "verify", "--json")
    reported = v.rc == 1 and sorted(v.json()["corrupt_actions"]) == sorted([ka, kb])
    swap()
    shutil.rmtree(ws / "out")
    again, events = build_events(ws, "//...")
    outs = {
        n: (ws / "out" / n).read_text() for n in ("a.txt", "b.txt") if (ws / "out" / n).exists()
    }
    right = outs == {"a.txt": "alpha\n", "b.txt": "beta\n"}
    rerun = ran(events) == {"//:a", "//:b"}
    held = reported and again.rc == 0 and rerun and right
    return Row(
        "two action-cache entries' files swapped",
        ("cache verify reported both (exit 1)" if reported else f"verify missed it (exit {v.rc})")
        + "; the build "
        + ("served neither, reran both" if rerun else f"SERVED {sorted(cached(events))}"),
        f"out/ {'right' if right else f'WRONG: {outs}'}; {verify(ws)}",
        held,
    )


@scenario
def corrupted_blob(tmp: Path) -> Row:
    ws = workspace(
        tmp,
        "ws",
        command("gen", "tr a-z A-Z < $(SRCS) > $(OUT)", ["gen.txt"], srcs=["in.txt"])
        + command(
            "use", "cat $(location :gen) $(location :gen) > $(OUT)", ["use.txt"], deps=[":gen"]
        ),
        files={"in.txt": "input\n"},
    )
    rsi(ws, "build", "//:use")
    blob = next(p for p in (ws / "cache" / "cas").glob("*/*") if p.read_bytes() == b"INPUT\n")
    os.chmod(blob, 0o644)
    blob.write_bytes(b"EVIL!\n")
    (ws / "out" / "use.txt").unlink()
    again, events = build_events(ws, "//:use")
    right = (ws / "out" / "use.txt").read_text() == "INPUT\nINPUT\n"
    held = again.rc == 0 and "//:gen" in ran(events) and right and blob.read_bytes() == b"INPUT\n"
    return Row(
        "an output blob altered in the CAS (same size)",
        f"the build {'rebuilt //:gen' if '//:gen' in ran(events) else 'did not rebuild //:gen'}, "
        f"exit {again.rc}",
        f"out/ {'right' if right else 'WRONG'}; blob restored; {verify(ws)}",
        held,
    )


@scenario
def store_is_the_workspace_root(tmp: Path) -> Row:
    ws = workspace(
        tmp, "ws", command("a", "echo a > $(OUT)", ["a.txt"]), config='[workspace]\nstore = "."\n'
    )
    (ws / "tmp").mkdir()
    (ws / "tmp" / "scratch-999999-notes.txt").write_text("my notes\n")
    old = ws / "tmp" / "draft.txt"
    old.write_text("an old draft\n")
    os.utime(old, (time.time() - 3 * 86400,) * 2)
    before = tree(ws)
    runs = {" ".join(args): rsi(ws, *args) for args in (("build", "//:a"), ("cache", "gc"))}
    lost = sorted(set(before) - set(tree(ws)))
    changed = tree(ws) != before
    held = all(r.rc == 2 and not r.traceback for r in runs.values()) and not changed
    return Row(
        'store = "." (the workspace root) with files in tmp/',
        "; ".join(f"rsi {n}: exit {r.rc}" for n, r in runs.items())
        + f': "...{runs["build //:a"].error().split(" cannot be used")[-1][:150]}"',
        "every file untouched" if not changed else f"LOST {lost}" if lost else "files changed",
        held,
        {"stderr": runs["build //:a"].stderr},
    )


@scenario
def two_workspaces_share_a_store(tmp: Path) -> Row:
    config = f'[workspace]\nstore = "{tmp / "shared"}"\n'
    rule = command("up", "tr a-z A-Z < $(SRCS) > $(OUT)", ["up.txt"], srcs=["in.txt"])
    one = workspace(tmp, "one", rule, config, {"in.txt": "first\n"})
    two = workspace(
        tmp,
        "two",
        rule + command("y", "echo y > $(OUT)", ["y.txt"]),
        config,
        {"in.txt": "second\n"},
    )
    rsi(one, "build", "//...")
    rsi(two, "build", "//...")
    gc = rsi(one, "cache", "gc", "--json")
    removed = len(gc.json()["removed_actions"]) if gc.rc == 0 else None
    again, events = build_events(two, "//...")
    kept = again.rc == 0 and cached(events) == {"//:up", "//:y"}
    shutil.rmtree(two)
    gone = rsi(one, "cache", "gc")
    dropped = gone.rc == 0 and f"dropped the gc roots of workspace {two}" in gone.stdout
    _, mine = build_events(one, "//...")
    held = removed == 0 and kept and dropped and cached(mine) == {"//:up"}
    return Row(
        "`cache gc` in one of two workspaces sharing a store (same labels, other sources)",
        f"gc removed {removed} results; the other workspace's rebuild was "
        + ("fully cached" if kept else f"NOT cached: ran {sorted(ran(events))}")
        + "; after deleting that workspace, gc "
        + ("dropped its roots and said so" if dropped else "did not drop its roots"),
        f"this workspace still fully cached; {verify(one)}",
        held,
        {"gc": gone.stdout},
    )


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir()
    got = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    return got.returncode == 0


def _fill(folder: Path) -> None:
    with open(folder / "filler", "wb", buffering=0) as f:
        for size in (1 << 16, 4096, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                pass


@scenario
def gc_on_a_full_disk(tmp: Path) -> Row:
    two = command("a", "echo alpha > $(OUT)", ["a.txt"]) + command(
        "b", "echo beta > $(OUT)", ["b.txt"]
    )
    mnt = tmp / "tmpfs"
    if not _mount_tmpfs(mnt, "2m"):
        return Row(
            "`cache gc` on a full disk (2 MiB tmpfs)", "skipped: cannot mount a tmpfs", "-", True
        )
    try:
        store = mnt / "store"
        ws = workspace(tmp, "ws", two, f'[workspace]\nstore = "{store}"\n')
        rsi(ws, "build", "//...")
        _fill(mnt)
        nothing = rsi(ws, "cache", "gc")
        (ws / "BUILD.toml").write_text(two[: two.index("[b]")])
        some = rsi(ws, "cache", "gc", "--json")
        state = verify(ws)
        (mnt / "filler").unlink()
        _, events = build_events(ws, "//:a")
        held = (
            nothing.rc == 0
            and not nothing.traceback
            and some.rc in (0, 1)
            and not some.traceback
            and state == "verify clean"
            and cached(events) == {"//:a"}
        )
        what = f"exit {some.rc}" + (f': "{some.error()[:120]}"' if some.rc else ", freed space")
        return Row(
            "`cache gc` on a full disk (2 MiB tmpfs, filled)",
            f"nothing to remove: exit {nothing.rc}; one target dropped: {what}; no traceback"
            if not (nothing.traceback or some.traceback)
            else "TRACEBACK",
            f"{state}; the kept target still cached",
            held,
        )
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@scenario
def gc_cannot_write_for_no_space(tmp: Path) -> Row:
    two = command("a", "echo alpha > $(OUT)", ["a.txt"]) + command(
        "b", "echo beta > $(OUT)", ["b.txt"]
    )
    ws = workspace(tmp, "ws", two)
    _, events = build_events(ws, "//...")
    kb = key_of(events, "//:b").split("/")[0]
    (ws / "BUILD.toml").write_text(two[: two.index("[b]")])
    run = rsi(ws, "cache", "gc", launcher=NO_SPACE)
    state = verify(ws)
    _, again = build_events(ws, "//:a")
    finish = rsi(ws, "cache", "gc", "--json")
    held = (
        run.rc == 1
        and not run.traceback
        and "No space left on device" in run.stderr
        and not (ws / "cache" / "ac" / kb[:2] / kb).exists()
        and state == "verify clean"
        and cached(again) == {"//:a"}
        and finish.rc == 0
    )
    return Row(
        "`cache gc` whose index rewrite hits ENOSPC (injected)",
        f"exit {run.rc}, {'a TRACEBACK' if run.traceback else 'no traceback'}: "
        f'"{run.error()[:150]}..."',
        f"the unreachable result removed, the kept one cached; {state}; the next gc finishes",
        held,
        {"stderr": run.stderr},
    )


# --------------------------------------------------------------------------------------- main


def _finished(events: list[dict], label: str) -> dict:
    return next((e for e in events if e["kind"] == "action_finished" and e["label"] == label), {})


def _shm_entries() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


@scenario
def action_overfills_its_scratch(tmp: Path) -> Row:
    build = command("hog", "head -c 41943040 /dev/zero > big.bin; echo done > $(OUT)", ["h.txt"])
    build += command("fine", "echo ok > $(OUT)", ["f.txt"])
    ws = workspace(tmp, "ws", build, '[workspace]\nstore = "store"\n[limits]\nscratch_mb = 16\n')
    shm_before = _shm_entries()
    run, events = build_events(ws, "//:hog")
    hog = _finished(events, "//:hog")
    again, events2 = build_events(ws, "//:fine")
    leftover = sorted(_shm_entries() - shm_before)
    held = (
        run.rc == 1
        and hog.get("reason") == "scratch_limit"
        and not run.traceback
        and again.rc == 0
        and not leftover
    )
    return Row(
        "an action writes 40 MiB with a 16 MiB scratch limit",
        f"rsi build exit {run.rc}; the action failed with reason {hog.get('reason')!r}: "
        f"{(hog.get('message') or '')[:120]}",
        f"the next action built (exit {again.rc}); new entries in /dev/shm: {leftover or 'none'}",
        held,
    )


@scenario
def action_exceeds_its_memory(tmp: Path) -> Row:
    cmd = (
        "python3 -c 'b = bytearray(150 << 20); b[::4096] = b\"x\" * len(b[::4096])'; "
        "echo done > $(OUT)"
    )
    ws = workspace(
        tmp,
        "ws",
        command("hog", cmd, ["h.txt"]),
        '[workspace]\nstore = "store"\n[limits]\nmemory_mb = 48\n',
    )
    info = rsi(ws, "info", "--json")
    run, events = build_events(ws, "//:hog")
    hog = _finished(events, "//:hog")
    alive = rsi(ws, "cache", "verify", "--json")
    enforced = (info.json().get("limits") or {}) if info.rc == 0 else {}
    held = run.rc == 1 and hog.get("reason") == "memory_limit" and alive.rc == 0
    return Row(
        "an action allocates 150 MiB with a 48 MiB memory limit",
        f"rsi build exit {run.rc}; the action failed with reason {hog.get('reason')!r}",
        f"rsi and the store fine (verify exit {alive.rc}); limits as rsi info reports them: "
        f"{json.dumps(enforced)[:160]}",
        held,
    )


@scenario
def sigint_during_a_build(tmp: Path) -> Row:
    marker = f"rsi-fault-sleep-{os.getpid()}"
    ws = workspace(
        tmp,
        "ws",
        command("slow", f"sleep 60 # {marker}\necho > $(OUT)", ["s.txt"]),
        '[workspace]\nstore = "store"\n',
    )
    events_path = tmp / "events.jsonl"
    proc = subprocess.Popen(
        [*RSI, "build", "--events", str(events_path), "//:slow"],
        cwd=ws,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = events_path.read_text() if events_path.exists() else ""
        if '"action_started"' in text:
            break
        time.sleep(0.1)
    time.sleep(0.5)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        rc = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = None
    took = time.monotonic() - t0
    events = [json.loads(x) for x in events_path.read_text().splitlines() if x.strip()]
    last = events[-1] if events else {}
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    held = (
        rc == 130
        and last.get("kind") == "build_finished"
        and last.get("reason") == "interrupted"
        and not left
    )
    return Row(
        "SIGINT while a build runs a 60 s action",
        f"rsi exited {rc} {took:.1f} s after the signal; last event {last.get('kind')} "
        f"(reason {last.get('reason')!r}, signal {last.get('signal')!r})",
        f"processes of the action left: {len(left)}",
        held,
    )


@scenario
def waiting_on_the_host_lock(tmp: Path) -> Row:
    lock = tmp / "host.lock"
    env = {"RSI_HOST_LOCK": str(lock)}
    hold = workspace(
        tmp,
        "hold",
        command("hold", "sleep 20; echo > $(OUT)", ["h.txt"], tags=["exclusive"]),
        '[workspace]\nstore = "s"\n',
    )
    wait = workspace(
        tmp,
        "wait",
        command("timed", "echo > $(OUT)", ["t.txt"], tags=["exclusive"]),
        '[workspace]\nstore = "s"\n',
    )
    holder = subprocess.Popen(
        [*RSI, "build", "//:hold"],
        cwd=hold,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (lock.parent / "host.lock.holders").exists():
            time.sleep(0.1)
        time.sleep(0.5)
        events_path = tmp / "events.jsonl"
        t0 = time.monotonic()
        run = rsi(
            wait, "build", "--lock-timeout", "2", "--events", str(events_path), "//:timed", env=env
        )
        took = time.monotonic() - t0
        events = [json.loads(x) for x in events_path.read_text().splitlines() if x.strip()]
    finally:
        holder.kill()
        holder.wait()
    waits = [e for e in events if e["kind"] == "host_lock_wait"]
    holders = waits[0]["holders"] if waits else []
    named = any(h.get("label") == "//:hold" for h in holders)
    held = run.rc == 1 and bool(waits) and named and took < 15
    return Row(
        "a timing action waits for the host lock held by another build (--lock-timeout 2)",
        f"exit {run.rc} after {took:.1f} s; host_lock_wait named holders "
        f"{[(h.get('pid'), h.get('label')) for h in holders]}",
        "the holding build unaffected; nothing waited silently",
        held,
    )


def table(rows: list[Row]) -> str:
    lines = ["| fault | what happened | what remained | held |", "|---|---|---|---|"]
    for r in rows:
        cells = [r.fault, r.happened, r.remained, "yes" if r.held else "**NO**"]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="run only these scenarios (by function name)")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    args = parser.parse_args()
    if args.list:
        print("\n".join(fn.__name__ for fn in SCENARIOS))
        return 0
    chosen = [fn for fn in SCENARIOS if not args.only or fn.__name__ in args.only]
    rows: list[Row] = []
    base = Path(tempfile.mkdtemp(prefix="rsi-fault-matrix-"))
    # NB: a private host lock, so the matrix never waits on (or blocks) another rsi build
    os.environ.setdefault("RSI_HOST_LOCK", str(base / "host.lock"))
    try:
        for fn in chosen:
            tmp = base / fn.__name__
            tmp.mkdir()
            t0 = time.perf_counter()
            try:
                row = fn(tmp)
            except Exception as exc:  # NB: a scenario that breaks is a row, not the end
                row = Row(
                    fn.__name__,
                    f"the scenario itself failed: {exc!r}",
                    "-",
                    False,
                    {"traceback": traceback.format_exc()},
                )
            for name in ("fault", "happened", "remained"):  # NB: shorter, and the same each run
                setattr(row, name, getattr(row, name).replace(str(tmp), "<tmp>"))
            row.details["scenario"] = fn.__name__
            row.details["wall_s"] = round(time.perf_counter() - t0, 2)
            rows.append(row)
            print(f"{fn.__name__}: {'held' if row.held else 'DID NOT HOLD'}", file=sys.stderr)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(table(rows))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps(
            {
                "schema": "rsi.bench.fault_matrix/1",
                "time": time.time(),
                "host": platform.node(),
                "rows": [asdict(r) for r in rows],
            },
            indent=2,
        )
    )
    print(f"\nwritten {OUT.relative_to(ROOT)}", file=sys.stderr)
    return 0 if all(r.held for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
