"""Confinement primitives for processes that run candidate code: non-dumpable, sealed shared
buffers, no capabilities, and a seccomp filter that keeps a worker's hands off its neighbours.

Stdlib + ctypes only, Linux only; imported by the referee side (referee.py, multirank.py) and
loaded by path by the workers (worker.py, mr_worker.py), so it must never import rsi, rules or
_common, and never anything a sandbox lacks. Every function either does what it says or says
(False / ConfineError) that it could not: a caller must not judge on a confinement it lacks.

API:
- `no_dump()`: PR_SET_DUMPABLE 0. A same-uid process without CAP_SYS_PTRACE over our user
  namespace can then neither ptrace us, process_vm_readv/writev us, nor open /proc/<pid>/mem.
  Inherited over fork (a forked worker is non-dumpable too), reset by execve.
- `seal(fd)`: F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL on a memfd: nobody (the worker
  through its inherited fd or /proc/self/fd included) can ftruncate it, so a mapping of it can
  never fault (SIGBUS) in the referee. Writes stay allowed: the referee writes inputs into it.
- `sealed_memfd(name, size) -> fd`: memfd_create(MFD_ALLOW_SEALING | MFD_CLOEXEC), sized, sealed.
- `drop_caps()`, `effective_caps()`: capset to nothing; the effective set (capget, so it works
  where /proc is empty, as in the bwrap sandbox). Non-dumpable does not stop a process that
  holds CAP_SYS_PTRACE in the owning user namespace: a worker must run with CapEff == 0.
- `seccomp_supported()`, `install_seccomp(protect_pids, protect_pgids, own_pid=None,
  own_only=False)`: a classic BPF filter built here (x86_64 and aarch64; PR_SET_NO_NEW_PRIVS
  first), installed for the calling thread and everything it later forks. It refuses with EPERM:
    * always: ptrace, process_vm_readv/writev, pidfd_getfd, pidfd_send_signal, kcmp,
      process_madvise, process_mrelease, any syscall of a foreign ABI (i386 int 0x80, x32);
    * setpriority and ioprio_set on a process group, a uid, or a protected pid (a renice of
      the zygote would be inherited by every later arm); on any other one process, allowed;
    * kill, tkill, tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo aimed at a negative pid (-1,
      any process group) other than -own_pid, or at a protected pid / -protected pgid;
    * sched_setaffinity/setparam/setscheduler/setattr, prlimit64, migrate_pages, move_pages
      aimed at a protected pid (0, the caller itself, stays allowed);
    * fcntl F_SETOWN aimed as a signal may not be (a file's owner gets the F_SETSIG signal on
      O_ASYNC I/O, SIGSTOP and SIGKILL included); F_SETOWN_EX, ioctl FIOSETOWN/SIOCSPGRP.
  With `own_only` (where the worker shares a pid namespace with processes it was not told
  about: the other arm's worker, a peer rank, another action's), every syscall of the last
  four items and pidfd_open may name only the caller itself: pid 0, own_pid or -own_pid
  (tgkill/rt_tgsigqueueinfo: thread group own_pid; setpriority/ioprio_set: one process, 0 or
  own_pid). A pid it cannot name it cannot signal, stop, renice, re-pin or limit. The price: a
  process the worker forks cannot signal itself or be signalled by pid (only through the
  worker's process group, kill(0)).
  Pids are compared on their low 32 bits, as the kernel reads a pid_t. Raises ConfineError
  where the filter cannot be built or installed; returns nothing.
- `confine_worker(protect, own_pid, skip=(), own_only=False) -> dict`: all of the above for a
  freshly forked worker or rank, before any candidate code (capabilities dropped, non-dumpable,
  the filter), returning what holds as the report the referee checks (confinement_missing):
  cap_eff, dumpable, seccomp, signals ("own" or "unprotected pids"), or the *_error of each.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import platform
import struct

__all__ = [
    "ConfineError",
    "no_dump",
    "is_dumpable",
    "seal",
    "sealed_memfd",
    "seals_of",
    "drop_caps",
    "effective_caps",
    "seccomp_supported",
    "install_seccomp",
    "seccomp_mode",
    "confine_worker",
]


class ConfineError(Exception):
    """A confinement this host or process cannot provide (the caller must not judge)."""


_libc = None


def _c():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


PR_SET_DUMPABLE, PR_GET_DUMPABLE = 4, 3
PR_GET_SECCOMP, PR_SET_SECCOMP = 21, 22
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_MODE_FILTER = 2


def _prctl(option: int, arg: int = 0) -> int:
    res = _c().prctl(
        option, ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)
    )
    if res < 0:
        err = ctypes.get_errno()
        raise ConfineError(f"prctl({option}) failed: {os.strerror(err)}")
    return res


def no_dump() -> None:
    """Mark this process non-dumpable (raises ConfineError where that fails)."""
    _prctl(PR_SET_DUMPABLE, 0)


def is_dumpable() -> bool:
    return _prctl(PR_GET_DUMPABLE) != 0


# ------------------------------------------------------------------------------ memfd seals

F_ADD_SEALS = getattr(fcntl, "F_ADD_SEALS", 1033)
F_GET_SEALS = getattr(fcntl, "F_GET_SEALS", 1034)
F_SEAL_SEAL = getattr(fcntl, "F_SEAL_SEAL", 0x1)
F_SEAL_SHRINK = getattr(fcntl, "F_SEAL_SHRINK", 0x2)
F_SEAL_GROW = getattr(fcntl, "F_SEAL_GROW", 0x4)
SIZE_SEALS = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL


def seal(fd: int) -> None:
    """Fix the size of a memfd for good (it must have been made with MFD_ALLOW_SEALING)."""
    try:
        fcntl.fcntl(fd, F_ADD_SEALS, SIZE_SEALS)
    except OSError as exc:
        raise ConfineError(f"cannot seal memfd {fd}: {exc}") from exc
    if seals_of(fd) & SIZE_SEALS != SIZE_SEALS:
        raise ConfineError(f"memfd {fd} did not keep its seals")


def seals_of(fd: int) -> int:
    try:
        return fcntl.fcntl(fd, F_GET_SEALS)
    except OSError:
        return 0


def sealed_memfd(name: str, size: int) -> int:
    """A close-on-exec memfd of `size` bytes (at least 1) whose size nobody can change."""
    flags = getattr(os, "MFD_ALLOW_SEALING", 2) | getattr(os, "MFD_CLOEXEC", 1)
    fd = os.memfd_create(name, flags)
    try:
        os.ftruncate(fd, max(int(size), 1))
        seal(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


# ------------------------------------------------------------------------------ capabilities

_CAP_V3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def effective_caps() -> int:
    """This thread's effective capability set as a bit mask (capget)."""
    header, data = _CapHeader(_CAP_V3, 0), (_CapData * 2)()
    if _c().capget(ctypes.byref(header), data) != 0:
        raise ConfineError(f"capget failed: {os.strerror(ctypes.get_errno())}")
    return data[0].effective | (data[1].effective << 32)


