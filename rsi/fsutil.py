"""Small file-system primitives with crash-safe semantics (temp file, fsync, rename)."""

from __future__ import annotations

import itertools
import os
import tempfile
import threading
from pathlib import Path

from rsi.errors import StoreError


def atomic_write_bytes(
    path: Path, data: bytes, *, fsync: bool = True, mode: int | None = None
) -> None:
    """Write `data` so that readers see either the old file or the whole new one."""
    fd, tmp = _create_temp(path.parent)
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


_counter = itertools.count()


def _create_temp(folder: Path) -> tuple[int, str]:
    """A new file beside the target, named by pid, thread and a counter (unique within this
    host's processes; O_EXCL guards the rest), the folder created on first use."""
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
