"""One build, end to end: load, analyse, schedule, materialise outputs, report. It must never export
an output older than the sources it read.

This is the engine's entry point for the CLI and for tests; it holds the store lock for the
whole build and writes one event log per build under `<store>/events/`, which always ends with
`build_finished`, even when SIGINT or SIGTERM stops the build.
"""

from __future__ import annotations

import gc
import math
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from rsi import recheck, wslock
from rsi.errors import RsiError, UsageError
from rsi.events import EventLog
from rsi.fsutil import pid_alive
from rsi.label import Label, Pattern
from rsi.record import Value
from rsi.runtime import make_local_executor, open_store
from rsi.store import LocalStore
from rsi.workspace import Workspace

if TYPE_CHECKING:
    # NB: imported where used: a build the incremental state serves never loads the
    # analysis, the scheduler, the executors or networkx
    from rsi.analysis import BuildGraph
    from rsi.host import Capabilities
    from rsi.loader import Loader
    from rsi.scheduler import Outcome


class BuildReport(Value):
    _fields = (
        "build_id",
        "ok",
        "targets",
        "counts",
        "events_path",
        "wall_s",
        "outcomes",
        "graph_source",
    )
    _hidden = ("graph_source",)

    def __init__(
        self,
        build_id: str,
        ok: bool,
        targets: dict[str, dict[str, Any]] | None = None,
        counts: dict[str, int] | None = None,
        events_path: str | None = None,
        wall_s: float = 0.0,
        outcomes: Mapping[str, Outcome] | None = None,
        graph_source: Any = None,
    ) -> None:
        self.build_id = build_id
        self.ok = ok
        self.targets: dict[str, dict[str, Any]] = {} if targets is None else targets
        self.counts: dict[str, int] = {} if counts is None else counts
        self.events_path = events_path
        self.wall_s = wall_s
        self.outcomes: Mapping[str, Outcome] = {} if outcomes is None else outcomes
        # NB: a BuildGraph, or a callable loading it: a build served from the incremental
        # state loads its graph only when someone asks (the campaign commands do)
        self.graph_source = graph_source

    @property
    def graph(self) -> BuildGraph | None:
        if callable(self.graph_source):
            self.graph_source = self.graph_source()
        return self.graph_source

    def to_json(self) -> dict:
        return {
            "schema": "rsi.build_report/1",
            "build_id": self.build_id,
            "ok": self.ok,
            "counts": self.counts,
            "targets": self.targets,
            "events": self.events_path,
            "wall_s": round(self.wall_s, 4),
        }


class BuildInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped the build; the CLI exits with 128 + the signal number."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.signal = signal.Signals(signum).name
        self.exit_code = 128 + signum
        super().__init__(self.signal)


@contextmanager
def interruptible() -> Iterator[None]:
    """While a build runs (in the main thread), SIGINT and SIGTERM raise `BuildInterrupted`:
    the scheduler cancels what runs (killing each action's process tree), keeps what finished
    and the build reports why it ended. Only the first signal raises; the rest are ignored
    while that cleanup (bounded by the executors' cancel) runs. A signal the caller ignores
    (SIG_IGN) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        if fired:
            return
        fired.append(signum)
        raise BuildInterrupted(signum)

    previous: dict[int, Any] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) is signal.SIG_IGN:
            continue
        previous[sig] = signal.signal(sig, on_signal)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


# NB: a build whose sources changed while it ran builds again (what did not change is served
# from the cache); past this many attempts it fails, saying so, and exports nothing
MAX_BUILD_ATTEMPTS = 3


class SourcesMoved(Exception):
    """What this build read changed before it could export (internal: `build` goes again)."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths
        first = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
        self.what = f"sources changed during the build ({first})"
        super().__init__(f"{self.what}, {MAX_BUILD_ATTEMPTS} times: outputs not exported")


def _moved(seen: Mapping[str, tuple], plan: Any, analysis: dict, store: LocalStore) -> list[str]:
    """What this build read that the workspace no longer holds (rsi.recheck)."""
    from rsi.incremental import unchanged_since_check

    # NB: with a watcher (the build server), what no event named since the check is as read
    unchanged = unchanged_since_check(plan)
    lstats: dict = {}
    expected = recheck.expected_sources(seen, plan)
    # NB: files under the store (a built toolchain's tree and info.json) are written by this
    # very build; they are outputs it made, never sources another writer moved
    # (a prefix test on the path as read: no realpath per source on the one-change path)
    inside = os.path.join(str(store.root), "")
    expected = {p: v for p, v in expected.items() if not p.startswith(inside)}
    moved = recheck.moved_sources(expected, store.function, unchanged, lstats)
    moved += recheck.moved_declarations(analysis.get("tracker"), lstats, unchanged)
    return [p for p in moved if not p.startswith(inside)]


