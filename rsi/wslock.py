"""The lock over one workspace's outputs: builds take it (flock, exclusive) only to check that
their results are still those of the sources and to export them under `out/`, and for a whole
no-op build, so exports never interleave and parallel builds stay possible. It never holds
while an action runs, and a wait for it is always visible (who holds it) and interruptible.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rsi.digest import digest_bytes
from rsi.errors import ExecutionError
from rsi.fsutil import pid_alive

POLL_S = 0.05


class OutputLockTimeout(ExecutionError):
    """Another build held the workspace's outputs for longer than `--lock-timeout`."""


RECORD_BYTES = 512


def _record(what: str) -> bytes:
    """The holder's record, padded with spaces to RECORD_BYTES (what it builds cut to fit)."""
    for cut in (len(what), 200, 40):
        text = what if len(what) <= cut else what[:cut] + "..."
        record = json.dumps({"pid": os.getpid(), "what": text, "since": time.time()}).encode()
        if len(record) <= RECORD_BYTES:
            return record.ljust(RECORD_BYTES)
    return (
        json.dumps({"pid": os.getpid(), "what": None, "since": time.time()})
        .encode()
        .ljust(RECORD_BYTES)
    )


def lock_path(store_root: Path, out_dir: Path) -> Path:
    """One lock per `out/` (by its real path), kept in the store's `locks/` folder."""
    name = digest_bytes(os.path.realpath(out_dir).encode()).hash[:32]
    return Path(store_root) / "locks" / f"out-{name}.lock"


def holder(fd: int) -> dict | None:
    """What the holder wrote into the lock file (pid, what it builds, since), if it is alive."""
    try:
        doc = json.loads(os.pread(fd, RECORD_BYTES, 0).strip() or b"null")
        if isinstance(doc, dict) and pid_alive(int(doc["pid"])):
            return doc
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def describe(doc: dict | None) -> str:
    if doc is None:
        return "another process"
    since = time.strftime("%H:%M:%S", time.localtime(float(doc.get("since") or 0)))
    return f"pid {doc['pid']} (rsi build {doc.get('what') or '?'}, since {since})"


@contextmanager
def held(
    path: Path,
    what: str,
    *,
    timeout_s: float | None = None,
    on_wait: Callable[[dict | None, float], None] | None = None,
) -> Iterator[None]:
    """Hold the lock at `path`. While another process holds it, `on_wait(holder, waited_s)`
    is called when the wait begins and whenever the holder changes; the wait polls (a signal
    ends it at once) and `timeout_s` bounds it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except FileNotFoundError:
        os.makedirs(path.parent, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        started = None
        seen: object = ()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                pass
            now = time.monotonic()
            started = now if started is None else started
            who = holder(fd)
            key = None if who is None else (who.get("pid"), who.get("since"))
            if key != seen and on_wait is not None:
                on_wait(who, now - started)
            seen = key
            if timeout_s is not None and now - started >= timeout_s:
                raise OutputLockTimeout(
                    f"the workspace's outputs are held by {describe(who)} for more than "
                    f"{timeout_s:g} s (lock file {path})"
                )
            time.sleep(POLL_S)
        try:
            # NB: written over in place at a fixed length: a truncate and a new block per build
            # cost milliseconds on some file systems (ext4 with discard), this ~10 us
            os.pwrite(fd, _record(what), 0)
        except OSError:
            pass  # NB: the lock holds all the same; a waiter names "another process"
        yield
    finally:
        os.close(fd)  # NB: releases the flock
