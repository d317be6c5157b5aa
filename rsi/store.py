"""The local store: content-addressed blobs and the action cache, on disk, crash-safe.

Layout (Bazel's disk cache): `STORE.json` (the marker: only a folder holding it, or an empty
one, is used as a store), `cas/ab/<hash>` blobs, `ac/ab/<key>` action results, `targets/` the
last key per action id (for "why did this rebuild?"), `roots/` the workspaces using the store
(gc roots), `tmp/` temporaries. Every write is a temporary under `tmp/` (named by pid, so a
killed writer's is found and removed) + rename, made durable by an fsync each or, during a
scheduler run, by group commit (`sync_each`); every read that serves content verifies it; a
corrupt entry is deleted and reported, never served.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import threading
import time
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Iterator

try:  # NB: the C module itself: hashlib would load OpenSSL (~2 ms of every start)
    from _sha2 import sha256  # type: ignore[import-not-found]  # Python 3.12+
except ImportError:
    try:
        from _sha256 import sha256  # type: ignore[import-not-found,no-redef]
    except ImportError:  # pragma: no cover - NB: a Python built without either
        from hashlib import sha256  # type: ignore[assignment]

from rsi.action import ActionResult
from rsi.canonical import canonical_bytes
from rsi.digest import DEFAULT_FUNCTION, Digest, FileDigestMemo, digest_bytes, digest_file
from rsi.errors import EXIT_USAGE, CorruptEntry, RsiError, StoreError
from rsi.fsutil import (
    atomic_write_bytes,
    create_temp,
    pid_alive,
    remove_tree,
    replace_into,
    store_write_error,
    temp_pid,
)

STORE_SCHEMA = "rsi.store/1"
STORE_MARKER = "STORE.json"
# NB: version 2 hashes the key with the content: an entry moved to another key never verifies
AC_SCHEMA = "rsi.ac/2"
ROOT_SCHEMA = "rsi.gcroot/1"
# NB: blobs up to this size are verified by hashing them, not through the blob memo
SMALL_BLOB = 4 << 20
# NB: a registration's journal is folded into it past this size (see `update_registration`)
JOURNAL_BYTES = 256 << 10
_SMALL_COPY = 1 << 20
# NB: files an empty folder may hold in a repository (the default `cache/` ships with one);
# rsi never touches them
_PLACEHOLDERS = frozenset({".gitkeep", ".gitignore", ".keep"})
_SHARD = re.compile(r"[0-9a-f]{2}")
_ENTRY = re.compile(r"[0-9a-f]{64}")
# NB: how old a temporary without a pid in its name must be before it counts as abandoned:
# in tmp/ (remote downloads; the same as a build's scratch clean-up) and in cas/ or ac/ (only
# older rsi versions wrote temporaries there)
_STALE_UNNAMED_S = {"tmp": 86400, "entries": 3600}


def _marker(function: str | None) -> bytes:
    doc = {"schema": STORE_SCHEMA}
    if function is not None:
        doc["digest_function"] = function
    return json.dumps(doc).encode()


def claim_store(root: Path, function: str | None = None) -> None:
    """Make `root` a store before anything is written under it (StoreRefused when it may not
    be one): every writer into a store folder, not only `LocalStore`, calls this first."""
    root = Path(root)
    problem = store_folder_problem(root)
    if problem is not None:
        raise StoreRefused(
            f"{root} cannot be used as the store: {problem}",
            hint="point the store at a new or empty folder (rsi.toml `store`, or --store)",
        )
    meta = root / STORE_MARKER
    if meta.exists():
        return
    try:
        # NB: the marker first, so a folder rsi starts to fill is recognisably a store
        root.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(meta, _marker(function))
    except OSError as exc:
        raise store_write_error(root, exc) from exc


class StoreRefused(StoreError):
    """The configured folder cannot be a store (not empty and not an rsi store)."""

    exit_code = EXIT_USAGE


class OutdatedEntry(ValueError):
    """An action-cache entry in an older format, whose integrity did not cover its key."""


def store_folder_problem(root: Path) -> str | None:
    """Why `root` cannot be used as a store, or None: it may be absent, empty, or a store.

    rsi writes and deletes files under its store, so a folder holding anything else (and no
    STORE.json) is refused rather than adopted.
    """
    try:
        entries = [
            e for e in os.listdir(root) if not e.startswith(".tmp-") and e not in _PLACEHOLDERS
        ]
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return "it is a file, not a folder"
    except OSError as exc:
        return f"it cannot be read ({exc.strerror or exc})"
    if STORE_MARKER not in entries:
        if not entries:
            return None  # NB: `.tmp-*`: another rsi is creating this store right now
        shown = ", ".join(sorted(entries)[:3]) + (", ..." if len(entries) > 3 else "")
        return (
            f"it is not empty ({shown}) and is not an rsi store (no {STORE_MARKER}); rsi "
            "deletes files in its store, so it only uses an empty folder or one it created"
        )
    try:
        doc = json.loads((root / STORE_MARKER).read_bytes())
        schema = doc.get("schema") if isinstance(doc, dict) else None
    except (OSError, ValueError) as exc:
        return f"its {STORE_MARKER} is unreadable ({exc})"
    if schema == STORE_SCHEMA:
        return None
    if isinstance(schema, str) and schema.startswith("rsi.store/"):
        return f"another version of rsi wrote it (schema {schema}; this rsi reads {STORE_SCHEMA})"
    return f"its {STORE_MARKER} is not an rsi store marker (schema {schema!r})"


# NB: the folders of a store a build writes in (checked by name: a listing costs more); a rule
# family's own folders (the campaign logs) are its business: the engine names none of them
WRITTEN_FOLDERS = (
    "cas",
    "ac",
    "targets",
    "tmp",
    "roots",
    "events",
    "analysis",
    "toolchains",
    "locks",  # NB: the outputs lock of each workspace (rsi/wslock.py)
)


def folder_write_problem(
    root: str | os.PathLike, what: str = "it", inside: tuple[str, ...] = WRITTEN_FOLDERS
) -> str | None:
    """Why rsi could not write under `root` (a store, or `out/`), or None: the folder, the
    folders `inside` it that exist, or where it is to be made, is read-only (a read-only mount, an
    immutable folder: root bypasses modes but not these) or closed to this user. Checked
    before a build writes anything, so a refusal leaves nothing half written. (A file where
    the folder should be is left to `store_folder_problem`.)"""
    want = os.R_OK | os.W_OK | os.X_OK
    top = here = os.fspath(root)
    while not os.path.lexists(here):
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent
        what = f"the folder it would be made in ({here})"
    if not os.path.isdir(here):
        return None
    folders = [here]
    if here == top:
        folders += [os.path.join(here, name) for name in inside]
    for folder in folders:
        if os.access(folder, want) or (folder != here and not os.path.lexists(folder)):
            continue
        try:
            read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
        except OSError:
            read_only = False
        if read_only:
            why = "on a read-only file system"
        elif os.access(folder, os.R_OK | os.X_OK):
            why = "not writable (an immutable folder, or its mode)"
        else:
            why = "not readable by this user"
        return f"{what if folder == here else folder} is {why}"
    return None


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
        self.roots = self.root / "roots"
        self.events_dir = self.root / "events"
        self.corrupt_seen: list[str] = []
        self._empty: Digest | None = None
        self._dev: int | None = None
        self._packs: dict[str, dict] = {}
        # NB: an older store's one-file target index, parsed once per (inode, size, mtime)
        self._legacy_cached: tuple | None = None
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
        # declarations, out/), kept apart so checking them never loads a memo of every source
        self.meta_memo = FileDigestMemo(self.root / "meta-memo.json", self.function)

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
                atomic_write_bytes(meta, _marker(self.function))
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
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
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
        if st.st_size != digest.size:
            self._quarantine(path)
            return False
        if st.st_size <= SMALL_BLOB:
            # NB: hashed again: cheaper than loading the memo of every blob for a few small ones
            if digest_file(path, self.function) != digest:
                self._quarantine(path)
                return False
            return True
        if self.blob_memo.digest(path, st) != digest:
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
            data = path.read_bytes()
        except FileNotFoundError:
            raise CorruptEntry(f"blob {digest} is missing from {self.cas}") from None
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
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
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

        candidates = [(e, "tmp") for e in _scan(self.tmp)]
        for folder in (self.cas, self.ac):
            for entry in _scan(folder):
                if entry.name.startswith(".tmp-"):
                    candidates.append((entry, "entries"))
                elif _SHARD.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
                    candidates += [
                        (e, "entries") for e in _scan(entry.path) if e.name.startswith(".tmp-")
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

    # -------------------------------------------------------------- gc roots (workspaces)
    # NB: every workspace that builds with this store records the action keys it references,
    # so `cache gc` run from one workspace keeps what the others still use.
    def _registration_path(self, workspace: Path) -> Path:
        name = sha256(os.fsencode(str(workspace))).hexdigest()[:32]
        return self.roots / f"{name}.json"

    # NB: a registration is `roots/<name>.json` and, beside it, a journal `<name>.journal`:
    # a first line naming the registration file it extends (its stat signature), then one
    # JSON line of updates per build. A one-change build appends its few new keys instead of
    # rewriting the keys of every action; a journal naming another file (the registration was
    # rewritten since, folding it in) is stale and ignored, so a crash at any point leaves
    # either the old registration or the new one.
    @staticmethod
    def _journal_path(path: Path) -> Path:
        return path.with_suffix(".journal")

    def registration_signature(self, workspace: Path) -> tuple | None:
        """Changes whenever the registration file is rewritten or its journal grows."""
        path = self._registration_path(workspace)
        sigs = []
        for p in (path, self._journal_path(path)):
            try:
                st = os.stat(p)
            except OSError:
                sigs.append(None)
                continue
            sigs.append((st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        return None if sigs[0] is None else tuple(sigs)

    def _read_registration(self, path: Path) -> dict:
        """The registration document with its journal (when it extends this file) applied."""
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                doc = json.loads(f.read())
        except (OSError, ValueError):
            return {}
        if not isinstance(doc, dict):
            return {}
        actions = doc.get("actions")
        if isinstance(actions, dict):
            for update in self._journal_updates(path, _stat_sig(st)):
                actions.update(update)
        return doc

    def _journal_updates(self, path: Path, base_sig: list) -> list[dict]:
        try:
            lines = self._journal_path(path).read_bytes().splitlines()
        except OSError:
            return []
        updates: list[dict] = []
        for n, line in enumerate(lines):
            try:
                doc = json.loads(line)
            except ValueError:
                continue  # NB: a line cut short by a crash
            if not isinstance(doc, dict):
                continue
            if n == 0:
                if doc.get("extends") != base_sig:
                    return []  # NB: stale: the registration was rewritten with it folded in
                continue
            if isinstance(doc.get("actions"), dict):
                updates.append(doc["actions"])
        return updates

    def register_workspace(self, workspace: Path, actions: dict[str, dict]) -> None:
        """Add `actions` (action id -> {"key", "label"}) to what `workspace` references."""
        path = self._registration_path(workspace)
        with self._roots_lock():
            doc = self._read_registration(path)
            known = doc.get("actions") if doc.get("workspace") == str(workspace) else None
            known = known if isinstance(known, dict) else {}
            merged = {**known, **actions}
            if path.exists() and merged == known:
                return  # NB: a no-op build writes nothing
            self._write_registration(path, workspace, merged)

    def update_registration(self, workspace: Path, actions: dict[str, dict]) -> None:
        """Add `actions` to what `workspace` references, known to be registered already but
        for these: appended to the journal, without reading or rewriting the registration
        (folded into it once the journal outgrows `JOURNAL_BYTES`)."""
        if not actions:
            return
        path = self._registration_path(workspace)
        journal = self._journal_path(path)
        with self._roots_lock():
            try:
                base = _stat_sig(os.stat(path))
            except OSError:
                base = None
            try:
                size = os.stat(journal).st_size
            except OSError:
                size = 0
            fresh = size == 0 or self._journal_header(journal) != base
            if base is None or size > JOURNAL_BYTES:
                doc = self._read_registration(path) if base is not None else {}
                known = doc.get("actions") if doc.get("workspace") == str(workspace) else None
                known = known if isinstance(known, dict) else {}
                self._write_registration(path, workspace, {**known, **actions})
                return
            line = json.dumps({"actions": actions}, sort_keys=True) + "\n"
            try:
                if fresh:
                    head = json.dumps({"schema": ROOT_SCHEMA, "extends": base}) + "\n"
                    atomic_write_bytes(journal, (head + line).encode(), tmp_dir=self.tmp)
                else:
                    with open(journal, "a", encoding="utf-8") as f:
                        f.write(line)
                        f.flush()
                        os.fsync(f.fileno())
            except OSError as exc:
                raise store_write_error(self.root, exc) from exc

    @staticmethod
    def _journal_header(journal: Path) -> list | None:
        try:
            with open(journal, "rb") as f:
                return json.loads(f.readline()).get("extends")
        except (OSError, ValueError, AttributeError):
            return None

    @contextmanager
    def _roots_lock(self) -> Iterator[None]:
        try:
            self.roots.mkdir(exist_ok=True)
            fd = os.open(self.root / "roots.lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise store_write_error(self.root, exc) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _write_registration(self, path: Path, workspace: Path, actions: dict) -> None:
        doc = {"schema": ROOT_SCHEMA, "workspace": str(workspace), "actions": actions}
        try:
            atomic_write_bytes(path, json.dumps(doc, sort_keys=True).encode(), tmp_dir=self.tmp)
        except OSError as exc:
            raise store_write_error(self.root, exc) from exc
        # NB: stale now (it names the file just replaced); removed so it is not read again
        with contextlib.suppress(OSError):
            os.unlink(self._journal_path(path))

    def drop_registration(self, path: Path) -> None:
        for p in (path, self._journal_path(path)):
            with contextlib.suppress(OSError):
                os.unlink(p)

    def registrations(self) -> list[tuple[Path, dict]]:
        """Every workspace registration: (its file, its document with its journal; {} when
        unreadable)."""
        return [
            (Path(e.path), self._read_registration(Path(e.path)))
            for e in sorted(_scan(self.roots), key=lambda e: e.name)
            if e.name.endswith(".json")
        ]

    # ------------------------------------------------------------------- target index (why)
    # NB: what each action id was last built as (key, description pack, attributes), for
    # "why" and `rsi cache`. Sharded by a hash of the id (targets/index/<xx>.json, 256
    # shards), so a build reads and rewrites only the shards of the actions it ran: a one-file
    # index of 100,000 actions is ~35 MB to parse and write again on every build. A concurrent
    # build may lose the other's update of a shard, which only weakens "why", never
    # correctness. `targets/index.json` is the one-file index of older stores: read as the
    # base of every shard, and folded into the shards at the first write.
    def _target_index_path(self) -> Path:
        return self.targets / "index.json"

    def _index_dir(self) -> Path:
        return self.targets / "index"

    @staticmethod
    def index_shard(action_id: str) -> str:
        return sha256(action_id.encode()).hexdigest()[:2]

    def index_signature(self) -> tuple | None:
        """Changes whenever any index shard (or the old one-file index) is replaced."""
        sig = []
        for path in (self._index_dir(), self._target_index_path()):
            try:
                st = os.stat(path)
            except OSError:
                sig.append(None)
                continue
            sig.append((st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        return None if sig == [None, None] else tuple(sig)

    def index_details(self, action_id: str, entry: dict) -> tuple[dict | None, dict | None]:
        """(description, attributes) recorded for an action's last build; None where gone."""
        try:
            if entry.get("pack"):
                pack = self._packs.get(entry["pack"])
                if pack is None:
                    pack = json.loads(self.read_bytes(Digest.parse(entry["pack"])))
                    if len(self._packs) >= 4:  # NB: a few at a time bounds memory
                        self._packs.pop(next(iter(self._packs)))
                    self._packs[entry["pack"]] = pack
                item = pack.get(action_id) or {}
                return item.get("description"), item.get("attrs")
            if entry.get("description"):  # NB: stores written before packs existed
                return json.loads(self.read_bytes(Digest.parse(entry["description"]))), None
        except (RsiError, KeyError, ValueError):
            pass
        return None, None

    def index_blobs(self, entry: dict) -> list[str]:
        return [Digest.parse(entry[k]).hash for k in ("pack", "description") if entry.get(k)]

    def _legacy_index(self) -> dict[str, dict]:
        path = self._target_index_path()
        try:
            st = os.stat(path)
        except OSError:
            return {}
        sig = (st.st_ino, st.st_size, st.st_mtime_ns)
        cached = self._legacy_cached
        if cached is None or cached[0] != sig:
            cached = self._legacy_cached = (sig, _read_json(path))
        return dict(cached[1])

    def load_index_shard(self, shard: str) -> dict[str, dict]:
        """The entries of one shard (with the old one-file index's entries for it beneath)."""
        found = _read_json(self._index_dir() / f"{shard}.json")
        entries = found if isinstance(found, dict) else {}
        if self._target_index_path().exists():
            old = {k: v for k, v in self._legacy_index().items() if self.index_shard(k) == shard}
            entries = {**old, **entries}
        return entries

    def load_target_index(self) -> dict[str, dict]:
        index = self._legacy_index()
        for entry in _scan(self._index_dir()):
            if entry.name.endswith(".json"):
                found = _read_json(Path(entry.path))
                if isinstance(found, dict):
                    index.update(found)
        return index

    def _write_shard(self, shard: str, entries: dict) -> None:
        path = self._index_dir() / f"{shard}.json"
        if not entries:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            return
        atomic_write_bytes(path, json.dumps(entries).encode(), fsync=False)

    def save_target_index(self, updates: dict[str, dict]) -> None:
        """Update the entries of these action ids (rewriting only their shards)."""
        if not updates:
            return
        try:
            self._index_dir().mkdir(exist_ok=True)
            if self._target_index_path().exists():
                # NB: fold the old one-file index into the shards once
                self.write_target_index({**self.load_target_index(), **updates})
                return
            by_shard: dict[str, dict] = {}
            for action_id, entry in updates.items():
                by_shard.setdefault(self.index_shard(action_id), {})[action_id] = entry
            for shard, entries in by_shard.items():
                self._write_shard(shard, {**self.load_index_shard(shard), **entries})
        except OSError as exc:
            raise store_write_error(self.root, exc) from exc

    def write_target_index(self, index: dict[str, dict]) -> None:
        """Replace the whole index with `index` (cache gc); raises OSError."""
        self._index_dir().mkdir(exist_ok=True)
        by_shard: dict[str, dict] = {}
        for action_id, entry in index.items():
            by_shard.setdefault(self.index_shard(action_id), {})[action_id] = entry
        present = {e.name[:-5] for e in _scan(self._index_dir()) if e.name.endswith(".json")}
        for shard in sorted(present | set(by_shard)):
            self._write_shard(shard, by_shard.get(shard, {}))
        with contextlib.suppress(FileNotFoundError):
            self._target_index_path().unlink()


