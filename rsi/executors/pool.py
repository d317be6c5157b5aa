"""Persistent bubblewrap sandboxes: one per job slot, reused by every action the slot runs.

Starting bwrap costs 3-10 ms per action on a small VM (namespaces, a mount table built from
binds, /proc and /dev), several times the action itself for a fan-in of small commands. A slot
pays that once. Inside it, a runner (pid 1 of the sandbox's pid namespace, the host Python run
with `-I -S`) drops to uid/gid 65534 and then, per action:

- spawns the command in `/rsi/exec` with exactly the declared environment;
- enforces the timeout, and after every outcome sends SIGKILL to every other process in the
  namespace (`kill(-1)` from pid 1), reaping them all, so no process outlives its action;
- empties `/tmp` and `/dev/shm` and removes System V IPC objects, so nothing passes between
  two actions of the same slot.

What the host does per action (`_Slot.run`): it makes a fresh `/rsi/exec`, materialised by
root: inputs root-owned 0444/0555, folders that hold only inputs 0555, the others sticky 1777,
so the action (uid 65534) can create its outputs but cannot change, remove or rename an input.
Outputs are read back by lstat (regular files only) with every process of the action already
dead, and the folder is removed before the slot serves anything else.

Limits (`rsi.limits`): `/rsi`, `/tmp` and `/dev/shm` are tmpfs mounts of the slot's own mount
namespace, sized (bwrap --size), so a runaway write stops there and no scratch outlives the
slot, even when rsi is SIGKILLed; the runner counts what each action wrote. The runner, and
with it every action process, lives in a memory cgroup of the slot's, set to each action's
memory limit; an OOM kill there fails that action with `memory_limit`.

The slot's network, UTS and IPC namespaces are the bwrap ones (no network). A runner that dies
or stops answering takes its slot with it; the action fails as an infrastructure fault
(retryable), unless the OOM killer ended it, and the next action starts a fresh slot.

Used only where this process may set uids (euid 0, the CI and default set-up); elsewhere the
local executor starts one bwrap per action, as before.
"""

from __future__ import annotations

import atexit
import json
import marshal
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from functools import lru_cache
from pathlib import Path

from rsi.fsutil import pid_alive
from rsi.errors import ExecutionError
from rsi.limits import Cgroup, cgroup_support, host_memory_bytes, remove_stale_cgroups

SANDBOX_UID = 65534
SLOT_ROOT = "/rsi"
RUNNER_GRACE_S = 30.0

