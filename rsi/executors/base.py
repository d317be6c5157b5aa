"""The executor interface and the pieces every executor shares: materialising inputs from the
store into a fresh scratch folder and collecting declared outputs back into it."""

from __future__ import annotations

import os
import platform
import queue
import shutil
import signal
import socket
import stat
import threading
from functools import lru_cache
from pathlib import Path
from typing import Protocol

from rsi.action import Action, ActionResult, OutputFile
from rsi.digest import FileNode, SymlinkNode, digest_bytes, digest_file
from rsi.store import LocalStore


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
        store.export_file(node.digest, dest, node.executable)
        os.chmod(dest, 0o555 if node.executable else 0o444)
    for out in action.outputs:
        parent = out.rpartition("/")[0]
        if parent and parent not in made:
            os.makedirs(exec_dir / parent, exist_ok=True)
            made.add(parent)


def copy_source(src: str, dest: Path, node: FileNode, store: LocalStore) -> None:
    """Copy a workspace file into the scratch folder, refusing it if its content is no longer
    the one the action's key was computed from."""
    from rsi.errors import ExecutionError

    small = node.digest.size <= (1 << 20)
    try:
        if small:  # NB: one read serves both the hash and the copy
            with open(src, "rb") as f:
                data = f.read()
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

    def args(self) -> list[str]:
        return ["--json-status-fd", str(self.fd)]

    def spawned(self) -> None:
        os.close(self.fd)

    def require_started(self, stderr_path: Path, timed_out: bool) -> None:
        """Raise (an infrastructure error) when bwrap never started the action."""
        if not self.started() and not timed_out:
            head = stderr_path.read_bytes()[:300].decode(errors="replace")
            from rsi.errors import ExecutionError

            raise ExecutionError(f"sandbox failed to start: {head}")

    def started(self) -> bool:
        chunks = []
        try:
            while chunk := os.read(self._read, 65536):
                chunks.append(chunk)
        except BlockingIOError:
            pass
        finally:
            os.close(self._read)
        return b"child-pid" in b"".join(chunks)


class _Trash:
    """Removes finished scratch folders on a background thread.

    NB: on file systems mounted with `discard`, rmdir/unlink cost milliseconds each; removing a
    scratch folder off the action's critical path keeps per-action overhead near the sandbox's.
    """

    def __init__(self) -> None:
        self._queue: "queue.Queue[Path]" = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def put(self, path: Path) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="rsi-trash", daemon=True)
                self._thread.start()
        self._queue.put(path)

    def _run(self) -> None:
        while True:
            path = self._queue.get()
            try:
                remove_tree(path)
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
) -> ActionResult:
    """The result every executor returns: logs kept in the store, the exit code named when
    the action also left a declared output missing, a timeout reported as SIGKILL."""
    if failure and exit_code != 0 and not timed_out:
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
    the run, e.g. out of memory) as the failure; `result` as for `finish_result`."""
    outputs, failure = collect_outputs(action, store, exec_dir)
    if timed_out:
        failure = f"timed out after {action.timeout_s:g}s; {killed}"
    elif cut_short:
        failure = cut_short
    return finish_result(
        store,
        exit_code=exit_code,
        timed_out=timed_out,
        outputs=outputs,
        failure=failure,
        **result,  # type: ignore[arg-type]
    )


def remove_tree(path: Path) -> None:
    def onerror(func, p, exc_info):  # NB: read-only folders of inputs block unlink for non-root
        try:
            os.chmod(os.path.dirname(p), 0o755)
            os.chmod(p, 0o755)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=onerror)


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
    return {
        "hostname": socket.gethostname(),
        "os": platform.system(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpu_model": cpu,
        "cpu_count": os.cpu_count(),
    }
