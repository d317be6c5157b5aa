"""Copying a build's outputs under `out/` for people, each atomically and only when it differs.
Must never export anything but the verified blob this build's outcome names."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rsi.label import Label
from rsi.store import LocalStore
from rsi.workspace import Workspace

if TYPE_CHECKING:
    from rsi.analysis import BuildGraph
    from rsi.scheduler import Outcome


def export_output(
    ws: Workspace, store: LocalStore, path: str, digest: Any, executable: bool
) -> str:
    """Copy one output under `out/` for people; skipped when already identical."""
    dest = ws.out_dir / path
    try:
        if dest.is_file() and store.out_memo.digest(dest) == digest:
            return str(dest)
    except OSError:
        pass
    store.export_file(digest, dest, executable, atomic=True)
    return str(dest)


def materialise_target(
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
    return export_files(ws, store, files, outcomes)


def export_files(
    ws: Workspace, store: LocalStore, files: list, outcomes: Mapping[str, Outcome]
) -> list[str]:
    """Copy (path, the action producing it) files under `out/` from this build's outcomes (a
    target's files from its provider, or as the build state recorded them)."""
    written: list[str] = []
    for path, producer in files:
        result = outcomes[producer].result
        out = result.output_map.get(path) if result else None
        if out is not None:
            written.append(export_output(ws, store, path, out.digest, out.executable))
    return written


def remove_out(ws: Workspace) -> None:
    shutil.rmtree(ws.out_dir, ignore_errors=True)
