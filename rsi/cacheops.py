"""Inspecting and maintaining the local store: ls, show, verify, gc, stats.

gc keeps what any registered, existing workspace references (`<store>/roots/`), never only
what the workspace running it does, and every blob a rule family's `rsi.gc_roots` entry point
names (the campaign logs); it removes before it rewrites, so a full disk cannot leave a kept
result without its blobs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from rsi.digest import Digest, digest_file
from rsi.errors import StoreError, UsageError
from rsi.fsutil import remove_tree
from rsi.store import LocalStore, OutdatedEntry


def _labels_by_key(store: LocalStore) -> dict[str, dict]:
    return {
        entry["key"].split("/")[0]: {"id": action_id, **entry}
        for action_id, entry in store.target_index.load_all().items()
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
    index = store.target_index.load_all()
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
    desc, _ = store.target_index.details(entry["id"], entry)
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
    # NB: entries of an older format cannot show which key they belong to: removed (they are
    # rebuilt), but not corruption
    outdated_actions: list[str] = field(default_factory=list)
    stale_temporaries: list[str] = field(default_factory=list)

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
            "outdated_actions": self.outdated_actions,
            "stale_temporaries": self.stale_temporaries,
        }


def cache_verify(store: LocalStore) -> VerifyReport:
    """Re-hash every blob and check every action result (against the key it is filed under);
    remove whatever fails, and what killed writers left behind."""
    report = VerifyReport()
    report.stale_temporaries = store.remove_stale_temporaries()
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
            result = store.parse_action_result(path.read_bytes(), key)
            missing = [d for d in result.blobs() if not store.has(d)]
            if missing:
                raise ValueError("missing blobs")
        except OutdatedEntry:
            report.outdated_actions.append(key.hash)
            store._quarantine(path)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
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
        "tracked_actions": len(store.target_index.load_all()),
        "workspaces": sorted(
            str(doc.get("workspace")) for _, doc in store.gc_roots.all() if doc.get("workspace")
        ),
    }


def _workspace_exists(path: str) -> bool:
    return bool(path) and (Path(path) / "rsi.toml").is_file()


def cache_gc(
    store: LocalStore,
    keep_labels: set[str] | None,
    dry_run: bool,
    workspace: Path | None = None,
) -> dict:
    """Keep the action results `workspace` reaches (its targets, or `keep_labels`), those of
    every other registered workspace that still exists, and every blob they reference; remove
    the rest. Never removes a blob a kept result references.

    Order, for a crash or a full disk at any point: action results go first, then blobs no
    kept result names, then the target index and registrations are rewritten; removing needs
    no space, and an index naming a removed result only means a miss.

    Rule families add roots of their own (the campaign logs' candidate files) through the
    `rsi.gc_roots` entry point group; one that fails stops gc before it removes anything.
    """
    from rsi.registry import gc_root_blobs

    family_roots = gc_root_blobs(store)
    index = store.target_index.load_all()
    mine_path = store.gc_roots.path_for(workspace) if workspace is not None else None
    root_keys: set[str] = set()
    mine: dict[str, dict] = {}
    others: list[str] = []
    dropped: list[dict] = []
    for path, doc in store.gc_roots.all():
        actions = doc.get("actions")
        if path == mine_path:
            mine = actions if isinstance(actions, dict) else {}
            continue
        where = doc.get("workspace")
        if not isinstance(actions, dict) or not isinstance(where, str):
            reason = "its registration is unreadable"
            dropped.append({"workspace": where, "file": str(path), "reason": reason})
            continue
        if not _workspace_exists(where):
            dropped.append({"workspace": where, "file": str(path), "reason": "its folder is gone"})
            continue
        others.append(where)
        for entry in actions.values():
            if isinstance(entry, dict) and isinstance(entry.get("key"), str):
                root_keys.add(entry["key"].split("/")[0])

    def wanted(entry: dict) -> bool:
        return keep_labels is None or entry.get("label") in keep_labels

    my_keep = {i: e for i, e in mine.items() if isinstance(e, dict) and wanted(e)}
    for entry in [*my_keep.values(), *(e for e in index.values() if wanted(e))]:
        if isinstance(entry.get("key"), str):
            root_keys.add(entry["key"].split("/")[0])

    kept_keys: set[str] = set()
    kept_blobs: set[str] = set()
    for key_hash in sorted(root_keys):
        result = store.get_action_result(Digest(key_hash, 0), check_blobs=False)
        if result is None:
            continue
        kept_keys.add(key_hash)
        kept_blobs.update(d.hash for d in result.blobs())
    new_index = {}
    for action_id, entry in index.items():
        if entry.get("key", "").split("/")[0] in kept_keys:
            new_index[action_id] = entry
            kept_blobs.update(store.target_index.blobs(entry))
    kept_blobs |= family_roots
    my_new = {i: e for i, e in my_keep.items() if str(e.get("key")).split("/")[0] in kept_keys}

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
    temporaries: list[str] = []
    # NB: the prepared input trees (rsi/executors/staged.py) hard-link blobs: a blob removed
    # here would stay on disk through them. They are a cache, rebuilt when next used, and no
    # build holds one while gc holds the store lock exclusive: gc removes them all
    stage = store.root / "stage"
    trees = sum(1 for p in stage.iterdir() if p.is_dir()) if stage.is_dir() else 0
    if not dry_run:
        if trees:
            remove_tree(stage)
        temporaries = store.remove_stale_temporaries()
        for k in removed_actions:
            store._quarantine(store._ac_path(Digest(k, 0)))
        for name in removed_blobs:
            store._quarantine(store.cas / name[:2] / name)
        for gone in dropped:
            store.gc_roots.drop(Path(gone["file"]))
        try:
            os.unlink(store.root / "blob-memo.json")
        except OSError:
            pass
        _rewrite(store, index, new_index, workspace, mine_path, mine, my_new, removed_actions)
    return {
        "dry_run": dry_run,
        "kept_actions": len(kept_keys),
        "kept_blobs": len(kept_blobs),
        "removed_actions": removed_actions,
        "removed_blobs": removed_blobs,
        "freed_bytes": freed,
        "workspaces": sorted(others),
        "dropped_workspaces": dropped,
        "removed_temporaries": temporaries,
        "removed_input_trees": trees,
    }


def _rewrite(
    store: LocalStore,
    index: dict,
    new_index: dict,
    workspace: Path | None,
    mine_path: Path | None,
    mine: dict,
    my_new: dict,
    removed_actions: list[str],
) -> None:
    """The writes of gc, after its removals: the target index and this workspace's roots."""
    path = store.target_index.folder
    try:
        if new_index != index:
            store.target_index.replace_all(new_index)
        if workspace is not None and mine_path is not None and my_new != mine:
            path = mine_path
            store.gc_roots.write(mine_path, workspace, my_new)
    except (OSError, StoreError) as exc:
        cause = exc.__cause__ if isinstance(exc, StoreError) else exc
        reason = getattr(cause, "strerror", None) or str(cause or exc)
        raise StoreError(
            f"cache gc removed {len(removed_actions)} action results and the blobs only they "
            f"named, but could not rewrite {path}: {reason}. Nothing half-deleted: every kept "
            "result still has its blobs, and an entry naming a removed result is only a miss",
            hint="free some disk space and run `rsi cache gc` again to finish",
        ) from exc
