"""One build, end to end: load, analyse, schedule, materialise outputs, report.

This is the engine's entry point for the CLI and for tests; it holds the store lock for the
whole build and writes one event log per build under `<store>/events/`, which always ends with
`build_finished`, even when SIGINT or SIGTERM stops the build.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from rsi.fsutil import pid_alive
from rsi.analysis import BuildGraph, analyze
from rsi.errors import RsiError, UsageError
from rsi.events import EventLog
from rsi.host import Capabilities, HostLock, host_capabilities
from rsi.label import Label, Pattern
from rsi.loader import Loader
from rsi.registry import load_rules
from rsi.scheduler import Outcome, Scheduler
from rsi.store import LocalStore
from rsi.workspace import Workspace


@dataclass
class BuildReport:
    build_id: str
    ok: bool
    targets: dict[str, dict[str, Any]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    events_path: str | None = None
    wall_s: float = 0.0
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    graph: BuildGraph | None = None

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


def executor_capabilities(executor: Any) -> Callable[[], Capabilities] | None:
    """What the executor can provide: its own `capabilities` when it declares them; none to
    check for a remote engine (its workers may have what this host lacks); otherwise what
    this host has, since a local executor runs actions here."""
    declared = getattr(executor, "capabilities", None)
    if declared is not None:
        return declared if callable(declared) else (lambda: declared)
    if getattr(executor, "name", "") == "remote":
        return None
    return host_capabilities


def open_store(ws: Workspace) -> LocalStore:
    ws.check_store()
    return LocalStore(ws.store_dir, ws.digest_function)


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
        store.register_workspace(ws.root, refs)
    except RsiError as exc:
        events.emit("warning", parent, message=f"workspace not registered as a gc root: {exc}")


def make_executor(name: str, ws: Workspace):
    from rsi.limits import Limits

    limits = Limits.from_workspace(ws)
    if name == "local":
        from rsi.executors.local import LocalExecutor

        return LocalExecutor(limits=limits)
    if name == "bwrap":
        from rsi.executors.bwrap import BwrapExecutor  # type: ignore[import-not-found]

        return BwrapExecutor(limits=limits)
    if name == "docker":
        from rsi.executors.docker import DockerExecutor  # type: ignore[import-not-found]

        return DockerExecutor(limits=limits)
    if name == "remote":
        from rsi.remote import make_remote_executor  # type: ignore[import-not-found]

        return make_remote_executor(ws)
    raise RsiError(f"unknown executor {name!r}", hint="use local, bwrap, docker or remote")


def _remote_cache(ws: Workspace):
    if not ws.remote:
        return None
    from rsi.remote import make_remote_cache  # type: ignore[import-not-found]

    return make_remote_cache(ws)


def make_loader(ws: Workspace) -> Loader:
    return Loader(
        ws.root,
        load_rules(ws.rules),
        {"store": str(ws.store_dir.resolve()), "workspace": str(ws.root)},
    )


def load_graph(
    ws: Workspace, patterns: list[str], store: LocalStore, *, use_cache: bool = True
) -> tuple[list[Label], BuildGraph]:
    from rsi import analysis_cache

    current = _current_package(ws)
    loader = make_loader(ws)
    key = analysis_cache.cache_key(
        store.file_memo,
        {
            "patterns": patterns,
            "current": current,
            "root": str(ws.root),
            "salt": ws.salt,
            "rules": list(ws.rules),
            "store": str(store.root),
            "function": store.function,
        },
        rule_modules={rule.impl.__module__ for rule in loader.rules.values()},
    )
    if use_cache:
        cached = analysis_cache.load(store, key, loader.packages_under)
        if cached is not None:
            return cached
    tracker = analysis_cache.Tracker(store.file_memo)
    tracker.file(ws.root / "rsi.toml")
    loader.tracker = tracker
    loader.settings["track_file"] = tracker.file
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
    return labels, graph


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
    Folders without a pid in the name are removed once older than a day.
    """
    from rsi.executors.base import remove_tree
    from rsi.executors.pool import remove_stale_slots

    remove_stale_slots()
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
        remove_tree(entry) if entry.is_dir() else entry.unlink(missing_ok=True)


