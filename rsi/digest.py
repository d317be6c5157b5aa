"""Digests: of bytes, of files (streamed), and of trees (Merkle), plus the stat memo.

This module owns hashing. BLAKE3 by default; SHA-256 when a remote service offers nothing else.
It never follows a symlink out of the tree being hashed, and it never trusts (path, size, mtime)
alone: the memo is keyed on (inode, size, mtime_ns, ctime_ns) and only skips re-reading content.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import blake3

from rsi.canonical import canonical_bytes
from rsi.errors import RsiError, StoreError
from rsi.fsutil import atomic_write_bytes, open_regular, read_regular
from rsi.record import Frozen, Ordered

_set = object.__setattr__

DIGEST_FUNCTIONS = ("blake3", "sha256")
DEFAULT_FUNCTION = "blake3"
_SMALL_FILE = 1 << 20


class Digest(Ordered):
    """A content digest: hex hash plus size in bytes (as in REAPI)."""

    __slots__ = ("hash", "size")
    _fields = ("hash", "size")
    hash: str
    size: int

    def __init__(self, hash: str, size: int) -> None:  # noqa: A002 - NB: REAPI's name
        _set(self, "hash", hash)
        _set(self, "size", size)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is Digest:
            return self.hash == other.hash and self.size == other.size  # type: ignore[attr-defined]
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.hash, self.size))

    def __reduce__(self) -> tuple:
        return (Digest, (self.hash, self.size))

    def __str__(self) -> str:
        return f"{self.hash}/{self.size}"

    @property
    def short(self) -> str:
        return self.hash[:12]

    @classmethod
    def parse(cls, text: str) -> "Digest":
        try:
            hash_hex, size = text.split("/")
            int(hash_hex, 16)
            return cls(hash_hex.lower(), int(size))
        except ValueError:
            raise RsiError(f"not a digest: {text!r}", hint="expected HASH/SIZE") from None

    def to_json(self) -> str:
        return str(self)


def _hasher(function: str):
    if function == "blake3":
        return blake3.blake3()
    if function == "sha256":
        import hashlib  # NB: OpenSSL's, fast on big files; only this digest function loads it

        return hashlib.sha256()
    raise StoreError(
        f"unknown digest function {function!r}", hint=f"use one of {', '.join(DIGEST_FUNCTIONS)}"
    )


def hasher(function: str = DEFAULT_FUNCTION) -> Any:
    """A new incremental hasher of `function` (`update`, `hexdigest`): for data read in parts."""
    return _hasher(function)


def digest_bytes(data: bytes, function: str = DEFAULT_FUNCTION) -> Digest:
    h = _hasher(function)
    h.update(data)
    return Digest(h.hexdigest(), len(data))


def digest_value(value: object, function: str = DEFAULT_FUNCTION) -> Digest:
    """Digest of a structured value under the canonical encoding."""
    return digest_bytes(canonical_bytes(value), function)


# NB: the digest of a set of cache hits (docs/events.md, `actions_cached`): the sum, modulo
# 2**256, of each hit's term. A sum needs no sort, and a state keeps it up to date by
# subtracting an action's old term and adding its new one (a no-op at 100,000 actions reads it)
HITS_MOD = 1 << 256


def hit_term(action: str, key: str) -> int:
    """One hit's term: SHA-256 of the line "ACTION KEY\\n", as a big-endian number."""
    import hashlib  # NB: as in _hasher: a no-op that reads the state's sum never loads it

    return int.from_bytes(hashlib.sha256(f"{action} {key}\n".encode()).digest(), "big")


def hits_digest(total: int) -> str:
    """The text of a hit set's digest from the sum of its terms."""
    return f"sha256-sum:{total % HITS_MOD:064x}"


def digest_file(path: str | os.PathLike, function: str = DEFAULT_FUNCTION) -> Digest:
    """Stream a file through the hash; large files are memory-mapped and hashed in parallel.
    Only a regular file: anything else raises OSError (rsi.fsutil.open_regular)."""
    fd = open_regular(path)
    size = os.fstat(fd).st_size
    if function == "blake3" and size >= _SMALL_FILE:
        import mmap

        # NB: the descriptor checked, mapped: never the path opened again
        try:
            with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mapped:
                h = blake3.blake3(max_threads=blake3.blake3.AUTO)
                h.update(mapped)
                return Digest(h.hexdigest(), len(mapped))
        finally:
            os.close(fd)
    h = _hasher(function)
    with os.fdopen(fd, "rb") as f:
        if size < _SMALL_FILE:
            data = f.read()
            h.update(data)
            size = len(data)
        else:
            size = 0
            while chunk := f.read(1 << 22):
                h.update(chunk)
                size += len(chunk)
    return Digest(h.hexdigest(), size)


