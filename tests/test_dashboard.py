"""The campaign dashboard (issue 16): the `<campaign>.dashboard` build target (a self-contained
HTML report, content-addressed like every node), `rsi dashboard` (live, read-only, localhost)
and both in a real browser (Debian's chromium driven by playwright): the plotted points are the
evidence's numbers, a screenshot is saved under out/dashboard/.

Hostile inputs too: an agent's hypothesis or reason holding HTML is escaped, unknown usage is
"unknown" and never 0, a round that did not pass never shows a speedup as counting."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dashboard_support as S  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SOFTMAX = REPO / "tasks" / "softmax"
SHOTS = REPO / "out" / "dashboard"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def dash():
    return S.harness("dashboard")


def rendered(c: dict, live=None) -> tuple[dict, str]:
    d = dash()
    v = d.view(c["report"], c["docs"], c["verdicts"], c["meta"], live=live)
    return v, d.render_html(v)


def row_html(html: str, n: int) -> str:
    m = re.search(rf'<tr id="round-{n}".*?</tr>', html, re.S)
    assert m, f"no row for round {n}"
    return m.group(0)


# ===================================================================================== unit


@pytest.mark.fast
def test_plotted_points_and_best_so_far_are_the_evidence_numbers():
    c = S.campaign(20, seed=3)
    v, html = rendered(c)
    docs = {d["round"]: d for d in c["docs"]}
    found = re.findall(
        r'<g class="pt" data-round="(\d+)" data-x="([^"]*)" data-point="([^"]*)" '
        r'data-lo="([^"]*)" data-hi="([^"]*)" data-verdict="(\w+)"',
        html.split('id="chart-round"')[1].split("</svg>")[0],
    )
    # NB: every judged round is on the chart; one without a measured speedup on the strip
    assert {int(p[0]) for p in found} == set(docs)
    points = [p for p in found if p[2]]
    measured = {n: d for n, d in docs.items() if d["speedup"]}
    assert {int(p[0]) for p in points} == set(measured)
    for n, x, point, lo, hi, verdict in points:
        sp = measured[int(n)]["speedup"]
        assert float(x) == int(n)
        assert float(point) == pytest.approx(sp["point"], rel=1e-5)
        assert (float(lo), float(hi)) == pytest.approx((sp["lo"], sp["hi"]), rel=1e-5)
        assert verdict == measured[int(n)]["verdict"]
    best, expect = None, {}
    for n in sorted(docs):
        if docs[n]["verdict"] == "PASS":
            best = max(best or 0, docs[n]["speedup"]["point"])
        if best is not None:
            expect[n] = best
    got = {r["round"]: r["best_so_far"] for r in v["rounds"] if r["best_so_far"] is not None}
    assert got == expect
    band = re.search(r'class="band" data-lo="([^"]*)" data-hi="([^"]*)"', html)
    assert float(band.group(1)) == pytest.approx(1 / 1.012, rel=1e-5)
    assert float(band.group(2)) == pytest.approx(1.012, rel=1e-5)
    assert 'data-threshold="1.05"' in html


@pytest.mark.fast
def test_wall_time_axis_is_seconds_since_the_campaigns_start():
    c = S.campaign(6, seed=1)
    v, _ = rendered(c)
    assert [r["t_s"] for r in v["rounds"]] == [30.0 * n for n in range(1, 7)]


@pytest.mark.fast
def test_hostile_text_is_escaped():
    c = S.campaign(3, seed=2)
    evil = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    c["report"]["rounds"][0]["hypothesis"] = evil
    c["report"]["rounds"][1]["why"] = [{"code": "x</code><script>", "detail": evil}]
    c["report"]["rounds"][1]["verdict"] = "FAIL"
    c["report"]["rounds"][1]["speedup_counts"] = False
    c["report"]["campaign"] = '//p:"><script>c</script>'
    _, html = rendered(c)
    assert "<script>alert" not in html and "<img src=x" not in html
    assert "<script>c</script>" not in html and "x</code><script>" not in html
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in html
    assert "<script" not in html  # NB: the static report has no script at all


@pytest.mark.fast
def test_unknown_usage_is_unknown_never_zero_and_a_real_zero_is_zero():
    c = S.campaign(3, seed=5)
    c["report"]["rounds"][0]["usage"] = {}
    c["report"]["rounds"][1]["usage"] = {
        "tokens": {"input": 0, "output": 0, "cached": 0},
        "calls": 0,
        "wall_s": 0.0,
        "device_s": 0.0,
    }
    v, html = rendered(c)
    r1, r2 = row_html(html, 1), row_html(html, 2)
    for cls in ("cost-tokens", "cost-calls", "cost-wall", "cost-device"):
        assert re.search(rf'class="num {cls}"><span class="unknown">unknown</span>', r1), cls
        assert re.search(rf'class="num {cls}">0(\.0)?</td>', r2), cls
    # NB: a sum over a round that reported nothing is unknown: not placed on the cost axes
    assert v["rounds"][0]["cum_cost"]["tokens"] is None
    assert all(r["cum_cost"]["calls"] is None for r in v["rounds"])
    tokens = next(ch for ch in dash().charts(v) if ch["axis"] == "tokens")
    assert tokens["points"] == [] and tokens["unplaced"] == [1, 2, 3]
    assert "not placed: unknown on this axis" in html
    text = dash().render_text(v)
    assert "unknown" in text.splitlines()[5] and "None" not in text


@pytest.mark.fast
def test_a_round_that_did_not_pass_never_shows_its_speedup_as_counting():
    c = S.campaign(2, seed=0)
    c["docs"] = [
        S.round_doc(1, "PASS", 1.3, {}, "ok"),
        S.round_doc(2, "FAIL", 2.4, {}, "fast but wrong"),
    ]
    c["docs"][1]["correctness"]["cases"][1].update(
        passed=False, reason="wrong_output", detail="max abs err 0.3"
    )
    report = S.harness("report")
    c["report"] = report.report(
        "//p:c", c["docs"], S.harness("selection").select(c["docs"]), {"state": "pending"}
    )
    v, html = rendered(c)
    row = row_html(html, 2)
    assert "2.400x" not in row and "not counted" in row
    assert "<code>transposed_f32</code>: wrong_output" in row
    assert "✗ FAIL" in row and 'data-verdict="FAIL"' in row
    assert "1.300x" in row_html(html, 1)
    assert v["rounds"][1]["best_so_far"] == 1.3  # the FAIL round's 2.4 never becomes best
    assert 'data-round="2" data-x="2" data-point="2.4"' in html  # plotted, marked not counted
    assert re.search(r'data-round="2"[^>]*data-verdict="FAIL" data-counts="false"', html)
    text = dash().render_text(v)
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("2 "))
    assert "not counted" in line and "2.400 " not in line and "transposed_f32" in line


@pytest.mark.fast
def test_the_page_is_self_contained_deterministic_and_accessible(tmp_path):
    c = S.campaign(12, seed=4)
    v1, html = rendered(c)
    assert rendered(c)[1] == html
    # NB: no fetch at view time: no external URL but the SVG namespace, no <link>, no src=
    urls = set(re.findall(r"https?://[^\s\"'<>]+", html))
    assert urls <= {"http://www.w3.org/2000/svg"}, urls
    assert "<link" not in html and " src=" not in html and "@import" not in html
    # NB: no host path, no clock
    assert str(REPO) not in html and "/tmp/" not in html
    assert not re.search(r"20\d\d-\d\d-\d\dT", html)
    # NB: table headers, chart text alternatives, verdict words and symbols beside colour
    assert html.count('<th scope="col"') >= 12
    for svg in re.findall(r"<svg[^>]*>", html):
        assert 'role="img"' in svg and "aria-labelledby" in svg
    assert len(re.findall(r"<desc id=", html)) == len(re.findall(r"<svg ", html)) >= 2
    for r in v1["rounds"]:
        assert f"{r['symbol']} {r['verdict']}" in row_html(html, r["round"])
    # NB: the same bytes from a separate process in another folder
    (tmp_path / "in").mkdir()
    args = []
    for name, doc in (("report", c["report"]), ("meta", c["meta"])):
        (tmp_path / "in" / f"{name}.json").write_text(json.dumps(doc))
        args += [f"--{name}", str(tmp_path / "in" / f"{name}.json")]
    for d in c["docs"]:
        p, q = tmp_path / "in" / f"r{d['round']}.json", tmp_path / "in" / f"v{d['round']}.json"
        p.write_text(json.dumps(d))
        q.write_text(json.dumps(c["verdicts"][d["round"]]))
        args += ["--round", str(p), "--verdict", str(q)]
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-I",
            "-B",
            str(S.HARNESS / "dashboard.py"),
            *args,
            "--out-html",
            str(out / "index.html"),
            "--out-json",
            str(out / "dashboard.json"),
            "--out-txt",
            str(out / "summary.txt"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert (out / "index.html").read_text() == html
    assert json.loads((out / "dashboard.json").read_text()) == v1
    assert (out / "summary.txt").read_text() == dash().render_text(v1)


@pytest.mark.fast
def test_text_summary_has_the_pages_fields():
    c = S.campaign(8, seed=6)
    v, _ = rendered(c)
    text = dash().render_text(v)
    for field in ("noise floor", "threshold", "interval", "tokens", "calls", "wall_s"):
        assert field in text
    for field in ("device_s", "evidence", "best: round", "final: PASS", "fingerprint"):
        assert field in text
    assert "cpu_model=Synthetic CPU @ 3.0GHz" in text
    assert "re-measure of round" in text


@pytest.mark.fast
def test_live_extras_pending_rounds_and_reuse_from_another_campaign():
    c = S.campaign(3, seed=7)
    live = {
        "pending": [
            {
                "round": 4,
                "label": "//tasks/sm:campaign.round-4",
                "hypothesis": "next",
                "candidate_digest": "x",
                "submitted_at": S.START + 200,
                "usage": {},
                "detail": "being judged now",
            }
        ],
        "reuse": {2: {"reused": True, "from": {"campaign": "//tasks/sm:other", "round": 5}}},
    }
    v, html = rendered(c, live=live)
    assert [r["state"] for r in v["rounds"]] == ["judged", "judged", "judged", "pending"]
    assert "… pending" in row_html(html, 4) and "being judged now" in row_html(html, 4)
    assert "reused from <code>//tasks/sm:other</code> round 5" in row_html(html, 2)
    assert "measured" in row_html(html, 1)


@pytest.mark.fast
def test_the_dashboard_target_is_a_host_python_action_over_the_evidence(tmp_path, make_workspace):
    from rsi.analysis import analyze
    from rsi.digest import digest_bytes
    from rsi.label import Label
    from rsi.loader import Loader
    from rsi.registry import load_rules
    from rules.campaign import CampaignLog
    from rules.domain import host_python_identity

    ws = make_workspace(tmp_path, workspace_files())
    store = tmp_path / "store"
    log = CampaignLog(store, "//tasks/sm:campaign")
    with log.locked():
        log.append({"kind": "start", "time": 5.0, "campaign": "//tasks/sm:campaign"})
        for i, name in enumerate(("vectorised", "wrong"), 1):
            text = (ws / "cands" / name / "kernel.py").read_bytes()
            log.append(
                {
                    "kind": "candidate",
                    "time": 5.0 + i,
                    "digest": f"d{i}",
                    "files": {"kernel.py": str(digest_bytes(text))},
                    "executable": [],
                    "hypothesis": name,
                    "usage": {},
                }
            )
    label = Label.parse("//tasks/sm:campaign.dashboard")
    graph = analyze(
        Loader(ws, load_rules(), {"store": str(store)}),
        [label],
        store_put=digest_bytes,
        settings={},
    )
    (action_id,) = [
        a for a in graph.target_actions[label] if graph.actions[a].mnemonic == "Dashboard"
    ]
    spec = graph.actions[action_id]
    # NB: the dashboard's interpreter identity covers what dashboard.py imports (jinja2)
    assert dict(spec.platform) == {"toolchain": host_python_identity(("dashboard",))}
    paths = {a.path for a in spec.inputs}
    assert "_rsi/harness/templates/campaign.html.j2" in paths
    assert "_rsi/harness/dashboard.py" in paths
    assert "tasks/sm/campaign.report/report.json" in paths
    assert sum(1 for p in paths if p.endswith("/round.json")) == 2
    assert sum(1 for p in paths if p.endswith("/verdict.json")) == 2
    assert len(spec.outputs) == 3
    assert {o.rsplit("/", 1)[-1] for o in spec.outputs} == {
        "index.html",
        "dashboard.json",
        "summary.txt",
    }
    meta = next(a for a in spec.inputs if a.path.endswith("campaign.dashboard/meta.json"))
    assert meta.digest is not None


# ====================================================================================== e2e

NAIVE = (SOFTMAX / "baseline" / "kernel.py").read_text() if (SOFTMAX / "baseline").is_dir() else ""
CANDIDATES = {
    "vectorised": "import numpy as np\n\n\ndef softmax(x):\n"
    "    e = np.exp(x - x.max(axis=-1, keepdims=True))\n"
    "    return e / e.sum(axis=-1, keepdims=True)\n",
    "wrong": "import numpy as np\n\n\ndef softmax(x):\n"
    "    e = np.exp(x - x.max(axis=0, keepdims=True))\n"
    "    return e / e.sum(axis=0, keepdims=True)\n",
    "syntax": "import numpy as np\n\ndef softmax(x:\n    return x\n",
}
BASELINE = (
    "import numpy as np\n\n\ndef softmax(x):\n    rows = x.reshape(-1, x.shape[-1])\n"
    "    out = np.empty(rows.shape, dtype=x.dtype)\n    for i in range(rows.shape[0]):\n"
    "        r = rows[i].astype(np.float64)\n        r = np.exp(r - r.max())\n"
    "        out[i] = r / r.sum()\n    return out.reshape(x.shape)\n"
)
BUILD = """\
[task]
rule = "task"
runtime = ["workloads.py", "oracle.py"]
baseline = "baseline"
framework = "numpy"
entry = {module = "kernel", function = "softmax"}
editable = ["kernel.py"]
tolerances = {float32 = {atol = 1e-06, rtol = 1e-05}}
cases = [
  {name = "normal_f32", shape = [16, 128], dtype = "float32", kind = "normal"},
  {name = "transposed_f32", shape = [24, 40], dtype = "float32", kind = "transposed"},
]

