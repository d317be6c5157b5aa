"""The build server: `rsi build TARGET...` served by a long-lived rsi process, as Bazel's
server serves its client (opt-in: `RSI_SERVER=1`; docs/architecture.md, "The build server").

A plain `rsi build TARGET...` (no option) costs, before it looks at a single file, an
interpreter start and ~80 ms of imports on a small VM, and a build that runs something starts a
sandbox slot (~30 ms) and throws it away at exit. A server keeps all of that between builds:
its imports, its sandbox slots, and the build state and analysis its last build left (kept
in memory under the signatures of their files, rsi.incremental `keep`). The client (this module, run
from the console script before anything heavy is imported) sends its targets and working
folder over a Unix socket and relays what the server's build prints, byte for byte, with the
same exit code. Nothing else changes: the server runs the very function the client would
(`rsi.buildcmd.plain_build`), under the same store and host locks, so another rsi, with or
without a server, sees an ordinary build.

- **On demand.** No server answering means this build runs in the client, as without one, and
  a server is started in the background for the next (a double fork: the client does not wait).
  A server busy with another build answers "busy": that client also builds by itself.
- **Which server.** One per user, interpreter, rsi install and environment (every variable but
  the shell's own bookkeeping): its socket's name is a digest of those (Linux's abstract
  namespace: no file to go stale). Each side checks the other's uid (SO_PEERCRED) and talks
  only to itself.
- **Never stale code.** Before each build the server re-checks the files of every module it has
  imported from outside the standard library, and the installed packages' folders; any change
  and it answers "restart" (the client builds by itself) and exits.
- **Signals.** Ctrl-C or SIGTERM at the client is passed to the server's build, which stops as
  an in-process build stops (exit 130 or 143); a client that goes away stops its build too.
- **Watching** (`RSI_SERVER_WATCH=1`, off by default). The server watches the sources'
  folders and the store's blob folders with inotify (rsi/watch.py) and does not `lstat` a
  source, nor `stat` an output blob, that no event named since its last check. inotify does
  not see a change made through a hard link created after that check (in a folder nobody
  watches), through a memory mapping, or by another machine on a network file system; files
  with two links when last looked at, symlinks, and folders on other than local file systems
  are always stat'ed, but the first case stays a hole, so this is a choice, as Bazel's
  `--watchfs` is.
- **Bounded.** The server exits after `RSI_SERVER_IDLE_S` seconds without a build (600) and
  after a build that leaves it holding more than `RSI_SERVER_MAX_RSS_MB` (2048). Its own
  messages go to `<tmp>/rsi-server-<uid>/<key>.log`, cut back at each start.
- **A server that dies mid-build** (killed, out of memory) leaves the client's build unfinished:
  the client says so and builds by itself; what the server finished is in the cache.
"""

from __future__ import annotations

import os
import sys

# NB: the client's path imports nothing heavier than these C modules (`socket`, `json` and
# `hashlib` cost ~25 ms of start-up on a small VM, more than a served no-op build)
import _socket

try:
    from _sha256 import sha256
except ImportError:  # pragma: no cover - NB: a Python built without it
    from hashlib import sha256

SCHEMA = "rsi.server/1"
# NB: variables a shell changes between two identical commands; every other one is the build's
_VOLATILE = frozenset({"PWD", "OLDPWD", "_", "SHLVL", "COLUMNS", "LINES", "TERM", "RSI_SERVER"})
_HEAD = 5  # NB: a frame: one byte of kind, four of length (big-endian), the payload
MAX_FRAME = 64 << 20


def enabled() -> bool:
    return os.environ.get("RSI_SERVER") == "1"


