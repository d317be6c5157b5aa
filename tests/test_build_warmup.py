"""The one-change build's sandbox warm-up (rsi/build.py): the executor handed to the scheduler
is the real one in all but its first action's wait for the slot started for it."""

from __future__ import annotations

import threading
import time

import pytest

from rsi import build_executor as build_mod

pytestmark = pytest.mark.fast


class _Executor:
    name = "local"
    copies_sources = True

    def __init__(self) -> None:
        self.calls: list = []

    def run(self, action, store, cancel=None):
        self.calls.append((action, store, cancel))
        return "result"


def test_the_first_action_waits_for_the_warm_up_and_the_rest_is_the_executor():
    executor = _Executor()
    started = threading.Event()
    done = threading.Event()

    def warm() -> None:
        started.set()
        time.sleep(0.05)
        done.set()

    warming = threading.Thread(target=warm, daemon=True)
    warming.start()
    wrapped = build_mod.AfterWarmUp(executor, warming)
    assert started.wait(5)
    assert wrapped.name == "local" and wrapped.copies_sources is True
    assert getattr(wrapped, "capabilities", None) is None  # NB: what executor_capabilities asks
    assert wrapped.run("a", "s", None) == "result"
    assert done.is_set(), "the first action ran before the slot it waits for was started"
    assert wrapped.run("b", "s") == "result"
    assert [c[0] for c in executor.calls] == ["a", "b"]


def test_an_executor_that_uses_no_pooled_slot_is_used_as_it_is(monkeypatch):
    swept: list = []
    monkeypatch.setattr(build_mod, "clean_stale_sandboxes", lambda: swept.append(1))
    executor = _Executor()
    executor.sandbox = "none"
    assert build_mod.warm_sandbox(executor) is executor
    assert swept == [1]
