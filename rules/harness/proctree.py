"""The worker's process tree as the referee reads it from outside, in /proc: who is below a
sandbox, the CPU time its processes used, how long they waited for a CPU, and stopping them.

Owns every /proc reading a verdict rests on (tree_cpu_ns, sandbox_cpu, DelayProbe, Freezer); it
must never trust a figure a worker reports about itself, and never read a worker's memory.
Stdlib only; loads no other harness module.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time

TICK_NS = 1_000_000_000 // (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)

_libc = None


def _read(path: str) -> bytes:
    """A /proc file whole. NB: os.open and os.read, not open(): a third of its cost, and the
    referee reads hundreds of these per pair (a process table, CPU clocks around every call)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = [os.read(fd, 4096)]
        while chunks[-1]:
            chunks.append(os.read(fd, 4096))
    finally:
        os.close(fd)
    return b"".join(chunks)


def cpu_clock_ns(pid: int) -> int | None:
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        clk = ctypes.c_int()
        if _libc.clock_getcpuclockid(pid, ctypes.byref(clk)) != 0:
            return None
        return time.clock_gettime_ns(clk.value)
    except (OSError, AttributeError, ValueError):
        return None


def _proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, cutime+cstime in ns) for every process we can read."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = _read(f"/proc/{entry}/stat").decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        table[int(entry)] = (int(fields[1]), (int(fields[13]) + int(fields[14])) * TICK_NS)
    return table


def tree_cpu_ns(root: int) -> int:
    """CPU time (ns) used so far by `root` and every process below it, the reaped ones included
    (through their parents' cutime/cstime). Read from outside: the worker cannot forge it."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        if pid not in table:
            continue
        own = cpu_clock_ns(pid)
        if own is None:
            own = _stat_cpu_ns(pid) or 0
        total += own + table[pid][1]
        stack.extend(children.get(pid, []))
    return total


def _run_delay_ns(path: str) -> int:
    """Time spent runnable but waiting for a CPU (the second field of schedstat), 0 if unknown."""
    try:
        return int(_read(path).split()[1])
    except (OSError, ValueError, IndexError):
        return 0


class DelayProbe:
    """How long the referee's thread and every thread of the worker's tree (as it is when the
    probe is made) waited for a CPU while runnable, so far (ns). Another process taking their
    CPU shows here; a worker spinning or sleeping does not. Read from outside: the worker
    cannot forge it. Cheap enough to read between two calls (a few small files).

    NB: rooted at the forked worker, not at its sandbox: the sandbox's idle processes (bwrap,
    the zygote) wake together when the sandbox is let go on after the other arm's calls, and
    their waiting for each other is not the measurement's contention."""

    def __init__(self, worker_root: int | None, referee: bool = True) -> None:
        # NB: `referee=False` or no root: one side only (multi-rank reads each rank apart)
        roots = [] if worker_root is None else [worker_root, *descendants(worker_root)]
        self.paths = ["/proc/thread-self/schedstat"] if referee else []
        self.paths += [
            f"/proc/{pid}/task/{tid}/schedstat" for pid in roots for tid in threads_of(pid)
        ]

    def read(self) -> int:
        return sum(_run_delay_ns(path) for path in self.paths)


