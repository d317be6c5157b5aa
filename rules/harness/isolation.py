"""Where a worker runs: the isolation modes this host allows, a sandbox's argv, environment and
CPUs, starting it in the strongest mode that works, and killing it with everything below it.

Owns the start and teardown every referee sandbox shares (referee.py's worker, mr_sandbox.py's
rank zygote) and the confinement a forked worker must report; it must never start a worker
whose report it has not checked, nor leave a process or folder of a sandbox behind after kill.
"""

from __future__ import annotations

import runpy
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar


# NB: the harness's one sibling loader (siblings.py), itself run by path: no sys.path here
load_siblings = runpy.run_path(str(Path(__file__).resolve().parent / "siblings.py"))["load"]
confine, P, T = load_siblings("confine", "referee_protocol", "proctree")

WORKER_UID = 65533
SCRATCH_BYTES = 256 << 20  # the worker's /tmp and /dev/shm (tmpfs: counted against its memory)
# NB: a private switch for tests that prove a defence matters by removing it: a comma list of
# "dump", "caps", "seccomp", "own_only", "seal" (rank sandboxes also "tmp_reset"). Read from the
# referee's environment, which candidate code never writes (the worker's is built from scratch,
# worker_env); every use is in the evidence.
UNCONFINED_ENV = "_RSI_TEST_UNCONFINED"
# NB: every sandbox this referee started (their zygotes' pids): a forked worker protects them
SANDBOXES: set[int] = set()


def unconfined() -> list[str]:
    raw = os.environ.get(UNCONFINED_ENV, "")
    return sorted({p.strip() for p in raw.split(",") if p.strip()})


def harden_self() -> None:
    """No ptrace, no /proc/<pid>/mem for a same-uid process; children inherit nothing of it."""
    try:
        confine.no_dump()
    except confine.ConfineError:
        pass


def tail(path: Path, limit: int = 2000) -> str | None:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return None
    return text[-limit:] if text else None


def bwrap_path() -> str | None:
    for path in (shutil.which("bwrap"), "/usr/bin/bwrap"):
        if path and os.access(path, os.X_OK):
            return path
    return None


def isolation_modes() -> list[str]:
    forced = os.environ.get("RSI_WORKER_ISOLATION")
    if forced:
        return [forced]
    modes = []
    if bwrap_path():
        modes.append("namespaces")
    if os.geteuid() == 0:
        modes.append("uid")
    else:
        # NB: never as root: a worker of uid 0 with no capabilities can still write every
        # root-owned file (the referee's among them); a root referee falls back to uid only
        modes.append("process")
    return modes


def _python_paths() -> list[Path]:
    paths = {
        Path(sys.prefix).resolve(),
        Path(sys.base_prefix).resolve(),
        Path(os.path.realpath(sys.executable)).parent,
    }
    return sorted(paths)


def _hidden_dirs(work_dir: Path) -> list[str]:
    """Folders the worker must not see: the exec root (and its parent, the pool slot's logs,
    when no interpreter lives there), the referee's work dir, temp folders."""
    cwd = Path.cwd().resolve()
    hide = {cwd, work_dir.resolve().parent, Path("/tmp"), Path("/dev/shm")}
    if str(cwd.parent) != "/" and not any(p.is_relative_to(cwd.parent) for p in _python_paths()):
        hide.add(cwd.parent)
    tmp = os.environ.get("TMPDIR")
    if tmp:
        hide.add(Path(tmp).resolve())
    return sorted(str(p) for p in hide if str(p) != "/" and p.is_dir())


def worker_env(threads: int, home: str) -> dict[str, str]:
    t = str(int(threads))
    env = {k: os.environ[k] for k in ("PATH", "LD_LIBRARY_PATH") if k in os.environ}
    env.update(
        OMP_NUM_THREADS=t,
        MKL_NUM_THREADS=t,
        OPENBLAS_NUM_THREADS=t,
        NUMEXPR_NUM_THREADS=t,
        VECLIB_MAXIMUM_THREADS=t,
        PYTHONHASHSEED="0",
        LC_ALL="C",
        TMPDIR=home,
        HOME=home,
        PYTHONDONTWRITEBYTECODE="1",
        GLIBC_TUNABLES="glibc.malloc.mmap_threshold=33554432:"
        "glibc.malloc.trim_threshold=1073741824:glibc.malloc.top_pad=67108864",
    )
    return env