# NB: passed with `python -I -S -c`, so no file of rsi needs to be visible in the sandbox.
RUNNER = r"""
# NB: C modules only, besides ctypes (json, shutil and signal would import re, enum and
# collections: ~9 ms of every slot's start, which a one-change build waits for)
import _signal as signal, ctypes, marshal, os, select, sys, time
signal.signal(signal.SIGINT, signal.SIG_DFL)
os.setgroups([]); os.setgid(%(uid)d); os.setuid(%(uid)d)
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no ptrace or /proc/1/mem from an action
# NB: changing uid cleared bwrap's parent-death signal; without it again, a SIGKILLed rsi would
# leave this runner (and the action) running
libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
IPC_RMID = 0
def wipe(top):
    # everything under top, however deep (a loop, no recursion) and whatever its modes
    stack = [(top, False)]
    while stack:
        path, emptied = stack.pop()
        if emptied:
            try:
                os.rmdir(path)
            except OSError:
                pass
            continue
        try:
            entries = list(os.scandir(path))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    os.chmod(entry.path, 0o700)
                    stack.append((entry.path, True))
                    stack.append((entry.path, False))
                else:
                    os.unlink(entry.path)
            except OSError:  # NB: a hostile tree must not end the runner
                pass
def which(prog, path):
    for folder in path.split(":"):
        cand = os.path.join(folder or ".", prog)
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None
KEYCTL = {"x86_64": 250, "aarch64": 219}.get(os.uname().machine)
def keyrings_clean():
    # every slot shares uid %(uid)d, and with it one user keyring: emptied after each action
    if KEYCTL is not None:
        for ring in (-4, -5):  # KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING
            libc.syscall(KEYCTL, 7, ring)  # KEYCTL_CLEAR
def fresh_session_keyring():
    if KEYCTL is not None:
        libc.syscall(KEYCTL, 1, None)  # KEYCTL_JOIN_SESSION_KEYRING: a new anonymous one
def ipc_clean():
    for kind, ctl in (("shm", libc.shmctl), ("msg", libc.msgctl), ("sem", libc.semctl)):
        try:
            with open("/proc/sysvipc/" + kind) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            ident = int(row.split()[1])
            if kind == "sem":
                ctl(ident, 0, IPC_RMID)
            else:
                ctl(ident, IPC_RMID, None)
def sweep():
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
def wait_for(pid, timeout_s):
    # (exit code, timed out): woken by the child's exit through a pidfd, not by polling
    fd = os.pidfd_open(pid)
    try:
        ready = select.select([fd, 0], [], [], timeout_s)[0]
        if 0 in ready and fd not in ready:
            # NB: input while an action runs means the host closed the pipe (rsi is gone):
            # end now; pid 1 exiting kills everything in the namespace
            os._exit(3)
        if not ready:
            return None, True
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status), False
    finally:
        os.close(fd)
SCRATCH = ("/rsi", "/tmp", "/dev/shm")
FULL_BELOW = 65536
def usage():
    # {file system: (bytes used, bytes free)} of the action's writable tmpfs mounts
    found = {}
    for top in SCRATCH:
        try:
            st = os.statvfs(top)
            found[top] = ((st.f_blocks - st.f_bfree) * st.f_frsize, st.f_bavail * st.f_frsize)
        except OSError:
            found[top] = (0, FULL_BELOW)
    return found
# NB: default dispositions for the action (Python ignores SIGPIPE and SIGXFSZ for itself)
SIGNALS = set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}
out = os.fdopen(1, "wb", buffering=0)
# NB: messages are marshal'ed dicts of plain values, a line of hex each way: both ends are
# this interpreter, and no action can reach either pipe
out.write(b"ready\n")
for line in sys.stdin.buffer:
    req = marshal.loads(bytes.fromhex(line.decode()))
    resp = {"exit_code": None, "timed_out": False}
    t0 = time.perf_counter()
    before = usage()
    try:
        fresh_session_keyring()
        try:
            o = os.open("/rsi/stdout", os.O_WRONLY | os.O_NOFOLLOW)
            e = os.open("/rsi/stderr", os.O_WRONLY | os.O_NOFOLLOW)
        except OSError as exc:
            resp["error"] = "cannot open the action's logs: %%s" %% exc
            raise
        try:
            os.chdir("/rsi/exec")  # NB: a fresh folder each time; posix_spawn inherits the cwd
            argv = req["argv"]
            prog = argv[0]
            if "/" not in prog:  # NB: as execvp: the action's PATH, else the default one
                path = req["env"].get("PATH", os.defpath)
                prog = which(prog, path) or prog
            pid = os.posix_spawn(prog, argv, req["env"], setsid=True, setsigdef=SIGNALS,
                                 setsigmask=(), file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, o, 1), (os.POSIX_SPAWN_DUP2, e, 2),
                (os.POSIX_SPAWN_CLOSE, o), (os.POSIX_SPAWN_CLOSE, e)])
        except OSError as exc:
            os.write(e, ("cannot start %%s: %%s\n" %% (req["argv"][0], exc.strerror)).encode())
            resp["exit_code"] = 127
        else:
            resp["exit_code"], resp["timed_out"] = wait_for(pid, req["timeout_s"])
        finally:
            os.close(o)
            os.close(e)
            os.chdir("/")
    except OSError:
        pass
    finally:
        resp["wall_s"] = time.perf_counter() - t0
        sweep()
        if resp["exit_code"] is None and not resp["timed_out"]:
            resp["exit_code"] = -9
        # NB: what the action wrote, counted with every process of it dead and before the wipe
        after = usage()
        resp["written"] = sum(max(0, after[top][0] - before[top][0]) for top in SCRATCH)
        resp["full"] = [top + " is full" for top in SCRATCH if after[top][1] < FULL_BELOW]
        # NB: answered before the wipe, so the host collects the outputs meanwhile; the next
        # request is read only once the wipe is done: no action meets another's scratch
        out.write(marshal.dumps(resp).hex().encode() + b"\n")
        for top in ("/tmp", "/dev/shm", "/dev/mqueue"):
            wipe(top)
        ipc_clean()
        keyrings_clean()
"""


