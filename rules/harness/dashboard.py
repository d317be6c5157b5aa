"""A campaign's dashboard: the report's rounds, selection and final as a self-contained HTML page
(inline CSS and SVG, nothing fetched at view time), a JSON view model (rsi.campaign.dashboard/1)
and a text summary with the same fields, for terminals and agents.

A pure function of its inputs (the report, each round's document and verdict, and a meta file
naming the campaign's start, kind and the relative links to the evidence): the same evidence
gives the same bytes. No clock, no absolute path, no randomness. Needs jinja2 (a dependency of
rsi); its templates are the files under templates/ next to this script. `rsi dashboard` renders
live pages with the same functions (`live` adds a refresh script and what only the live store
knows: rounds not judged yet, evidence reused from another campaign).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

SCHEMA = "rsi.campaign.dashboard/1"
TEMPLATES = Path(__file__).resolve().parent / "templates"
EVIDENCE_NAMES = ("round.json", "verdict.json", "check.json", "samples.json", "verdict.txt")
COST_FIELDS = ("tokens", "calls", "wall_s", "device_s")
# NB: every verdict has a symbol and a word next to its colour: colour never carries it alone
SYMBOLS = {
    "PASS": "✓",
    "FAIL": "✗",
    "INCONCLUSIVE": "?",
    "abandoned": "⊘",
    "pending": "…",
    "none": "–",
}
FINGERPRINT_KEYS = (
    "device",
    "cpu_model",
    "machine",
    "python",
    "numpy",
    "torch",
    "cuda",
    "toolchain",
    "gpu_name",
    "gpu_driver",
    "gpu_compute_capability",
    "gpu_memory_bytes",
    "gpu_peak_gb_s",
)


def _tokens(usage: dict | None) -> int | None:
    """Input plus output tokens (cached ones are part of the input); unknown when either is."""
    t = (usage or {}).get("tokens") or {}
    if t.get("input") is None or t.get("output") is None:
        return None
    return t["input"] + t["output"]


def cost_of(usage: dict | None) -> dict:
    u = usage or {}
    return {
        "tokens": _tokens(u),
        "calls": u.get("calls"),
        "wall_s": u.get("wall_s"),
        "device_s": u.get("device_s"),
    }


def _failing_case(doc: dict) -> dict | None:
    for case in (doc.get("correctness") or {}).get("cases") or []:
        if case.get("passed") is False:
            return {k: case.get(k) for k in ("name", "reason", "detail")}
    return None


def _noise(docs: list[dict]) -> dict:
    """The binding's noise floor (the A/A calibration's delta) and threshold: the most common
    over the measured rounds (one calibration per binding; a regrade may move the threshold)."""

    def common(key: str):
        seen = [d.get(key) for d in docs if d.get(key) is not None]
        return max(sorted(set(seen)), key=seen.count) if seen else None

    delta, threshold = common("noise_floor"), common("threshold")
    band = None if delta is None else [1.0 / (1.0 + delta), 1.0 + delta]
    return {"delta": delta, "band": band, "threshold": threshold}


def view(
    report: dict,
    round_docs: list[dict],
    verdicts: dict[int, dict],
    meta: dict,
    live: dict | None = None,
) -> dict:
    """The dashboard's view model. `report` is rsi.campaign.report/1; `round_docs` the rounds'
    rsi.campaign.round/1 documents; `verdicts` {round: verdict.json}; `meta` the campaign's
    start time, kind, binding and {round: {name: link}}. `live` (rsi dashboard only): rounds
    still without a verdict (`pending`), and {round: evidence reuse} from the store's index."""
    live = live or {}
    docs = {d["round"]: d for d in round_docs}
    started = meta.get("started_at")
    links = {int(k): v for k, v in (meta.get("links") or {}).items()}
    rows: list[dict] = []
    seen_evidence: dict[str, int] = {}
    for r in report["rounds"]:
        n = r["round"]
        doc = docs.get(n) or {}
        review = _review(doc.get("review"), r.get("review"), r.get("review_findings"))
        counts = _counts(r, doc, review)
        sp = r.get("speedup") or None
        measured = None if not sp or sp.get("point") is None else sp
        evidence = (doc.get("evidence_sha256") or {}).get("verdict")
        reuse = (live.get("reuse") or {}).get(n)
        if reuse is None:
            # NB: the same content under the same binding has the same evidence, judged once
            first = seen_evidence.setdefault(evidence, n) if evidence else n
            reuse = {"reused": first != n, "from": {"round": first} if first != n else None}
        submitted = doc.get("submitted_at")
        rows.append(
            {
                "round": n,
                "label": r["label"],
                "state": "judged",
                "verdict": r["verdict"],
                "symbol": SYMBOLS.get(r["verdict"], "?"),
                "counts": counts,
                "not_counted_why": None if counts else _why_not(r["verdict"], review),
                "review": review,
                "speedup": measured,
                "reasons": [
                    {"code": x.get("code"), "detail": x.get("detail")} for x in r.get("why") or []
                ],
                "reason_codes": list(r.get("reasons") or []),
                "failure_kind": r.get("failure_kind"),
                "failing_case": _failing_case(doc),
                "hypothesis": r.get("hypothesis"),
                "candidate_digest": r.get("candidate_digest"),
                "submitted_at": submitted,
                "t_s": None
                if submitted is None or started is None
                else round(submitted - started, 3),
                "cost": cost_of(r.get("usage")),
                "evidence": reuse,
                "links": links.get(n) or {},
            }
        )
    for a in report.get("abandoned") or []:
        rows.append(_other_row(a, "abandoned", started, a.get("reason")))
    for p in live.get("pending") or []:
        rows.append(_other_row(p, "pending", started, p.get("detail")))
    rows.sort(key=lambda x: x["round"])
    _cumulate(rows)
    best = report.get("best")
    final = report.get("final") or {}
    measured_docs = [docs[n] for n in sorted(docs)]
    return {
        "schema": SCHEMA,
        "campaign": report["campaign"],
        "kind": meta.get("kind"),
        "binding": meta.get("binding"),
        "metric": next((d.get("metric") for d in measured_docs if d.get("metric")), None),
        "direction": next((d.get("direction") for d in measured_docs if d.get("direction")), None),
        "started_at": started,
        "max_rounds": meta.get("max_rounds"),
        "counts": report.get("counts"),
        "counted": sum(1 for r in rows if r["counts"]),
        "review_failed": sum(
            1 for r in rows if r["verdict"] == "PASS" and not r["counts"] and r["state"] == "judged"
        ),
        "noise": _noise(measured_docs),
        "rounds": rows,
        "best": None
        if not best
        else {
            "round": best["round"],
            "label": best["label"],
            "speedup": best.get("speedup"),
            "candidate_digest": best.get("candidate_digest"),
        },
        "selection_rule": report.get("selection_rule"),
        "final": {
            "state": final.get("state") or "unknown",
            "verdict": final.get("verdict"),
            "speedup": final.get("speedup"),
            "selected_round": (final.get("selected") or {}).get("round"),
            "reasons": [
                {"code": x.get("code"), "detail": x.get("detail")}
                for x in final.get("reasons") or []
            ],
            "message": final.get("message"),
            "links": meta.get("final_links") or {},
        },
        "usage": report.get("usage"),
        "usage_unknown": _usage_unknown(rows),
        "fingerprints": _fingerprints(verdicts),
        "live": bool(live),
    }


