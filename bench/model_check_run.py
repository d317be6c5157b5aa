"""The model checker's builds: the real `rsi` console script as a subprocess in each mode (in
process, served, served with watch, a job, a second Python environment), started, waited for
or killed, and every process a sequence started found by its tag and killed at its end. It
never judges an output; bench/model_check.py does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RSI = str(Path(sys.executable).with_name("rsi"))
SINGLE_MODES = ("plain", "served", "watch", "job", "env2")
TAG_VAR = "RSI_MODEL_CHECK_TAG"


@dataclass
class Outcome:
    mode: str
    rc: int
    stdout: str
    stderr: str
    # what the build reported: out/-relative path -> the file's bytes read at its end (plain,
    # served) or the digest of the artifact (job)
    files: dict[str, bytes] = field(default_factory=dict)
    digests: dict[str, str] = field(default_factory=dict)
    killed: bool = False
    resumed: bool = False  # a job attached to an interrupted one, resumed (see below)


def second_env(folder: Path, tree: Path | None = None) -> Path:
    """A second Python environment (its own prefix and interpreter path, rsi's packages reached
    through a .pth file) with an `rsi` console script of its own; returns that script. With
    `tree`, that folder's rsi and rules come first (a snapshot of a commit)."""
    script = folder / "bin" / "rsi"
    if script.exists():
        return script
    base = Path(os.path.realpath(sys.executable))
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(folder)], check=True)
    site = next((folder / "lib").glob("python3*/site-packages"))
    here = next(p for p in sys.path if p.endswith("site-packages") and "/lib/python" in p)
    first = f"; import sys; sys.path.insert(0, {str(tree)!r})" if tree else ""
    (site / "rsi_main.pth").write_text(f"import site; site.addsitedir({here!r}){first}\n")
    script.write_text(
        f"#!{folder / 'bin' / 'python3'}\nimport sys\nfrom rsi.entry import run\n"
        "if __name__ == '__main__':\n    sys.exit(run())\n"
    )
    script.chmod(0o755)
    return script


class Builds:
    """Starts builds of one sequence's workspace; every process carries the sequence's tag."""

    def __init__(
        self, ws: Path, tag: str, host_lock: Path, env2: Path | None, rsi: str = RSI
    ) -> None:
        self.rsi = rsi
        self.ws = ws
        self.tag = tag
        self.env2 = env2
        self.base = {
            k: v for k, v in os.environ.items() if not k.startswith(("RSI_SERVER", "RSI_SANDBOX"))
        }
        self.base.update(
            {TAG_VAR: tag, "RSI_HOST_LOCK": str(host_lock), "RSI_SERVER_IDLE_S": "120"}
        )

    def argv_env(self, mode: str, pattern: str) -> tuple[list[str], dict[str, str]]:
        env = dict(self.base, RSI_SERVER="0")
        if mode == "plain":
            return [self.rsi, "build", pattern, "--json"], env
        if mode in ("served", "watch"):
            env["RSI_SERVER"] = "1"
            if mode == "watch":
                env["RSI_SERVER_WATCH"] = "1"
            return [self.rsi, "build", pattern], env  # NB: a plain build is the only served one
        if mode == "job":
            return [self.rsi, "job", "submit", pattern, "--wait", "--json"], env
        if mode == "env2":
            assert self.env2 is not None, "env2 needs a second environment"
            env["RSI_SERVER"] = "1"  # NB: its own server: another interpreter is another key
            return [str(self.env2), "build", pattern], env
        raise ValueError(mode)

    def start(self, mode: str, pattern: str, extra: tuple[str, ...] = ()) -> subprocess.Popen:
        argv, env = self.argv_env(mode, pattern)
        argv += list(extra)
        proc = subprocess.Popen(
            argv, cwd=self.ws, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        proc.mode = mode  # type: ignore[attr-defined]
        return proc

    def finish(self, proc: subprocess.Popen, timeout: float = 120, killed: bool = False) -> Outcome:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            err += f"\n[model_check: killed after {timeout:.0f} s]"
        got = Outcome(proc.mode, proc.returncode, out, err, killed=killed)  # type: ignore
        if got.mode == "job" and got.rc == 1 and not killed:
            self._resume_interrupted(got)
        if got.rc == 0:
            self._reported(got)
        return got

    def _resume_interrupted(self, got: Outcome) -> None:
        """A submit that attached to a job whose runner was killed (docs/jobs.md: same key,
        "interrupted") is resumed and waited for, as its user is told to."""
        try:
            doc = json.loads(got.stdout)
        except ValueError:
            return
        if not (doc.get("attached") and doc.get("state") == "interrupted"):
            return
        _, env = self.argv_env("job", "")
        run = [self.rsi, "job"]
        subprocess.run([*run, "resume", doc["id"]], cwd=self.ws, env=env, capture_output=True)
        wait = subprocess.run(
            [*run, "wait", doc["id"], "--json"], cwd=self.ws, env=env, capture_output=True,
            text=True, timeout=120,
        )  # fmt: skip
        got.rc, got.stdout, got.stderr = wait.returncode, wait.stdout, got.stderr + wait.stderr
        got.resumed = True

    def build(self, mode: str, pattern: str) -> Outcome:
        return self.finish(self.start(mode, pattern))

    def _reported(self, got: Outcome) -> None:
        """What the build said it produced: the report's outputs (plain), the printed paths
        (served), the job's artifact digests (job)."""
        outdir = str(self.ws / "out") + "/"
        paths: list[str] = []
        if got.mode == "plain":
            for t in json.loads(got.stdout)["targets"].values():
                paths += t["outputs"]
        elif got.mode == "job":
            for a in json.loads(got.stdout).get("artifacts", []):
                got.digests[a["path"]] = a["digest"]
        else:
            paths = [ln.strip() for ln in got.stdout.splitlines() if ln.startswith("  /")]
        for p in paths:
            if p.startswith(outdir) and os.path.isfile(p):
                with open(p, "rb") as f:
                    got.files[p[len(outdir) :]] = f.read()

    # ------------------------------------------------------------------------- processes
    def tagged(self, cmd_has: bytes = b"") -> list[int]:
        """Live pids carrying this sequence's tag (servers, job runners, clients), those whose
        command line holds `cmd_has` only when it is given."""
        mark = f"{TAG_VAR}={self.tag}".encode()
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if stat == "Z" or mark not in Path(f"/proc/{entry}/environ").read_bytes():
                    continue
                if cmd_has and cmd_has not in Path(f"/proc/{entry}/cmdline").read_bytes():
                    continue
            except OSError:
                continue
            found.append(int(entry))
        return found

    def kill_tagged(self, cmd_has: bytes) -> list[int]:
        """SIGKILL this sequence's servers (b"rsi.server") or job runners (b"rsi.jobs.runner")."""
        pids = self.tagged(cmd_has)
        for pid in pids:
            _kill(pid)
        return pids

    def stop_all(self) -> None:
        """Kill every process of this sequence (servers, runners) until none is left."""
        deadline = time.monotonic() + 10
        while (pids := self.tagged()) and time.monotonic() < deadline:
            for pid in pids:
                _kill(pid)
            time.sleep(0.05)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
