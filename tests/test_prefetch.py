"""While a one-change build's re-run actions run, the main thread looks up the inputs that
producers settled before the run (the incremental state's) give to the actions waiting on
them (rsi.scheduler `_prefetch`), so a root of many inputs is resolved from that, never from a
producer the run makes anew."""

from __future__ import annotations

import time

import pytest
import test_event_hits

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bwrap")]

fanin = test_event_hits.fanin


def test_a_waiting_action_gets_its_settled_inputs_looked_up_while_it_waits(fanin, monkeypatch):
    from rsi import build as build_mod
    from rsi import incremental, scheduler
    from rsi.workspace import Workspace

    ws = Workspace.load(fanin)
    assert build_mod.build(ws, ["//:top"], progress=False).ok
    time.sleep(1.1)  # NB: past the racy window: the next build is served by the state
    assert build_mod.build(ws, ["//:top"], progress=False).counts["executed"] == 0
    early: dict[str, dict] = {}
    real = scheduler.Scheduler._prefetch

    def prefetch(self, spec, outcomes, run, found):
        early[spec.id] = found
        yield from real(self, spec, outcomes, run, found)

    lookups: list[str] = []
    real_output = incremental.StateOutcomes.output

    def output(self, producer, path):
        lookups.append(path)
        return real_output(self, producer, path)

    monkeypatch.setattr(scheduler.Scheduler, "_prefetch", prefetch)
    monkeypatch.setattr(incremental.StateOutcomes, "output", output)
    (fanin / "in" / "a.txt").write_text("alpha 2\n")
    report = build_mod.build(ws, ["//:top"], progress=False)
    assert report.ok and report.counts["executed"] == 2
    assert (fanin / "out" / "top.out").read_text() == "alpha 2\nbravo\n"
    (top,) = [i for i in early if i.startswith("//:top")]
    # NB: leaf_b's output, settled, looked up once (while leaf_a ran); leaf_a's never: the run
    # made it anew
    assert list(early[top]) == ["b.out"] and early[top]["b.out"][0].size == len("bravo\n")
    assert lookups == ["b.out"]
