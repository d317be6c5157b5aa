"""Incremental builds: what the last successful build of a request found, so the next one costs
a stat per source and per cache entry instead of re-analysing, re-hashing and re-keying every
action (docs/architecture.md, "Incremental builds").

The state of one request (patterns, current package, workspace, salt, rules, store, digest
function) is one file, `<store>/analysis/state-<request>`: the analysis it used (by key, with
that analysis' recorded reads), and for every source the stat signature and digest its
consumers were keyed with, for every action its key, its outputs and the stat signatures of its
action-cache entry and blobs. A signature stands for content only when it was taken more than
`RACY_NS` after the file's last change (Git's racy-timestamp rule, as the stat memo); a racy or
differing one means the content is read again. The actions' entries are kept in 256 shards
(rsi.sharded), each unpickled only by a build that needs an entry of it (a no-op needs none,
a one-change build those it re-keys and reads, found by id; an action-cache shard folder whose
signature moved has its entries found through `ac_index`: the outputs a no-op exports
are kept apart, `exports`, and follow every entry that changes). This module never decides a
result by itself: an action whose sources, entry or blobs are in any doubt goes to the
scheduler, which re-keys it and verifies what it serves.
"""

from __future__ import annotations

import os
import pickle
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from rsi import __version__, analysis_cache, native, side_check
from rsi.gc_policy import quiet_gc  # noqa: F401 - NB: build.py uses it from here
from rsi.analysis_cache import Vouched, read_sealed_head, write_sealed
from rsi.digest import HITS_MOD, Digest, FileDigestMemo, digest_file, digest_value, hit_term
from rsi.fsutil import open_regular
from rsi.record import Value
from rsi.sections import Packed, is_packed
from rsi.sections import raw as unpacked
from rsi.sharded import EntryShardedDict, Sharded, ShardedDict, UnorderedShardedDict

# NB: /7: the actions in shards (rsi.sharded), `ac_index`. In the request key too, so an older
# rsi sharing the store never reads a state it cannot (it would apply a delta to packed bytes)
# /8: every action's outputs, key and entry signature also in a sidecar file, `outs-<request>`
# (`_outs_table`)
# /9: a source's entry may carry a fifth item, the `st_mode` at which the analysis' read of it
# was found as recorded, at the entry's signature (`_fold`); older rsi unpacks four. The
# blobs' signatures are kept in shards (`ShardedDict`), as the actions' entries are
# /10: files in sections (rsi.sections): each shard read when first used; `folders`
SCHEMA = "rsi.incremental/11"
RACY_NS = FileDigestMemo.RACY_NS
# NB: a build that only found a few small sources touched leaves the state as it is (each is
# hashed again next time, as now): at 100,000 actions, writing the state costs seconds
TOUCHED_MAX = 64
TOUCHED_BYTES = 1 << 20
# NB: what a build changed in the state goes to a small delta file beside it, folded into the
# state (rewritten whole) once it holds more than this many entries or an eighth of the actions
DELTA_MIN = 512

# NB: what the state keeps of the analysis it was built from
ANALYSIS_FIELDS = ("analysis_key", "code_roots", "code_packages", "code", "tracker")
# NB: an action's entry is a list, the fastest thing to pickle and index
LABEL, MNEMONIC, KEY_HASH, KEY_SIZE, AC_SIG, OUTPUTS, LOGS = range(7)


