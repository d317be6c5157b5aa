"""The store's gc roots: every workspace that builds with a store records there the action keys it
references (`roots/<hash>.json` and its journal), so `cache gc` run from one workspace keeps what
the others still use. Must never lose a registration to a crash (old or new file, never half of
one) and never read the blobs or entries the keys name (that is `store.py` and `cacheops.py`)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from rsi.fsutil import (
    atomic_write_bytes,
    name_hash,
    open_regular,
    path_signatures,
    read_regular,
    scan_dir,
    stat_signature,
    store_write_error,
)

ROOT_SCHEMA = "rsi.gcroot/1"
# NB: a registration's journal is folded into it past this size (see `GcRoots.update`)
JOURNAL_BYTES = 256 << 10


class GcRoots:
    """The `roots/` folder of the store at `store_root` (temporaries go to `tmp`)."""

    def __init__(self, store_root: Path, tmp: Path) -> None:
        self.store_root = store_root
        self.folder = store_root / "roots"
        self.tmp = tmp

    def path_for(self, workspace: Path) -> Path:
        name = name_hash(str(workspace))[:32]
        return self.folder / f"{name}.json"

    # NB: a registration is `roots/<name>.json` and, beside it, a journal `<name>.journal`:
    # a first line naming the registration file it extends (its stat signature), then one
    # JSON line of updates per build. A one-change build appends its few new keys instead of
    # rewriting the keys of every action; a journal naming another file (the registration was
    # rewritten since, folding it in) is stale and ignored, so a crash at any point leaves
    # either the old registration or the new one.
    @staticmethod
    def _journal_path(path: Path) -> Path:
        return path.with_suffix(".journal")

    def signature(self, workspace: Path) -> tuple | None:
        """Changes whenever the registration file is rewritten or its journal grows."""
        path = self.path_for(workspace)
        sigs = path_signatures((path, self._journal_path(path)))
        return None if sigs[0] is None else tuple(sigs)

    def read(self, path: Path) -> dict:
        """The registration document with its journal (when it extends this file) applied."""
        try:
            with os.fdopen(open_regular(path), "rb") as f:
                st = os.fstat(f.fileno())
                doc = json.loads(f.read())
        except (OSError, ValueError):
            return {}
        if not isinstance(doc, dict):
            return {}
        actions = doc.get("actions")
        if isinstance(actions, dict):
            for update in self._journal_updates(path, stat_signature(st)):
                actions.update(update)
        return doc

    def _journal_updates(self, path: Path, base_sig: list) -> list[dict]:
        try:
            lines = read_regular(self._journal_path(path)).splitlines()
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

    def register(self, workspace: Path, actions: dict[str, dict]) -> None:
        """Add `actions` (action id -> {"key", "label"}) to what `workspace` references."""
        path = self.path_for(workspace)
        with self._lock():
            doc = self.read(path)
            known = doc.get("actions") if doc.get("workspace") == str(workspace) else None
            known = known if isinstance(known, dict) else {}
            merged = {**known, **actions}
            if path.exists() and merged == known:
                return  # NB: a no-op build writes nothing
            self.write(path, workspace, merged)

    def update(self, workspace: Path, actions: dict[str, dict]) -> None:
        """Add `actions` to what `workspace` references, known to be registered already but
        for these: appended to the journal, without reading or rewriting the registration
        (folded into it once the journal outgrows `JOURNAL_BYTES`)."""
        if not actions:
            return
        path = self.path_for(workspace)
        journal = self._journal_path(path)
        with self._lock():
            try:
                base = stat_signature(os.stat(path))
            except OSError:
                base = None
            try:
                size = os.stat(journal).st_size
            except OSError:
                size = 0
            fresh = size == 0 or self._journal_header(journal) != base
            if base is None or size > JOURNAL_BYTES:
                doc = self.read(path) if base is not None else {}
                known = doc.get("actions") if doc.get("workspace") == str(workspace) else None
                known = known if isinstance(known, dict) else {}
                self.write(path, workspace, {**known, **actions})
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
                raise store_write_error(self.store_root, exc) from exc

    @staticmethod
    def _journal_header(journal: Path) -> list | None:
        try:
            with os.fdopen(open_regular(journal), "rb") as f:
                return json.loads(f.readline()).get("extends")
        except (OSError, ValueError, AttributeError):
            return None

    @contextmanager
    def _lock(self) -> Iterator[None]:
        try:
            self.folder.mkdir(exist_ok=True)
            fd = os.open(self.store_root / "roots.lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise store_write_error(self.store_root, exc) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def write(self, path: Path, workspace: Path, actions: dict) -> None:
        """Replace the registration at `path` (folding its journal in)."""
        doc = {"schema": ROOT_SCHEMA, "workspace": str(workspace), "actions": actions}
        try:
            atomic_write_bytes(path, json.dumps(doc, sort_keys=True).encode(), tmp_dir=self.tmp)
        except OSError as exc:
            raise store_write_error(self.store_root, exc) from exc
        # NB: stale now (it names the file just replaced); removed so it is not read again
        with contextlib.suppress(OSError):
            os.unlink(self._journal_path(path))

    def drop(self, path: Path) -> None:
        for p in (path, self._journal_path(path)):
            with contextlib.suppress(OSError):
                os.unlink(p)

    def all(self) -> list[tuple[Path, dict]]:
        """Every workspace registration: (its file, its document with its journal; {} when
        unreadable)."""
        return [
            (Path(e.path), self.read(Path(e.path)))
            for e in sorted(scan_dir(self.folder), key=lambda e: e.name)
            if e.name.endswith(".json")
        ]