def drop_caps() -> None:
    """Effective, permitted and inheritable sets emptied (for good: permitted cannot regrow)."""
    header, data = _CapHeader(_CAP_V3, 0), (_CapData * 2)()
    if _c().capset(ctypes.byref(header), data) != 0:
        raise ConfineError(f"capset failed: {os.strerror(ctypes.get_errno())}")
    try:
        _c().prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL (best effort)
    except (OSError, AttributeError):
        pass
    if effective_caps() != 0:
        raise ConfineError("capabilities are still effective after capset")


# ------------------------------------------------------------------------------ seccomp

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_BIT = 0x40000000

# name -> (x86_64, aarch64)
_NR = {
    "kill": (62, 129),
    "tkill": (200, 130),
    "tgkill": (234, 131),
    "rt_sigqueueinfo": (129, 138),
    "rt_tgsigqueueinfo": (297, 240),
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "kcmp": (312, 272),
    "pidfd_send_signal": (424, 424),
    "pidfd_open": (434, 434),
    "pidfd_getfd": (438, 438),
    "process_madvise": (440, 440),
    "process_mrelease": (448, 448),
    "setpriority": (141, 140),
    "ioprio_set": (251, 30),
    "sched_setparam": (142, 118),
    "sched_setscheduler": (144, 119),
    "sched_setaffinity": (203, 122),
    "sched_setattr": (314, 274),
    "prlimit64": (302, 261),
    "migrate_pages": (256, 238),
    "move_pages": (279, 239),
    "fcntl": (72, 25),
    "ioctl": (16, 29),
}
DENIED = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "pidfd_send_signal",
    "pidfd_getfd",
    "process_madvise",
    "process_mrelease",
)
SIGNALS = ("kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")
# (which, who): allowed only for one process (PRIO_PROCESS 0 / IOPRIO_WHO_PROCESS 1) that is
# not protected; a process group or a whole uid (the zygote's too) is refused
WHICH_WHO = {"setpriority": 0, "ioprio_set": 1}
PID_TARGETED = (
    "sched_setparam",
    "sched_setscheduler",
    "sched_setaffinity",
    "sched_setattr",
    "prlimit64",
    "migrate_pages",
    "move_pages",
)
# NB: a file's owner is signalled on I/O (O_ASYNC) with the signal F_SETSIG picks, SIGSTOP and
# SIGKILL included, and the kernel lets a same-uid (or root) owner be any pid: F_SETOWN names a
# pid or group like kill does; F_SETOWN_EX, FIOSETOWN and SIOCSPGRP pass it behind a pointer a
# filter cannot read, so they are refused outright
F_SETOWN, F_SETOWN_EX = 8, 15
OWNER_IOCTLS = (0x8901, 0x8902)  # FIOSETOWN, SIOCSPGRP