def _sig(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _trusted(st: os.stat_result, now_ns: int) -> tuple[int, int, int, int] | None:
    """The signature, when the file's last change is old enough for it to stand for content."""
    return _sig(st) if now_ns - max(st.st_mtime_ns, st.st_ctime_ns) > RACY_NS else None


def request_key(ws: Any, patterns: list[str], current: str, store: Any) -> str | None:
    """The state's name for this request; None where no state is kept (remote builds: their
    hits depend on a server this module cannot check with a stat; RSI_INCREMENTAL=0)."""
    if ws.remote or ws.executor == "remote" or os.environ.get("RSI_INCREMENTAL") == "0":
        return None
    return digest_value(
        {"schema": SCHEMA, "version": __version__, **request_fields(ws, patterns, current, store)}
    ).hash


def request_fields(ws: Any, patterns: list[str], current: str, store: Any) -> dict:
    """What names a build request, for the state's name and the analysis cache's key alike."""
    return {
        "patterns": list(patterns),
        "current": current,
        "root": str(ws.root),
        "salt": ws.salt,
        "rules": list(ws.rules),
        "store": str(store.root),
        "function": store.function,
    }


def _actions(state: dict) -> Any:
    """The state's actions. On disk they are kept in 256 shards by a CRC of the action id
    (`ShardedDict`), each unpickled on first use: a no-op, which needs no action's entry,
    unpickles none (at 100,000 actions, a third of reading the state), and a one-change build
    the shards of the entries it reads."""
    return state["actions"]


def _ac_index(actions: Any) -> dict[str, Any]:
    """{action-cache shard (the key's first two hex digits): the rows (action id, key hash,
    entry signature) of the actions whose entry is in it, as the state is written whole}: a
    shard folder whose signature moved has its entries checked without a walk of every action
    and without their entries (`_check_listed`; an entry changed since has its row in `outs`).
    Each shard's rows are pickled apart (`Packed`: a section of the state file, read only for
    a folder that moved); `_index_rows` reads them."""
    index: dict[str, list] = {}
    for action_id, a in actions.items():
        index.setdefault(a[KEY_HASH][:2], []).append((action_id, a[KEY_HASH], a[AC_SIG]))
    dumps = pickle.dumps
    return {
        shard: Packed(dumps(tuple(rows), pickle.HIGHEST_PROTOCOL)) for shard, rows in index.items()
    }


def _index_rows(index: dict, shard: str) -> tuple:
    """The rows `ac_index` holds for `shard` (unpickled on first use)."""
    rows = index.get(shard, ())
    if is_packed(rows):
        rows = index[shard] = pickle.loads(unpacked(rows))
    return rows


def _listed(state: dict, shard: str) -> list[tuple]:
    """The rows (action id, key hash or None, signature or None) of the actions whose entry is
    in `shard` now: `ac_index`'s, as the state was written whole, less those whose entry has
    moved since to another shard, plus those moved into it (`ac_moved`, {action id: its
    shard}, in the delta: a few ids a build, not whole shards' rows), whose rows are in `outs`."""
    rows = list(_index_rows(state["ac_index"], shard))
    moved = state.get("ac_moved")
    if moved:
        rows = [r for r in rows if moved.get(r[0], shard) == shard]
        have = {r[0] for r in rows}
        rows += [(i, None, None) for i, at in moved.items() if at == shard and i not in have]
    return rows


def _exports_of(state: dict, actions: dict[str, list]) -> dict[str, tuple]:
    """{producer: its entry's outputs} of every file a target of the state exports: what a
    no-op copies under out/ without reading any action's entry."""
    return {
        producer: tuple(actions[producer][OUTPUTS])
        for t in state.get("targets") or ()
        for _path, producer in t["files"]
        if producer in actions
    }


def _state_path(store: Any, request: str):
    return store.root / "analysis" / f"state-{request}"


def _delta_path(store: Any, request: str):
    return store.root / "analysis" / f"delta-{request}"


def _outs_path(store: Any, request: str):
    return store.root / "analysis" / f"outs-{request}"


# NB: sidecar tables already read, by seal (the digest of the file's content), newest last;
# and the seals whose file did not hold them, with that file's stat signature then (None: no
# file): not read and hashed again per lookup while the file is as it was
_OUTS: dict[str, Sharded] = {}
KEEP_OUTS = 2
_OUTS_MISSED: dict[str, tuple | None] = {}


def _row(a: list) -> tuple:
    """What the sidecar keeps of an action's entry `a`: (outputs, key hash, entry signature)."""
    return (tuple(a[OUTPUTS]), a[KEY_HASH], a[AC_SIG])


def _outs_table(store: Any, state: dict) -> Sharded | None:
    """{action id: `_row` of its entry} of every action as the state was last written whole:
    the sidecar file `outs-<request>`, whose seal the state holds (`outs_seal`); every entry
    changed since has its row in the state's `outs`. None when the state names no sidecar or
    the file is not the one it names (rewritten by another build, removed, altered): the
    caller reads the entries.

    NB: apart from the state, so a no-op neither reads nor hashes it, and apart from the
    actions' entries, so a one-change build that re-keys a root of 10,000 inputs, or checks
    the entries of the action-cache folders the build before wrote into, unpickles rows only.
    Only a long-lived process (the build server, `analysis_cache.keeping`) reads it: it keeps
    the table from build to build (a watching server's one-change build at 100,000 actions:
    0.367 -> 0.308 s). A process of one build would read and hash 26 MB and unpickle all its
    shards (0.137 s) where unpickling every action shard of the state it already read costs
    0.089 s: it reads the entries."""
    seal = state.get("outs_seal")
    if not seal or not analysis_cache.keeping:
        return None
    table = _OUTS.get(seal)
    if table is not None:
        _keep_outs(seal, table)
        return table
    path = _outs_path(store, state["request"])
    try:
        now: tuple | None = _sig(os.stat(path))
    except OSError:
        now = None
    if seal in _OUTS_MISSED and _OUTS_MISSED[seal] == now:
        return None
    found, table = read_sealed_head(store, path)
    if found != seal or not isinstance(table, Sharded):
        _OUTS_MISSED.pop(seal, None)
        _OUTS_MISSED[seal] = now
        while len(_OUTS_MISSED) > 8:
            _OUTS_MISSED.pop(next(iter(_OUTS_MISSED)))
        return None
    _OUTS_MISSED.pop(seal, None)
    _keep_outs(seal, table)
    return table


def _keep_outs(seal: str, table: Sharded) -> None:
    _OUTS.pop(seal, None)
    _OUTS[seal] = table
    while len(_OUTS) > KEEP_OUTS:  # NB: the least recently kept go first
        _OUTS.pop(next(iter(_OUTS)))


# NB: the parts of a state a delta replaces entry by entry; the rest of its fields are whole
DELTA_PARTS = (
    "actions",
    "sources",
    "blobs",
    "logs",
    "ac_dirs",
    "exports",
    "ac_moved",
    "outs",
    "inputs",
)
# NB: `hits_sum`: the sum of every action's `hit_term` (its hit line in the event summary),
# kept up to date entry by entry so a no-op's summary costs nothing per action
DELTA_FIELDS = ("index_sig", "roots_sig", "hits_sum")


# NB: a long-lived process (the build server, rsi/server.py, sets `analysis_cache.keeping`) keeps in
# memory the state each of its builds left on disk, so the next build need not read, check and
# unpickle it again. An entry is taken out when a build loads it (a build that fails never puts back
# what it may have changed) and put back by a build that ends with the state saved or found
# unchanged, under the signatures of the state and delta files as they are then: any other writer
# (another rsi) makes new files, so new signatures, and the state is read from disk as always. Off
# unless turned on.
_KEEP: dict[str, tuple] = {}
KEEP_STATES = 4


def _sig_of(path) -> tuple | None:
    """A state or delta file's signature and seal (its first line, the digest of its content):
    a file system may hand a rewritten file the old one's inode and size within one clock
    tick, so the kept copy (`_KEEP`) is trusted by content, not by the stat alone."""
    try:
        with os.fdopen(open_regular(path), "rb") as f:
            st = os.fstat(f.fileno())
            head = f.read(160).split(b"\n", 1)[0]
    except OSError:
        return None
    return _sig(st), head


def keep(store: Any, p: Plan) -> None:
    """Remember `p`'s state as the files now on disk hold it (see `_KEEP`)."""
    if analysis_cache.keeping and p.seal is not None:
        path = _state_path(store, p.request)
        sigs = (_sig_of(path), _sig_of(_delta_path(store, p.request)))
        if sigs[0] is not None:
            updated = {part: set(keys) for part, keys in p.updated.items()}
            _KEEP.pop(str(path), None)
            _KEEP[str(path)] = (sigs, p.state, p.seal, updated, p.watch, p.hits)
            while len(_KEEP) > KEEP_STATES:  # NB: the least recently kept go first
                _KEEP.pop(next(iter(_KEEP)))


def _kept(store: Any, request: str) -> tuple[dict, str, dict] | None:
    if not analysis_cache.keeping:
        return None
    path = _state_path(store, request)
    found = _KEEP.pop(str(path), None)
    if found is None:
        return None
    sigs, state, seal, updated, watched, hits = found
    if sigs != (_sig_of(path), _sig_of(_delta_path(store, request))):
        return None
    return state, seal, updated, (watched, hits)


def _load(store: Any, request: str) -> tuple[dict, str, dict, Any] | None:
    """(the state, its seal, what its delta changed: part -> keys, what the watcher knew of it
    when kept), the delta applied."""
    from rsi.fsutil import touch

    path = _state_path(store, request)
    kept = _kept(store, request)
    if kept is not None:
        state = kept[0]
        touch(path)
        analysis_cache.touch_entry(path.parent / str(state.get("analysis_key")))
        return kept
    seal, state = read_sealed_head(store, path)
    if seal is None or not isinstance(state, dict) or state.get("schema") != SCHEMA:
        return None
    # NB: a delta extends the state file it names (by seal); any other is stale and ignored
    changed: dict[str, set] = {part: set() for part in DELTA_PARTS}
    _, delta = read_sealed_head(store, _delta_path(store, request))
    if isinstance(delta, dict) and delta.get("extends") == seal:
        for part in DELTA_PARTS:
            entries = delta.get(part) or {}
            if part == "actions" and isinstance(state["actions"], ShardedDict):
                # NB: applied as each shard loads: a no-op loads none of them
                state["actions"].defer(entries)
            elif part == "blobs" and isinstance(state["blobs"], ShardedDict):
                # NB: one by one (their shards loaded): a delta adds blobs, and a deferred new
                # key would be missing from a walk of every blob until its shard loads
                blobs = state["blobs"]
                for h, sig in entries.items():
                    blobs[h] = sig
            else:
                state.setdefault(part, {}).update(entries)
            changed[part].update(entries)
        for name in DELTA_FIELDS:
            state[name] = delta.get(name)
    # NB: in use: neither this state nor the analysis it names is the oldest to prune
    touch(path)
    analysis_cache.touch_entry(path.parent / str(state.get("analysis_key")))
    return state, seal, changed, (None, None)


def save(store: Any, state: dict) -> str | None:
    """Write the whole state (its delta, folded in, is removed); returns its seal."""
    from rsi.analysis_cache import KEEP_BYTES, KEEP_STATES
    from rsi.fsutil import prune

    actions = _actions(state)
    live = {h for a in actions.values() for _, h, _n, _x in a[OUTPUTS]}
    blobs = state["blobs"]
    if len(blobs) > len(live):
        blobs = {h: sig for h, sig in blobs.items() if h in live}
    state["logs"] = _logs_of(actions.values())
    state["exports"] = _exports_of(state, actions)
    state["ac_index"] = _ac_index(actions)
    path = _state_path(store, state["request"])
    try:
        packed = EntryShardedDict.pack(actions)
        outs = Sharded.pack({i: _row(a) for i, a in actions.items()})
        # NB: the blobs' signatures too: a no-op's own process never unpickles them (the
        # side check's child does, rsi/side_check.py), a one-change build those it re-keys
        blobs = UnorderedShardedDict.pack(blobs)
    except Exception:  # NB: as write_sealed: the state is a speed-up only
        return None
    state["actions"] = packed
    state["blobs"] = blobs
    # NB: the sidecar first: a state whose sidecar was never written names a seal no file
    # has, and its builds read the entries instead
    state["outs"] = {}
    state["ac_moved"] = {}
    state["outs_seal"] = write_sealed(store, _outs_path(store, state["request"]), outs)
    if analysis_cache.keeping and state["outs_seal"] is not None:
        _keep_outs(state["outs_seal"], outs)  # NB: a server's next build need not read it
    seal = write_sealed(store, path, state)
    try:
        os.unlink(_delta_path(store, state["request"]))
    except OSError:
        pass
    if seal is not None:
        keep(store, Plan(state["request"], state, seal))
    removed = prune(
        path.parent,
        keep=KEEP_STATES,
        keep_bytes=KEEP_BYTES,
        match=lambda name: name.startswith("state-"),
        spare=path.name,
    )
    for name in removed:
        for kind in ("delta", "outs"):
            try:
                os.unlink(path.parent / f"{kind}-{name[len('state-') :]}")
            except OSError:
                pass
    _drop_orphans(path.parent)
    return seal


# NB: a delta or sidecar is written before or after its state by another build: one this old
# with no state beside it is an orphan (its state pruned by an older rsi, or never written)
ORPHAN_AGE_S = 3600


def _drop_orphans(folder: Any) -> None:
    try:
        names = set(os.listdir(folder))
    except OSError:
        return
    cutoff = time.time() - ORPHAN_AGE_S
    for name in names:
        kind, _, request = name.partition("-")
        if kind not in ("delta", "outs") or not request or f"state-{request}" in names:
            continue
        try:
            if os.lstat(folder / name).st_mtime < cutoff:
                os.unlink(folder / name)
        except OSError:
            pass


_ABSENT = object()


def save_changes(store: Any, p: Plan) -> None:
    """Write what changed since the state file was written (the plan's `updated` entries) as
    its delta, or the whole state once the delta would be large."""
    state = p.state
    # NB: `outs` mirrors `actions` entry for entry: counted once
    count = sum(len(keys) for part, keys in p.updated.items() if part != "outs")
    if p.seal is None or p.compact or count > max(DELTA_MIN, len(state["order"]) // 8):
        p.seal = save(store, state)
        p.updated = {part: set() for part in DELTA_PARTS}
        return
    # NB: entries this build may have replaced: what a no-op exports follows them (the
    # exported producers' entries only: their shards, not all)
    exports = state.setdefault("exports", {})
    for producer, outputs in _exports_of(state, state["actions"]).items():
        if exports.get(producer) != outputs:
            exports[producer] = outputs
            p.updated["exports"].add(producer)
    delta: dict[str, Any] = {"schema": SCHEMA, "extends": p.seal}
    for part in DELTA_PARTS:
        whole = state.get(part) or {}
        if isinstance(whole, ShardedDict):
            # NB: what the loaded delta held is written again without loading its shards
            # NB: None is a value here (a blob's signature too recent to trust), not "absent"
            found = ((k, whole.peek(k, _ABSENT)) for k in p.updated[part])
            delta[part] = {k: v for k, v in found if v is not _ABSENT}
        else:
            delta[part] = {k: whole[k] for k in p.updated[part] if k in whole}
    for name in DELTA_FIELDS:
        delta[name] = state.get(name)
    if write_sealed(store, _delta_path(store, p.request), delta) is not None:
        keep(store, p)


def forget_file(path: str) -> None:
    """A cache file whose section failed its digest (rsi.sections.CacheDamaged): removed, and
    whatever this process keeps read of it dropped, so the next attempt goes without it."""
    try:
        os.unlink(path)
    except OSError:
        pass
    analysis_cache.forget_kept(path)
    _KEEP.clear()
    _OUTS.clear()


def forget(store: Any, request: str | None) -> None:
    if request is not None:
        _KEEP.pop(str(_state_path(store, request)), None)
        paths = (_state_path, _delta_path, _outs_path)
        for path in (at(store, request) for at in paths):
            try:
                os.unlink(path)
            except OSError:
                pass


class Plan(Value):
    """What the state says about this build: the actions that are certainly unchanged
    (`clean`, with their verified entries) and those the scheduler must look at (`dirty`)."""

    _fields = (
        "request",
        "state",
        "seal",
        "updated",
        "dirty",
        "changed",
        "touched",
        "touched_bytes",
        "fresh",
        "edited",
        "compact",
        "watch",
        "hits",
        "unsettled",
        "dirs",
    )

    def __init__(
        self,
        request: str,
        state: dict,
        seal: str | None = None,
        updated: dict[str, set] | None = None,
    ) -> None:
        self.request = request
        self.state = state
        # NB: the seal of the state file, and the entries changed since it was written (by
        # part: actions, sources, blobs), which its delta holds
        self.seal = seal
        self.updated: dict[str, set] = (
            {k: set() for k in DELTA_PARTS} if updated is None else updated
        )
        self.dirty: set[str] = set()
        self.changed = False  # NB: signatures were refreshed: save the state again
        # NB: sources touched (same content, new signature): worth saving the state for only
        # when reading them again next time would cost more than writing the whole state now
        self.touched = 0
        self.touched_bytes = 0
        # NB: sources whose content changed, as this build's check hashed them: path ->
        # (stat signature, signature to trust or None when racy, digest)
        self.fresh: dict[str, tuple] = {}
        self.edited = False  # NB: a source's content differs: some action will likely run
        self.compact = False  # NB: the state names blobs no action has: write it whole
        # NB: with a watcher (the build server): the mark taken before this build's checks,
        # the sources to stat whatever the watcher says (links), and the sources by folder
        self.watch: Any = None
        # NB: kept in memory only: the hit lines of every action, rendered
        # (rsi.events.HitTemplate)
        self.hits: Any = None
        # NB: for the re-check before export (`swept_since_check`): the sources whose check
        # did not find them at their recorded trusted signature (hashed, missing, links), and
        # the folders' real paths as the check of the analysis' reads resolved them
        self.unsettled: set[str] = set()
        self.dirs: dict[str, str] = {}
        # NB: without a watcher: this build's own watch of the sources' folders, made before
        # its check (rsi.watch.BuildWatch), so that re-check looks again only at what an event
        # named; None (look at every source) below `BUILD_WATCH_MIN` sources
        self.sweep_watch: Any = None
        # NB: without either watch: the child that stats half the sources in that re-check
        # (rsi.side_check.Sweep), forked when the check found the first edited source
        self.sweeper: Any = None
        # NB: (the state's `outs_seal`, its sidecar table or None) as last looked up: a root
        # of 10,000 inputs asks for each producer's outputs (`_outputs`)
        self._table: tuple[Any, Any] = (None, None)
        self._inputs: dict[str, dict] = {}  # NB: `inputs_of`'s tables, unpickled

    def end_watch(self) -> None:
        """Close this build's own watch and stop its sweep's child (once the re-check before
        export is made, or the plan is given up)."""
        if self.sweep_watch is not None:
            self.sweep_watch.close()
            self.sweep_watch = None
        if self.sweeper is not None:
            self.sweeper.cancel()
            self.sweeper = None

    @property
    def worth_saving(self) -> bool:
        return self.changed or self.touched > TOUCHED_MAX or self.touched_bytes > TOUCHED_BYTES

    def hit_template(self) -> Any:
        """The hit lines of all this state's actions, kept with it in a long-lived process;
        None otherwise (rendering them once costs what writing them does)."""
        if not analysis_cache.keeping:
            return None
        if self.hits is None:
            from rsi.events import HitTemplate

            self.hits = HitTemplate()
        return self.hits

    @property
    def actions(self) -> dict[str, list]:
        return _actions(self.state)

    def known_source(self, path: str, st: os.stat_result) -> tuple | None:
        """(digest, signature to trust or None) of a source this build's check vouches for at
        this very stat: one it hashed (changed), or one whose trusted signature is as recorded.
        For the scheduler's keying (`FileDigestMemo.known`): no second hash, no file memo."""
        sig = _sig(st)
        fresh = self.fresh.get(path)
        if fresh is not None:
            return (fresh[2], fresh[1]) if fresh[0] == sig else None
        entry = self.state["sources"].get(path)
        if entry is None or entry[0] is None or entry[1] is None or tuple(entry[0]) != sig:
            return None
        return Digest(entry[1], entry[2]), sig

    def outcome(self, action_id: str):
        from rsi.action import ActionResult, OutputFile
        from rsi.scheduler import Outcome

        a = self.actions[action_id]
        logs = [Digest(*d) if d else None for d in a[LOGS]]
        result = ActionResult(
            exit_code=0,
            outputs=tuple(OutputFile(p, Digest(h, n), x) for p, h, n, x in a[OUTPUTS]),
            stdout=logs[0],
            stderr=logs[1],
        )
        return Outcome(action_id, "hit", Digest(a[KEY_HASH], a[KEY_SIZE]), result)

    def hit_summary(self, skip: set[str] | frozenset[str] = frozenset()) -> tuple[int, int]:
        """(count, sum of `hit_term`s) of the hits of every action but those in `skip`: from
        the state's kept sum, less the skipped actions' terms (no walk of the others)."""
        total = self.state.get("hits_sum")
        if total is None:  # NB: a state written before the sum was kept: once, then saved
            total = _hits_sum(self.actions)
            self.state["hits_sum"] = total
            self.changed = True
        actions = self.actions if skip else {}
        skipped = [i for i in skip if i in actions]
        for i in skipped:
            a = actions[i]
            total -= hit_term(i, f"{a[KEY_HASH]}/{a[KEY_SIZE]}")
        return len(self.state["order"]) - len(skipped), total % HITS_MOD

    def hit_rows(self, ids) -> Iterator[tuple[str, str, str, str]]:
        actions = self.actions
        for i in ids:
            a = actions[i]
            yield i, a[LABEL], a[MNEMONIC], f"{a[KEY_HASH]}/{a[KEY_SIZE]}"

    def refs(self, ids) -> dict[str, dict]:
        """What the workspace's gc-root registration names for these actions."""
        actions = self.actions
        return {
            i: {"key": f"{actions[i][KEY_HASH]}/{actions[i][KEY_SIZE]}", "label": actions[i][LABEL]}
            for i in ids
        }

    def inputs_of(self, action_id: str) -> dict[str, tuple] | None:
        """The table of `action_id`'s produced inputs as it was last resolved ({input path:
        (producer, hash, size, executable)}; rsi.scheduler `wide_inputs`), or None.

        NB: sound for the producers this build vouches for: an entry's outputs change only
        where the record of a build that re-ran that producer writes it, and that build
        re-ran (resolved) every action downstream of it, so wrote this table again too."""
        got = self._inputs.get(action_id)
        if got is None:
            tables = self.state.get("inputs")
            packed = tables.get(action_id) if tables else None
            if packed is None:
                return None
            got = pickle.loads(unpacked(packed))
            if not isinstance(got, dict):
                return None
            self._inputs[action_id] = got
        return got

    def key_of(self, action_id: str) -> str:
        a = self.actions[action_id]
        return f"{a[KEY_HASH]}/{a[KEY_SIZE]}"

    def output(self, store: Any, producer: str, path: str) -> tuple[Digest, bool] | None:
        outputs = (self.state.get("exports") or {}).get(producer)
        if outputs is None:
            outputs = self._outputs(store, producer)
        for p, h, n, x in outputs:
            if p == path:
                return Digest(h, n), x
        return None

    def _outputs(self, store: Any, producer: str) -> Any:
        """The outputs of `producer`'s entry: changed since the sidecar, else from it, else
        from the entry itself (KeyError when the state has no such action)."""
        state = self.state
        over = state.get("outs")
        if over and producer in over:
            return over[producer][0]
        # NB: the table looked up once per seal (a save makes a new one, and empties `outs`)
        seal = state.get("outs_seal")
        if self._table[0] != seal or seal is None:
            self._table = (seal, _outs_table(store, state))
        table = self._table[1]
        got = table.get(producer) if table is not None else None
        return got[0] if got is not None else self.actions[producer][OUTPUTS]


def _sidecar_row(store: Any, state: dict, action_id: str) -> tuple | None:
    """`_row` of the action's entry as it is now: from the state's `outs` when it changed
    since the sidecar was written, else from the sidecar; None when neither can say."""
    over = state.get("outs")
    if over and action_id in over:
        return over[action_id]
    table = _outs_table(store, state)
    return table.get(action_id) if table is not None else None


def _changed_row(p: Plan, action_id: str, a: list) -> None:
    """The entry `a` of `action_id` changed (outputs, key or signature): its row goes to the
    state's `outs`, so to the delta, and wins over the sidecar's."""
    p.state.setdefault("outs", {})[action_id] = _row(a)
    p.updated["outs"].add(action_id)


class Wanted:
    """The state's actions as the build's set of wanted ones: `in` (looked up in the action
    shard of the id), `len` and iteration in the state's order, without a set of them all."""

    __slots__ = ("_plan",)

    def __init__(self, plan: Plan) -> None:
        self._plan = plan

    def __contains__(self, action_id: object) -> bool:
        return action_id in self._plan.actions

    def __len__(self) -> int:
        return len(self._plan.state["order"])

    def __iter__(self) -> Iterator[str]:
        return iter(self._plan.state["order"])


class Except:
    """The ids of `order` not in `skip` (a subset of it), in order: iterated, never listed."""

    __slots__ = ("_order", "_skip")

    def __init__(self, order: list[str], skip: set[str]) -> None:
        self._order, self._skip = order, skip

    def __iter__(self) -> Iterator[str]:
        skip = self._skip
        return (i for i in self._order if i not in skip)

    def __len__(self) -> int:
        return len(self._order) - len(self._skip)


class StateOutcomes(Mapping):
    """Outcomes of actions the state vouches for (all of them, or `ids`, or all but `skip`),
    made on first use: a build of 100,000 unchanged actions need not build 100,000 objects
    nobody reads."""

    def __init__(
        self,
        store: Any,
        plan: Plan,
        ids: list[str] | None = None,
        skip: set[str] | None = None,
    ) -> None:
        self._store = store
        self._plan = plan
        self._skip = skip if skip is not None and ids is None else None
        self._ids: Any = (
            ids
            if ids is not None
            else Except(plan.state["order"], skip)
            if skip is not None
            else plan.state["order"]
        )
        self._members = None if ids is None else set(ids)
        self._made: dict = {}

    def __getitem__(self, action_id: str):
        got = self._made.get(action_id)
        if got is None:
            if self._members is not None and action_id not in self._members:
                raise KeyError(action_id)
            if self._skip is not None and action_id in self._skip:
                raise KeyError(action_id)
            # NB: KeyError when the state has no such action (one shard looked at)
            got = self._made[action_id] = self._plan.outcome(action_id)
        return got

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, action_id: object) -> bool:
        if self._members is None:
            if self._skip is not None and action_id in self._skip:
                return False
            return action_id in self._plan.actions
        return action_id in self._members

    def settled_ids(self) -> Any:
        """For the ids of a table of inputs the state keeps (`Plan.inputs_of`), all of them
        in the state's actions: `in` without a look at their shards where that can say."""
        return _NotIn(self._skip) if self._skip is not None else self

    def inputs_of(self, consumer: str) -> dict[str, tuple] | None:
        """The table of `consumer`'s produced inputs the state keeps (`Plan.inputs_of`)."""
        return self._plan.inputs_of(consumer)

    def output(self, producer: str, path: str) -> tuple[Digest, bool] | None:
        """(digest, executable) of a vouched-for action's output, from the state as is."""
        if self._skip is not None:
            # NB: all but `skip`: no look at the producer's entry shard to ask whether the
            # state has it (the sidecar may say all that is needed); one it lacks is None
            if producer in self._skip:
                return None
            try:
                return self._plan.output(self._store, producer, path)
            except KeyError:
                return None
        if producer not in self:
            return None
        return self._plan.output(self._store, producer, path)


class _NotIn:
    """`in`: not in `skip` (for ids known to be the state's actions)."""

    __slots__ = ("_skip",)

    def __init__(self, skip: set[str]) -> None:
        self._skip = skip

    def __contains__(self, action_id: object) -> bool:
        return action_id not in self._skip


class Overlay(Mapping):
    """A build's outcomes: those of its scheduler run over those the state vouched for."""

    def __init__(self, run: Mapping, settled: Mapping) -> None:
        self._run, self._settled = run, settled

    def __getitem__(self, action_id: str):
        got = self._run.get(action_id)
        return got if got is not None else self._settled[action_id]

    def __iter__(self) -> Iterator[str]:
        yield from self._run
        for action_id in self._settled:
            if action_id not in self._run:
                yield action_id

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, action_id: object) -> bool:
        return action_id in self._run or action_id in self._settled


