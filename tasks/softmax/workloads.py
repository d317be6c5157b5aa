"""Softmax workloads: deterministic numpy inputs from (case, seed). Stdlib + numpy only."""

from __future__ import annotations

import numpy as np


def make_inputs(case: dict, seed: int) -> dict[str, np.ndarray]:
    """Return {"x": array of case["shape"] and case["dtype"]}; case["kind"] picks the values.

    kinds: normal, zeros, large (uniform +-case.get("scale", 1e4)), negative_large (every value
    -scale, so exp without max subtraction underflows to 0/0), tiny (+-1e-30), transposed (a
    non-contiguous .T view), strided (every other column of a wider array).
    """
    rng = np.random.default_rng(seed)
    rows, cols = (int(n) for n in case["shape"])
    dtype = np.dtype(case["dtype"])
    kind = case.get("kind", "normal")
    scale = float(case.get("scale", 1e4))
    if kind == "normal":
        x = rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(case.get("std", 3.0))
    elif kind == "zeros":
        x = np.zeros((rows, cols))
    elif kind == "large":
        x = rng.uniform(-scale, scale, (rows, cols))
    elif kind == "negative_large":
        x = np.full((rows, cols), -scale)
    elif kind == "tiny":
        x = rng.uniform(-1e-30, 1e-30, (rows, cols))
    elif kind == "transposed":
        return {"x": (rng.standard_normal((cols, rows)) * 3.0).astype(dtype).T}
    elif kind == "strided":
        return {"x": (rng.standard_normal((rows, 2 * cols)) * 3.0).astype(dtype)[:, ::2]}
    else:
        raise ValueError(f"unknown softmax workload kind {kind!r}")
    return {"x": np.ascontiguousarray(x.astype(dtype))}
