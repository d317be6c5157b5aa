"""The referee's side of a judged call: secret seeds, the worker's sandbox, the call protocol,
the clock that counts and the CPU time the worker really used.

The referee (check.py, measure.py) owns everything that decides a verdict. Candidate code runs
only in a worker (worker.py) started here, in the strongest isolation this host allows:

- `namespaces`: a nested bubblewrap with its own user, pid, ipc, net and mount namespaces; the
  exec root, the referee's work dir and /tmp are replaced by empty tmpfs, /proc by an empty one;
  it sees its own implementation folder read-only and nothing else of the action.
- `uid`: the referee is root and no namespace can be made: the worker runs as another uid
  (65533) in its own session; the referee's files are 0700.
- `process`: neither: its own session, the same uid. Recorded in the evidence.
In `uid` and `process` the worker shares a pid namespace with the other arm's worker and the
host, so its seccomp filter lets it name no pid but its own (signals, pidfd_open, scheduling,
limits: confine.py own_only); a worker whose report does not say so is not started.

The referee, the zygote and every worker are non-dumpable, and every worker runs with no
capabilities under a seccomp filter (confine.py): no worker can ptrace, read or write the
memory of, or signal, its zygote, the other arm or the referee. Inputs reach the worker only
when its call starts (written into a shared buffer after the referee's clock started); the
output is copied out of the worker's buffer before the clock stops. The buffers are memfds
sealed against shrinking and growing before the worker gets them (no SIGBUS here). What the
worker says is data: JSON with a length prefix, size- and depth-capped, NaN refused, checked
field by field (parse_reply); anything else is a protocol fault, the candidate's.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import mmap
import os
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path


def _load_confine():
    name = "_rsi_harness_confine"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, Path(__file__).resolve().parent / "confine.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


confine = _load_confine()

MAX_MESSAGE = 1 << 20
MAX_DEPTH = 16  # the deepest reply the protocol has is 3 levels; a deeper one is refused
# NB: a private switch for tests that prove a defence matters by removing it: a comma list of
# "dump", "caps", "seccomp", "own_only", "seal". Read from the referee's environment, which
# candidate code never writes (the worker's is built from scratch, _env); every use is in the
# evidence.
UNCONFINED_ENV = "_RSI_TEST_UNCONFINED"


def unconfined() -> list[str]:
    raw = os.environ.get(UNCONFINED_ENV, "")
    return sorted({p.strip() for p in raw.split(",") if p.strip()})


_LEN = struct.Struct("<I")
_SEQ = struct.Struct("<q")
CTL_SIZE = 4096
REQ_AT, DONE_AT = 0, 64  # the same layout as worker.py's control buffer
NO_CALL = -(1 << 62)  # the sequence numbers' value before the first call (never an index)
SPIN_S = 0.02  # spin this long for a call to end, then poll every 50 us
WORKER_UID = 65533
ALIGN = 64
SCRATCH_BYTES = 256 << 20  # the worker's /tmp and /dev/shm (tmpfs: counted against its memory)
TICK_NS = _TICK_NS = 1_000_000_000 // (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


class WorkerStartError(Exception):
    """The worker could not be started or did not get ready: nothing of the candidate ran."""


class WorkerFault(Exception):
    """The worker ended, stalled or broke the protocol after candidate code was imported."""

    def __init__(self, code: str, detail: str):
        super().__init__(detail)
        self.code, self.detail = code, detail


# -------------------------------------------------------------------------- the worker's bytes

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_BRACKET = re.compile(rb"[\[\]{}]")
_SHORT, _LONG = 256, 8192


def _depth_ok(body: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether no array or object in `body` nests deeper than `limit` (no recursion: a reply
    50,000 levels deep must not reach json.loads, whose recursion would raise)."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return True
    depth = 0
    for m in _BRACKET.finditer(_STRING.sub(b'""', body)):
        depth += 1 if m.group() in (b"[", b"{") else -1
        if depth > limit:
            return False
    return True


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number the protocol allows")


def _finite_float(text: str) -> float:
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{text[:40]} is not a finite number")
    return value


def _is_int(v) -> bool:
    return type(v) is int and -(1 << 62) <= v <= (1 << 62)


def _is_str(limit: int):
    return lambda v: type(v) is str and len(v) <= limit


def _or_none(check):
    return lambda v: v is None or check(v)


def _dict_of(fields: dict):
    return lambda v: type(v) is dict and all(k in fields and fields[k](x) for k, x in v.items())


def _list_of(check, limit: int):
    return lambda v: type(v) is list and len(v) <= limit and all(check(x) for x in v)


_OUT = {
    "type": _or_none(_is_str(_SHORT)),
    "dtype": _or_none(_is_str(_SHORT)),
    "shape": _or_none(_list_of(lambda x: _is_int(x) and x >= 0, 64)),
    "device": _or_none(_is_str(_SHORT)),
    "nbytes": _or_none(lambda x: _is_int(x) and x >= 0),
    "problem": _or_none(_is_str(_SHORT)),
}
_ERROR = {
    "type": _or_none(_is_str(_LONG)),
    "message": _or_none(_is_str(_LONG)),
    "traceback": _or_none(_is_str(_LONG)),
}
_HOW = {"exit": _or_none(_is_int), "signal": _or_none(_is_int)}
# NB: every field a reply may carry, and what it may hold; anything else is a protocol fault.
# multirank.py's replies (rank, ranks) share this table.
REPLY_FIELDS = {
    "op": _is_str(64),
    "i": _is_int,
    "pid": _is_int,
    "rank": _is_int,
    "event_ns": _is_int,
    "echo": lambda v: type(v) is bool,
    "kind": _is_str(64),
    "message": _is_str(_LONG),
    "out": _or_none(_dict_of(_OUT)),
    "error": _or_none(_dict_of(_ERROR)),
    "exit": _or_none(_is_int),
    "signal": _or_none(_is_int),
    "ranks": _list_of(_dict_of(_HOW), 4096),
    "confined": _or_none(
        _dict_of(
            {
                k: _or_none(lambda v: _is_int(v) or type(v) is bool or _is_str(_SHORT)(v))
                for k in (
                    "cap_eff",
                    "dumpable",
                    "seccomp",
                    "stray_fds_closed",
                    "candidate_modules_in_zygote",
                    "cap_error",
                    "dump_error",
                    "seccomp_error",
                    "signals",
                )
            }
        )
    ),
}


_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite_float)


def parse_reply(body: bytes) -> dict:
    """The worker's reply as a dict, or WorkerFault("protocol"): never anything else, whatever
    the bytes (nesting, NaN, Infinity, huge numbers, bad UTF-8, unknown fields, wrong types)."""
    try:
        if not _depth_ok(body):
            raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
        doc = _DECODER.decode(body.decode("utf-8"))
        if type(doc) is not dict or "op" not in doc:
            raise ValueError("not a JSON object with an op")
        for key, value in doc.items():
            check = REPLY_FIELDS.get(key)
            if check is None:
                raise ValueError(f"unknown field {key[:40]!r}")
            if not check(value):
                raise ValueError(f"field {key!r} holds {str(value)[:80]!r}")
    except WorkerFault:
        raise
    except Exception as exc:  # noqa: BLE001  whatever the bytes did, it is theirs: a protocol fault
        raise WorkerFault(
            "protocol", f"a reply the protocol does not allow: {str(exc)[:200]}"
        ) from None
    return doc


def secret_seed() -> int:
    """A 63-bit seed from the OS, never derived from anything public; revealed after the run."""
    return int.from_bytes(os.urandom(8), "big") >> 1


def harden_self() -> None:
    """No ptrace, no /proc/<pid>/mem for a same-uid process; children inherit nothing of it."""
    try:
        confine.no_dump()
    except confine.ConfineError:
        pass


# -------------------------------------------------------------------------- CPU accounting

_libc = None


def _cpu_clock_ns(pid: int) -> int | None:
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
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        table[int(entry)] = (int(fields[1]), (int(fields[13]) + int(fields[14])) * _TICK_NS)
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
        own = _cpu_clock_ns(pid)
        if own is None:
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    fields = f.read().decode().rsplit(")", 1)[1].split()
                own = (int(fields[11]) + int(fields[12])) * _TICK_NS
            except (OSError, ValueError, IndexError):
                own = 0
        total += own + table[pid][1]
        stack.extend(children.get(pid, []))
    return total


def _run_delay_ns(path: str) -> int:
    """Time spent runnable but waiting for a CPU (the second field of schedstat), 0 if unknown."""
    try:
        with open(path, "rb") as f:
            return int(f.read().split()[1])
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

    def __init__(self, worker_root: int) -> None:
        self.paths = ["/proc/thread-self/schedstat"] + [
            f"/proc/{pid}/task/{tid}/schedstat"
            for pid in [worker_root, *descendants(worker_root)]
            for tid in _threads(pid)
        ]

    def read(self) -> int:
        return sum(_run_delay_ns(path) for path in self.paths)


def _outside_pid(root: int, inner: object) -> int | None:
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


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _wait_blocked(pid: int, limit_s: float = BLOCK_WAIT_S) -> str | None:
    """None once the process's main thread went to sleep (after answering), within `limit_s`;
    else why not. Spins the first few ms (the usual case), then polls: on a busy host the
    worker may need a while to get a CPU and reach its read."""
    start = time.monotonic()
    path = f"/proc/{pid}/task/{pid}/stat"
    while True:
        try:
            with open(path, "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
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
        ns = _cpu_clock_ns(pid)
        if ns is None:
            ns = _stat_cpu_ns(pid)
            if ns is None:
                continue
        found[pid] = ns
        stack.extend(_children_of(pid))
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
        with open(f"/proc/{zygote}/task/{zygote}/children", "rb") as f:
            children = [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        children = _children_of(zygote)
    for child in children:
        if child not in found:
            found.update(subtree_cpu(child))
    return found


def _stat_cpu_ns(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * _TICK_NS
    except (OSError, ValueError, IndexError):
        return None


def reaped_cpu_ns(pids) -> dict[int, int]:
    """{pid: CPU of its reaped children (cutime + cstime), ns at clock-tick resolution}: where
    a helper process the worker forked, and waited for, within a call left its CPU time."""
    found = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            found[pid] = (int(fields[13]) + int(fields[14])) * _TICK_NS
        except (OSError, ValueError, IndexError):
            continue
    return found


def thread_cpu_ns(pid: int, tid: int) -> int | None:
    """CPU time of one thread (schedstat's first field, ns), None where unreadable."""
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _has_children_files() -> bool:
    try:
        return os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
    except OSError:
        return False


_CHILDREN_FILES = _has_children_files()


def _children_of(pid: int) -> list[int]:
    """Children of every thread of `pid` (/proc/<pid>/task/<tid>/children), [] if gone.

    NB: a kernel without CONFIG_PROC_CHILDREN has no such file; then the whole process table
    is read (slower, the same answer), never a silent [] that would leave children running."""
    if not _CHILDREN_FILES:
        return [child for child, (ppid, _) in _proc_table().items() if ppid == pid]
    found = []
    for tid in _threads(pid):
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                found.extend(int(x) for x in f.read().split())
        except (OSError, ValueError):
            continue
    return found


def _task_states(pid: int) -> list[bytes]:
    states = []
    for tid in _threads(pid):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                states.append(f.read().rsplit(b")", 1)[1].split()[0])
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
                stack.extend(_children_of(pid))
            running = [p for p in seen if any(s in (b"R", b"S") for s in _task_states(p))]
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
        while any(s in (b"R", b"T") for p in woken for s in _task_states(p)):
            if time.monotonic() > deadline:
                return
            os.sched_yield()


def _threads(pid: int) -> list[str]:
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


# -------------------------------------------------------------------------- isolation


def _bwrap() -> str | None:
    for path in (shutil.which("bwrap"), "/usr/bin/bwrap"):
        if path and os.access(path, os.X_OK):
            return path
    return None


def isolation_modes() -> list[str]:
    forced = os.environ.get("RSI_WORKER_ISOLATION")
    if forced:
        return [forced]
    modes = []
    if _bwrap():
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


def _env(threads: int, home: str) -> dict[str, str]:
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


_SANDBOXES: set[int] = set()  # every sandbox this referee started (their zygotes' pids)


def _memfd(name: str, size: int, sealed: bool = True) -> int:
    """A shared buffer of `size` bytes, sealed against shrinking and growing (confine.py)."""
    if not sealed:
        fd = os.memfd_create(name, 0)
        os.ftruncate(fd, size)
        return fd
    try:
        return confine.sealed_memfd(name, size)
    except (confine.ConfineError, OSError) as exc:
        raise WorkerStartError(f"cannot make a sealed shared buffer: {exc}") from exc


def confinement_missing(report, skipped=(), own_only: bool = False) -> str | None:
    """What a forked worker's report says does not hold (None: all of it holds). Items in
    `skipped` (the tests' private switch) are not required. `own_only`: the worker shares a
    pid namespace with others (uid, process modes), so its filter must let it name no pid but
    its own (confine.py)."""
    if not isinstance(report, dict):
        return "no confinement report"
    problems = []
    if report.get("candidate_modules_in_zygote") != 0:
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


class WorkerProcess:
    """One worker: started, asked to import, called, killed. Every wait has a deadline."""

    def __init__(
        self,
        *,
        framework: str,
        device: str,
        threads: int,
        impl_dir: Path,
        entry: dict,
        in_size: int,
        out_size: int,
        work_dir: Path,
        log_path: Path,
        mode: str,
        startup_timeout_s: float,
        also_visible: tuple[Path, ...] = (),
    ) -> None:
        self.mode, self.impl_dir, self.entry = mode, impl_dir.resolve(), entry
        self.visible = (self.impl_dir, *(p.resolve() for p in also_visible))
        self.framework, self.device, self.threads = framework, device, int(threads)
        self.log_path = log_path
        self.in_size, self.out_size = max(in_size, 1), max(out_size, 1)
        self.unconfined = unconfined()
        # NB: sealed against shrinking and growing before the worker gets them: a worker that
        # truncated one (its fds are in its argv) made the referee die of SIGBUS on its mapping
        sealed = "seal" not in self.unconfined
        self.in_fd, self.out_fd, self.ctl_fd = (
            _memfd(name, size, sealed)
            for name, size in (
                ("rsi-in", self.in_size),
                ("rsi-out", self.out_size),
                ("rsi-ctl", CTL_SIZE),
            )
        )
        self.ctl = mmap.mmap(self.ctl_fd, CTL_SIZE)
        _SEQ.pack_into(self.ctl, REQ_AT, NO_CALL)
        _SEQ.pack_into(self.ctl, DONE_AT, NO_CALL)
        self.in_buf = mmap.mmap(self.in_fd, self.in_size)
        self.out_buf = mmap.mmap(self.out_fd, self.out_size)
        req_r, self.req_w = os.pipe()
        self.resp_r, resp_w = os.pipe()
        os.set_inheritable(req_r, True)
        os.set_inheritable(resp_w, True)
        os.set_inheritable(self.in_fd, True)
        os.set_inheritable(self.out_fd, True)
        os.set_inheritable(self.ctl_fd, True)
        worker_script = Path(__file__).resolve().parent / "worker.py"
        args = {
            "framework": framework,
            "device": device,
            "threads": self.threads,
            "req_fd": req_r,
            "resp_fd": resp_w,
            "in_fd": self.in_fd,
            "out_fd": self.out_fd,
            "ctl_fd": self.ctl_fd,
            "in_size": self.in_size,
            "out_size": self.out_size,
            "own_pid_namespace": mode == "namespaces",
            "unconfined": self.unconfined,
        }
        home = "/tmp"
        argv = [sys.executable, "-I", "-B", str(worker_script), json.dumps(args)]
        cwd = "/"
        cpus = worker_cpus(threads)
        preexec = None
        if mode == "namespaces":
            argv = self._bwrap_argv(work_dir, worker_script) + argv
        elif mode == "uid":
            home_dir = (
                Path(os.environ.get("TMPDIR") or "/tmp") / f"rsi-worker-{os.getpid()}-"
                f"{time.monotonic_ns()}"
            )
            home_dir.mkdir(mode=0o700)
            os.chown(home_dir, WORKER_UID, WORKER_UID)
            self._home = home_dir
            home = cwd = str(home_dir)

            def preexec():
                os.setgroups([])
                os.setgid(WORKER_UID)
                os.setuid(WORKER_UID)
        else:
            home_dir = work_dir / f"home-{time.monotonic_ns()}"
            home_dir.mkdir()
            self._home = home_dir
            home = cwd = str(home_dir)
        log = open(log_path, "ab")  # noqa: SIM115

        def start():
            if cpus:
                try:
                    os.sched_setaffinity(0, cpus)
                except OSError:
                    pass
            if preexec:
                preexec()

        self.worker_env = _env(threads, home)
        self.worker_cpus = cpus
        try:
            self.proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=self.worker_env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=(req_r, resp_w, self.in_fd, self.out_fd, self.ctl_fd),
                start_new_session=True,
                preexec_fn=start,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            self._release()
            raise WorkerStartError(f"cannot start the worker ({mode}): {exc}") from exc
        finally:
            log.close()
            os.close(req_r)
            os.close(resp_w)
        self.pid = self.proc.pid
        _SANDBOXES.add(self.pid)
        self.startup_timeout_s = startup_timeout_s
        self.child_alive = False
        self.confinement: dict | None = None
        try:
            ready = self.recv(startup_timeout_s)
        except WorkerFault as exc:
            self.kill()
            raise WorkerStartError(
                f"worker ({mode}) did not get ready: {exc.detail}; log: {tail(log_path)}"
            ) from exc
        if ready.get("op") != "zygote":
            self.kill()
            raise WorkerStartError(f"worker ({mode}) answered {ready!r} instead of ready")

    def fork_request(self) -> dict:
        """What a forked worker re-applies and protects before any candidate code runs: the
        environment and CPUs it was started with, and (outside a pid namespace, where pids
        are the referee's) the referee, its parent and every sandbox's zygote."""
        protect = []
        if self.mode != "namespaces":
            protect = sorted({os.getpid(), os.getppid(), *_SANDBOXES})
        return {"op": "fork", "env": self.worker_env, "cpus": self.worker_cpus, "protect": protect}

    def fork(self) -> None:
        """A fresh worker forked from the sandbox's pristine zygote (no candidate code yet)."""
        try:
            reply = self.request(self.fork_request(), self.startup_timeout_s)
        except WorkerFault as exc:
            raise WorkerStartError(f"worker fork failed: {exc.detail}") from exc
        if reply.get("op") != "ready":
            raise WorkerStartError(f"worker fork answered {str(reply)[:200]}")
        self.child_alive = True
        self.confinement = reply.get("confined")
        missing = confinement_missing(
            self.confinement, self.unconfined, own_only=self.mode != "namespaces"
        )
        if missing:
            raise WorkerStartError(f"the forked worker is not confined: {missing}")
        # NB: its pid as seen from here (it reports the one in its own pid namespace), found
        # before any candidate code runs: the referee reads its CPU clock around every call
        self.child_pid = _outside_pid(self.pid, reply.get("pid"))
        if self.child_pid is None:
            raise WorkerStartError(f"the forked worker (pid {reply.get('pid')}) is not in /proc")
        # NB: the zygote, as seen from here: every process of the sandbox that is not bwrap's
        # is below it (a subreaper: orphans of the worker's tree are re-parented to it)
        self.zygote_pid = _parent_of(self.child_pid)
        if self.zygote_pid is None:
            raise WorkerStartError("the forked worker's zygote is not in /proc")

    def end_child(self, timeout_s: float) -> None:
        """Ask the worker to exit, wait for the zygote to say so, and check from outside that
        nothing of it is left (a worker that will not end is the candidate's failure)."""
        if not self.child_alive:
            return
        self.child_alive = False
        reply = self.request({"op": "exit"}, timeout_s)
        if reply.get("op") != "ended":
            raise WorkerFault("crash", f"protocol: exit answered {str(reply)[:200]}")
        keep = 2 if self.mode == "namespaces" else 0
        deadline = time.monotonic() + 2.0
        while len(descendants(self.pid)) > keep:
            if time.monotonic() > deadline:
                raise WorkerFault("crash", "processes of the worker outlived it")
            time.sleep(0.005)
        if len(descendants(self.pid)) != keep or self.proc.poll() is not None:
            raise WorkerFault("crash", "the worker took its sandbox down (its zygote is gone)")

    def _bwrap_argv(self, work_dir: Path, worker_script: Path) -> list[str]:
        # NB: confine.py travels with every worker script (worker.py loads it by path)
        argv = [
            _bwrap(),
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
        if self.device != "cpu":
            for dev in sorted(Path("/dev").glob("nvidia*")):
                argv += ["--dev-bind-try", str(dev), str(dev)]
        hidden = [Path(p) for p in _hidden_dirs(work_dir)]
        for path in _python_paths():
            if any(path.is_relative_to(h) for h in hidden):
                argv += ["--ro-bind", str(path), str(path)]
        for path in self.visible:
            argv += ["--ro-bind", str(path), str(path)]
        argv += ["--ro-bind", str(worker_script), str(worker_script)]
        here = Path(__file__).resolve().parent / "confine.py"
        argv += ["--ro-bind", str(here), str(here), "--chdir", "/tmp"]
        return argv

    # ------------------------------------------------------------------------ protocol
    def send(self, doc: dict) -> None:
        body = json.dumps(doc, separators=(",", ":")).encode()
        try:
            os.write(self.req_w, _LEN.pack(len(body)) + body)
        except (BrokenPipeError, OSError) as exc:
            raise WorkerFault("crash", f"the worker is gone ({exc})") from exc

    def recv(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        head = self._read(_LEN.size, deadline)
        (size,) = _LEN.unpack(head)
        if size > MAX_MESSAGE:
            raise WorkerFault("protocol", f"a {size}-byte reply (the limit is {MAX_MESSAGE})")
        body = self._read(size, deadline)
        return parse_reply(body)

    def _read(self, size: int, deadline: float) -> bytes:
        chunks, left = [], size
        while left:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WorkerFault("timeout", "no reply in time; the worker was killed")
            ready, _, _ = select.select([self.resp_r], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(self.resp_r, left)
            if not chunk:
                code = self.proc.poll()
                if code is None:
                    try:
                        code = self.proc.wait(timeout=2)
                    except subprocess.TimeoutExpired:
                        code = None
                how = f"signal {-code}" if code is not None and code < 0 else f"exit {code}"
                raise WorkerFault("crash", f"the worker ended ({how}) without a reply")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def request(self, doc: dict, timeout_s: float) -> dict:
        self.send(doc)
        return self.recv(timeout_s)

    def import_impl(self, timeout_s: float, impl_dir: Path | None = None) -> dict:
        impl = self.impl_dir if impl_dir is None else impl_dir.resolve()
        if impl not in self.visible:
            raise WorkerFault("protocol", f"{impl} is not visible in this sandbox")
        return self.request({"op": "import", "impl_dir": str(impl), "entry": self.entry}, timeout_s)

    def layout(self, header: dict, timeout_s: float) -> None:
        reply = self.request({"op": "layout", "inputs": header}, timeout_s)
        if reply.get("op") != "ok":
            raise WorkerFault("protocol", f"layout answered {str(reply)[:200]}")

    def cpu_ns(self) -> int:
        return tree_cpu_ns(self.pid)

    def kill(self) -> None:
        _SANDBOXES.discard(getattr(self, "pid", None))
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in descendants(self.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.proc.kill()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self._release()

    def _release(self) -> None:
        """Close our ends and buffers, remove the worker's home folder (also after a start
        that failed: nothing the referee made outlives it)."""
        for fd in (self.req_w, self.resp_r, self.in_fd, self.out_fd, self.ctl_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        for buf in (self.in_buf, self.out_buf, self.ctl):
            try:
                buf.close()
            except (BufferError, ValueError):
                pass
        home = getattr(self, "_home", None)
        if home is not None:
            shutil.rmtree(home, ignore_errors=True)


def start_worker(*, attempts: int = 3, **kw) -> WorkerProcess:
    """Start a worker in the strongest isolation that works here; a start that fails (nothing
    of the candidate has run) is retried at most twice more, then is the harness's fault."""
    errors = []
    modes = isolation_modes()
    for attempt in range(attempts):
        for mode in modes:
            try:
                return WorkerProcess(mode=mode, **kw)
            except WorkerStartError as exc:
                errors.append(str(exc))
        if attempt + 1 < attempts:
            time.sleep(0.2)
    raise WorkerStartError("; ".join(errors[-3:]))


def tail(path: Path, limit: int = 2000) -> str | None:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return None
    return text[-limit:] if text else None


# -------------------------------------------------------------------------- input packing


SHIFT_MAX = 4096


def pack_inputs(C, inputs: dict, shift: int = 0) -> tuple[dict, bytes]:
    """(layout header, packed bytes): each array's raw memory span at an aligned offset, the
    first `shift` bytes (a multiple of ALIGN below SHIFT_MAX) left empty.

    NB: where an input sits relative to a page decides whether it 4K-aliases the worker's
    outputs and temporaries, whose addresses differ from one sandbox to the next (ASLR): a
    fixed placement turned into a bias of one arm's sandbox (2x on an A/A run). A shift drawn
    per call makes that an averaged-out effect instead, identical for both arms of a pair."""
    header, parts, at = {}, [], 0
    if shift:
        parts.append(b"\0" * shift)
        at = shift
    for name in sorted(inputs):
        meta = C.describe_input(inputs[name])
        if meta["kind"] == "array":
            span = C.extent_bytes(inputs[name])
            pad = (-at) % ALIGN
            if pad:
                parts.append(b"\0" * pad)
                at += pad
            meta = dict(meta, at=at, span=len(span))
            parts.append(span)
            at += len(span)
        header[name] = meta
    return header, b"".join(parts)


def packed_size(C, inputs: dict) -> int:
    return len(pack_inputs(C, inputs)[1]) + ALIGN


class Call:
    """One judged call: the referee's clock around handing over the input and taking the output.

    `result`: ("ok", raw output bytes, meta), ("raised", error), ("problem", code, detail).
    """

    __slots__ = (
        "elapsed_ns",
        "armed_ns",
        "cpu_ns",
        "cpu_window_ns",
        "helper_cpu_ns",
        "reply",
        "output",
        "inputs_intact",
        "event_ns",
        "cpu_unread",
    )

    def __init__(self):
        self.elapsed_ns = None
        self.armed_ns = 0
        self.cpu_ns = self.cpu_window_ns = self.helper_cpu_ns = None
        self.reply = None
        self.output = None
        self.inputs_intact = None
        self.event_ns = None
        self.cpu_unread = None  # why the call's CPU figures could not be read (None: read)


def timed_call(
    worker: WorkerProcess,
    index: int,
    packed: bytes,
    out_nbytes: int,
    timeout_s: float,
    echo: bool = False,
) -> Call:
    """Hand `packed` to the worker, call, take `out_nbytes` of output: all inside our clock.

    Untimed: the worker is armed for call `index` (it answers, then spins on the control
    buffer). Timed: the input is written, the call published, and we spin until the worker
    publishes the end, then copy the output. Untimed again: its reply (what it returned).
    """
    call = Call()
    n = len(packed)
    if n > worker.in_size or out_nbytes > worker.out_size:
        raise WorkerFault("protocol", "buffers too small for this call")
    # NB: the CPU clocks of the worker's processes (all threads) read where the worker is
    # blocked, before it is armed and after it has answered: another process's clock leaves
    # out the slice its threads are running now (the kernel adds it at the next tick or
    # switch), so a reading taken while the worker spins would miss up to a tick of it
    # NB: of every process below the sandbox's zygote, not only below the worker: a helper it
    # double-forked is re-parented to the zygote (a subreaper) and was missed. The zygote
    # itself sleeps through a call (bwrap's processes above it can get no orphan).
    cpu_pid = getattr(worker, "child_pid", None) if worker.child_alive else None
    zygote = getattr(worker, "zygote_pid", None)
    w0 = time.perf_counter_ns()
    c0 = sandbox_cpu(zygote, cpu_pid) if cpu_pid else None
    # NB: and what is not the calling thread's: helper processes reaped within the call (their
    # parents' cutime) and every other thread or process; on a threads = 1 binding that must
    # be nothing, however slow a busy host makes the call's wall time
    r0 = reaped_cpu_ns(c0) if c0 else None
    m0 = thread_cpu_ns(cpu_pid, cpu_pid) if c0 else None
    arm_sent = time.perf_counter_ns()
    armed = worker.request({"op": "arm", "i": index, "echo": echo}, timeout_s)
    if armed.get("op") != "armed" or armed.get("i") != index:
        raise WorkerFault("crash", f"protocol: arm answered {str(armed)[:200]}")
    in_buf, out_buf, ctl = worker.in_buf, worker.out_buf, worker.ctl
    unpack, clock, pause = _SEQ.unpack_from, time.perf_counter_ns, os.sched_yield
    t0 = clock()
    # NB: the armed worker spins from its reply until t0; on a busy host that can be long (the
    # referee waits for a CPU), and it is CPU time the worker may use: see measure.ArmRun
    call.armed_ns = t0 - arm_sent
    in_buf[:n] = packed
    _SEQ.pack_into(ctl, REQ_AT, index)
    spin_until = t0 + int(SPIN_S * 1e9)
    deadline = t0 + int(timeout_s * 1e9)
    spins = 0
    while unpack(ctl, DONE_AT)[0] != index:
        pause()  # NB: a worker on this CPU gets it back at once (both spin; neither sleeps)
        spins += 1
        if spins & 0x3FF == 0:
            now = clock()
            if now > deadline:
                raise WorkerFault("timeout", "no reply in time; the worker was killed")
            if now > spin_until:
                # NB: a long call: poll, so the referee does not take a core from the worker
                ready, _, _ = select.select([worker.resp_r], [], [], 0.00005)
                if ready:
                    break  # the worker wrote (or died) without publishing: judged below
    output = out_buf[:out_nbytes] if out_nbytes else b""
    t1 = clock()
    call.elapsed_ns = t1 - t0
    reply = worker.recv(max(1.0, timeout_s - (t1 - t0) / 1e9))
    # NB: a figure that cannot be read makes the call's CPU unknown (cpu_unread), never a
    # skipped check: a worker whose main thread exited (pthread_exit) while another thread
    # served the calls never went back to sleep, and its calls went unchecked
    if c0 is not None:
        why = _wait_blocked(cpu_pid)
        c1 = sandbox_cpu(zygote, cpu_pid) if why is None else None
        if why is None and (cpu_pid not in c1 or cpu_pid not in c0):
            why = "the worker's CPU clock could not be read"
        m1 = thread_cpu_ns(cpu_pid, cpu_pid) if why is None else None
        if why is None and (m0 is None or m1 is None):
            why = "the worker's calling thread's CPU could not be read"
        if why is None:
            r1 = reaped_cpu_ns(c1)
            # NB: totals, not per-process differences: a process that ended in the call
            # leaves its clock and shows in its parent's reaped time instead
            call.cpu_ns = max(
                0, sum(c1.values()) - sum(c0.values()) + sum(r1.values()) - sum(r0.values())
            )
            call.cpu_window_ns = clock() - w0
            call.helper_cpu_ns = max(0, call.cpu_ns - (m1 - m0))
        else:
            call.cpu_unread = f"the CPU of call {index} could not be read: {why}"
    if unpack(ctl, DONE_AT)[0] != index:
        raise WorkerFault("crash", f"protocol: reply {str(reply)[:200]} before call {index} ended")
    call.reply = reply
    meta = reply.get("out") if reply.get("op") == "done" and reply.get("i") == index else None
    ok = isinstance(meta, dict) and meta.get("problem") is None and meta.get("nbytes") == out_nbytes
    call.output = output if ok or echo else None
    call.inputs_intact = in_buf[:n] == packed
    if isinstance(reply.get("event_ns"), int):
        call.event_ns = reply["event_ns"]
    return call
