"""Inspecting and maintaining the local store: ls, show, verify, gc, stats."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

from rsi.digest import Digest, digest_file
from rsi.errors import UsageError
from rsi.store import LocalStore


def _labels_by_key(store: LocalStore) -> dict[str, dict]:
    return {
        entry["key"].split("/")[0]: {"id": action_id, **entry}
        for action_id, entry in store.load_target_index().items()
    }


def cache_ls(store: LocalStore) -> list[dict]:
    names = _labels_by_key(store)
    rows = []
    for key in store.iter_action_keys():
        result = store.get_action_result(key, check_blobs=False)
        info = names.get(key.hash, {})
        rows.append(
            {
                "key": key.hash,
                "action": info.get("id"),
                "exit_code": result.exit_code if result else None,
                "outputs": len(result.outputs) if result else None,
                "bytes": sum(o.digest.size for o in result.outputs) if result else None,
                "executor": result.executor if result else None,
                "corrupt": result is None,
            }
        )
    return rows


def cache_show(store: LocalStore, what: str) -> dict:
    index = store.load_target_index()
    entry = None
    for action_id, e in index.items():
        if what in (action_id, e.get("label")) or e["key"].startswith(what):
            entry = {"id": action_id, **e}
            break
    if entry is None:
        raise UsageError(
            f"nothing in the cache matches {what!r}",
            hint="give an action key prefix, a label or an action id (rsi cache ls)",
        )
    key = Digest.parse(entry["key"])
    result = store.get_action_result(key, check_blobs=False)
    desc, _ = store.index_details(entry["id"], entry)
    return {
        "action": entry["id"],
        "label": entry.get("label"),
        "key": entry["key"],
        "description": desc,
        "result": result.to_json() if result else None,
    }


@dataclass
class VerifyReport:
    blobs: int = 0
    actions: int = 0
    corrupt_blobs: list[str] = field(default_factory=list)
    corrupt_actions: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.corrupt_blobs and not self.corrupt_actions

    def to_json(self) -> dict:
        return {
            "clean": self.clean,
            "blobs": self.blobs,
            "actions": self.actions,
            "corrupt_blobs": self.corrupt_blobs,
            "corrupt_actions": self.corrupt_actions,
        }


def cache_verify(store: LocalStore) -> VerifyReport:
    """Re-hash every blob and check every action result; remove whatever fails."""
    report = VerifyReport()
    for name, path in store.iter_blobs():
        report.blobs += 1
        try:
            ok = digest_file(path, store.function).hash == name
        except OSError:
            ok = False
        if not ok:
            report.corrupt_blobs.append(name)
            store._quarantine(path)
    for key in store.iter_action_keys():
        report.actions += 1
        path = store._ac_path(key)
        try:
            result = store.parse_action_result(path.read_bytes())
            missing = [d for d in result.blobs() if not store.has(d)]
            if missing:
                raise ValueError("missing blobs")
        except (OSError, ValueError, KeyError, TypeError):
            report.corrupt_actions.append(key.hash)
            store._quarantine(path)
    return report


def cache_stats(store: LocalStore) -> dict:
    blobs = blob_bytes = 0
    for _, path in store.iter_blobs():
        blobs += 1
        try:
            blob_bytes += path.stat().st_size
        except OSError:
            pass
    actions = sum(1 for _ in store.iter_action_keys())
    events = len(list(store.events_dir.glob("*.jsonl")))
    return {
        "store": str(store.root),
        "digest_function": store.function,
        "blobs": blobs,
        "blob_bytes": blob_bytes,
        "action_results": actions,
        "builds_logged": events,
        "tracked_actions": len(store.load_target_index()),
    }


_DIGEST_TEXT = re.compile(r"^([0-9a-f]{64})/\d+$")


def _logged_blobs(store: LocalStore) -> set[str]:
    """Blobs named by any append-only log under `<store>/campaigns/` (candidate snapshots,
    frozen project trees): gc roots, since a logged candidate may not have been built yet."""
    found: set[str] = set()

    def walk(value) -> None:
        if isinstance(value, str):
            m = _DIGEST_TEXT.match(value)
            if m:
                found.add(m.group(1))
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    for log in sorted((store.root / "campaigns").glob("*/*.jsonl")):
        try:
            lines = log.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                walk(json.loads(line))
            except ValueError:
                continue  # NB: a torn last line of a crashed writer
    return found


def cache_gc(store: LocalStore, keep_labels: set[str] | None, dry_run: bool) -> dict:
    """Keep action results of the workspace's targets (or named roots) and every blob they
    reference; remove the rest. Never removes a blob a kept result references."""
    index = store.load_target_index()
    kept_keys: set[str] = set()
    kept_blobs: set[str] = set()
    new_index = {}
    for action_id, entry in index.items():
        if keep_labels is not None and entry.get("label") not in keep_labels:
            continue
        key = Digest.parse(entry["key"])
        result = store.get_action_result(key, check_blobs=False)
        if result is None:
            continue
        kept_keys.add(key.hash)
        kept_blobs.update(d.hash for d in result.blobs())
        kept_blobs.update(store.index_blobs(entry))
        new_index[action_id] = entry
    kept_blobs |= _logged_blobs(store)
    removed_actions = [k.hash for k in store.iter_action_keys() if k.hash not in kept_keys]
    removed_blobs = []
    freed = 0
    for name, path in store.iter_blobs():
        if name not in kept_blobs:
            removed_blobs.append(name)
            try:
                freed += path.stat().st_size
            except OSError:
                pass
    if not dry_run:
        for k in removed_actions:
            store._quarantine(store._ac_path(Digest(k, 0)))
        for name in removed_blobs:
            store._quarantine(store.cas / name[:2] / name)
        idx = store._target_index_path()
        from rsi.fsutil import atomic_write_bytes

        atomic_write_bytes(idx, json.dumps(new_index).encode())
        try:
            os.unlink(store.root / "blob-memo.json")
        except OSError:
            pass
    return {
        "dry_run": dry_run,
        "kept_actions": len(kept_keys),
        "kept_blobs": len(kept_blobs),
        "removed_actions": removed_actions,
        "removed_blobs": removed_blobs,
        "freed_bytes": freed,
    }