def server_key() -> str:
    """Which server this client may use: user, group, umask, interpreter, rsi install and
    environment."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = sorted((k, v) for k, v in os.environ.items() if k not in _VOLATILE)
    mask = os.umask(0o022)
    os.umask(mask)
    material = repr((SCHEMA, os.geteuid(), os.getegid(), mask, sys.executable, here, env))
    return sha256(material.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def _address(key: str) -> str:
    return f"\0rsi-server-{key}"


def _log_path(key: str) -> str:
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"rsi-server-{os.geteuid()}", f"{key}.log")


# ---------------------------------------------------------------------------------- frames


def send(sock, kind: bytes, payload: bytes = b"") -> None:
    sock.sendall(kind + len(payload).to_bytes(4, "big") + payload)


def _recv_exact(sock, n: int) -> bytes | None:
    chunks = []
    while n:
        try:
            chunk = sock.recv(min(n, 1 << 20))
        except InterruptedError:
            continue
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def receive(sock) -> tuple[bytes, bytes] | None:
    """(kind, payload), or None when the other side is gone."""
    head = _recv_exact(sock, _HEAD)
    if head is None:
        return None
    kind, size = head[:1], int.from_bytes(head[1:], "big")
    if size > MAX_FRAME:
        return None
    payload = _recv_exact(sock, size) if size else b""
    return None if payload is None else (kind, payload)


def peer_uid(sock) -> int:
    """The uid of the process at the other end (SO_PEERCRED: pid, uid, gid as C ints)."""
    creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    return int.from_bytes(creds[4:8], sys.byteorder)


# ---------------------------------------------------------------------------------- client


def via_server(targets: list[str]) -> int | None:
    """This build's exit code as the server gave it, or None: build in this process."""
    key = server_key()
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        try:
            sock.connect(_address(key))
        except OSError:
            _spawn(key)
            return None
        try:
            if peer_uid(sock) != os.geteuid():
                return None  # NB: someone else holds the name: never talk to it
            # NB: the working folder, then the targets, NUL-separated (neither can hold one)
            header = "\0".join([os.getcwd(), *targets])
            send(sock, b"h", header.encode("utf-8", "surrogateescape"))
        except OSError:
            return None
        return _relay(sock)
    finally:
        sock.close()


def _relay(sock) -> int | None:
    import signal

    def forward(signum: int, frame: object) -> None:
        try:
            send(sock, b"i", str(signum).encode())
        except OSError:
            pass

    previous = {
        sig: signal.signal(sig, forward)
        for sig in (signal.SIGINT, signal.SIGTERM)
        if signal.getsignal(sig) is not signal.SIG_IGN
    }
    try:
        while True:
            try:
                got = receive(sock)
            except OSError:
                got = None
            if got is None:
                sys.stdout.flush()
                sys.stderr.write(
                    "rsi: the build server ended during this build; building without it "
                    "(what it finished is in the cache)\n"
                )
                sys.stderr.flush()
                return None
            kind, payload = got
            if kind in (b"o", b"e"):
                stream = sys.stdout if kind == b"o" else sys.stderr
                stream.buffer.write(payload)
                stream.flush()
            elif kind == b"x":
                return int(payload)
            else:  # NB: b"b" busy, b"r" restarting: build here
                return None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _spawn(key: str) -> None:
    """Start a server for `key` in the background (a double fork: nothing to wait for)."""
    try:
        log = _log_path(key)
        os.makedirs(os.path.dirname(log), mode=0o700, exist_ok=True)
        _prune_logs(os.path.dirname(log))
        pid = os.fork()
    except OSError:
        return
    if pid:
        try:
            os.waitpid(pid, 0)
        except OSError:
            pass
        return
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.closerange(3, 1 << 16)
        # NB: -P: not the working folder first on sys.path (a workspace's queue.py must not
        # shadow the standard library's); PYTHONPATH stays, as it is part of the key
        os.execv(sys.executable, [sys.executable, "-P", "-m", "rsi.server", key])
    finally:
        os._exit(127)