def plan(
    ws: Any,
    store: Any,
    patterns: list[str],
    current: str,
    on_edit: Callable[[], None] | None = None,
) -> Plan | None:
    """None when there is no usable state (the slow path analyses and keys everything);
    otherwise which actions are unchanged and which the scheduler must see. `on_edit` is
    called once, as soon as a source's content is found changed (something will run)."""
    with quiet_gc():
        return _plan(ws, store, patterns, current, on_edit)


def _plan(
    ws: Any, store: Any, patterns: list[str], current: str, on_edit: Callable[[], None] | None
) -> Plan | None:
    from rsi.workspace import packages_under

    request = request_key(ws, patterns, current, store)
    if request is None:
        return None
    loaded = _load(store, request)
    if loaded is None:
        return None
    state, seal, updated, (watched, hits) = loaded
    if watched is not None and watched.get("count") != len(state["sources"]):
        watched = None  # NB: not the sources it was made for: start again
    memo = store.meta_memo
    sources = state["sources"]
    # NB: with a watcher, the sources it saw unchanged since the last check are not stat'ed
    p = Plan(request, state, seal, updated)
    p.hits = hits
    if watcher is None:
        p.sweep_watch = _build_watch(state)
    unchanged: Any = (
        _watched_unchanged(p, sources, watched, store._cas_s) if watcher is not None else None
    )
    # NB: one lstat per source serves both the check of its content's signature and the
    # analysis' check of its existence, kind, mode and real path, which needs only its mode:
    # {path: st_mode} is kept, not the stat results (at 100,000 sources, ~60 MiB of them)
    modes: dict[str, int] = {}
    # NB: the sources first: an edited one is reported at once (the caller starts what the
    # build will run on), before the code and the analysis' reads are checked (a change
    # there means analysing again, which runs something all the same)
    # NB: without a watcher, the output blobs are stat'ed by a forked child meanwhile
    # (rsi/side_check.py): their check needs nothing the sources' check finds
    tracker = state["tracker"]
    # NB: without a watcher, the analysis' reads of sources whose entries vouch for them are
    # left to the sources' check (`_fold`)
    folding = state.get("fold") if unchanged is None else None
    planned: Plan | None = None
    if not _fold_fits(folding, tracker, sources):
        folding = None
    fold: tuple[list, list] | None = ([], []) if folding is not None else None
    side = (
        side_check.start(store._cas_s, state["blobs"], state["logs"]) if p.watch is None else None
    )

    def edited() -> None:
        # NB: something will likely run, so a re-check before export follows: its sweep's
        # child is forked now, before `on_edit` starts any thread
        if p.watch is None and p.sweep_watch is None and p.sweeper is None:
            p.sweeper = side_check.start_sweep(sources)
        if on_edit is not None:
            on_edit()

    try:
        _check_sources(store, sources, modes, p, edited, unchanged, fold)
        # NB: the engine and rule code, then every read analysis made (declarations, folder
        # listings, sources' existence, mode and real path): any change means analyse again
        if not analysis_cache.packages_still_at(state["code_packages"]):
            return None  # NB: another copy of the engine or a rule family is on the path now
        if analysis_cache.code_digest(memo, state["code_roots"]) != state["code"]:
            return None
        tracker.memo = memo
        walker = lambda package: packages_under(ws.root, package)  # noqa: E731
        only = _fold(folding, fold, p.dirs) if fold is not None else None
        if not tracker.still_valid(store, walker, modes, unchanged, p.dirs, only):
            return None
        if only is not None:
            _vouch(sources, tracker.stats, fold[1], modes, p)  # type: ignore[index]
        _check_index(store, state, p)
        _check_entries(store, state, state["blobs"], p, side)
        planned = p
        return p
    finally:
        if side is not None:
            side.cancel()  # NB: nothing, once its answer was read
        if planned is None:
            p.end_watch()


