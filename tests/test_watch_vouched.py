"""What a watcher vouches for, by folder (rsi.incremental `_vouched`, rsi.analysis_cache
`Vouched`): a source named by an event, linked, of unknown digest or a mount point is looked at,
as is every source of a folder the watcher cannot speak for; the analysis' reads that are no
watched source are always checked. The watcher is a stand-in here (only its mount table is
read); tests/test_watch.py drives a real one through real builds."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rsi import incremental
from rsi.analysis_cache import Vouched, _stats_unchanged
from rsi.incremental import Plan, _vouched

pytestmark = pytest.mark.fast


def _plan(folders: dict[str, list[str]], linked=()) -> Plan:
    p = Plan("r", {"sources": {}})
    p.watch = {
        "folders": {f: frozenset(paths) for f, paths in folders.items()},
        "linked": set(linked),
        "extra": {},
    }
    return p


def test_named_linked_unknown_and_mounted_sources_are_looked_at(monkeypatch):
    monkeypatch.setattr(incremental, "watcher", SimpleNamespace(mount_points=frozenset({"/w/c/m"})))
    p = _plan(
        {
            "/w/a": ["/w/a/1", "/w/a/2", "/w/a/3", "/w/a/4"],
            "/w/b": ["/w/b/1", "/w/b/2"],
            "/w/c": ["/w/c/1", "/w/c/m"],
        },
        linked={"/w/a/3"},
    )
    changed = {"/w/a": {"1", "not-a-source"}, "/w/b": None, "/w/c": set()}
    v = _vouched(p, changed, unknown={"/w/a/4"})
    assert sorted(v.noisy) == ["/w/a/1", "/w/a/3", "/w/a/4", "/w/b/1", "/w/b/2", "/w/c/m"]
    assert "/w/a/2" in v and "/w/c/1" in v
    for path in v.noisy + ["/w/a/other", "/elsewhere", 3]:
        assert path not in v
    assert set(v.quiet) == {"/w/a", "/w/c"}  # NB: /w/b cannot be spoken for


def test_the_analysis_reads_not_vouched_for_are_checked_one_by_one(monkeypatch, tmp_path):
    monkeypatch.setattr(incremental, "watcher", SimpleNamespace(mount_points=frozenset()))
    folder = str(tmp_path)
    a, b = f"{folder}/a.txt", f"{folder}/b.txt"
    for q in (a, b):
        open(q, "w").close()
    declarations = f"{folder}/BUILD.toml"
    open(declarations, "w").close()
    p = _plan({folder: [a, b]})
    v = _vouched(p, {folder: {"b.txt"}})
    stats = {q: ["file", False, q] for q in (a, b, declarations)}
    assert sorted(v.reads_to_check(stats)) == [declarations, b]
    assert _stats_unchanged(stats, {}, v, {})
    # NB: a read that is no watched source is checked even when the watcher vouches for all
    stats[declarations] = ["absent"]
    assert not _stats_unchanged(stats, {}, _vouched(p, {folder: set()}), {})
    assert not _stats_unchanged(stats, {}, Vouched({}, [a, b], {}, {}), {})
