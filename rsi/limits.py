"""What one action may use of the host: scratch space and memory.

Every action runs under two limits, so that no action can take the machine down:

- **scratch**: the bytes it may write (its working folder, logs, /tmp and /dev/shm together).
  The file systems it writes are sized or per-file limited so a runaway write stops, and what
  it wrote is counted when it ends; past the limit it fails with `scratch_limit`.
- **memory**: a memory cgroup (`memory.max`, swap included) holding every process of the
  action; the kernel's OOM killer acting in it fails the action with `memory_limit`. RAM
  written to a tmpfs by the action counts here too.

The defaults come from `[limits]` in rsi.toml (`scratch_mb`, `memory_mb`), else 1 GiB of scratch
and a quarter of the host's memory; an action's platform properties `scratch` and `memory`
(sizes such as "512m", "4g") override them. Limits are not part of an action's key: a result
that fits one limit is the same result under any larger one, and failures are never cached.

Memory cgroups: cgroup v2 where this process may create cgroups with the memory controller
(root, or a delegated subtree), else the v1 memory hierarchy, else none; a host without one
runs actions with an unenforced memory limit, which every result records in its host facts
and `rsi info` shows, with the reason.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import time
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator, Mapping

from rsi.fsutil import pid_alive
from rsi.errors import DeclarationError
from rsi.record import Frozen

MIB = 1 << 20
DEFAULT_SCRATCH_BYTES = 1 << 30
MEMORY_FRACTION = 4  # NB: the default memory limit is a quarter of the host's memory
SCRATCH_LIMIT = "scratch_limit"
MEMORY_LIMIT = "memory_limit"
HINT = "raise it with [limits] in rsi.toml or the action's platform property"

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(value: str | int, what: str = "size") -> int:
    """Bytes of "4g", "512m", "64MiB", "1048576" (binary units, as docker's --memory)."""
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    else:
        m = _SIZE.match(str(value))
        if not m:
            raise DeclarationError(
                f"{what} {value!r} is not a size", hint='write bytes or e.g. "512m", "4g"'
            )
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n <= 0:
        raise DeclarationError(f"{what} {value!r} must be more than 0 bytes")
    return n


def human(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} B"


@lru_cache(maxsize=1)
def host_memory_bytes() -> int:
    """The memory rsi may count on: the host's RAM, or less when rsi itself runs in a
    memory-limited cgroup (a container)."""
    total = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    total = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError):
        pass
    own = _own_memory_limit()
    if own and (not total or own < total):
        return own
    return total or (4 << 30)


def _own_memory_limit() -> int | None:
    for version, path, _ in _own_cgroup_paths():
        names = ("memory.max",) if version == "v2" else ("memory.limit_in_bytes",)
        for name in names:
            try:
                text = (path / name).read_text().strip()
            except OSError:
                continue
            if text != "max" and text.isdigit() and int(text) < (1 << 60):
                return int(text)
    return None