class LazyIndex:
    """The target index as a mapping read shard by shard on first use (a build that runs
    three actions reads three shards), remembering what the build sets."""

    def __init__(self, store: LocalStore) -> None:
        self._store = store
        self._shards: dict[str, dict] = {}

    def _shard(self, action_id: str) -> dict:
        shard = self._store.index_shard(action_id)
        entries = self._shards.get(shard)
        if entries is None:
            entries = self._shards[shard] = self._store.load_index_shard(shard)
        return entries

    def get(self, action_id: str, default=None):
        return self._shard(action_id).get(action_id, default)

    def __setitem__(self, action_id: str, entry: dict) -> None:
        self._shard(action_id)[action_id] = entry


def _scan(folder: str | os.PathLike) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _entries(folder: Path) -> Iterator[tuple[str, Path]]:
    """`(name, path)` of every entry in a sharded folder; temporaries and strays are skipped."""
    for shard in sorted(_scan(folder), key=lambda e: e.name):
        if not _SHARD.fullmatch(shard.name) or not shard.is_dir(follow_symlinks=False):
            continue
        for entry in sorted(_scan(shard.path), key=lambda e: e.name):
            if _ENTRY.fullmatch(entry.name):
                yield entry.name, Path(entry.path)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _stat_sig(st: os.stat_result) -> list[int]:
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _read_json(path: Path) -> dict:
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}
