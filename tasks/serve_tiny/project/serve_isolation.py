"""The serving judge's isolation (protocol file): where the engine runs and what it can reach.

The vLLM server (candidate code) runs inside bubblewrap: its own user, pid, IPC and mount
namespaces, the whole file system read-only, the judge's folders (its scratch, AIPerf's
artefacts, the result, the arm trees) hidden under empty tmpfs mounts, and only its own
scratch (HOME, TMPDIR) writable; under root it also runs as a fixed unprivileged uid. The judge,
and every AIPerf process (a sitecustomize), makes itself non-dumpable, so no process of the
same uid can open its /proc/<pid>/fd or mem. This module must never fall back to an
unisolated server: where bwrap cannot build the sandbox the arm is `server_not_isolated`.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path

# NB: a fixed uid/gid no account uses; only root can hand it over (a non-root judge relies on
# the namespaces and on being non-dumpable)
SERVER_UID = SERVER_GID = 64917
PR_SET_DUMPABLE = 4

SITECUSTOMIZE = """# serve_isolation.py: no AIPerf process may be read or traced by the engine
import ctypes
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # NB: PR_SET_DUMPABLE 0
"""


class NotIsolated(Exception):
    """The server could not be put in its sandbox (the arm cannot count)."""


def bwrap_path() -> str:
    # NB: a test points this at a missing file to show the arm is refused, never run bare
    return os.environ.get("RSI_SERVE_BWRAP", "/usr/bin/bwrap")


def make_non_dumpable() -> None:
    """PR_SET_DUMPABLE 0 for this process: /proc/<pid>/{fd,mem,environ} and ptrace are refused
    to every unprivileged process, the engine's included; NotIsolated when the kernel refuses."""
    try:
        rc = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError) as exc:
        raise NotIsolated(f"prctl unavailable: {exc}") from None
    if rc != 0:
        raise NotIsolated(f"PR_SET_DUMPABLE refused: {os.strerror(ctypes.get_errno())}")


def write_sitecustomize(folder: Path) -> Path:
    """A folder to put first on AIPerf's PYTHONPATH: each of its interpreters (spawned workers
    too) makes itself non-dumpable as it starts."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return folder


# NB: under root, bwrap itself runs as root (it can bind any source), and this shim, the
# sandbox's first program, drops to the server's uid before it execs the engine; changing uid
# clears the parent-death signal, so it is set again
DROP_SHIM = (
    "import ctypes, os, signal, sys\n"
    "u = int(sys.argv[1])\n"
    "os.setgroups([]); os.setgid(u); os.setuid(u)\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)\n"
    "os.execve(sys.argv[2], sys.argv[2:], os.environ)\n"
)


def hand_over(path: Path) -> None:
    """Make a folder the server's own (under root): it is writable by the server uid only."""
    if os.geteuid() == 0:
        os.chown(path, SERVER_UID, SERVER_GID)
    os.chmod(path, 0o700)


def _base(proc: list[str]) -> list[str]:
    # NB: a pid namespace only with its own /proc: under the host's, a process's own pid would
    # not name its /proc entry (the engine reads /proc/<getpid()>/status)
    pidns = ["--unshare-pid"] if proc[0] == "--proc" else []
    ns = [*pidns, "--unshare-ipc", "--unshare-uts", "--die-with-parent"]
    if os.geteuid() == 0:
        caps = ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        ns = ["--unshare-user", *ns]
        caps = ["--cap-drop", "ALL"]
    return [
        bwrap_path(),
        *ns,
        *caps,
        "--ro-bind",
        "/",
        "/",
        *proc,
        # NB: its own /dev, a /dev/shm everyone may write (POSIX semaphores: the engine's
        # multiprocessing locks) and its own /tmp
        "--dev",
        "/dev",
        "--perms",
        "1777",
        "--tmpfs",
        "/dev/shm",
        "--tmpfs",
        "/tmp",
    ]


def _works(argv: list[str]) -> tuple[bool, str]:
    try:
        r = subprocess.run(
            [*argv, "--", "/bin/true"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return False, str(exc)
    return r.returncode == 0, r.stderr.strip()[-300:]


def _closed_ancestors(path: Path) -> list[Path]:
    """The folders above `path` that only their owner may search (e.g. /root, where the host's
    interpreter lives): another uid needs them re-made, searchable and empty but for `path`."""
    out = []
    for p in reversed(path.parents):
        try:
            if p != Path("/") and not os.stat(p).st_mode & 0o001:
                out.append(p)
        except OSError:
            continue
    return out


def sandbox_argv(
    hidden: list[Path], readonly: list[Path], writable: list[Path], python: Path
) -> tuple[list, dict]:
    """The bwrap command line to prefix the server's argv with (it ends with the uid-dropping
    shim under root), and what it isolates.

    `hidden` folders are covered by empty tmpfs mounts (the judge's: its scratch, the arm trees,
    the result folder); `readonly` and `writable` are bound back over them (the server's own
    model, plugin and scratch). A fresh /proc of the server's own pid namespace where the kernel
    allows it; inside a sandbox that masks parts of /proc the kernel refuses a new one, and the
    host's is bound read-only and the server shares the pid namespace (pids outside are
    visible, but every judge process is non-dumpable, so their fds, memory and environment are
    not; a signal it sends to a judge process can only make its own arm invalid). NotIsolated
    when bwrap cannot build either."""
    exe = bwrap_path()
    if not os.access(exe, os.X_OK):
        raise NotIsolated(f"{exe} is not an executable: the server cannot be sandboxed")
    how = {"bwrap": exe, "uid": SERVER_UID if os.geteuid() == 0 else os.geteuid()}
    tried = []
    for proc, kind in ((["--proc", "/proc"], "own"), (["--ro-bind", "/proc", "/proc"], "shared")):
        ok, err = _works(_base(proc))
        if ok:
            how["proc"] = kind
            argv = _base(proc)
            break
        tried.append(f"{kind} /proc: {err}")
    else:
        raise NotIsolated("bwrap cannot build the server's sandbox: " + "; ".join(tried))
    for path in hidden:
        if path.is_dir() and path != Path("/"):
            argv += ["--tmpfs", str(path)]
    if os.geteuid() == 0:
        # NB: the interpreter's install (its real path's prefix) under a folder closed to others
        prefix = Path(os.path.realpath(python)).parent.parent
        closed = _closed_ancestors(prefix)
        if closed:
            argv += ["--perms", "0755", "--tmpfs", str(closed[0])]
            # NB: the folders bwrap would make on the way are 0700: made searchable here
            for d in reversed(prefix.parents):
                if d.is_relative_to(closed[0]) and d != closed[0]:
                    argv += ["--perms", "0755", "--dir", str(d)]
            argv += ["--ro-bind", str(prefix), str(prefix)]
    for path in readonly:
        argv += ["--ro-bind", str(path), str(path)]
    for path in writable:
        argv += ["--bind", str(path), str(path)]
    argv.append("--")
    if os.geteuid() == 0:
        argv += [str(python), "-I", "-S", "-c", DROP_SHIM, str(SERVER_UID)]
    return argv, how