def build(
    ws: Workspace,
    patterns: list[str],
    *,
    events_to: IO[str] | None = None,
    progress: bool | None = None,
    materialise: bool = True,
    lock_timeout: float | None = None,
) -> BuildReport:
    """Build `patterns`. `lock_timeout` bounds each wait for the host lock (seconds; None
    waits as long as it takes, saying who holds it)."""
    t0 = time.perf_counter()
    if lock_timeout is not None and not (math.isfinite(lock_timeout) and lock_timeout >= 0):
        raise UsageError(f"--lock-timeout must be a number of seconds >= 0, not {lock_timeout}")
    if ws.remote and not ws.digest_function_explicit:
        # NB: keys must use the remote's digest function; ask it rather than fail on mismatch
        from rsi.remote import negotiate_digest_function  # type: ignore[import-not-found]

        ws = ws.with_overrides(digest_function=negotiate_digest_function(ws.remote))
    store = open_store(ws)
    build_id = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]
    events_path = store.events_dir / f"{build_id}.jsonl"
    events = EventLog(events_path, also=events_to, progress=progress)
    with interruptible(), store.lock(exclusive=False):
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
            report = _build(
                ws, patterns, store, events, root_event, build_id, materialise, lock_timeout, t0
            )
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
            events.emit("build_finished", root_event, **ended)
            events.close()
            raise
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
) -> BuildReport:
    labels, graph = load_graph(ws, patterns, store)
    wanted = graph.actions_for(labels)
    named = _named_labels(ws, patterns)
    required = graph.actions_for([lb for lb in labels if lb in named])
    for label in labels:
        events.emit(
            "target_started",
            root_event,
            label=str(label),
            rule=graph.targets[label].rule.name,
            actions=len(graph.target_actions.get(label, [])),
        )
    executor = make_executor(ws.executor, ws)
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
    outcomes = scheduler.run(graph, wanted, root_event)
    _register_roots(ws, store, graph, outcomes, events, root_event)
    report = BuildReport(
        build_id,
        # NB: an action a pattern only matched may be incompatible; one a named target
        # needs may not
        ok=all(o.ok or (o.needs is not None and o.id not in required) for o in outcomes.values()),
        events_path=str(events.path),
        outcomes=outcomes,
        graph=graph,
    )
    for label in labels:
        ids = sorted(graph.actions_for([label]))
        mine = [outcomes[i] for i in ids if i in outcomes]
        ok = all(o.ok for o in mine)
        needs = sorted({o.needs for o in mine if o.needs})
        broken = any(o.status in ("failed", "error") for o in mine)
        skipped = None
        if not ok and needs and not broken and label not in named:
            skipped = "needs " + ", ".join(needs)
        outputs: list[str] = []
        if ok and materialise:
            outputs = _materialise(ws, store, graph, label, outcomes)
        cache = "hit" if all(o.status in ("hit", "remote_hit") for o in mine) else "miss"
        failed = [
            {"action": o.id, "status": o.status, "message": o.message}
            for o in mine
            if not o.ok and skipped is None
        ]
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
    c = events.counts
    not_built = ("skipped", "not_started", "incompatible")
    report.counts = {
        "actions": len(wanted),
        "cached": c["hit"],
        "executed": c["executed"],
        "failed": c["failed"],
        "skipped": sum(1 for o in outcomes.values() if o.status in not_built),
        "incompatible": sum(1 for o in outcomes.values() if o.needs is not None),
    }
    report.wall_s = time.perf_counter() - t0
    return report


def _materialise(
    ws: Workspace, store: LocalStore, graph: BuildGraph, label: Label, outcomes: dict[str, Outcome]
) -> list[str]:
    """Copy a target's files under `out/` for people; skipped when already identical."""
    written: list[str] = []
    for art in graph.providers[label].files:
        if art.producer is None:
            continue
        result = outcomes[graph.producer(art.producer)].result
        out = result.output_map.get(art.path) if result else None
        if out is None:
            continue
        dest = ws.out_dir / art.path
        try:
            if dest.is_file() and store.file_memo.digest(dest) == out.digest:
                written.append(str(dest))
                continue
        except OSError:
            pass
        store.export_file(out.digest, dest, out.executable, atomic=True)
        written.append(str(dest))
    return written


def remove_out(ws: Workspace) -> None:
    shutil.rmtree(ws.out_dir, ignore_errors=True)
