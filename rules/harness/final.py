"""A campaign's final: re-judge the selected candidate against the baseline from scratch.

Reads the selection (best.json), re-seeds every spec (fresh correctness inputs and fresh timed
inputs; never the seeds any round used), then runs the plan's steps — baseline check, check,
A/A calibration, paired measurement, assessment, rendering — each as a fresh process. Exit 2 when
a step faults (the action is not cached and the final can be retried); a candidate that fails is
a verdict, exit 0. Stdlib only (the steps bring their own dependencies).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

SCHEMA = "rsi.campaign.final/1"
CASE_FIELDS = ("name", "passed", "reason", "detail", "max_abs_err", "max_rel_err")


def derive_seed(*parts) -> int:
    text = json.dumps(parts, separators=(",", ":"), sort_keys=True)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


def reseed(spec: dict, final_seed: int) -> dict:
    """Replace every seed of a spec by one derived from it and the final's seed (old -> new)."""
    changed = {}
    old = int(spec.get("seed", 0))
    spec["seed"] = derive_seed(old, "rsi-final", final_seed)
    changed["seed"] = [old, spec["seed"]]
    measure = spec.get("measure")
    if isinstance(measure, dict):
        old = int(measure.get("seed", 0))
        measure["seed"] = derive_seed(old, "rsi-final-measure", final_seed)
        changed["measure.seed"] = [old, measure["seed"]]
    for case in spec.get("cases") or []:
        if isinstance(case, dict) and "seed" in case:
            old = int(case["seed"])
            case["seed"] = derive_seed(old, "rsi-final-case", case.get("name"), final_seed)
            changed[f"cases.{case.get('name')}.seed"] = [old, case["seed"]]
    return changed


def write_json(path: Path, doc) -> None:
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n")
    os.replace(tmp, path)


def placeholders(out_dir: Path, outputs: list[str], reason: str) -> None:
    for name in outputs:
        if name == "final.json":
            continue
        path = out_dir / name
        if name.endswith(".json"):
            write_json(path, {"schema": "rsi.none/1", "reason": reason})
        else:
            path.write_text(reason + "\n")


def run_steps(plan: dict, subst: dict[str, str]) -> dict[str, int]:
    """Run the plan's steps in order; returns {name: code} of those that exited with their own
    `uncached_exit` (good documents, not to be cached: a measurement on a busy host)."""
    uncached = {}
    for step in plan["steps"]:
        argv = [sys.executable if a == "{python}" else a.format(**subst) for a in step["argv"]]
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if proc.returncode != 0 and proc.returncode == step.get("uncached_exit"):
            uncached[step["name"]] = proc.returncode
        elif proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
            raise RuntimeError(f"step {step['name']} exited with {proc.returncode}:\n{tail}")
    return uncached


def final(plan: dict, best: dict, final_seed: int, out_dir: Path) -> dict:
    selected = best.get("selected")
    if selected is None:
        reason = (
            f"no round passed ({best.get('n_rounds')} round(s), none eligible); there is "
            "no candidate to confirm"
        )
        placeholders(out_dir, plan["outputs"], reason)
        return {
            "schema": SCHEMA,
            "state": "no_candidate",
            "message": reason,
            "selected": None,
            "verdict": None,
            "final_seed": final_seed,
        }
    if selected.get("review") not in (None, "pass"):
        # NB: the selection never names one; a review that did not pass is never confirmed
        raise RuntimeError(
            f"the selection names round {selected['round']}, whose review is "
            f"{selected['review']}: it cannot be accepted"
        )
    cand = plan["candidates"].get(str(selected["round"]))
    if cand is None:
        raise RuntimeError(
            f"the selection names round {selected['round']}, which this final does not hold"
        )
    subst = {"candidate": cand, "out": str(out_dir)}
    reseeded = {}
    for name, path in plan["specs"].items():
        spec = json.loads(Path(path).read_text())
        reseeded[name] = reseed(spec, final_seed)
        dest = out_dir / f"{name}.json"
        write_json(dest, spec)
        subst[name] = str(dest)
    uncached = run_steps(plan, subst)
    verdict = json.loads((out_dir / "verdict.json").read_text())
    check = json.loads((out_dir / "check.json").read_text())
    noise = verdict.get("noise_floor")
    return {
        "schema": SCHEMA,
        "state": "done",
        "selected": {
            "round": selected["round"],
            "label": selected["label"],
            "candidate_digest": selected["candidate_digest"],
            "round_verdict": selected["verdict"],
            "round_speedup": selected["speedup"],
            "review": selected.get("review"),
        },
        "verdict": verdict["verdict"],
        "reasons": verdict["reasons"],
        "speedup": verdict["speedup"],
        "noise_floor": noise.get("delta") if isinstance(noise, dict) else noise,
        "threshold": verdict.get("threshold"),
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
        "final_seed": final_seed,
        "reseeded": reseeded,
        "confirms_selection": verdict["verdict"] == "PASS",
        # NB: steps whose documents must not be cached (a busy host): nor is this final
        "uncached_steps": uncached,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pending", help="write a pending document with this message and stop")
    ap.add_argument("--plan", type=Path)
    ap.add_argument("--best", type=Path)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out-dir", required=True, type=Path)
    args = ap.parse_args()
    out_dir = args.out_dir.resolve()
    try:
        if args.pending is not None:
            write_json(
                out_dir / "final.json",
                {
                    "schema": SCHEMA,
                    "state": "pending",
                    "message": args.pending,
                    "selected": None,
                    "verdict": None,
                },
            )
            return 0
        plan = json.loads(args.plan.read_text())
        best = json.loads(args.best.read_text())
        doc = final(plan, best, args.seed, out_dir)
        write_json(out_dir / "final.json", doc)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        print(f"rsi harness fault (final): {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    if doc.get("uncached_steps"):
        # NB: the step's own code, which the Final's action declares too (rules/steps.py)
        print(f"rsi final: not to be cached: {sorted(doc['uncached_steps'])}", file=sys.stderr)
        return next(iter(doc["uncached_steps"].values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