def _review(summary: dict | None, verdict: str | None, findings: list | None) -> dict | None:
    """The independent review as the page shows it: pass, fail or inconclusive with its
    findings (file and line); None when the round has none (an external project)."""
    if summary is None and verdict is None:
        return None
    summary = summary or {}
    found = summary.get("findings") if summary.get("findings") is not None else findings or []
    return {
        "verdict": summary.get("verdict") or verdict,
        "n_findings": summary.get("n_findings", len(found)),
        "findings": [
            {k: f.get(k) for k in ("rule", "severity", "file", "line", "detail")} for f in found
        ],
    }


def _counts(row: dict, doc: dict, review: dict | None) -> bool:
    """Counted: the verdict is PASS and the review passed or there is none (`accepted` in the
    round document). Every source must agree: any one saying no makes it not counted."""
    if row["verdict"] != "PASS" or (review is not None and review["verdict"] != "pass"):
        return False
    return all(
        bool(x)
        for x in (
            row.get("speedup_counts", True),
            row.get("accepted", True),
            doc.get("accepted", True),
        )
    )


def _why_not(verdict: str, review: dict | None) -> str:
    if verdict == "PASS":
        if review is None or review["verdict"] == "pass":
            return "not accepted"
        return "review failed" if review["verdict"] == "fail" else f"review {review['verdict']}"
    return {"abandoned": "abandoned", "pending": "not judged yet"}.get(verdict, verdict)