def pool_supported() -> bool:
    """A slot's runner must drop to another uid; only a root host may hand it that right. The
    slot also needs bwrap's --perms (0.5 and later)."""
    return (
        os.geteuid() == 0 and os.environ.get("RSI_SANDBOX_POOL", "1") != "0" and bwrap_has_perms()
    )


@lru_cache(maxsize=1)
def bwrap_has_perms() -> bool:
    """bubblewrap 0.5+ (it has --perms); older ones (Ubuntu 20.04) reject the option."""
    from rsi.executors import probes

    def ask() -> bool:
        try:
            out = subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout
            version = tuple(int(x) for x in out.split()[-1].split(".")[:2])
        except (OSError, ValueError, IndexError):
            return False
        return version >= (0, 5)

    return bool(probes.cached("bwrap-perms", probes.binary_key("bwrap"), ask, keep=bool))


@lru_cache(maxsize=1)
def bwrap_has_size() -> bool:
    """bubblewrap 0.7+ (it has --size, the size of the next --tmpfs)."""
    from rsi.executors import probes

    def ask() -> bool:
        try:
            out = subprocess.run(["bwrap", "--help"], capture_output=True, text=True).stdout
        except OSError:
            return False
        return "--size" in out

    # NB: an answer about the binary: kept whatever it is, until the binary changes
    key = probes.binary_key("bwrap")
    return bool(probes.cached("bwrap-size", key, ask, keep=lambda _: True))


def tmpfs_args(dest: str, perms: str, size: int | None) -> list[str]:
    """bwrap arguments for a tmpfs at `dest`, of at most `size` bytes where bwrap can say so."""
    sized = ["--size", str(size)] if size and bwrap_has_size() else []
    return ["--perms", perms, *sized, "--tmpfs", dest]


# NB: earlier versions of rsi put slot folders on a host tmpfs at least this big
MIN_TMPFS_BYTES = 2 << 30


def scratch_root() -> Path:
    """Where earlier versions of rsi kept slot folders on the host (`RSI_SCRATCH`, else a
    roomy tmpfs, else /tmp); such folders are only removed now, once their build is gone."""
    forced = os.environ.get("RSI_SCRATCH")
    if forced:
        return Path(forced)
    for cand in ("/dev/shm", os.environ.get("XDG_RUNTIME_DIR") or ""):
        if cand and os.path.isdir(cand) and os.access(cand, os.W_OK):
            try:
                st = os.statvfs(cand)
            except OSError:
                continue
            if st.f_blocks * st.f_frsize >= MIN_TMPFS_BYTES:
                return Path(cand) / f"rsi-{os.geteuid()}"
    return Path("/tmp") / f"rsi-{os.geteuid()}"