# NB: from this many blobs a watched check stats them in one batch (rsi.native) rather than
# one by one in Python
NATIVE_LINKED_MIN = 64

# NB: set by the build server (rsi/server.py): an rsi.watch.Watcher of the sources' folders
watcher: Any = None

# NB: opt-in, as the server's watch is: RSI_BUILD_WATCH=1 makes a build without a server watch
# its sources' folders for its re-check before export (`_build_watch`) from this many sources
# (below, looking at every source again costs less than the watch), =always whatever the size.
# Off by default: inotify does not see a write through a hard link made after the check in a
# folder nobody watches, nor a write through a shared memory mapping, which the `lstat` of
# every source catches (tests/test_build_watch.py)
BUILD_WATCH_MIN = 5000


def _folders_of(sources: Mapping) -> dict:
    """For a new state: every folder holding a source (watched by `_build_watch`)."""
    folders = {q[: q.rfind("/")] or "/" for q in sources}
    return {"list": sorted(folders), "count": len(sources)}


def _build_watch(state: dict) -> Any:
    """This build's own watch of the sources' folders (rsi.watch.BuildWatch), made before its
    check of the sources, or None: off (the default), too few sources for it to pay, a folder
    for fewer than 8 sources on average, a state without its folders (or not made for these
    sources), or no inotify instance to be had (the re-check then looks at every source)."""
    mode = os.environ.get("RSI_BUILD_WATCH", "")
    if mode not in ("1", "always"):
        return None
    folders, sources = state.get("folders"), state["sources"]
    if not isinstance(folders, dict) or folders.get("count") != len(sources):
        return None
    listed = folders.get("list")
    if not isinstance(listed, list) or not all(isinstance(f, str) for f in listed):
        return None
    if mode != "always" and (len(sources) < BUILD_WATCH_MIN or 8 * len(listed) > len(sources)):
        return None
    from rsi.watch import BuildWatch

    try:
        return BuildWatch(listed)
    except OSError:
        return None


