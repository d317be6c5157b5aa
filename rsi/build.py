"""One build, end to end: load, analyse, schedule, materialise outputs, report. It must never export
an output older than the sources it read.

This is the engine's entry point for the CLI and for tests; it holds the store lock for the
whole build and writes one event log per build under `<store>/events/`, which always ends with
`build_finished`, even when SIGINT or SIGTERM stops the build. Its parts: `build_analysis.py`
(the loader and the request's graph), `build_executor.py` (the executor, routed and warmed),
`build_output.py` (copies under `out/`), `build_housekeeping.py` (event logs, stale scratch),
`interrupt.py` (signals during a build).
"""

from __future__ import annotations

import gc
import math
import os
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any

from rsi import recheck, wslock
from rsi.errors import RsiError, StoreError, UsageError
from rsi.sections import CacheDamaged
from rsi.events import EventLog
from rsi.record import Value
from rsi.build_analysis import (
    analyse,
    analysis_cache_graph,
    current_package,
    load_graph,
    named_labels,
)
from rsi.build_executor import (
    AfterWarmUp,
    Routed,
    clean_stale_sandboxes,
    executor_capabilities,
    make_executor,
    remote_cache,
    warm_in_background,
)
from rsi.build_housekeeping import clean_stale_scratch, prune_event_logs
from rsi.build_output import export_files, export_output, materialise_target
from rsi.interrupt import interruptible
from rsi.runtime import open_store
from rsi.store import LocalStore
from rsi.workspace import Workspace

