"""The analysis cache: a no-op build skips loading and analysis when nothing analysis read changed.

Analysis reads declaration files, checks that sources exist, lists folders, and writes small
blobs. `Tracker` records each of those reads; a cached analysis is reused only when every
recorded read gives the same answer again, the engine and rule code are unchanged, and the
interpreter's packages are unchanged. Anything unreadable or unexpected means: analyse again.
"""

from __future__ import annotations

import os
import pickle
import stat
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Iterable

from rsi import __version__, sections
from rsi.sections import Packed, is_packed
from rsi.sections import raw as unpacked
from rsi.digest import Digest, FileDigestMemo, digest_value, hasher
from rsi.fsutil import atomic_write_bytes, open_regular, prune
from rsi.gc_policy import quiet_gc

SCHEMA = "rsi.analysis/1"


def _stat_sig(path: str, dirs: dict[str, str] | None = None, mode: int | None = None) -> list:
    """Existence, kind, executable bit and real path of `path`. `dirs` memoises the real path
    of parent folders within one check, so a folder of many sources costs one lstat each;
    `mode` is the `st_mode` of the path's `lstat` when the caller has it already."""
    try:
        if mode is None:
            mode = os.lstat(path).st_mode
        if stat.S_ISLNK(mode):
            mode = os.stat(path).st_mode
            real = os.path.realpath(path)
        else:
            parent, name = os.path.split(path)
            if not name or name in (".", "..") or not os.path.isabs(parent):
                real = os.path.realpath(path)
            else:
                real_parent = None if dirs is None else dirs.get(parent)
                if real_parent is None:
                    real_parent = os.path.realpath(parent)
                    if dirs is not None:
                        dirs[parent] = real_parent
                # NB: the file itself is no link, so its real path is its folder's + its name
                real = os.path.join(real_parent, name)
                if real == path:
                    real = path  # NB: one string, not two, in what is pickled
    except (OSError, ValueError):  # NB: ValueError: a NUL in the path
        return ["absent"]
    # NB: the real path too: a folder on the way swapped for a symlink out of the workspace
    # must re-run analysis, which refuses it (rule.py), not reuse the old verdict
    kind = "dir" if stat.S_ISDIR(mode) else "file"
    return [kind, bool(mode & 0o111), real]


class Vouched:
    """The sources a watcher (the build server's, rsi.incremental) saw no change to, by
    folder: every source of a `quiet` folder ({folder: the set of its sources}) but the
    `noisy` ones, which are to be looked at one by one, as are the sources of folders not
    in `quiet`. Checks go over `noisy` and one real path per folder, not over every source
    (100,000 at a time, several times per build). `extra` ({id: (stats, paths, size)}) keeps,
    per tracker, its reads that are no watched source."""

    __slots__ = ("quiet", "noisy", "_noisy", "extra", "watched")

    def __init__(self, quiet: dict, noisy: list, extra: dict, watched: dict) -> None:
        self.quiet, self.noisy, self.extra = quiet, noisy, extra
        self._noisy = frozenset(noisy)
        self.watched = watched  # NB: {folder: the set of its sources}, every folder watched

    def __contains__(self, path: object) -> bool:
        if not isinstance(path, str) or path in self._noisy:
            return False
        return path in self.quiet.get(path[: path.rfind("/")] or "/", ())

    def __bool__(self) -> bool:
        return bool(self.quiet)

    def reads_to_check(self, stats: Mapping[str, list]) -> list[str]:
        """The paths of `stats` not vouched for: its reads that are no watched source (once
        per tracker), and the noisy sources it read."""
        extra = self.extra.get(id(stats))
        if extra is None or extra[0] is not stats or extra[2] != len(stats):
            get = self.watched.get
            alone = [q for q in stats if q not in get(q[: q.rfind("/")] or "/", ())]
            extra = self.extra[id(stats)] = (stats, alone, len(stats))
        return [*extra[1], *(q for q in self.noisy if q in stats)]

    def folders(self, stats: Mapping[str, list]) -> Iterator[tuple[str, str]]:
        """(folder, a path of it that `stats` holds) of each folder with a vouched source."""
        for folder, paths in self.quiet.items():
            for q in paths:
                if q in stats:
                    yield folder, q
                    break


