"""Model checker for "never a stale result": random sequences of source and BUILD.toml changes
(edits, same-size rewrites with the mtime put back, touches, renames, reused inodes, deletions,
targets added and removed) and builds (in process, served, watched, jobs, a second Python
environment, two at once, killed, a server killed), each checked against an oracle: every
requested output under out/, and every artifact a build reported, must equal what a clean
build of the sources on disk produces (bench/model_check_ws.py computes it in Python and, every
`--crosscheck-every` steps, a clean `rsi build` in a fresh store confirms it).

    .venv/bin/python bench/model_check.py --sequences 1000 --seed 1 [--minutes 60]
        [--modes plain,served,watch,job,env2,concurrent,overtake,race,kill,serverkill,jobkill]

Prints a summary and writes out/bench/model_check.json (sequences, steps, builds per mode,
differences with seed, step and the sequence of operations, time). Exit 1 on a difference.
Everything lives under one temporary folder, deleted at the end, with a private host lock;
every process a sequence starts carries its tag and is killed when the sequence ends."""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from model_check_run import RSI, SINGLE_MODES, Builds, Outcome, second_env
from model_check_ws import (
    PATTERNS,
    compare,
    digest,
    edit_build,
    edit_source,
    generate,
    oracle,
    requested,
    unmount_all,
)

ROOT = Path(__file__).resolve().parent.parent
LATE_S = 0.05  # see Sequence.late_reports
STEP_KINDS = ("concurrent", "overtake", "race", "kill", "serverkill", "jobkill")
ALL_MODES = (*SINGLE_MODES, *STEP_KINDS)
SOURCE_OPS = {
    **{"edit": 3, "same_size": 3, "touch": 2, "rename": 2, "reuse_inode": 2},
    **{"swap": 1, "replace_dir": 1, "revert": 2, "hardlink": 1},
}
BUILD_OPS = {"filter": 2, "retag_same_size": 3, "add_target": 1, "remove_target": 1, "srcs": 1}


