"""The harness's core, stdlib only: the spec, its errors and exit code, JSON files.

What every judging step reads (check, measure, assess, an external project's assess): kept apart
from `_common.py` (input transport, processes, devices and fingerprints) so that each step's
action key covers only the code it runs — editing the GPU query re-runs checks and measurements,
never an assessment (rules/steps.py lists each step's files; tests/test_steps.py checks them).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import traceback
from pathlib import Path
from typing import Any

SPEC_SCHEMA = "rsi.harness.spec/1"
FRAMEWORKS = ("numpy", "torch")
DEVICES = ("cpu", "cuda")
INFRA_EXIT = 2
# NB: a measurement made while other work had the host's CPUs (busy_reason): its documents are
# written and judged (INCONCLUSIVE host_busy), and the step exits with this code, which its
# action declares (RSI_UNCACHED_EXIT, rules/steps.py): the build goes on with it, but it is never
# cached, so building again measures again (EX_TEMPFAIL)
BUSY_EXIT = 75
# NB: a pair in which more than this share of either arm's timed calls were contended (the
# referee or the worker waited for a CPU another process had for over half the call, from
# schedstat) measured the host's other work, not the candidate: when most pairs are, the host
# was busy and the measurement says nothing (host_busy)
CONTENTION_MAX = 0.5


class HarnessError(Exception):
    """An infrastructure or harness fault: the candidate could not be judged."""


# ---------------------------------------------------------------------------------------------
# JSON and files


def write_json(path: Path, doc: Any) -> None:
    text = json.dumps(doc, indent=1, sort_keys=True, allow_nan=False)
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    tmp.write_text(text + "\n", encoding="utf-8")
    os.replace(tmp, path)


def json_safe(doc: Any, depth: int = 64) -> Any:
    """A copy of `doc` that write_json can always write: non-finite floats become None, keys
    strings, anything else not JSON its str(), nesting past `depth` a marker string. For the
    evidence of a judged run whose document would not serialise (never for a normal one)."""
    if depth <= 0:
        return "<nested too deep>"
    if doc is None or isinstance(doc, (bool, int, str)):
        return doc
    if isinstance(doc, float):
        return doc if math.isfinite(doc) else None
    if isinstance(doc, dict):
        return {str(k): json_safe(v, depth - 1) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [json_safe(v, depth - 1) for v in doc]
    return str(doc)[:1000]


def error_summary(exc: BaseException) -> str:
    """An exception as one bounded line plus the innermost frames (evidence, not a crash)."""
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames))
    return f"{type(exc).__name__}: {str(exc)[:300]} (at {where})"


def read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise HarnessError(f"cannot read JSON from {path}: {exc}") from exc


def finite_or_none(value: float | None) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------------------------------------
# Spec


def load_spec(path: Path) -> dict:
    spec = read_json(path)
    if not isinstance(spec, dict):
        raise HarnessError("spec must be a JSON object")
    required = ("entry", "editable", "framework", "cases", "tolerances")
    missing = [k for k in required if k not in spec]
    if missing:
        raise HarnessError(f"spec {path} lacks required keys {missing}; see rules/harness/SPEC.md")
    if spec["framework"] not in FRAMEWORKS:
        raise HarnessError(f"spec framework must be one of {FRAMEWORKS}, not {spec['framework']!r}")
    entry = spec["entry"]
    if not (
        isinstance(entry, dict)
        and entry.get("module")
        and bool(entry.get("function")) != bool(entry.get("class"))
    ):
        raise HarnessError(
            "spec entry must be {'module': ..., 'function': ...} or {'module': ..., 'class': ...}"
        )
    if f"{entry['module']}.py" not in spec["editable"]:
        raise HarnessError(f"spec entry module {entry['module']}.py is not among editable files")
    names = [c.get("name") for c in spec["cases"]]
    if not names or len(set(names)) != len(names) or not all(names):
        raise HarnessError("spec cases must be non-empty and have unique non-empty names")
    for case in spec["cases"]:
        if case.get("out_dtype", case.get("dtype")) not in spec["tolerances"]:
            raise HarnessError(f"no tolerance for the output dtype of case {case['name']!r}")
    spec.setdefault("threads", 1)
    spec.setdefault("call_timeout_s", 30.0)
    spec.setdefault("startup_timeout_s", 120.0)
    spec.setdefault("device", "cpu")
    if spec["device"] not in DEVICES:
        raise HarnessError(f"spec device must be one of {DEVICES}, not {spec['device']!r}")
    if spec["device"] != "cpu" and spec["framework"] != "torch":
        raise HarnessError(f"spec device {spec['device']!r} needs framework 'torch'")
    spec.setdefault("toolchain", None)
    if spec["toolchain"] is not None and not isinstance(spec["toolchain"], str):
        raise HarnessError("spec toolchain must be a string (the engine's toolchain value)")
    spec.setdefault("seed", 0)
    measure = spec.setdefault("measure", {})
    measure.setdefault("warmups", 3)
    measure.setdefault("samples", 10)
    measure.setdefault("pairs", 10)
    measure.setdefault("metric", "latency")
    measure.setdefault("direction", "minimize" if measure["metric"] == "latency" else "maximize")
    measure.setdefault("seed", 0)
    measure.setdefault("probes", 32)
    measure.setdefault("value_checks", 3)
    measure.setdefault("units_per_call", None)
    measure.setdefault("arm_timeout_s", None)
    # NB: the sequential design (rules/harness/sequential.py): looks after first_look pairs and
    # every look_every more, 16 % of alpha open from the first look, a tenth more over the
    # interim looks and the rest at the last (Haybittle-Peto-type); it stops when the interval
    # clears 1 + stop_improvement or lies below 1 / (1 + stop_loss) at stop_confidence (the
    # loss bar keeps 0.01 of room for the run shift above the assessment's default
    # min_improvement, the gain bar 0.03 for the shift and a noise floor: a stopped loss that
    # is judged INCONCLUSIVE instead of FAIL was never going to PASS). "fixed": all pairs
    measure.setdefault("sequential", "peto")
    measure.setdefault("first_look", 8)
    measure.setdefault("look_every", 2)
    measure.setdefault("stop_confidence", 0.95)
    measure.setdefault("stop_improvement", 0.08)
    measure.setdefault("stop_loss", 0.06)
    if measure["sequential"] not in ("peto", "pocock", "obrien_fleming", "fixed"):
        raise HarnessError("measure.sequential must be peto, pocock, obrien_fleming or fixed")
    for key in ("first_look", "look_every"):
        if isinstance(measure[key], bool) or not isinstance(measure[key], int) or measure[key] < 1:
            raise HarnessError(f"measure.{key} must be a whole number >= 1")
    if not 0 < float(measure["stop_confidence"]) < 1 or float(measure["stop_improvement"]) < 0:
        raise HarnessError("measure.stop_confidence must lie in (0, 1), stop_improvement >= 0")
    loss = measure["stop_loss"]
    if isinstance(loss, bool) or not isinstance(loss, (int, float)) or not 0 <= loss < math.inf:
        raise HarnessError(f"measure.stop_loss must be a number >= 0, not {loss!r:.30}")
    bpc = measure.get("bytes_per_call")
    if bpc is not None and (isinstance(bpc, bool) or not isinstance(bpc, int) or bpc <= 0):
        raise HarnessError("measure.bytes_per_call must be a positive integer when given")
    if (measure["metric"], measure["direction"]) not in (
        ("latency", "minimize"),
        ("throughput", "maximize"),
    ):
        raise HarnessError(
            "measure metric/direction must be latency/minimize or throughput/maximize"
        )
    if measure["metric"] == "throughput" and not measure["units_per_call"]:
        raise HarnessError("measure metric 'throughput' needs measure.units_per_call")
    assess = spec.setdefault("assess", {})
    assess.setdefault("min_improvement", 0.05)
    assess.setdefault("confidence", 0.95)
    assess.setdefault("bootstrap_resamples", 2000)
    assess.setdefault("min_pairs", 5)
    return spec


def tolerance_for(spec: dict, dtype: str) -> tuple[float, float]:
    tol = spec["tolerances"].get(dtype)
    if tol is None:
        raise HarnessError(f"spec has no tolerance for dtype {dtype}")
    return float(tol["atol"]), float(tol["rtol"])


# ---------------------------------------------------------------------------------------------
# Contention


def contended(pair: dict) -> bool:
    return any(
        (pair["arms"][arm].get("contention") or 0.0) > CONTENTION_MAX
        for arm in ("baseline", "candidate")
    )


def busy_reason(doc: dict) -> str | None:
    """Why a measurement says nothing about the implementations (None: it does): most of its
    complete pairs are contended (most of an arm's calls waited for a CPU another process had)."""
    complete = [p for p in doc.get("pairs") or [] if p.get("complete")]
    busy = [p for p in complete if contended(p)]
    if complete and 2 * len(busy) > len(complete):
        return (
            f"{len(busy)} of {len(complete)} pairs had an arm with more than "
            f"{CONTENTION_MAX:.0%} of its timed calls contended (the referee or the worker "
            "waited for a CPU another process had): other work had the host's CPUs; measure "
            "again on a quiet host (a busy measurement is never cached: building again "
            "measures again)"
        )
    return None
