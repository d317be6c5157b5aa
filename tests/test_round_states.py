"""What `rsi campaign status` says of a round with no verdict in the cache, from its last attempt
(rules/campaign/log.py `attempt_state`): a round judged while the host was busy is `host_busy`
(its INCONCLUSIVE shown, never counted, asked again), not `not_built` as if never judged."""

from __future__ import annotations

import os
import socket

import pytest

from rules.campaign.log import attempt_state


def _done(reasons: list[str], verdict: str = "INCONCLUSIVE") -> dict:
    return {"outcome": "done", "verdict_doc": {"verdict": verdict, "reasons": reasons}}


@pytest.mark.fast
def test_a_round_judged_on_a_busy_host_says_so():
    assert attempt_state(_done(["host_busy"])) == "host_busy"
    assert attempt_state(_done(["host_busy", "noise_band"])) == "host_busy"


@pytest.mark.fast
def test_a_judged_round_whose_verdict_left_the_cache_is_not_built():
    # NB: a PASS or FAIL was cached when judged: gone now means evicted, not busy
    assert attempt_state(_done([], "PASS")) == "not_built"
    assert attempt_state(_done(["noise_band"])) == "not_built"
    assert attempt_state({"outcome": "done"}) == "not_built"
    assert attempt_state(None) == "not_built"


@pytest.mark.fast
def test_failures_and_live_builds_keep_their_states():
    assert attempt_state({"outcome": "failed"}) == "failed_retryable"
    mine = {"outcome": "building", "host": socket.gethostname(), "pid": os.getpid()}
    assert attempt_state(mine) == "building"
    gone = {"outcome": "building", "host": socket.gethostname(), "pid": 2**22 + 12345}
    assert attempt_state(gone) == "interrupted"
