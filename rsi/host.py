"""What this machine offers the actions run on it, and who is using it: the host-wide lock that
timing actions take alone (`RSI_HOST_LOCK`), and the platform capabilities (accelerators) a
local executor can satisfy here. It never decides what runs; the scheduler asks it.
"""

from __future__ import annotations

import fcntl
import hashlib
import glob
import itertools
import json
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Iterator

from rsi.fsutil import pid_alive, read_regular
from rsi.errors import ExecutionError
from rsi.record import Frozen

DEFAULT_HOST_LOCK = "/tmp/rsi-host.lock"
HOST_LOCK_ENV = "RSI_HOST_LOCK"
ACCELERATORS_ENV = "RSI_HOST_ACCELERATORS"


def host_lock_path() -> Path:
    """The lock file every rsi process on this machine shares: `$RSI_HOST_LOCK`, read at each
    use (not at import), or /tmp/rsi-host.lock."""
    return Path(os.environ.get(HOST_LOCK_ENV) or DEFAULT_HOST_LOCK)


SHORT_LABEL = 60


def short_label(label: str | None, limit: int = SHORT_LABEL) -> str | None:
    """A holder's label for one line: a build of many patterns is its first and a count."""
    if not label:
        return label
    parts = label.split()
    text = parts[0] + (f" (+{len(parts) - 1} more)" if len(parts) > 1 else "")
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Holder(Frozen):
    """One holding of the host lock, as its holder wrote it next to the lock file."""

    _fields = ("pid", "label", "exclusive", "since", "expected_s")
    pid: int
    label: str | None
    exclusive: bool
    since: float | None  # NB: None when the holder left no record
    # NB: how long the same step held it last time on this host (None: never seen)
    expected_s: float | None

    def __init__(
        self,
        pid: int,
        label: str | None,
        exclusive: bool,
        since: float | None,
        expected_s: float | None = None,
    ) -> None:
        d = self.__dict__
        d["pid"] = pid
        d["label"] = label
        d["exclusive"] = exclusive
        d["since"] = since
        d["expected_s"] = expected_s

    def to_json(self) -> dict:
        return {
            "pid": self.pid,
            "label": self.label,
            "mode": "exclusive" if self.exclusive else "shared",
            "since": round(self.since, 3) if self.since is not None else None,
            "expected_s": round(self.expected_s, 3) if self.expected_s is not None else None,
        }

    def remaining_s(self, now: float | None = None) -> float | None:
        """The holder's expected time left, from its step's last holding (None: unknown)."""
        if self.since is None or self.expected_s is None:
            return None
        return self.expected_s - max(0.0, (now or time.time()) - self.since)

    def describe(self, now: float | None = None) -> str:
        """One short line: pid, a short label, the mode, for how long, and the time left."""
        label = short_label(self.label)
        what = f" {label}" if label else ""
        mode = "exclusive" if self.exclusive else "shared"
        if self.since is None:
            return f"pid {self.pid}{what} ({mode})"
        now = now or time.time()
        held = max(0.0, now - self.since)
        left = self.remaining_s(now)
        if left is None:
            eta = ""
        elif left >= 0:
            eta = f", ~{_duration(left)} left"
        else:
            eta = f", {_duration(-left)} over its last {_duration(self.expected_s or 0.0)}"
        return f"pid {self.pid}{what} ({mode}, for {_duration(held)}{eta})"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def describe_holders(holders: list[Holder], now: float | None = None) -> str:
    if not holders:
        return "an unknown process (another pid namespace, or it just let go)"
    first = holders[0].describe(now)
    return first if len(holders) == 1 else f"{first} and {len(holders) - 1} other holding(s)"


class HostLockTimeout(ExecutionError):
    """The host lock was not free within `--lock-timeout`; retryable, nothing ran."""


WaitCallback = Callable[[list[Holder], float], None]