def _stats_unchanged(
    stats: Mapping[str, list],
    lstats: dict,
    unchanged: Vouched | None = None,
    dirs: dict[str, str] | None = None,
    only: Iterable[str] | None = None,
) -> bool:
    """`_stat_sig` of every path still gives what was recorded (of the paths in `only`, when
    given: the caller vouches for the rest, folders included, as rsi.incremental's fold
    does); `lstats` are {path: st_mode} of `lstat`s the caller made already (the modes
    alone: a stat result per source held at once costs ~600 bytes each). A path recorded as
    its own real path (no link on the way: the common case) that is still no link is checked
    here from its `lstat` and its folder's real path (one per folder), without `_stat_sig`'s
    path arithmetic. A path in `unchanged` (a
    watcher saw no change to it, nor to its folder) only has its folder's real path checked.
    `dirs` receives {folder: its real path} of the folders resolved (rsi.incremental's
    re-check resolves them again instead of every path's)."""
    if dirs is None:
        dirs = {}
    got = lstats.get
    is_link, is_dir = stat.S_ISLNK, stat.S_ISDIR
    realpath = os.path.realpath
    items: Iterable = stats.items()
    if isinstance(unchanged, Vouched):
        # NB: a path the watcher vouches for kept its kind and mode (a chmod or a swap is an
        # event naming it); what is left is its real path, which depends on its folder's
        # alone (it is no symlink itself: those are always stat'ed): one check per folder,
        # against the real folder recorded for one of its paths; the rest one by one
        for parent, q in unchanged.folders(stats):
            want = stats[q]
            if len(want) != 3:
                return False
            if realpath(parent) != (want[2][: want[2].rfind("/")] or "/"):
                return False
        items = ((q, stats[q]) for q in unchanged.reads_to_check(stats))
    elif only is not None:
        items = ((q, stats[q]) for q in only if q in stats)
    for p, want in items:
        mode = got(p)
        if mode is not None and len(want) == 3 and want[2] == p and not is_link(mode):
            # NB: a recorded real path is absolute and normalised, so its folder is all
            # before its last "/"; it is still its own real path iff the folder still is
            cut = p.rfind("/")
            if cut >= 0:
                parent = p[:cut] or "/"
                real_parent = dirs.get(parent)
                if real_parent is None:
                    real_parent = dirs[parent] = realpath(parent)
                if (
                    real_parent != parent
                    or want[0] != ("dir" if is_dir(mode) else "file")
                    or want[1] != bool(mode & 0o111)
                ):
                    return False
                continue
        if _stat_sig(p, dirs, mode) != want:
            return False
    return True


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

    def still_valid(
        self,
        store,
        walker,
        lstats: dict | None = None,
        unchanged=frozenset(),
        dirs: dict[str, str] | None = None,
        only: Iterable[str] | None = None,
    ) -> bool:
        """Every recorded read gives the same answer; `lstats` are {path: st_mode} of `lstat`s
        the caller took just now (the incremental state's pass over the sources), used instead
        of new calls; `unchanged` are paths a watcher saw no change to (rsi.incremental); `dirs`
        receives the folders' real paths as resolved (`_stats_unchanged`); `only`: of the
        paths stat'ed, check just these (the caller vouches for the others)."""
        for p, want in self.files.items():
            try:
                got = self.memo.digest(p).hash
            except OSError:
                got = "absent"
            if got != want:
                return False
        if not _stats_unchanged(self.stats, lstats or {}, unchanged, dirs, only):
            return False
        if any(_tree_sig(p, tuple(ex)) != sig for p, (ex, sig) in self.trees.items()):
            return False
        if any(list(walker(root)) != found for root, found in self.walks.items()):
            return False
        return all(store.has(Digest.parse(d)) for d in self.blobs)

    def _moved_files(self) -> list[str]:
        """The declarations (and `rsi.toml`) whose content digest differs from the one read."""
        moved = []
        for p, want in self.files.items():
            try:
                got = self.memo.digest(p).hash
            except OSError:
                got = "absent"
            if got != want:
                moved.append(p)
        return moved

    def moved_reads(self, lstats: dict | None = None, unchanged=frozenset()) -> list[str]:
        """The declarations (and `rsi.toml`) whose content differs now, or a note when a path's
        existence, kind, mode or real path does: for a build about to export (rsi.recheck);
        `lstats` and `unchanged` as for `still_valid`."""
        moved = self._moved_files()
        if not moved and not _stats_unchanged(self.stats, lstats or {}, unchanged):
            moved.append("(a source's existence, mode or real path)")
        return sorted(moved)

    def moved_reads_since(
        self,
        settled: Mapping,
        unsettled: set[str],
        dirs: dict[str, str],
        lstats: dict,
        others: list[str] | None = None,
    ) -> list[str]:
        """As `moved_reads`, for a caller that checked every read with `still_valid` (which
        gave it `dirs`) and has since found the paths in `settled` but not in `unsettled`
        unchanged in signature (inode, size, mtime, ctime: a chmod or a swap moves ctime), so
        in kind and mode: for those only their folders' real paths are resolved again, once
        per folder; every other path is checked as `moved_reads` does (`lstats` as there).
        `others`, when given, holds at least every read not in `settled` (the state's fold:
        rsi.incremental), so the reads are not walked to find them."""
        moved = self._moved_files()
        realpath = os.path.realpath
        if moved or any(realpath(folder) != real for folder, real in dirs.items()):
            return sorted(moved) or ["(a source's real path)"]
        stats = self.stats
        if others is not None:
            rest = {p: stats[p] for p in (*others, *unsettled) if p in stats}
        else:
            rest = {p: want for p, want in stats.items() if p not in settled or p in unsettled}
        if not _stats_unchanged(rest, lstats):
            moved.append("(a source's existence, mode or real path)")
        return moved

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "memo"}