def _prune_logs(folder: str, keep_s: float = 86400.0) -> None:
    """Servers' logs untouched for a day (one per environment ever served) are removed."""
    import time

    try:
        names = os.listdir(folder)
    except OSError:
        return
    now = time.time()
    for name in names:
        path = os.path.join(folder, name)
        try:
            if name.endswith(".log") and now - os.stat(path).st_mtime > keep_s:
                os.unlink(path)
        except OSError:
            pass


# ---------------------------------------------------------------------------------- server


class _Stream:
    """sys.stdout/sys.stderr of a served build: every write goes to the client as a frame; a
    client gone means the writes go nowhere (its build is being stopped)."""

    def __init__(self, conn, kind: bytes) -> None:
        self._conn, self._kind = conn, kind
        self.buffer = self
        self.encoding = "utf-8"
        self.errors = "replace"

    def write(self, data) -> int:
        raw = data.encode("utf-8", "replace") if isinstance(data, str) else bytes(data)
        if raw:
            try:
                send(self._conn, self._kind, raw)
            except OSError:
                pass
        return len(data)

    def flush(self) -> None:
        return None

    def isatty(self) -> bool:
        return False  # NB: no progress line through the server; the report is the same

    def fileno(self) -> int:
        import io

        raise io.UnsupportedOperation("a served build's stream has no descriptor")

    def writable(self) -> bool:
        return True


def _loaded_files() -> dict[str, tuple[int, ...]]:
    """(device, inode, size, mtime, ctime) of the file of every module imported from outside
    the standard library, and of the installed packages' folders: never less than the build
    state's signature (a same-size rewrite with its mtime put back still moves the ctime)."""
    stdlib = (os.path.dirname(os.__file__) + os.sep,)
    found: dict[str, tuple[int, ...]] = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not path or path.startswith(stdlib) and "site-packages" not in path:
            continue
        try:
            st = os.stat(path)
        except OSError:
            found[path] = (0, 0, 0, 0, 0)
            continue
        found[path] = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    for entry in sys.path:
        if entry.endswith(("site-packages", "dist-packages")):
            try:
                st = os.stat(entry)
                found[entry] = (st.st_dev, st.st_ino, 0, st.st_mtime_ns, st.st_ctime_ns)
            except OSError:
                pass
    return found


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)
    except (OSError, ValueError, IndexError):
        return 0.0


