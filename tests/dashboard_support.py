"""A synthetic campaign's evidence (round documents, verdicts, report, meta) for the dashboard's
unit tests and its benchmark: shaped like what the harness writes, with a seeded mix of PASS,
FAIL and INCONCLUSIVE rounds and usage that is sometimes unknown."""

from __future__ import annotations

import random
import sys
from importlib import util
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[1] / "rules" / "harness"
START = 1_700_000_000.0
FINGERPRINT = {
    "device": "cpu",
    "cpu_model": "Synthetic CPU @ 3.0GHz",
    "machine": "x86_64",
    "python": "3.11.2",
    "numpy": "2.4.6",
    "torch": None,
    "cuda": None,
    "toolchain": "host-python@" + "0" * 32,
}


def harness(stem: str):
    if str(HARNESS) not in sys.path:
        sys.path.insert(0, str(HARNESS))
    spec = util.spec_from_file_location(f"rsi_test_dashboard_{stem}", HARNESS / f"{stem}.py")
    module = util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def round_doc(n: int, verdict: str, point: float | None, usage: dict, hypothesis: str) -> dict:
    sp = None if point is None else {"point": point, "lo": point * 0.96, "hi": point * 1.04}
    failing = verdict == "FAIL" and point is None
    reasons = []
    if verdict == "FAIL":
        reasons.append(
            {"code": "candidate_check_failed", "detail": "case transposed_f32: max abs err 0.3"}
            if failing
            else {"code": "slower", "detail": "interval upper bound below 1/threshold"}
        )
    elif verdict == "INCONCLUSIVE":
        reasons.append({"code": "below_threshold", "detail": "lower bound <= 1.05"})
    cases = [
        {"name": "normal_f32", "passed": True, "reason": None, "detail": None},
        {
            "name": "transposed_f32",
            "passed": not failing,
            "reason": "wrong_output" if failing else None,
            "detail": "max abs err 0.3 > atol" if failing else None,
        },
    ]
    return {
        "schema": "rsi.campaign.round/1",
        "campaign": "//tasks/sm:campaign",
        "round": n,
        "label": f"//tasks/sm:campaign.round-{n}",
        "kind": "task",
        "candidate": {"digest": f"{n:064x}/10", "files": {}, "hypothesis": hypothesis or None},
        "submitted_at": START + 30.0 * n,
        "usage": usage,
        "verdict": verdict,
        "reasons": reasons,
        "speedup": sp,
        "noise_floor": 0.012,
        "threshold": 1.05,
        "min_improvement": 0.05,
        "n_pairs": 16,
        "metric": "latency",
        "direction": "minimize",
        "correctness": {
            "status": "fail" if failing else "pass",
            "failure_kind": "wrong_output" if failing else None,
            "n_cases": 2,
            "n_passed": 1 if failing else 2,
            "cases": cases,
        },
        "evidence_sha256": {"verdict": f"v{n}", "check": f"c{n}"},
    }


def campaign(n_rounds: int, seed: int = 0, final_state: str = "done") -> dict:
    """{report, docs, verdicts, meta} of a synthetic campaign of `n_rounds` rounds."""
    rng = random.Random(seed)
    docs, verdicts = [], {}
    for n in range(1, n_rounds + 1):
        kind = rng.random()
        if kind < 0.5:
            verdict, point = "PASS", 1.05 + rng.random() * (0.2 + n / n_rounds)
        elif kind < 0.65:
            verdict, point = "FAIL", None
        elif kind < 0.75:
            verdict, point = "FAIL", 0.7 + rng.random() * 0.2
        else:
            verdict, point = "INCONCLUSIVE", 0.98 + rng.random() * 0.06
        usage = {
            "tokens": {
                "input": rng.randrange(1000, 9000),
                "output": rng.randrange(100, 900) if n % 7 else None,
                "cached": None,
            },
            "calls": rng.randrange(1, 6),
            "wall_s": round(rng.random() * 60, 1),
            "device_s": None,
        }
        docs.append(round_doc(n, verdict, point, usage, f"idea {n}: fuse the loops"))
        verdicts[n] = {"verdict": verdict, "fingerprint": dict(FINGERPRINT)}
    select, report = harness("selection"), harness("report")
    best = select.select(docs)
    sel = best["selected"]
    if final_state == "done" and sel:
        sp = sel["speedup"]
        final = {
            "state": "done",
            "verdict": "PASS",
            "speedup": {"point": sp["point"] * 0.99, "lo": sp["lo"] * 0.99, "hi": sp["hi"]},
            "selected": {"round": sel["round"], "label": sel["label"]},
            "reasons": [],
        }
    else:
        final = {"state": "pending", "message": "the campaign is still open", "verdict": None}
    doc = report.report("//tasks/sm:campaign", docs, best, final, [])
    meta = {
        "campaign": "//tasks/sm:campaign",
        "binding": "//tasks/sm:small",
        "kind": "task",
        "started_at": START,
        "max_rounds": n_rounds,
        "links": {
            str(n): {"verdict.json": f"../_evidence/small/{n:064x}/verdict.json"}
            for n in range(1, n_rounds + 1)
        },
        "final_links": {"final.json": "../campaign.final/final.json"},
    }
    return {"report": doc, "docs": docs, "verdicts": verdicts, "meta": meta}


def reviewed(doc: dict, verdict: str | None, findings: list[dict] | None = None) -> dict:
    """`doc` with an independent review (None: none, an external project), and `accepted` as
    rules/harness/round.py writes it."""
    if verdict is None:
        doc["review"] = None
    else:
        found = findings or []
        doc["review"] = {"verdict": verdict, "n_findings": len(found), "findings": found}
    doc["accepted"] = doc["verdict"] == "PASS" and verdict in (None, "pass")
    return doc


FINDING = {
    "rule": "frame_introspection",
    "severity": "fail",
    "file": "kernel.py",
    "line": 7,
    "detail": "reads the caller's frame (sys._getframe)",
}


def review_campaign(noise: float = 0.0) -> dict:
    """The issue's case: round 1 a FAIL with nothing measured (its check failed), round 2 a
    fast PASS whose review failed (never counted), round 3 INCONCLUSIVE, round 4 a PASS whose
    review passed; usage (tokens, calls) known only for round 4."""
    unknown = {"tokens": {"input": None, "output": None, "cached": None}, "calls": None}
    known = {"tokens": {"input": 1200, "output": 300, "cached": None}, "calls": 3}
    docs = [
        reviewed(round_doc(1, "FAIL", None, unknown, "transpose in place"), "pass"),
        reviewed(round_doc(2, "PASS", 1.8, unknown, "peek at the caller"), "fail", [FINDING]),
        reviewed(round_doc(3, "INCONCLUSIVE", 1.01, unknown, "unroll"), "inconclusive"),
        reviewed(round_doc(4, "PASS", 1.2, known, "fuse exp and sum"), "pass"),
    ]
    for d in docs:
        d["noise_floor"] = noise
    verdicts = {
        d["round"]: {"verdict": d["verdict"], "fingerprint": dict(FINGERPRINT)} for d in docs
    }
    select, report = harness("selection"), harness("report")
    best = select.select(docs)
    final = {"state": "pending", "message": "the campaign is still open", "verdict": None}
    meta = {
        "campaign": "//tasks/sm:campaign",
        "binding": "//tasks/sm:small",
        "kind": "task",
        "started_at": START,
        "max_rounds": 6,
        "links": {},
        "final_links": {},
    }
    doc = report.report("//tasks/sm:campaign", docs, best, final, [])
    return {"report": doc, "docs": docs, "verdicts": verdicts, "meta": meta}