@contextmanager
def _outputs_held(
    ws: Workspace,
    store: LocalStore,
    events: EventLog,
    parent: int,
    patterns: list[str],
    timeout_s: float | None,
    materialise: bool = True,
) -> Iterator[None]:
    """The workspace's outputs lock (rsi.wslock) for this build's check and export; a wait
    is a `build_waiting` event and one line naming the holder. A build that exports nothing
    takes none."""
    if not materialise:
        yield
        return
    path = wslock.lock_path(store.root, ws.out_dir)

    def on_wait(holder: dict | None, waited_s: float) -> None:
        events.emit(
            "build_waiting",
            parent,
            lock=str(path),
            holder=holder,
            waited_s=round(waited_s, 3),
            timeout_s=timeout_s,
        )
        events.notice(
            f"waiting for {ws.out_dir}: held by {wslock.describe(holder)}; Ctrl-C stops",
            new=True,
        )

    with wslock.held(path, " ".join(patterns), timeout_s=timeout_s, on_wait=on_wait):
        yield


def executor_capabilities(executor: Any) -> Callable[[], Capabilities] | None:
    """What the executor can provide: its own `capabilities` when it declares them; none to
    check for a remote engine (its workers may have what this host lacks); otherwise what
    this host has, since a local executor runs actions here."""
    declared = getattr(executor, "capabilities", None)
    if declared is not None:
        return declared if callable(declared) else (lambda: declared)
    if getattr(executor, "name", "") == "remote":
        return None
    from rsi.host import host_capabilities

    return host_capabilities


def _settled_hit() -> Outcome:
    """Stands for every action the incremental state vouched for in a target's summary."""
    from rsi.scheduler import Outcome

    return Outcome("", "hit")


def _register_refs(
    ws: Workspace, store: LocalStore, refs: dict, events: EventLog, parent: int | None
) -> None:
    try:
        store.gc_roots.register(ws.root, refs)
    except RsiError as exc:
        events.emit("warning", parent, message=f"workspace not registered as a gc root: {exc}")


def _register_roots(
    ws: Workspace,
    store: LocalStore,
    graph: BuildGraph,
    outcomes: dict[str, Outcome],
    events: EventLog,
    parent: int | None,
) -> None:
    """Record in the store what this workspace references, so gc from another workspace
    sharing the store keeps it (a failure to record is a warning, not a failed build)."""
    refs = {
        i: {"key": str(o.key), "label": graph.actions[i].label}
        for i, o in outcomes.items()
        if o.ok and o.key is not None and i in graph.actions
    }
    try:
        store.gc_roots.register(ws.root, refs)
    except RsiError as exc:
        events.emit("warning", parent, message=f"workspace not registered as a gc root: {exc}")


def make_executor(name: str, ws: Workspace):
    if name == "remote":
        from rsi.remote import make_remote_executor  # type: ignore[import-not-found]

        return make_remote_executor(ws)
    return make_local_executor(name, ws)


class _Routed:
    """The build's executor, except for actions whose platform names another one (a binding's
    `executor = "slurm"`): those go to that executor, made when first needed."""

    def __init__(self, executor: Any, ws: Workspace) -> None:
        self._executor, self._ws = executor, ws
        self._others: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _for(self, action: Any) -> Any:
        name = dict(action.platform).get("executor")
        if not name or name == self._ws.executor:
            return self._executor
        with self._lock:
            other = self._others.get(name)
            if other is None:
                other = self._others[name] = make_executor(name, self._ws)
        return other

    def run(self, action: Any, *args: Any, **kwargs: Any) -> Any:
        return self._for(action).run(action, *args, **kwargs)

    def capabilities(self) -> dict:
        """What the build's executor provides, and a configured Slurm cluster's nodes (an
        action routed there asks them, not this host)."""
        own = executor_capabilities(self._executor)
        caps = {k: frozenset(v) for k, v in (own() if own else {}).items()}
        if self._ws.slurm and self._ws.executor != "slurm":
            from rsi.executors.slurm import SlurmExecutor

            for k, v in SlurmExecutor(dict(self._ws.slurm)).capabilities().items():
                caps[k] = caps.get(k, frozenset()) | v
        return caps

    def __getattr__(self, name: str) -> Any:
        return getattr(self._executor, name)