if TYPE_CHECKING:
    # NB: imported where used: a build the incremental state serves never loads the
    # analysis, the scheduler, the executors or networkx
    from rsi.analysis import BuildGraph
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
    from rsi.incremental import _fold_fits, swept_since_check, unchanged_since_check

    # NB: files under the store (a built toolchain's tree and info.json) are written by this
    # very build; they are outputs it made, never sources another writer moved
    # (a prefix test on the path as read: no realpath per source on the one-change path)
    inside = os.path.join(str(store.root), "")
    swept = swept_since_check(plan, seen, inside) if plan is not None else None
    lstats: dict = {}
    if swept is not None:
        # NB: one sweep as the state's check makes, no more per source than a no-op pays;
        # what it cannot vouch for is checked as below
        moved, slow, looked_at = swept
        moved += recheck.moved_sources(slow, store.function, frozenset(), lstats)
        tracker = analysis.get("tracker")
        if tracker is not None:
            sources = plan.state["sources"]
            # NB: the fold lists every read that is not a source's (and more): no walk of all
            fold = plan.state.get("fold")
            others = fold["rest"] if _fold_fits(fold, tracker, sources) else None
            moved += tracker.moved_reads_since(sources, looked_at, plan.dirs, lstats, others)
        return sorted(p for p in moved if not p.startswith(inside))
    # NB: with a watcher (the build server), what no event named since the check is as read
    unchanged = unchanged_since_check(plan)
    only = getattr(unchanged, "noisy", None)  # NB: a watcher's: the sources not vouched for
    expected = recheck.expected_sources(seen, plan, only)
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
    _register_refs(ws, store, refs, events, parent)


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
    prune_event_logs(store, events_path.name)
    with interruptible(), store.lock(exclusive=False), _unfrozen_after():
        clean_stale_scratch(store)
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
            damages = 0
            while True:
                plans: list[Any] = []
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
                        plans,
                    )
                    break
                except CacheDamaged as damaged:
                    # NB: a section of a cache file read only now (rsi.sections) failed its
                    # digest: the file is forgotten, and the build goes again without it, as
                    # it would had the file been missing (what ran is cached under its key)
                    damages += 1
                    if damages > MAX_BUILD_ATTEMPTS:
                        raise StoreError(
                            f"{damaged}, {damages} times",
                            hint="check the disk under the store; `rsi cache gc` drops it",
                        ) from damaged
                    from rsi.incremental import forget_file

                    forget_file(damaged.path)
                    events.summarise_hits(root_event)
                    events.emit(
                        "warning",
                        root_event,
                        message=f"{damaged}: forgotten, building again",
                    )
                    events.notice(f"{damaged}: forgotten, building again", new=True)
                    for name in events.counts:
                        events.counts[name] = 0
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
                finally:
                    # NB: however the attempt ended (a failure, Ctrl-C, a plan given up for a
                    # new analysis), its plan's watch is closed and its sweep's child reaped
                    for p in plans:
                        p.end_watch()
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
    attempt: int,
    plans: list[Any],
) -> BuildReport:
    """One attempt; the plan it makes goes into `plans` (the caller ends its watch and its
    sweep's child however the attempt ends)."""
    from rsi import analysis_cache, incremental

    current = current_package(ws)
    request = incremental.request_key(ws, patterns, current, store)
    warmed: list[threading.Thread] = []

    def on_edit() -> None:
        # NB: a source changed, so something will likely run: the executor's sandbox starts
        # (after the sweep of killed builds' sandboxes) while the plan, the graph and the
        # scheduler get to it
        warmed.append(warm_in_background(ws))

    # NB: a no-op build holds the workspace's outputs from its check to its export, so no
    # other build's export comes between; one that runs something lets go meanwhile
    with _outputs_held(ws, store, events, root_event, patterns, lock_timeout, materialise):
        plan = incremental.plan(ws, store, patterns, current, on_edit) if request else None
        if plan is not None:
            plans.append(plan)
        if plan is not None and not plan.dirty:
            plan.end_watch()  # NB: nothing runs, so no re-check before export
            return _build_unchanged(
                ws, patterns, store, events, root_event, build_id, materialise, t0, plan
            )
    found = None
    if not warmed:
        clean_stale_sandboxes()
    if plan is not None:
        # NB: the state checked this analysis' reads already; only the graph is needed
        found = analysis_cache.load_unchecked(store, plan.state["analysis_key"])
    if found is not None:
        labels, graph = found[0], found[1]
        analysis = {k: plan.state[k] for k in incremental.ANALYSIS_FIELDS}
    else:
        plan = None
        labels, graph, analysis = analyse(ws, patterns, store, current)
    # NB: the state's actions are those this analysis' labels need (it recorded them from the
    # same analysis): no walk of the whole graph
    # (as a set of the state's order made only on demand: 110,000 ids hashed take ~20 ms)
    wanted: Any = incremental.Wanted(plan) if plan is not None else graph.actions_for(labels)
    todo, clean, known = wanted, [], None
    if plan is not None and len(plan.actions) == len(wanted):
        todo = set()
        for action_id in plan.dirty:
            if action_id not in todo:
                todo.add(action_id)
                todo |= graph.descendants(action_id, wanted)
        # NB: every other action of the state, in its order, none listed (nor hashed) here
        clean = incremental.Except(plan.state["order"], todo)
        known = incremental.StateOutcomes(store, plan, skip=todo)
    else:
        if plan is not None:
            wanted = todo = set(plan.state["order"])
        plan = None
    named = named_labels(ws, patterns)
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
        executor = AfterWarmUp(executor, warmed[0])
    if ws.executor != "remote":  # NB: a remote engine's workers are chosen by their properties
        executor = Routed(executor, ws)
    remote = remote_cache(ws)
    if remote is not None or ws.executor == "remote":
        from rsi.remote import bind_events  # type: ignore[import-not-found]

        for adapter in (remote, executor if ws.executor == "remote" else None):
            if adapter is not None:
                bind_events(adapter, events, root_event)
    scheduler = Scheduler(
        store,
        executor,
        events,
        jobs=ws.jobs,
        keep_going=ws.keep_going,
        salt=ws.salt,
        remote=remote,
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
        if plan is not None:
            plan.end_watch()
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
                    outputs = export_files(ws, store, recorded["files"], outcomes)
                else:
                    outputs = materialise_target(ws, store, graph, label, outcomes)
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
    elif (
        request is not None
        and not moved
        and all(o.status in ("hit", "executed") for o in ran.values())
    ):
        # NB: never after the last attempt saw sources move: the state would vouch for what
        # this build read, which the workspace no longer holds
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
                wide=scheduler.wide_inputs,
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
        outcomes=incremental.StateOutcomes(store, plan),
        graph_source=graph,
    )
    for t in state["targets"]:
        outputs: list[str] = []
        if materialise:
            for path, producer in t["files"]:
                out = plan.output(store, producer, path)
                if out is not None:
                    outputs.append(export_output(ws, store, path, out[0], out[1]))
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
