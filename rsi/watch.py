"""Folders watched with inotify, for the build server (rsi/server.py, RSI_SERVER_WATCH=1): which
entries of a folder changed since a given moment, so a served build need not `lstat` the sources
(nor `stat` the store's output blobs) no event named. An event it missed must never hide a change:
where it cannot watch, they are stat'ed.

Moments are marks of a counter that every event drained from the kernel advances (and every
`watch` call ticks). For a folder and a mark M, `changed_since` gives the names of its entries
that events named after M, or None (look at every entry) when it cannot tell: the watch was
added at or after M, an event on the folder itself came after M, the kernel dropped events
after M (`IN_Q_OVERFLOW`, or too many names to remember), or the path no longer leads to the
same folder (one `stat`: a renamed or replaced ancestor). `mark()` drains what the kernel has
queued first: an event is queued by the system call that made the change, so a change made
before a build takes its mark is counted at or before that mark.

What inotify cannot see, so the caller must `stat` anyway: a file changed through a hard link
in a folder nobody watches (rsi.incremental stats sources that had two links when last looked
at; a link made later stays unseen), a change through a memory mapping, a folder on a network
file system changed by another machine (`local_fs`: only local file system types are watched).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import struct
from typing import Any

IN_MODIFY = 0x002
IN_ATTRIB = 0x004
IN_CLOSE_WRITE = 0x008
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
MASK = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_CLOSE_WRITE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
)
_EVENT = struct.Struct("iIII")
MAX_NAMED = 200_000
# NB: file systems whose changes all go through this kernel (so through inotify)
LOCAL_FS = frozenset(
    {"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "overlay", "f2fs", "zfs", "bcachefs"}
)


def _read_mountinfo() -> bytes | None:
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            return f.read()
    except OSError:
        return None


def local_fs_types(raw: bytes | None = None) -> list[tuple[str, str]]:
    """(mount point, file system type) of every mount, longest mount point first."""
    if raw is None:
        raw = _read_mountinfo()
        if raw is None:
            return []
    mounts = []
    for line in raw.decode("utf-8", "replace").splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right:
            continue
        point = fields[4].replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")
        mounts.append((point.replace("\\134", "\\"), right.split()[0]))
    mounts.sort(key=lambda m: len(m[0]), reverse=True)
    return mounts


def _libc() -> ctypes.CDLL:
    """The C library's inotify calls: through the interpreter's own symbols (no search for
    the library: `find_library` runs `ldconfig`, ~12 ms a build), else found by name."""
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "inotify_init1"):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    return libc


class Watcher:
    """inotify watches on folders, and the counter of changes seen in them."""

    def __init__(self, max_watches: int = 100_000) -> None:
        libc = _libc()
        self._add = libc.inotify_add_watch
        self._add.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
        self._rm = libc.inotify_rm_watch
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.fd = fd
        self.max_watches = max_watches
        self.counter = 0
        self.overflow_at = 0
        self._wd: dict[int, str] = {}
        self._folders: dict[str, tuple[int, int, int]] = {}  # folder -> (wd, added at, inode)
        self._last: dict[str, int] = {}  # NB: events on a folder itself
        self._names: dict[str, dict[str, int]] = {}  # NB: folder -> entry -> its last event
        self._named = 0
        self._mountinfo = _read_mountinfo()
        self._mounts = local_fs_types(self._mountinfo)
        self.mount_points = frozenset(p for p, _ in self._mounts)
        self._local: dict[str, bool] = {}

    def close(self) -> None:
        os.close(self.fd)

    def local_fs(self, folder: str) -> bool:
        got = self._local.get(folder)
        if got is None:
            kind = next(
                (
                    t
                    for p, t in self._mounts
                    if folder == p or folder.startswith(p.rstrip("/") + "/")
                ),
                "",
            )
            got = self._local[folder] = kind in LOCAL_FS
        return got

    def drain(self) -> None:
        """Count every event the kernel has queued."""
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            except InterruptedError:
                continue
            at = 0
            while at + _EVENT.size <= len(data):
                wd, mask, _cookie, size = _EVENT.unpack_from(data, at)
                at += _EVENT.size + size
                self.counter += 1
                if mask & IN_Q_OVERFLOW:
                    self.overflow_at = self.counter
                    continue
                folder = self._wd.get(wd)
                if folder is None:
                    continue
                if size:
                    # NB: about an entry of the folder, named: only that entry changed
                    raw = data[at - size : at].split(b"\0", 1)[0]
                    self._names.setdefault(folder, {})[os.fsdecode(raw)] = self.counter
                    self._named += 1
                    if self._named > MAX_NAMED:
                        # NB: too much to remember by name: as if the kernel had dropped them
                        self._names.clear()
                        self._named = 0
                        self.overflow_at = self.counter
                    continue
                self._last[folder] = self.counter
                if mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF):
                    # NB: the watch is gone (or soon): the folder is watched again if asked
                    self._wd.pop(wd, None)
                    self._folders.pop(folder, None)

    def mounts_moved(self, update: bool = True) -> bool:
        """Whether a mount was added or removed since the last call (or since this watcher
        was made); `mount_points` is then brought up to date (unless not `update`: a look
        that leaves the answer to the next call). No event says so: a mount over a watched
        path, or a file bind-mounted, changes what a path shows without one."""
        raw = _read_mountinfo()
        if raw is not None and raw == self._mountinfo:
            return False
        if not update:
            return True
        self._mountinfo = raw
        self._mounts = local_fs_types(raw) if raw is not None else []
        self.mount_points = frozenset(p for p, _ in self._mounts)
        self._local.clear()
        return True

    def mark(self) -> int:
        """The current moment: every change made before this call is counted at or before it."""
        self.drain()
        return self.counter

    def watch(self, folders) -> None:
        """Watch these folders (those on local file systems, within the watch budget) from now
        on; a folder already watched keeps its watch. A mark taken after this call is later
        than every watch it added."""
        self.drain()
        for folder in folders:
            if folder in self._folders or len(self._folders) >= self.max_watches:
                continue
            if not self.local_fs(folder):
                continue
            try:
                st = os.stat(folder)
            except OSError:
                continue
            wd = self._add(self.fd, os.fsencode(folder), MASK)
            if wd < 0:
                if ctypes.get_errno() == errno.ENOSPC:
                    self.max_watches = len(self._folders)  # NB: the user's watch limit
                continue
            self._wd[wd] = folder
            self._folders[folder] = (wd, self.counter, st.st_ino)
        # NB: a tick: a watch added by this call is "before" any mark taken after it, and a
        # watch added after a mark is not (added_at >= that mark)
        self.counter += 1

    def changed_since(self, folder: str, mark: int) -> set[str] | None:
        """The names of the entries of `folder` changed since `mark`; None when that cannot be
        told (not watched since before the mark, an event on the folder itself, events lost,
        or no longer the same folder at that path): then every entry must be looked at."""
        held = self._folders.get(folder)
        if held is None or held[1] >= mark or self.overflow_at > mark:
            return None
        if self._last.get(folder, 0) > mark:
            return None
        try:
            if os.stat(folder).st_ino != held[2]:
                return None
        except OSError:
            return None
        names = self._names.get(folder)
        return {n for n, at in names.items() if at > mark} if names else set()


class BuildWatch:
    """One build's watch, without a build server (rsi.incremental): inotify watches on the
    folders of the sources, added (and a mark taken) before the build's check stats them, so
    the re-check before export needs to look again only at the sources an event named since,
    and at those no event can vouch for (`linked`: two links or a symlink when the check
    looked; and mount points). `named` is None, so every source is looked at again, when the
    watch cannot tell: a folder not watched (another file system, the watch limit), an event
    on a folder itself, events lost, or a mount added or removed."""

    def __init__(self, folders: list[str]) -> None:
        self.watcher: Watcher | None = Watcher(max_watches=len(folders))
        self.folders = folders
        self.linked: list[str] = []
        try:
            self.watcher.watch(folders)
            self.mark = self.watcher.mark()
        except BaseException:
            self.close()
            raise

    def named(self, sources: Any) -> list[str] | None:
        """The sources to look at again (some maybe not in `sources`), or None (all)."""
        w = self.watcher
        if w is None or w.mounts_moved(update=False):
            return None
        w.drain()
        found = list(self.linked)
        for folder in self.folders:
            names = w.changed_since(folder, self.mark)
            if names is None:
                return None
            cut = folder + "/" if folder != "/" else "/"
            found.extend(cut + n for n in names)
        found.extend(m for m in w.mount_points if m in sources)
        return found

    def close(self) -> None:
        if getattr(self, "watcher", None) is not None:
            self.watcher.close()
            self.watcher = None

    def __del__(self) -> None:
        self.close()
