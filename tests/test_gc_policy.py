"""The garbage collector's settings while a scheduler runs (rsi.gc_policy): full
collections rare during the run, Python's own settings back after it, however runs overlap
or end."""

from __future__ import annotations

import gc
import threading

import pytest

from rsi.gc_policy import FULL_EVERY, few_full_collections

pytestmark = pytest.mark.fast


@pytest.fixture
def thresholds():
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*before)


def test_a_run_makes_full_collections_rare_and_puts_the_settings_back(thresholds):
    with few_full_collections():
        assert gc.get_threshold() == (700, 10, FULL_EVERY)
    assert gc.get_threshold() == (700, 10, 10)


def test_a_run_that_raises_still_puts_the_settings_back(thresholds):
    with pytest.raises(KeyError):
        with few_full_collections():
            raise KeyError("boom")
    assert gc.get_threshold() == (700, 10, 10)


def test_overlapping_runs_restore_only_when_the_last_ends(thresholds):
    """Two runs in threads, the first ending while the second still runs (a build server):
    the second keeps its setting, and the settings of before the first come back at the end,
    not the second's view of them."""
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[tuple] = []

    def first():
        with few_full_collections():
            first_in.set()
            second_in.wait(5)
        first_out.set()

    def second():
        first_in.wait(5)
        with few_full_collections():
            second_in.set()
            first_out.wait(5)
            seen.append(gc.get_threshold())

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == [(700, 10, FULL_EVERY)]
    assert gc.get_threshold() == (700, 10, 10)


def test_a_collector_already_less_eager_is_left_so(thresholds):
    gc.set_threshold(700, 10, 5000)
    with few_full_collections():
        assert gc.get_threshold()[2] == 5000
    assert gc.get_threshold() == (700, 10, 5000)
