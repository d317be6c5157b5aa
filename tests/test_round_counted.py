"""A round document says whether its speedup counts (issue 32, item 2): a FAIL's interval, an
INCONCLUSIVE's, a review-failed PASS's and a round without a verdict are marked not counted, with
the reason; only an accepted PASS counts."""

from __future__ import annotations

import pytest

from rules.campaign.documents import round_counted

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(
    ("doc", "counted", "needle"),
    [
        ({"state": "done", "verdict": "PASS", "review": {"verdict": "pass"}}, True, None),
        ({"state": "done", "verdict": "PASS", "review": None}, True, None),
        ({"state": "done", "verdict": "FAIL", "review": {"verdict": "pass"}}, False, "FAIL"),
        ({"state": "done", "verdict": "INCONCLUSIVE"}, False, "INCONCLUSIVE"),
        ({"state": "done", "verdict": "PASS", "review": {"verdict": "fail"}}, False, "review"),
        ({"state": "failed", "verdict": None}, False, "no verdict"),
    ],
)
def test_only_an_accepted_pass_counts_and_the_rest_say_why(doc, counted, needle):
    got, why = round_counted(doc)
    assert got is counted
    if counted:
        assert why is None
    else:
        assert needle in why
