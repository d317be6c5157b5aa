"""The re-check a one-change build makes before it exports (rsi.incremental
`swept_since_check`: one sweep, as the state's check makes): a source of an action the state
vouched for, changed while the re-run actions ran, in content, mode or real path, is still
caught, and the build goes again rather than export an output older than it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import test_event_hits

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bwrap")]

# NB: the same workspace as the event tests': leaf_a, leaf_b -> top, each leaf copying its source
fanin = test_event_hits.fanin


@pytest.fixture(
    autouse=True,
    params=["0", "python", "always", "child"],
    ids=["sweep", "sweep_python", "build_watch", "sweep_child"],
)
def build_watch(request, monkeypatch):
    """Each test with the re-check looking at every source (through the C stat loop, and
    through the Python loop rsi.native falls back on); with the build's own watch
    (rsi.watch.BuildWatch) telling it which to look at; and with half the sources swept by a
    forked child (rsi.side_check.Sweep); each at any size, for the test."""
    from rsi import native

    if request.param == "0":
        assert native.available(), "the C stat loop is not built (python -m rsi.native build)"
    if request.param == "python":
        monkeypatch.setattr(native, "_native", None)
        monkeypatch.setenv("RSI_BUILD_WATCH", "0")
        monkeypatch.setenv("RSI_SIDE_CHECK", "0")
    elif request.param == "child":
        monkeypatch.setenv("RSI_BUILD_WATCH", "0")
        monkeypatch.setenv("RSI_SIDE_CHECK", "always")
    else:
        monkeypatch.setenv("RSI_BUILD_WATCH", request.param)
        monkeypatch.setenv("RSI_SIDE_CHECK", "0")
    return request.param


def _one_change_with(ws_root: Path, monkeypatch, meanwhile) -> tuple[object, list[dict]]:
    """Build, settle, change in/a.txt, and build again with `meanwhile()` run right after the
    first attempt's actions (before its re-check); (the report, the events)."""
    from rsi import build as build_mod
    from rsi import scheduler
    from rsi.workspace import Workspace

    ws = Workspace.load(ws_root)
    assert build_mod.build(ws, ["//:top"], progress=False).ok
    time.sleep(1.1)  # NB: past the racy window: the state's signatures stand for content
    assert build_mod.build(ws, ["//:top"], progress=False).counts["executed"] == 0
    real_run = scheduler.Scheduler.run
    calls: list[set] = []

    def run(self, graph, wanted, *args, **kwargs):
        out = real_run(self, graph, wanted, *args, **kwargs)
        calls.append(set(wanted))
        if len(calls) == 1:
            meanwhile()
        return out

    monkeypatch.setattr(scheduler.Scheduler, "run", run)
    (ws_root / "in" / "a.txt").write_text("alpha 2\n")
    events_path = ws_root.parent / "events.jsonl"
    with open(events_path, "w") as f:
        report = build_mod.build(ws, ["//:top"], progress=False, events_to=f)
    # NB: the first attempt was a one-change build: leaf_b was vouched for by the state
    assert calls and not any(i.startswith("//:leaf_b") for i in calls[0])
    events = [json.loads(line) for line in events_path.read_text().splitlines()]
    return report, events


def _changed(events: list[dict]) -> list[dict]:
    return [e for e in events if e["kind"] == "sources_changed"]


def test_a_vouched_for_source_rewritten_during_a_one_change_build_is_caught(fanin, monkeypatch):
    b = fanin / "in" / "b.txt"
    report, events = _one_change_with(fanin, monkeypatch, lambda: b.write_text("bravo 2\n"))
    changed = _changed(events)
    assert changed and changed[0]["paths"] == [str(b)] and changed[0]["attempt"] == 1
    assert report.ok
    assert (fanin / "out" / "top.out").read_text() == "alpha 2\nbravo 2\n"


def test_a_vouched_for_source_made_executable_during_a_one_change_build_is_caught(
    fanin, monkeypatch
):
    b = fanin / "in" / "b.txt"
    report, events = _one_change_with(fanin, monkeypatch, lambda: os.chmod(b, 0o755))
    changed = _changed(events)
    assert changed and changed[0]["attempt"] == 1
    assert any("mode" in p for p in changed[0]["paths"]), changed
    assert report.ok


def test_a_source_folder_swapped_for_a_link_during_a_one_change_build_is_caught(fanin, monkeypatch):
    """Same files, same inodes: only the folder's real path differs."""

    def swap() -> None:
        (fanin / "in").rename(fanin / "elsewhere")
        (fanin / "in").symlink_to(fanin / "elsewhere")

    _, events = _one_change_with(fanin, monkeypatch, swap)
    changed = _changed(events)
    assert changed and changed[0]["attempt"] == 1
    assert any("real path" in p for p in changed[0]["paths"]), changed


def test_a_one_change_build_with_nothing_moved_exports_once(fanin, monkeypatch):
    report, events = _one_change_with(fanin, monkeypatch, lambda: None)
    assert not _changed(events)
    assert report.ok and report.counts["executed"] == 2
    assert (fanin / "out" / "top.out").read_text() == "alpha 2\nbravo\n"