def code_packages(rule_modules: Iterable[str]) -> dict[str, str]:
    """{top-level package: its folder} of the engine and of every rule family in use."""
    found = {"rsi": Path(__file__).resolve().parent}
    for name in rule_modules:
        # NB: the top-level package of every module that implements a rule, so helpers it
        # imports from its own package count too
        top_name = name.split(".")[0]
        top = sys.modules.get(top_name)
        path = getattr(top, "__file__", None) if top is not None else None
        if path:
            found[top_name] = Path(path).resolve().parent
    return {k: str(v) for k, v in sorted(found.items())}


def code_roots(rule_modules: Iterable[str]) -> list[str]:
    """The folders whose Python files are the engine and the rule families in use."""
    roots = {Path(p) for p in code_packages(rule_modules).values()}
    # NB: a single-file module's folder is site-packages, covered by the installed packages
    return [str(r) for r in sorted(roots) if r.name not in ("site-packages", "dist-packages")]


def packages_still_at(packages: dict[str, str]) -> bool:
    """Each package would still be imported from the folder recorded (no other copy of it
    came first on the path), without importing anything."""
    import importlib.util

    for name, folder in packages.items():
        if name == "rsi":
            here = str(Path(__file__).resolve().parent)
        else:
            try:
                spec = importlib.util.find_spec(name)
            except (ImportError, ValueError):
                return False
            origin = getattr(spec, "origin", None) if spec is not None else None
            if not origin:
                return False
            here = str(Path(origin).resolve().parent)
        if here != folder:
            return False
    return True


def code_digest(memo: FileDigestMemo, roots: Iterable[str]) -> str:
    """Engine and rule-family source files under `roots`, plus the installed packages."""
    # NB: the interpreter by what it is, not by the name it was started as (python, python3)
    parts: list = [__version__, sys.version, sys.prefix, os.path.realpath(sys.executable)]
    for root in roots:
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


def _code_digest(memo: FileDigestMemo, rule_modules: Iterable[str]) -> str:
    return code_digest(memo, code_roots(rule_modules))


def cache_key(
    memo: FileDigestMemo,
    request: dict,
    rule_modules: Iterable[str] = (),
    *,
    code: str | None = None,
) -> str:
    """The analysis cache key of `request`; `code` is `code_digest` when already known."""
    if code is None:
        code = _code_digest(memo, rule_modules)
    return digest_value({"schema": SCHEMA, "code": code, **request}).hash


def read_sealed(store, path: Path) -> Any | None:
    """The object pickled at `path` under its own digest (write_sealed); None when the file is
    missing, altered or unreadable in any way: the callers' memos are speed-ups only."""
    return read_sealed_head(store, path)[1]


