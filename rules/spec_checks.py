"""The tables a task and a binding declare (cases, tolerances, a workload, the measurement and
assessment policies), checked at analysis: a shape that is not a list of sizes, a negative
size, an unknown dtype, a misspelt policy key is a declaration error naming the field, never
a harness fault when the first check runs. Checks only; never changes a value (keys stay)."""

from __future__ import annotations

import math
from typing import Any, Callable

# NB: the element types the harness can make inputs of and compare (numpy and torch names)
DTYPES = (
    "bfloat16",
    "bool",
    "complex64",
    "complex128",
    "float16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
)
MAX_DIM = 1 << 31
# NB: past these a measurement never ends in any timeout, and a seed is no seed numpy takes
MAX_COUNT = 10**7
MAX_SEED = (1 << 63) - 1
MEASURE_KEYS = {
    "workload": "table",
    "warmups": "count0",
    "samples": "count",
    "pairs": "count",
    "seed": "seed",
    "probes": "count0",
    "value_checks": "count0",
    "metric": ("latency", "throughput"),
    "direction": ("minimize", "maximize"),
    "units_per_call": "positive",
    "bytes_per_call": "count",
    "arm_timeout_s": "positive",
    "sequential": ("peto", "pocock", "obrien_fleming", "fixed"),
    "first_look": "count",
    "look_every": "count",
    "stop_confidence": "open_fraction",
    "stop_improvement": "fraction0",
    "stop_loss": "fraction0",
}
ASSESS_KEYS = {
    "min_improvement": "fraction0",
    "confidence": "open_fraction",
    "bootstrap_resamples": "count",
    "min_pairs": "count",
}

Error = Callable[..., Exception]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def _shape_problem(shape: Any) -> str | None:
    if not isinstance(shape, list):
        return f"shape must be a list of sizes such as [4, 8], not {shape!r:.40}"
    for size in shape:
        if not _is_int(size):
            return f"shape {shape!r:.40} holds {size!r:.20}, not a whole number"
        if not 1 <= size <= MAX_DIM:
            return f"shape {shape!r:.40} holds the size {size}: sizes are from 1 to 2**31"
    return None


def _dtype_problem(dtype: Any, key: str = "dtype") -> str | None:
    if not isinstance(dtype, str) or dtype not in DTYPES:
        return f"{key} {dtype!r:.30} is not one of {', '.join(DTYPES)}"
    return None


def check_case(case: Any, where: str, tolerances: dict | None) -> str | None:
    """What is wrong with one case (or workload) table, or None."""
    if not isinstance(case, dict):
        return f"{where} must be a table, not {case!r:.40}"
    name = case.get("name")
    if not isinstance(name, str) or not name:
        return f"{where} needs a non-empty name"
    if "shape" not in case:
        return f"{where} ({name}) needs a shape"
    problem = _shape_problem(case["shape"])
    if problem:
        return f"{where} ({name}): {problem}"
    for key in ("dtype", "out_dtype"):
        if key in case or key == "dtype":
            problem = _dtype_problem(case.get(key), key)
            if problem:
                return f"{where} ({name}): {problem}"
    kind = case.get("kind", "normal")
    if not isinstance(kind, str) or not kind:
        return f"{where} ({name}): kind must be a non-empty string"
    if tolerances is not None:
        out = case.get("out_dtype", case["dtype"])
        if out not in tolerances:
            return f"{where} ({name}): the output dtype {out} has no entry in tolerances"
    return None


def check_task(attrs: dict, error: Error) -> None:
    """The task's `entry`, `tolerances` and `cases`."""
    for key, value in attrs["entry"].items():
        if key not in ("module", "function", "class"):
            raise error(f"unknown key {key!r} (module, function, class)", "entry")
        if not value.isidentifier():
            raise error(f"{key} {value!r:.40} is not a Python name", "entry")
    tolerances = attrs["tolerances"]
    if not tolerances:
        raise error("must give {atol, rtol} for at least one dtype", "tolerances")
    for dtype, tol in tolerances.items():
        problem = _dtype_problem(dtype, "the key")
        if problem:
            raise error(problem, "tolerances")
        if not isinstance(tol, dict) or set(tol) != {"atol", "rtol"}:
            raise error(f"{dtype} must be {{atol = ..., rtol = ...}}", "tolerances")
        for key, value in tol.items():
            if not _is_number(value) or value < 0:
                raise error(f"{dtype}.{key} must be a number >= 0, not {value!r:.30}", "tolerances")
    cases = attrs["cases"]
    if not cases:
        raise error("must list at least one case", "cases")
    names: set[str] = set()
    for i, case in enumerate(cases):
        problem = check_case(case, f"cases[{i}]", tolerances)
        if problem:
            raise error(problem, "cases")
        if case["name"] in names:
            raise error(f"cases[{i}]: the name {case['name']!r} is used twice", "cases")
        names.add(case["name"])


def _value_problem(key: str, want: Any, value: Any) -> str | None:
    if isinstance(want, tuple):
        return None if value in want else f"{key} must be one of {', '.join(want)}"
    if want == "seed":
        ok = _is_int(value) and 0 <= value <= MAX_SEED
        return None if ok else f"{key} must be a whole number from 0 to 2**63-1, not {value!r:.30}"
    if want in ("count", "count0"):
        low = 1 if want == "count" else 0
        ok = _is_int(value) and low <= value <= MAX_COUNT
        return (
            None
            if ok
            else f"{key} must be a whole number from {low} to {MAX_COUNT}, not {value!r:.30}"
        )
    if want == "positive":
        ok = _is_number(value) and value > 0
        return None if ok else f"{key} must be a number > 0, not {value!r:.30}"
    if want == "fraction0":
        ok = _is_number(value) and value >= 0
        return None if ok else f"{key} must be a number >= 0, not {value!r:.30}"
    if want == "open_fraction":
        ok = _is_number(value) and 0 < value < 1
        return None if ok else f"{key} must be a number between 0 and 1, not {value!r:.30}"
    return None


def check_policy(table: dict, known: dict, field: str, error: Error) -> None:
    for key, value in table.items():
        if key not in known:
            raise error(
                f"unknown key {key!r}",
                field,
                hint=f"known keys: {', '.join(sorted(known))}",
            )
        problem = None if known[key] == "table" else _value_problem(key, known[key], value)
        if problem:
            raise error(problem, field)


def check_binding(attrs: dict, tolerances: dict, error: Error) -> None:
    """The binding's `measure` (its workload included) and `assess` tables."""
    measure = attrs["measure"]
    check_policy(measure, MEASURE_KEYS, "measure", error)
    if "workload" not in measure:
        raise error("needs a workload = {name, shape, dtype, kind}", "measure")
    problem = check_case(measure["workload"], "workload", tolerances)
    if problem:
        raise error(problem, "measure")
    check_policy(attrs["assess"], ASSESS_KEYS, "assess", error)
