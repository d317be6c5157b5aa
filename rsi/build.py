"""One build, end to end: load, analyse, schedule, materialise outputs, report.

This is the engine's entry point for the CLI and for tests; it holds the store lock for the
whole build and writes one event log per build under `<store>/events/`.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from rsi.analysis import BuildGraph, analyze
from rsi.errors import RsiError
from rsi.events import EventLog
from rsi.label import Label
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


def open_store(ws: Workspace) -> LocalStore:
    return LocalStore(ws.store_dir, ws.digest_function)


def make_executor(name: str, ws: Workspace):
    if name == "local":
        from rsi.executors.local import LocalExecutor

        return LocalExecutor()
    if name == "bwrap":
        from rsi.executors.bwrap import BwrapExecutor  # type: ignore[import-not-found]

        return BwrapExecutor()
    if name == "docker":
        from rsi.executors.docker import DockerExecutor  # type: ignore[import-not-found]

        return DockerExecutor()
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

    cwd = Path.cwd().resolve()
    try:
        rel = cwd.relative_to(ws.root)
        current = "" if str(rel) == "." else rel.as_posix()
    except ValueError:
        current = ""
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
            if _pid_alive(pid):
                continue
        else:
            try:
                if now - entry.stat().st_mtime < 86400:
                    continue
            except OSError:
                continue
        remove_tree(entry) if entry.is_dir() else entry.unlink(missing_ok=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def build(
    ws: Workspace,
    patterns: list[str],
    *,
    events_to: IO[str] | None = None,
    progress: bool | None = None,
    materialise: bool = True,
) -> BuildReport:
    t0 = time.perf_counter()
    if ws.remote and not ws.digest_function_explicit:
        # NB: keys must use the remote's digest function; ask it rather than fail on mismatch
        from rsi.remote import negotiate_digest_function  # type: ignore[import-not-found]

        ws = ws.with_overrides(digest_function=negotiate_digest_function(ws.remote))
    store = open_store(ws)
    build_id = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]
    events_path = store.events_dir / f"{build_id}.jsonl"
    events = EventLog(events_path, also=events_to, progress=progress)
    with store.lock(exclusive=False):
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
            labels, graph = load_graph(ws, patterns, store)
            wanted = graph.actions_for(labels)
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
            )
            outcomes = scheduler.run(graph, wanted, root_event)
        except RsiError as exc:
            events.emit(
                "build_finished",
                root_event,
                ok=False,
                error=str(exc),
                wall_s=round(time.perf_counter() - t0, 4),
            )
            events.close()
            raise
        report = BuildReport(
            build_id,
            ok=all(o.ok for o in outcomes.values()),
            events_path=str(events_path),
            outcomes=outcomes,
            graph=graph,
        )
        for label in labels:
            ids = sorted(graph.actions_for([label]))
            statuses = [outcomes[i].status for i in ids if i in outcomes]
            ok = all(outcomes[i].ok for i in ids if i in outcomes)
            outputs: list[str] = []
            if ok and materialise:
                outputs = _materialise(ws, store, graph, label, outcomes)
            cache = "hit" if all(s in ("hit", "remote_hit") for s in statuses) else "miss"
            failed = [
                {"action": i, "status": outcomes[i].status, "message": outcomes[i].message}
                for i in ids
                if i in outcomes and not outcomes[i].ok
            ]
            show = graph.providers[label].info.get("show")
            shown = next((o for o in outputs if show and o.endswith("/" + show)), None)
            report.targets[str(label)] = {
                "ok": ok,
                "cache": cache,
                "outputs": outputs,
                "failed": failed,
                "show": shown,
            }
            events.emit(
                "target_finished",
                root_event,
                label=str(label),
                ok=ok,
                cache=cache,
                outputs=outputs,
                failed=failed,
            )
        store.save_memos()
        c = events.counts
        report.counts = {
            "actions": len(wanted),
            "cached": c["hit"],
            "executed": c["executed"],
            "failed": c["failed"],
            "skipped": sum(1 for o in outcomes.values() if o.status in ("skipped", "not_started")),
        }
        report.wall_s = time.perf_counter() - t0
        events.emit(
            "build_finished",
            root_event,
            ok=report.ok,
            counts=report.counts,
            wall_s=round(report.wall_s, 4),
        )
        events.close()
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