# NB: the size of each read while a sealed file is hashed: the file is never held whole
_CHUNK = 1 << 20


class _Hashing:
    """A file, read through `pickle.load`, that hashes every byte it hands over."""

    def __init__(self, f: Any, h: Any) -> None:
        self._f, self._h = f, h

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        self._h.update(data)
        return data

    def readinto(self, buf: Any) -> int:
        n = self._f.readinto(buf)
        self._h.update(memoryview(buf)[:n])
        return n

    def readline(self, limit: int = -1) -> bytes:
        data = self._f.readline(limit)
        self._h.update(data)
        return data

    def hexdigest(self) -> str:
        """The digest of every byte handed over so far."""
        return self._h.hexdigest()


def read_sealed_head(store, path: Path) -> tuple[str | None, Any | None]:
    """(the payload's digest, the object) as `read_sealed`; (None, None) when unusable. The
    payload is hashed as it is read, never held whole (a state of 100,000 actions is ~60 MB,
    an analysis ~160 MB: held while unpickled, it was the build's peak memory): once before
    it is unpickled (nothing is unpickled from bytes the seal does not vouch for), and again
    as it is unpickled (what was unpickled is what was checked, whatever wrote meanwhile)."""
    try:
        with os.fdopen(open_regular(path), "rb") as f:
            seal = f.readline(256).rstrip(b"\n").decode(errors="replace")
            start = f.tell()
            if f.read(len(sections.MAGIC)) == sections.MAGIC:
                # NB: sectioned (rsi.sections): the header and payload checked now, each
                # section when first read
                f.seek(start)
                try:
                    with quiet_gc():
                        return seal, sections.load(f, str(path), store.function, seal)
                except Exception:  # NB: any failure just means "no memo", as below
                    return None, None
            f.seek(start)
            h = hasher(store.function)
            for chunk in iter(lambda: f.read(_CHUNK), b""):
                h.update(chunk)
            if not seal or seal != h.hexdigest():
                return None, None
            f.seek(start)
            again = _Hashing(f, hasher(store.function))
            try:
                with quiet_gc():
                    found = pickle.load(again)
            except Exception:  # NB: any unpickling failure just means "no memo"
                return None, None
            while again.read(_CHUNK):  # NB: anything after the pickle is in the seal too
                pass
            if again.hexdigest() != seal:
                return None, None
            return seal, found
    except OSError:
        return None, None


def write_sealed(store, path: Path, obj: Any) -> str | None:
    """Pickle `obj` to `path`, preceded by the payload's digest (returned); nothing on any
    failure (an unpicklable object, a full disk): the memo is a speed-up only."""
    try:
        head, parts = sections.dumps(obj, store.function)
    except sections.CacheDamaged:
        raise  # NB: a section it still held went bad: the build goes again without it
    except Exception:  # NB: a rule holding something unpicklable just goes uncached
        return None
    try:
        atomic_write_bytes(path, parts, fsync=False)
    except OSError:
        return None
    return head


# NB: the analysis folder gets an entry per version of the declarations and rule code, and a
# state per request (rsi.incremental); both are speed-ups, kept to the newest few (by last
# use) and a byte budget so that a long-lived store never fills its disk (an analysis of
# 100,000 targets is ~130 MB)
KEEP_ANALYSES = 8
KEEP_STATES = 16
KEEP_BYTES = 1 << 30


# NB: in a long-lived process (the build server), the analyses it last read, by file: an
# entry is rewritten under the same key whenever the declarations change, and a file system
# may give the new file the inode the old one had, with the same size; so a kept analysis is
# served only while the file's whole signature (device, inode, size, mtime, ctime) and its
# seal (the first line: the digest of its content) are as when it was read; off unless
# `keeping`
_KEPT: dict[str, tuple] = {}


def forget_kept(path: str) -> None:
    """Drop what this process keeps of the analysis at `path` (a damaged file)."""
    _KEPT.pop(str(path), None)


# NB: set by a long-lived process (the build server); rsi/incremental.py keeps the build state
# in memory under the same switch
keeping = False
KEEP_IN_MEMORY = 2