_ALLOWED: list[int] | None = None


def allowed_cpus() -> list[int]:
    """The CPUs this referee was given, as first seen (pin_referee narrows its own set later)."""
    global _ALLOWED
    if _ALLOWED is None:
        try:
            _ALLOWED = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            _ALLOWED = []
    return _ALLOWED


def worker_cpus(threads: int) -> list[int] | None:
    """The CPUs a worker is pinned to: the last `threads` of the referee's own set, when that
    leaves at least one for the referee (None: not pinned). Both arms of every pair get the same
    CPUs. NB: the worker can undo its pinning (sched_setaffinity); what holds regardless is the
    CPU time the referee reads from outside (cpu_overuse)."""
    allowed = allowed_cpus()
    if threads < 1 or len(allowed) <= threads:
        return None
    return allowed[-threads:]


def pin_referee(threads: int) -> list[int] | None:
    """Keep the referee (its spin-wait on the control page) off the worker's CPUs."""
    cpus = worker_cpus(threads)
    if not cpus:
        return None
    rest = [c for c in allowed_cpus() if c not in cpus]
    try:
        os.sched_setaffinity(0, rest)
    except OSError:
        return None
    return rest


def confinement_missing(
    report, skipped=(), own_only: bool = False, zygote: bool = True
) -> str | None:
    """What a forked worker's report says does not hold (None: all of it holds). Items in
    `skipped` (the tests' private switch) are not required. `own_only`: the worker shares a
    pid namespace with others (uid, process modes; a rank in every mode), so its filter must
    let it name no pid but its own (confine.py). `zygote`: the report says whether candidate
    code was loaded in the zygote (worker.py's does; mr_worker.py's ranks' does not)."""
    if not isinstance(report, dict):
        return "no confinement report"
    problems = []
    if zygote and report.get("candidate_modules_in_zygote") != 0:
        problems.append("candidate code was loaded in the zygote")
    if "caps" not in skipped and report.get("cap_eff") != 0:
        problems.append(f"capabilities {report.get('cap_eff')} {report.get('cap_error') or ''}")
    if "dump" not in skipped and report.get("dumpable") is not False:
        problems.append(f"dumpable {report.get('dump_error') or ''}")
    if "seccomp" not in skipped and report.get("seccomp") != 2:
        problems.append(f"no seccomp filter {report.get('seccomp_error') or ''}")
    elif own_only and not {"seccomp", "own_only"} & set(skipped):
        if report.get("signals") != "own":
            problems.append("its filter lets it signal pids other than its own")
    return "; ".join(p.strip() for p in problems) or None


def bwrap_argv(
    device: str, visible: tuple[Path, ...], work_dir: Path, scripts: tuple[Path, ...]
) -> list[str]:
    """The nested bubblewrap of `namespaces` mode: its own user, pid, ipc, net and mount
    namespaces; the exec root, the referee's work dir and /tmp replaced by empty tmpfs; /proc
    by an empty one; `visible` folders and the harness `scripts` it runs read-only."""
    # NB: confine.py travels with every worker script (worker.py loads it by path)
    argv = [
        bwrap_path(),
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-net",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--ro-bind",
        "/",
        "/",
        "--tmpfs",
        "/proc",
        "--ro-bind-try",
        "/proc/cpuinfo",
        "/proc/cpuinfo",
        "--dev",
        "/dev",
    ]
    for path in _hidden_dirs(work_dir):
        argv += ["--size", str(SCRATCH_BYTES), "--tmpfs", path]
    if device != "cpu":
        for dev in sorted(Path("/dev").glob("nvidia*")):
            argv += ["--dev-bind-try", str(dev), str(dev)]
    hidden = [Path(p) for p in _hidden_dirs(work_dir)]
    for path in _python_paths():
        if any(path.is_relative_to(h) for h in hidden):
            argv += ["--ro-bind", str(path), str(path)]
    for path in visible:
        argv += ["--ro-bind", str(path), str(path)]
    for path in (*scripts, Path(__file__).resolve().parent / "confine.py"):
        argv += ["--ro-bind", str(path), str(path)]
    return argv + ["--chdir", "/tmp"]