class _AfterWarmUp:
    """The executor, whose first action waits for the sandbox slot being started for it (then
    takes it) instead of starting a second one beside it."""

    def __init__(self, executor: Any, warming: threading.Thread) -> None:
        self._executor = executor
        self._warming: threading.Thread | None = warming

    def run(self, *args: Any, **kwargs: Any) -> Any:
        warming = self._warming
        if warming is not None:
            warming.join(timeout=60)  # NB: bounded: a slot that never starts is not waited on
            self._warming = None
        return self._executor.run(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._executor, name)


def _warm_sandbox(executor: Any) -> Any:
    """In the background: sweep what killed builds left of the sandboxes, then start one
    persistent sandbox slot of the local executor, where it uses them (bwrap, a root host),
    for the first action to take instead of starting its own (tens of ms). Where the
    executor uses none, only the sweep runs (here); on any error, nothing more. The slot is
    the one every action of the default platform runs in; an unused one is closed at exit."""
    if not _uses_slots(executor):
        _clean_stale_sandboxes()
        return executor
    warming = threading.Thread(
        target=_warm_slot, args=(executor,), name="rsi-warm-sandbox", daemon=True
    )
    warming.start()
    return _AfterWarmUp(executor, warming)


def _uses_slots(executor: Any) -> bool:
    return (
        getattr(executor, "name", "") == "local"
        and getattr(executor, "sandbox", "") == "bwrap"
        and bool(getattr(executor, "pool", False))
    )


def _warm_slot(executor: Any) -> None:
    try:
        from rsi.executors.local import _pool_shape
        from rsi.executors.pool import POOL, pool_supported

        if pool_supported():
            shape = _pool_shape(executor.limits.for_action({}).scratch_bytes)
            slot = POOL.acquire(shape)
            POOL.release(shape, slot, True)
    except Exception:  # noqa: BLE001 - NB: a speed-up only; the executor starts its own
        pass
    # NB: after the slot, which the first action waits for; the sweep never takes a slot of
    # a live rsi (this one's included)
    try:
        _clean_stale_sandboxes()
    except Exception:  # noqa: BLE001 - NB: best effort, as the build's own sweep is
        pass


def _warm_in_background(ws: Workspace) -> threading.Thread:
    """`_warm_sandbox`, the executor made on the background thread too: what the build does
    meanwhile (the state's checks, loading the graph) does not wait for its imports. The
    build makes its own executor later; the slot is the pool's, so it takes it all the same."""

    def work() -> None:
        try:
            executor = make_executor(ws.executor, ws)
        except Exception:  # noqa: BLE001 - NB: the build makes it again, and says what failed
            executor = None
        try:
            if executor is not None and _uses_slots(executor):
                _warm_slot(executor)
            else:
                try:
                    _clean_stale_sandboxes()
                except Exception:  # noqa: BLE001 - NB: the build's own sweep is gone
                    pass
        finally:
            sys.setswitchinterval(interval)

    # NB: the slot's start is mostly waiting (bwrap, its runner's interpreter), but each step
    # of it in Python waits for the interpreter lock, which the build's own thread (importing,
    # checking) gives up only every switch interval (5 ms): shorter while the slot starts
    interval = sys.getswitchinterval()
    sys.setswitchinterval(min(interval, WARM_SWITCH_INTERVAL_S))
    warming = threading.Thread(target=work, name="rsi-warm-sandbox", daemon=True)
    warming.start()
    return warming


WARM_SWITCH_INTERVAL_S = 0.0005


# NB: a build's event log stays for `rsi why` and for people; the newest are kept, bounded
KEEP_EVENT_LOGS = 200
KEEP_EVENT_BYTES = 256 << 20


def _prune_event_logs(store: LocalStore, current: str) -> None:
    from rsi.fsutil import prune

    prune(
        store.events_dir,
        keep=KEEP_EVENT_LOGS,
        keep_bytes=KEEP_EVENT_BYTES,
        match=lambda name: name.endswith(".jsonl"),
        spare=current,
    )


def _remote_cache(ws: Workspace):
    if not ws.remote:
        return None
    from rsi.remote import make_remote_cache  # type: ignore[import-not-found]

    return make_remote_cache(ws)


def make_loader(ws: Workspace) -> Loader:
    from rsi.loader import Loader
    from rsi.registry import load_rules

    return Loader(
        ws.root,
        load_rules(ws.rules),
        {"store": str(ws.store_dir.resolve()), "workspace": str(ws.root)},
    )


def load_graph(
    ws: Workspace, patterns: list[str], store: LocalStore, *, use_cache: bool = True
) -> tuple[list[Label], BuildGraph]:
    labels, graph, _ = _analyse(ws, patterns, store, _current_package(ws), use_cache=use_cache)
    return labels, graph


