"""A campaign's report: every round's verdict, the rounds given up on (abandoned), the selection,
the final and the agent's usage, as JSON (rsi.campaign.report/1) and as Markdown for people. Stdlib
only; a pure function of the round, best and final documents and the abandoned list. It must never
judge anew."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

SCHEMA = "rsi.campaign.report/1"
USAGE_FIELDS = ("tokens.input", "tokens.output", "tokens.cached", "calls", "wall_s", "device_s")


def _get(usage: dict, dotted: str):
    cur = usage or {}
    for part in dotted.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return cur


def usage_totals(per_round: list[dict]) -> dict:
    """Sum each field over the rounds that reported it; null when none did (never 0)."""
    totals, unknown = {}, {}
    for name in USAGE_FIELDS:
        known = [_get(u, name) for u in per_round if _get(u, name) is not None]
        totals[name] = sum(known) if known else None
        unknown[name] = len(per_round) - len(known)
    return {"totals": totals, "unknown_rounds": unknown, "rounds": len(per_round)}


def _fmt(x, spec=".3f") -> str:
    return "null" if x is None else format(x, spec)


def _accepted(doc: dict) -> bool:
    """A round counts only when its verdict is PASS and its review passed (or it has none: an
    external project); the round document says so itself (`accepted`)."""
    review = doc.get("review")
    own = doc["verdict"] == "PASS" and (review is None or review.get("verdict") == "pass")
    return bool(doc.get("accepted", own)) and own


def _findings(review: dict | None) -> list[dict]:
    return [
        {k: f.get(k) for k in ("rule", "severity", "file", "line", "detail")}
        for f in (review or {}).get("findings") or []
    ]


def where(finding: dict) -> str:
    """A review finding's place: `file:line`, `file`, or `?` when the review named none."""
    place = finding.get("file") or "?"
    return place if finding.get("line") is None else f"{place}:{finding['line']}"


def report(
    campaign: str, rounds: list[dict], best: dict, final: dict, abandoned: list[dict] | None = None
) -> dict:
    gave_up = [
        {
            "round": a["round"],
            "label": a["label"],
            "reason": a.get("reason") or None,
            "time": a.get("time"),
            "candidate_digest": a.get("candidate_digest"),
            "hypothesis": a.get("hypothesis"),
            "usage": a.get("usage"),
        }
        for a in sorted(abandoned or [], key=lambda d: d["round"])
    ]
    rows = []
    for r in sorted(rounds, key=lambda d: d["round"]):
        sp = r.get("speedup") or {}
        rows.append(
            {
                "round": r["round"],
                "label": r["label"],
                "verdict": r["verdict"],
                "speedup": sp or None,
                "candidate_digest": r["candidate"]["digest"],
                "hypothesis": r["candidate"]["hypothesis"],
                "failure_kind": r["correctness"]["failure_kind"],
                "reasons": [x.get("code") for x in r.get("reasons") or []],
                # NB: why a round did not pass, for people; and whether its speedup counts
                # (only an accepted PASS's: a PASS whose review failed is never selected)
                "why": [
                    {"code": x.get("code"), "detail": x.get("detail")}
                    for x in r.get("reasons") or []
                ]
                if r["verdict"] != "PASS"
                else [],
                "speedup_counts": _accepted(r),
                "usage": r.get("usage"),
                "review": (r.get("review") or {}).get("verdict"),
                "review_findings": _findings(r.get("review")),
                "accepted": _accepted(r),
                "session": r.get("session"),
                "knowledge": r.get("knowledge") or [],
            }
        )
    counts = {
        v: sum(1 for r in rows if r["verdict"] == v) for v in ("PASS", "FAIL", "INCONCLUSIVE")
    }
    counts["abandoned"] = len(gave_up)
    # NB: an abandoned round was still paid for: its usage counts in the totals
    spent = [r.get("usage") or {} for r in rounds] + [a["usage"] or {} for a in gave_up]
    return {
        "schema": SCHEMA,
        "campaign": campaign,
        "rounds": rows,
        "abandoned": gave_up,
        "counts": counts,
        "best": best.get("selected"),
        "selection_rule": best.get("rule"),
        "final": final,
        "usage": usage_totals(spent),
        "sessions": sessions_of(rows, gave_up),
    }


def sessions_of(rows: list[dict], gave_up: list[dict]) -> list[dict]:
    """Rounds per agent session (rounds that name none under `null`)."""
    by: dict = {}
    for r in rows:
        s = r.get("session") or {}
        key = s.get("dispatch")
        row = by.setdefault(
            key,
            {
                "dispatch": key,
                "session": s.get("session"),
                "model": s.get("model"),
                "rounds": [],
                "verdicts": {},
            },
        )
        row["rounds"].append(r["round"])
        row["verdicts"][r["verdict"]] = row["verdicts"].get(r["verdict"], 0) + 1
    return sorted(by.values(), key=lambda s: (s["dispatch"] is None, min(s["rounds"])))


