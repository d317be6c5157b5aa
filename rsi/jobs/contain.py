"""Owning a job's processes: its own cgroup, or (where none can be made) its own session.

`cgroup`: the job gets `rsi-jobs/<job>` at the top of the cgroup hierarchy this process sees,
in cgroup v2 when a v2 hierarchy is mounted and writable (the runner in `<job>/runner`, so
the memory cgroups the executors make next to their own process stay inside `<job>`), else
in the v1 `freezer` hierarchy. Every process the runner starts inherits it, whatever it does
to its session, process group or pid namespace (bwrap's sandboxes, the harness' workers):
cancelling kills the whole tree at once (`cgroup.kill`; or freeze, SIGKILL every member,
thaw), waits until the cgroup is empty and removes it. Being at the top of the hierarchy, the
job outlives the cgroup of the shell that submitted it (as `systemd-run --scope` does).
Memory is counted in the memory cgroups the executors make for each action (`rsi-<runner
pid>-N`, rsi/limits.py), whose limit a memory budget lowers to the budget: the runner's own
Python is not counted, so a small budget never kills the runner.

`session`: no writable cgroup (not root, no delegation, `RSI_JOB_CGROUPS=0`): the runner leads
its own session; cancel kills every process of that session and every descendant of the
runner found in /proc, and repeats until none is left. A process that left both (setsid, then
its parent died) is out of reach: `status` says `containment: session`.

Docker containers are children of dockerd, never in the job's cgroup: cancel removes the
containers the docker executor labelled with one of the job's runner pids on this host.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from rsi.fsutil import pid_alive

JOBS_GROUP = "rsi-jobs"


def proc_start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, /proc/<pid>/stat field 22): with the
    pid and the boot id it names one process, even once its pid is reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    try:
        return int(text.rsplit(b")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return None


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def same_process(pid: int | None, start: int | None, boot: str | None) -> bool:
    """Whether the process recorded as (pid, start ticks, boot id) still runs."""
    if not pid:
        return False
    if boot and boot != boot_id():
        return False  # NB: the machine rebooted since
    if not pid_alive(pid):
        return False
    if start is not None:
        now = proc_start_ticks(pid)
        if now is not None and now != start:
            return False  # NB: the pid was reused
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state == "Z":
                return False
        except (OSError, IndexError):
            pass
    return True


def _mounts() -> list[tuple[str, str, str, str]]:
    from rsi.limits import _mounts as mounts

    return mounts()


def _v2_root() -> Path | None:
    for point, root, fstype, _ in _mounts():
        if fstype == "cgroup2" and root == "/":
            return Path(point)
    return None


def _v1_root(controller: str) -> Path | None:
    for point, root, fstype, opts in _mounts():
        if fstype == "cgroup" and controller in opts.split(",") and root == "/":
            return Path(point)
    return None


def _mkdir(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
        return True
    except OSError:
        return False


def plan_cgroups(job_id: str) -> dict:
    """Make the job's cgroups; {"containment": "cgroup"|"session", "cgroups": [...],
    "join": [procs files the runner joins], "why": reason for session}. Nothing is left
    behind when it falls back."""
    if os.environ.get("RSI_JOB_CGROUPS") == "0":
        return {"containment": "session", "cgroups": [], "join": [], "why": "RSI_JOB_CGROUPS=0"}
    forced = os.environ.get("RSI_JOB_CGROUPS", "")
    made: list[str] = []
    join: list[str] = []
    track = None
    v2 = _v2_root() if forced in ("", "v2") else None
    if v2 is not None and _mkdir(v2 / JOBS_GROUP / job_id / "runner"):
        track = v2 / JOBS_GROUP / job_id
        made.append(str(track))
        join.append(str(track / "runner" / "cgroup.procs"))
    if track is None and forced in ("", "freezer"):
        fz = _v1_root("freezer")
        if fz is not None and _mkdir(fz / JOBS_GROUP / job_id):
            track = fz / JOBS_GROUP / job_id
            made.append(str(track))
            join.append(str(track / "cgroup.procs"))
    if track is None:
        return {
            "containment": "session",
            "cgroups": [],
            "join": [],
            "why": "no writable cgroup hierarchy (cgroup v2 or the v1 freezer)",
        }
    return {"containment": "cgroup", "cgroups": made, "join": join, "why": None}


def join(procs_files: list[str], pid: int | None = None) -> list[str]:
    """Put `pid` (this process) in each cgroup; returns the files it could not join."""
    failed = []
    value = str(pid or os.getpid()).encode()
    for name in procs_files:
        try:
            fd = os.open(name, os.O_WRONLY)
            try:
                os.write(fd, value)
            finally:
                os.close(fd)
        except OSError:
            failed.append(name)
    return failed


def _walk(path: Path) -> list[Path]:
    """`path` and every cgroup below it, deepest first."""
    found: list[Path] = []
    try:
        for entry in os.scandir(path):
            if entry.is_dir(follow_symlinks=False):
                found.extend(_walk(Path(entry.path)))
    except OSError:
        return found
    found.append(path)
    return found


def cgroup_pids(paths: list[str]) -> set[int]:
    pids: set[int] = set()
    for top in paths:
        for cg in _walk(Path(top)):
            try:
                pids.update(int(p) for p in (cg / "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                continue
    return pids


def memory_usage(parents: list[str], pids: list[int]) -> tuple[int | None, bool]:
    """(bytes the memory cgroups the executors of these runner pids made (`rsi-<pid>-N`)
    use now, whether any hit its limit), or (None, False) where there are none."""
    names = {str(p) for p in pids}
    used, hit, seen = 0, False, False
    for parent in parents:
        try:
            entries = list(os.scandir(parent))
        except OSError:
            continue
        for entry in entries:
            parts = entry.name.split("-")
            if len(parts) != 3 or parts[0] != "rsi" or parts[1] not in names:
                continue
            p = Path(entry.path)
            for name in ("memory.current", "memory.usage_in_bytes"):
                try:
                    used += int((p / name).read_text())
                    seen = True
                    break
                except (OSError, ValueError):
                    continue
            try:
                hit = hit or int((p / "memory.failcnt").read_text().strip() or 0) > 0
            except (OSError, ValueError):
                pass
            try:
                for line in (p / "memory.events").read_text().splitlines():
                    k, _, v = line.partition(" ")
                    if k in ("max", "oom_kill") and int(v or 0) > 0:
                        hit = True
            except (OSError, ValueError):
                pass
    return (used if seen else None), hit


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            kids.setdefault(int(fields[1]), []).append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return kids


def _session_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[3])
    except (OSError, IndexError, ValueError):
        return None


def session_pids(leaders: list[int]) -> set[int]:
    """Every live process of the sessions `leaders` lead, and every descendant of them."""
    found: set[int] = set()
    kids = _children_map()
    for leader in leaders:
        stack = [leader]
        while stack:
            pid = stack.pop()
            if pid in found:
                continue
            if pid_alive(pid):
                found.add(pid)
            stack.extend(kids.get(pid, []))
    wanted = set(leaders)
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and _session_of(int(entry.name)) in wanted:
            found.add(int(entry.name))
    return {p for p in found if _state(p) not in (None, "Z")}


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
        return True
    except OSError:
        return False


def kill_cgroups(paths: list[str], wait_s: float = 15.0) -> dict:
    """SIGKILL every process in the job's cgroups (frozen first, so none forks away), wait
    until they are empty and remove them, deepest first. {"killed", "left", "removed",
    "not_removed"}: `left` lists pids still there after `wait_s`."""
    me = os.getpid()
    before = cgroup_pids(paths) - {me}
    track = Path(paths[0]) if paths else None
    if track is not None:
        if (track / "cgroup.kill").exists():
            _write(track / "cgroup.kill", "1")
        else:
            frozen = _write(track / "cgroup.freeze", "1") or _write(
                track / "freezer.state", "FROZEN"
            )
            deadline = time.monotonic() + 2
            while frozen and time.monotonic() < deadline:
                try:
                    state = (track / "freezer.state").read_text().strip()
                except OSError:
                    break
                if state == "FROZEN":
                    break
                time.sleep(0.01)
    deadline = time.monotonic() + wait_s
    left: set[int] = set()
    while True:
        left = cgroup_pids(paths) - {me}
        live = {p for p in left if _state(p) not in (None, "Z")}
        for pid in live:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if track is not None:
            _write(track / "cgroup.freeze", "0") or _write(track / "freezer.state", "THAWED")
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    removed, not_removed = remove_cgroups(paths)
    return {
        "killed": sorted(before),
        "left": sorted(left),
        "removed": removed,
        "not_removed": not_removed,
    }


def remove_cgroups(paths: list[str]) -> tuple[list[str], list[str]]:
    removed, kept = [], []
    for top in paths:
        for cg in _walk(Path(top)):
            for attempt in range(50):
                try:
                    os.rmdir(cg)
                    removed.append(str(cg))
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01 * (attempt + 1))
            else:
                kept.append(str(cg))
        parent = Path(top).parent
        if parent.name == JOBS_GROUP:
            try:
                os.rmdir(parent)  # NB: only when no other job is there
            except OSError:
                pass
    return removed, kept


def kill_session(leaders: list[int], wait_s: float = 15.0) -> dict:
    before = session_pids(leaders) - {os.getpid()}
    deadline = time.monotonic() + wait_s
    left: set[int] = set()
    while True:
        left = session_pids(leaders) - {os.getpid()}
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    return {"killed": sorted(before), "left": sorted(left), "removed": [], "not_removed": []}


def leave_cgroups(paths: list[str]) -> None:
    """Move this process to the top of each hierarchy it is in under `paths` (so the job's
    cgroups can be removed once the rest of its processes are gone)."""
    for top in paths:
        root = Path(top).parent.parent
        join([str(root / "cgroup.procs")])


def remove_containers(runner_pids: list[int]) -> list[str]:
    """Remove the containers the docker executor started for these runner pids on this host
    (labels `rsi.pid`, `rsi.host`); [] without a docker daemon."""
    if not runner_pids or not os.path.exists("/var/run/docker.sock"):
        return []
    import socket

    removed = []
    try:
        import docker

        client = docker.from_env(timeout=10)
        for pid in runner_pids:
            for c in client.containers.list(
                all=True, filters={"label": ["rsi.executor", f"rsi.pid={pid}"]}
            ):
                if (c.labels or {}).get("rsi.host") != socket.gethostname():
                    continue
                c.remove(force=True)
                removed.append(c.name)
    except Exception:  # noqa: BLE001 - NB: no daemon, or it failed: nothing of ours to remove
        pass
    return removed
