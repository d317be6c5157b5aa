"""Prepared input trees for actions with many inputs: kept between builds under the store's
`stage/` folder, one per action role (label, mnemonic, outputs), and brought to an action's
inputs by the difference from the last inputs the tree held, so a fan-in of 10,000 inputs whose
inputs changed by one file stages one file (hard links to the store's blobs, no copy).

It must never let an action write through to the store or into another action's inputs: a tree
is used only where the action runs as another uid than the blobs' owner (root hands the sandbox
uid 65534), inputs are root-owned and read-only (0444/0555) in folders the action cannot change
(input-only folders 0555, the others sticky 1777: an action creates its outputs but cannot
remove, rename, chmod or write an input), and every unchanged entry is checked by its stat
signature before each use (a racy or differing one is hashed again, a wrong one replaced).
"""

from __future__ import annotations

import fcntl
import hashlib
import marshal
import os
import stat
import time
from pathlib import Path

from rsi import native
from rsi.action import Action
from rsi.digest import Digest, FileNode, SymlinkNode, digest_file
from rsi.executors.base import copy_source
from rsi.fsutil import remove_tree
from rsi.store import LocalStore

# NB: below this many inputs a pooled slot's copy onto its tmpfs costs less than a sandbox of
# its own (3-10 ms to start); measured at 10,000 inputs: ~180 ms copied, ~20 ms checked here
TREE_MIN_INPUTS = 512
# NB: trees kept per store; the least recently used one beyond this is removed (its links
# keep blobs that `cache gc` removed on disk until then)
TREES_KEPT = 16
RACY_NS = 1_000_000_000
SANDBOX_UID = 65534
MANIFEST_SCHEMA = "rsi.stage/1"


def _sig(st: os.stat_result) -> tuple[int, int, int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_uid, st.st_mode)


def _content(node: FileNode | SymlinkNode) -> tuple:
    """What an entry must hold: the same content means the same tree entry."""
    if isinstance(node, SymlinkNode):
        return ("l", node.target)
    return ("f", node.digest.hash, node.digest.size, bool(node.executable))


def _dirs(paths) -> set[str]:
    found: set[str] = set()
    for rel in paths:
        if "/" not in rel:
            continue
        parts = rel.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            found.add("/".join(parts[:i]))
    return found


class Tree:
    """One locked, up-to-date prepared tree: `exec_dir` holds exactly the action's inputs (and
    the folders of its outputs). `close` removes what the action left and unlocks it."""

    def __init__(self, home: Path, lock_fd: int, action: Action) -> None:
        self.home = home
        self.exec_dir = home / "exec"
        self._lock_fd = lock_fd
        self._inputs = {rel for rel, _ in action.inputs}
        self._out_dirs = {""} | _dirs(action.outputs)
        self._in_dirs = _dirs(self._inputs)

    def leftovers(self) -> list[tuple[str, os.DirEntry]]:
        """Everything in the tree that is not an input or a needed folder: what the action
        wrote (outputs included). Only folders holding an output can be written by it."""
        found: list[tuple[str, os.DirEntry]] = []
        keep = self._inputs | self._out_dirs | self._in_dirs
        for d in sorted(self._out_dirs):
            try:
                with os.scandir(self.exec_dir / d if d else self.exec_dir) as it:
                    if d:
                        found += [(r, e) for e in it if (r := f"{d}/{e.name}") not in keep]
                    else:
                        found += [(e.name, e) for e in it if e.name not in keep]
            except FileNotFoundError:
                continue
        return found

    def written(self, cap: int) -> tuple[int, list[str]]:
        """(bytes the action left in the tree, the files that reached the size cap `cap`)."""
        total, full = 0, []
        for rel, e in self.leftovers():
            paths = [(rel, e.path)]
            if e.is_dir(follow_symlinks=False):
                paths = [
                    (os.path.relpath(os.path.join(dp, n), self.exec_dir), os.path.join(dp, n))
                    for dp, _, names in os.walk(e.path)
                    for n in names
                ]
            for r, p in paths:
                try:
                    st = os.lstat(p)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    total += st.st_blocks * 512
                    if st.st_size >= cap:
                        full.append(f"{r} reached the size cap")
        return total, full

    def clear(self) -> None:
        """Remove what the action left (its outputs were moved out already)."""
        for rel, e in self.leftovers():
            path = self.exec_dir / rel
            try:
                if e.is_dir(follow_symlinks=False):
                    remove_tree(path)
                else:
                    os.unlink(path)
            except FileNotFoundError:
                pass

    def close(self) -> None:
        try:
            self.clear()
            os.unlink(self.home / "busy")
        finally:
            os.close(self._lock_fd)