# The fold: the analysis' check of a source it read (kind, mode, real path) left to the
# sources' own check. A source's `lstat` signature (inode, size, mtime, ctime) stands for its
# kind and mode, as for its content: a chmod or a swap moves its ctime. So where the analysis'
# read of a source was once found as recorded by an `lstat` of the signature the source's entry
# still holds, and the source is still at that signature, the read holds but for its real path,
# which for a path that is its own real path (no link) holds while its folder's does. The entry
# says so with a fifth item, the mode it was found at (`_vouch`), dropped whenever its signature
# changes; a source at that signature but another mode (a file system that keeps no ctime for
# a chmod) has its read checked. The state keeps, from when it was made, the folders of such
# sources and the reads that are none (`_fold_of`). A no-op at 100,000 sources then resolves
# their folders, not every read.


def _fold_of(tracker: Any, sources: dict) -> dict | None:
    """For a new state: the folders of the sources the analysis read as their own real path
    (the only reads the fold can vouch for), and every other read (always checked)."""
    stats = getattr(tracker, "stats", None)
    if stats is None:
        return None
    folders: set[str] = set()
    rest: list[str] = []
    for q, want in stats.items():
        if q in sources and len(want) == 3 and want[2] == q:
            folders.add(q[: q.rfind("/")] or "/")
        else:
            rest.append(q)
    return {"folders": sorted(folders), "rest": rest, "count": [len(stats), len(sources)]}


def _fold_fits(folding: Any, tracker: Any, sources: dict) -> bool:
    """The state's fold is whole and made for this tracker's reads and these sources (else
    the analysis' check looks at every read, as without a fold)."""
    return (
        isinstance(folding, dict)
        and isinstance(folding.get("folders"), list)
        and isinstance(folding.get("rest"), list)
        and folding.get("count") == [len(getattr(tracker, "stats", ())), len(sources)]
    )


def _fold(folding: dict, fold: tuple[list, list], dirs: dict[str, str]) -> list[str] | None:
    """The reads the analysis' check must look at (the others' folders are still their own
    real paths, entered in `dirs` for the re-check before export), or None (check them all)
    when a folder is no longer its own real path."""
    realpath = os.path.realpath
    for folder in folding["folders"]:
        if realpath(folder) != folder:
            return None
    for folder in folding["folders"]:
        dirs[folder] = folder
    return [*folding["rest"], *fold[0]]


def _vouch(sources: dict, stats: Mapping, same: list[str], modes: dict, p: Plan) -> None:
    """After the analysis' check held: mark the entries of the sources it checked against an
    `lstat` whose signature their entry holds (`same`), where the read is the fold's kind (the
    path its own real path, no link), so the next check leaves them to the sources' check."""
    for q in same:
        want = stats.get(q)
        if want is None or len(want) != 3 or want[2] != q:
            continue
        mode = modes.get(q)
        entry = sources.get(q)
        if mode is None or stat.S_ISLNK(mode) or entry is None or len(entry) != 4:
            continue
        entry.append(mode)
        p.updated["sources"].add(q)
        p.changed = True


def _vouch_new(sources: dict, tracker: Any) -> None:
    """For a new state: mark the entries of the sources whose read an `lstat` now shows as the
    analysis recorded it (kind, executable, no link, its own real path) at the signature the
    run recorded, as `_vouch` does after a check (the first no-op after a cold build then need
    not write the state whole to mark them: at 100,000 sources, 2 s and 460 MiB)."""
    stats = getattr(tracker, "stats", None)
    if not stats:
        return
    lstat = os.lstat
    for q, entry in sources.items():
        sig = entry[0]
        want = stats.get(q)
        if sig is None or len(entry) != 4 or want is None or len(want) != 3 or want[2] != q:
            continue
        try:
            st = lstat(q)
        except OSError:
            continue
        mode = st.st_mode
        if (
            stat.S_ISLNK(mode)
            or sig != _sig(st)
            or want[0] != ("dir" if stat.S_ISDIR(mode) else "file")
            or want[1] != bool(mode & 0o111)
        ):
            continue
        entry.append(mode)


def _watched_unchanged(p: Plan, sources: dict, watched: Any, cas_root: str) -> Vouched:
    """The sources the watcher saw no change to since this state was last checked (in this
    process), by folder (`Vouched`): each in a folder watched since before that check, not
    named by any event since, with its digest known and, when last stat'ed, a single link and
    no symlink. The folders (and the store's blob folders) are watched from now on, and the
    mark taken before any source is looked at."""
    if watched is None:
        listed: dict[str, list[str]] = {}
        for path in sources:
            listed.setdefault(path[: path.rfind("/")] or "/", []).append(path)
        folders = {folder: frozenset(paths) for folder, paths in listed.items()}
        # NB: "cas_linked": the blobs to stat whatever the watcher says (two links when last
        # stat'ed); None until one build has stat'ed every blob under a watch
        watched = {
            "mark": None,
            "linked": set(sources),
            "folders": folders,
            "count": len(sources),
            "cas_linked": None,
            "extra": {},
        }
    folders = watched["folders"]
    watcher.watch(folders)
    # NB: the store's blob folders too (`_check_entries`): a blob is only ever added, replaced
    # or removed by a rename or an unlink in its folder, or changed by a write through a path,
    # each an event naming it there (through a second link: always stat'ed, as a source is)
    watcher.watch(_cas_folders(cas_root))
    mark = watcher.mark()
    # NB: after the mark: a mount made since the last check changes what a path shows with no
    # event, so then every source is stat'ed; a source that is a mount point always is (a
    # write through the mount's other path is reported to that path's folder only)
    moved = watcher.mounts_moved()
    before, linked = watched["mark"], watched["linked"]
    p.watch = {
        "mark": mark,
        "linked": linked,
        "folders": folders,
        "before": None if moved else before,
        "count": watched["count"],
        "cas_linked": watched.get("cas_linked"),
        "extra": watched.get("extra", {}),
    }
    if before is None or moved:
        return _vouched(p, {})
    # NB: a source with no digest known (racy when last hashed) is never vouched for
    unknown = {path for path, entry in sources.items() if entry[1] is None}
    changed = {folder: watcher.changed_since(folder, before) for folder in folders}
    return _vouched(p, changed, unknown)


def _vouched(p: Plan, changed: dict, unknown: set[str] | frozenset[str] = frozenset()) -> Vouched:
    """What the watcher vouches for, given {folder: the names changed in it since the mark, or
    None}: the sources of each folder with a set of names (`quiet`), but those named, linked,
    mount points or `unknown`, which are `noisy` with every source of the other folders."""
    folders, linked, mounts = p.watch["folders"], p.watch["linked"], watcher.mount_points
    quiet: dict[str, frozenset[str]] = {}
    noisy: list[str] = []
    held = _mount_folders(mounts)
    for folder, paths in folders.items():
        names = changed.get(folder)
        if names is None:
            noisy.extend(paths)
            continue
        quiet[folder] = paths
        cut = f"{folder}/" if folder != "/" else "/"
        noisy.extend(q for q in (cut + name for name in names) if q in paths)
        if linked:
            noisy.extend(linked.intersection(paths))
        if unknown:
            noisy.extend(unknown.intersection(paths))
        if folder in held:
            noisy.extend(mounts.intersection(paths))
    return Vouched(quiet, list(dict.fromkeys(noisy)), p.watch["extra"], folders)


def _mount_folders(mounts: frozenset[str]) -> frozenset[str]:
    """The folders that hold a mount point (whose sources are looked at one by one)."""
    got = _MOUNT_FOLDERS.get(mounts)
    if got is None:
        got = frozenset(m[: m.rfind("/")] or "/" for m in mounts)
        _MOUNT_FOLDERS.clear()
        _MOUNT_FOLDERS[mounts] = got
    return got


_MOUNT_FOLDERS: dict[frozenset, frozenset] = {}


def _cas_folders(cas_root: str | None) -> list[str]:
    """The store's blob folders (one per first two hex digits of a blob's hash)."""
    if not cas_root:
        return []
    try:
        names = os.listdir(cas_root)
    except OSError:
        return []
    return [f"{cas_root}/{n}" for n in names if len(n) == 2]


def _blobs_to_stat(p: Plan, cas_root: str, blobs: Any, logs: Any) -> tuple | None:
    """With a watcher (the build server's): (the output blobs, the log blobs) of the state
    that no event can vouch for since the last check: named by an event in their folder since
    it, or with two links when last stat'ed (or new to the state since). None (stat them all)
    when the watcher cannot tell for every folder holding one: the first watched check, a
    mount added or removed, events lost, a folder not watched since before the last check, or
    a mount inside the store."""
    w = p.watch
    if w is None or watcher is None or w["before"] is None or w["cas_linked"] is None:
        return None
    before = w["before"]
    if any(m == cas_root or m.startswith(cas_root + "/") for m in watcher.mount_points):
        return None
    named: set[str] = set()
    # NB: every folder a hash can be in (two hex digits), there or not: one not watched since
    # before the last check (made since, or not there) vouches for none of its blobs
    blind: set[str] = set()
    for shard in _SHARDS:
        changed = watcher.changed_since(f"{cas_root}/{shard}", before)
        if changed is None:
            blind.add(shard)
        else:
            named.update(changed)
    if blind and any(h[:2] in blind for hashes in (blobs, logs) for h in hashes):
        return None
    named.update(w["cas_linked"])
    return _pick(blobs, named), [h for h in named if h in logs]


