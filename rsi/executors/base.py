"""The executor interface and the pieces every executor shares: materialising inputs from the store
into a fresh scratch folder and collecting declared outputs back into it. It must never trust an
output it has not hashed."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import resource
import select
import shutil
import signal
import stat
import subprocess
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import Callable, Protocol

from rsi.action import UNCACHED_EXIT_ENV, Action, ActionResult, OutputFile
from rsi.digest import FileNode, SymlinkNode, digest_bytes, digest_file
from rsi.fsutil import read_regular, remove_tree
from rsi.limits import Cgroup, Limits, cgroup_support
from rsi.store import SMALL_BLOB, LocalStore


class Executor(Protocol):
    name: str

    def run(
        self, action: Action, store: LocalStore, cancel: threading.Event | None = None
    ) -> ActionResult: ...


def materialise_inputs(
    action: Action, store: LocalStore, exec_dir: Path, *, link: bool = False
) -> None:
    """Write every input file under `exec_dir`, verified, read-only.

    With `link` (only when the sandbox binds inputs read-only, so nothing inside can write
    through the link), a non-executable input is a hard link to its 0444 blob: no copy.
    """
    sources = dict(action.sources)
    made: set[str] = set()
    # NB: small blobs are written through a descriptor of `exec_dir` (a slot's is reached
    # through /proc, a slow path to resolve for every file): read and checked once, created
    # with their final mode
    dir_fd: int | None = None
    try:
        for rel, node in action.inputs:
            dest = exec_dir / rel
            parent = rel.rpartition("/")[0]
            if parent and parent not in made:
                os.makedirs(exec_dir / parent, exist_ok=True)
                made.add(parent)
            if isinstance(node, SymlinkNode):
                os.symlink(node.target, dest)
                continue
            src = sources.get(rel)
            if src is not None and not store.has(node.digest):
                copy_source(src, dest, node, store)
                continue
            if link and not node.executable and store.has_verified(node.digest):
                try:
                    os.link(store.blob_path(node.digest), dest)
                    continue
                except OSError:
                    pass  # NB: another file system, or a link limit: fall back to a copy
            if not link and node.digest.size <= SMALL_BLOB:
                data = store.read_small_verified(node.digest)
                if data is not None:
                    if dir_fd is None:
                        dir_fd = os.open(exec_dir, os.O_RDONLY | os.O_DIRECTORY)
                    if _write_new(dir_fd, rel, data, 0o555 if node.executable else 0o444):
                        continue
            store.export_file(node.digest, dest, node.executable)
            os.chmod(dest, 0o555 if node.executable else 0o444)
    finally:
        if dir_fd is not None:
            os.close(dir_fd)
    for out in action.outputs:
        parent = out.rpartition("/")[0]
        if parent and parent not in made:
            os.makedirs(exec_dir / parent, exist_ok=True)
            made.add(parent)


def _write_new(dir_fd: int, rel: str, data: bytes, mode: int) -> bool:
    """A new file `rel` under `dir_fd` holding `data`, with `mode`; False when one is there."""
    from rsi.errors import StoreError

    try:
        fd = os.open(rel, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode, dir_fd=dir_fd)
    except FileExistsError:
        return False
    except OSError as exc:
        raise StoreError(f"cannot write {rel}: {exc.strerror or exc}") from exc
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, mode)
    except OSError as exc:
        raise StoreError(f"cannot write {rel}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    return True


def copy_source(src: str, dest: Path, node: FileNode, store: LocalStore) -> None:
    """Copy a workspace file into the scratch folder, refusing it if its content is no longer
    the one the action's key was computed from."""
    from rsi.errors import ExecutionError

    small = node.digest.size <= (1 << 20)
    try:
        if small:  # NB: one read serves both the hash and the copy
            data = read_regular(src)
            got = digest_bytes(data, store.function)
            if got == node.digest:
                with open(dest, "xb") as f:
                    f.write(data)
        else:
            shutil.copyfile(src, dest)
            got = digest_file(dest, store.function)
    except OSError as exc:
        raise ExecutionError(f"cannot read input {src}: {exc.strerror or exc}") from exc
    if got != node.digest:
        store.file_memo.forget(src)
        raise ExecutionError(
            f"{src} changed while the build was running", hint="run the build again"
        )
    os.chmod(dest, 0o555 if node.executable else 0o444)


