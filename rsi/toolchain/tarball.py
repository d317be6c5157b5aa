"""Byte-identical tar archives of a root filesystem, hashed while written, and their extraction.

Entries are sorted, parents first; mtimes are clamped to SOURCE_DATE_EPOCH; owners are numeric
with no names; device nodes and the contents of /dev, /proc, /sys are left out (every runtime
provides its own). Nothing here reads the clock or the host's user database.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path

import blake3

from rsi.digest import Digest

_EMPTY_DIRS = {"dev", "proc", "sys", "run", "tmp"}


class _HashingWriter:
    """A write-only file that hashes (BLAKE3 and SHA-256) everything written through it."""

    def __init__(self, f) -> None:
        self.f = f
        self.b3 = blake3.blake3()
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.f.write(data)
        self.b3.update(data)
        self.sha.update(data)
        self.size += len(data)
        return len(data)

    def tell(self) -> int:
        return self.size


def write_rootfs_tar(root: Path, dest: Path, epoch: int) -> tuple[Digest, str]:
    """Write `root` as a deterministic tar at `dest`; return (BLAKE3 digest, sha256 hex)."""
    hardlinks: dict[tuple[int, int], str] = {}
    with open(dest, "wb") as raw:
        writer = _HashingWriter(raw)
        with tarfile.open(fileobj=writer, mode="w|", format=tarfile.GNU_FORMAT) as tar:
            for rel in _walk(root):
                _add(tar, root, rel, epoch, hardlinks)
        raw.flush()
        os.fsync(raw.fileno())
    return Digest(writer.b3.hexdigest(), writer.size), writer.sha.hexdigest()


def _walk(root: Path):
    """Relative paths, parents before children, siblings sorted by name (bytes order)."""
    stack = [""]
    while stack:
        rel = stack.pop()
        if rel:
            yield rel
        full = os.path.join(root, rel) if rel else os.fspath(root)
        if rel in _EMPTY_DIRS or not (os.path.isdir(full) and not os.path.islink(full)):
            continue
        names = sorted(os.listdir(full), key=os.fsencode, reverse=True)
        stack.extend(f"{rel}/{n}" if rel else n for n in names)


def _add(
    tar: tarfile.TarFile, root: Path, rel: str, epoch: int, hardlinks: dict[tuple[int, int], str]
) -> None:
    full = os.path.join(root, rel)
    st = os.lstat(full)
    info = tarfile.TarInfo(rel)
    info.uid, info.gid = st.st_uid, st.st_gid
    info.uname = info.gname = ""
    info.mode = stat.S_IMODE(st.st_mode)
    info.mtime = min(int(st.st_mtime), epoch)
    if stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    elif stat.S_ISLNK(st.st_mode):
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(full)
        tar.addfile(info)
    elif stat.S_ISREG(st.st_mode):
        key = (st.st_dev, st.st_ino)
        if st.st_nlink > 1 and key in hardlinks:
            info.type = tarfile.LNKTYPE
            info.linkname = hardlinks[key]
            tar.addfile(info)
            return
        if st.st_nlink > 1:
            hardlinks[key] = rel
        info.size = st.st_size
        with open(full, "rb") as f:
            tar.addfile(info, f)
    elif stat.S_ISFIFO(st.st_mode):
        info.type = tarfile.FIFOTYPE
        tar.addfile(info)
    # NB: sockets and device nodes are never part of a toolchain


def extract_rootfs(tar_path: Path, dest: Path) -> None:
    """Unpack into `dest` (created; must not exist) keeping numeric owners, modes and mtimes."""
    tmp = dest.with_name(dest.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        subprocess.run(
            [
                "tar",
                "-x",
                "-f",
                os.fspath(tar_path),
                "-C",
                os.fspath(tmp),
                "--numeric-owner",
                "--same-permissions",
                "--same-owner",
            ],
            check=True,
            capture_output=True,
        )
        os.chmod(tmp, 0o755)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
