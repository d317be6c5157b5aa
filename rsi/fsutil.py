"""Small file-system primitives with crash-safe semantics (temp file, fsync, rename). A reader must
never meet a half-written file."""

from __future__ import annotations

import errno
import itertools
import json
import os
import shutil
import stat
import threading
import time
from pathlib import Path
from typing import Callable

try:  # NB: the C module itself: hashlib would load OpenSSL (~2 ms of every start)
    from _sha2 import sha256  # type: ignore[import-not-found]  # Python 3.12+
except ImportError:
    try:
        from _sha256 import sha256  # type: ignore[import-not-found,no-redef]
    except ImportError:  # pragma: no cover - NB: a Python built without either
        from hashlib import sha256  # type: ignore[assignment]

from rsi.errors import StoreError


_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words ("a FIFO")."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_regular(path: str | os.PathLike) -> int:
    """A descriptor of `path` for reading, only when it is a regular file. Opened without
    waiting (the open of a FIFO would wait for a writer, for ever) and checked on the
    descriptor itself, so a file swapped meanwhile is seen; anything else (a FIFO, a device
    such as an endless /dev/zero, a folder, a socket) raises OSError(EINVAL) naming it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"not a regular file: it is {file_kind(mode)}", path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str | os.PathLike) -> bytes:
    """The bytes of `path`, a regular file (`open_regular`)."""
    with os.fdopen(open_regular(path), "rb") as f:
        return f.read()


def atomic_write_bytes(
    path: Path,
    data: bytes | list[bytes],
    *,
    fsync: bool = True,
    mode: int | None = None,
    tmp_dir: Path | None = None,
) -> None:
    """Write `data` (bytes, or a list of parts) so that readers see either the old file or
    the whole new one.

    The temporary file goes beside `path`, or into `tmp_dir` (same file system) when readers
    list `path`'s folder and must never meet a temporary there, however the writer dies.
    """
    fd, tmp = create_temp(tmp_dir if tmp_dir is not None else path.parent)
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            if isinstance(data, list):  # NB: parts, written in order, never joined in memory
                f.writelines(data)
            else:
                f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        replace_into(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def replace_into(tmp: str | os.PathLike, path: Path) -> None:
    """Rename `tmp` over `path`, creating `path`'s folder on first use."""
    try:
        os.replace(tmp, path)
    except FileNotFoundError:
        if not os.path.exists(tmp):
            raise
        path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, path)


_counter = itertools.count()


def temp_pid(name: str) -> int | None:
    """The writer's pid in a temporary's name (`.tmp-PID-…`, `scratch-PID-…`), if it has one."""
    parts = name.lstrip(".").split("-")
    try:
        return int(parts[1]) if len(parts) > 2 else None
    except ValueError:
        return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def create_temp(folder: Path) -> tuple[int, str]:
    """A new file in `folder`, named by pid, thread and a counter (unique within this host's
    processes; O_EXCL guards the rest), the folder created on first use. The pid in the name
    lets a later writer or `cache gc` remove what a killed writer left (`temp_pid`)."""
    base = f"{os.fspath(folder)}/.tmp-{os.getpid()}-{threading.get_ident()}-"
    for _ in range(100):
        name = base + str(next(_counter))
        try:
            return os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600), name
        except FileExistsError:
            continue
        except FileNotFoundError:
            os.makedirs(folder, exist_ok=True)
    import tempfile

    return tempfile.mkstemp(dir=folder, prefix=".tmp-")


def store_write_error(path: Path, exc: OSError) -> StoreError:
    return StoreError(
        f"cannot write to the store at {path}: {exc.strerror or exc}",
        hint="free disk space or fix permissions, or point the store elsewhere with --store",
    )


def prune(
    folder: Path, *, keep: int, keep_bytes: int, match: Callable[[str], bool], spare: str
) -> list[str]:
    """Remove the least recently used files of `folder` whose name `match`es beyond `keep`
    of them or `keep_bytes`, never `spare` (the one just written). Returns the names removed."""
    found = []
    try:
        with os.scandir(folder) as it:
            for entry in it:
                if not match(entry.name) or ".tmp" in entry.name:
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                found.append((max(st.st_atime_ns, st.st_mtime_ns), entry.name, st.st_size))
    except OSError:
        return []
    found.sort(reverse=True)
    kept = total = 0
    removed = []
    for _, name, size in found:
        if name == spare or (kept < keep and total + size <= keep_bytes):
            kept += 1
            total += size
            continue
        try:
            os.unlink(folder / name)
            removed.append(name)
        except OSError:
            pass
    return removed


def touch(path: Path) -> None:
    """Mark an entry used now: its access time (what prune orders by, with the modification
    time), leaving the modification time, which says when it was written, as it was."""
    try:
        os.utime(path, ns=(time.time_ns(), os.stat(path).st_mtime_ns))
    except OSError:
        pass


def remove_tree(path: Path) -> None:
    """Remove a folder tree, making read-only folders of inputs writable first."""

    def onerror(func, p, exc_info):  # NB: read-only folders of inputs block unlink for non-root
        try:
            os.chmod(os.path.dirname(p), 0o755)
            os.chmod(p, 0o755)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=onerror)


def scan_dir(folder: str | os.PathLike) -> list[os.DirEntry]:
    """The entries of `folder`; [] when it is absent or not a folder."""
    try:
        with os.scandir(folder) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []


def read_json_object(path: Path) -> dict:
    """A JSON object read from `path`; {} when it is absent, unreadable or not an object."""
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def stat_signature(st: os.stat_result) -> list[int]:
    """What changes whenever a file is replaced or written: inode, size, mtime, ctime."""
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def path_signatures(paths: tuple[Path, ...]) -> list[tuple | None]:
    """Each path's (inode, size, mtime, ctime), None where it is absent: what changes whenever
    one of the files is replaced or written."""
    sigs: list[tuple | None] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            sigs.append(None)
            continue
        sigs.append((st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return sigs


def name_hash(text: str) -> str:
    """The SHA-256 hex of `text` (file-system encoded): a stable file name for a path or an id."""
    return sha256(os.fsencode(text)).hexdigest()
