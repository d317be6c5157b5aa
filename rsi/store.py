"""The local store: content-addressed blobs and the action cache, on disk, crash-safe. Must never
serve a blob or result that fails verification, nor write into a folder it did not claim.

Layout (Bazel's disk cache): `STORE.json` (the marker, `store_folder.py`: only a folder holding it,
or an empty one, is used as a store), `cas/ab/<hash>` blobs, `ac/ab/<key>` action results,
`targets/` the last key per action id (for "why did this rebuild?", `store_index.py`), `roots/` the
workspaces using the store (gc roots, `store_roots.py`), `tmp/` temporaries. Every write is a
temporary under `tmp/` (named by pid, so a killed writer's is found and removed) + rename, made
durable by an fsync each or, during a scheduler run, by group commit (`sync_each`); every read that
serves content verifies it; a corrupt entry is deleted and reported, never served.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import errno
import stat
import os
import re
import shutil
import threading
import time
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Iterator

from rsi.action import ActionResult
from rsi.canonical import canonical_bytes
from rsi.digest import DEFAULT_FUNCTION, Digest, FileDigestMemo, digest_bytes, digest_file
from rsi.errors import CorruptEntry, StoreError
from rsi.fsutil import (
    atomic_write_bytes,
    create_temp,
    pid_alive,
    read_regular,
    remove_tree,
    replace_into,
    scan_dir,
    store_write_error,
    temp_pid,
)
from rsi.store_folder import STORE_MARKER, claim_store, marker_bytes
from rsi.store_index import TargetIndex
from rsi.store_roots import GcRoots

# NB: version 2 hashes the key with the content: an entry moved to another key never verifies
AC_SCHEMA = "rsi.ac/2"
# NB: blobs up to this size are verified by hashing them, not through the blob memo
SMALL_BLOB = 4 << 20
_SMALL_COPY = 1 << 20
_SHARD = re.compile(r"[0-9a-f]{2}")
_ENTRY = re.compile(r"[0-9a-f]{64}")
# NB: how old a temporary without a pid in its name must be before it counts as abandoned:
# in tmp/ (remote downloads; the same as a build's scratch clean-up) and in cas/ or ac/ (only
# older rsi versions wrote temporaries there)
_STALE_UNNAMED_S = {"tmp": 86400, "entries": 3600}


class OutdatedEntry(ValueError):
    """An action-cache entry in an older format, whose integrity did not cover its key."""


@lru_cache(maxsize=1)
def _syncfs():
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None


# NB: up to this many files written under group commit are fsynced one by one, with their
# folders (~0.2 ms each on a small VM's disk); past it, one syncfs costs less (a cold build of
# 1,000 actions: 3.05 s with 64 here, 2.63 s with 8)
SYNC_FILES_MAX = 8


def _fsync_path(path: str, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _shard(root: str, hash_hex: str) -> str:
    return f"{root}/{hash_hex[:2]}/{hash_hex}"


class LocalStore:
    def __init__(self, root: str | os.PathLike, digest_function: str = DEFAULT_FUNCTION) -> None:
        self.root = Path(root).resolve()
        self.function = digest_function
        self.cas = self.root / "cas"
        self.ac = self.root / "ac"
        self.targets = self.root / "targets"
        self.tmp = self.root / "tmp"
        self.events_dir = self.root / "events"
        self.corrupt_seen: list[str] = []
        self._empty: Digest | None = None
        self._dev: int | None = None
        # NB: True: every blob and entry is fsynced before its rename. A scheduler turns it off
        # for a run and group-commits instead: one `sync()` before each batch of action-cache
        # entries makes the blobs they name durable first, and one more at the end.
        self.sync_each = True
        # NB: the files written since the last `sync()` with `sync_each` off: a few are fsynced
        # one by one (with their folders); many, or too many to list, by one syncfs
        self._unsynced: list[str] = []
        self._unsynced_lock = threading.Lock()
        self._cas_s, self._ac_s = str(self.cas), str(self.ac)
        self._init()
        self.blob_memo = FileDigestMemo(self.root / "blob-memo.json", self.function)
        self.file_memo = FileDigestMemo(self.root / "file-memo.json", self.function)
        # NB: the few files a build reads besides action inputs (engine and rule code,
        # declarations), kept apart so checking them never loads a memo of every source
        self.meta_memo = FileDigestMemo(self.root / "meta-memo.json", self.function)
        # NB: the copies under out/: a `//...` build at 100,000 actions exports 110,000 of
        # them, and every build checks the engine's code through the memo above (in the same
        # memo, 100 ms of loading it per build)
        self.out_memo = FileDigestMemo(self.root / "out-memo.json", self.function)
        # NB: the workspaces using this store, and what each action id was last built as
        self.gc_roots = GcRoots(self.root, self.tmp)
        self.target_index = TargetIndex(self.root, self.targets, self.read_bytes)

    # ------------------------------------------------------------------------------ layout
    def _init(self) -> None:
        meta = self.root / STORE_MARKER
        claim_store(self.root, self.function)
        try:
            for d in (self.cas, self.ac, self.targets, self.tmp, self.events_dir):
                d.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise store_write_error(self.root, exc) from exc
        try:
            found = json.loads(meta.read_text()).get("digest_function")
            if found is None:  # NB: claimed by a writer that stores no digests (toolchains)
                atomic_write_bytes(meta, marker_bytes(self.function))
                found = self.function
        except (OSError, ValueError) as exc:
            raise StoreError(f"{meta}: unreadable store metadata ({exc})") from exc
        if found != self.function:
            raise StoreError(
                f"the store at {self.root} holds {found} digests but this workspace uses "
                f"{self.function}; digests of two functions never mix",
                hint="use a separate store (--store DIR) for this digest function",
            )

    def save_memos(self) -> None:
        self.blob_memo.save()
        self.file_memo.save()
        self.meta_memo.save()
        self.out_memo.save()

    @contextmanager
    def lock(self, exclusive: bool = False) -> Iterator[None]:
        """Builds hold the lock shared; `cache gc` holds it exclusive."""
        fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)

    def scratch_dir(self, prefix: str = "scratch") -> Path:
        """A fresh folder on the store's file system, named after this pid (for crash cleanup)."""
        import tempfile

        return Path(tempfile.mkdtemp(dir=self.tmp, prefix=f"{prefix}-{os.getpid()}-"))

    # ------------------------------------------------------------------------------- blobs
    def blob_path(self, digest: Digest) -> Path:
        return Path(_shard(self._cas_s, digest.hash))

    def has(self, digest: Digest) -> bool:
        try:
            return os.stat(_shard(self._cas_s, digest.hash)).st_size == digest.size
        except OSError:
            return False

    def read_small_verified(self, digest: Digest) -> bytes | None:
        """A small blob's content, when present and hashing to its name; None otherwise (a
        corrupt one is quarantined)."""
        path = _shard(self._cas_s, digest.hash)
        try:
            data = read_regular(path)
        except OSError as exc:
            if exc.errno == errno.EINVAL:  # NB: not a regular file (a FIFO): never a blob
                self._quarantine(path)
            return None
        if len(data) != digest.size or digest_bytes(data, self.function) != digest:
            self._quarantine(path)
            return None
        return data

    def has_verified(self, digest: Digest) -> bool:
        """Present and its content still hashes to its name (memoised on the blob's stat)."""
        path = _shard(self._cas_s, digest.hash)
        try:
            st = os.stat(path)
        except OSError:
            return False
        if st.st_size != digest.size or not stat.S_ISREG(st.st_mode):
            self._quarantine(path)
            return False
        try:
            if st.st_size <= SMALL_BLOB:
                # NB: hashed again: cheaper than loading the memo of every blob for a few
                # small ones
                if digest_file(path, self.function) != digest:
                    self._quarantine(path)
                    return False
                return True
            found = self.blob_memo.digest(path, st)
        except OSError as exc:
            if exc.errno == errno.EINVAL:  # NB: swapped for a FIFO since the stat
                self._quarantine(path)
            return False
        if found != digest:
            self.blob_memo.forget(path)
            self._quarantine(path)
            return False
        return True

    def put_bytes(self, data: bytes, *, fsync: bool = True) -> Digest:
        digest = digest_bytes(data, self.function)
        if not self.has(digest):
            path = self.blob_path(digest)
            try:
                atomic_write_bytes(
                    path, data, mode=0o444, fsync=fsync and self.sync_each, tmp_dir=self.tmp
                )
            except OSError as exc:
                raise store_write_error(self.root, exc) from exc
            if fsync and not self.sync_each:
                self._written(path)
        return digest

    def put_file(self, src: str | os.PathLike, *, move: bool = False) -> Digest:
        """Add a file's content; with `move`, rename it in (same file system, no copy).

        What is hashed is the file that gets renamed into place (the copy, or the moved file),
        so a source changing meanwhile can never leave a blob whose name mismatches its content.
        """
        try:
            st = os.stat(src)
            if move and (st.st_dev != self._cas_dev() or st.st_uid != os.geteuid()):
                # NB: a rename cannot cross file systems (scratch on a tmpfs), and a file owned
                # by a sandbox uid must not become a blob that uid could change later
                move = False
            if not move and st.st_size <= _SMALL_COPY:
                # NB: small files go through memory: one hash, and no file at all when the
                # blob is already there
                with open(src, "rb") as f:
                    return self.put_bytes(f.read())
            if move:
                tmp = os.fspath(src)
            else:
                # NB: under tmp/, named by pid: never where readers list blobs, and removed by
                # the next build or gc if this process is killed mid-copy
                fd, tmp = create_temp(self.tmp)
                os.close(fd)
            try:
                if not move:  # NB: inside the try, so a copy cut short (disk full) is removed
                    shutil.copyfile(src, tmp)
                digest = digest_file(tmp, self.function)
                if self.has(digest):
                    os.unlink(tmp)
                    return digest
                os.chmod(tmp, 0o444)
                if self.sync_each:
                    fd = os.open(tmp, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                path = self.blob_path(digest)
                replace_into(tmp, path)
                if not self.sync_each:
                    self._written(path)
            except BaseException:
                if not move and os.path.exists(tmp):
                    os.unlink(tmp)
                raise
        except OSError as exc:
            raise store_write_error(self.root, exc) from exc
        return digest

    def _written(self, path: str | os.PathLike) -> None:
        with self._unsynced_lock:
            if len(self._unsynced) <= SYNC_FILES_MAX:
                self._unsynced.append(os.fspath(path))

    def sync(self) -> None:
        """Make every write so far durable at once (group commit, see `sync_each`): the few
        files written since the last sync one by one, with the folders their names went into,
        so that a build that ran three actions does not wait for whatever else the file
        system holds unwritten (another program's gigabytes); more than `SYNC_FILES_MAX` by
        one syncfs of the store's file system."""
        with self._unsynced_lock:
            written, self._unsynced = self._unsynced, []
        if len(written) <= SYNC_FILES_MAX:
            folders: set[str] = set()
            try:
                for path in written:
                    _fsync_path(path, os.O_RDONLY)
                    folders.add(os.path.dirname(path))
                for folder in folders:
                    _fsync_path(folder, os.O_RDONLY | os.O_DIRECTORY)
                return
            except OSError:
                pass  # NB: a file gone meanwhile (gc): the whole file system, as below
        fd = os.open(self.root, os.O_RDONLY)
        try:
            if _syncfs() is not None and _syncfs()(fd) == 0:
                return
            os.fsync(fd)
            os.sync()
        finally:
            os.close(fd)

    def _cas_dev(self) -> int:
        if self._dev is None:
            self.cas.mkdir(parents=True, exist_ok=True)
            self._dev = os.stat(self.cas).st_dev
        return self._dev

    def put_log(self, path: str | os.PathLike) -> Digest:
        """Keep an action's stdout/stderr; the (common) empty log costs no file operation."""
        if os.stat(path).st_size == 0:
            if self._empty is None:
                self._empty = self.put_bytes(b"")
            return self._empty
        return self.put_file(path, move=True)

    def read_bytes(self, digest: Digest) -> bytes:
        path = self.blob_path(digest)
        try:
            data = read_regular(path)
        except FileNotFoundError:
            raise CorruptEntry(f"blob {digest} is missing from {self.cas}") from None
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise StoreError(f"cannot read blob {digest}: {exc.strerror or exc}") from exc
            self._quarantine(path)
            raise CorruptEntry(f"blob {digest} was not a regular file and was removed") from None
        if digest_bytes(data, self.function) != digest:
            self._quarantine(path)
            raise CorruptEntry(f"blob {digest} failed verification and was removed")
        return data

    def export_file(
        self,
        digest: Digest,
        dest: str | os.PathLike,
        executable: bool = False,
        *,
        atomic: bool = False,
    ) -> None:
        """Copy a blob out, verifying it on the way; never serves a corrupt blob.

        With `atomic` (for folders other builds may write at the same time, like `out/`), the
        copy lands under a temporary name and is renamed over `dest`.
        """
        src = self.blob_path(digest)
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        mode = 0o755 if executable else 0o644
        if digest.size <= SMALL_BLOB:
            # NB: one read serves both the check and the copy (a sandbox's many small inputs)
            data = self.read_small_verified(digest)
            if data is None:
                raise CorruptEntry(f"blob {digest} is missing or corrupt in {self.cas}")
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
            try:
                if atomic:
                    fd, tmp = create_temp(dest.parent)
                    try:
                        _write_all(fd, data)
                        os.fchmod(fd, mode)
                        os.close(fd)
                        fd = -1
                        os.replace(tmp, dest)
                    except BaseException:
                        if fd >= 0:
                            os.close(fd)
                        with contextlib.suppress(OSError):
                            os.unlink(tmp)
                        raise
                    return
                try:
                    fd = os.open(dest, flags, mode)
                except FileExistsError:
                    dest.unlink()
                    fd = os.open(dest, flags, mode)
                try:
                    _write_all(fd, data)
                    os.fchmod(fd, mode)
                finally:
                    os.close(fd)
            except OSError as exc:
                raise StoreError(f"cannot write {dest}: {exc.strerror or exc}") from exc
            return
        if not self.has_verified(digest):
            raise CorruptEntry(f"blob {digest} is missing or corrupt in {self.cas}")
        try:
            if atomic:
                fd, tmp = create_temp(dest.parent)
                os.close(fd)
                try:
                    shutil.copyfile(src, tmp)
                    os.chmod(tmp, mode)
                    os.replace(tmp, dest)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
                    raise
                return
            if dest.exists() or dest.is_symlink():
                dest.unlink()
            shutil.copyfile(src, dest)
            os.chmod(dest, mode)
        except OSError as exc:
            raise StoreError(f"cannot write {dest}: {exc.strerror or exc}") from exc

    def _quarantine(self, path: str | Path) -> None:
        try:
            os.chmod(path, 0o644)
            os.unlink(path)
        except OSError:
            pass

    # ------------------------------------------------------------------------ action cache
    def _ac_path(self, key: Digest) -> Path:
        return Path(_shard(self._ac_s, key.hash))

    def get_action_result(self, key: Digest, *, check_blobs: bool = True) -> ActionResult | None:
        """The cached result for `key`, or None. A corrupt entry is deleted and reported as None."""
        path = _shard(self._ac_s, key.hash)
        try:
            raw = read_regular(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.EINVAL:  # NB: a FIFO in its place: a miss, never a wait
                self._quarantine(path)
                return None
            raise StoreError(f"cannot read {path}: {exc}") from exc
        try:
            result = self.parse_action_result(raw, key)
        except OutdatedEntry:
            self._quarantine(path)  # NB: unverifiable, so a miss; the rebuild rewrites it
            return None
        except (ValueError, KeyError, TypeError, AttributeError):
            self._quarantine(path)
            self.corrupt_seen.append(str(key))
            return None
        if check_blobs:
            for out in result.outputs:
                if not self.has_verified(out.digest):
                    self.corrupt_seen.append(str(out.digest))
                    return None
            for log in (result.stdout, result.stderr):
                if log is not None and not self.has(log):
                    return None
        return result

    def _ac_integrity(self, key_hash: str, body: bytes) -> str:
        return digest_bytes(
            AC_SCHEMA.encode() + b"\0" + key_hash.encode() + b"\0" + body, self.function
        ).hash

    def parse_action_result(self, raw: bytes, key: Digest | str) -> ActionResult:
        """The result an action-cache entry holds for `key`; ValueError/KeyError/TypeError when
        it is corrupt or belongs to another key, `OutdatedEntry` when its format cannot say."""
        key_hash = key if isinstance(key, str) else key.hash
        doc = json.loads(raw)
        body = doc["result"]
        if doc.get("schema") != AC_SCHEMA:
            if doc.get("integrity") != digest_bytes(canonical_bytes(body), self.function).hash:
                raise ValueError("integrity mismatch")
            raise OutdatedEntry("written in the older format (rsi.ac/1)")
        if doc.get("key") != key_hash:
            raise ValueError(f"it is the entry of key {doc.get('key')}, not of {key_hash}")
        if doc.get("integrity") != self._ac_integrity(key_hash, canonical_bytes(body)):
            raise ValueError("integrity mismatch")
        return ActionResult.from_json(body)

    def put_action_result(self, key: Digest, result: ActionResult) -> None:
        body = canonical_bytes(result.to_json())
        integrity = self._ac_integrity(key.hash, body)
        # NB: the same bytes json.dumps(sort_keys=True) would give, without encoding twice
        data = (
            b'{"integrity": "'
            + integrity.encode()
            + b'", "key": "'
            + key.hash.encode()
            + b'", "result": '
            + body
            + b', "schema": "'
            + AC_SCHEMA.encode()
            + b'"}'
        )
        path = self._ac_path(key)
        try:
            atomic_write_bytes(path, data, fsync=self.sync_each, tmp_dir=self.tmp)
        except OSError as exc:
            raise store_write_error(self.root, exc) from exc
        if not self.sync_each:
            self._written(path)

    def iter_action_keys(self) -> Iterator[Digest]:
        for name, _ in _entries(self.ac):
            yield Digest(name, 0)

    def iter_blobs(self) -> Iterator[tuple[str, Path]]:
        yield from _entries(self.cas)

    def remove_stale_temporaries(self) -> list[str]:
        """Remove what killed writers left: temporaries under `tmp/`, and (from older rsi
        versions) beside entries in `cas/` and `ac/`, whose writer is gone. Returns their paths.

        A temporary whose pid is alive is never touched; one without a pid in its name only
        once it is old (`_STALE_UNNAMED_S`).
        """
        removed: list[str] = []
        now = time.time()

        def stale(entry: os.DirEntry, where: str) -> bool:
            pid = temp_pid(entry.name)
            if pid is not None:
                return not pid_alive(pid)
            try:
                age = now - entry.stat(follow_symlinks=False).st_mtime
            except OSError:
                return False
            return age > _STALE_UNNAMED_S[where]

        candidates = [(e, "tmp") for e in scan_dir(self.tmp)]
        for folder in (self.cas, self.ac):
            for entry in scan_dir(folder):
                if entry.name.startswith(".tmp-"):
                    candidates.append((entry, "entries"))
                elif _SHARD.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
                    candidates += [
                        (e, "entries") for e in scan_dir(entry.path) if e.name.startswith(".tmp-")
                    ]
        for entry, where in candidates:
            if not stale(entry, where):
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    remove_tree(Path(entry.path))
                else:
                    os.unlink(entry.path)
            except OSError:
                continue
            removed.append(entry.path)
        return removed


def _entries(folder: Path) -> Iterator[tuple[str, Path]]:
    """`(name, path)` of every entry in a sharded folder; temporaries and strays are skipped."""
    for shard in sorted(scan_dir(folder), key=lambda e: e.name):
        if not _SHARD.fullmatch(shard.name) or not shard.is_dir(follow_symlinks=False):
            continue
        for entry in sorted(scan_dir(shard.path), key=lambda e: e.name):
            if _ENTRY.fullmatch(entry.name):
                yield entry.name, Path(entry.path)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
