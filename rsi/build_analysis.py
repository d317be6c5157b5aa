"""A build's analysis: the loader of a workspace's rules, and the labels and action graph of a
request, served by the analysis cache when nothing it read changed. Must never run an action
nor write outside the store's analysis cache."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rsi.label import Label, Pattern
from rsi.store import LocalStore
from rsi.workspace import Workspace

if TYPE_CHECKING:
    from rsi.analysis import BuildGraph
    from rsi.loader import Loader


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
    labels, graph, _ = analyse(ws, patterns, store, current_package(ws), use_cache=use_cache)
    return labels, graph


def analyse_request(
    ws: Workspace, patterns: list[str], store: LocalStore, current: str
) -> tuple[list[Label], BuildGraph, dict]:
    """(labels, graph, what the analysis depended on: its key, which covers the engine and
    rule code, and the tracker of its reads) for `patterns` from package `current`; the
    analysis cache serves it when nothing it read changed."""
    return analyse(ws, patterns, store, current)


def analyse(
    ws: Workspace, patterns: list[str], store: LocalStore, current: str, *, use_cache: bool = True
) -> tuple[list[Label], BuildGraph, dict]:
    """(labels, graph, what the incremental state keeps of the analysis: its key, the code it
    depended on and the tracker of its reads)."""
    from rsi import analysis_cache
    from rsi.analysis import analyze
    from rsi.incremental import quiet_gc, request_fields

    loader = make_loader(ws)
    rule_modules = {rule.impl.__module__ for rule in loader.rules.values()}
    roots = analysis_cache.code_roots(rule_modules)
    code = analysis_cache.code_digest(store.meta_memo, roots)
    key = analysis_cache.cache_key(
        store.meta_memo, request_fields(ws, patterns, current, store), code=code
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


def current_package(ws: Workspace) -> str:
    """The package of the current folder; relative labels resolve against it."""
    try:
        rel = Path.cwd().resolve().relative_to(ws.root)
    except ValueError:
        return ""
    return "" if str(rel) == "." else rel.as_posix()


def named_labels(ws: Workspace, patterns: list[str]) -> set[Label]:
    """The targets named one by one (not through `...` or `:all`): a target a pattern only
    matched is skipped when the executor cannot run it; a named one fails."""
    current = current_package(ws)
    named: set[Label] = set()
    for text in patterns:
        pattern = Pattern.parse(text, current)
        if pattern.name is not None:
            named.add(Label(pattern.package, pattern.name))
    return named


def analysis_cache_graph(store: LocalStore, key: str) -> BuildGraph | None:
    from rsi import analysis_cache

    found = analysis_cache.load_unchecked(store, key)
    return None if found is None else found[1]