def serve(key: str) -> int:
    import queue
    import signal
    import socket
    import threading
    import time

    idle_s = float(os.environ.get("RSI_SERVER_IDLE_S", "600"))
    max_rss = float(os.environ.get("RSI_SERVER_MAX_RSS_MB", "2048"))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(_address(key))
    except OSError:
        return 0  # NB: another server has the name already
    listener.listen(16)

    def say(msg: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} rsi server {os.getpid()}: {msg}", flush=True)

    say(f"serving {key} (idle exit after {idle_s:g} s)")
    # NB: what a build needs, imported once; a build's own imports stay loaded after it
    from rsi import analysis_cache, buildcmd, incremental  # noqa: F401
    from rsi.build import build as _  # noqa: F401

    # NB: the build state and the analysis each build leaves are kept in memory for the next;
    # with RSI_SERVER_WATCH=1 the sources' folders are watched too, and a source no inotify
    # event named is not stat'ed again (opt-in: inotify misses a change made through a hard
    # link created after the last check, rsi/watch.py)
    analysis_cache.keeping = True
    if os.environ.get("RSI_SERVER_WATCH") == "1":
        try:
            from rsi.watch import Watcher

            incremental.watcher = Watcher()
        except (OSError, AttributeError) as exc:
            say(f"no inotify ({exc}): every source is stat'ed")

    stop: list[int] = []
    # NB: SIGTERM ends the server between builds; a SIGINT there is a client's Ctrl-C that
    # came after its build ended, and is dropped (the server has no terminal of its own)
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    busy = threading.Lock()
    work: queue.Queue = queue.Queue()

    def accept() -> None:
        # NB: a client that comes while a build runs is told "busy" at once and builds by
        # itself, as it would without a server: builds are never queued behind each other
        while True:
            try:
                conn, _addr = listener.accept()
            except OSError:
                return
            try:
                if peer_uid(conn) != os.geteuid():
                    conn.close()
                    continue
                conn.settimeout(10.0)
                got = receive(conn)
                conn.settimeout(None)
            except OSError:
                conn.close()
                continue
            if got is None or got[0] != b"h":
                conn.close()
                continue
            if not busy.acquire(blocking=False):
                send_quietly(conn, b"b")
                conn.close()
                continue
            work.put((conn, got[1]))

    threading.Thread(target=accept, name="rsi-server-accept", daemon=True).start()
    known = _loaded_files()
    last = time.monotonic()
    while not stop:
        try:
            conn, header = work.get(timeout=1.0)
        except queue.Empty:
            if time.monotonic() - last > idle_s:
                say("idle: exiting")
                break
            continue
        with conn:
            try:
                now = _loaded_files()
                if any(now.get(path) != sig for path, sig in known.items()):
                    say("code or installed packages changed: exiting")
                    send_quietly(conn, b"r")
                    break
                cwd, *targets = header.decode("utf-8", "surrogateescape").split("\0")
                code = _serve_one(conn, {"cwd": cwd, "targets": targets}, say)
                send_quietly(conn, b"x", str(code).encode())
            finally:
                last = time.monotonic()
                busy.release()
        # NB: only the modules this build imported first are added, as they are now: a file
        # loaded before is held to its signature at load, never to one taken after the build
        # (a rewrite landing between the client's exit and that snapshot went unseen, and the
        # next build was served with the old code)
        for path, sig in _loaded_files().items():
            known.setdefault(path, sig)
        if _rss_mb() > max_rss:
            say(f"holding {_rss_mb():.0f} MiB after a build (> {max_rss:g}): exiting")
            break
    listener.close()
    return 0


def send_quietly(conn, kind: bytes, payload: bytes = b"") -> None:
    try:
        send(conn, kind, payload)
    except OSError:
        pass


def _serve_one(conn, request: dict, say) -> int:
    """Run one client's build here, its output to it; its signals (or its going away)
    interrupt the build as they would interrupt it in the client."""
    import signal
    import threading

    from rsi.buildcmd import plain_build

    targets = [str(t) for t in request.get("targets") or []]
    cwd = str(request.get("cwd") or "/")
    try:
        os.chdir(cwd)
    except OSError as exc:
        send_quietly(conn, b"e", f"rsi: error: cannot enter {cwd}: {exc.strerror}\n".encode())
        return 2
    done = threading.Event()

    def listen() -> None:
        # NB: the client's Ctrl-C or SIGTERM, or its end (EOF), stops its build
        while not done.is_set():
            try:
                got = receive(conn)
            except OSError:
                got = None
            if done.is_set():
                return
            signum = signal.SIGINT
            if got is not None:
                if got[0] != b"i":
                    continue
                try:
                    signum = signal.Signals(int(got[1]))
                except ValueError:
                    continue
            os.kill(os.getpid(), signum)
            if got is None:
                return

    watcher = threading.Thread(target=listen, name="rsi-server-client", daemon=True)
    real = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Stream(conn, b"o"), _Stream(conn, b"e")  # type: ignore[assignment]
    watcher.start()
    try:
        return plain_build(targets)
    except KeyboardInterrupt:
        return 130  # NB: a signal between builds' handlers: the build had not begun
    except Exception as exc:  # noqa: BLE001 - NB: a server reports, never dies, on one build
        say(f"build failed inside the server: {exc!r}")
        send_quietly(conn, b"e", f"rsi: error: {type(exc).__name__}: {exc}\n".encode())
        return 1
    finally:
        done.set()
        sys.stdout, sys.stderr = real


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1]))