def outside_pid(root: int, inner: object) -> int | None:
    """The pid (in our namespace) of the process below `root` whose innermost pid is `inner`."""
    if not isinstance(inner, int):
        return None
    for pid in descendants(root):
        try:
            with open(f"/proc/{pid}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"NSpid:"):
                        if int(line.split()[-1]) == inner:
                            return pid
                        break
        except (OSError, ValueError, IndexError):
            continue
    return None


BLOCK_SPIN_S, BLOCK_WAIT_S = 0.005, 1.0


def parent_of(pid: int) -> int | None:
    try:
        return int(_read(f"/proc/{pid}/stat").rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def wait_blocked(pid: int, limit_s: float = BLOCK_WAIT_S) -> str | None:
    """None once the process's main thread went to sleep (after answering), within `limit_s`;
    else why not. Spins the first few ms (the usual case), then polls: on a busy host the
    worker may need a while to get a CPU and reach its read."""
    start = time.monotonic()
    path = f"/proc/{pid}/task/{pid}/stat"
    while True:
        try:
            state = _read(path).rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            return "its main thread is gone"
        if state in (b"S", b"D"):
            return None
        if state in (b"Z", b"X"):
            return "its main thread exited while the process went on"
        waited = time.monotonic() - start
        if waited > limit_s:
            return f"its main thread was still running {limit_s} s after its reply"
        if waited < BLOCK_SPIN_S:
            os.sched_yield()
        else:
            time.sleep(0.0005)


def subtree_cpu(root: int) -> dict[int, int]:
    """{pid: CPU clock ns} of `root` and every process below it now (threads included, to the
    ns; a process that appears later counts from 0; a zombie, whose clock cannot be read, by
    its /proc stat in clock ticks). Cheap: the children files of its tree."""
    found, stack = {}, [root]
    while stack:
        pid = stack.pop()
        if pid in found:
            continue
        ns = cpu_clock_ns(pid)
        if ns is None:
            ns = _stat_cpu_ns(pid)
            if ns is None:
                continue
        found[pid] = ns
        stack.extend(children_of(pid))
    return found


def sandbox_cpu(zygote: int | None, worker_pid: int) -> dict[int, int]:
    """subtree_cpu of the worker and of every other child of its zygote (where the worker's
    orphans go): every process of the sandbox but the zygote, which sleeps through a call and
    reaps nothing then (it waits for the worker), and bwrap's above it, which get no orphan."""
    found = subtree_cpu(worker_pid)
    if not zygote:
        return found
    # NB: the zygote's main thread only: it forked the worker, and orphans go to a live thread
    # of the subreaper, its leader first (the zygote's leader waits for the worker meanwhile)
    try:
        children = [int(x) for x in _read(f"/proc/{zygote}/task/{zygote}/children").split()]
    except (OSError, ValueError):
        children = children_of(zygote)
    for child in children:
        if child not in found:
            found.update(subtree_cpu(child))
    return found


def _stat_cpu_ns(pid: int) -> int | None:
    try:
        fields = _read(f"/proc/{pid}/stat").rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * TICK_NS
    except (OSError, ValueError, IndexError):
        return None


def reaped_cpu_ns(pids) -> dict[int, int]:
    """{pid: CPU of its reaped children (cutime + cstime), ns at clock-tick resolution}: where
    a helper process the worker forked, and waited for, within a call left its CPU time."""
    found = {}
    for pid in pids:
        try:
            fields = _read(f"/proc/{pid}/stat").rsplit(b")", 1)[1].split()
            found[pid] = (int(fields[13]) + int(fields[14])) * TICK_NS
        except (OSError, ValueError, IndexError):
            continue
    return found


def thread_cpu_ns(pid: int, tid: int) -> int | None:
    """CPU time of one thread (schedstat's first field, ns), None where unreadable."""
    try:
        return int(_read(f"/proc/{pid}/task/{tid}/schedstat").split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _has_children_files() -> bool:
    try:
        return os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
    except OSError:
        return False


_CHILDREN_FILES = _has_children_files()


def children_of(pid: int) -> list[int]:
    """Children of every thread of `pid` (/proc/<pid>/task/<tid>/children), [] if gone.

    NB: a kernel without CONFIG_PROC_CHILDREN has no such file; then the whole process table
    is read (slower, the same answer), never a silent [] that would leave children running."""
    if not _CHILDREN_FILES:
        return [child for child, (ppid, _) in _proc_table().items() if ppid == pid]
    found = []
    for tid in threads_of(pid):
        try:
            found.extend(int(x) for x in _read(f"/proc/{pid}/task/{tid}/children").split())
        except (OSError, ValueError):
            continue
    return found


def task_states(pid: int) -> list[bytes]:
    states = []
    for tid in threads_of(pid):
        try:
            states.append(_read(f"/proc/{pid}/task/{tid}/stat").rsplit(b")", 1)[1].split()[0])
        except (OSError, IndexError):
            continue
    return states


class FreezeError(Exception):
    pass


class Freezer:
    """Stops every process of one worker sandbox (SIGSTOP, which nothing can catch or block)
    while the other arm's timed calls run, and lets them go on afterwards.

    NB: the arms' calls interleave, so the idle arm's worker is alive during the other arm's
    calls; stopped, it can take neither that arm's CPU nor its caches or memory bandwidth.
    The tree is walked top-down, each process stopped before its children are listed, until
    a walk finds nothing new and no thread of it is still running (a stopped process cannot
    fork, so the set is then closed). Cheap: /proc/<pid>/task/<tid>/children, no /proc scan.
    """

    SETTLE_S = 0.2

    def __init__(self, root: int) -> None:
        self.root = root
        self.stopped: list[int] = []

    def freeze(self) -> None:
        seen: set[int] = set()
        deadline = time.monotonic() + self.SETTLE_S
        while True:
            new, stack = False, [self.root]
            while stack:
                pid = stack.pop()
                if pid not in seen:
                    try:
                        os.kill(pid, signal.SIGSTOP)
                    except ProcessLookupError:
                        continue
                    seen.add(pid)
                    self.stopped.append(pid)
                    new = True
                stack.extend(children_of(pid))
            running = [p for p in seen if any(s in (b"R", b"S") for s in task_states(p))]
            if not new and not running:
                return
            if time.monotonic() > deadline:
                raise FreezeError(
                    f"{len(running)} process(es) of the sandbox could not be stopped"
                    if running
                    else "the sandbox kept starting processes while it was being stopped"
                )
            if running:
                os.sched_yield()

    def thaw(self, settle_s: float = 0.02) -> None:
        """SIGCONT, then wait (at most `settle_s`) until every thread is back asleep: the woken
        processes all share the worker's CPU, and the next call must not start behind them."""
        for pid in self.stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        woken, self.stopped = self.stopped, []
        deadline = time.monotonic() + settle_s
        while any(s in (b"R", b"T") for p in woken for s in task_states(p)):
            if time.monotonic() > deadline:
                return
            os.sched_yield()


def threads_of(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def descendants(root: int) -> list[int]:
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found
