"""A campaign round's document: the candidate's metadata, its verdict and its per-case
correctness, reshaped into one small JSON file (rsi.campaign.round/1). Stdlib only; judges
nothing itself. Exit 2 only when the evidence cannot be read."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

SCHEMA = "rsi.campaign.round/1"
CASE_FIELDS = ("name", "passed", "reason", "detail", "max_abs_err", "max_rel_err")


def review_summary(review: dict | None) -> dict | None:
    """What the round document says of the independent review (review.json has it all)."""
    if review is None:
        return None
    return {
        "verdict": review["verdict"],
        "n_findings": len(review.get("findings") or []),
        "findings": [
            {k: f.get(k) for k in ("rule", "severity", "file", "line", "detail")}
            for f in (review.get("findings") or [])[:20]
        ],
    }


def round_doc(
    meta: dict,
    verdict: dict,
    check: dict,
    blobs: dict[str, bytes],
    review: dict | None = None,
) -> dict:
    noise = verdict.get("noise_floor")
    summary = review_summary(review)
    return {
        "schema": SCHEMA,
        "campaign": meta["campaign"],
        "round": meta["round"],
        "label": meta["label"],
        "kind": meta["kind"],
        "candidate": {
            "digest": meta["digest"],
            "files": meta["files"],
            "hypothesis": meta["hypothesis"] or None,
        },
        "submitted_at": meta["submitted_at"],
        "usage": meta["usage"],
        "verdict": verdict["verdict"],
        "reasons": verdict["reasons"],
        "speedup": verdict["speedup"],
        "noise_floor": noise.get("delta") if isinstance(noise, dict) else noise,
        "threshold": verdict["threshold"],
        "min_improvement": verdict.get("min_improvement"),
        "n_pairs": verdict.get("n_pairs"),
        "metric": verdict.get("metric"),
        "direction": verdict.get("direction"),
        "correctness": {
            "status": check["status"],
            "failure_kind": check.get("failure_kind"),
            "n_cases": check.get("n_cases"),
            "n_passed": check.get("n_passed"),
            "cases": [{k: c.get(k) for k in CASE_FIELDS} for c in check.get("cases") or []],
        },
        "evidence_sha256": {name: hashlib.sha256(b).hexdigest() for name, b in blobs.items()},
        # NB: the review never changes the verdict; it decides whether a PASS may be accepted
        # (selected, confirmed by the final). No review (an external project): the verdict
        "review": summary,
        # NB: who made the candidate, and what context retrieval gave them before it
        "session": meta.get("session"),
        "knowledge": meta.get("knowledge") or [],
        "accepted": verdict["verdict"] == "PASS"
        and (summary is None or summary["verdict"] == "pass"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    for flag in ("--meta", "--verdict", "--check", "--out"):
        ap.add_argument(flag, required=True, type=Path)
    ap.add_argument("--review", type=Path)
    args = ap.parse_args()
    try:
        names = ("meta", "verdict", "check", *(("review",) if args.review else ()))
        blobs = {n: getattr(args, n).read_bytes() for n in names}
        docs = {n: json.loads(b) for n, b in blobs.items()}
        doc = round_doc(
            docs["meta"],
            docs["verdict"],
            docs["check"],
            {n: b for n, b in blobs.items() if n != "meta"},
            docs.get("review"),
        )
        tmp = args.out.with_name(args.out.name + f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n")
        os.replace(tmp, args.out)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"rsi harness fault (round): {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
