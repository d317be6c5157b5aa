"""The measurement document (`rsi.measure/1`) as measure.py and multirank.py both assemble it:
an arm's and a pair's records, the tally of invalid arms, the status, the timing and bandwidth
sections, the early stop and the sequential design's looks (stats.py, sequential.py).

It must never judge a call nor read a clock: it only arranges what the arms recorded, and a
look taken on a busy host decides nothing.
"""

from __future__ import annotations

import runpy
import math
import os
import platform
import statistics
from pathlib import Path


# NB: the harness's one sibling loader (siblings.py), itself run by path: no sys.path here
load_siblings = runpy.run_path(str(Path(__file__).resolve().parent / "siblings.py"))["load"]
C, S, Q = load_siblings("_common", "stats", "sequential")


SCHEMA = "rsi.measure/1"
ARMS = ("baseline", "candidate")
EARLY_STOP_PAIRS, EARLY_STOP_FACTOR = 8, 1.5


def new_arm(impl: str) -> dict:
    return {
        "impl": impl,
        "valid": False,
        "reasons": [],
        "samples_ns": [],
        "input_digests": [],
        "warmup_ns": [],
        "output_digests": [],
        "wall_s": None,
        "log_tail": None,
        "cpu_ns": None,
        "calls_wall_ns": None,
        "run_delay_ns": None,
        "contention": None,
    }


def new_pair(i: int) -> dict:
    """Pair i's record before it runs: AB when i is even, BA when odd."""
    return {
        "index": i,
        "order": list(ARMS) if i % 2 == 0 else list(reversed(ARMS)),
        "complete": False,
        "inputs_identical": True,
        "timed_seeds": [],
        "warmup_seeds": [],
        "arms": {},
    }


def next_pair(pairs: list[dict], stopped: bool, invalid: dict[str, list]) -> dict | None:
    """The next pair's record to run, or None: then it is appended to `pairs` not run (stopped
    early, or an earlier arm ended the measurement)."""
    record = new_pair(len(pairs))
    if not stopped and not invalid["baseline"] and not invalid["candidate"]:
        return record
    why = (
        f"stopped early: the candidate was at least {EARLY_STOP_FACTOR}x slower in "
        f"{EARLY_STOP_PAIRS} pairs"
        if stopped
        else "an earlier arm ended the measurement"
    )
    for name in ARMS:
        record["arms"][name] = new_arm(name)
        record["arms"][name]["reasons"].append({"code": "not_run", "detail": why})
    record["stopped_early"] = stopped
    pairs.append(record)
    return None


def settle_pair(record: dict, invalid: dict[str, list]) -> None:
    """After a pair ran: its arms' real reasons join `invalid`, an arm it never reached is
    not_run, and the pair is complete when both arms are valid."""
    for name in record["arms"]:
        real = [r for r in record["arms"][name]["reasons"] if r["code"] != "not_run"]
        invalid[name].extend(dict(r, pair=record["index"]) for r in real)
    for name in ARMS:
        if name not in record["arms"]:
            record["arms"][name] = new_arm(name)
            record["arms"][name]["reasons"].append(
                {"code": "not_run", "detail": "the other arm of this pair was invalid"}
            )
    record["complete"] = all(record["arms"][a]["valid"] for a in ARMS)


def add_log_tails(pairs: list[dict], logs: list[str | None]) -> None:
    """Each failed arm gets the log tail of the sandbox it ran in."""
    for p in pairs:
        for name in ARMS:
            arm = p["arms"][name]
            if (
                arm["reasons"]
                and arm["reasons"][0]["code"] != "not_run"
                and arm.get("sandbox") is not None
            ):
                arm["log_tail"] = logs[arm["sandbox"]]


def status_of(invalid: dict[str, list]) -> str:
    if invalid["candidate"]:
        return "candidate_invalid"
    return "baseline_invalid" if invalid["baseline"] else "ok"