def analyse_request(
    ws: Workspace, patterns: list[str], store: LocalStore, current: str
) -> tuple[list[Label], BuildGraph, dict]:
    """(labels, graph, what the analysis depended on: its key, which covers the engine and
    rule code, and the tracker of its reads) for `patterns` from package `current`; the
    analysis cache serves it when nothing it read changed."""
    return _analyse(ws, patterns, store, current)


def _analyse(
    ws: Workspace, patterns: list[str], store: LocalStore, current: str, *, use_cache: bool = True
) -> tuple[list[Label], BuildGraph, dict]:
    """(labels, graph, what the incremental state keeps of the analysis: its key, the code it
    depended on and the tracker of its reads)."""
    from rsi import analysis_cache
    from rsi.analysis import analyze

    loader = make_loader(ws)
    rule_modules = {rule.impl.__module__ for rule in loader.rules.values()}
    roots = analysis_cache.code_roots(rule_modules)
    code = analysis_cache.code_digest(store.meta_memo, roots)
    key = analysis_cache.cache_key(
        store.meta_memo,
        {
            "patterns": patterns,
            "current": current,
            "root": str(ws.root),
            "salt": ws.salt,
            "rules": list(ws.rules),
            "store": str(store.root),
            "function": store.function,
        },
        code=code,
    )
    meta: dict = {
        "analysis_key": key,
        "code_roots": roots,
        "code_packages": analysis_cache.code_packages(rule_modules),
        "code": code,
    }
    if use_cache:
        cached = analysis_cache.load_checked(store, key, loader.packages_under)
        if cached is not None:
            meta["tracker"] = cached[2]
            return cached[0], cached[1], meta
    tracker = analysis_cache.Tracker(store.meta_memo)
    tracker.file(ws.root / "rsi.toml")
    loader.tracker = tracker
    loader.settings["track_file"] = tracker.file
    from rsi.incremental import quiet_gc

    with quiet_gc():
        labels = loader.expand(patterns, current)
        graph = analyze(
            loader,
            labels,
            store_put=store.put_bytes,
            settings={"salt": ws.salt, "store": str(store.root)},
            tracker=tracker,
            function=store.function,
        )
    analysis_cache.save(store, key, labels, graph, tracker)
    meta["tracker"] = tracker
    return labels, graph, meta


def _current_package(ws: Workspace) -> str:
    try:
        rel = Path.cwd().resolve().relative_to(ws.root)
    except ValueError:
        return ""
    return "" if str(rel) == "." else rel.as_posix()


def _named_labels(ws: Workspace, patterns: list[str]) -> set[Label]:
    """The targets named one by one (not through `...` or `:all`): a target a pattern only
    matched is skipped when the executor cannot run it; a named one fails."""
    current = _current_package(ws)
    named: set[Label] = set()
    for text in patterns:
        pattern = Pattern.parse(text, current)
        if pattern.name is not None:
            named.add(Label(pattern.package, pattern.name))
    return named


def _clean_stale_scratch(store: LocalStore) -> None:
    """Remove scratch folders left by a killed build: those whose pid (in the name) is gone.

    A live pid's folder is never touched, however old: a long action may still be using it.
    Folders without a pid in the name are removed once older than a day. (What killed builds
    left of the sandboxes, `_clean_stale_sandboxes`, waits for a build that runs something.)
    """
    now = time.time()
    for entry in store.tmp.iterdir() if store.tmp.exists() else ():
        try:
            pid = int(entry.name.split("-")[1])
        except (IndexError, ValueError):
            pid = None
        if pid is not None:
            if pid_alive(pid):
                continue
        else:
            try:
                if now - entry.stat().st_mtime < 86400:
                    continue
            except OSError:
                continue
        if entry.is_dir():
            # NB: imported only when there is something to remove: a no-op build never needs
            # the executors
            from rsi.fsutil import remove_tree

            remove_tree(entry)
        else:
            entry.unlink(missing_ok=True)


def _clean_stale_sandboxes() -> None:
    """The memory cgroups and slot folders of killed builds: only a build that may run an
    action pays for importing the sandbox pool to look."""
    from rsi.executors.pool import remove_stale_slots

    remove_stale_slots()


@contextmanager
def _unfrozen_after() -> Iterator[None]:
    """What the build's loads froze (`quiet_gc`: the state, the graph) goes back to the
    collector when the build ends (a build server runs many)."""
    try:
        yield
    finally:
        gc.unfreeze()