def _swap_bytes() -> int:
    """Swap on this host now (without any, v1's memory+swap limit need not be set)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("SwapTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 1  # NB: unknown: as if there were


class Limits(Frozen):
    """The limits one action runs under."""

    _fields = ("scratch_bytes", "memory_bytes")
    scratch_bytes: int
    memory_bytes: int  # NB: 0: a quarter of the host's memory, once `for_action` resolves it

    def __init__(self, scratch_bytes: int = DEFAULT_SCRATCH_BYTES, memory_bytes: int = 0) -> None:
        d = self.__dict__
        d["scratch_bytes"] = scratch_bytes
        d["memory_bytes"] = memory_bytes

    @classmethod
    def default(cls, scratch_mb: int | None = None, memory_mb: int | None = None) -> "Limits":
        return cls(
            scratch_bytes=scratch_mb * MIB if scratch_mb else DEFAULT_SCRATCH_BYTES,
            memory_bytes=memory_mb * MIB if memory_mb else host_memory_bytes() // MEMORY_FRACTION,
        )

    @classmethod
    def from_workspace(cls, ws: Any) -> "Limits":
        return cls.default(getattr(ws, "scratch_mb", None), getattr(ws, "memory_mb", None))

    def for_action(self, platform: Mapping[str, str]) -> "Limits":
        """These limits, overridden by the action's platform properties `scratch`/`memory`."""
        scratch, memory = platform.get("scratch"), platform.get("memory")
        memory_bytes = self.memory_bytes or host_memory_bytes() // MEMORY_FRACTION
        return Limits(
            scratch_bytes=parse_size(scratch, "scratch") if scratch else self.scratch_bytes,
            memory_bytes=parse_size(memory, "memory") if memory else memory_bytes,
        )

    def facts(self, scratch: str, memory: str | None, exceeded: str | None = None) -> dict:
        """The `limits` entry of a result's host facts: the limits and how each was enforced
        (`memory` is None where nothing enforced it)."""
        out: dict = {
            "scratch_bytes": self.scratch_bytes,
            "scratch": scratch,
            "memory_bytes": self.memory_bytes,
            "memory": memory or f"not enforced: {cgroup_support().reason}",
        }
        if exceeded:
            out["exceeded"] = exceeded
        return out

    def verdict(
        self, *, oom: bool, written: int | None, full: list[str], failed: bool
    ) -> tuple[str | None, str | None]:
        """(reason code, failure message) when the action went past a limit, else (None,
        None). An OOM kill in the action's cgroup always counts, as does scratch written past
        the limit; a full scratch file system counts when the action failed."""
        if oom:
            return MEMORY_LIMIT, self.memory_failure()
        if (written is not None and written > self.scratch_bytes) or (failed and full):
            return SCRATCH_LIMIT, self.scratch_failure(written, full)
        return None, None

    def scratch_failure(self, written: int | None, full: list[str]) -> str:
        what = f"wrote {human(written)} of scratch" if written is not None else "ran out of scratch"
        where = f"; {', '.join(full)}" if full else ""
        return (
            f"{SCRATCH_LIMIT}: the action {what}, its limit is {human(self.scratch_bytes)}"
            f"{where}; {HINT} `scratch`"
        )

    def memory_failure(self) -> str:
        return (
            f"{MEMORY_LIMIT}: out of memory: the kernel killed the action at its memory limit "
            f"({human(self.memory_bytes)}); {HINT} `memory`"
        )


# ------------------------------------------------------------------------------ cgroups


class CgroupSupport(Frozen):
    """Where this process makes its actions' memory cgroups, or why it cannot."""

    _fields = ("version", "parent", "reason")
    version: str | None  # "v2", "v1" or None
    parent: Path | None
    reason: str | None

    def __init__(self, version: str | None, parent: Path | None, reason: str | None = None) -> None:
        d = self.__dict__
        d["version"] = version
        d["parent"] = parent
        d["reason"] = reason

    @property
    def label(self) -> str | None:
        return f"cgroup {self.version}" if self.version else None


def _mounts() -> list[tuple[str, str, str, str]]:
    """(mount point, root, fstype, super options) of every mount this process sees."""
    found = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, tail = left.split(), right.split()
                if len(fields) >= 5 and len(tail) >= 3:
                    point = fields[4].replace("\\040", " ")
                    found.append((point, fields[3], tail[0], tail[2]))
    except OSError:
        pass
    return found