class _Slot:
    """One persistent sandbox. Its `/rsi` (the action's folder and logs), `/tmp` and `/dev/shm`
    are tmpfs mounts of the slot's own mount namespace, each sized: nothing of them is on the
    host, so they are gone, RAM included, the moment the slot's last process is (a killed rsi
    closes the runner's pipe, and the runner ends). rsi reaches `/rsi` through a descriptor
    of it (`/proc/self/fd/N`), opened once the runner answers. The runner is in a memory
    cgroup of its own where the host has them, so every action process is too."""

    def __init__(self, base_args: tuple[str, ...]) -> None:
        self._root_fd: int | None = None
        self.cgroup: Cgroup | None = None
        self._ooms = 0
        status_read, status_write = os.pipe()
        cmd = [
            "bwrap",
            "--json-status-fd",
            str(status_write),
            # NB: not --die-with-parent: its signal follows the *thread* that started bwrap,
            # and slots outlive it. The runner ends when rsi's end of its pipe closes.
            *(a for a in base_args if a != "--die-with-parent"),
            "--mqueue",
            "/dev/mqueue",
            "--cap-add",
            "CAP_SETUID",
            "--cap-add",
            "CAP_SETGID",
            "--as-pid-1",
            "--chdir",
            "/",
            "--",
            sys.executable,
            "-I",
            "-S",
            "-c",
            RUNNER % {"uid": SANDBOX_UID},
        ]
        try:
            self.proc = subprocess.Popen(
                cmd,
                env={},  # NB: the runner never needs, and must never hold, the host's environment
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                pass_fds=(status_write,),
            )
        finally:
            os.close(status_write)
        try:
            # NB: bwrap names the runner as soon as it is spawned: it is moved into its cgroup
            # (a move waits for an RCU grace period, milliseconds) while its Python starts
            runner = _child_pid(status_read)
            if runner is not None and cgroup_support().version:
                try:
                    self.cgroup = Cgroup(memory_bytes=host_memory_bytes())
                    self.cgroup.add(runner)
                except OSError as exc:
                    raise ExecutionError(f"cannot make the slot's memory cgroup: {exc}") from exc
            line = self._read_line(30.0, None)
            if line != b"ready\n" or runner is None:
                err = self._stderr_text()
                # NB: the kept host probes vouched for bwrap here: ask them again next time
                from rsi.executors import probes

                probes.forget()
                raise ExecutionError(f"sandbox slot failed to start: {err or 'no answer'}")
            self._root_fd = os.open(f"/proc/{runner}/root{SLOT_ROOT}", os.O_PATH | os.O_DIRECTORY)
            if not self.alive():  # NB: the pid was the runner's when it opened
                raise ExecutionError("sandbox slot ended while starting")
        except BaseException:
            self.close()
            raise
        finally:
            os.close(status_read)
        self.root = Path(f"/proc/self/fd/{self._root_fd}")
        self.exec_dir = self.root / "exec"
        self.stdout = self.root / "stdout"
        self.stderr = self.root / "stderr"

    def _stderr_text(self) -> str:
        try:
            if self.proc.poll() is None:
                return ""
            return self.proc.stderr.read(2000).decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""

    def _read_line(self, timeout_s: float, cancel: threading.Event | None) -> bytes | None:
        fd = self.proc.stdout.fileno()
        buf = b""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], min(remaining, 0.2))
            if cancel is not None and cancel.is_set():
                raise ExecutionError("cancelled")
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            buf += chunk
            if buf.endswith(b"\n"):
                return buf

    def fresh_exec_dir(self) -> Path:
        """A new, empty /rsi/exec and new logs (the last action's were removed by `clear`:
        a slot goes back to the pool only after it)."""
        os.mkdir(self.exec_dir, 0o1777)
        os.chmod(self.exec_dir, 0o1777)  # NB: mkdir's mode is masked by the umask
        for log in (self.stdout, self.stderr):
            # NB: new files each time: the last action owned these and could have left a mode,
            # an xattr or a hard link on them (it cannot create or remove names in the slot)
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                os.fchown(fd, SANDBOX_UID, SANDBOX_UID)
            finally:
                os.close(fd)
        return self.exec_dir

    def clear(self) -> None:
        """Remove the last action's folder and logs, so none of its scratch stays in RAM."""
        try:
            remove_small_tree(str(self.exec_dir))
        except FileNotFoundError:
            pass
        for log in (self.stdout, self.stderr):
            try:
                os.unlink(log)
            except FileNotFoundError:
                pass

    def run(
        self,
        argv: list[str],
        env: dict[str, str],
        timeout_s: float,
        cancel: threading.Event | None,
        memory_bytes: int | None = None,
    ) -> dict:
        """The runner's answer: exit_code, timed_out, wall_s, written (bytes of scratch),
        full (tmpfs mounts left full), and `oom` (the kernel's OOM killer acted in the slot's
        cgroup during the action). A slot killed by the OOM killer answers `oom` too."""
        if self.cgroup is not None and memory_bytes:
            try:
                self.cgroup.set_memory(memory_bytes)
            except OSError as exc:
                raise ExecutionError(f"cannot set the slot's memory limit: {exc}") from exc
        req = {"argv": argv, "env": env, "timeout_s": timeout_s}
        try:
            self.proc.stdin.write(marshal.dumps(req).hex().encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise ExecutionError(f"sandbox slot is gone: {exc}") from exc
        line = self._read_line(timeout_s + RUNNER_GRACE_S, cancel)
        oom = False
        if self.cgroup is not None:
            # NB: the count only moves while an action runs: the last one's is the baseline
            ooms, self._ooms = self._ooms, self.cgroup.oom_kills()
            oom = self._ooms > ooms
        if line is None:
            if oom:  # NB: the kernel chose the runner: the action's failure, not the sandbox's
                return {"exit_code": -signal.SIGKILL, "oom": True, "written": None, "full": []}
            raise ExecutionError(
                "sandbox slot stopped answering"
                + (f": {self._stderr_text()}" if self._stderr_text() else "")
            )
        try:
            answer = marshal.loads(bytes.fromhex(line.decode()))
        except (ValueError, EOFError, TypeError) as exc:
            raise ExecutionError(f"sandbox slot answered garbage: {exc}") from exc
        if not isinstance(answer, dict):
            raise ExecutionError("sandbox slot answered garbage")
        return {**answer, "oom": oom}

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                stream.close()
            except (OSError, ValueError):
                pass
        if self._root_fd is not None:
            os.close(self._root_fd)  # NB: the last reference to the slot's tmpfs mounts
            self._root_fd = None
        if self.cgroup is not None:
            self.cgroup.close()
            self.cgroup = None


def _child_pid(status_fd: int) -> int | None:
    """The sandbox's pid (its runner, with --as-pid-1) from bwrap's --json-status-fd."""
    buf = b""
    deadline = time.monotonic() + 5
    while b"\n" not in buf and time.monotonic() < deadline:
        if not select.select([status_fd], [], [], 0.5)[0]:
            continue
        chunk = os.read(status_fd, 4096)
        if not chunk:
            break
        buf += chunk
    try:
        return int(json.loads(buf.split(b"\n", 1)[0])["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None


def remove_small_tree(path: str) -> None:
    """rmtree for an action's scratch folder on a tmpfs: root removes anything, so none of
    shutil.rmtree's permission repairs or fd-based walking (several times slower) is needed;
    symlinks are removed, never followed."""
    with os.scandir(path) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                remove_small_tree(entry.path)
            else:
                os.unlink(entry.path)
    os.rmdir(path)


class SandboxPool:
    """Idle slots by sandbox shape (the bwrap arguments every action of that shape shares)."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, ...], list[_Slot]] = {}
        self._lock = threading.Lock()
        self._count = 0  # NB: slots started

    def acquire(self, base_args: tuple[str, ...]) -> _Slot:
        with self._lock:
            idle = self._idle.get(base_args) or []
            while idle:
                slot = idle.pop()
                if slot.alive():
                    return slot
                slot.close()
            self._count += 1
        return _Slot(base_args)

    def release(self, base_args: tuple[str, ...], slot: _Slot, healthy: bool) -> None:
        if not healthy or not slot.alive():
            slot.close()
            return
        with self._lock:
            self._idle.setdefault(base_args, []).append(slot)

    def close(self) -> None:
        with self._lock:
            slots = [s for idle in self._idle.values() for s in idle]
            self._idle.clear()
        for slot in slots:
            slot.close()


POOL = SandboxPool()


def _close_pool() -> None:
    POOL.close()


atexit.register(_close_pool)


def prepare_exec_dir(exec_dir: Path, input_paths: list[str], output_paths: list[str]) -> None:
    """Modes that make inputs read-only for the sandbox uid: folders holding an output (and
    the exec root) sticky 1777, folders of inputs only 0555, every file root-owned 0444/0555."""
    out_dirs = {""}
    for out in output_paths:
        parts = out.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            out_dirs.add("/".join(parts[:i]))
    in_dirs: set[str] = set()
    for rel in input_paths:
        parts = rel.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            in_dirs.add("/".join(parts[:i]))
    for d in sorted(out_dirs - {""}):
        os.chmod(exec_dir / d, 0o1777)
    # NB: deepest first, so a parent losing its write bit does not block its children
    for d in sorted(in_dirs - out_dirs, key=lambda p: -p.count("/")):
        os.chmod(exec_dir / d, 0o555)


def remove_stale_slots() -> None:
    """What a killed build left: its memory cgroups, and slot folders of earlier versions (a
    slot's tmpfs mounts now end with the slot)."""
    remove_stale_cgroups()
    root = scratch_root()
    try:
        st = os.lstat(root)
    except OSError:
        return
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        return  # NB: not a private folder of ours: never walked, let alone emptied
    for entry in root.iterdir():
        try:
            pid = int(entry.name.split("-")[1])
        except (IndexError, ValueError):
            continue
        if pid_alive(pid):
            continue
        shutil.rmtree(entry, ignore_errors=True)
