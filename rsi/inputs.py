"""What a request's outputs are made of, as one digest: the analysis (its key covers the engine
and rule code; its tracker every declaration read, by content) and the content and mode of every
source its actions read. A job's key (rsi.jobs) includes it, so a second submit attaches only
to a run of the same inputs. It reads files; it never runs an action nor writes `out/`.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from rsi.build_analysis import analyse_request
from rsi.digest import digest_value
from rsi.runtime import open_store
from rsi.workspace import Workspace


def _source_digest(store: Any, path: str) -> list:
    """[kind, executable, content digest] of a workspace source (a file or a folder of them)."""
    try:
        st = os.stat(path)
    except OSError:
        return ["absent"]
    if not stat.S_ISDIR(st.st_mode):
        try:
            return ["file", bool(st.st_mode & 0o111), str(store.file_memo.digest(path, st))]
        except OSError:
            return ["unreadable"]
    found: list = []
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            found.append([os.path.relpath(full, path), _source_digest(store, full)])
    return ["dir", found]


def request_inputs(ws: Workspace, patterns: list[str], current: str) -> str:
    """The digest of everything `rsi build PATTERNS` (from package `current`) would read now."""
    store = open_store(ws)
    with store.lock(exclusive=False):  # NB: analysis writes blobs, which gc must not race
        labels, graph, meta = analyse_request(ws, patterns, store, current)
        tracker = meta["tracker"]
        sources: dict[str, list] = {}
        for action_id in sorted(graph.actions_for(labels)):
            for art in graph.actions[action_id].inputs:
                if art.source is not None and art.producer is None and art.source not in sources:
                    sources[art.source] = _source_digest(store, art.source)
        store.save_memos()
    return digest_value(
        {
            "analysis": meta["analysis_key"],
            "declarations": sorted(tracker.files.items()),
            "stats": sorted(tracker.stats.items()),
            "trees": sorted(tracker.trees.items()),
            "walks": sorted(tracker.walks.items()),
            "sources": sorted(sources.items()),
        },
        store.function,
    ).hash