def build(
    ws: Workspace,
    patterns: list[str],
    *,
    events_to: IO[str] | None = None,
    progress: bool | None = None,
    materialise: bool = True,
    lock_timeout: float | None = None,
    list_hits: bool | None = None,
) -> BuildReport:
    """Build `patterns`. `lock_timeout` bounds each wait for the host lock (seconds; None
    waits as long as it takes, saying who holds it). `list_hits`: an `action_finished` line
    per cache hit as well as their summary (None: as `RSI_EVENTS_HITS` says)."""
    t0 = time.perf_counter()
    if lock_timeout is not None and not (math.isfinite(lock_timeout) and lock_timeout >= 0):
        raise UsageError(f"--lock-timeout must be a number of seconds >= 0, not {lock_timeout}")
    if ws.remote and not ws.digest_function_explicit:
        # NB: keys must use the remote's digest function; ask it rather than fail on mismatch
        from rsi.remote import negotiate_digest_function  # type: ignore[import-not-found]

        ws = ws.with_overrides(digest_function=negotiate_digest_function(ws.remote))
    # NB: every build (the CLI, the server, a job, a campaign round) refuses a store or out/ it
    # cannot write before writing anything, not halfway with a PermissionError
    ws.check_writable()
    store = open_store(ws)
    build_id = time.strftime("%Y%m%dT%H%M%S") + "-" + os.urandom(4).hex()
    events_path = store.events_dir / f"{build_id}.jsonl"
    events = EventLog(events_path, also=events_to, progress=progress, list_hits=list_hits)
    _prune_event_logs(store, events_path.name)
    with interruptible(), store.lock(exclusive=False), _unfrozen_after():
        _clean_stale_scratch(store)
        root_event = events.emit(
            "build_started",
            build_id=build_id,
            patterns=patterns,
            workspace=str(ws.root),
            store=str(store.root),
            salt_set=bool(ws.salt),
            jobs=ws.jobs,
            executor=ws.executor,
            remote=ws.remote or None,
            pid=os.getpid(),
        )
        try:
            attempt = 1
            while True:
                try:
                    report = _build(
                        ws,
                        patterns,
                        store,
                        events,
                        root_event,
                        build_id,
                        materialise,
                        lock_timeout,
                        t0,
                        attempt,
                    )
                    break
                except SourcesMoved as moved:
                    # NB: what it built is cached under its keys; the next attempt keys the
                    # sources as they are now and serves whatever did not change
                    events.summarise_hits(root_event)
                    events.emit(
                        "sources_changed",
                        root_event,
                        paths=moved.paths[:20],
                        count=len(moved.paths),
                        attempt=attempt,
                        again=True,
                    )
                    events.notice(f"{moved.what}: building again", new=True)
                    for name in events.counts:
                        events.counts[name] = 0
                    attempt += 1
        except BaseException as exc:
            # NB: every build's log ends with build_finished, saying why it ended early
            ended: dict[str, Any] = {"ok": False}
            if isinstance(exc, KeyboardInterrupt):
                c = events.counts
                ended.update(reason="interrupted", signal=getattr(exc, "signal", "SIGINT"))
                ended["counts"] = {
                    "actions": c["total"],
                    "cached": c["hit"],
                    "executed": c["executed"],
                    "failed": c["failed"],
                }
            elif isinstance(exc, RsiError):
                ended.update(reason="error", error=str(exc))
            else:
                ended.update(reason="crashed", error=f"{type(exc).__name__}: {exc}")
            ended["wall_s"] = round(time.perf_counter() - t0, 4)
            events.summarise_hits(root_event)
            events.emit("build_finished", root_event, **ended)
            events.close()
            raise
        events.summarise_hits(root_event)  # NB: the hits of this attempt, one event
        events.emit(
            "build_finished",
            root_event,
            ok=report.ok,
            counts=report.counts,
            wall_s=round(report.wall_s, 4),
        )
        events.close()
    return report