class HostLock:
    """A readers-writer lock over one file (flock): ordinary actions hold it shared, timing
    actions exclusive, across every rsi process on the machine.

    So that a waiter can say whom it waits for, holders leave records in `<lock>.holders/`:
    one per exclusive holding (pid, target, since), and one per process for its shared
    holdings (pid, what it builds, since its first one), written once, so an ordinary action
    pays no file write. A waiter trusts a record only while the kernel (/proc/locks) shows that
    pid holding the lock. A wait polls (it never blocks in the kernel), so a cancel (Ctrl-C,
    SIGTERM) ends it at once and `timeout_s` bounds it.
    """

    def __init__(
        self,
        path: Path | str | None = None,
        *,
        timeout_s: float | None = None,
        owner: str | None = None,
    ) -> None:
        self.path = Path(path) if path is not None else host_lock_path()
        self.holders_dir = self.path.with_name(self.path.name + ".holders")
        self.timeout_s = timeout_s
        self.owner = owner
        self._seq = itertools.count(1)
        self._shared_record: Path | None = None
        self._guard = threading.Lock()

    @contextmanager
    def slot(
        self,
        exclusive: bool,
        label: str | None = None,
        *,
        cancel: threading.Event | None = None,
        on_wait: WaitCallback | None = None,
    ) -> Iterator[None]:
        fd = self._open()
        if fd is None:
            yield  # NB: no lock file can be opened (read-only /tmp): in-process exclusivity holds
            return
        try:
            mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
            if not _try_flock(fd, mode):
                self._wait(fd, mode, exclusive, cancel, on_wait)
            record = None
            if exclusive:
                started = time.monotonic()
                record = self._write_record(
                    f"{os.getpid()}-{next(self._seq)}", label, True, self._expected(label)
                )
            elif self._shared_record is None:
                with self._guard:
                    if self._shared_record is None:
                        self._sweep()
                        name = f"{os.getpid()}-shared-{id(self):x}"
                        self._shared_record = self._write_record(name, self.owner or label, False)
            try:
                yield
            finally:
                if record is not None:
                    _unlink(record)
                    self._remember(label, time.monotonic() - started)
        finally:
            os.close(fd)  # NB: releases the flock

    def close(self) -> None:
        """Remove this process's record of shared holdings (at the end of a build)."""
        with self._guard:
            if self._shared_record is not None:
                _unlink(self._shared_record)
                self._shared_record = None

    def holders(self) -> list[Holder]:
        """Who holds the lock now, exclusive holders first. Records of processes the kernel
        does not show holding it (finished, or killed with -9) are left out; a holder that
        left no record is listed by pid alone."""
        records: list[Holder] = []
        try:
            names = os.listdir(self.holders_dir)
        except OSError:
            names = []
        for name in names:
            try:
                doc = json.loads(read_regular(self.holders_dir / name))
                records.append(
                    Holder(
                        int(doc["pid"]),
                        doc.get("label"),
                        bool(doc["exclusive"]),
                        float(doc["since"]),
                        _seconds(doc.get("expected_s")),
                    )
                )
            except (OSError, ValueError, KeyError, TypeError):
                continue  # NB: being written or removed right now
        held = self._kernel_holders()
        if held is None:  # NB: no /proc/locks: trust the records of live processes
            found = [h for h in records if pid_alive(h.pid)]
        else:
            found = []
            for pid, exclusive in sorted(held.items()):
                mine = [h for h in records if h.pid == pid and h.exclusive == exclusive]
                found += mine or [Holder(pid, None, exclusive, None)]
        return sorted(found, key=lambda h: (not h.exclusive, h.since or 0.0, h.pid))

    # ------------------------------------------------------------------------ internals
    def _kernel_holders(self) -> dict[int, bool] | None:
        """{pid: exclusive} of the flocks the kernel records on the lock file now."""
        try:
            st = os.stat(self.path)
            text = Path("/proc/locks").read_text()
        except OSError:
            return None
        want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
        held: dict[int, bool] = {}
        for line in text.splitlines():
            fields = line.split()
            if len(fields) < 6 or fields[1] != "FLOCK":
                continue  # NB: "->" marks a blocked request, not a holder
            try:
                major, minor, inode = fields[5].split(":")
                where = (int(major, 16), int(minor, 16), int(inode))
                pid = int(fields[4])
            except ValueError:
                continue
            if where == want:
                held[pid] = held.get(pid, False) or fields[3] == "WRITE"
        return held

    def _open(self) -> int | None:
        for flags in (os.O_RDWR | os.O_CREAT, os.O_RDONLY):
            try:
                return os.open(self.path, flags, 0o666)
            except OSError:
                continue  # NB: another user's 0644 lock file still takes a flock read-only
        return None

    def _wait(
        self,
        fd: int,
        mode: int,
        exclusive: bool,
        cancel: threading.Event | None,
        on_wait: WaitCallback | None,
    ) -> None:
        start = time.monotonic()
        delay, next_report = 0.02, 0.0
        holders: list[Holder] = []
        while True:
            waited = time.monotonic() - start
            if cancel is not None and cancel.is_set():
                raise ExecutionError("cancelled while waiting for the host lock")
            if waited >= next_report:
                holders = self.holders()
                if on_wait is not None:
                    on_wait(holders, waited)
                next_report = waited + 1.0
            if self.timeout_s is not None and waited >= self.timeout_s:
                raise HostLockTimeout(
                    f"gave up after {self.timeout_s:g} s waiting for the host lock "
                    f"{self.path} ({'exclusive' if exclusive else 'shared'}), held by "
                    f"{describe_holders(holders)}",
                    hint="wait for that build to finish, raise --lock-timeout, or set "
                    "RSI_HOST_LOCK to a lock of your own if it measures on other hardware",
                )
            pause = delay
            if self.timeout_s is not None:
                pause = min(pause, max(0.0, self.timeout_s - waited))
            if cancel is not None:
                cancel.wait(pause)
            else:
                time.sleep(pause)
            delay = min(delay * 2, 0.25)
            if _try_flock(fd, mode):
                return

    def _expected_path(self, label: str | None) -> Path:
        name = hashlib.sha256((label or "").encode()).hexdigest()[:24]
        return self.holders_dir / "expected" / name

    def _expected(self, label: str | None) -> float | None:
        """How long the last exclusive holding of `label` lasted on this host, if recorded."""
        try:
            return _seconds(json.loads(read_regular(self._expected_path(label))).get("s"))
        except (OSError, ValueError, AttributeError):
            return None

    def _remember(self, label: str | None, held_s: float) -> None:
        """Record this holding's length for the next waiter's estimate (a courtesy: any
        failure to write it is ignored)."""
        path = self._expected_path(label)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            os.makedirs(path.parent, exist_ok=True)
            tmp.write_text(json.dumps({"label": label, "s": round(held_s, 3)}))
            os.replace(tmp, path)
        except OSError:
            _unlink(tmp)

    def _write_record(
        self, name: str, label: str | None, exclusive: bool, expected_s: float | None = None
    ) -> Path | None:
        doc = {
            "pid": os.getpid(),
            "label": label,
            "exclusive": exclusive,
            "since": time.time(),
            "expected_s": expected_s,
        }
        record = self.holders_dir / name
        for attempt in range(2):
            try:
                with open(record, "w", encoding="utf-8") as f:
                    f.write(json.dumps(doc))
                return record
            except FileNotFoundError:
                if attempt or not self._make_holders_dir():
                    return None
            except OSError:
                return None  # NB: who holds the lock is a courtesy to waiters, never a failure
        return None

    def _sweep(self) -> None:
        """Remove records of processes that no longer exist (killed with -9)."""
        try:
            names = os.listdir(self.holders_dir)
        except OSError:
            return
        for name in names:
            pid = name.split("-", 1)[0]
            if pid.isdigit() and not pid_alive(int(pid)):
                _unlink(self.holders_dir / name)

    def _make_holders_dir(self) -> bool:
        try:
            os.mkdir(self.holders_dir)
        except FileExistsError:
            return True
        except OSError:
            return False
        try:
            os.chmod(self.holders_dir, 0o1777)  # NB: every user's builds share the lock
        except OSError:
            pass
        return True


