"""What a reader sees of the dashboard in a real browser (issue 32, item 1): Debian's chromium
driven by playwright, pages built from fixture documents (tests/dashboard_support.py), at
1400 px and 800 px. Asserts on the DOM a reader sees (text, visibility, boxes), not pixels;
the screenshots go to out/dashboard/ for people."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dashboard_support as S  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHOTS = REPO / "out" / "dashboard"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
WIDTHS = (1400, 800)


def _playwright():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if sync_playwright is None or not os.path.exists(CHROMIUM):
        why = "playwright is not installed" if sync_playwright is None else f"no {CHROMIUM}"
        if os.environ.get("RSI_REQUIRE_SANDBOXES") == "1":
            pytest.fail(f"{why}: CI must run the browser test (./scripts/setup.sh --test)")
        pytest.skip(f"{why} (./scripts/setup.sh --test installs both)")
    return sync_playwright


def _pages(tmp_path: Path) -> dict[str, Path]:
    dash = S.harness("dashboard")
    out = {}
    c = S.review_campaign()
    v = dash.view(c["report"], c["docs"], c["verdicts"], c["meta"])
    out["review"] = tmp_path / "review.html"
    out["review"].write_text(dash.render_html(v), encoding="utf-8")
    w = S.review_campaign()
    w["docs"][3] = S.reviewed(S.round_doc(4, "PASS", 12.0, {}, "vectorise"), "pass")
    w["report"] = S.harness("report").report(
        "//p:c", w["docs"], S.harness("selection").select(w["docs"]), {"state": "pending"}
    )
    vw = dash.view(w["report"], w["docs"], w["verdicts"], w["meta"])
    out["wide"] = tmp_path / "wide.html"
    out["wide"].write_text(dash.render_html(vw), encoding="utf-8")
    other = S.campaign(6, seed=2)
    vo = dash.view(other["report"], other["docs"], other["verdicts"], other["meta"])
    vo["campaign"] = "//tasks/sm:other"
    out["compare"] = tmp_path / "compare.html"
    out["compare"].write_text(dash.render_compare("//tasks/sm:task", [v, vo]), encoding="utf-8")
    return out


@pytest.mark.e2e
def test_a_reader_sees_the_review_the_fail_marker_and_the_unknown_usage_note(tmp_path):
    sync_playwright = _playwright()
    pages = _pages(tmp_path)
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            for width in WIDTHS:
                page = browser.new_page(viewport={"width": width, "height": 1000})
                requests: list[str] = []
                page.on("request", lambda r, seen=requests: seen.append(r.url))
                page.goto(pages["review"].as_uri())
                assert requests == [pages["review"].as_uri()]  # NB: self-contained
                # the review mark beside the review-failed PASS, in the same cell
                verdict = page.locator("#round-2 td.verdict")
                assert verdict.inner_text().startswith("✓ PASS")
                mark = verdict.locator(".review-mark")
                assert mark.is_visible() and mark.inner_text() == "⚠ review fail"
                vb, mb = verdict.bounding_box(), mark.bounding_box()
                assert vb["y"] <= mb["y"] <= vb["y"] + vb["height"]
                counted = page.locator("#round-2 td.counted-cell").inner_text()
                assert counted == "not counted: review failed"
                assert "kernel.py:7" in page.locator("#round-2 td.review").inner_text()
                assert page.locator("#round-4 td.counted-cell").inner_text() == "counted"
                assert "1 counted" in page.locator("#counted-summary").inner_text()
                # the FAIL round's marker: drawn inside the round chart, with its hover text
                fail = page.locator('#chart-round g.pt[data-round="1"]')
                assert fail.get_attribute("data-verdict") == "FAIL"
                assert fail.locator("path.pt-FAIL").is_visible()
                fb = fail.locator("path.pt-FAIL").bounding_box()
                cb = page.locator("#chart-round").bounding_box()
                assert cb["x"] <= fb["x"] and fb["x"] + fb["width"] <= cb["x"] + cb["width"]
                assert cb["y"] <= fb["y"] and fb["y"] + fb["height"] <= cb["y"] + cb["height"]
                title = fail.locator("title").text_content()
                assert title.startswith("round 1: FAIL") and "not counted" in title
                key = page.locator('.chart-key[data-axis="round"]')
                assert key.is_visible() and "review not passed: not counted (1)" in key.inner_text()
                # the best-so-far line never passes through the review-failed PASS
                best = page.locator("#chart-round circle.best-pt")
                assert [best.nth(i).get_attribute("data-round") for i in range(best.count())] == [
                    "4"
                ]
                # unknown usage: a note a reader sees, no empty frame
                for axis in ("tokens", "calls"):
                    note = page.locator(f'.usage-unknown[data-axis="{axis}"]')
                    assert note.is_visible()
                    assert "usage unknown for 3 of 4 rounds" in note.inner_text()
                    assert page.locator(f"#chart-{axis}").count() == 0
                # the noise band at 0 % is drawn with a height and labelled
                band = page.locator("#chart-round rect.band").bounding_box()
                assert band["height"] >= 2
                label = page.locator("#chart-round text.band-label")
                assert label.is_visible() and label.text_content() == "noise ±0.0%"
                # responsive: each chart fits the viewport, none wider than the page
                for i in range(page.locator("svg.chart").count()):
                    box = page.locator("svg.chart").nth(i).bounding_box()
                    assert box["width"] <= width and box["x"] >= 0
                shot = SHOTS / f"review-{width}.png"
                page.screenshot(path=str(shot), full_page=True)
                assert shot.stat().st_size > 10_000
                page.close()

            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(pages["wide"].as_uri())
            assert page.locator("#chart-round").is_visible()
            assert not page.locator("#chart-round-log").is_visible()
            page.locator("#logscale").check()
            assert page.locator("#chart-round-log").is_visible()
            assert not page.locator("#chart-round").is_visible()
            page.screenshot(path=str(SHOTS / "review-log-1400.png"), full_page=True)
            page.close()

            page = browser.new_page(viewport={"width": 800, "height": 1000})
            page.goto(pages["compare"].as_uri())
            ticks = page.locator("#chart-compare text.xtick").all_text_contents()
            assert ticks == [str(n) for n in range(1, 7)]
            row = page.locator('tr[data-campaign="//tasks/sm:campaign"] td.usage-tokens')
            assert "partial: usage unknown for 3 of 4 rounds" in row.inner_text()
            page.screenshot(path=str(SHOTS / "compare-800.png"), full_page=True)
            page.close()
        finally:
            browser.close()