class Sequence:
    """One seeded sequence: a fresh workspace and store, its steps, and what they found."""

    def __init__(
        self,
        seed: int,
        modes: list[str],
        root: Path,
        env2: Path | None,
        plant: str,
        every: int,
        mounts: bool = True,
        rsi: str = RSI,
    ) -> None:
        self.seed = seed
        self.crosscheck_every = every
        self.rng = random.Random(seed)
        self.modes = modes
        self.single = [m for m in modes if m in SINGLE_MODES] or ["plain"]
        self.kinds = ["single"] + [k for k in STEP_KINDS if k in modes]
        if not {"served", "watch"} & set(self.single) and "serverkill" in self.kinds:
            self.kinds.remove("serverkill")
        self.dir = root / f"seq-{seed}"
        self.ws = self.dir / "ws"
        self.ws.mkdir(parents=True)
        self.plant = plant
        self.mounts = mounts and os.geteuid() == 0  # NB: bind mounts need root
        self.model = generate(self.ws, self.rng)
        tag = f"{os.getpid()}-{seed}-{uuid.uuid4().hex[:8]}"
        self.builds = Builds(self.ws, tag, root / "host.lock", env2, rsi)
        self.log: list[str] = []
        self.differences: list[dict] = []
        self.failures: list[dict] = []
        self.oracle_disagreements: list[dict] = []
        self.by_mode: dict[str, int] = {}
        self.previous_out: dict[str, bytes] = {}
        self.crosschecks = 0
        self.changes: dict[str, int] = {}
        self.holes: list[dict] = []  # differences the documented watch hole explains
        self.late: list[float] = []  # seconds between a change and a stale ok reported after it

    # ------------------------------------------------------------------------- changes
    def change(self) -> str:
        rng = self.rng
        if self.model.deleted and rng.random() < 0.6:
            what = edit_source(self.ws, self.model, rng, "recreate")
        elif self.model.mounts and rng.random() < 0.3:
            what = edit_source(self.ws, self.model, rng, "unmount")
        elif rng.random() < 0.7:
            ops = dict(SOURCE_OPS, **({} if self.model.deleted else {"delete": 1}))
            if self.mounts:
                ops.update(bind_file=1, bind_dir=1)
            kind = rng.choices(list(ops), weights=list(ops.values()))[0]
            what = edit_source(self.ws, self.model, rng, kind)
        else:
            kind = rng.choices(list(BUILD_OPS), weights=list(BUILD_OPS.values()))[0]
            what = edit_build(self.ws, self.model, rng, kind)
        self.log.append(f"change: {what}")
        name = what.split(" (")[0].split(" ")[0] if what != "noop" else "noop"
        if "inode reused: True" in what:
            name = "reuse-inode(reused)"
        self.changes[name] = self.changes.get(name, 0) + 1
        return what

    def pattern(self) -> str:
        return PATTERNS[0] if self.rng.random() < 0.6 else self.rng.choice(PATTERNS)

    def expected(self, pattern: str) -> dict[str, bytes] | None:
        return oracle(self.ws, requested(self.ws, pattern))

    # -------------------------------------------------------------------------- checks
    def _difference(self, step: int, kind: str, detail: list[str], outcome: Outcome) -> None:
        # NB: a change through a hard link made after the watch's last check is the hole
        # docs/architecture.md names for RSI_SERVER_WATCH=1: counted apart, not hidden
        hole = outcome.mode == "watch" and self.model.linked
        (self.holes if hole else self.differences).append(
            {
                "seed": self.seed,
                "step": step,
                "kind": kind,
                "mode": outcome.mode,
                "detail": detail[:8],
                "sequence": list(self.log),
                "stderr": outcome.stderr[-600:],
            }
        )

    def check(self, step: int, got: Outcome, want: dict[str, bytes] | None, kind: str) -> None:
        """A build that exited 0 must have left, and reported, exactly the oracle's outputs;
        one the oracle says must fail must not exit 0."""
        self.by_mode[got.mode] = self.by_mode.get(got.mode, 0) + 1
        said = (
            " (killed)" if got.killed else " (resumed the interrupted job)" if got.resumed else ""
        )
        self.log.append(f"build {got.mode}{said} -> exit {got.rc}")
        if want is None:
            if got.rc == 0:
                self._difference(step, kind, ["exit 0 with a source it needs missing"], got)
            return
        if got.rc != 0:
            if not got.killed:
                self.failures.append(
                    {"seed": self.seed, "step": step, "mode": got.mode, "rc": got.rc,
                     "sequence": list(self.log), "stderr": got.stderr[-600:]}
                )  # fmt: skip
            return
        wrong = compare(self.ws, want)
        wrong += [f"reported {w}" for w in compare(self.ws, want, got.files)]
        for rel, d in got.digests.items():
            if rel in want and digest(want[rel]) != d:
                wrong.append(f"job artifact {rel}: digest {d}, want {digest(want[rel])}")
        if wrong:
            self._difference(step, kind, wrong, got)
        self.previous_out = {
            rel: (self.ws / "out" / rel).read_bytes()
            for rel in want
            if (self.ws / "out" / rel).is_file()
        }

    def planted(self, got: Outcome, want: dict[str, bytes] | None) -> None:
        """`--plant stale`: the broken engine the tests use to prove a stale output is caught:
        every output a build changed gets its previous bytes back."""
        if self.plant != "stale" or got.rc != 0 or want is None:
            return
        for rel, old in self.previous_out.items():
            path = self.ws / "out" / rel
            if path.is_file() and path.read_bytes() != old:
                path.write_bytes(old)
                got.files.pop(rel, None)

    def crosscheck(self, step: int, pattern: str, want: dict[str, bytes] | None) -> None:
        """The oracle against a clean rsi build of a copy of the workspace in a fresh store."""
        self.crosschecks += 1
        clean = self.dir / "clean"
        shutil.copytree(self.ws, clean, ignore=shutil.ignore_patterns("cache", "out"))
        env = dict(self.builds.base, RSI_SERVER="0")
        proc = subprocess.run(
            [self.builds.rsi, "--store", str(self.dir / "clean-store"), "build", pattern, "--json"],
            cwd=clean, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if want is None:
            wrong = ["clean build exit 0, oracle says it fails"] if proc.returncode == 0 else []
        elif proc.returncode != 0:
            wrong = [f"clean build exit {proc.returncode}: {proc.stderr[-300:]}"]
        else:
            wrong = compare(clean, want)
        if wrong:
            self.oracle_disagreements.append(
                {"seed": self.seed, "step": step, "detail": wrong, "sequence": list(self.log)}
            )
        shutil.rmtree(clean, ignore_errors=True)
        shutil.rmtree(self.dir / "clean-store", ignore_errors=True)

    # --------------------------------------------------------------------------- steps
    def single_step(self, step: int, mode: str | None = None) -> tuple[str, dict | None]:
        mode = mode or self.rng.choice(self.single)
        pattern = self.pattern()
        want = self.expected(pattern)
        self.log.append(f"build {mode} {pattern} ...")
        got = self.builds.build(mode, pattern)
        self.planted(got, want)
        self.check(step, got, want, "single")
        return pattern, want

    def concurrent_step(self, step: int, overtake: bool = False) -> None:
        """Two builds, a change between their starts; once both ended, out/ must be the
        newest sources' outputs (and the second build's report too)."""
        first, second = self.rng.choice(self.single), self.rng.choice(self.single)
        # NB: patterns of their own: a small second build must not be overwritten by a
        # bigger first one that read the older sources and exports last
        early, pattern = self.rng.choice(PATTERNS), self.pattern()
        pause, extra = self.rng.uniform(0.0, 0.4), ()
        if overtake:  # NB: a salted first build runs every action again, so the second ends first
            first, early, pause = "plain", "//...", self.rng.uniform(0.2, 0.8)
            extra = ("--salt", f"s{self.rng.randrange(10**9)}")
        self.log.append(f"start {first} {early} {' '.join(extra)}; after {pause:.2f} s:")
        a = self.builds.start(first, early, extra)
        time.sleep(pause)
        self.change()
        want = self.expected(pattern)
        self.log.append(f"start {second} {pattern}; wait for both")
        b = self.builds.start(second, pattern)
        got_a = self.builds.finish(a)
        got_b = self.builds.finish(b)
        self.by_mode[got_a.mode] = self.by_mode.get(got_a.mode, 0) + 1
        self.log.append(f"first build {first} -> exit {got_a.rc}")
        self.check(step, got_b, want, "concurrent")

    def race_step(self, step: int) -> None:
        """A change while a build runs; once it ended, the next build must see the change
        (the classic race: a source read before the change recorded with its state after)."""
        mode, pattern = self.rng.choice(self.single), self.pattern()
        pause = self.rng.uniform(0.0, 0.4)
        self.log.append(f"start {mode} {pattern}; change after {pause:.2f} s:")
        started = time.time()
        proc = self.builds.start(mode, pattern)
        time.sleep(pause)
        self.change()
        changed = time.time()
        want = self.expected(pattern)
        got = self.builds.finish(proc)
        self.by_mode[got.mode] = self.by_mode.get(got.mode, 0) + 1
        self.log.append(f"racing build {mode} -> exit {got.rc}")
        self.late_reports(step, got, started, changed, want)
        self.single_step(step)

    def late_reports(
        self, step: int, got: Outcome, started: float, changed: float, want: dict | None
    ) -> None:
        """A target the racing build reported ok (`target_finished`) after the change ended
        must have left the changed sources' output: reporting an older one is a stale result.
        Within `LATE_S` of the change it is only counted (a check and an export cannot be
        atomic with an edit no lock orders); later, it is a difference."""
        if got.rc != 0 or want is None:
            return
        outdir = str(self.ws / "out") + "/"
        for log in (self.ws / "cache" / "events").glob("*.jsonl"):
            if log.stat().st_mtime < started:
                continue
            for line in log.read_text().splitlines():
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if ev.get("kind") != "target_finished" or not ev.get("ok"):
                    continue
                late = ev["time"] - changed
                for path in ev.get("outputs") or []:
                    rel = path[len(outdir) :] if path.startswith(outdir) else None
                    if late <= 0 or rel not in want:
                        continue
                    file = self.ws / "out" / rel
                    if file.is_file() and file.read_bytes() == want[rel]:
                        continue
                    self.late.append(round(late, 3))
                    if late > LATE_S:
                        self._difference(
                            step,
                            "race",
                            [f"{ev['label']} reported ok {late:.3f} s after a change, {rel} "
                             "not its output"],
                            got,
                        )  # fmt: skip

    def kill_step(self, step: int, kind: str) -> None:
        """A build killed with SIGKILL mid-run (kill: the client; serverkill: the server;
        jobkill: the job's runner), maybe a change, then a build that must be right."""
        if kind == "kill":
            mode = self.rng.choice([m for m in self.single if m != "job"] or ["plain"])
        elif kind == "serverkill":
            mode = self.rng.choice([m for m in self.single if m in ("served", "watch")])
        else:
            mode = "job"
        pattern = self.pattern()
        want = self.expected(pattern)
        pause = self.rng.uniform(0.0, 0.5)
        self.log.append(f"start {mode} {pattern}; {kind} after {pause:.2f} s")
        proc = self.builds.start(mode, pattern)
        time.sleep(pause)
        if kind == "kill":
            proc.kill()
        else:
            self.builds.kill_tagged(b"rsi.server" if kind == "serverkill" else b"rsi.jobs.runner")
        # NB: with its server killed a client builds by itself, so it must not fail
        got = self.builds.finish(proc, killed=kind != "serverkill")
        self.check(step, got, want, kind)
        if self.rng.random() < 0.5:
            self.change()
        self.single_step(step)

    def run(self) -> None:
        try:
            self.single_step(0)
            for step in range(1, self.rng.randint(5, 15) + 1):
                kind = self.rng.choices(self.kinds, weights=[3] + [1] * (len(self.kinds) - 1))[0]
                self.log.append(f"-- step {step} ({kind})")
                if kind == "single":
                    self.change()
                    pattern, want = self.single_step(step)
                elif kind in ("concurrent", "overtake"):
                    self.concurrent_step(step, overtake=kind == "overtake")
                elif kind == "race":
                    self.race_step(step)
                else:
                    self.kill_step(step, kind)
                if self.crosscheck_every and step % self.crosscheck_every == 0:
                    pattern = self.pattern()
                    self.crosscheck(step, pattern, self.expected(pattern))
        finally:
            self.builds.stop_all()
            unmount_all(self.ws, self.model)
            shutil.rmtree(self.dir, ignore_errors=True)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sequences", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1, help="first seed; sequence i uses seed+i")
    ap.add_argument("--modes", default=",".join(ALL_MODES), help=",".join(ALL_MODES))
    ap.add_argument("--minutes", type=float, default=0, help="stop after this long (0: never)")
    ap.add_argument("--crosscheck-every", type=int, default=5, help="steps; 0: never")
    ap.add_argument("--plant", choices=["none", "stale"], default="none", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "bench" / "model_check.json")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument(
        "--rsi", default="live", help="live: this checkout as it is; or a commit (HEAD), run "
        "from a snapshot of it (git archive), so edits in progress are not what is tested",
    )  # fmt: skip
    ap.add_argument("--no-mounts", action="store_true", help="no bind mounts (root only)")
    opts = ap.parse_args(argv)
    opts.modes = [m for m in opts.modes.split(",") if m]
    unknown = sorted(set(opts.modes) - set(ALL_MODES))
    if unknown:
        ap.error(f"unknown mode(s) {', '.join(unknown)}; known: {', '.join(ALL_MODES)}")
    return opts


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # NB: so SIGTERM too unmounts, kills and removes what it made


def main(argv: list[str] | None = None) -> dict:
    opts = parse(argv)
    if __name__ == "__main__":
        signal.signal(signal.SIGTERM, _stop)
    started = time.monotonic()
    summary: dict = {
        "schema": "rsi.bench.model_check/1",
        "modes": opts.modes,
        "first_seed": opts.seed,
        "plant": opts.plant,
        "sequences": 0,
        "steps": 0,
        "builds": {},
        "crosschecks": 0,
        "late_reports_s": [],
        "checker_errors": [],
        "documented_hole": [],
        "changes": {},
        "differences": [],
        "unexpected_failures": [],
        "oracle_disagreements": [],
    }
    root = Path(tempfile.mkdtemp(prefix="rsi-model-check-"))
    try:
        rsi, tree = RSI, None
        if opts.rsi != "live":  # NB: a commit's snapshot: edits in progress are not tested
            tree = root / "tree"
            tree.mkdir()
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", opts.rsi], capture_output=True, check=True
            )
            subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
            summary["commit"] = subprocess.run(
                ["git", "-C", str(ROOT), "rev-parse", opts.rsi],
                capture_output=True, text=True, check=True,
            ).stdout.strip()  # fmt: skip
            rsi = str(second_env(root / "env1", tree))
        env2 = second_env(root / "env2", tree) if "env2" in opts.modes else None
        for i in range(opts.sequences):
            if opts.minutes and time.monotonic() - started > opts.minutes * 60:
                break
            seq = Sequence(
                opts.seed + i,
                opts.modes,
                root,
                env2,
                opts.plant,
                opts.crosscheck_every,
                not opts.no_mounts,
                rsi,
            )
            try:
                seq.run()
            except Exception:  # NB: a fault of the checker's own is reported, not a verdict
                summary["checker_errors"].append(
                    {"seed": seq.seed, "error": traceback.format_exc()[-800:], "log": seq.log}
                )
            summary["sequences"] += 1
            summary["steps"] += sum(seq.by_mode.values())
            for mode, n in seq.by_mode.items():
                summary["builds"][mode] = summary["builds"].get(mode, 0) + n
            summary["crosschecks"] += seq.crosschecks
            summary["late_reports_s"] += seq.late
            summary["documented_hole"] += seq.holes
            for name, n in seq.changes.items():
                summary["changes"][name] = summary["changes"].get(name, 0) + n
            summary["differences"] += seq.differences
            summary["unexpected_failures"] += seq.failures
            summary["oracle_disagreements"] += seq.oracle_disagreements
            summary["last_seed"] = seq.seed
            summary["wall_s"] = round(time.monotonic() - started, 1)
            if not opts.quiet:
                print(
                    f"seed {seq.seed}: {sum(seq.by_mode.values())} builds, "
                    f"{len(seq.differences)} differences, {len(seq.failures)} failures",
                    flush=True,
                )
            write(opts.out, summary)
    finally:
        unmount_under(root)
        shutil.rmtree(root, ignore_errors=True)
    summary["wall_s"] = round(time.monotonic() - started, 1)
    write(opts.out, summary)
    print(
        f"model check: {summary['sequences']} sequences (seeds {opts.seed}.."
        f"{summary.get('last_seed', opts.seed)}), {summary['steps']} builds {summary['builds']}, "
        f"{summary['crosschecks']} clean cross-checks; {len(summary['differences'])} "
        f"differences, {len(summary['unexpected_failures'])} unexpected failures, "
        f"{len(summary['oracle_disagreements'])} oracle disagreements, "
        f"{len(summary['checker_errors'])} checker errors, {len(summary['documented_hole'])} "
        f"watch differences after a later hard link (documented hole); {summary['wall_s']} s"
    )
    for d in summary["differences"][:10]:
        print(f"  DIFFERENCE seed {d['seed']} step {d['step']} ({d['kind']}, {d['mode']}):")
        for line in d["detail"][:3]:
            print(f"    {line}")
    return summary


def unmount_under(root: Path) -> None:
    """A safety net: lazily unmount anything still mounted under the run's folder."""
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    for point in reversed(points):
        if point.startswith(str(root) + "/"):
            subprocess.run(["umount", "-l", point], check=False)


def write(path: Path, summary: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=1, sort_keys=True))
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(1 if main()["differences"] else 0)
