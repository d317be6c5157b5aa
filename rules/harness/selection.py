"""Cross-round selection: the best candidate of a campaign, chosen by each round's *paired*
improvement over its own baseline (never by absolute numbers from different rounds). Only PASS
rounds whose independent review passed (or that have none: an external project) are
eligible. Stdlib only; a pure function of the round documents."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

SCHEMA = "rsi.campaign.best/1"
RULE = (
    "highest paired speedup point estimate among PASS rounds whose review passed; ties go "
    "to the higher interval lower bound, then to the earlier round"
)


def select(rounds: list[dict]) -> dict:
    considered, eligible = [], []
    for r in sorted(rounds, key=lambda d: d["round"]):
        sp = r.get("speedup") or {}
        row = {
            "round": r["round"],
            "label": r["label"],
            "verdict": r["verdict"],
            "candidate_digest": r["candidate"]["digest"],
            "speedup_point": sp.get("point"),
            "speedup_lo": sp.get("lo"),
            "speedup_hi": sp.get("hi"),
            "eligible": False,
            "why_not": None,
        }
        review = r.get("review")
        row["review"] = None if review is None else review.get("verdict")
        if r["verdict"] != "PASS":
            row["why_not"] = f"verdict {r['verdict']}: only PASS rounds are eligible"
        elif review is not None and review.get("verdict") != "pass":
            first = (review.get("findings") or [{}])[0]
            row["why_not"] = (
                f"review {review.get('verdict')}: a PASS is accepted only when its review "
                f"passes ({first.get('rule')} at {first.get('file')}:{first.get('line')})"
            )
        elif sp.get("point") is None:
            row["why_not"] = "no paired speedup estimate"
        else:
            row["eligible"] = True
            eligible.append((r, row))
        considered.append(row)
    selected = None
    if eligible:
        r, row = max(
            eligible,
            key=lambda e: (e[1]["speedup_point"], e[1]["speedup_lo"] or 0.0, -e[0]["round"]),
        )
        selected = {
            "round": r["round"],
            "label": r["label"],
            "candidate_digest": r["candidate"]["digest"],
            "files": r["candidate"]["files"],
            "hypothesis": r["candidate"]["hypothesis"],
            "verdict": r["verdict"],
            "speedup": r["speedup"],
            "noise_floor": r.get("noise_floor"),
            "threshold": r.get("threshold"),
            "review": (r.get("review") or {}).get("verdict"),
        }
    return {
        "schema": SCHEMA,
        "rule": RULE,
        "n_rounds": len(rounds),
        "n_eligible": len(eligible),
        "selected": selected,
        "considered": considered,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--round", dest="rounds", action="append", type=Path, default=[])
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    try:
        docs = [json.loads(p.read_text()) for p in args.rounds]
        for p, d in zip(args.rounds, docs, strict=True):
            if d.get("schema") != "rsi.campaign.round/1":
                raise ValueError(f"{p} is not an rsi.campaign.round/1 document")
        doc = select(docs)
        tmp = args.out.with_name(args.out.name + f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n")
        os.replace(tmp, args.out)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"rsi harness fault (select): {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
