"""Small file-system primitives with crash-safe semantics (temp file, fsync, rename)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from rsi.errors import StoreError


def atomic_write_bytes(
    path: Path, data: bytes, *, fsync: bool = True, mode: int | None = None
) -> None:
    """Write `data` so that readers see either the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
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


def store_write_error(path: Path, exc: OSError) -> StoreError:
    return StoreError(
        f"cannot write to the store at {path}: {exc.strerror or exc}",
        hint="free disk space or fix permissions, or point the store elsewhere with --store",
    )
