"""Waiting for the host lock informs without flooding (issue 32, item 5): one short line naming
the holder (a build of many patterns by its first and a count), how long it has held the lock
and, when its step held it before on this host, the time it has left; on a non-terminal a new
line only when the wait starts, when the holder changes (at most every 5 s) and every 30 s."""

from __future__ import annotations

import time

import pytest

from rsi.host import Holder, HostLock, short_label
from rsi.lock_wait import LockWaiter

pytestmark = pytest.mark.fast


def test_a_build_of_many_patterns_is_named_by_its_first_and_a_count():
    label = " ".join(f"//tasks/t{i}:verdict" for i in range(40))
    assert short_label(label) == "//tasks/t0:verdict (+39 more)"
    assert len(short_label("//" + "x" * 200)) == 60


def test_a_holder_line_says_how_long_it_held_and_the_time_it_has_left():
    now = time.time()
    h = Holder(42, "//tasks/softmax:verdict.measure", True, now - 30, expected_s=90.0)
    assert (
        h.describe(now)
        == "pid 42 //tasks/softmax:verdict.measure (exclusive, for 30s, ~1m00s left)"
    )
    late = Holder(42, "//a:b", True, now - 100, expected_s=90.0)
    assert "10s over its last 1m30s" in late.describe(now)
    unknown = Holder(42, "//a:b", True, now - 5)
    assert unknown.describe(now) == "pid 42 //a:b (exclusive, for 5s)"


def test_an_exclusive_holding_records_its_length_for_the_next_waiter(tmp_path):
    lock = HostLock(tmp_path / "host.lock")
    with lock.slot(True, "//a:timing"):
        [held] = lock.holders()
        assert held.expected_s is None  # NB: never held before on this host
    with lock.slot(True, "//a:timing"):
        [held] = lock.holders()
        assert held.expected_s is not None and held.expected_s >= 0
    with lock.slot(True, "//a:other"):
        [held] = lock.holders()
        assert held.expected_s is None


def test_a_corrupt_duration_record_is_ignored(tmp_path):
    lock = HostLock(tmp_path / "host.lock")
    with lock.slot(True, "//a:timing"):
        pass
    path = lock._expected_path("//a:timing")
    for bad in ('{"s": "soon"}', '{"s": -3}', "[1]", "not json", '{"s": 1e999}'):
        path.write_text(bad)
        with lock.slot(True, "//a:timing"):
            [held] = lock.holders()
            assert held.expected_s is None, bad
        path.write_text(bad)


class _Events:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.emitted: list[dict] = []

    def emit(self, kind, parent, **fields) -> None:
        self.emitted.append({"kind": kind, **fields})

    def notice(self, message: str, *, new: bool = True) -> None:
        if new:
            self.lines.append(message)


class _Spec:
    id = "a1"
    label = " ".join(f"//p{i}:t" for i in range(30))


def test_a_long_wait_prints_a_few_short_lines_not_one_per_poll(tmp_path, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    events = _Events()
    waiter = LockWaiter(events, HostLock(tmp_path / "l"), _Spec(), True, None)
    a = Holder(1, " ".join(f"//q{i}:t" for i in range(50)), True, time.time())
    b = Holder(2, "//other:t", True, time.time())
    # NB: 3 minutes of polls once a second; the holder flips every 2 s for one minute
    for second in range(180):
        clock[0] = 1000.0 + second
        holder = (a if second % 4 < 2 else b) if second < 60 else a
        waiter([holder], float(second))
    assert 1 < len(events.lines) <= 20, len(events.lines)
    assert all(len(line) < 240 for line in events.lines), max(map(len, events.lines))
    assert "(+49 more)" in events.lines[0] and "(+29 more)" in events.lines[0]
    # NB: the event stream still records every change of holder
    assert sum(e["kind"] == "host_lock_wait" for e in events.emitted) == 31
