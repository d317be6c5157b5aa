"""The store's target index: what each action id was last built as (key, description pack,
attributes), for "why" and `rsi cache`, sharded so a build rewrites only the shards of the actions
it ran. Must never be read to decide whether an action runs: losing an update weakens "why",
never correctness."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Callable

from rsi.digest import Digest
from rsi.errors import RsiError
from rsi.fsutil import (
    atomic_write_bytes,
    name_hash,
    path_signatures,
    read_json_object,
    scan_dir,
    store_write_error,
)


# NB: sharded by a hash of the id (targets/index/<xx>.json, 256 shards), so a build reads and
# rewrites only the shards of the actions it ran: a one-file index of 100,000 actions is ~35 MB
# to parse and write again on every build. A concurrent build may lose the other's update of a
# shard, which only weakens "why", never correctness. `targets/index.json` is the one-file index
# of older stores: read as the base of every shard, and folded into the shards at the first write.
class TargetIndex:
    """The index under `targets`; description packs are read through `read_blob` (verified)."""

    def __init__(
        self, store_root: Path, targets: Path, read_blob: Callable[[Digest], bytes]
    ) -> None:
        self.store_root = store_root
        self.folder = targets / "index"
        self.legacy = targets / "index.json"
        self._read_blob = read_blob
        self._packs: dict[str, dict] = {}
        # NB: an older store's one-file index, parsed once per (inode, size, mtime)
        self._legacy_cached: tuple | None = None

    @staticmethod
    def shard_of(action_id: str) -> str:
        return name_hash(action_id)[:2]

    def signature(self) -> tuple | None:
        """Changes whenever any index shard (or the old one-file index) is replaced."""
        sig = path_signatures((self.folder, self.legacy))
        return None if sig == [None, None] else tuple(sig)

    def details(self, action_id: str, entry: dict) -> tuple[dict | None, dict | None]:
        """(description, attributes) recorded for an action's last build; None where gone."""
        try:
            if entry.get("pack"):
                pack = self._packs.get(entry["pack"])
                if pack is None:
                    pack = json.loads(self._read_blob(Digest.parse(entry["pack"])))
                    if len(self._packs) >= 4:  # NB: a few at a time bounds memory
                        self._packs.pop(next(iter(self._packs)))
                    self._packs[entry["pack"]] = pack
                item = pack.get(action_id) or {}
                return item.get("description"), item.get("attrs")
            if entry.get("description"):  # NB: stores written before packs existed
                return json.loads(self._read_blob(Digest.parse(entry["description"]))), None
        except (RsiError, KeyError, ValueError):
            pass
        return None, None

    @staticmethod
    def blobs(entry: dict) -> list[str]:
        """The blob hashes an entry keeps alive (its pack or description)."""
        return [Digest.parse(entry[k]).hash for k in ("pack", "description") if entry.get(k)]

    def _legacy_index(self) -> dict[str, dict]:
        try:
            st = os.stat(self.legacy)
        except OSError:
            return {}
        sig = (st.st_ino, st.st_size, st.st_mtime_ns)
        cached = self._legacy_cached
        if cached is None or cached[0] != sig:
            cached = self._legacy_cached = (sig, read_json_object(self.legacy))
        return dict(cached[1])

    def load_shard(self, shard: str) -> dict[str, dict]:
        """The entries of one shard (with the old one-file index's entries for it beneath)."""
        entries = read_json_object(self.folder / f"{shard}.json")
        if self.legacy.exists():
            old = {k: v for k, v in self._legacy_index().items() if self.shard_of(k) == shard}
            entries = {**old, **entries}
        return entries

    def load_all(self) -> dict[str, dict]:
        index = self._legacy_index()
        for entry in scan_dir(self.folder):
            if entry.name.endswith(".json"):
                index.update(read_json_object(Path(entry.path)))
        return index

    def _write_shard(self, shard: str, entries: dict) -> None:
        path = self.folder / f"{shard}.json"
        if not entries:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            return
        atomic_write_bytes(path, json.dumps(entries).encode(), fsync=False)

    def save(self, updates: dict[str, dict]) -> None:
        """Update the entries of these action ids (rewriting only their shards)."""
        if not updates:
            return
        try:
            self.folder.mkdir(exist_ok=True)
            if self.legacy.exists():
                # NB: fold the old one-file index into the shards once
                self.replace_all({**self.load_all(), **updates})
                return
            by_shard: dict[str, dict] = {}
            for action_id, entry in updates.items():
                by_shard.setdefault(self.shard_of(action_id), {})[action_id] = entry
            for shard, entries in by_shard.items():
                self._write_shard(shard, {**self.load_shard(shard), **entries})
        except OSError as exc:
            raise store_write_error(self.store_root, exc) from exc

    def replace_all(self, index: dict[str, dict]) -> None:
        """Replace the whole index with `index` (cache gc); raises OSError."""
        self.folder.mkdir(exist_ok=True)
        by_shard: dict[str, dict] = {}
        for action_id, entry in index.items():
            by_shard.setdefault(self.shard_of(action_id), {})[action_id] = entry
        present = {e.name[:-5] for e in scan_dir(self.folder) if e.name.endswith(".json")}
        for shard in sorted(present | set(by_shard)):
            self._write_shard(shard, by_shard.get(shard, {}))
        with contextlib.suppress(FileNotFoundError):
            self.legacy.unlink()


class LazyIndex:
    """The target index as a mapping read shard by shard on first use (a build that runs
    three actions reads three shards), remembering what the build sets."""

    def __init__(self, index: TargetIndex) -> None:
        self._index = index
        self._shards: dict[str, dict] = {}

    def _shard(self, action_id: str) -> dict:
        shard = self._index.shard_of(action_id)
        entries = self._shards.get(shard)
        if entries is None:
            entries = self._shards[shard] = self._index.load_shard(shard)
        return entries

    def get(self, action_id: str, default=None):
        return self._shard(action_id).get(action_id, default)

    def __setitem__(self, action_id: str, entry: dict) -> None:
        self._shard(action_id)[action_id] = entry