def readonly_units(action: Action) -> list[str]:
    """The fewest input paths to bind read-only without covering a declared output's folder."""
    out_dirs: set[str] = set()
    for out in action.outputs:
        parts = out.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            out_dirs.add("/".join(parts[:i]))
    units: set[str] = set()
    for rel, _ in action.inputs:
        parts = rel.split("/")
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i])
            if prefix not in out_dirs:
                units.add(prefix)
                break
    return sorted(units)


def collect_outputs(
    action: Action, store: LocalStore, exec_dir: Path
) -> tuple[tuple[OutputFile, ...], str | None]:
    """Move declared outputs into the store. Undeclared files are ignored; a missing one fails."""
    found: list[OutputFile] = []
    missing: list[str] = []
    for rel in action.outputs:
        path = exec_dir / rel
        try:
            st = os.lstat(path)
        except OSError:  # NB: not only ENOENT: a file where a parent folder should be, ENOTDIR
            missing.append(rel)
            continue
        if not stat.S_ISREG(st.st_mode):
            missing.append(f"{rel} (not a regular file)")
            continue
        digest = store.put_file(path, move=True)
        found.append(OutputFile(rel, digest, bool(st.st_mode & 0o111)))
    failure = None
    if missing:
        failure = "declared output(s) not created: " + ", ".join(missing)
    return tuple(found), failure