def _pick(mapping: Any, keys: Any) -> list[tuple]:
    """(key, value) of each of `keys` in `mapping` (a sharded one: one lookup each)."""
    if isinstance(mapping, Sharded):
        return mapping.pick(keys)
    return [(k, mapping[k]) for k in keys if k in mapping]


_SHARDS = tuple(f"{i:02x}" for i in range(256))


def unchanged_since_check(p: Plan | None) -> Vouched | frozenset[str]:
    """The sources a watcher (the build server's) saw no change to since this build's check
    (its mark): in a folder watched since before it, named by no event since, never a
    symlink, a file of two links or a mount point, and no mount added or removed since
    (looked at, not taken: the next build's check sees it too). Empty without a watcher."""
    if p is None or p.watch is None or watcher is None:
        return frozenset()
    if watcher.mounts_moved(update=False):
        return frozenset()
    mark = p.watch["mark"]
    changed = {folder: watcher.changed_since(folder, mark) for folder in p.watch["folders"]}
    return _vouched(p, changed)


def swept_since_check(
    p: Plan, seen: Mapping[str, tuple], inside: str
) -> tuple[list[str], dict[str, tuple], set[str]] | None:
    """The re-check before export (rsi/build.py) as one sweep like the check's: one `lstat` per
    source. A source at the trusted signature the check found it at is unchanged since then in
    content, kind and mode (a write, a chmod or a swap moves its ctime), and in real path while
    its folder's is (`Tracker.moved_reads_since`). Returns (the sources gone, {path: (signature
    or None, hash, size)} of every other source to check as `rsi.recheck` does: re-keyed by the
    run, hashed or missing at the check, links, racy or moved now; the paths looked at). Paths
    under `inside` (the store: this build wrote them) are not sources. None where this does
    not apply (a watcher's build: its events say more)."""
    if p.watch is not None:
        return None
    sources = p.state["sources"]
    unsettled = p.unsettled
    lstat = os.lstat
    slow: dict[str, tuple] = {}
    gone: list[str] = []
    # NB: with this build's own watch, the sources no event named since the check (nor
    # links, symlinks or mount points) are as the check found them: not looked at again
    named = p.sweep_watch.named(sources) if p.sweep_watch is not None else None
    items: Any = sources.items()
    if named is not None:
        items = ((q, sources[q]) for q in dict.fromkeys(named) if q in sources)
    # NB: with the sweep's child (rsi.side_check.Sweep), the sources of odd hash are its
    sweeper, p.sweeper = (p.sweeper, None) if named is None else (None, p.sweeper)
    if sweeper is not None and not sweeper.go():
        sweeper.cancel()
        sweeper = None

    def sweep(pairs: Any, split: bool) -> tuple[int, int]:
        """`lstat` each source of `pairs` (with `split`, the odd-hash ones are the child's:
        counted and XORed, not looked at); (how many were the child's, their hashes' XOR)."""
        count = xor = 0
        for path, entry in pairs:
            if split:
                h = hash(path)
                if h & 1:
                    count += 1
                    xor ^= h
                    continue
            if path in unsettled or path in seen:
                continue
            try:
                st = lstat(path)
            except OSError:
                gone.append(path)
                continue
            sig = entry[0]
            if sig is None or sig != (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns):
                slow[path] = (sig, entry[1], entry[2])
        return count, xor

    if sweeper is None and named is None and type(sources) is dict:
        # NB: every source in one batch (rsi.native): those not at their recorded signature
        # (or with none) are swept as above, one by one
        moved, _ = native.stale([sources], sig_at=0)
        items = ((q, sources[q]) for q in moved)
    try:
        count, xor = sweep(items, sweeper is not None)
    except BaseException:
        # NB: a Ctrl-C or a signal mid-sweep: the child is stopped and reaped, not left
        # blocked on a pipe nobody reads (the plan no longer holds it)
        if sweeper is not None:
            sweeper.cancel()
        raise
    if sweeper is not None:
        answer = sweeper.result()
        if answer is not None and answer[1:] == (count, xor):
            # NB: the child looked at every odd source the state holds now: those it names
            # are looked at again here; the others were at their signature after the go
            sweep(((q, sources[q]) for q in answer[0] if q in sources), False)
        else:
            sweep(((q, e) for q, e in sources.items() if hash(q) & 1), False)
    # NB: what the run keyed, else what the check hashed, else what the state recorded
    for path in unsettled:
        entry = sources.get(path)
        if entry is not None:
            slow[path] = (entry[0], entry[1], entry[2])
    for path, (_, trusted, digest) in p.fresh.items():
        slow[path] = (trusted, digest.hash, digest.size)
    slow.update(seen)
    looked_at = set(slow).union(gone)
    slow = {path: v for path, v in slow.items() if not path.startswith(inside)}
    return [path for path in gone if not path.startswith(inside)], slow, looked_at


def _check_sources(
    store: Any,
    sources: dict,
    modes: dict,
    p: Plan,
    on_edit: Callable[[], None] | None = None,
    unchanged: Any = None,
    fold: tuple[list, list] | None = None,
) -> None:
    """Each source not in `unchanged` (a watcher's `Vouched`) is `lstat`ed once, its mode put in
    `modes` (for the analysis' check); one whose signature moved is hashed again, and a
    different digest makes the actions reading it dirty. With a watcher, its links are
    noted (`p.watch["linked"]`: stat'ed whatever the watcher says). `fold` (`_fold`) receives
    (the sources the analysis' check must look at: all but those at their signature and at the
    mode of their fifth item, the sources of those whose entry now holds the signature of the
    `lstat` whose mode is in `modes`)."""
    dirty, unsettled = p.dirty, p.unsettled
    lstat = os.lstat
    linked = p.watch["linked"] if p.watch is not None else None
    # NB: this build's own watch (`_build_watch`) cannot vouch for these either
    swept_linked = p.sweep_watch.linked if p.sweep_watch is not None else None
    items: Any = sources.items()
    if isinstance(unchanged, Vouched):
        # NB: the sources not vouched for, and no others: no walk of every source
        items = ((path, sources[path]) for path in unchanged.noisy if path in sources)
    check, same = fold if fold is not None else (None, None)

    def settle(path: str, entry: list, st: os.stat_result | None) -> None:
        """One source, `st` its `lstat` (None: gone)."""
        if st is not None:
            modes[path] = st.st_mode
            if linked is not None:
                if st.st_nlink > 1 or stat.S_ISLNK(st.st_mode):
                    linked.add(path)
                else:
                    linked.discard(path)
            if swept_linked is not None and (st.st_nlink > 1 or stat.S_ISLNK(st.st_mode)):
                swept_linked.append(path)
        sig = entry[0]
        if st is not None and sig is not None and sig == _sig(st):
            if check is not None and (len(entry) == 4 or entry[4] != st.st_mode):
                # NB: not vouched for, or at another mode than vouched for (a file system
                # that keeps no ctime for a chmod): its read is checked
                del entry[4:]
                check.append(path)
                same.append(path)
            return
        hash_hex, size, consumers = entry[1], entry[2], entry[3]
        unsettled.add(path)
        del entry[4:]  # NB: what the fifth item vouched for is gone with the signature
        if check is not None:
            check.append(path)
        if st is None:
            dirty.update(consumers)  # NB: the scheduler says what is wrong with it
            return
        if stat.S_ISLNK(st.st_mode):
            try:
                st = os.stat(path)
            except OSError:
                dirty.update(consumers)
                return
        if sig is not None and sig == _sig(st):
            return
        try:
            # NB: not through the stat memo: a racy source is read every time until it settles,
            # and that must not load a memo of every source
            digest = digest_file(path, store.function)
        except OSError:
            dirty.update(consumers)
            return
        new_sig = _trusted(st, time.time_ns()) if digest.size == st.st_size else None
        if hash_hex is None or digest.hash != hash_hex or digest.size != size:
            p.fresh[path] = (_sig(st), new_sig, digest)
            dirty.update(consumers)
            if not p.edited and on_edit is not None:
                on_edit()
            p.edited = True
            return
        if new_sig != sig:  # NB: touched, same content: remember the new signature
            entry[0] = new_sig
            if same is not None and new_sig is not None and st.st_mode == modes.get(path):
                same.append(path)  # NB: the signature of the very `lstat` of `modes`
            p.updated["sources"].add(path)
            if sig is None and new_sig is not None:
                p.changed = True  # NB: settled at last: from now on a stat stands for it
            else:
                p.touched += 1
                p.touched_bytes += st.st_size

    if check is None or linked is not None or type(sources) is not dict:
        for path, entry in items:
            settle(path, entry, _lstat_or_none(lstat, path))
        return
    # NB: the fold's common case in one batch (rsi.native: a C loop over threads where it is
    # built): a source at its signature whose entry vouches for the analysis' read needs
    # nothing more (not even its mode kept: 100,000 of them); every other is settled here
    moved, links = native.stale([sources], sig_at=0, mode_at=4, linked=swept_linked is not None)
    if swept_linked is not None:
        swept_linked.extend(links)
    for path in moved:
        settle(path, sources[path], _lstat_or_none(lstat, path))


def _lstat_or_none(lstat: Callable, path: str) -> os.stat_result | None:
    try:
        return lstat(path)
    except OSError:
        return None


