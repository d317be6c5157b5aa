"""Whether what a build read is still what the workspace holds, asked just before it exports:
every source by its stat signature (hashed again only where that signature is racy or moved)
and every declaration analysis read. It never decides a result: a build whose reads moved
builds again or says so, and never exports outputs older than the sources it last saw.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from typing import Any

from rsi.digest import digest_file


def expected_sources(seen: Mapping[str, tuple], plan: Any, only: Any = None) -> dict[str, tuple]:
    """{path: (signature or None, hash, size)} of every source the build's outputs come from:
    what the run keyed (`seen`, the scheduler's), else what the incremental state's check
    found (its hashed edits first, then the recorded entries it vouched for). `only`: the
    state's sources to list (a watcher vouches for the others), instead of all of them."""
    expected: dict[str, tuple] = {}
    if plan is not None:
        sources = plan.state["sources"]
        for path in sources if only is None else only:
            entry = sources[path]
            expected[path] = (entry[0], entry[1], entry[2])
        for path, (_, trusted, digest) in plan.fresh.items():
            expected[path] = (trusted, digest.hash, digest.size)
    expected.update(seen)
    return expected


def moved_sources(
    expected: Mapping[str, tuple],
    function: str,
    unchanged: Any = frozenset(),
    lstats: dict | None = None,
) -> list[str]:
    """The sources whose content is no longer what the build read (sorted). Those in
    `unchanged` (a watcher saw no change to them since the build's check) are not looked at;
    the mode of each other one's `lstat` goes into `lstats` (for `moved_declarations`)."""
    moved = []
    for path, (sig, hash_hex, size) in expected.items():
        if hash_hex is not None and path in unchanged:
            continue
        try:
            st = os.lstat(path)
            if lstats is not None:
                lstats[path] = st.st_mode
            if stat.S_ISLNK(st.st_mode):
                st = os.stat(path)
        except OSError:
            moved.append(path)
            continue
        if sig is not None and tuple(sig) == (
            st.st_ino,
            st.st_size,
            st.st_mtime_ns,
            st.st_ctime_ns,
        ):
            continue
        if hash_hex is None or st.st_size != size:
            moved.append(path)
            continue
        try:
            digest = digest_file(path, function)
        except OSError:
            moved.append(path)
            continue
        if digest.hash != hash_hex or digest.size != size:
            moved.append(path)
    return sorted(moved)


def moved_declarations(tracker: Any, lstats: dict, unchanged: Any = frozenset()) -> list[str]:
    """What analysis read that differs now ([] without a tracker: a remote build keeps none);
    `lstats` and `unchanged` as `moved_sources` left them."""
    return [] if tracker is None else tracker.moved_reads(lstats, unchanged)
