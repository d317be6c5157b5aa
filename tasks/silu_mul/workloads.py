"""SiLU-and-mul workloads: deterministic torch CPU inputs from (case, seed), numpy's RNG."""

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
    """Return {"x": [rows, 2 * d]} in case["dtype"]; x[..., :d] is the gate, x[..., d:] the up.

    kinds: normal, zeros, large (x ~ N(0, scale)), gate_negative (the gate half ~ -|N(0, scale)|,
    where silu underflows towards -0 and a naive exp(-g) overflows), transposed (x is a
    non-contiguous .t() view), strided (every other column of a twice-as-wide tensor).
    """
    rng = np.random.default_rng(seed)
    rows, width = (int(n) for n in case["shape"])
    if width % 2:
        raise ValueError(f"silu_mul needs an even last dimension, got {width}")
    dtype = getattr(torch, case["dtype"])
    kind = case.get("kind", "normal")
    scale = float(case.get("scale", 1.0))
    if kind == "transposed":
        x = _tensor(_normal(rng, (width, rows), scale), dtype).t()
    elif kind == "strided":
        x = _tensor(_normal(rng, (rows, 2 * width), scale), dtype)[:, ::2]
    elif kind == "zeros":
        x = torch.zeros((rows, width), dtype=dtype)
    elif kind == "gate_negative":
        values = _normal(rng, (rows, width), 1.0)
        values[:, : width // 2] = -np.abs(values[:, : width // 2]) * np.float32(scale)
        x = _tensor(values, dtype)
    elif kind in ("normal", "large"):
        x = _tensor(_normal(rng, (rows, width), scale), dtype)
    else:
        raise ValueError(f"unknown silu_mul workload kind {kind!r}")
    return {"x": x}