def _try_flock(fd: int, mode: int) -> bool:
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError:
        return True  # NB: a file system without flock: in-process exclusivity still holds


def _seconds(value: object) -> float | None:
    """A recorded duration, or None when it is missing or not a finite, non-negative number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if 0.0 <= value < float("inf") else None


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# ---------------------------------------------------------------------------- capabilities
Capabilities = Mapping[str, frozenset[str]]


def host_capabilities() -> Capabilities:
    """Platform properties this host can satisfy, by property name. Only the properties named
    here constrain where an action runs: an action asking for a value not in the set cannot
    run on this host. `RSI_HOST_ACCELERATORS` (comma-separated, empty for none) overrides what
    is detected."""
    forced = os.environ.get(ACCELERATORS_ENV)
    if forced is not None:
        values = frozenset(v.strip() for v in forced.split(",") if v.strip())
    else:
        values = _detected_accelerators()
    return {"accelerator": values}


@lru_cache(maxsize=1)
def _detected_accelerators() -> frozenset[str]:
    """The `accelerator` values this host provides: "cuda" and "nvidia" plus the GPU model
    (e.g. "nvidia-h200"), as a remote worker advertises them; none without a GPU device."""
    if not glob.glob("/dev/nvidia[0-9]*"):
        return frozenset()
    return frozenset({"cuda", "nvidia", *(gpu_model(name) for name in gpu_names())} - {""})


@lru_cache(maxsize=1)
def gpu_names() -> tuple[str, ...]:
    """The GPU names nvidia-smi lists (one per device); () without it or when it fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ()
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ()
    if out.returncode != 0:
        return ()
    return tuple(n.strip() for n in out.stdout.splitlines() if n.strip())


def gpu_model(name: str) -> str:
    """An `accelerator` value from a GPU name: "NVIDIA H200" -> "nvidia-h200"."""
    return re.sub(r"[^a-z0-9]+", "-", name.strip().lower()).strip("-")


def unmet_requirement(
    platform: Mapping[str, str], capabilities: Capabilities
) -> tuple[str, str] | None:
    """The first (property, value) of `platform` the capabilities do not provide, e.g.
    ("accelerator", "cuda"), or None when every constrained property is met."""
    for name in sorted(capabilities):
        wanted = platform.get(name)
        if wanted and wanted not in capabilities[name]:
            return name, wanted
    return None