def _build(
    ws: Workspace,
    patterns: list[str],
    store: LocalStore,
    events: EventLog,
    root_event: int,
    build_id: str,
    materialise: bool,
    lock_timeout: float | None,
    t0: float,
    attempt: int = 1,
) -> BuildReport:
    from rsi import analysis_cache, incremental

    current = _current_package(ws)
    request = incremental.request_key(ws, patterns, current, store)
    warmed: list[threading.Thread] = []

    def on_edit() -> None:
        # NB: a source changed, so something will likely run: the executor's sandbox starts
        # (after the sweep of killed builds' sandboxes) while the plan, the graph and the
        # scheduler get to it
        warmed.append(_warm_in_background(ws))

    # NB: a no-op build holds the workspace's outputs from its check to its export, so no
    # other build's export comes between; one that runs something lets go meanwhile
    with _outputs_held(ws, store, events, root_event, patterns, lock_timeout, materialise):
        plan = incremental.plan(ws, store, patterns, current, on_edit) if request else None
        if plan is not None and not plan.dirty:
            return _build_unchanged(
                ws, patterns, store, events, root_event, build_id, materialise, t0, plan
            )
    found = None
    if not warmed:
        _clean_stale_sandboxes()
    if plan is not None:
        # NB: the state checked this analysis' reads already; only the graph is needed
        found = analysis_cache.load_unchecked(store, plan.state["analysis_key"])
    if found is not None:
        labels, graph = found[0], found[1]
        analysis = {k: plan.state[k] for k in incremental.ANALYSIS_FIELDS}
    else:
        plan = None
        labels, graph, analysis = _analyse(ws, patterns, store, current)
    # NB: the state's actions are those this analysis' labels need (it recorded them from the
    # same analysis): no walk of the whole graph
    wanted = set(plan.state["order"]) if plan is not None else graph.actions_for(labels)
    todo, clean, known = wanted, [], None
    if plan is not None and len(plan.actions) == len(wanted):
        todo = set()
        for action_id in plan.dirty:
            if action_id not in todo:
                todo.add(action_id)
                todo |= graph.descendants(action_id, wanted)
        clean = [i for i in plan.state["order"] if i not in todo]
        known = incremental.StateOutcomes(plan, clean)
    else:
        plan = None
    named = _named_labels(ws, patterns)
    required = (
        wanted
        if plan is not None and all(lb in named for lb in labels)
        else graph.actions_for([lb for lb in labels if lb in named])
    )
    if plan is not None:
        # NB: as the state recorded them: a target's rule is not looked at (nor imported)
        for t in plan.state["targets"]:
            events.emit(
                "target_started",
                root_event,
                label=t["label"],
                rule=t["rule"],
                actions=t["declared"],
            )
    else:
        for label in labels:
            events.emit(
                "target_started",
                root_event,
                label=str(label),
                rule=graph.targets[label].rule.name,
                actions=len(graph.target_actions.get(label, [])),
            )
    from rsi.host import HostLock
    from rsi.scheduler import Scheduler

    executor = make_executor(ws.executor, ws)
    if warmed:
        executor = _AfterWarmUp(executor, warmed[0])
    if ws.executor != "remote":  # NB: a remote engine's workers are chosen by their properties
        executor = _Routed(executor, ws)
    remote_cache = _remote_cache(ws)
    if remote_cache is not None or ws.executor == "remote":
        from rsi.remote import bind_events  # type: ignore[import-not-found]

        for adapter in (remote_cache, executor if ws.executor == "remote" else None):
            if adapter is not None:
                bind_events(adapter, events, root_event)
    scheduler = Scheduler(
        store,
        executor,
        events,
        jobs=ws.jobs,
        keep_going=ws.keep_going,
        salt=ws.salt,
        remote=remote_cache,
        remote_fallback=ws.remote_fallback,
        host_lock=HostLock(timeout_s=lock_timeout, owner=" ".join(patterns)),
        capabilities=executor_capabilities(executor),
        required=required,
    )
    if plan is not None and clean:
        # NB: the actions the state vouches for are hits, reported without being looked at
        events.emit_hits(root_event, plan.hit_rows(clean), summary=plan.hit_summary(todo))
        events.counts["hit"] += len(clean)
        events.counts["done"] += len(clean)
    if plan is not None:
        # NB: the sources the state's check hashed or vouched for are keyed from it: no second
        # hash, and no load of the memo of every file ever read (100,000 entries: ~130 ms)
        store.file_memo.known = plan.known_source
    ran = scheduler.run(graph, todo, root_event, known=known)
    outcomes: Mapping[str, Outcome] = ran
    if plan is not None:
        outcomes = incremental.Overlay(ran, known or {})
        # NB: `ran` also holds the state's outcomes the run looked at (a consumer's inputs):
        # those are registered already, and reading their specs would unpickle each
        recorded = plan.actions
        changed = {
            i: {"key": str(o.key), "label": graph.actions[i].label}
            for i, o in ran.items()
            if o.ok
            and o.key is not None
            and (i not in recorded or plan.key_of(i) != str(o.key))
            and i in graph.actions
        }
        if store.gc_roots.signature(ws.root) == plan.state.get("roots_sig"):
            # NB: the registration holds what the state recorded: only the new keys go in
            try:
                store.gc_roots.update(ws.root, changed)
            except RsiError as exc:
                message = f"workspace not registered as a gc root: {exc}"
                events.emit("warning", root_event, message=message)
        else:
            refs = plan.refs(clean)
            refs.update(
                (i, {"key": str(o.key), "label": graph.actions[i].label})
                for i, o in ran.items()
                if i not in refs and o.ok and o.key is not None and i in graph.actions
            )
            _register_refs(ws, store, refs, events, root_event)
    else:
        _register_roots(ws, store, graph, ran, events, root_event)
    # NB: an action a pattern only matched may be incompatible; one a named target needs may
    # not (the ones the state vouched for are hits)
    built = all(o.ok or (o.needs is not None and o.id not in required) for o in ran.values())
    moved: list[str] = []
    with _outputs_held(ws, store, events, root_event, patterns, lock_timeout, materialise):
        if built:
            # NB: under the lock: what this build read is what the workspace holds now, or it
            # builds again (a build exporting meanwhile saw newer sources); past the last
            # attempt it says so and leaves out/ to a build that saw them
            moved = _moved(scheduler.sources_seen, plan, analysis, store)
            if moved and attempt < MAX_BUILD_ATTEMPTS:
                raise SourcesMoved(moved)
        report = BuildReport(
            build_id,
            ok=built and not moved,
            events_path=str(events.path),
            outcomes=outcomes,
            graph_source=graph,
        )
        failed_moved = (
            [{"action": None, "status": "sources_changed", "message": str(SourcesMoved(moved))}]
            if moved
            else []
        )
        settled = _settled_hit()
        state_targets = {t["label"]: t for t in plan.state["targets"]} if plan is not None else None
        for label in labels:
            if len(labels) == 1 and known is not None:
                # NB: the one target needs every wanted action: those the run saw, and the ones
                # the state vouched for (hits, all alike), without walking the graph for them
                mine = [ran[i] for i in sorted(ran) if i in wanted]
                if len(mine) < len(wanted):
                    mine.append(settled)
            else:
                ids = sorted(graph.actions_for([label]))
                mine = [ran.get(i) or settled for i in ids if i in outcomes]
            ok = all(o.ok for o in mine)
            needs = sorted({o.needs for o in mine if o.needs})
            broken = any(o.status in ("failed", "error") for o in mine)
            skipped = None
            if not ok and needs and not broken and label not in named:
                skipped = "needs " + ", ".join(needs)
            outputs: list[str] = []
            # NB: served by the state, a target's files and "show" are as the state recorded them
            # from this very analysis: the graph's providers (all of them, at first use) stay unread
            recorded = state_targets.get(str(label)) if state_targets is not None else None
            unexported: list[dict] = []
            if ok and moved:
                ok, unexported = False, failed_moved
            if ok and materialise:
                if recorded is not None:
                    outputs = _export_files(ws, store, recorded["files"], outcomes)
                else:
                    outputs = _materialise(ws, store, graph, label, outcomes)
            cache = "hit" if all(o.status in ("hit", "remote_hit") for o in mine) else "miss"
            failed = [
                {"action": o.id, "status": o.status, "message": o.message}
                for o in mine
                if not o.ok and skipped is None
            ] or unexported
            if recorded is not None:
                show = recorded["show"]
            else:
                show = graph.providers[label].info.get("show")
            shown = next((o for o in outputs if show and o.endswith("/" + show)), None)
            report.targets[str(label)] = {
                "ok": ok,
                "cache": cache,
                "outputs": outputs,
                "failed": failed,
                "show": shown,
                "skipped": skipped,
            }
            extra = {"skipped": skipped} if skipped else {}
            events.emit(
                "target_finished",
                root_event,
                label=str(label),
                ok=ok,
                cache=cache,
                outputs=outputs,
                failed=failed,
                **extra,
            )
    store.save_memos()
    uncached = any(o.result is not None and not o.result.cacheable for o in ran.values())
    if request is not None and uncached:
        # NB: an action's result must not be served again (its action said so), and the state
        # would vouch for it: the next build goes the whole way (its entry is not cached)
        incremental.forget(store, request)
    elif request is not None and all(o.status in ("hit", "executed") for o in ran.values()):
        with incremental.quiet_gc():
            incremental.record(
                store,
                request,
                analysis=analysis,
                labels=labels,
                graph=graph,
                outcomes=outcomes,
                observed=scheduler.sources_seen,
                previous=plan,
                rerun=todo,
                roots_sig=store.gc_roots.signature(ws.root),
            )
    c = events.counts
    not_built = ("skipped", "not_started", "incompatible")
    report.counts = {
        "actions": len(wanted),
        "cached": c["hit"],
        "executed": c["executed"],
        "failed": c["failed"],
        # NB: only the run's: the actions the state vouched for are hits
        "skipped": sum(1 for o in ran.values() if o.status in not_built),
        "incompatible": sum(1 for o in ran.values() if o.needs is not None),
    }
    report.wall_s = time.perf_counter() - t0
    return report


