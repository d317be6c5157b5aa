"""The dashboard shows the independent review and what counts (issue 32, item 1): a PASS whose
review failed is marked beside its verdict, never counted, and the best-so-far line never goes
through it; FAIL rounds are on the charts; the noise band is visible at 0 %; unknown usage is
said, not drawn as an empty frame; charts are responsive, hoverable and offer a log scale.
Built from fixture documents (tests/dashboard_support.py), no campaign is run."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dashboard_support as S  # noqa: E402

pytestmark = pytest.mark.fast


def dash():
    return S.harness("dashboard")


def built(c: dict) -> tuple[dict, str]:
    d = dash()
    v = d.view(c["report"], c["docs"], c["verdicts"], c["meta"])
    return v, d.render_html(v)


def row_html(html: str, n: int) -> str:
    m = re.search(rf'<tr id="round-{n}".*?</tr>', html, re.S)
    assert m, f"no row for round {n}"
    return m.group(0)


def svg(html: str, chart_id: str) -> str:
    m = re.search(rf'<svg id="{chart_id}".*?</svg>', html, re.S)
    assert m, f"no {chart_id}"
    return m.group(0)


def test_a_review_failed_pass_is_marked_beside_its_verdict_and_never_counted():
    v, html = built(S.review_campaign())
    row = row_html(html, 2)
    assert re.search(r"✓ PASS <span class=\"review-mark\"[^>]*>⚠ review fail</span>", row)
    assert 'data-counts="false"' in row and 'data-review="fail"' in row
    assert "not counted</span>: review failed" in row
    assert "<code>kernel.py:7</code> frame_introspection" in row
    assert "1.800x" not in row  # NB: its speedup is never shown as a gain
    assert "counted</span>" in row_html(html, 4) and 'data-counts="true"' in row_html(html, 4)
    # NB: the header and the rows tell the same story: 1 counted, the review-failed PASS not
    assert "<strong>1 counted</strong> (1 PASS not counted: review not passed)" in html
    # NB: the best-so-far line goes through counted rounds only
    assert [r["best_so_far"] for r in v["rounds"]] == [None, None, None, 1.2]
    rounds = svg(html, "chart-round")
    assert re.findall(r'class="best-pt"[^>]*data-round="(\d+)"', rounds) == ["4"]
    pt = re.search(r'<g class="pt" data-round="2"[^>]*>\s*<title>([^<]*)', rounds)
    assert 'data-kind="review"' in pt.group(0)
    assert "review fail: not counted (review failed)" in pt.group(1)


def test_the_review_is_in_the_json_view_the_text_summary_and_the_report():
    c = S.review_campaign()
    v, _ = built(c)
    blob = json.loads(json.dumps(v, allow_nan=False))
    r2 = blob["rounds"][1]
    assert r2["review"]["verdict"] == "fail" and r2["counts"] is False
    assert r2["review"]["findings"][0]["file"] == "kernel.py"
    assert r2["review"]["findings"][0]["line"] == 7
    assert r2["not_counted_why"] == "review failed"
    assert [r["review"]["verdict"] for r in blob["rounds"]] == [
        "pass",
        "fail",
        "inconclusive",
        "pass",
    ]
    text = dash().render_text(v)
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("2 "))
    assert "fail (1)" in line and "not counted" in line and "1.800 " not in line
    assert "review finding: kernel.py:7 frame_introspection" in text
    md = S.harness("report").markdown(c["report"])
    row = next(ln for ln in md.splitlines() if ln.startswith("| 2 |"))
    assert "| PASS | fail | (1.800, not counted)" in row
    assert "`kernel.py:7` frame_introspection" in md
    assert c["report"]["rounds"][1]["speedup_counts"] is False


def test_an_external_round_without_review_counts_and_says_none():
    c = S.review_campaign()
    S.reviewed(c["docs"][3], None)
    c["report"] = S.harness("report").report(
        "//p:c", c["docs"], S.harness("selection").select(c["docs"]), {"state": "pending"}
    )
    v, html = built(c)
    assert v["rounds"][3]["counts"] is True and v["rounds"][3]["review"] is None
    assert "none (external project)" in row_html(html, 4)


def test_a_fail_round_without_a_measured_speedup_is_on_every_placed_chart():
    v, html = built(S.review_campaign())
    for chart_id in ("chart-round", "chart-t_s"):
        g = re.search(r'<g class="pt" data-round="1"[^>]*>', svg(html, chart_id))
        assert g, chart_id
        tag = g.group(0)
        assert 'data-verdict="FAIL"' in tag and 'data-measured="false"' in tag
        assert 'data-counts="false"' in tag
    c = next(ch for ch in dash().charts(v) if ch["axis"] == "round")
    fail = next(p for p in c["points"] if p["round"] == 1)
    # NB: on the strip just above the x axis, drawn as a cross
    assert c["strip"] < fail["cy"] < c["plot"]["y"] + c["plot"]["h"]
    assert "candidate_check_failed" in fail["why"]
    assert "1 judged without a measured speedup" in c["summary"]


def test_the_noise_band_is_visible_and_labelled_even_at_zero():
    v, html = built(S.review_campaign(noise=0.0))
    for c in dash().charts(v):
        if c["frame"]:
            assert c["band"]["h"] >= dash().MIN_BAND_PX
            assert c["band"]["label"] == "noise ±0.0%"
    assert 'class="band-label"' in html and "noise ±0.0%</text>" in html


def test_unknown_usage_is_said_instead_of_an_empty_frame():
    v, html = built(S.review_campaign())
    assert v["usage_unknown"]["tokens"] == 3 and v["usage_unknown"]["rounds"] == 4
    for axis in ("tokens", "calls"):
        assert f'id="chart-{axis}"' not in html
        note = re.search(rf'<div class="usage-unknown" data-axis="{axis}"[^>]*>(.*?)</div>', html)
        assert "usage unknown for 3 of 4 rounds" in note.group(1)
    # NB: a total over rounds with unknowns says it is partial
    usage = re.search(r'<tr data-field="tokens.input">.*?</tr>', html).group(0)
    assert "1200" in usage and "partial: 3 of 4 rounds unknown" in usage


def test_the_compare_page_has_round_ticks_and_never_a_silent_partial_total():
    a, b = S.review_campaign(), S.campaign(6, seed=2)
    va = dash().view(a["report"], a["docs"], a["verdicts"], a["meta"])
    vb = dash().view(b["report"], b["docs"], b["verdicts"], b["meta"])
    vb["campaign"] = "//tasks/sm:other"
    html = dash().render_compare("//tasks/sm:task", [va, vb])
    chart = svg(html, "chart-compare")
    assert re.findall(r'<text class="xtick"[^>]*>(\d+)</text>', chart) == [
        str(n) for n in range(1, 7)
    ]
    row = re.search(r'<tr data-campaign="//tasks/sm:campaign">.*?</tr>', html, re.S).group(0)
    tokens = re.search(r'<td class="num usage-tokens"[^>]*>(.*?)</td>', row).group(1)
    assert "1500" in tokens and "partial: usage unknown for 3 of 4 rounds" in tokens
    assert "1 counted, 1 PASS not counted (review)" in row
    assert 'width="560"' not in chart and "viewBox=" in chart


def test_charts_are_responsive_and_every_marker_has_a_hover_title():
    v, html = built(S.campaign(12, seed=4))
    for tag in re.findall(r"<svg [^>]*>", html):
        assert "viewBox=" in tag and " width=" not in tag and " height=" not in tag
    assert "svg.chart { width: 100%" in html
    for g in re.findall(r'<g class="pt".*?</g>', html, re.S):
        assert re.search(r"<title>round \d+: \w+[^<]*(counted|not counted)", g), g


def test_a_wide_speedup_range_offers_a_log_scale_view():
    c = S.review_campaign()
    c["docs"][3] = S.reviewed(S.round_doc(4, "PASS", 12.0, {}, "vectorise"), "pass")
    c["report"] = S.harness("report").report(
        "//p:c", c["docs"], S.harness("selection").select(c["docs"]), {"state": "pending"}
    )
    v, html = built(c)
    assert dash().wide(v)
    assert '<input type="checkbox" id="logscale">' in html
    log = svg(html, "chart-round-log")
    assert 'data-scale="log"' in log and "log scale" in log
    ticks = [float(t) for t in re.findall(r'text-anchor="end">([\d.]+)</text>', log)]
    assert {1.0, 2.0, 5.0, 10.0} <= set(ticks)
    # NB: on the log axis heights are ratios: 1 -> 12x is log(12)/log(1.2) times 1 -> 1.2x
    c = next(ch for ch in dash().charts(v) if ch["axis"] == "round")["log"]
    cy = {p["round"]: p["cy"] for p in c["points"]}
    one = c["one"]
    lin = next(ch for ch in dash().charts(v) if ch["axis"] == "round")
    assert (one - cy[4]) / (one - cy[2]) == pytest.approx(math.log(12) / math.log(1.8), rel=0.02)
    assert (lin["one"] - next(p["cy"] for p in lin["points"] if p["round"] == 4)) / (
        lin["one"] - next(p["cy"] for p in lin["points"] if p["round"] == 2)
    ) == pytest.approx(11 / 0.8, rel=0.02)
    narrow = built(S.review_campaign())[1]
    assert 'id="logscale"' not in narrow and "chart-round-log" not in narrow


def test_the_index_says_how_many_rounds_count():
    v, _ = built(S.review_campaign())
    groups = [
        {
            "task": "//tasks/sm:task",
            "compare": "c",
            "campaigns": [{"label": v["campaign"], "url": "u", "view": v, "error": None}],
        }
    ]
    html = dash().render_index("ws", groups, None, None)
    assert "1 counted, 1 PASS not counted (review)" in html


def test_review_findings_are_escaped():
    c = S.review_campaign()
    evil = dict(S.FINDING, file="<b>k.py</b>", detail='<script>alert("x")</script>')
    S.reviewed(c["docs"][1], "fail", [evil])
    _, html = built(c)
    assert "<script" not in html and "<b>k.py" not in html
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in row_html(html, 2)


def test_every_chart_has_its_own_counted_not_counted_key():
    _, html = built(S.review_campaign())
    for axis in ("round", "t_s"):
        key = re.search(rf'<p class="legend chart-key" data-axis="{axis}">(.*?)</p>', html).group(1)
        assert "● PASS, counted (1)" in key
        assert "◎ PASS, review not passed: not counted (1)" in key
        assert "□ INCONCLUSIVE: not counted (1)" in key and "✗ FAIL: not counted" in key
        assert "best so far: counted rounds only" in key


def test_the_round_documents_review_decides_even_when_the_report_does_not_say():
    # NB: a report written before `accepted` (speedup_counts = verdict == PASS): the round
    # document's failed review still keeps its PASS from counting
    c = S.review_campaign()
    for r in c["report"]["rounds"]:
        r["speedup_counts"] = r["verdict"] == "PASS"
        r.pop("accepted"), r.pop("review"), r.pop("review_findings")
    for d in c["docs"]:
        d.pop("accepted")
    v, html = built(c)
    assert [r["counts"] for r in v["rounds"]] == [False, False, False, True]
    assert "⚠ review fail" in row_html(html, 2)
