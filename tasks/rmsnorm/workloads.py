"""RMSNorm workloads: deterministic torch CPU inputs from (case, seed), drawn with numpy's RNG."""

from __future__ import annotations

import numpy as np
import torch


def _tensor(values: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).to(dtype)


def _normal(rng: np.random.Generator, shape: tuple[int, ...], scale: float) -> np.ndarray:
    values = rng.standard_normal(shape, dtype=np.float32)
    values *= np.float32(scale)
    return values


def make_inputs(case: dict, seed: int) -> dict:
    """Return {"x": [rows, hidden], "weight": [hidden], "eps": float} in case["dtype"].

    kinds: normal, zeros, large (x ~ N(0, scale)), tiny (x ~ N(0, scale) with a small scale, so
    eps dominates), transposed (x is a non-contiguous .t() view), strided (every other column).
    """
    rng = np.random.default_rng(seed)
    rows, hidden = (int(n) for n in case["shape"])
    dtype = getattr(torch, case["dtype"])
    kind = case.get("kind", "normal")
    scale = float(case.get("scale", 1.0))
    weight = _tensor(1.0 + _normal(rng, (hidden,), 0.5), dtype)
    eps = float(case.get("eps", 1e-6))
    if kind == "transposed":
        x = _tensor(_normal(rng, (hidden, rows), scale), dtype).t()
    elif kind == "strided":
        x = _tensor(_normal(rng, (rows, 2 * hidden), scale), dtype)[:, ::2]
    elif kind == "zeros":
        x = torch.zeros((rows, hidden), dtype=dtype)
    elif kind in ("normal", "large", "tiny"):
        x = _tensor(_normal(rng, (rows, hidden), scale), dtype)
    else:
        raise ValueError(f"unknown rmsnorm workload kind {kind!r}")
    return {"x": x, "weight": weight, "eps": eps}