def _build_unchanged(
    ws: Workspace,
    patterns: list[str],
    store: LocalStore,
    events: EventLog,
    root_event: int,
    build_id: str,
    materialise: bool,
    t0: float,
    plan: Any,
) -> BuildReport:
    """Nothing the last successful build of this request depended on changed (the incremental
    state vouches for every action): report its hits without analysing or keying anything."""
    from rsi import incremental

    state = plan.state
    order = state["order"]
    for t in state["targets"]:
        events.emit(
            "target_started", root_event, label=t["label"], rule=t["rule"], actions=t["declared"]
        )
    events.emit_hits(
        root_event, plan.hit_rows(order), template=plan.hit_template(), summary=plan.hit_summary()
    )
    c = events.counts
    c["total"] = c["done"] = c["hit"] = len(order)

    def graph() -> BuildGraph:
        found = analysis_cache_graph(store, state["analysis_key"])
        return found if found is not None else load_graph(ws, patterns, store)[1]

    report = BuildReport(
        build_id,
        ok=True,
        events_path=str(events.path),
        outcomes=incremental.StateOutcomes(plan),
        graph_source=graph,
    )
    for t in state["targets"]:
        outputs: list[str] = []
        if materialise:
            for path, producer in t["files"]:
                out = plan.output(producer, path)
                if out is not None:
                    outputs.append(_export(ws, store, path, out[0], out[1]))
        show = t["show"]
        shown = next((o for o in outputs if show and o.endswith("/" + show)), None)
        report.targets[t["label"]] = {
            "ok": True,
            "cache": "hit",
            "outputs": outputs,
            "failed": [],
            "show": shown,
            "skipped": None,
        }
        events.emit(
            "target_finished",
            root_event,
            label=t["label"],
            ok=True,
            cache="hit",
            outputs=outputs,
            failed=[],
        )
    sig = store.gc_roots.signature(ws.root)
    if sig is None or sig != state["roots_sig"]:
        refs = {
            i: {"key": f"{a[incremental.KEY_HASH]}/{a[incremental.KEY_SIZE]}", "label": a[0]}
            for i, a in plan.actions.items()
        }
        try:
            store.gc_roots.register(ws.root, refs)
            state["roots_sig"] = store.gc_roots.signature(ws.root)
            plan.changed = True
        except RsiError as exc:
            message = f"workspace not registered as a gc root: {exc}"
            events.emit("warning", root_event, message=message)
    store.save_memos()
    if plan.worth_saving:
        incremental.save_changes(store, plan)
    else:
        incremental.keep(store, plan)  # NB: as loaded (and touched): for a long-lived rsi
    report.counts = {
        "actions": len(order),
        "cached": len(order),
        "executed": 0,
        "failed": 0,
        "skipped": 0,
        "incompatible": 0,
    }
    report.wall_s = time.perf_counter() - t0
    return report