def host_doc(affinity: list[int] | None, worker_cpus, referee_cpus) -> dict:
    return {
        "node": platform.node(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "numpy": C.np.__version__,
        "cpu_count": os.cpu_count(),
        "affinity": affinity,
        "worker_cpus": worker_cpus,
        "referee_cpus": referee_cpus,
        "loadavg_start": None,
    }


def timing_doc(spec: dict, flush: dict | None) -> dict:
    base = {
        "referee_clock": "time.perf_counter_ns in the referee, from before the input is "
        "handed over until the output has been copied out of the worker's buffer"
    }
    if spec["device"] == "cpu":
        return dict(
            base,
            clock="perf_counter_ns",
            sync=None,
            l2_flush=None,
            samples="the referee's clock around each call",
        )
    return dict(
        base,
        clock="cuda_event",
        sync="torch.cuda.synchronize() before the end event",
        l2_flush=flush,
        wall_ns="the referee's clock around each call (bounds the event)",
        samples="elapsed time between CUDA events recorded in the worker around the "
        "call and a device-wide synchronise, in ns; refused when above the referee's",
    )


def bandwidth_doc(m: dict, tensor_bytes: int, pairs: list[dict], fprint: dict) -> dict:
    bytes_per_call = m.get("bytes_per_call") or tensor_bytes
    peak = fprint.get("gpu_peak_gb_s")
    doc = {
        "bytes_per_call": bytes_per_call,
        "bytes_source": "measure.bytes_per_call"
        if m.get("bytes_per_call")
        else "input and output tensor bytes",
        "peak_gb_s": peak,
        "peak_source": fprint.get("gpu_peak_source"),
    }
    for arm in ARMS:
        samples = [
            ns for p in pairs for ns in p["arms"][arm]["samples_ns"] if p["arms"][arm]["valid"]
        ]
        median = float(statistics.median(samples)) if samples else None
        doc[arm] = C.bandwidth(bytes_per_call, median, peak)
    return doc


def early_stop(pairs: list[dict]) -> bool:
    """Stop a clearly slower candidate early: EARLY_STOP_PAIRS complete pairs, each with the
    candidate at least EARLY_STOP_FACTOR x slower (the interval then lies wholly below 1)."""
    done = [p for p in pairs if p["complete"]]
    if len(done) < EARLY_STOP_PAIRS:
        return False
    for p in done:
        b = statistics.median(p["arms"]["baseline"]["samples_ns"])
        c = statistics.median(p["arms"]["candidate"]["samples_ns"])
        if c < EARLY_STOP_FACTOR * b:
            return False
    return True


def pair_ratio(m: dict, pair: dict) -> float:
    values = [
        S.arm_value(pair["arms"][arm]["samples_ns"], m["metric"], m.get("units_per_call"))
        for arm in ARMS
    ]
    return S.log_ratio(values[0], values[1], m["direction"])


def look(m: dict, plan: dict, pairs: list[dict], since: int) -> dict | None:
    """The look the plan takes after these pairs (None: not a look): its interval and whether
    it stops the run. NB: a look is not valid, and stops nothing, when the measurement so far
    is host_busy or a pair since the previous look was contended: a busy host delays a
    decision, never makes one (the whole run is still judged host_busy by assess.py)."""
    done = [p for p in pairs if p["complete"]]
    look = next((lk for lk in plan["looks"] if lk["n"] == len(done)), None)
    if look is None or len(done) != len(pairs):
        return None
    out = {"n": look["n"], "c": look["c"], "spent_alpha": look["spent_alpha"]}
    interval = Q.interval_at([pair_ratio(m, p) for p in done], look)
    out["lo"], out["hi"] = (
        (math.exp(interval[0]), math.exp(interval[1])) if interval else (None, None)
    )
    busy = C.busy_reason({"pairs": done})
    recent = [p for p in done[since:] if C.contended(p)]
    out["valid"] = not busy and not recent
    out["why_invalid"] = (
        ("host_busy so far" if busy else f"{len(recent)} contended pair(s) since the last look")
        if not out["valid"]
        else None
    )
    out["stop"] = (
        Q.decide(interval[0], interval[1], m["stop_improvement"], m.get("stop_loss"))
        if interval and out["valid"] and look["n"] < plan["looks"][-1]["n"]
        else None
    )
    return out


def sequential_doc(m: dict, plan: dict, taken: list[dict], pairs: list[dict]) -> dict:
    """What the evidence records of the design: the plan, the looks taken, why it stopped."""
    stop = next((lk["stop"] for lk in taken if lk["stop"]), None)
    n = sum(p["complete"] for p in pairs)
    if stop is None:
        stop = "max_pairs" if n == plan["looks"][-1]["n"] else "ended"
    return {
        "design": m["sequential"],
        "first_look": m["first_look"],
        "look_every": m["look_every"],
        "stop_confidence": m["stop_confidence"],
        "stop_improvement": m["stop_improvement"],
        "stop_loss": m.get("stop_loss"),
        "plan": [{k: lk[k] for k in ("n", "c", "spent_alpha")} for lk in plan["looks"]],
        "looks": taken,
        "stopped_at": n,
        "stop": stop,
        "method": plan["method"],
    }


def failure_document(doc: dict, exc: BaseException) -> dict:
    """`doc` made writable (JSON-safe) with the candidate invalid as `referee_error`: what to
    write when the measured document itself could not be written."""
    safe = C.json_safe(doc)
    reason = {"code": "referee_error", "sample": None, "detail": C.error_summary(exc)}
    safe["status"] = "candidate_invalid"
    safe.setdefault("invalid", {"baseline": [], "candidate": []})
    safe["invalid"]["candidate"] = [reason, *(safe["invalid"].get("candidate") or [])]
    return safe


def measure_document(
    spec: dict,
    invalid: dict[str, list],
    digests: dict[str, tuple],
    same_tree: bool,
    pairs: list[dict],
    call_bytes: int,
) -> dict:
    """What every `rsi.measure/1` document says of its pairs (measure.py's and multirank.py's;
    the caller adds its referee, timing, host and expected output): the status from the
    invalid arms, A/A calibration when both arms are one tree, the pairs, device and bandwidth."""
    m = spec["measure"]
    facts = C.device_facts(spec)
    fprint = C.fingerprint(spec, facts, C.nvidia_smi() if spec["device"] != "cpu" else None)
    return {
        "schema": SCHEMA,
        "status": status_of(invalid),
        "calibration": same_tree or digests["baseline"][0] == digests["candidate"][0],
        "invalid": invalid,
        "baseline": {"digest": digests["baseline"][0], "files": digests["baseline"][1]},
        "candidate": {"digest": digests["candidate"][0], "files": digests["candidate"][1]},
        "measure": m,
        "threads": spec["threads"],
        "framework": spec["framework"],
        "probe_indices": [],
        "n_pairs": int(m["pairs"]),
        "n_complete_pairs": sum(p["complete"] for p in pairs),
        "stopped_early": any(p.get("stopped_early") for p in pairs),
        "pairs": [{k: v for k, v in p.items() if k != "stopped_early"} for p in pairs],
        "device": facts,
        "fingerprint": fprint,
        "bandwidth": bandwidth_doc(m, call_bytes, pairs, fprint),
    }