class Launched:
    """A sandbox process started by `launch`: the process, the environment it was given, and
    the home folder made for it (removed by `release`, None in `namespaces` mode)."""

    def __init__(self, proc: subprocess.Popen, env: dict[str, str], home: Path | None) -> None:
        self.proc, self.env, self.home = proc, env, home
        self.pid = proc.pid
        SANDBOXES.add(self.pid)

    def kill(self) -> None:
        """SIGKILL its process group and every process below it, then reap it."""
        SANDBOXES.discard(self.pid)
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in T.descendants(self.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.proc.kill()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.release()

    def release(self) -> None:
        if self.home is not None:
            shutil.rmtree(self.home, ignore_errors=True)
            self.home = None

    def await_leftovers(self, mode: str, outlived: str) -> None:
        """Wait (2 s) until nothing but the sandbox itself is below it (bwrap's two processes in
        `namespaces` mode): an ended worker's processes that live on are the candidate's."""
        keep = 2 if mode == "namespaces" else 0
        deadline = time.monotonic() + 2.0
        while len(T.descendants(self.pid)) > keep:
            if time.monotonic() > deadline:
                raise P.WorkerFault("crash", outlived)
            time.sleep(0.005)


def launch(
    python_argv: list[str],
    *,
    mode: str,
    what: str,
    device: str,
    visible: tuple[Path, ...],
    scripts: tuple[Path, ...],
    work_dir: Path,
    home_name: str,
    threads: int,
    log_path: Path,
    pass_fds: list[int],
    cpus: list[int] | None = None,
) -> Launched:
    """Start `python_argv` (a harness script under this interpreter) in `mode`, its own session,
    a clean environment, stdout and stderr to `log_path`; WorkerStartError if it cannot be
    started (its home folder removed). `uid` runs it as WORKER_UID in a 0700 home of its own."""
    home, cwd, home_dir, preexec = "/tmp", "/", None, None
    argv = python_argv
    if mode == "namespaces":
        argv = bwrap_argv(device, visible, work_dir, scripts) + python_argv
    elif mode == "uid":
        home_dir = Path(os.environ.get("TMPDIR") or "/tmp") / (
            f"rsi-{home_name}-{os.getpid()}-{time.monotonic_ns()}"
        )
        home_dir.mkdir(mode=0o700)
        os.chown(home_dir, WORKER_UID, WORKER_UID)

        def preexec():
            os.setgroups([])
            os.setgid(WORKER_UID)
            os.setuid(WORKER_UID)
    else:
        home_dir = work_dir / f"{home_name}-home-{time.monotonic_ns()}"
        home_dir.mkdir()
    if home_dir is not None:
        home = cwd = str(home_dir)

    def start():
        if cpus:
            try:
                os.sched_setaffinity(0, cpus)
            except OSError:
                pass
        if preexec:
            preexec()

    env = worker_env(threads, home)
    log = open(log_path, "ab")  # noqa: SIM115
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            pass_fds=pass_fds,
            start_new_session=True,
            preexec_fn=start,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        if home_dir is not None:
            shutil.rmtree(home_dir, ignore_errors=True)
        raise P.WorkerStartError(f"cannot start the {what} ({mode}): {exc}") from exc
    finally:
        log.close()
    return Launched(proc, env, home_dir)


Started = TypeVar("Started")


def in_strongest_mode(start: Callable[[str], Started], attempts: int = 3) -> Started:
    """`start(mode)` in the strongest isolation that works here; a start that fails (nothing of
    the candidate has run) is retried at most twice more, then is the harness's fault."""
    errors = []
    for attempt in range(attempts):
        for mode in isolation_modes():
            try:
                return start(mode)
            except P.WorkerStartError as exc:
                errors.append(str(exc))
        if attempt + 1 < attempts:
            time.sleep(0.2)
    raise P.WorkerStartError("; ".join(errors[-3:]))