def analysis_cache_graph(store: LocalStore, key: str) -> BuildGraph | None:
    from rsi import analysis_cache

    found = analysis_cache.load_unchecked(store, key)
    return None if found is None else found[1]


def _export(ws: Workspace, store: LocalStore, path: str, digest: Any, executable: bool) -> str:
    """Copy one output under `out/` for people; skipped when already identical."""
    dest = ws.out_dir / path
    try:
        if dest.is_file() and store.meta_memo.digest(dest) == digest:
            return str(dest)
    except OSError:
        pass
    store.export_file(digest, dest, executable, atomic=True)
    return str(dest)


def _materialise(
    ws: Workspace,
    store: LocalStore,
    graph: BuildGraph,
    label: Label,
    outcomes: Mapping[str, Outcome],
) -> list[str]:
    """Copy a target's files under `out/` for people; skipped when already identical."""
    files = [
        (art.path, graph.producer(art.producer))
        for art in graph.providers[label].files
        if art.producer is not None
    ]
    return _export_files(ws, store, files, outcomes)


def _export_files(
    ws: Workspace, store: LocalStore, files: list, outcomes: Mapping[str, Outcome]
) -> list[str]:
    """Copy (path, the action producing it) files under `out/` from this build's outcomes (a
    target's files from its provider, or as the build state recorded them)."""
    written: list[str] = []
    for path, producer in files:
        result = outcomes[producer].result
        out = result.output_map.get(path) if result else None
        if out is not None:
            written.append(_export(ws, store, path, out.digest, out.executable))
    return written


def remove_out(ws: Workspace) -> None:
    shutil.rmtree(ws.out_dir, ignore_errors=True)