def _entry_identity(path: Path) -> tuple | None:
    """(stat signature, seal) of an analysis entry: what a kept copy must still match."""
    try:
        fd = open_regular(path)
    except OSError:
        return None
    try:
        return _identity_of(fd)
    except OSError:
        return None
    finally:
        os.close(fd)


def _identity_of(fd: int) -> tuple:
    st = os.fstat(fd)
    head = os.pread(fd, 160, 0).split(b"\n", 1)[0]
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns), head


def touch_entry(path: Path) -> None:
    """Mark an analysis entry used now (`fsutil.touch`: its access time). The touch moves its
    ctime, which is part of the identity a kept copy must match (`_KEPT`), so a copy kept
    for the file as it was just before the touch is kept for it as it is after (same open
    file, so no other file that took the path meanwhile): without this, a long-lived rsi read
    the whole analysis (~160 MB at 100,000 actions) again at every build that needed it."""
    try:
        fd = open_regular(path)
    except OSError:
        return
    try:
        before = _identity_of(fd)
        os.utime(fd, ns=(time.time_ns(), before[0][3]))
        kept = _KEPT.get(str(path))
        if kept is not None and kept[0] == before:
            _KEPT[str(path)] = (_identity_of(fd), kept[1])
    except OSError:
        pass
    finally:
        os.close(fd)


def _read(store, key: str) -> tuple | None:
    path = store.root / "analysis" / key
    ident = None
    if keeping:
        ident = _entry_identity(path)
        kept = _KEPT.get(str(path))
        if ident is not None and kept is not None and kept[0] == ident:
            touch_entry(path)
            return kept[1]
    found = _read_file(store, key)
    if keeping and found is not None and ident is not None:
        _KEPT.pop(str(path), None)
        # NB: the identity taken before the read: a file replaced meanwhile differs next time
        _KEPT[str(path)] = (ident, found)
        while len(_KEPT) > KEEP_IN_MEMORY:
            _KEPT.pop(next(iter(_KEPT)))
    if found is not None:
        touch_entry(path)
    return found


def _read_file(store, key: str) -> list | None:
    found = read_sealed(store, store.root / "analysis" / key)
    try:
        labels, graph, tracker = found
    except (TypeError, ValueError):
        return None
    # NB: [labels, graph, the tracker still pickled (a section) until `_tracker` needs it]
    return [labels, graph, tracker]


def _tracker(store, found: list) -> Tracker | None:
    """The analysis' tracker, unpickled on first use (a one-change build, which checked the
    state's own copy of it, never needs it: at 100,000 sources, 5 MB unpickled for nothing)."""
    tracker = found[2]
    if is_packed(tracker):
        try:
            tracker = found[2] = pickle.loads(unpacked(tracker))
        except sections.CacheDamaged:
            raise
        except Exception:  # NB: as any unpickling failure of a memo: no memo
            return None
    if not isinstance(tracker, Tracker):
        return None
    tracker.memo = store.meta_memo
    return tracker


def load_unchecked(store, key: str) -> tuple | None:
    """(labels, graph) under `key` without checking the tracker (not read): for a caller
    that has just checked the same tracker itself (rsi.incremental)."""
    found = _read(store, key)
    return None if found is None else (found[0], found[1])


def load_checked(store, key: str, walker) -> tuple | None:
    """(labels, graph, tracker) under `key` when every read the analysis recorded gives the
    same answer again."""
    found = _read(store, key)
    if found is None:
        return None
    tracker = _tracker(store, found)
    if tracker is None or not tracker.still_valid(store, walker):
        return None
    return found[0], found[1], tracker


def load(store, key: str, walker) -> Any | None:
    found = load_checked(store, key, walker)
    return None if found is None else found[:2]


def save(store, key: str, labels, graph, tracker: Tracker) -> None:
    # NB: the tracker pickled apart, in a section of its own: read only by a check of it
    packed = Packed(pickle.dumps(tracker, pickle.HIGHEST_PROTOCOL))
    write_sealed(store, store.root / "analysis" / key, (labels, graph, packed))
    prune(
        store.root / "analysis",
        keep=KEEP_ANALYSES,
        keep_bytes=KEEP_BYTES,
        match=lambda name: not name.startswith(("state-", "delta-", "outs-")),
        spare=key,
    )
