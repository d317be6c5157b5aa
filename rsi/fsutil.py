"""Small file-system primitives with crash-safe semantics (temp file, fsync, rename)."""

from __future__ import annotations

import itertools
import os
import tempfile
import threading
from pathlib import Path

from rsi.errors import StoreError


def atomic_write_bytes(
    path: Path,
    data: bytes,
    *,
    fsync: bool = True,
    mode: int | None = None,
    tmp_dir: Path | None = None,
) -> None:
    """Write `data` so that readers see either the old file or the whole new one.

    The temporary file goes beside `path`, or into `tmp_dir` (same file system) when readers
    list `path`'s folder and must never meet a temporary there, however the writer dies.
    """
    fd, tmp = create_temp(tmp_dir if tmp_dir is not None else path.parent)
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
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
    return tempfile.mkstemp(dir=folder, prefix=".tmp-")


def store_write_error(path: Path, exc: OSError) -> StoreError:
    return StoreError(
        f"cannot write to the store at {path}: {exc.strerror or exc}",
        hint="free disk space or fix permissions, or point the store elsewhere with --store",
    )