# --------------------------------------------------------------------------------------- trees


class FileNode(Frozen):
    """A regular file in a tree: its content digest and executable bit."""

    __slots__ = ("digest", "executable")
    _fields = ("digest", "executable")
    digest: Digest
    executable: bool

    def __init__(self, digest: Digest, executable: bool = False) -> None:
        _set(self, "digest", digest)
        _set(self, "executable", executable)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is FileNode:
            return self.digest == other.digest and self.executable == other.executable  # type: ignore[attr-defined]
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.digest, self.executable))

    def __reduce__(self) -> tuple:
        return (FileNode, (self.digest, self.executable))

    def encode(self) -> list:
        return [self.digest.hash, self.digest.size, self.executable]


class SymlinkNode(Frozen):
    """A symlink kept as a link; its target is relative and stays inside the tree."""

    __slots__ = ("target",)
    _fields = ("target",)
    target: str

    def __init__(self, target: str) -> None:
        _set(self, "target", target)

    def __reduce__(self) -> tuple:
        return (SymlinkNode, (self.target,))

    def encode(self) -> list:
        return ["symlink", self.target]


TreeEntry = FileNode | SymlinkNode


class TreeError(RsiError):
    """A tree could not be snapshotted (a symlink out of it, an unreadable file)."""


def _check_rel_path(rel: str) -> None:
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise TreeError(f"path {rel!r} is not a normalised relative path")


def scan_tree(
    root: str | os.PathLike,
    memo: "FileDigestMemo | None" = None,
    *,
    function: str = DEFAULT_FUNCTION,
    exclude: Iterable[str] = (),
) -> dict[str, TreeEntry]:
    """Snapshot a folder as {relative path: entry}.

    Symlink rule: a link whose target resolves inside `root` is kept as a link (never followed);
    a link pointing outside `root`, or dangling, is an error naming the file.
    """
    root_path = Path(root)
    real_root = os.path.realpath(root_path)
    excluded = set(exclude)
    entries: dict[str, TreeEntry] = {}
    for dirpath, dirnames, filenames in os.walk(root_path, followlinks=False):
        rel_dir = os.path.relpath(dirpath, root_path)
        rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
        dirnames[:] = sorted(d for d in dirnames if d not in excluded)
        for name in sorted(
            filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        ):
            if name in excluded:
                continue
            full = os.path.join(dirpath, name)
            rel = rel_dir + name
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(full)
                resolved = os.path.realpath(full)
                inside = resolved == real_root or resolved.startswith(real_root + os.sep)
                if os.path.isabs(target) or not inside or not os.path.exists(full):
                    raise TreeError(
                        f"{full}: symlink to {target!r} points outside {root_path} or nowhere",
                        hint="replace the link with the file it points to",
                    )
                entries[rel] = SymlinkNode(target)
            elif stat.S_ISREG(st.st_mode):
                digest = memo.digest(full, st) if memo else digest_file(full, function)
                entries[rel] = FileNode(digest, bool(st.st_mode & 0o111))
            elif stat.S_ISDIR(st.st_mode):
                continue
            else:
                raise TreeError(f"{full}: not a regular file, folder or symlink")
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
    return entries


def merkle_directories(
    entries: Mapping[str, TreeEntry], function: str = DEFAULT_FUNCTION
) -> tuple[Digest, dict[Digest, bytes]]:
    """Merkle root of a flat tree, and every directory blob by digest (REAPI-shaped).

    A directory blob lists files, subdirectories and symlinks by name, so the file set (names
    included) and executable bits are part of the root digest.
    """
    tree: dict = {}
    for path, entry in entries.items():
        _check_rel_path(path)
        node = tree
        *dirs, leaf = path.split("/")
        for d in dirs:
            node = node.setdefault(d, {})
            if not isinstance(node, dict):
                raise TreeError(f"{path}: a parent of this path is a file")
        if leaf in node:
            raise TreeError(f"{path}: listed twice or both file and folder")
        node[leaf] = entry
    blobs: dict[Digest, bytes] = {}

    def encode(node: dict) -> Digest:
        files, dirs, links = [], [], []
        for name in sorted(node):
            child = node[name]
            if isinstance(child, dict):
                d = encode(child)
                dirs.append([name, d.hash, d.size])
            elif isinstance(child, SymlinkNode):
                links.append([name, child.target])
            else:
                files.append([name, *child.encode()])
        data = canonical_bytes({"dirs": dirs, "files": files, "symlinks": links})
        digest = digest_bytes(data, function)
        blobs[digest] = data
        return digest

    return encode(tree), blobs