def _usage_unknown(rows: list[dict]) -> dict:
    """Per usage field, how many of the rounds did not report it (their own cost, not the sum)."""
    out = {"rounds": len(rows)}
    for k in COST_FIELDS:
        out[k] = sum(1 for r in rows if r["cost"][k] is None)
    return out


def _other_row(entry: dict, state: str, started, why) -> dict:
    usage = entry.get("usage")
    submitted = entry.get("time") if state == "abandoned" else entry.get("submitted_at")
    return {
        "round": entry["round"],
        "label": entry.get("label"),
        "state": state,
        "verdict": state,
        "symbol": SYMBOLS[state],
        "counts": False,
        "not_counted_why": _why_not(state, None),
        "review": None,
        "speedup": None,
        "reasons": [{"code": state, "detail": why}] if why else [],
        "reason_codes": [state],
        "failure_kind": None,
        "failing_case": None,
        "hypothesis": entry.get("hypothesis"),
        "candidate_digest": entry.get("candidate_digest"),
        "submitted_at": submitted,
        "t_s": None if submitted is None or started is None else round(submitted - started, 3),
        "cost": cost_of(usage),
        "evidence": None,
        "links": {},
    }


def _cumulate(rows: list[dict]) -> None:
    """Best-so-far speedup (counted rounds only) and cumulative cost after each round. A sum over
    rounds one of which did not report a field is unknown (null), never a smaller number."""
    best = None
    total = {k: 0 for k in COST_FIELDS}
    for row in rows:
        if row["counts"] and row["speedup"]:
            point = row["speedup"]["point"]
            best = point if best is None else max(best, point)
        row["best_so_far"] = best
        for k in COST_FIELDS:
            v = row["cost"][k]
            total[k] = None if total[k] is None or v is None else total[k] + v
        row["cum_cost"] = dict(total)


def _fingerprints(verdicts: dict[int, dict]) -> list[dict]:
    groups: dict[str, dict] = {}
    for n in sorted(verdicts):
        fp = (verdicts[n] or {}).get("fingerprint")
        if not isinstance(fp, dict):
            continue
        # NB: on a CPU the GPU fields say nothing (null by design): left out, not "unknown"
        cpu = fp.get("device") == "cpu"
        fields = {k: fp.get(k) for k in FINGERPRINT_KEYS if not (cpu and k.startswith("gpu_"))}
        key = json.dumps(fields, sort_keys=True)
        groups.setdefault(key, {"fields": fields, "rounds": []})["rounds"].append(n)
    return list(groups.values())


# ------------------------------------------------------------------------------------- charts

W, H = 560, 250
PAD_L, PAD_R, PAD_T, PAD_B = 52, 74, 14, 40
STRIP = 10  # px above the x axis where rounds without a measured speedup are marked
MIN_BAND_PX = 4.0  # NB: a noise floor of 0 % is still drawn (and labelled), never invisible
WIDE = 3.0  # hi/lo ratio of the plotted speedups from which a log-scale view is offered
USAGE_AXES = ("tokens", "calls")
AXES = (
    ("round", "round", "best-so-far speedup against round"),
    ("t_s", "seconds since the campaign's start (submission)", "best-so-far speedup against time"),
    ("tokens", "cumulative tokens (input + output)", "best-so-far speedup against tokens"),
    ("calls", "cumulative agent calls", "best-so-far speedup against calls"),
)
# NB: the marker says the verdict and whether it counts; the legend and each <title> say it too
MARKERS = (
    ("counted", "● PASS, counted"),
    ("review", "◎ PASS, review not passed: not counted"),
    ("INCONCLUSIVE", "□ INCONCLUSIVE: not counted"),
    ("FAIL", "✗ FAIL: not counted (on the bottom strip when nothing was measured)"),
)