def markdown(doc: dict) -> str:
    gave_up = doc.get("abandoned") or []
    lines = [
        f"# Campaign {doc['campaign']}",
        "",
        f"{len(doc['rounds']) + len(gave_up)} round(s): {doc['counts']['PASS']} PASS, "
        f"{doc['counts']['FAIL']} FAIL, {doc['counts']['INCONCLUSIVE']} INCONCLUSIVE"
        + (f", {len(gave_up)} abandoned" if gave_up else ""),
        "",
        "| round | verdict | review | speedup | interval | failure | hypothesis |",
        "|---|---|---|---|---|---|---|",
    ]

    def cell(text) -> str:
        return (text or "").replace("|", "/").replace("\n", " ")[:80]

    table, why = [], []
    for r in doc["rounds"]:
        sp = r["speedup"] or {}
        counts = r.get("speedup_counts", r["verdict"] == "PASS")
        review = r.get("review") or "none"
        interval = f"[{_fmt(sp.get('lo'))}, {_fmt(sp.get('hi'))}]" if sp else ""
        point = _fmt(sp.get("point")) if sp else ""
        if sp and not counts:
            # NB: measured, but a round that did not pass never counts: never shown as a gain
            point, interval = f"({point}, not counted)", f"({interval})"
        table.append(
            (
                r["round"],
                f"| {r['round']} | {r['verdict']} | {review} | {point} "
                f"| {interval} | {r['failure_kind'] or ''} | {cell(r['hypothesis'])} |",
            )
        )
        for reason in r.get("why") or []:
            detail = reason.get("detail")
            why.append(
                f"- round {r['round']} ({r['verdict']}): {reason.get('code')}"
                + (f": {cell(str(detail))}" if detail not in (None, "") else "")
            )
    for a in gave_up:
        table.append(
            (
                a["round"],
                f"| {a['round']} | abandoned |  |  |  | {cell(a['reason'])} "
                f"| {cell(a['hypothesis'])} |",
            )
        )
    lines += [row for _, row in sorted(table)]
    uncounted = [r for r in doc["rounds"] if r["speedup"] and not r.get("speedup_counts", True)]
    if uncounted:
        lines += [
            "",
            "Speedups in parentheses were measured but do not count: only PASS rounds "
            "are eligible, and a PASS only when its review passed (or it has none).",
        ]
    if why:
        lines += ["", "## Why rounds did not pass", "", *why]
    best = doc["best"]
    lines += ["", "## Best", ""]
    if best:
        sp = best["speedup"]
        lines.append(
            f"round {best['round']} ({best['candidate_digest']}): "
            f"{_fmt(sp['point'])}x [{_fmt(sp['lo'])}, {_fmt(sp['hi'])}] against its "
            "own paired baseline"
        )
    else:
        lines.append("none: no round passed")
    lines.append(f"selection rule: {doc['selection_rule']}")
    final = doc["final"] or {}
    lines += ["", "## Final", ""]
    if final.get("state") == "done":
        sp = final.get("speedup") or {}
        lines.append(
            f"{final['verdict']}: {_fmt(sp.get('point'))}x "
            f"[{_fmt(sp.get('lo'))}, {_fmt(sp.get('hi'))}] — an independent "
            f"re-measure of round {final['selected']['round']} with fresh seeds"
        )
        for reason in final.get("reasons") or []:
            lines.append(f"- {reason.get('code')}: {reason.get('detail')}")
    else:
        lines.append(f"{final.get('state', 'unknown')}: {final.get('message', '')}")
    sessions = doc.get("sessions") or []
    if any(s["dispatch"] for s in sessions):
        lines += ["", "## Rounds per session", "", "| session | model | rounds | verdicts |"]
        lines.append("|---|---|---|---|")
        for s in sessions:
            verdicts = ", ".join(f"{k} {v}" for k, v in sorted(s["verdicts"].items()))
            lines.append(
                f"| {cell(s['session'] or '(none named)')} | {cell(s['model'])} "
                f"| {', '.join(str(n) for n in s['rounds'])} | {verdicts} |"
            )
    rejected = [r for r in doc["rounds"] if r.get("review") not in (None, "pass")]
    if rejected:
        lines += ["", "## Review", ""]
        for r in rejected:
            lines.append(
                f"- round {r['round']} ({r['verdict']}): review {r['review']}: never accepted"
            )
            for f in r.get("review_findings") or []:
                lines.append(
                    f"  - `{cell(where(f))}` {cell(f.get('rule'))} ({cell(f.get('severity'))}): "
                    f"{cell(str(f.get('detail') or ''))}"
                )
    lines += [
        "",
        "## Usage (reported by the agent)",
        "",
        "| field | total | rounds unknown |",
        "|---|---|---|",
    ]
    for name, total in doc["usage"]["totals"].items():
        lines.append(f"| {name} | {_fmt(total, 'g')} | {doc['usage']['unknown_rounds'][name]} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--campaign", required=True)
    ap.add_argument("--round", dest="rounds", action="append", type=Path, default=[])
    ap.add_argument("--best", required=True, type=Path)
    ap.add_argument("--final", required=True, type=Path)
    ap.add_argument("--abandoned", type=Path, help="JSON list of the abandoned rounds")
    ap.add_argument("--out-json", required=True, type=Path)
    ap.add_argument("--out-md", required=True, type=Path)
    args = ap.parse_args()
    try:
        rounds = [json.loads(p.read_text()) for p in args.rounds]
        abandoned = json.loads(args.abandoned.read_text()) if args.abandoned else []
        doc = report(
            args.campaign,
            rounds,
            json.loads(args.best.read_text()),
            json.loads(args.final.read_text()),
            abandoned,
        )
        for path, text in (
            (args.out_json, json.dumps(doc, indent=1, sort_keys=True) + "\n"),
            (args.out_md, markdown(doc)),
        ):
            tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
            tmp.write_text(text)
            os.replace(tmp, path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"rsi harness fault (report): {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