_LD_W_ABS, _JEQ, _JSET, _JGE, _RET = 0x20, 0x15, 0x45, 0x35, 0x06
RET_ALLOW = 0x7FFF0000
RET_EPERM = 0x00050000 | 1
_OFF_NR, _OFF_ARCH, _OFF_ARG0, _OFF_ARG1, _OFF_ARG2 = 0, 4, 16, 24, 32


def _arch() -> str | None:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine) if machine else None


def seccomp_mode() -> int | None:
    """0 (none), 1 (strict) or 2 (filter) for this thread; None where unknown."""
    try:
        return _prctl(PR_GET_SECCOMP)
    except ConfineError:
        return None


def seccomp_supported() -> bool:
    """Whether install_seccomp can work here: a known arch and a kernel with seccomp."""
    return _arch() in AUDIT_ARCH and seccomp_mode() is not None


def build_filter(
    protect_pids,
    protect_pgids,
    own_pid: int | None = None,
    arch: str | None = None,
    own_only: bool = False,
) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) instructions (exposed for tests)."""
    arch = arch or _arch()
    if arch not in AUDIT_ARCH:
        raise ConfineError(f"no seccomp filter for architecture {arch!r}")
    if own_only:
        if not own_pid or int(own_pid) <= 0:
            raise ConfineError("an own-pid-only filter needs the caller's pid")
        return _assemble(_own_only_program(arch, int(own_pid)))
    col = 0 if arch == "x86_64" else 1
    pids = sorted({int(p) & 0xFFFFFFFF for p in protect_pids if int(p) > 0})
    negs = sorted({(-int(g)) & 0xFFFFFFFF for g in protect_pgids if int(g) > 0})
    # Symbolic program: ("ld", off) / ("jeq"|"jset"|"jge", k, true_label, false_label) /
    # ("ret", k) / ("label", name). Labels resolve to relative jumps below.
    prog = _prologue(arch, col)
    for name in SIGNALS:
        prog.append(("jeq", _NR[name][col], "signal", None))
    for name in PID_TARGETED:
        prog.append(("jeq", _NR[name][col], "pid", None))
    for name in WHICH_WHO:
        prog.append(("jeq", _NR[name][col], f"which_{name}", None))
    prog += _owner_dispatch(col)
    prog.append(("ret", RET_ALLOW))
    for name, process in WHICH_WHO.items():
        prog += [("label", f"which_{name}"), ("ld", _OFF_ARG0), ("jeq", process, None, "deny")]
        prog.append(("ld", _OFF_ARG1))
        prog += [("jeq", k, "deny", None) for k in pids]
        prog.append(("ret", RET_ALLOW))
    prog += _owner_commands()
    # F_SETOWN's pid or -group (arg 2), judged as a signal's target is
    prog += [("label", "owner"), ("ld", _OFF_ARG2)]
    if own_pid:
        prog.append(("jeq", (-int(own_pid)) & 0xFFFFFFFF, "allow", None))
    prog.append(("jset", 0x80000000, "deny", None))
    prog += [("jeq", k, "deny", None) for k in pids]
    prog.append(("ret", RET_ALLOW))
    prog += [("label", "signal"), ("ld", _OFF_ARG0)]
    if own_pid:
        prog.append(("jeq", (-int(own_pid)) & 0xFFFFFFFF, "allow", None))
    prog.append(("jset", 0x80000000, "deny", None))  # -1 and every process group
    for k in negs:
        prog.append(("jeq", k, "deny", None))
    prog.append(("label", "pid"))
    prog.append(("ld", _OFF_ARG0))
    for k in pids:
        prog.append(("jeq", k, "deny", None))
    prog += [("label", "allow"), ("ret", RET_ALLOW), ("label", "deny"), ("ret", RET_EPERM)]
    return _assemble(prog)


def _prologue(arch: str, col: int) -> list[tuple]:
    """What both filters start with: a foreign ABI (and x32) is refused, and so is every
    syscall of the always-denied list."""
    prog: list[tuple] = [
        ("ld", _OFF_ARCH),
        ("jeq", AUDIT_ARCH[arch], None, "deny"),
        ("ld", _OFF_NR),
    ]
    if arch == "x86_64":
        prog.append(("jge", X32_BIT, "deny", None))
    for name in DENIED:
        prog.append(("jeq", _NR[name][col], "deny", None))
    return prog


def _own_only_program(arch: str, own_pid: int) -> list[tuple]:
    """The symbolic program of an own_only filter (see the module docstring): the same
    always-denied list, and every pid-naming syscall allowed only at 0, own_pid, -own_pid."""
    col = 0 if arch == "x86_64" else 1
    own, neg = own_pid & 0xFFFFFFFF, (-own_pid) & 0xFFFFFFFF
    prog = _prologue(arch, col)
    for name in (*SIGNALS, *PID_TARGETED, "pidfd_open"):
        prog.append(("jeq", _NR[name][col], "own", None))
    for name in WHICH_WHO:
        prog.append(("jeq", _NR[name][col], f"which_{name}", None))
    prog += _owner_dispatch(col)
    prog.append(("ret", RET_ALLOW))
    for name, process in WHICH_WHO.items():
        prog += [("label", f"which_{name}"), ("ld", _OFF_ARG0), ("jeq", process, None, "deny")]
        prog += [("ld", _OFF_ARG1), ("jeq", 0, "allow", None), ("jeq", own, "allow", "deny")]
    prog += _owner_commands()
    prog += [("label", "owner"), ("ld", _OFF_ARG2), ("jeq", 0, "allow", None)]
    prog += [("jeq", own, "allow", None), ("jeq", neg, "allow", "deny")]
    # NB: kill(0) and kill(-own) reach the worker's own process group (it called setsid):
    # its own helpers, which a forked child cannot otherwise be signalled through
    prog += [("label", "own"), ("ld", _OFF_ARG0), ("jeq", 0, "allow", None)]
    prog += [("jeq", own, "allow", None), ("jeq", neg, "allow", "deny")]
    prog += [("label", "allow"), ("ret", RET_ALLOW), ("label", "deny"), ("ret", RET_EPERM)]
    return prog


def _owner_dispatch(col: int) -> list[tuple]:
    return [("jeq", _NR["fcntl"][col], "fcntl", None), ("jeq", _NR["ioctl"][col], "ioctl", None)]


def _owner_commands() -> list[tuple]:
    """fcntl: F_SETOWN_EX refused, F_SETOWN to the "owner" label (the caller's own check of
    arg 2); ioctl: FIOSETOWN, SIOCSPGRP refused; every other command allowed."""
    prog: list[tuple] = [("label", "fcntl"), ("ld", _OFF_ARG1), ("jeq", F_SETOWN_EX, "deny", None)]
    prog += [("jeq", F_SETOWN, "owner", None), ("ret", RET_ALLOW), ("label", "ioctl")]
    prog.append(("ld", _OFF_ARG1))
    prog += [("jeq", k, "deny", None) for k in OWNER_IOCTLS]
    prog.append(("ret", RET_ALLOW))
    return prog


def _assemble(prog: list[tuple]) -> list[tuple[int, int, int, int]]:
    """Resolve a symbolic program's labels into relative jumps."""
    at, labels = 0, {}
    for ins in prog:
        if ins[0] == "label":
            labels[ins[1]] = at
        else:
            at += 1
    out, at = [], 0
    for ins in prog:
        if ins[0] == "label":
            continue
        if ins[0] == "ld":
            out.append((_LD_W_ABS, 0, 0, ins[1]))
        elif ins[0] == "ret":
            out.append((_RET, 0, 0, ins[1]))
        else:
            code = {"jeq": _JEQ, "jset": _JSET, "jge": _JGE}[ins[0]]
            jt = 0 if ins[2] is None else labels[ins[2]] - at - 1
            jf = 0 if ins[3] is None else labels[ins[3]] - at - 1
            if not (0 <= jt <= 255 and 0 <= jf <= 255):
                raise ConfineError("seccomp filter too long (too many protected pids)")
            out.append((code, jt, jf, ins[1] & 0xFFFFFFFF))
        at += 1
    return out


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def install_seccomp(
    protect_pids, protect_pgids=(), own_pid: int | None = None, own_only: bool = False
) -> None:
    """Install the filter (see the module docstring) on the calling thread and its future
    children. Call it single-threaded (right after fork): other threads are not covered.
    Raises ConfineError where it cannot be installed."""
    program = build_filter(protect_pids, protect_pgids, own_pid, own_only=own_only)
    filters = (_SockFilter * len(program))(*[_SockFilter(*ins) for ins in program])
    fprog = _SockFprog(len(program), ctypes.cast(filters, ctypes.POINTER(_SockFilter)))
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    res = _c().prctl(
        PR_SET_SECCOMP,
        ctypes.c_ulong(SECCOMP_MODE_FILTER),
        ctypes.byref(fprog),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
    )
    if res != 0:
        raise ConfineError(f"seccomp filter refused: {os.strerror(ctypes.get_errno())}")
    if seccomp_mode() != SECCOMP_MODE_FILTER:
        raise ConfineError("seccomp filter not in force after installing it")


