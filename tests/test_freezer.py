"""proctree.Freezer on real processes: while one arm's timed calls run, every process of the
other arm's sandbox is stopped (threads, children, and orphans left to a subreaper alike) and
uses no CPU; afterwards all of them go on. The arms' calls interleave, so without it an idle
candidate could burn the CPU, cache or memory bandwidth that the baseline's call is using."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from harness_support import load_harness_module

pytestmark = pytest.mark.fast

R = load_harness_module("proctree")

# A root that becomes a subreaper, runs a burning thread, a burning child and a double-forked
# burning orphan (reparented to the root), then says how many it started.
TREE = r"""
import ctypes, os, sys, threading, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
def burn():
    while True:
        pass
threading.Thread(target=burn, daemon=True).start()
if os.fork() == 0:
    burn()
if os.fork() == 0:
    if os.fork() == 0:
        burn()
    os._exit(0)
os.wait()
print("ready", flush=True)
time.sleep(120)
"""


def _tree(root: int) -> list[int]:
    return [root, *R.descendants(root)]


def _cpu(pids: list[int]) -> int:
    return sum(R.cpu_clock_ns(p) or 0 for p in pids)


def _states(pids: list[int]) -> set[bytes]:
    return {s for p in pids for s in R.task_states(p)}


@pytest.fixture()
def tree():
    proc = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        yield proc.pid
    finally:
        for pid in _tree(proc.pid)[::-1]:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        proc.wait()


def test_a_frozen_sandbox_uses_no_cpu_and_goes_on_when_thawed(tree):
    pids = _tree(tree)
    assert len(pids) == 3, "root, its child and the orphan it took over"
    freezer = R.Freezer(tree)
    freezer.freeze()
    try:
        assert sorted(freezer.stopped) == sorted(pids)
        assert _states(pids) <= {b"T", b"t"}, _states(pids)
        before = _cpu(pids)
        time.sleep(0.1)
        assert _cpu(pids) == before, "a stopped process used CPU"
    finally:
        freezer.thaw()
    assert freezer.stopped == []
    before = _cpu(pids)
    time.sleep(0.1)
    assert _cpu(pids) > before, "the thawed processes did not go on"


def test_a_process_that_cannot_be_stopped_is_reported(tree, monkeypatch):
    """A sandbox whose threads still run after the settle time is the frozen arm's failure
    (measure.py: `interference`), not a silent pass."""
    monkeypatch.setattr(R, "task_states", lambda pid: [b"R"])
    monkeypatch.setattr(R.Freezer, "SETTLE_S", 0.02)
    freezer = R.Freezer(tree)
    try:
        with pytest.raises(R.FreezeError, match="could not be stopped"):
            freezer.freeze()
    finally:
        freezer.thaw()


def test_without_children_files_the_process_table_finds_the_same_tree(tree, monkeypatch):
    """A kernel without /proc/<pid>/task/<tid>/children must not leave children running."""
    with_files = sorted(R.children_of(tree))
    monkeypatch.setattr(R, "_CHILDREN_FILES", False)
    assert sorted(R.children_of(tree)) == with_files
    assert len(with_files) == 2
    freezer = R.Freezer(tree)
    freezer.freeze()
    try:
        assert sorted(freezer.stopped) == sorted(_tree(tree))
    finally:
        freezer.thaw()