def usable(action: Action) -> bool:
    """A tree serves this action: many inputs, and a sandbox uid the blobs' owner is not.
    RSI_STAGE_TREES=0 turns trees off (bench/fanin.py --change-at compares both ways)."""
    if os.environ.get("RSI_STAGE_TREES", "1") == "0":
        return False
    return len(action.inputs) >= TREE_MIN_INPUTS and os.geteuid() == 0


def _home(store: LocalStore, action: Action) -> Path:
    role = repr((action.label, action.mnemonic, tuple(action.outputs), store.function))
    return store.root / "stage" / hashlib.blake2b(role.encode(), digest_size=12).hexdigest()


def open_tree(store: LocalStore, action: Action) -> Tree | None:
    """The action's prepared tree, locked and holding exactly its inputs; None when another
    build holds it (the caller stages the inputs the ordinary way)."""
    home = _home(store, action)
    try:
        if not home.exists():
            _evict(home.parent)
        home.mkdir(parents=True, exist_ok=True)
        fd = os.open(home / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return None  # NB: a store this build cannot write a tree in: staged the ordinary way
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    try:
        os.utime(home / "lock")  # NB: when it was last used, for eviction
        tree = Tree(home, fd, action)
        busy = home / "busy"
        if busy.exists():
            tree.clear()  # NB: what a run that was killed left (a closed one cleared its own)
        _update(store, action, tree)
        busy.touch()
        return tree
    except OSError:
        # NB: a full disk, a link limit: the next use rebuilds the tree whole
        try:
            os.unlink(home / "manifest")
        except OSError:
            pass
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise


def _read_manifest(path: Path) -> dict | None:
    try:
        with open(path, "rb") as f:
            doc = marshal.loads(f.read())  # NB: plain tuples: faster than pickle here
    except (OSError, EOFError, ValueError, TypeError):
        return None
    if not isinstance(doc, dict) or doc.get("schema") != MANIFEST_SCHEMA:
        return None
    return doc.get("entries")


def _update(store: LocalStore, action: Action, tree: Tree) -> None:
    """Bring `tree.exec_dir` to the action's inputs, changing only the entries that differ.
    Every kept entry is checked by its stat signature; one that is off is hashed again or
    remade, so a crash halfway (or a hand in the tree) costs a check, never a wrong input."""
    manifest = tree.home / "manifest"
    old = _read_manifest(manifest)
    ex = tree.exec_dir
    if old is None:
        if ex.exists():
            remove_tree(ex)
        old = {}
    ex.mkdir(exist_ok=True)
    new = {rel: (node, _content(node)) for rel, node in action.inputs}
    needed_dirs = tree._in_dirs | (tree._out_dirs - {""})
    changed = False
    # NB: folders are root's while changing, their modes set once the entries are in place
    # (a folder at the top the inputs no longer need goes with the action's leftovers)
    old_dirs = _dirs(old)
    for rel, e in list(old.items()):
        got = new.get(rel)
        if got is None or got[1] != e[0]:
            _unlink(ex / rel)
            del old[rel]
            changed = True
    for d in sorted(old_dirs - needed_dirs, key=lambda p: -p.count("/")):
        if os.path.lexists(ex / d):
            remove_tree(ex / d)
    for d in sorted(needed_dirs):
        try:
            os.mkdir(ex / d)
        except FileExistsError:
            pass
        os.chmod(ex / d, 0o755)
    now = time.time_ns()
    sources = dict(action.sources)
    entries: dict[str, tuple] = {}
    # NB: the kept entries with a trusted signature in one batch (rsi.native: a C loop over
    # threads where it is built): those still at it are kept as they are, each other one is
    # looked at below as before (every entry left in `old` holds its input's content)
    base = f"{ex}/"
    batch = {base + rel: e[1] for rel, e in old.items() if e[2]}
    moved = {path[len(base) :] for path in native.stale([batch])[0]} if batch else set()
    fd = os.open(ex, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for rel, (node, want) in new.items():
            e = old.get(rel)
            if e is not None and e[2] and rel not in moved:
                entries[rel] = e
                continue
            if e is not None:
                # NB: relative to the tree's descriptor: no walk of the tree's path per entry
                try:
                    st = os.lstat(rel, dir_fd=fd)
                except OSError:
                    st = None
                if st is not None:
                    sig = _sig(st)
                    if e[2] and sig == e[1]:
                        entries[rel] = e
                        continue
                    if _holds(store, ex / rel, st, node):
                        trusted = now - max(st.st_mtime_ns, st.st_ctime_ns) > RACY_NS
                        entries[rel] = (want, sig, trusted)
                        changed = True
                        continue
            changed = True
            path = ex / rel
            _unlink(path)  # NB: what a crash or a hand left there
            _make(store, path, rel, node, sources.get(rel))
            entries[rel] = (want, _sig(os.lstat(path)), False)
    finally:
        os.close(fd)
    # NB: the action may create outputs in folders holding one, nothing anywhere else
    for d in sorted(tree._out_dirs):
        os.chmod(ex / d if d else ex, 0o1777)
    for d in sorted(tree._in_dirs - tree._out_dirs, key=lambda p: -p.count("/")):
        os.chmod(ex / d, 0o555)
    if changed or not manifest.exists():
        tmp = tree.home / "manifest.tmp"
        with open(tmp, "wb") as f:
            marshal.dump({"schema": MANIFEST_SCHEMA, "entries": entries}, f)
        os.replace(tmp, manifest)


def _holds(store: LocalStore, path: Path, st: os.stat_result, node) -> bool:
    """The entry is what the input must be: root-owned, read-only, the right content."""
    if isinstance(node, SymlinkNode):
        return stat.S_ISLNK(st.st_mode) and os.readlink(path) == node.target
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        return False
    if stat.S_IMODE(st.st_mode) != (0o555 if node.executable else 0o444):
        return False
    try:
        return digest_file(path, store.function) == node.digest
    except OSError:
        return False


def _make(store: LocalStore, path: Path, rel: str, node, source: str | None) -> None:
    if isinstance(node, SymlinkNode):
        os.symlink(node.target, path)
        return
    digest: Digest = node.digest
    if source is not None and not store.has(digest):
        copy_source(source, path, node, store)  # NB: verified against the key's digest
        return
    if not node.executable and store.has_verified(digest):
        try:
            st = os.stat(store.blob_path(digest))
            if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o222 == 0:
                os.link(store.blob_path(digest), path)
                return
        except OSError:
            pass  # NB: another file system, or a link limit: a copy
    store.export_file(digest, path, node.executable)
    os.chmod(path, 0o555 if node.executable else 0o444)


def _unlink(path: Path) -> None:
    try:
        if path.is_dir() and not path.is_symlink():
            remove_tree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass


def _evict(stage: Path) -> None:
    """Remove the least recently used trees beyond `TREES_KEPT - 1` that no build holds."""
    try:
        homes = [p for p in stage.iterdir() if p.is_dir()]
    except FileNotFoundError:
        return
    if len(homes) < TREES_KEPT:
        return

    def used(p: Path) -> float:
        try:
            return os.stat(p / "lock").st_mtime
        except OSError:
            return 0.0

    for home in sorted(homes, key=used)[: len(homes) - TREES_KEPT + 1]:
        try:
            fd = os.open(home / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            remove_tree(home)
        finally:
            os.close(fd)