def _num(x: float) -> str:
    """A stable short text for a coordinate or a plotted value (the same bytes every run)."""
    if x is None:
        return ""
    return format(float(x), ".6g")


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    out, v = [], first
    while v <= hi + step * 1e-9:
        out.append(round(v, 12))
        v += step
    return out


def _log_ticks(lo: float, hi: float) -> list[float]:
    """1-2-5 ticks between lo and hi (speedups, > 0)."""
    out = []
    for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        for m in (1, 2, 5):
            t = round(m * 10.0**e, 12)
            if lo <= t <= hi:
                out.append(t)
    return out or [lo]


def _x_of(row: dict, axis: str):
    if axis == "round":
        return row["round"]
    if axis == "t_s":
        return row["t_s"]
    return row["cum_cost"].get(axis)


def _kind(row: dict) -> str:
    if row["counts"]:
        return "counted"
    return "review" if row["verdict"] == "PASS" else row["verdict"]


def _speedups(rows: list[dict]) -> list[float]:
    ys = []
    for r in rows:
        sp = r["speedup"]
        if sp:
            ys += [y for y in (sp.get("lo"), sp["point"], sp.get("hi")) if y is not None and y > 0]
    return ys


def wide(v: dict) -> bool:
    """Whether the measured speedups span enough (hi/lo >= WIDE, 1 included) for a log view."""
    ys = _speedups([r for r in v["rounds"] if r["state"] == "judged"]) + [1.0]
    return max(ys) / min(ys) >= WIDE