def _check_index(store: Any, state: dict, p: Plan) -> None:
    dirty = p.dirty
    index_sig = store.target_index.signature()
    if index_sig is None or index_sig != state.get("index_sig"):
        actions = _actions(state)
        # NB: another build recorded other keys for some of these actions; the scheduler
        # records ours again so "why" compares against what this request last ran
        index = store.target_index.load_all()
        for action_id, a in actions.items():
            if (index.get(action_id) or {}).get("key") != f"{a[KEY_HASH]}/{a[KEY_SIZE]}":
                dirty.add(action_id)
        state["index_sig"] = index_sig
        p.changed = True


def _check_entries(
    store: Any, state: dict, blobs: dict, p: Plan, side: side_check.SideCheck | None = None
) -> None:
    """Every action not yet dirty keeps its cache entry and blobs as recorded (by signature);
    a racy or differing one is verified by content as a cache hit would be, and an action
    whose entry or blobs fail is dirty. The checks go by distinct folder and blob, not by
    action: the actions are walked only when something failed (to find whose it was) or an
    entry's shard changed."""
    dirty = p.dirty
    ac_root, cas_root = store._ac_s, store._cas_s
    stat_of = os.stat
    now = time.time_ns()
    # NB: an entry is only ever added, replaced or removed by a rename or an unlink in its
    # shard folder, which changes the folder's signature: in a shard whose folder is as
    # recorded, every entry is (a stat of 256 folders, not one per action). The folders are
    # stat'ed before their entries, so a change made while they are checked is seen next time
    ac_dirs = p.state["ac_dirs"]
    recheck: set[str] = set()
    shard_new: dict[str, Any] = {}
    for shard, want in ac_dirs.items():
        try:
            st = stat_of(f"{ac_root}/{shard}")
        except OSError:
            recheck.add(shard)
            shard_new[shard] = None
            continue
        if want is None or want != (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns):
            recheck.add(shard)
            shard_new[shard] = _trusted(st, now)
    # NB: every output blob once (a blob many actions output is stat'ed once); a racy or
    # differing one is verified by content (its hash names it, size included). With a
    # watcher, only those no event vouches for (`_blobs_to_stat`), and the links of each
    # blob stat'ed are noted
    bad: set[str] = set()
    logs = p.state["logs"]
    linked: set[str] | None = None
    only_b = only_l = None
    if p.watch is not None and watcher is not None:
        only = _blobs_to_stat(p, cas_root, blobs, logs)
        if only is None:
            p.watch["cas_linked"] = set()
        else:
            only_b, only_l = only
        linked = p.watch["cas_linked"]

    def check(h: str, want: Any) -> None:
        try:
            st = stat_of(f"{cas_root}/{h[:2]}/{h}")
        except OSError:
            bad.add(h)
            return
        if linked is not None:
            (linked.add if st.st_nlink > 1 else linked.discard)(h)
        if want is None or want != (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns):
            if not _blob_verified(store, st, h, st.st_size, blobs, p):
                bad.add(h)

    if side is not None and linked is None:
        # NB: this process's share of the blobs first (`side_check.PARENT_SHARDS`), then the
        # child's whole answer: the blobs it found moved or missing, each looked at again
        # here; no answer (it failed), and every blob is
        for h, want in side.own(blobs):
            check(h, want)
        suspects = side.result()
        if suspects is not None:
            only_b = _pick(blobs, suspects)
            only_l = [h for h in suspects if h in logs]
    if only_b is None and linked is None:
        # NB: every blob in one batch (rsi.native: a C loop over threads where it is built),
        # shard by shard where sharded (no order); those not at their signature are checked
        # one by one
        parts = blobs.shards() if isinstance(blobs, Sharded) else [blobs]
        if all(type(part) is dict for part in parts):
            only_b = _pick(blobs, native.stale(parts, prefix=cas_root, follow=True)[0])
    if only_b is None:
        # NB: every blob, shard by shard where sharded (no order, no lookup per blob); a
        # signature replaced meanwhile replaces an existing key, which a walk allows
        for h, want in blobs.shard_items() if isinstance(blobs, Sharded) else blobs.items():
            check(h, want)
    elif linked is not None and len(only_b) >= NATIVE_LINKED_MIN:
        # NB: a watcher's blobs (a prepared tree's 10,000 links among them) in one batch:
        # those at their signature are noted linked or not, the others checked one by one
        batch = dict(only_b)
        moved, links = native.stale([batch], prefix=cas_root, follow=True, linked=True)
        for h in moved:
            check(h, batch.pop(h))
        links_set = set(links)
        for h in batch:
            (linked.add if h in links_set else linked.discard)(h)
    else:
        for h, want in only_b:
            check(h, want)
    # NB: logs are checked by size, as a cache hit does
    for h in logs if only_l is None else only_l:
        try:
            st = stat_of(f"{cas_root}/{h[:2]}/{h}")
        except OSError:
            bad.add(h)
            continue
        if linked is not None:
            (linked.add if st.st_nlink > 1 else linked.discard)(h)
        if st.st_size != logs[h]:
            bad.add(h)
    walk = bool(bad or recheck)
    if recheck and not bad:
        # NB: the entries of the shards whose folder moved, by the index: no walk of the rest
        walk = not _check_listed(store, state, recheck, p, shard_new)
    if walk:
        owned: set[str] = set()
        for action_id, a in _actions(state).items():
            if bad:
                mine = [o[1] for o in a[OUTPUTS] if o[1] in bad]
                mine += [d[0] for d in a[LOGS] if d and d[0] in bad]
                if mine:
                    dirty.add(action_id)
                    owned.update(mine)
            if action_id in dirty:
                continue
            h = a[KEY_HASH]
            if h[:2] in recheck and not _entry_held(store, action_id, a, p):
                dirty.add(action_id)
                shard_new[h[:2]] = None
        if bad - owned:  # NB: gone, but no action has them any more: dropped at the next save
            p.compact = p.changed = True
    # NB: a shard whose entries all held: its folder's signature stands for them next time
    # (one with a failed entry is re-checked: the action runs again and writes into it)
    for shard, sig in shard_new.items():
        if ac_dirs.get(shard) != sig:
            ac_dirs[shard] = sig
            p.updated["ac_dirs"].add(shard)
            p.changed = True


def _check_listed(store: Any, state: dict, shards: set[str], p: Plan, shard_new: dict) -> bool:
    """The entries of these action-cache shards, found through `ac_index`, held (those that
    did not make their actions dirty); False when the index cannot say (missing, or naming an
    action whose entry is elsewhere): the caller walks every action."""
    index = state.get("ac_index")
    if index is None:
        return False
    actions = _actions(state)
    ac_root = store._ac_s
    over = state.get("outs") or {}
    for shard in sorted(shards):
        for listed in _listed(state, shard):
            action_id = listed[0]
            if action_id in p.dirty:
                continue
            # NB: the row holds the entry's current key and signature (every change of them
            # since the state was written whole goes to `outs`, which wins), so an entry file
            # at the signature recorded with it is held: no entry unpickled
            row = over.get(action_id) or (None, listed[1], listed[2])
            if row[2] is not None and row[1][:2] == shard:
                try:
                    st = os.stat(f"{ac_root}/{shard}/{row[1]}")
                except OSError:
                    st = None
                if st is not None and row[2] == (
                    st.st_ino,
                    st.st_size,
                    st.st_mtime_ns,
                    st.st_ctime_ns,
                ):
                    continue
            a = actions.get(action_id)
            if a is None or a[KEY_HASH][:2] != shard:
                return False
            if not _entry_held(store, action_id, a, p):
                p.dirty.add(action_id)
                shard_new[shard] = None
    return True


def _entry_held(store: Any, action_id: str, a: list, p: Plan) -> bool:
    """The action's entry is there with its recorded signature, or verified by content."""
    h = a[KEY_HASH]
    try:
        st = os.stat(f"{store._ac_s}/{h[:2]}/{h}")
    except OSError:
        return False
    sig = a[AC_SIG]
    if sig is not None and sig == (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns):
        return True
    return _entry_verified(store, action_id, a, st, p)


def _entry_verified(store: Any, action_id: str, a: list, st: os.stat_result, p: Plan) -> bool:
    """The entry read and checked as a cache hit reads it, and holding what was recorded."""
    # NB: its blobs are checked next, by `_check_entries`, as a cache hit checks them
    result = store.get_action_result(Digest(a[KEY_HASH], a[KEY_SIZE]), check_blobs=False)
    if result is None or not result.ok:
        return False
    outputs = tuple((o.path, o.digest.hash, o.digest.size, o.executable) for o in result.outputs)
    logs = tuple((d.hash, d.size) if d else None for d in (result.stdout, result.stderr))
    if outputs != tuple(a[OUTPUTS]) or logs != tuple(a[LOGS]):
        return False
    a[AC_SIG] = _trusted(st, time.time_ns())
    p.updated["actions"].add(action_id)
    _changed_row(p, action_id, a)
    p.changed = True
    return True


def _blob_verified(store: Any, st: os.stat_result, h: str, n: int, blobs: dict, p: Plan) -> bool:
    """A blob whose signature is racy or moved, read and checked as a cache hit would; when
    good, its signature is remembered (if it stands for content by now)."""
    if not store.has_verified(Digest(h, n)):
        return False
    blobs[h] = _trusted(st, time.time_ns())
    p.updated["blobs"].add(h)
    p.changed = True
    return True


# ---------------------------------------------------------------------------------- record


