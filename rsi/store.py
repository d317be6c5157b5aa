"""The local store: content-addressed blobs and the action cache, on disk, crash-safe.

Layout (Bazel's disk cache): `cas/ab/<hash>` blobs, `ac/ab/<key>` action results, `targets/`
the last key per action id (for "why did this rebuild?"). Every write is temp file + rename, made
durable by an fsync each or, during a scheduler run, by group commit (`sync_each`); every read
that serves content verifies it; a corrupt entry is deleted and reported, never served.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Iterator

from rsi.action import ActionResult
from rsi.canonical import canonical_bytes
from rsi.digest import DEFAULT_FUNCTION, Digest, FileDigestMemo, digest_bytes, digest_file
from rsi.errors import CorruptEntry, RsiError, StoreError
from rsi.fsutil import atomic_write_bytes, store_write_error

STORE_SCHEMA = "rsi.store/1"
_SMALL_COPY = 1 << 20


@lru_cache(maxsize=1)
def _syncfs():
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None


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
        self._packs: dict[str, dict] = {}
        # NB: True: every blob and entry is fsynced before its rename. A scheduler turns it off
        # for a run and group-commits instead: one `sync()` before each batch of action-cache
        # entries makes the blobs they name durable first, and one more at the end.
        self.sync_each = True
        self._cas_s, self._ac_s = str(self.cas), str(self.ac)
        self._init()
        self.blob_memo = FileDigestMemo(self.root / "blob-memo.json", self.function)
        self.file_memo = FileDigestMemo(self.root / "file-memo.json", self.function)

    # ------------------------------------------------------------------------------ layout
    def _init(self) -> None:
        meta = self.root / "STORE.json"
        try:
            for d in (self.cas, self.ac, self.targets, self.tmp, self.events_dir):
                d.mkdir(parents=True, exist_ok=True)
            if not meta.exists():
                atomic_write_bytes(
                    meta,
                    json.dumps({"schema": STORE_SCHEMA, "digest_function": self.function}).encode(),
                )
        except OSError as exc:
            raise store_write_error(self.root, exc) from exc
        try:
            found = json.loads(meta.read_text()).get("digest_function")
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
        return Path(tempfile.mkdtemp(dir=self.tmp, prefix=f"{prefix}-{os.getpid()}-"))

    # ------------------------------------------------------------------------------- blobs
    def blob_path(self, digest: Digest) -> Path:
        return Path(_shard(self._cas_s, digest.hash))

    def has(self, digest: Digest) -> bool:
        try:
            return os.stat(_shard(self._cas_s, digest.hash)).st_size == digest.size
        except OSError:
            return False

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
                atomic_write_bytes(path, data, mode=0o444, fsync=fsync and self.sync_each)
            except OSError as exc:
                raise store_write_error(self.root, exc) from exc
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
                self.cas.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=self.cas, prefix=".tmp-")
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
                try:
                    os.replace(tmp, path)
                except FileNotFoundError:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(tmp, path)
            except BaseException:
                if not move and os.path.exists(tmp):
                    os.unlink(tmp)
                raise
        except OSError as exc:
            raise store_write_error(self.root, exc) from exc
        return digest

    def sync(self) -> None:
        """Make every write so far durable at once (group commit, see `sync_each`)."""
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
        if not self.has_verified(digest):
            raise CorruptEntry(f"blob {digest} is missing or corrupt in {self.cas}")
        mode = 0o755 if executable else 0o644
        try:
            if atomic:
                fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
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
            result = self.parse_action_result(raw)
        except (ValueError, KeyError, TypeError):
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

    def parse_action_result(self, raw: bytes) -> ActionResult:
        """An action-cache entry's result; ValueError/KeyError/TypeError when it is corrupt."""
        doc = json.loads(raw)
        body = doc["result"]
        if doc.get("integrity") != digest_bytes(canonical_bytes(body), self.function).hash:
            raise ValueError("integrity mismatch")
        return ActionResult.from_json(body)

    def put_action_result(self, key: Digest, result: ActionResult) -> None:
        body = canonical_bytes(result.to_json())
        integrity = digest_bytes(body, self.function).hash
        # NB: the same bytes json.dumps(sort_keys=True) would give, without encoding twice
        data = b'{"integrity": "' + integrity.encode() + b'", "result": ' + body + b"}"
        try:
            atomic_write_bytes(self._ac_path(key), data, fsync=self.sync_each)
        except OSError as exc:
            raise store_write_error(self.root, exc) from exc

    def iter_action_keys(self) -> Iterator[Digest]:
        for shard in sorted(self.ac.iterdir()) if self.ac.exists() else ():
            for entry in sorted(shard.iterdir()):
                if not entry.name.startswith("."):
                    yield Digest(entry.name, 0)

    def iter_blobs(self) -> Iterator[tuple[str, Path]]:
        for shard in sorted(self.cas.iterdir()) if self.cas.exists() else ():
            for entry in sorted(shard.iterdir()):
                if not entry.name.startswith("."):
                    yield entry.name, entry

    # ------------------------------------------------------------------- target index (why)
    # NB: one small file for all action ids, so a no-op build reads it once; a concurrent
    # build may lose the other's index updates, which only weakens "why", never correctness.
    def _target_index_path(self) -> Path:
        return self.targets / "index.json"

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

    def load_target_index(self) -> dict[str, dict]:
        try:
            return json.loads(self._target_index_path().read_bytes())
        except (OSError, ValueError):
            return {}

    def save_target_index(self, updates: dict[str, dict]) -> None:
        if not updates:
            return
        index = self.load_target_index()
        index.update(updates)
        try:
            atomic_write_bytes(self._target_index_path(), json.dumps(index).encode(), fsync=False)
        except OSError as exc:
            raise store_write_error(self.root, exc) from exc