def chart(v: dict, axis: str, xlabel: str, title: str, scale: str = "linear") -> dict:
    """One panel: every judged round (a measured one's interval as an error bar; one without
    a measured speedup as a ✗ on the bottom strip), the best-so-far step line through counted
    rounds only, the noise floor as a labelled band around 1 (never thinner than MIN_BAND_PX)
    and the threshold as a dashed line. Points carry data-* attributes with the plotted
    numbers, and each a <title> (the hover text). `scale` "log": the speedup axis in log10."""
    rows = [r for r in v["rounds"] if r["state"] == "judged"]
    placed = [(r, _x_of(r, axis)) for r in rows]
    plotted = [(r, x) for r, x in placed if x is not None]
    unplaced = [r["round"] for r, x in placed if x is None]
    noise = v["noise"]
    log = scale == "log"
    ys = [1.0] + _speedups([r for r, _ in plotted])
    if noise["band"]:
        ys += noise["band"]
    if noise["threshold"]:
        ys.append(noise["threshold"])
    f = (lambda y: math.log10(y)) if log else (lambda y: y)
    ys = [f(y) for y in ys if not log or y > 0]
    y0, y1 = min(ys), max(ys)
    span = (y1 - y0) or 0.1
    y0, y1 = y0 - span * 0.08, y1 + span * 0.08
    xs = [x for _, x in plotted] or [0, 1]
    x0, x1 = (0 if axis != "round" else 1), max(xs)
    if axis == "round":
        x0, x1 = 0.5, max(x1, 1) + 0.5
    elif x1 <= x0:
        x1 = x0 + 1
    pw, ph = W - PAD_L - PAD_R, H - PAD_T - PAD_B
    bottom = PAD_T + ph

    def px(x: float) -> float:
        return round(PAD_L + (x - x0) / (x1 - x0) * pw, 2)

    def py(y: float) -> float:
        fy = f(y) if y > 0 or not log else y0
        return round(PAD_T + (1 - (min(max(fy, y0), y1) - y0) / (y1 - y0)) * ph, 2)

    points, best_pts = [], []
    for r, x in plotted:
        sp = r["speedup"]
        review = r.get("review") or {}
        base = {
            "round": r["round"],
            "x": x,
            "cx": px(x),
            "verdict": r["verdict"],
            "counts": r["counts"],
            "kind": _kind(r),
            "review": review.get("verdict"),
            "why_not": r.get("not_counted_why"),
            "symbol": r["symbol"],
            "measured": bool(sp),
        }
        if sp:
            lo, hi = sp.get("lo"), sp.get("hi")
            points.append(
                dict(
                    base,
                    point=sp["point"],
                    lo=lo,
                    hi=hi,
                    cy=py(sp["point"]),
                    ylo=py(lo) if lo is not None else None,
                    yhi=py(hi) if hi is not None else None,
                )
            )
        else:
            # NB: a round with nothing measured (a failed check) is still on the chart
            why = ",".join(c for c in r["reason_codes"] if c) or r.get("failure_kind") or ""
            points.append(
                dict(
                    base,
                    point=None,
                    lo=None,
                    hi=None,
                    cy=bottom - STRIP / 2,
                    ylo=None,
                    yhi=None,
                    why=why,
                )
            )
        if r["best_so_far"] is not None:
            best_pts.append({"round": r["round"], "x": x, "best": r["best_so_far"]})
    path = ""
    for i, b in enumerate(best_pts):
        bx, by = px(b["x"]), py(b["best"])
        b.update(cx=bx, cy=by)
        path += f"M{bx},{by}" if i == 0 else f"H{bx}V{by}"
    if best_pts:
        path += f"H{px(x1)}"
    xticks = (
        [t for t in range(1, int(x1) + 1)][:: max(1, int(x1) // 10)]
        if axis == "round"
        else _ticks(x0, x1)
    )
    band = None
    if noise["band"]:
        top, low = py(noise["band"][1]), py(noise["band"][0])
        if low - top < MIN_BAND_PX:
            mid = py(1.0)
            top, low = round(mid - MIN_BAND_PX / 2, 2), round(mid + MIN_BAND_PX / 2, 2)
        band = {
            "lo": noise["band"][0],
            "hi": noise["band"][1],
            "y": top,
            "h": round(low - top, 2),
            "label": f"noise ±{noise['delta'] * 100:.1f}%",
        }
    known = v["usage_unknown"]["rounds"] - v["usage_unknown"].get(axis, 0)
    unknown_note = None
    if axis in USAGE_AXES and v["usage_unknown"].get(axis):
        unknown_note = (
            f"usage unknown for {v['usage_unknown'][axis]} of {v['usage_unknown']['rounds']} rounds"
        )
    yt = _log_ticks(10**y0, 10**y1) if log else _ticks(y0, y1)
    return {
        "id": f"chart-{axis}" + ("-log" if log else ""),
        "axis": axis,
        "scale": scale,
        "title": title + (" (log scale)" if log else ""),
        "xlabel": xlabel,
        "w": W,
        "h": H,
        "plot": {"x": PAD_L, "y": PAD_T, "w": pw, "h": ph},
        "strip": bottom - STRIP,
        # NB: no frame when nothing can be placed (usage unknown): a note says so instead
        "frame": bool(plotted) or axis not in USAGE_AXES,
        "known": known,
        "unknown_note": unknown_note,
        "points": points,
        "best": best_pts,
        "best_path": path,
        "unplaced": unplaced,
        "band": band,
        "threshold": None
        if not noise["threshold"]
        else {"value": noise["threshold"], "y": py(noise["threshold"])},
        "one": py(1.0),
        "yticks": [{"v": t, "y": py(t), "text": f"{t:g}"} for t in yt],
        "xticks": [{"v": t, "x": px(t), "text": f"{t:g}"} for t in xticks],
        "summary": _summary(title, points, best_pts, unplaced, noise, unknown_note),
        # NB: each chart's own key: which markers it holds, counted or not, and how many
        "key": [
            {"kind": k, "text": text, "n": sum(1 for p in points if p["kind"] == k)}
            for k, text in MARKERS
            if any(p["kind"] == k for p in points)
        ],
    }


def _summary(title: str, points, best_pts, unplaced, noise, unknown_note=None) -> str:
    """The chart's text alternative: what it shows, in words."""
    measured = [p for p in points if p["measured"]]
    parts = [f"{title}: {len(measured)} measured round(s)"]
    if len(points) > len(measured):
        parts.append(f"{len(points) - len(measured)} judged without a measured speedup")
    counted = sum(1 for p in points if p["counts"])
    parts.append(f"{counted} counted, {len(points) - counted} not counted")
    if best_pts:
        top = best_pts[-1]["best"]
        since = next(b["round"] for b in best_pts if b["best"] == top)
        parts.append(f"best so far {top:.3f}x (from round {since} on)")
    else:
        parts.append("no round counted")
    if noise["delta"] is not None:
        parts.append(f"noise floor ±{noise['delta'] * 100:.1f}%")
    if unknown_note:
        parts.append(unknown_note)
    if unplaced:
        parts.append(f"round(s) {_ranges(unplaced)} not placed: unknown on this axis")
    return "; ".join(parts)


def _ranges(numbers: list[int]) -> str:
    """[1, 2, 3, 7] as '1-3, 7'."""
    out: list[str] = []
    for n in sorted(numbers):
        if out and out[-1].split("-")[-1] == str(n - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ", ".join(out)


def charts(v: dict) -> list[dict]:
    """Each axis's panel; with a wide speedup range, its log-scale view too (shown instead of
    the linear one when the page's log-scale box is ticked)."""
    out = []
    log = wide(v)
    for axis, xlabel, title in AXES:
        c = chart(v, axis, xlabel, title)
        out.append(c)
        if log and c["frame"]:
            c["log"] = chart(v, axis, xlabel, title, scale="log")
    return out


# ----------------------------------------------------------------------------------- renderers


def fmt(x, spec: str = ".3f", unknown: str = "unknown") -> str:
    """A number for people; an unknown one is the word, never 0 or `None`."""
    if x is None:
        return unknown
    if isinstance(x, bool):
        return str(x).lower()
    if isinstance(x, (int, str)):
        return str(x)
    return format(x, spec)


def _env():
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=True,  # NB: hypotheses, reasons and details are the agent's text
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["fmt"] = fmt
    env.filters["num"] = _num
    env.filters["tojson_attr"] = lambda x: json.dumps(x, sort_keys=True, separators=(",", ":"))
    return env


def render_html(v: dict, live: dict | None = None) -> str:
    """The campaign page. `live`: {"events": URL, "version": text, "home": URL} adds the
    refresh script and a link back to the index (rsi dashboard)."""
    return (
        _env()
        .get_template("campaign.html.j2")
        .render(v=v, charts=charts(v), markers=MARKERS, live=live)
    )


def render_compare(task: str, views: list[dict], live: dict | None = None) -> str:
    """Campaigns of one task side by side: best-so-far against round, and a table."""
    lines = []
    for v in views:
        pts = [
            {"round": r["round"], "best": r["best_so_far"]}
            for r in v["rounds"]
            if r["best_so_far"] is not None
        ]
        lines.append({"campaign": v["campaign"], "points": pts, "view": v})
    usage = {v["campaign"]: {k: usage_total(v, k) for k in USAGE_AXES} for v in views}
    return (
        _env()
        .get_template("compare.html.j2")
        .render(task=task, lines=_compare_chart(lines), views=views, usage=usage, live=live)
    )


def usage_total(v: dict, field: str) -> dict:
    """A campaign's total of one usage field over its rounds, with how many rounds did not
    report it: `partial` when some did not (the total is then a lower bound, said so), and a
    null total when none did (never 0)."""
    known = [r["cost"][field] for r in v["rounds"] if r["cost"][field] is not None]
    n = len(v["rounds"])
    return {
        "total": sum(known) if known else None,
        "unknown": n - len(known),
        "rounds": n,
        "partial": bool(known) and len(known) < n,
    }


def render_index(root: str, groups: list[dict], error: str | None, live: dict | None) -> str:
    """The index of `rsi dashboard`: `groups` [{task, compare, campaigns: [{label, url, view,
    error}]}]."""
    return (
        _env()
        .get_template("index.html.j2")
        .render(root=root, groups=groups, error=error, live=live)
    )


def _compare_chart(lines: list[dict]) -> dict:
    xs = [p["round"] for ln in lines for p in ln["points"]] + [
        len(ln["view"]["rounds"]) for ln in lines
    ]
    ys = [p["best"] for ln in lines for p in ln["points"]] + [1.0]
    x1 = max(xs + [1]) + 0.5
    y0, y1 = min(ys), max(ys)
    span = (y1 - y0) or 0.1
    y0, y1 = y0 - span * 0.08, y1 + span * 0.08
    pw, ph = W - PAD_L - PAD_R, H - PAD_T - PAD_B
    dashes = ("", "6 3", "2 3", "8 3 2 3", "1 2")
    out = []
    for i, ln in enumerate(lines):
        pts = []
        path = ""
        for j, p in enumerate(ln["points"]):
            cx = round(PAD_L + (p["round"] - 0.5) / (x1 - 0.5) * pw, 2)
            cy = round(PAD_T + (1 - (p["best"] - y0) / (y1 - y0)) * ph, 2)
            pts.append(dict(p, cx=cx, cy=cy))
            path += f"M{cx},{cy}" if j == 0 else f"H{cx}V{cy}"
        if pts:
            # NB: the best so far holds until the campaign's last round (as on its own page)
            last = len(ln["view"]["rounds"])
            path += f"H{round(PAD_L + (last - 0.5) / (x1 - 0.5) * pw, 2)}"
        out.append(
            {
                "campaign": ln["campaign"],
                "points": pts,
                "path": path,
                "dash": dashes[i % len(dashes)],
                "n": i,
            }
        )
    rounds = list(range(1, int(x1) + 1))
    xticks = [
        {"x": round(PAD_L + (t - 0.5) / (x1 - 0.5) * pw, 2), "text": str(t)}
        for t in rounds[:: max(1, len(rounds) // 10)]
    ]
    return {
        "w": W,
        "h": H,
        "plot": {"x": PAD_L, "y": PAD_T, "w": pw, "h": ph},
        "xticks": xticks,
        "lines": out,
        "one": round(PAD_T + (1 - (1.0 - y0) / (y1 - y0)) * ph, 2),
        "yticks": [
            {"y": round(PAD_T + (1 - (t - y0) / (y1 - y0)) * ph, 2), "text": f"{t:g}"}
            for t in _ticks(y0, y1)
        ],
    }


def render_text(v: dict) -> str:
    """The same fields as the page, for terminals and agents."""
    noise = v["noise"]
    lines = [
        f"campaign {v['campaign']} ({v['kind'] or 'unknown kind'}; binding {v['binding']})",
        f"metric: {v['metric'] or 'unknown'} ({v['direction'] or 'unknown direction'})",
        f"noise floor: {fmt(noise['delta'], '.4f')}; threshold: {fmt(noise['threshold'], '.4f')}"
        + ("x" if noise["threshold"] is not None else ""),
        "",
        "round verdict        speedup      interval          review        counted      "
        "reason                 failing case        tokens  calls  wall_s  device_s  evidence",
    ]
    for r in v["rounds"]:
        sp = r["speedup"]
        point = fmt(sp["point"]) if sp and r["counts"] else "not counted" if sp else "-"
        interval = f"[{fmt(sp.get('lo'))}, {fmt(sp.get('hi'))}]" if sp else "-"
        why = ",".join(c for c in r["reason_codes"] if c) or "-"
        case = (r["failing_case"] or {}).get("name") or "-"
        c = r["cost"]
        ev = r["evidence"]
        evidence = "-" if ev is None else _reuse_text(ev)
        rv = r.get("review")
        review = "-" if r["state"] != "judged" else "none" if rv is None else rv["verdict"]
        if rv and rv["n_findings"]:
            review += f" ({rv['n_findings']})"
        counted = "counted" if r["counts"] else "not counted"
        lines.append(
            f"{r['round']:>5} {r['symbol']} {r['verdict']:<12} {point:>11}  {interval:<17} "
            f"{review:<13} {counted:<12} "
            f"{why:<22} {case:<16} {fmt(c['tokens'], 'g'):>9} {fmt(c['calls'], 'g'):>7} "
            f"{fmt(c['wall_s'], '.1f'):>7} {fmt(c['device_s'], '.1f'):>9}  {evidence}"
        )
        for f in (rv or {}).get("findings") or []:
            place = f.get("file") or "?"
            if f.get("line") is not None:
                place += f":{f['line']}"
            lines.append(
                f"      review finding: {place} {f.get('rule') or ''}: {f.get('detail') or ''}"
            )
    best = v["best"]
    lines.append("")
    if best:
        sp = best["speedup"] or {}
        lines.append(
            f"best: round {best['round']}: {fmt(sp.get('point'))}x "
            f"[{fmt(sp.get('lo'))}, {fmt(sp.get('hi'))}]"
        )
    else:
        lines.append("best: none (no round counted: a PASS whose review passed)")
    lines.append(
        f"counted: {v['counted']} of {len(v['rounds'])} round(s)"
        + (
            f"; {v['review_failed']} PASS not counted: review not passed"
            if v["review_failed"]
            else ""
        )
    )
    f = v["final"]
    if f["state"] == "done":
        sp = f["speedup"] or {}
        lines.append(
            f"final: {f['verdict']} {fmt(sp.get('point'))}x [{fmt(sp.get('lo'))}, "
            f"{fmt(sp.get('hi'))}], re-measure of round {f['selected_round']}"
        )
    else:
        lines.append(f"final: {f['state']}" + (f": {f['message']}" if f["message"] else ""))
    totals = (v["usage"] or {}).get("totals") or {}
    unknown = (v["usage"] or {}).get("unknown_rounds") or {}
    lines.append(
        "usage: "
        + ", ".join(
            f"{k} {fmt(t, 'g')}"
            + (
                f" (partial: {unknown.get(k)} round(s) unknown)"
                if unknown.get(k) and t is not None
                else f" ({unknown.get(k)} round(s) unknown)"
                if unknown.get(k)
                else ""
            )
            for k, t in totals.items()
        )
    )
    for fp in v["fingerprints"]:
        rounds = ",".join(map(str, fp["rounds"]))
        lines.append(
            f"fingerprint (rounds {rounds}): "
            + ", ".join(f"{k}={fmt(val, 'g')}" for k, val in fp["fields"].items())
        )
    if not v["fingerprints"]:
        lines.append("fingerprint: unknown (no measured round)")
    return "\n".join(lines) + "\n"


def _reuse_text(ev: dict) -> str:
    if not ev.get("reused"):
        return "measured"
    src = ev.get("from") or {}
    if src.get("campaign"):
        return f"reused from {src['campaign']} round {src.get('round')}"
    if src.get("round"):
        return f"reused from round {src['round']}"
    return "reused"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--meta", required=True, type=Path)
    ap.add_argument("--report", required=True, type=Path)
    ap.add_argument("--round", dest="rounds", action="append", type=Path, default=[])
    ap.add_argument("--verdict", dest="verdicts", action="append", type=Path, default=[])
    ap.add_argument("--out-html", required=True, type=Path)
    ap.add_argument("--out-json", required=True, type=Path)
    ap.add_argument("--out-txt", required=True, type=Path)
    args = ap.parse_args()
    try:
        meta = json.loads(args.meta.read_text())
        docs = [json.loads(p.read_text()) for p in args.rounds]
        verdicts = {
            d["round"]: json.loads(p.read_text()) for d, p in zip(docs, args.verdicts, strict=True)
        }
        v = view(json.loads(args.report.read_text()), docs, verdicts, meta)
        for path, text in (
            (args.out_html, render_html(v)),
            (args.out_json, json.dumps(v, indent=1, sort_keys=True, allow_nan=False) + "\n"),
            (args.out_txt, render_text(v)),
        ):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)
    except (OSError, ValueError, KeyError, TypeError, ImportError) as exc:
        print(f"rsi harness fault (dashboard): {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