def _add_sources(
    spec: Any, action_id: str, sources: dict, same_path: dict, observed: Mapping
) -> None:
    """Enter `spec`'s workspace sources under `sources`, with what the run saw of each."""
    for art in spec.inputs:
        if art.source is not None and art.producer is None:
            path = str(art.source)
            path = same_path.get(path, path)
            entry = sources.get(path)
            if entry is None:
                seen = observed.get(path) or (None, None, None)
                entry = sources[path] = [seen[0], seen[1], seen[2], []]
            entry[3].append(action_id)


def record(
    store: Any,
    request: str,
    *,
    analysis: dict,
    labels: list,
    graph: Any,
    outcomes: Mapping,
    observed: Mapping[str, tuple],
    previous: Plan | None,
    rerun: set[str],
    roots_sig: Any,
    wide: Mapping[str, dict] | None = None,
) -> None:
    """Save the state of a build in which every wanted action succeeded. `observed` is what
    the scheduler saw of each source it keyed ((signature or None, hash, size), or
    (None, None, None) when two reads disagreed); `rerun` are the actions it looked at (the
    others kept their entries from `previous`, which is then updated in place and saved as a
    delta: a build that ran three actions writes three entries, not the state of all).
    `wide`: the tables of produced inputs of the actions it resolved with many
    (rsi.scheduler `wide_inputs`)."""
    wide = wide or {}
    if previous is not None:
        _record_changes(store, previous, outcomes, observed, rerun, roots_sig, wide)
        return
    now = time.time_ns()
    wanted = [i for i in outcomes]
    blobs: dict = {}
    actions: dict[str, list] = {}
    sources: dict[str, list] = {}
    # NB: the tracker's own strings as keys, so each path is pickled once
    same_path = {p: p for p in getattr(analysis.get("tracker"), "stats", {})}
    # NB: one object for equal values many actions hold (their mnemonic, their logs: most
    # are empty), pickled and unpickled once
    shared: dict = {}
    for action_id in wanted:
        spec = graph.actions[action_id]
        _add_sources(spec, action_id, sources, same_path, observed)
        o = outcomes[action_id]
        actions[action_id] = _entry(store, spec.label, spec.mnemonic, o, blobs, shared, now)
    targets = []
    for label in labels:
        provider = graph.providers[label]
        targets.append(
            {
                "label": str(label),
                "rule": graph.targets[label].rule.name,
                "declared": len(graph.target_actions.get(label, [])),
                "files": [
                    (art.path, graph.producer(art.producer))
                    for art in provider.files
                    if art.producer is not None
                ],
                "show": provider.info.get("show"),
            }
        )
    _vouch_new(sources, analysis.get("tracker"))
    ac_dirs: dict[str, Any] = {}
    for a in actions.values():
        shard = a[KEY_HASH][:2]
        if shard not in ac_dirs:
            try:
                ac_dirs[shard] = _trusted(os.stat(f"{store._ac_s}/{shard}"), now)
            except OSError:
                ac_dirs[shard] = None
    state = {
        "schema": SCHEMA,
        "request": request,
        **analysis,
        "targets": targets,
        "order": wanted,
        "actions": actions,
        "sources": sources,
        "fold": _fold_of(analysis.get("tracker"), sources),
        "folders": _folders_of(sources),
        "blobs": blobs,
        "logs": _logs_of(actions.values()),
        "ac_dirs": ac_dirs,
        "index_sig": store.target_index.signature(),
        "roots_sig": roots_sig,
        "hits_sum": _hits_sum(actions),
        # NB: every action was resolved by this run: its tables are all there are
        "inputs": {i: _packed_inputs(t) for i, t in wide.items() if i in actions},
    }
    save(store, state)


def _packed_inputs(table: dict) -> Packed:
    """A `wide_inputs` table as the state keeps it (a section of its own when large)."""
    return Packed(pickle.dumps(table, pickle.HIGHEST_PROTOCOL))


def _hits_sum(actions: dict[str, list]) -> int:
    """The sum of every action's `hit_term` (rsi.digest), modulo `HITS_MOD`."""
    total = sum(hit_term(i, f"{a[KEY_HASH]}/{a[KEY_SIZE]}") for i, a in actions.items())
    return total % HITS_MOD


def _logs_of(entries) -> dict[str, int]:
    """{hash: size} of every log blob these action entries name."""
    logs: dict[str, int] = {}
    seen: set[int] = set()
    for a in entries:
        pair = a[LOGS]
        if id(pair) not in seen:  # NB: most actions share one pair (empty logs)
            seen.add(id(pair))
            for d in pair:
                if d:
                    logs[d[0]] = d[1]
    return logs


def _entry(
    store: Any,
    label: str,
    mnemonic: str,
    o: Any,
    blobs: dict,
    shared: dict,
    now: int,
    new_blobs: set | None = None,
) -> list:
    """An action's entry in the state, the signatures of its blobs not yet known (or racy)
    entered in `blobs` (and their hashes in `new_blobs`)."""
    result = o.result
    outputs = tuple((x.path, x.digest.hash, x.digest.size, x.executable) for x in result.outputs)
    logs = tuple((d.hash, d.size) if d else None for d in (result.stdout, result.stderr))
    logs = shared.setdefault(logs, logs)
    try:
        ac_sig = _trusted(os.stat(f"{store._ac_s}/{o.key.hash[:2]}/{o.key.hash}"), now)
    except OSError:
        ac_sig = None
    for _, h, _n, _x in outputs:
        if blobs.get(h) is None:
            try:
                blobs[h] = _trusted(os.stat(f"{store._cas_s}/{h[:2]}/{h}"), now)
            except OSError:
                blobs[h] = None
            if new_blobs is not None:
                new_blobs.add(h)
    return [
        label,
        shared.setdefault(mnemonic, mnemonic),
        o.key.hash,
        o.key.size,
        ac_sig,
        outputs,
        logs,
    ]


def _record_changes(
    store: Any,
    p: Plan,
    outcomes: Mapping,
    observed: Mapping[str, tuple],
    rerun: set[str],
    roots_sig: Any,
    wide: Mapping[str, dict],
) -> None:
    """The same analysis as the previous state's (the plan checked it), so the same sources
    with the same consumers and the same actions: only what the run saw of the sources it
    keyed and the entries of the actions it looked at are new; no other spec is read."""
    now = time.time_ns()
    state = p.state
    sources, actions = state["sources"], _actions(state)
    updated = p.updated
    # NB: every action this build looked at has its table of inputs anew (or none: one it did
    # not resolve keeps no table that may name a producer's old outputs)
    tables = state.setdefault("inputs", {})
    for action_id in rerun:
        table = wide.get(action_id)
        if table is not None:
            tables[action_id] = _packed_inputs(table)
        elif tables.get(action_id) is None:
            continue
        else:
            tables[action_id] = None
        updated["inputs"].add(action_id)
    for path, seen in observed.items():
        old = sources.get(path)
        if old is None:
            continue
        if any(c not in rerun for c in old[3]) and (old[1], old[2]) != seen[1:]:
            seen = (None, None, None)  # NB: an unchanged consumer was keyed with the old
        if (old[0], old[1], old[2]) != seen:
            old[0], old[1], old[2] = seen
            del old[4:]  # NB: a new signature: the analysis' read of it is not vouched for
            updated["sources"].add(path)
    # NB: one object for equal values many actions hold, shared with the kept entries
    # (a re-run action's old entry: its shard is loaded anyway, the first action's may not be)
    shared: dict = {}
    for a in (actions.get(i) for i in rerun):
        if a is not None:
            shared.setdefault(a[LOGS], a[LOGS])
            shared.setdefault(a[MNEMONIC], a[MNEMONIC])
            break
    blobs = state["blobs"]
    force = p.watch.get("cas_linked") if p.watch is not None else None
    for action_id in rerun:
        old = actions.get(action_id)
        if old is None or action_id not in outcomes:
            continue
        o = outcomes[action_id]
        entry = _entry(store, old[LABEL], old[MNEMONIC], o, blobs, shared, now, updated["blobs"])
        if force is not None:
            # NB: blobs this state did not have may have been in the store (and linked
            # elsewhere) before the watch's mark, with no event since: stat'ed next time
            force.update(out[1] for out in entry[OUTPUTS])
            force.update(log[0] for log in entry[LOGS] if log)
        if entry != old:
            actions[action_id] = entry
            # NB: the sidecar holds the rows as the state was last written whole
            _changed_row(p, action_id, entry)
            p.hits = None  # NB: its hit line changed (its key)
            if state.get("hits_sum") is not None:
                was = hit_term(action_id, f"{old[KEY_HASH]}/{old[KEY_SIZE]}")
                now_term = hit_term(action_id, f"{entry[KEY_HASH]}/{entry[KEY_SIZE]}")
                state["hits_sum"] = (state["hits_sum"] - was + now_term) % HITS_MOD
            updated["actions"].add(action_id)
            for d in entry[LOGS]:
                if d and d[0] not in state["logs"]:
                    state["logs"][d[0]] = d[1]
                    updated["logs"].add(d[0])
        if old[KEY_HASH][:2] != entry[KEY_HASH][:2]:
            # NB: its entry moved to another shard folder: the index follows (`_listed`; the
            # entry's row is in `outs`)
            state.setdefault("ac_moved", {})[action_id] = entry[KEY_HASH][:2]
            updated["ac_moved"].add(action_id)
        # NB: written into by this build: its entries are stat'ed next time, which settles it
        shard = entry[KEY_HASH][:2]
        if state["ac_dirs"].get(shard, 0) is not None:
            state["ac_dirs"][shard] = None
            updated["ac_dirs"].add(shard)
    state["index_sig"] = store.target_index.signature()
    state["roots_sig"] = roots_sig
    save_changes(store, p)