class BwrapStatus:
    """bwrap's `--json-status-fd`: it reports the sandboxed child's pid once the sandbox is up,
    so a failure before that is the sandbox's (infrastructure), after it the action's own.
    (Matching "bwrap:" on stderr would let an action fake an infrastructure fault.)"""

    def __init__(self) -> None:
        self._read, self.fd = os.pipe()
        os.set_blocking(self._read, False)
        self._seen = b""

    def args(self) -> list[str]:
        return ["--json-status-fd", str(self.fd)]

    def spawned(self) -> None:
        os.close(self.fd)

    def child_pid(self, timeout_s: float = 10.0) -> int | None:
        """The sandbox's pid, once bwrap reports it; None when bwrap ended without one."""
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._seen and time.monotonic() < deadline:
            if not select.select([self._read], [], [], 0.5)[0]:
                continue
            try:
                chunk = os.read(self._read, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                break
            self._seen += chunk
        try:
            return int(json.loads(self._seen.split(b"\n", 1)[0])["child-pid"])
        except (ValueError, KeyError, TypeError):
            return None

    def require_started(self, stderr_path: Path, timed_out: bool) -> None:
        """Raise (an infrastructure error) when bwrap never started the action."""
        if not self.started() and not timed_out:
            head = stderr_path.read_bytes()[:300].decode(errors="replace")
            from rsi.errors import ExecutionError

            raise ExecutionError(f"sandbox failed to start: {head}")

    def started(self) -> bool:
        chunks = [self._seen]
        try:
            while chunk := os.read(self._read, 65536):
                chunks.append(chunk)
        except BlockingIOError:
            pass
        finally:
            os.close(self._read)
        return b"child-pid" in b"".join(chunks)


class ActionGuard:
    """The limits of one action that runs in a sandbox of its own (not a persistent slot):
    a memory cgroup holding every process of it (where the host has them), each file it
    writes capped at its scratch limit (RLIMIT_FSIZE), and what it wrote counted when it ends.
    `close` kills whatever is left in the cgroup and removes it."""

    # NB: for sandboxes without bwrap: joins the cgroup and caps file sizes, then runs the
    # command ($1: the cgroup's procs file or /dev/null, $2: 512-byte blocks, as `ulimit -f`)
    SH = 'echo 0 > "$1" && ulimit -f "$2" && shift 2 && exec "$@"'

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.cgroup: Cgroup | None = None
        # NB: how the memory limit is enforced; None where nothing enforces it
        self.memory: str | None = None
        if cgroup_support().version:
            try:
                self.cgroup = Cgroup(limits.memory_bytes)
            except OSError as exc:
                from rsi.errors import ExecutionError

                raise ExecutionError(f"cannot make the action's memory cgroup: {exc}") from exc
            self.memory = cgroup_support().label

    def _spawning(self):
        """Around a spawn: the spawning thread inside the cgroup where it may be (v1), so the
        child starts there; yields whether it is (else the child is moved in after)."""
        if self.cgroup is None:
            return contextlib.nullcontext(True)
        return self.cgroup.joined()

    def spawn(self, cmd: list[str], **popen: object) -> subprocess.Popen:
        """`cmd` started through /bin/sh, which first puts itself under the limits (for
        sandboxes without bwrap)."""
        blocks = str(max(1, self.limits.scratch_bytes // 512))
        with self._spawning() as inside:
            procs = "/dev/null" if inside else str(self.cgroup.procs)  # type: ignore[union-attr]
            argv = ["/bin/sh", "-c", self.SH, "rsi-limits", procs, blocks, *cmd]
            return subprocess.Popen(argv, **popen)  # type: ignore[call-overload]

    def enter(self, *pids: int, capped: int | None = None) -> None:
        """Put `pids` in the action's cgroup and cap file sizes of `capped` (bwrap's sandbox,
        held by --block-fd until this is done, so the action starts inside)."""
        if self.cgroup is not None:
            for pid in pids:
                self.cgroup.add(pid)
        if capped is not None:
            cap = self.limits.scratch_bytes
            resource.prlimit(capped, resource.RLIMIT_FSIZE, (cap, cap))

    def start_bwrap(self, cmd: list[str], status: BwrapStatus, **popen: object):
        """Start `cmd` (bwrap ...) held until its sandbox is under the limits."""
        from rsi.errors import ExecutionError

        gate_read, gate_write = os.pipe()
        at = cmd.index("bwrap") + 1 if "bwrap" in cmd else 1  # NB: after a `taskset -c ...`
        cmd = [*cmd[:at], *status.args(), "--block-fd", str(gate_read), *cmd[at:]]
        capped: bool = popen.get("user") is None or _may_set_others_limits()
        if not capped:
            # NB: started as another uid, whose limits only a CAP_SYS_RESOURCE holder may
            # change (not every root: some containers drop it): it caps its own file size
            # first (lowering a limit needs no right)
            blocks = str(max(1, self.limits.scratch_bytes // 512))
            cmd = ["/bin/sh", "-c", 'ulimit -f "$1" && shift && exec "$@"', "rsi", blocks, *cmd]
        try:
            with self._spawning() as inside:
                proc = subprocess.Popen(cmd, pass_fds=(status.fd, gate_read), **popen)  # type: ignore[call-overload]
        finally:
            os.close(gate_read)
            status.spawned()
        try:
            child = status.child_pid()
            if child is not None:
                # NB: bwrap's own process stays out: it only waits for the sandbox
                self.enter(*(() if inside else (child,)), capped=child if capped else None)
            else:  # NB: bwrap failed before making the sandbox; never run one unlimited
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    raise OSError("bwrap did not report its sandbox") from None
        except OSError as exc:
            os.close(gate_write)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
            raise ExecutionError(f"cannot put the sandbox under its limits: {exc}") from exc
        try:
            os.write(gate_write, b"1")
        except OSError:
            pass  # NB: bwrap already ended; its status says why
        finally:
            os.close(gate_write)
        return proc

    def close(self) -> bool:
        """End the guard: True when the kernel's OOM killer acted in the action's cgroup.
        Every process still in it is sent SIGKILL now; the cgroup is removed off the
        action's critical path, once they are gone."""
        if self.cgroup is None:
            return False
        cgroup, self.cgroup = self.cgroup, None
        oom = cgroup.oom_kills() > 0
        cgroup.kill(wait_s=0)
        TRASH.put(cgroup.close)
        return oom

    def scratch(self, scratch: Path, action: Action) -> tuple[int, list[str]]:
        return count_scratch(scratch, action, self.limits.scratch_bytes)


@lru_cache(maxsize=1)
def _may_set_others_limits() -> bool:
    """Whether this process holds CAP_SYS_RESOURCE (prlimit on another uid's process)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> 24 & 1)  # NB: CAP_SYS_RESOURCE
    except (OSError, ValueError):
        pass
    return False


def count_scratch(scratch: Path, action: Action, cap: int) -> tuple[int, list[str]]:
    """(bytes the action wrote under `scratch`, its inputs left out; the files that reached
    the file size cap `cap`). `scratch` holds `exec` and the action's `tmp` and `shm`."""
    inputs = {f"exec/{rel}" for rel, _ in action.inputs}
    written, full = 0, []
    for dirpath, _, names in os.walk(scratch):
        rel_dir = os.path.relpath(dirpath, scratch)
        for name in names:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if rel in inputs:
                continue
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                written += st.st_blocks * 512
                if st.st_size >= cap:
                    top, _, inner = rel.partition("/")
                    shown = {"exec": "", "tmp": "/tmp/", "shm": "/dev/shm/"}.get(top)
                    full.append(f"{rel if shown is None else shown + inner} reached the size cap")
    return written, full


class _Trash:
    """Removes finished scratch folders (and runs other clean-ups: an action's emptied
    cgroup) on a background thread.

    NB: on file systems mounted with `discard`, rmdir/unlink cost milliseconds each; removing a
    scratch folder off the action's critical path keeps per-action overhead near the sandbox's.
    """

    def __init__(self) -> None:
        self._queue: "queue.Queue[Path | Callable[[], None]]" = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def put(self, path: Path | Callable[[], None]) -> None:
        """Queue a folder to remove, or a clean-up to call."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="rsi-trash", daemon=True)
                self._thread.start()
        self._queue.put(path)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                item() if callable(item) else remove_tree(item)
            except Exception:  # NB: a failed clean-up must not end the thread
                pass
            finally:
                self._queue.task_done()

    def drain(self) -> None:
        self._queue.join()


TRASH = _Trash()


def finish_result(
    store: LocalStore,
    *,
    exit_code: int,
    timed_out: bool,
    outputs: tuple[OutputFile, ...],
    failure: str | None,
    stdout_path: Path,
    stderr_path: Path,
    executor: str,
    host: dict,
    started: float,
    wall_s: float,
    reason_first: bool = False,
) -> ActionResult:
    """The result every executor returns: logs kept in the store, the exit code named when
    the action also left a declared output missing (after the failure when it starts with
    its reason code, `reason_first`), a timeout reported as SIGKILL."""
    if failure and exit_code != 0 and not timed_out:
        if reason_first:
            failure = f"{failure} (exited with code {exit_code})"
        else:
            failure = f"exited with code {exit_code}; {failure}"
    return ActionResult(
        exit_code=-signal.SIGKILL if timed_out else exit_code,
        outputs=outputs,
        stdout=store.put_log(stdout_path),
        stderr=store.put_log(stderr_path),
        timed_out=timed_out,
        failure=failure,
        executor=executor,
        host=host,
        timing={"started": started, "wall_s": round(wall_s, 6)},
    )


def finish_run(
    store: LocalStore,
    action: Action,
    exec_dir: Path,
    *,
    exit_code: int,
    timed_out: bool,
    killed: str,
    cut_short: str | None = None,
    **result: object,
) -> ActionResult:
    """The result of a sandboxed run that has ended: declared outputs collected from
    `exec_dir`, a timeout named with what it killed, else `cut_short` (why the sandbox ended
    the run: a limit, `rsi.limits`) as the failure; `result` as for `finish_result`."""
    outputs, failure = collect_outputs(action, store, exec_dir)
    if timed_out:
        failure = f"timed out after {action.timeout_s:g}s; {killed}"
    elif cut_short:
        failure = cut_short
    uncached = uncached_exit(action)
    if uncached is not None and exit_code == uncached and not timed_out and failure is None:
        # NB: the action's own word: good outputs, made under a transient condition
        result["host"] = {**dict(result.get("host") or {}), "uncached_exit": exit_code}  # type: ignore[dict-item]
        return finish_result(
            store,
            exit_code=0,
            timed_out=False,
            outputs=outputs,
            failure=None,
            **result,  # type: ignore[arg-type]
        ).replace(cacheable=False)
    return finish_result(
        store,
        exit_code=exit_code,
        timed_out=timed_out,
        outputs=outputs,
        failure=failure,
        reason_first=bool(cut_short) and not timed_out,
        **result,  # type: ignore[arg-type]
    )


def uncached_exit(action: Action) -> int | None:
    """The exit code `action` declares as "good, never cache" (`RSI_UNCACHED_EXIT`), if any."""
    value = dict(action.env).get(UNCACHED_EXIT_ENV)
    try:
        code = int(value) if value is not None else None
    except ValueError:
        return None
    return code if code not in (None, 0) else None


@lru_cache(maxsize=1)
def host_facts() -> dict:
    cpu = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    uname = os.uname()
    return {
        # NB: what socket.gethostname() and platform's system(), release() and machine()
        # answer, without importing either (~3 ms of every build that runs something)
        "hostname": uname.nodename,
        "os": uname.sysname,
        "kernel": uname.release,
        "machine": uname.machine,
        "cpu_model": cpu,
        "cpu_count": os.cpu_count(),
    }
