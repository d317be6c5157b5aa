"""Verdict from evidence: a deterministic function of the spec, the paired samples, both checks and
the A/A calibration. Runs no implementation code; exits non-zero only on unreadable evidence. It
must never import rsi or rules."""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
from pathlib import Path


def _load_sibling(stem: str):
    path = Path(__file__).resolve().parent / f"{stem}.py"
    spec = importlib.util.spec_from_file_location(f"_rsi_harness_{stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


C = _load_sibling("_core")
S = _load_sibling("stats")
Q = _load_sibling("sequential")

SCHEMA = "rsi.assess/1"


CONTENTION_MAX = C.CONTENTION_MAX
contended = C.contended


def pair_log_ratios(doc: dict, measure: dict) -> list[float]:
    """Per complete pair: log(baseline / candidate) of the arm values. NB: contended pairs
    stay in: leaving them out marked quiet pairs out on an idle host often enough to change
    verdicts of tiny policies; a mostly contended measurement is host_busy instead."""
    ratios = []
    for pair in doc["pairs"]:
        if not pair.get("complete"):
            continue
        values = {
            arm: S.arm_value(
                pair["arms"][arm]["samples_ns"], measure["metric"], measure.get("units_per_call")
            )
            for arm in ("baseline", "candidate")
        }
        ratios.append(S.log_ratio(values["baseline"], values["candidate"], measure["direction"]))
    return ratios


def sequential_interval(samples: dict, ratios: list[float], confidence: float) -> tuple:
    """(pairs judged, (lo, hi, coverage) on the log scale or None, the design's record).

    A measurement that recorded a sequential design is judged at the look it stopped at with
    that design's boundaries at this assessment's confidence (sequential.plan): the looks hold
    the median together, so stopping early costs no coverage. Without a record (a fixed
    design, a multi-rank measurement) it is None: the plain interval of all pairs; with a
    record, None means no look can judge these pairs yet (too_few_pairs)."""
    seq = samples.get("sequential")
    if not seq or seq.get("design") in (None, "fixed"):
        return ratios, None, None
    m = samples["measure"]
    plan = Q.plan(int(m["pairs"]), seq["first_look"], seq["look_every"], seq["design"], confidence)
    look = Q.look_for(plan, len(ratios))
    record = {
        "design": seq["design"],
        "looks": [lk["n"] for lk in plan["looks"]],
        "looks_taken": len(seq.get("looks") or []),
        "stop": seq.get("stop"),
        "stopped_at": seq.get("stopped_at"),
        "judged_at": look["n"] if look else None,
        "spent_alpha": look["spent_alpha"] if look else 0.0,
        "plan_alpha": plan["alpha_spent"],
        "order_index": look["c"] if look else None,
        "method": plan["method"],
    }
    if look is None:
        return ratios, None, record
    judged = ratios[: look["n"]]
    interval = Q.interval_at(judged, look)
    if interval is None:
        if look["n"] != plan["looks"][-1]["n"]:
            # NB: a look that may not judge yet (c = 0): no interval at all, not a fixed one
            return judged, None, record
        # NB: the last look of a plan too short to decide: the whole range, its coverage said
        lo, hi, coverage = S.median_interval(judged, confidence)
        return judged, (lo, hi, coverage), record
    return judged, (interval[0], interval[1], 1.0 - plan["alpha_spent"]), record


def _busy(doc: dict) -> str | None:
    return C.busy_reason(doc)


def _policy(measure: dict) -> dict:
    """The measurement policy an A/A run must share with the samples: all but the seed."""
    return {k: v for k, v in measure.items() if k != "seed"}


def _hardware(doc: dict) -> tuple:
    """The kind of device a measurement ran on: (device, model): the GPU model on a GPU, the
    CPU model on a CPU, so a noise floor measured on another kind of host never applies.

    Another unit of the same model is the same kind (its noise floor applies); evidence without
    a fingerprint says nothing and matches anything."""
    fp = doc.get("fingerprint")
    if not fp:
        return ()
    device = fp.get("device")
    return (device, fp.get("gpu_name") if device != "cpu" else fp.get("cpu_model"))


def bandwidth_summary(samples: dict) -> dict:
    """The candidate's achieved bandwidth and fraction of peak from the samples (nulls when
    unknown), with the baseline's alongside."""
    bw = samples.get("bandwidth") or {}
    cand, base = bw.get("candidate") or {}, bw.get("baseline") or {}
    return {
        "achieved_gb_s": cand.get("achieved_gb_s"),
        "peak_gb_s": bw.get("peak_gb_s"),
        "fraction": cand.get("fraction"),
        "bytes_per_call": bw.get("bytes_per_call"),
        "peak_source": bw.get("peak_source"),
        "baseline": {"achieved_gb_s": base.get("achieved_gb_s"), "fraction": base.get("fraction")},
    }


def _codes(reasons: list[dict]) -> str:
    return ", ".join(
        sorted({f"{r['code']}" + (f"@pair{r['pair']}" if "pair" in r else "") for r in reasons})
    )


def assess(
    spec: dict, samples: dict, check: dict, baseline_check: dict, calibration: dict, seed: int
) -> dict:
    m, a = spec["measure"], spec["assess"]
    reasons: list[dict] = []
    fail, inconclusive = False, False

    def add(code: str, detail: str) -> None:
        reasons.append({"code": code, "detail": detail})

    for name, doc, schema in (
        ("samples", samples, "rsi.measure/1"),
        ("check", check, "rsi.check/1"),
        ("baseline_check", baseline_check, "rsi.check/1"),
        ("calibration", calibration, "rsi.measure/1"),
    ):
        if not isinstance(doc, dict) or doc.get("schema") != schema:
            raise C.HarnessError(f"{name} evidence is not a {schema} document")

    if baseline_check["status"] != "ok":
        inconclusive = True
        add(
            "baseline_check_failed",
            f"the baseline fails its own check "
            f"({baseline_check['failure_kind']}); the task or oracle needs fixing",
        )
    if check["status"] != "ok":
        fail = True
        first = check["reasons"][0] if check["reasons"] else {}
        add(
            "candidate_check_failed",
            f"{check['failure_kind']}: case {first.get('case')}: {first.get('detail')}",
        )
    if samples["invalid"]["candidate"]:
        fail = True
        add("candidate_arm_invalid", _codes(samples["invalid"]["candidate"]))
    if samples["invalid"]["baseline"]:
        inconclusive = True
        add("baseline_arm_invalid", _codes(samples["invalid"]["baseline"]))
    if check["impl"]["digest"] != samples["candidate"]["digest"]:
        inconclusive = True
        add("evidence_mismatch", "the check and the samples judge different candidate trees")
    if baseline_check["impl"]["digest"] != samples["baseline"]["digest"]:
        inconclusive = True
        add("evidence_mismatch", "the baseline check and the samples use different baselines")

    noise = None
    if not calibration.get("calibration"):
        inconclusive = True
        add("calibration_invalid", "the calibration document is not an A/A run")
    elif calibration["invalid"]["baseline"] or calibration["invalid"]["candidate"]:
        inconclusive = True
        add(
            "calibration_invalid",
            "A/A arms invalid: "
            + _codes(calibration["invalid"]["baseline"] + calibration["invalid"]["candidate"]),
        )
    elif (
        calibration["baseline"]["digest"] != samples["baseline"]["digest"]
        or _policy(calibration["measure"]) != _policy(samples["measure"])
        or calibration["threads"] != samples["threads"]
    ):
        inconclusive = True
        add("calibration_mismatch", "the A/A run used another baseline, workload or policy")
    elif (
        _hardware(calibration)
        and _hardware(samples)
        and _hardware(calibration) != _hardware(samples)
    ):
        inconclusive = True
        add(
            "calibration_mismatch",
            f"the A/A run used another device "
            f"({_hardware(calibration)} vs {_hardware(samples)}); its noise floor does not apply",
        )
    elif _busy(calibration):
        inconclusive = True
        add("host_busy", "A/A calibration: " + _busy(calibration))
    else:
        aa = pair_log_ratios(calibration, m)
        if len(aa) < int(a["min_pairs"]):
            inconclusive = True
            add("calibration_invalid", f"only {len(aa)} complete A/A pairs (< {a['min_pairs']})")
        else:
            noise = S.noise_floor(aa, a["confidence"], a["bootstrap_resamples"], seed ^ 0xA5A5)

    ratios = pair_log_ratios(samples, m) if not samples["invalid"]["candidate"] else []
    ratios, interval, design = sequential_interval(samples, ratios, a["confidence"])
    speed = None
    if samples["invalid"]["candidate"] or samples["invalid"]["baseline"]:
        pass
    elif _busy(samples):
        inconclusive = True
        add("host_busy", _busy(samples))
    elif len(ratios) < int(a["min_pairs"]):
        inconclusive = True
        add("too_few_pairs", f"{len(ratios)} complete pairs (< {a['min_pairs']})")
    elif design is not None and interval is None:
        inconclusive = True
        add(
            "too_few_pairs",
            f"{len(ratios)} complete pairs: no look of the {design['design']} plan "
            f"({design['looks']}) can judge them yet",
        )
    else:
        # NB: the A/A calibration's own median is the run-to-run shift this binding shows
        shift = abs(math.log(noise["aa_point"])) if noise else 0.0
        speed = S.speedup(
            ratios, a["confidence"], a["bootstrap_resamples"], seed, shift, interval=interval
        )

    threshold = S.pass_threshold(noise["delta"], a["min_improvement"]) if noise else None
    # NB: a baseline failing its own check means the judge is broken; no candidate is failed by it.
    if baseline_check["status"] != "ok":
        verdict = "INCONCLUSIVE"
    elif fail:
        verdict = "FAIL"
    elif inconclusive or speed is None or threshold is None:
        verdict = "INCONCLUSIVE"
    elif speed["lo"] > threshold:
        verdict = "PASS"
        add("cleared_threshold", f"interval lower bound {speed['lo']:.4f} > {threshold:.4f}")
    elif speed["hi"] < 1.0 / threshold:
        # NB: the mirror image of PASS: the whole interval is below 1 by more than the noise
        # floor, so the candidate is slower, with the verdict's own confidence
        verdict = "FAIL"
        add(
            "slower",
            f"interval upper bound {speed['hi']:.4f} < {1.0 / threshold:.4f} "
            f"(1 / (1 + max(noise floor, min_improvement))): the candidate is slower",
        )
    else:
        verdict = "INCONCLUSIVE"
        add(
            "below_threshold",
            f"interval lower bound {speed['lo']:.4f} <= {threshold:.4f} "
            f"(1 + max(noise floor, min_improvement))",
        )
    return {
        "schema": SCHEMA,
        "verdict": verdict,
        "reasons": reasons,
        "speedup": speed,
        "noise_floor": noise,
        "threshold": threshold,
        "min_improvement": float(a["min_improvement"]),
        "n_pairs": len(ratios) if speed else (len(ratios) or None),
        "sequential": design,
        "n_contended_pairs": sum(1 for p in samples["pairs"] if p.get("complete") and contended(p)),
        "metric": m["metric"],
        "direction": m["direction"],
        "baseline_digest": samples["baseline"]["digest"],
        "candidate_digest": samples["candidate"]["digest"],
        "candidate_failure_kind": check.get("failure_kind"),
        "bootstrap_seed": seed,
        "bandwidth": bandwidth_summary(samples),
        "timing": (samples.get("timing") or {}).get("clock"),
        "fingerprint": samples.get("fingerprint"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    for flag in ("--spec", "--samples", "--check", "--baseline-check", "--calibration", "--out"):
        parser.add_argument(flag, required=True, type=Path)
    parser.add_argument("--text", type=Path, help="also write the verdict table here")
    args = parser.parse_args()
    try:
        blobs = {}
        for name in ("spec", "samples", "check", "baseline_check", "calibration"):
            try:
                blobs[name] = getattr(args, name).read_bytes()
            except OSError as exc:
                raise C.HarnessError(f"cannot read {name} evidence: {exc}") from exc
        spec = C.load_spec(args.spec)
        docs = {name: C.read_json(getattr(args, name)) for name in blobs if name != "spec"}
        seed = S.seed_from(*blobs.values())
        try:
            doc = assess(
                spec,
                docs["samples"],
                docs["check"],
                docs["baseline_check"],
                docs["calibration"],
                seed,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise C.HarnessError(f"malformed evidence: {type(exc).__name__}: {exc}") from exc
        doc["evidence_sha256"] = {name: C.sha256_bytes(b) for name, b in blobs.items()}
        C.write_json(args.out.resolve(), doc)
        if args.text is not None:
            table = _load_sibling("render").render(doc, docs["check"])
            try:
                args.text.write_text(table)
            except OSError as exc:
                raise C.HarnessError(f"cannot write the verdict table: {exc}") from exc
    except C.HarnessError as exc:
        print(f"rsi harness fault (assess): {exc}", file=sys.stderr)
        return C.INFRA_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
