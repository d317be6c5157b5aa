"""The cyclic garbage collector's settings where a build makes millions of long-lived objects:
while a state or an analysis loads (`quiet_gc`) and while a scheduler runs
(`few_full_collections`). It must never leave the collector off, or its thresholds changed,
after the last of them ends."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def quiet_gc() -> Iterator[None]:
    """No cyclic garbage collection while millions of long-lived objects are made (a state or
    an analysis of 100,000 actions): each collection would walk all of them again. They are
    frozen (out of the collector's walks) before it is turned back on: left young, the first
    collection after would walk them all (~170 ms at 100,000 actions). A build unfreezes
    what it froze when it ends (`_unfrozen_after` in rsi/build.py)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.freeze()
            gc.enable()


# NB: full collections while a scheduler runs: one per this many young (generation 1) ones
# instead of Python's 10; see `few_full_collections`
FULL_EVERY = 1000
_lock = threading.Lock()
_runs = 0  # NB: schedulers running now
_before: tuple[int, ...] | None = None  # NB: the thresholds before the first of them


@contextmanager
def few_full_collections() -> Iterator[None]:
    """Young collections as usual, full ones rarely, while a scheduler runs: each action's
    outcome, result and events outlive the young generations, so a full collection walks
    everything the run made so far, again and again (20 of them, 5.4 s of a 256 s cold build
    of 100,000 actions; 4 and 0.13 s at 10,000). Cyclic garbage still dies in the young
    collections; what survives them waits for the first full collection after the run. Runs
    nest and overlap (a build server runs builds in threads): the thresholds of before the
    first are put back when the last ends."""
    global _runs, _before
    with _lock:
        if _runs == 0:
            _before = gc.get_threshold()
            gc.set_threshold(_before[0], _before[1], max(_before[2], FULL_EVERY))
        _runs += 1
    try:
        yield
    finally:
        with _lock:
            _runs -= 1
            if _runs == 0 and _before is not None:
                gc.set_threshold(*_before)
                _before = None