[small]
rule = "binding"
task = ":task"
measure.workload = {name = "bench", shape = [64, 1024], dtype = "float32", kind = "normal"}
measure.warmups = 1
measure.samples = 3
measure.pairs = 6
measure.probes = 4
measure.metric = "latency"
measure.direction = "minimize"
assess = {min_improvement = 0.05, confidence = 0.95, bootstrap_resamples = 200, min_pairs = 5}

[campaign]
rule = "campaign"
binding = ":small"
rounds = {up_to = 6}

[other]
rule = "campaign"
binding = ":small"
rounds = {up_to = 3}
"""
C = "//tasks/sm:campaign"


def workspace_files() -> dict:
    files: dict[str, str | bytes] = {
        "tasks/sm/BUILD.toml": BUILD,
        "tasks/sm/oracle.py": (SOFTMAX / "oracle.py").read_bytes(),
        "tasks/sm/workloads.py": (SOFTMAX / "workloads.py").read_bytes(),
        "tasks/sm/baseline/kernel.py": BASELINE,
    }
    for name, text in CANDIDATES.items():
        files[f"cands/{name}/kernel.py"] = text
    return files


def rsi_json(run_rsi, ws: Path, *args: str) -> dict:
    run = run_rsi(ws, *args, "--json", timeout=600)
    assert run.returncode == 0, str(run)
    return run.json()


def submit(run_rsi, ws: Path, name: str, hypothesis: str, usage: dict | None, campaign=C) -> dict:
    args = ["round", campaign, "--from", str(ws / "cands" / name), "--hypothesis", hypothesis]
    if usage is not None:
        path = ws.parent / f"usage-{name}.json"
        path.write_text(json.dumps(usage))
        args += ["--usage", str(path)]
    return rsi_json(run_rsi, ws, *args)


@pytest.fixture(scope="module")
def campaign_ws(tmp_path_factory, make_workspace, run_rsi):
    """A workspace whose campaign has two judged rounds: a fast one (PASS, or INCONCLUSIVE on
    a busy host) and a wrong-output FAIL."""
    tmp = tmp_path_factory.mktemp("dash")
    ws = make_workspace(tmp, workspace_files())
    usage = {"tokens": {"input": 1200, "output": 300, "cached": None}, "calls": 2}
    r1 = submit(run_rsi, ws, "vectorised", "<script>alert(1)</script> vectorise", usage)
    r2 = submit(run_rsi, ws, "wrong", "normalise over the batch", None)
    assert r1["verdict"] in ("PASS", "INCONCLUSIVE"), r1
    assert r2["verdict"] == "FAIL", r2
    return ws


@pytest.mark.e2e
def test_the_html_report_builds_as_a_target_from_the_evidence(campaign_ws, build):
    ws = campaign_ws
    run = build(ws, f"{C}.dashboard")
    assert any(e.get("mnemonic") == "Dashboard" for e in run.finished()), str(run)
    page = ws / "out" / "tasks" / "sm" / "campaign.dashboard" / "index.html"
    html = page.read_text()
    assert "&lt;script&gt;alert(1)&lt;/script&gt; vectorise" in html and "<script" not in html
    assert str(ws) not in html and str(REPO) not in html
    # NB: every evidence link resolves to a file the build copied under out/
    links = re.findall(r'<a href="([^"#][^"]*)"', html)
    assert len(links) >= 10
    for href in links:
        assert (page.parent / href).resolve().is_file(), href
    docs = {
        n: json.loads((page.parent / href).read_text())
        for n in (1, 2)
        for href in re.findall(rf'<tr id="round-{n}".*?href="([^"]*round\.json)"', html, re.S)
    }
    chart = re.search(r'<svg id="chart-round".*?</svg>', html, re.S).group(0)
    pts = dict(
        re.findall(r'<g class="pt" data-round="(\d+)" data-x="[^"]*" data-point="([^"]+)"', chart)
    )
    assert set(pts) == {str(n) for n, d in docs.items() if d["speedup"]}
    for n, point in pts.items():
        assert float(point) == pytest.approx(docs[int(n)]["speedup"]["point"], rel=1e-5)
    again = build(ws, f"{C}.dashboard")
    # NB: the same evidence gives the same action key, so the same bytes (a cache hit); a
    # measurement on a busy host is never cached, so it is measured again: new evidence
    remeasured = any(
        e.get("mnemonic") in ("Measure", "Calibrate") and e.get("cache") == "miss"
        for e in again.finished()
    )
    if not remeasured:
        assert not any(
            e.get("mnemonic") == "Dashboard" and e.get("cache") == "miss" for e in again.finished()
        )
        assert page.read_text() == html
    summary = (page.parent / "summary.txt").read_text()
    assert "✗ FAIL" in summary and "unknown" in summary and "unknownx" not in summary


def start_dashboard(ws: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "rsi.cli", "dashboard", "--port", "0", "--interval", "0.3", *extra],
        cwd=ws,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    line = proc.stdout.readline()
    m = re.search(r"serving (http://\S+)", line)
    if not m:
        proc.kill()
        raise AssertionError(f"no URL: {line!r} {proc.stderr.read()}")
    return proc, m.group(1)


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def get(url: str, method: str = "GET") -> tuple[int, str]:
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def store_snapshot(ws: Path) -> dict[str, int]:
    root = ws / "cache"
    return {
        str(p.relative_to(root)): p.stat().st_mtime_ns
        for p in root.rglob("*")
        if p.is_file() and p.name != "lock"
    }


def wait_for(cond, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.e2e
def test_rsi_dashboard_serves_read_only_on_localhost_and_refreshes(campaign_ws, run_rsi):
    ws = campaign_ws
    before = store_snapshot(ws)
    proc, url = start_dashboard(ws)
    try:
        assert url.startswith("http://127.0.0.1:")
        status, index = get(url)
        assert status == 200 and C in index and "//tasks/sm:other" in index
        status, page = get(url + "campaign?c=" + urllib.request.quote(C, safe=""))
        assert status == 200 and "EventSource" in page and "&lt;script&gt;alert(1)" in page
        assert get(url, "POST")[0] == 405
        assert get(url + "evidence/" + "0" * 64 + "/1")[0] == 404
        status, compare = get(url + "compare?task=" + urllib.request.quote("//tasks/sm:task"))
        assert status == 200 and 'data-campaign="//tasks/sm:campaign"' in compare
        api = json.loads(get(url + "api/campaign?c=" + urllib.request.quote(C, safe=""))[1])
        assert [r["verdict"] for r in api["view"]["rounds"]][1:] == ["FAIL"]
        link = api["view"]["rounds"][0]["links"]["round.json"]
        assert json.loads(get(url.rstrip("/") + link)[1])["round"] == 1
        assert store_snapshot(ws) == before  # NB: serving wrote nothing to the store
        events: list[str] = []
        reader = threading.Thread(target=_read_events, args=(url + "events", events), daemon=True)
        reader.start()
        wait_for(lambda: events, 30, "the first version event")
        first = json.loads(events[0])[C]
        submit(run_rsi, ws, "syntax", "a typo", None)
        wait_for(
            lambda: len(events) > 1 and json.loads(events[-1])[C] != first, 60, "a new version"
        )

        def judged():
            api = json.loads(get(url + "api/campaign?c=" + urllib.request.quote(C, safe=""))[1])
            rounds = api["view"]["rounds"]
            return rounds if len(rounds) == 3 and rounds[-1]["state"] == "judged" else None

        # NB: the round shows as pending as soon as it is logged, judged once it is
        rounds = wait_for(judged, 60, "round 3's verdict")
        assert rounds[-1]["verdict"] == "FAIL"
        assert rounds[-1]["failure_kind"] == "syntax_error"
    finally:
        stop(proc)


def _read_events(url: str, out: list[str]) -> None:
    try:
        with urllib.request.urlopen(url, timeout=120) as resp:
            for raw in resp:
                line = raw.decode().rstrip("\n")
                if line.startswith("data: "):
                    out.append(line[len("data: ") :])
    except OSError:
        return


def _browser():
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


@pytest.mark.e2e
def test_in_a_real_browser_the_points_are_the_evidence_and_the_live_page_updates(
    campaign_ws, build, run_rsi
):
    sync_playwright = _browser()
    ws = campaign_ws
    build(ws, f"{C}.dashboard")
    page_path = ws / "out" / "tasks" / "sm" / "campaign.dashboard" / "index.html"
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1250, "height": 1000})
            requests: list[str] = []
            page.on("request", lambda r: requests.append(r.url))
            page.goto(page_path.as_uri())
            # NB: the static report loads nothing but itself
            assert requests == [page_path.as_uri()]
            pts = page.eval_on_selector_all(
                "#chart-round g.pt[data-measured=true]",
                "els => els.map(e => ({round: +e.dataset.round, point: +e.dataset.point,"
                " lo: +e.dataset.lo, hi: +e.dataset.hi, verdict: e.dataset.verdict}))",
            )
            measured = 0
            for n in range(1, page.locator("#rounds tbody tr").count() + 1):
                href = page.get_attribute(f'#round-{n} a:text("round.json")', "href")
                measured += bool(json.loads((page_path.parent / href).read_text())["speedup"])
            assert len(pts) == measured
            for pt in pts:
                href = page.get_attribute(f'#round-{pt["round"]} a:text("round.json")', "href")
                doc = json.loads((page_path.parent / href).read_text())
                sp = doc["speedup"]
                assert pt["verdict"] == doc["verdict"]
                assert (pt["point"], pt["lo"], pt["hi"]) == pytest.approx(
                    (sp["point"], sp["lo"], sp["hi"]), rel=1e-5
                )
            assert page.locator("#rounds thead th[scope=col]").count() >= 10
            charts = page.locator("svg[role=img]").count()
            assert charts >= 2 and page.locator("svg[role=img] > title").count() == charts
            shot = SHOTS / "report.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000

            proc, url = start_dashboard(ws)
            try:
                live = browser.new_page(viewport={"width": 1250, "height": 1000})
                live.goto(url + "campaign?c=" + urllib.request.quote(C, safe=""))
                live.wait_for_selector("#live-status:text('live: connected')", timeout=30_000)
                n = live.locator("#rounds tbody tr").count()
                live.evaluate("window.__same_document = true")
                submit(
                    run_rsi,
                    ws,
                    "vectorised",
                    "same content, another campaign",
                    None,
                    campaign="//tasks/sm:other",
                )
                other = browser.new_page(viewport={"width": 1250, "height": 1000})
                other.goto(url + "campaign?c=" + urllib.request.quote("//tasks/sm:other", safe=""))
                # NB: the page may first show the round as logged, then as judged
                other.wait_for_selector("#round-1:not([data-verdict=pending])", timeout=60_000)
                assert "reused from" in other.inner_text("#round-1")
                other.close()
                # NB: a round landing in this campaign updates the open page without a reload
                (ws / "cands" / "third").mkdir(exist_ok=True)
                (ws / "cands" / "third" / "kernel.py").write_text(
                    CANDIDATES["vectorised"] + "\n# the same code, new bytes\n"
                )
                submit(run_rsi, ws, "third", "same code, new bytes", None)
                live.locator("#rounds tbody tr").nth(n).wait_for(timeout=60_000)
                live.locator(f"#round-{n + 1}:not([data-verdict=pending])").wait_for(timeout=60_000)
                assert live.inner_text("#live-status") == "live: connected"
                assert live.evaluate("window.__same_document") is True
                shot = SHOTS / "live.png"
                live.screenshot(path=str(shot), full_page=True)
                assert shot.stat().st_size > 10_000
            finally:
                stop(proc)
        finally:
            browser.close()
