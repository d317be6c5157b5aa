"""A side check: the output blobs of a no-op's state stat'ed by a forked child while this process
checks the sources and the analysis' reads.

A stat is a system call that Python makes with its lock released, but two threads of one
interpreter stat'ing 100,000 paths each take longer than one thread doing both (measured: 0.53 s
against 0.37 s on two cores; each call hands the interpreter's lock over). A child forked after
the state is loaded has the blobs' recorded signatures without being sent them (its memory is
the parent's, copied on write), stats them on the other core and writes back only the hashes
whose signature moved (`suspects`): none, in a no-op.

The child decides nothing. A blob it names is checked again by the parent, one by one, as
before; a child that cannot be started, dies, is killed, or writes anything but a whole
well-formed answer counts as having said nothing, and the parent stats every blob itself. So
the answer is only ever "these, at least, look moved" and never "these are fine" unless the
child said so in full: the ending line carries how many hashes it sent, and a partial or
garbled reply is thrown away.

Forking is done only where it is safe and pays: a process with a single thread (a fork of a
threaded process copies locks another thread may hold; the build server, which has threads,
has its watcher instead), on Linux, with at least `MIN_BLOBS` paths to stat. `RSI_SIDE_CHECK=0`
turns it off; `RSI_SIDE_CHECK=always` forks whatever the count (the tests use it).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from rsi import native
from rsi.sharded import Sharded

# NB: below this many blobs, forking (~5 ms with a 100 MiB heap) costs more than it saves
MIN_BLOBS = 20_000
# NB: of the 256 shards of a sharded mapping (rsi.sharded), the parent checks this many itself
# (`SideCheck.own`) while the child checks the rest: the child also unpickles its shards, and
# the parent's other work (the sources) is the shorter (at 100,000: 0.26 s against 0.30 s)
PARENT_SHARDS = 32
_END = b"end "


def _alone() -> bool:
    """This process runs one thread (a fork copies no lock another thread may hold)."""
    return threading.active_count() == 1


class SideCheck:
    """A running child (`pid`, the read end of its pipe); `result()` waits for it."""

    def __init__(self, pid: int, fd: int, first: int) -> None:
        # NB: None once reaped and closed: a pid or descriptor number may be reused after
        self.pid: int | None = pid
        self.fd: int | None = fd
        self.first = first  # NB: the child's first shard: the parent's are those before

    def own(self, blobs: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
        """(hash, recorded signature) of the blobs the child leaves to the parent."""
        if self.first:
            yield from blobs.shard_items(0, self.first)  # type: ignore[attr-defined]

    def result(self) -> set[str] | None:
        """The hashes the child found moved or missing, or None when its answer cannot be
        used (the caller checks every blob itself)."""
        if self.fd is None:
            return None
        try:
            data = _read_all(self.fd)
        finally:
            self._close()
            status = self._reap()
        if data is None or status != 0:
            return None
        return _parse(data)

    def cancel(self) -> None:
        """Stop the child and reap it (the parent gave up on the plan); nothing once its
        answer was read."""
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass
        self._close()
        self._reap()

    def _close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            _close(fd)

    def _reap(self) -> int | None:
        pid, self.pid = self.pid, None
        return _reap(pid)


def _parse(data: bytes) -> set[str] | None:
    """The hashes of a whole answer ("h\\n" each, then "end N\\n"), else None."""
    if not data.endswith(b"\n"):
        return None
    lines = data[:-1].split(b"\n")
    last = lines.pop()
    if not last.startswith(_END):
        return None
    try:
        count = int(last[len(_END) :])
    except ValueError:
        return None
    if count != len(lines):
        return None
    try:
        return {line.decode("ascii") for line in lines}
    except UnicodeDecodeError:
        return None


def start(cas_root: str, blobs: Mapping[str, Any], logs: Mapping[str, int]) -> SideCheck | None:
    """Fork a child that stats every blob (`blobs`: {hash: recorded signature or None}; `logs`:
    {hash: size}), or None where that is not done (see the module's note)."""
    mode = os.environ.get("RSI_SIDE_CHECK", "")
    if not sys.platform.startswith("linux") or mode == "0":
        return None
    if not _alone():
        return None
    # NB: the C stat loop (rsi.native) checks them over threads in this process: as fast
    # as a child on the other core, with no fork
    if mode != "always" and (len(blobs) + len(logs) < MIN_BLOBS or native.available()):
        return None
    first = PARENT_SHARDS if isinstance(blobs, Sharded) else 0
    try:
        r, w = os.pipe()
    except OSError:  # NB: out of descriptors: the parent checks every blob
        return None
    # NB: no signal between the fork and the child's own handlers: a Ctrl-C must never run
    # the parent's handler (and its unwinding, its exit hooks) in the child
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        pid = os.fork()
    except OSError:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        os.close(r)
        os.close(w)
        return None
    if pid == 0:  # pragma: no cover - the child; its answer is checked by the parent
        code = 1
        try:
            for signum in _HELD:
                signal.signal(signum, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            os.close(r)
            _answer(w, cas_root, blobs, logs, first)
            code = 0
        except BaseException:
            pass
        finally:
            os._exit(code)
    signal.pthread_sigmask(signal.SIG_SETMASK, held)
    os.close(w)
    return SideCheck(pid, r, first)


# NB: the signals a build handles (rsi.interrupt); the child dies of them as a plain process
_HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _answer(
    fd: int, cas_root: str, blobs: Mapping[str, Any], logs: Mapping[str, int], first: int
) -> None:
    """The child's work: the hashes whose blob is missing or not as recorded (from shard
    `first` of a sharded mapping on), written whole."""
    stat_of = os.stat
    out: list[str] = []
    # NB: a sharded mapping shard by shard: no key order, no lookup per key
    items = blobs.shard_items(first) if isinstance(blobs, Sharded) else blobs.items()
    for h, want in items:
        try:
            st = stat_of(f"{cas_root}/{h[:2]}/{h}")
        except OSError:
            out.append(h)
            continue
        if want is None or want != (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns):
            out.append(h)
    for h, size in logs.items():
        try:
            st = stat_of(f"{cas_root}/{h[:2]}/{h}")
        except OSError:
            out.append(h)
            continue
        if st.st_size != size:
            out.append(h)
    view = memoryview("".join(f"{h}\n" for h in out).encode("ascii") + b"end %d\n" % len(out))
    while view:
        view = view[os.write(fd, view) :]


# ------------------------------------------------------------------------------- the sweep
#
# The re-check before export (`rsi.incremental.swept_since_check`) stats every source again
# once the build's actions ran: at 100,000 sources, ~0.2 s of one core. A child forked while
# the plan's check finds the first edited source (the process then has one thread) takes the
# sources whose `hash()` is odd (the child's hashes are the parent's: the same objects, the
# same seed), waits on a pipe until the parent says go (its actions have run), stats them on
# the other core, and writes back the paths not at the signature the state recorded, then
# how many sources it looked at and the XOR of their hashes. The parent stats the even ones
# meanwhile, and takes the answer only if that count and XOR are those of the odd sources it
# holds now: otherwise (or no whole answer, a child dead, killed or not started) it stats
# them itself. As with the blobs, a named path is looked at again by the parent; one the child
# does not name was at its recorded signature when the child looked, after the go.

# NB: below this many sources a fork (~5 ms with a 100 MiB heap) costs more than half a sweep
SWEEP_MIN = 20_000


class Sweep:
    """A forked child waiting for `go()`; `result()` reads its answer."""

    def __init__(self, pid: int, go_fd: int, fd: int) -> None:
        self.pid: int | None = pid
        self.go_fd: int | None = go_fd
        self.fd: int | None = fd

    def go(self) -> bool:
        """Start the child's sweep (False: it cannot be told; the parent stats every source)."""
        fd, self.go_fd = self.go_fd, None
        if fd is None:
            return False
        try:
            return os.write(fd, b"g") == 1
        except OSError:
            return False
        finally:
            os.close(fd)

    def result(self) -> tuple[list[str], int, int] | None:
        """(the paths the child found moved or missing, how many it looked at, the XOR of
        their hashes), or None where its answer cannot be used."""
        if self.fd is None or self.go_fd is not None:
            self.cancel()
            return None
        try:
            data = _read_all(self.fd)
        finally:
            _close(self.fd)
            self.fd = None
            status = _reap(self.pid)
            self.pid = None
        if data is None or status != 0:
            return None
        return _parse_sweep(data)

    def cancel(self) -> None:
        """Stop the child and reap it (nothing once its answer was read)."""
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass
        for name in ("go_fd", "fd"):
            fd = getattr(self, name)
            setattr(self, name, None)
            if fd is not None:
                _close(fd)
        _reap(self.pid)
        self.pid = None


def _read_all(fd: int) -> bytes | None:
    """Everything a child writes to `fd` until it closes it (None: a read failed)."""
    chunks = []
    try:
        while True:
            got = os.read(fd, 1 << 20)
            if not got:
                return b"".join(chunks)
            chunks.append(got)
    except OSError:
        return None


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _reap(pid: int | None) -> int | None:
    if pid is None:
        return None
    while True:
        try:
            _, status = os.waitpid(pid, 0)
        except InterruptedError:  # pragma: no cover - retried by Python since 3.5
            continue
        except ChildProcessError:
            return None
        return os.waitstatus_to_exitcode(status)


def _parse_sweep(data: bytes) -> tuple[list[str], int, int] | None:
    """A whole answer: each path then NUL (no path holds one), then "end N COUNT XOR\\n"."""
    if not data.endswith(b"\n"):
        return None
    cut = data.rfind(b"\0") + 1
    paths, last = data[:cut], data[cut:-1].split(b" ")
    if len(last) != 4 or last[0] != b"end":
        return None
    try:
        named, count, xor = int(last[1]), int(last[2]), int(last[3])
        got = [os.fsdecode(p) for p in paths.split(b"\0")[:-1]]
    except (ValueError, UnicodeDecodeError):
        return None
    if named != len(got):
        return None
    return got, count, xor


def start_sweep(sources: Mapping[str, Any]) -> Sweep | None:
    """Fork the sweep's child over `sources` ({path: entry whose first item is the recorded
    signature or None}), or None where that is not done (see the note above)."""
    mode = os.environ.get("RSI_SIDE_CHECK", "")
    if not sys.platform.startswith("linux") or mode == "0" or not _alone():
        return None
    # NB: the C stat loop (rsi.native) splits the whole sweep over threads itself
    if mode != "always" and (len(sources) < SWEEP_MIN or native.available()):
        return None
    try:
        r, w = os.pipe()
    except OSError:
        return None
    try:
        go_r, go_w = os.pipe()
    except OSError:
        os.close(r)
        os.close(w)
        return None
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        pid = os.fork()
    except OSError:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        for fd in (r, w, go_r, go_w):
            os.close(fd)
        return None
    if pid == 0:  # pragma: no cover - the child; its answer is checked by the parent
        code = 1
        try:
            for signum in _HELD:
                signal.signal(signum, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            # NB: the child lives while the build runs: it must hold no descriptor of the
            # parent's (a lock's flock is released only when every copy is closed)
            _keep_only(go_r, w)
            if os.read(go_r, 1) == b"g":
                _sweep(w, sources)
                code = 0
        except BaseException:
            pass
        finally:
            os._exit(code)
    signal.pthread_sigmask(signal.SIG_SETMASK, held)
    os.close(w)
    os.close(go_r)
    return Sweep(pid, go_w, r)


def _keep_only(a: int, b: int) -> None:
    """Close every descriptor but `a` and `b`, with /dev/null at 0-2 (where a process started
    with those closed holds a lock's file)."""
    try:
        null = os.open(os.devnull, os.O_RDWR)
    except OSError:
        null = -1
    for fd in (0, 1, 2):
        if fd not in (a, b, null):
            if null >= 0:
                os.dup2(null, fd, inheritable=False)
            else:
                _close(fd)
    keep = {0, 1, 2, a, b} if null >= 0 else {a, b}
    try:
        # NB: the open descriptors as listed, not every number up to the limit: without
        # close_range(2), closerange closes one number at a time (2**30 of them: ~100 s)
        listed = [int(n) for n in os.listdir("/proc/self/fd")]
    except (OSError, ValueError):
        top = min(os.sysconf("SC_OPEN_MAX"), 1 << 16)
        listed = list(range(top))
    for fd in listed:
        if fd not in keep:
            _close(fd)


def _sweep(fd: int, sources: Mapping[str, Any]) -> None:
    """The child's work: the odd-hash sources not at their recorded signature, written whole."""
    lstat = os.lstat
    out: list[str] = []
    count = xor = 0
    for path, entry in sources.items():
        h = hash(path)
        if not h & 1:
            continue
        count += 1
        xor ^= h
        try:
            st = lstat(path)
        except OSError:
            out.append(path)
            continue
        sig = entry[0]
        if sig is None or sig != (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns):
            out.append(path)
    body = b"".join(os.fsencode(p) + b"\0" for p in out)
    view = memoryview(body + b"end %d %d %d\n" % (len(out), count, xor))
    while view:
        view = view[os.write(fd, view) :]