def _own_cgroup_paths() -> list[tuple[str, Path, bool]]:
    """This process's memory-relevant cgroup folders: ("v2" or "v1", path, whether it is the
    top of the hierarchy this process sees)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    mounts = _mounts()
    out: list[tuple[str, Path, bool]] = []
    for line in lines:
        _, ctrls, rel = line.split(":", 2)
        if ctrls == "":
            fs = [(p, r) for p, r, t, _ in mounts if t == "cgroup2"]
            version = "v2"
        elif "memory" in ctrls.split(","):
            fs = [(p, r) for p, r, t, o in mounts if t == "cgroup" and "memory" in o.split(",")]
            version = "v1"
        else:
            continue
        for point, root in fs:
            if rel == root or rel.startswith(root.rstrip("/") + "/") or root == "/":
                sub = (rel[len(root) :] if root != "/" else rel).strip("/")
                out.append((version, Path(point) / sub, not sub))
                break
    return out


def _probe(parent: Path) -> str | None:
    probe = parent / f"rsi-{os.getpid()}-probe"
    try:
        os.mkdir(probe)
    except FileExistsError:
        pass
    except OSError as exc:
        return f"cannot create a cgroup in {parent}: {exc.strerror}"
    try:
        os.rmdir(probe)
    except OSError:
        pass
    return None


@lru_cache(maxsize=1)
def cgroup_support() -> CgroupSupport:
    """cgroup v2 (a sibling of this process's cgroup, in its parent, which has the memory
    controller when this one has it), else the v1 memory hierarchy (a child of this process's
    cgroup), else none with the reason. `RSI_CGROUPS=0` turns them off."""
    if os.environ.get("RSI_CGROUPS") == "0":
        return CgroupSupport(None, None, "turned off (RSI_CGROUPS=0)")
    reasons: list[str] = []
    for version, ours, top in _own_cgroup_paths():
        if version == "v2":
            try:
                controllers = (ours / "cgroup.controllers").read_text().split()
            except OSError as exc:
                reasons.append(f"cannot read {ours}/cgroup.controllers: {exc.strerror}")
                continue
            if "memory" not in controllers:
                reasons.append(
                    f"cgroup v2 {ours} has no memory controller "
                    f"(has: {' '.join(controllers) or 'none'})"
                )
                continue
            # NB: a v2 cgroup holding processes cannot have children with controllers, so
            # actions go next to this process, unless it is at the top (the root cgroup, or
            # a namespace's, where enabling the controller says whether that is allowed)
            parent = ours if top else ours.parent
            try:
                enabled = (parent / "cgroup.subtree_control").read_text().split()
                if "memory" not in enabled:
                    (parent / "cgroup.subtree_control").write_text("+memory")
            except OSError as exc:
                reasons.append(
                    f"cannot enable the memory controller in {parent}: {exc.strerror} "
                    "(run rsi in a delegated cgroup, e.g. systemd-run --scope -p Delegate=yes)"
                )
                continue
            why = _probe(parent)
            if why is None:
                return CgroupSupport("v2", parent)
            reasons.append(why)
        else:
            why = _probe(ours)
            if why is None:
                return CgroupSupport("v1", ours)
            reasons.append(why)
    return CgroupSupport(None, None, "; ".join(reasons) or "no memory cgroup controller")


_COUNTER = itertools.count(1)


class Cgroup:
    """One memory cgroup: an action's (or a persistent slot's), removed with its processes."""

    def __init__(self, memory_bytes: int, support: CgroupSupport | None = None) -> None:
        support = support or cgroup_support()
        assert support.version and support.parent
        self.version = support.version
        self.path = support.parent / f"rsi-{os.getpid()}-{next(_COUNTER)}"
        os.mkdir(self.path)
        self.memory_bytes = 0
        try:
            self.set_memory(memory_bytes)
        except OSError:
            self.close()
            raise

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def _write(self, name: str, value: str, *, optional: bool = False) -> None:
        try:
            with open(self.path / name, "w") as f:
                f.write(value)
        except FileNotFoundError:
            if not optional:
                raise

    def set_memory(self, limit: int) -> None:
        if limit == self.memory_bytes:
            return
        if self.version == "v2":
            self._write("memory.max", str(limit))
            self._write("memory.swap.max", "0", optional=True)  # NB: swap counts as memory
        elif _swap_bytes():
            # NB: memsw (memory + swap) may never be below the memory limit: lift it first
            self._write("memory.memsw.limit_in_bytes", "-1", optional=True)
            self._write("memory.limit_in_bytes", str(limit))
            self._write("memory.memsw.limit_in_bytes", str(limit), optional=True)
        else:
            self._write("memory.limit_in_bytes", str(limit))
        self.memory_bytes = limit

    def add(self, pid: int) -> None:
        """Move a process in. NB: it waits for an RCU grace period (milliseconds) unless one
        just passed; `joined` spawns children inside instead, where the hierarchy allows."""
        with open(self.procs, "w") as f:
            f.write(str(pid))

    @contextlib.contextmanager
    def joined(self) -> Iterator[bool]:
        """While inside, the calling thread is in this cgroup (v1 only: a thread may move
        alone, and moving itself takes no global lock), so the processes it spawns start
        here; yields False where that cannot be (v2): then `add` them."""
        if self.version != "v1":
            yield False
            return
        home = self.path.parent / "tasks"
        with open(self.path / "tasks", "w") as f:
            f.write("0")
        try:
            yield True
        finally:
            with open(home, "w") as f:
                f.write("0")

    def oom_kills(self) -> int:
        # NB: read through a descriptor kept open (a persistent slot asks after every action:
        # opening the file each time cost ~70 us); a cgroup file reads afresh from offset 0
        fd = getattr(self, "_events_fd", None)
        try:
            if fd is None:
                name = "memory.events" if self.version == "v2" else "memory.oom_control"
                fd = self._events_fd = os.open(self.path / name, os.O_RDONLY | os.O_CLOEXEC)
            text = os.pread(fd, 65536, 0)
        except OSError:
            return 0
        for line in text.split(b"\n"):
            key, _, value = line.partition(b" ")
            if key == b"oom_kill":
                try:
                    return int(value)
                except ValueError:
                    return 0
        return 0

    def _close_events(self) -> None:
        fd = getattr(self, "_events_fd", None)
        if fd is not None:
            self._events_fd = None
            try:
                os.close(fd)
            except OSError:
                pass

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in self.procs.read_text().split()]
        except (OSError, ValueError):
            return []

    def kill(self, wait_s: float = 5.0) -> None:
        """SIGKILL every process in the cgroup; wait up to `wait_s` until it is empty."""
        deadline = time.monotonic() + wait_s
        killed_all = False
        if self.version == "v2" and (self.path / "cgroup.kill").exists():
            try:
                self._write("cgroup.kill", "1")
                killed_all = True
            except OSError:
                pass
        while True:
            pids = self.pids()
            if not pids:
                return
            if not killed_all:
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
            if time.monotonic() >= deadline:
                return
            time.sleep(0.001)

    def close(self) -> None:
        """Kill what is left and remove the cgroup (retrying while the dead are reaped)."""
        self.kill()
        self.remove()

    def remove(self) -> None:
        """Remove the (emptied) cgroup, retrying while its killed processes are reaped."""
        self._close_events()
        for attempt in range(50):
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.01 * (attempt + 1))


def remove_stale_cgroups() -> int:
    """Remove the cgroups of rsi processes that no longer run (a kill -9); 0 when none."""
    support = cgroup_support()
    if not support.parent:
        return 0
    removed = 0
    try:
        entries = list(support.parent.iterdir())
    except OSError:
        return 0
    for entry in entries:
        parts = entry.name.split("-")
        if len(parts) != 3 or parts[0] != "rsi" or not parts[1].isdigit():
            continue
        pid = int(parts[1])
        if pid == os.getpid() or pid_alive(pid):
            continue
        stale = object.__new__(Cgroup)
        stale.version, stale.path, stale.memory_bytes = support.version, entry, 0
        stale.close()
        removed += not entry.exists()
    return removed
