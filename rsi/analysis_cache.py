"""The analysis cache: a no-op build skips loading and analysis when nothing analysis read changed.

Analysis reads declaration files, checks that sources exist, lists folders, and writes small
blobs. `Tracker` records each of those reads; a cached analysis is reused only when every
recorded read gives the same answer again, the engine and rule code are unchanged, and the
interpreter's packages are unchanged. Anything unreadable or unexpected means: analyse again.
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path
from typing import Any, Iterable

from rsi import __version__
from rsi.digest import Digest, FileDigestMemo, digest_bytes, digest_value
from rsi.fsutil import atomic_write_bytes

SCHEMA = "rsi.analysis/1"


def _stat_sig(path: str) -> list:
    try:
        st = os.stat(path)
    except (OSError, ValueError):  # NB: ValueError: a NUL in the path
        return ["absent"]
    # NB: the real path too: a folder on the way swapped for a symlink out of the workspace
    # must re-run analysis, which refuses it (rule.py), not reuse the old verdict
    kind = "dir" if os.path.isdir(path) else "file"
    return [kind, bool(st.st_mode & 0o111), os.path.realpath(path)]


def _tree_sig(path: str, exclude: tuple[str, ...]) -> str:
    items = []
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = sorted(d for d in dirnames if d not in exclude)
        rel = os.path.relpath(dirpath, path)
        for name in sorted(filenames + dirnames):
            full = os.path.join(dirpath, name)
            if os.path.islink(full):
                items.append([rel, name, "link", os.readlink(full)])
            elif os.path.isfile(full):
                items.append([rel, name, "file", os.access(full, os.X_OK)])
    return digest_value(items).hash


class Tracker:
    """What analysis read, so it can be checked again cheaply."""

    def __init__(self, memo: FileDigestMemo) -> None:
        self.memo = memo
        self.files: dict[str, str] = {}
        self.stats: dict[str, list] = {}
        self.trees: dict[str, list] = {}
        self.walks: dict[str, list[str]] = {}
        self.blobs: set[str] = set()

    def file(self, path: str | os.PathLike) -> None:
        p = os.fspath(path)
        try:
            self.files[p] = self.memo.digest(p).hash
        except OSError:
            self.files[p] = "absent"

    def stat(self, path: str | os.PathLike) -> None:
        self.stats[os.fspath(path)] = _stat_sig(os.fspath(path))

    def tree(self, path: str | os.PathLike, exclude: tuple[str, ...]) -> None:
        p = os.fspath(path)
        self.trees[p] = [list(exclude), _tree_sig(p, exclude)]

    def walk(self, root: str, found: list[str]) -> None:
        self.walks[root] = list(found)

    def blob(self, digest: Digest) -> None:
        self.blobs.add(str(digest))

    def still_valid(self, store, walker) -> bool:
        for p, want in self.files.items():
            try:
                got = self.memo.digest(p).hash
            except OSError:
                got = "absent"
            if got != want:
                return False
        if any(_stat_sig(p) != want for p, want in self.stats.items()):
            return False
        if any(_tree_sig(p, tuple(ex)) != sig for p, (ex, sig) in self.trees.items()):
            return False
        if any(list(walker(root)) != found for root, found in self.walks.items()):
            return False
        return all(store.has(Digest.parse(d)) for d in self.blobs)

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "memo"}


def _code_digest(memo: FileDigestMemo, rule_modules: Iterable[str]) -> str:
    """Engine and rule-family source files, plus the interpreter's installed packages."""
    parts: list = [__version__, sys.version, sys.executable]
    roots = {Path(__file__).resolve().parent}
    for name in rule_modules:
        # NB: the top-level package of every module that implements a rule, so helpers it
        # imports from its own package count too
        top = sys.modules.get(name.split(".")[0])
        path = getattr(top, "__file__", None) if top is not None else None
        if path:
            roots.add(Path(path).resolve().parent)
    for root in sorted(roots):
        if root.name in ("site-packages", "dist-packages"):
            continue  # NB: a single-file module; its installed-packages dir is covered below
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(filenames):
                if name.endswith(".py"):
                    full = os.path.join(dirpath, name)
                    parts.append([full, memo.digest(full).hash])
    for entry in sys.path:
        if entry.endswith(("site-packages", "dist-packages")):
            try:
                parts.append([entry, os.stat(entry).st_mtime_ns])
            except OSError:
                pass
    return digest_value(parts).hash


def cache_key(memo: FileDigestMemo, request: dict, rule_modules: Iterable[str] = ()) -> str:
    code = _code_digest(memo, rule_modules)
    return digest_value({"schema": SCHEMA, "code": code, **request}).hash


def load(store, key: str, walker) -> Any | None:
    path = store.root / "analysis" / key
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    head, _, payload = raw.partition(b"\n")
    if head.decode(errors="replace") != digest_bytes(payload, store.function).hash:
        return None
    try:
        labels, graph, tracker = pickle.loads(payload)
    except Exception:  # NB: any unpickling failure just means "analyse again"
        return None
    tracker.memo = store.file_memo
    if not tracker.still_valid(store, walker):
        return None
    return labels, graph


def save(store, key: str, labels, graph, tracker: Tracker) -> None:
    try:
        payload = pickle.dumps((labels, graph, tracker), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # NB: a rule holding something unpicklable just goes uncached
        return
    head = digest_bytes(payload, store.function).hash.encode()
    try:
        atomic_write_bytes(store.root / "analysis" / key, head + b"\n" + payload, fsync=False)
    except OSError:
        pass  # NB: a speed-up only