def tree_digest(entries: Mapping[str, TreeEntry], function: str = DEFAULT_FUNCTION) -> Digest:
    return merkle_directories(entries, function)[0]


# ----------------------------------------------------------------------------------------- memo


class FileDigestMemo:
    """Digests of unchanged files, keyed on (inode, size, mtime_ns, ctime_ns).

    A file modified within the last second is hashed but not remembered, so a write landing in
    the same timestamp tick as the hash can never be mistaken for the old content.
    """

    RACY_NS = 1_000_000_000

    def __init__(self, path: Path | None, function: str = DEFAULT_FUNCTION) -> None:
        self.path = path
        self.function = function
        self._loaded: dict[str, list] | None = None if path is not None else {}
        self._dirty = False
        # NB: `known(path, st)` -> (digest, trusted signature or None) when someone else (the
        # incremental state) vouches for the file at this very stat, else None: asked first
        # by `observe`, so a build the state serves loads no memo of every file ever read
        self.known: Callable[[str, os.stat_result], tuple | None] | None = None

    @property
    def _entries(self) -> dict[str, list]:
        # NB: read on first use: a build served by the incremental state never needs it
        entries = self._loaded
        if entries is None:
            entries = {}
            try:
                loaded = json.loads(read_regular(self.path))  # type: ignore[arg-type]
                if loaded.get("function") == self.function:
                    entries = loaded.get("entries", {})
            except (OSError, ValueError, AttributeError):
                entries = {}
            if not isinstance(entries, dict):
                entries = {}
            self._loaded = entries
        return entries

    def digest(self, path: str | os.PathLike, st: os.stat_result | None = None) -> Digest:
        key = os.fspath(path)
        if st is None:
            st = os.stat(key)
        sig = [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        if self._loaded is None and self._racy(st):
            # NB: a file changed within RACY_NS can neither be found in the memo (no entry is
            # made for a racy signature, and time moves on) nor be entered: the memo (an
            # entry per file ever read) is not loaded for it
            return digest_file(key, self.function)
        hit = self._entries.get(key)
        if hit is not None and hit[:4] == sig:
            return Digest(hit[4], st.st_size)
        digest = digest_file(key, self.function)
        now = time.time_ns()
        if now - max(st.st_mtime_ns, st.st_ctime_ns) > self.RACY_NS and digest.size == st.st_size:
            self._entries[key] = sig + [digest.hash]
            self._dirty = True
        elif hit is not None:
            # NB: pop, not del: executor threads may drop the same entry at once
            self._entries.pop(key, None)
            self._dirty = True
        return digest

    def observe(
        self, path: str | os.PathLike, st: os.stat_result | None = None
    ) -> tuple[Digest, tuple[int, int, int, int] | None]:
        """The digest of `path`, and the stat signature (ino, size, mtime_ns, ctime_ns) it was
        taken under when that signature may later stand for this content: only when the
        memo trusts it (the file was last changed more than RACY_NS before it was read).
        None means "racy": whoever keeps the digest must read the file again next time."""
        key = os.fspath(path)
        if st is None:
            st = os.stat(key)
        if self.known is not None:
            vouched = self.known(key, st)
            if vouched is not None:
                return vouched
        digest = self.digest(key, st)
        if self._loaded is None and self._racy(st):
            return digest, None
        sig = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        hit = self._entries.get(key)
        trusted = hit is not None and tuple(hit[:4]) == sig and hit[4] == digest.hash
        return digest, (sig if trusted else None)

    def _racy(self, st: os.stat_result) -> bool:
        return time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) <= self.RACY_NS

    def forget(self, path: str | os.PathLike) -> None:
        if self._entries.pop(os.fspath(path), None) is not None:
            self._dirty = True

    def save(self) -> None:
        if not self._dirty or self.path is None or self._loaded is None:
            return
        entries = dict(self._entries)  # NB: a snapshot; other threads may still be adding
        data = json.dumps({"function": self.function, "entries": entries}).encode()
        try:
            atomic_write_bytes(self.path, data)
        except OSError:
            pass  # NB: the memo is only a speed-up; failing to save it must not fail a build
        self._dirty = False