def pack_filter(program) -> bytes:
    """The filter's bytes (struct sock_filter array), for tests and logs."""
    return b"".join(struct.pack("<HBBI", *ins) for ins in program)


def confine_worker(protect, own_pid: int, skip=(), own_only: bool = False) -> dict:
    """Confine the calling (freshly forked, single-threaded) worker or rank before any
    candidate code: no capabilities, non-dumpable, the seccomp filter protecting `protect`
    (as pids and process groups), or with `own_only` naming nothing but itself. Returns what
    holds; a step that failed shows as its *_error and a missing item, never an exception.
    `skip` (tests only, the referee's private switch) names steps to leave out."""
    report: dict = {}
    skip = set(skip or ())
    own_only = own_only and "own_only" not in skip
    try:
        if "caps" not in skip:
            drop_caps()
        report["cap_eff"] = effective_caps()
    except ConfineError as exc:
        report["cap_error"] = str(exc)[:200]
    try:
        if "dump" not in skip:
            no_dump()
        report["dumpable"] = is_dumpable()
    except ConfineError as exc:
        report["dump_error"] = str(exc)[:200]
    pids = [int(p) for p in protect if isinstance(p, int)]
    try:
        if "seccomp" not in skip:
            install_seccomp(pids, pids, own_pid=own_pid, own_only=own_only)
            report["signals"] = "own" if own_only else "unprotected pids"
        report["seccomp"] = seccomp_mode()
    except ConfineError as exc:
        report["seccomp_error"] = str(exc)[:200]
    return report
