"""Tensor-parallel MLP workloads: global inputs from (case, seed), and each rank's shard.

`make_inputs(case, seed)` draws the whole layer (what the oracle sees); `shard_inputs(inputs,
rank, world_size)` is what rank `rank` is handed: `x` whole (replicated), the rows of `w_up` and
`b_up` and the columns of `w_down` of its slice of the hidden (ffn) axis (column-parallel
up-projection, row-parallel down-projection; slices as numpy.array_split cuts them, so an ffn
size that does not divide evenly gives the first ranks one more row).
"""

from __future__ import annotations

import numpy as np
import torch


def _tensor(values: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).to(dtype)


def make_inputs(case: dict, seed: int) -> dict:
    """{"x": [tokens, hidden], "w_up": [ffn, hidden], "b_up": [ffn], "w_down": [hidden, ffn]}.

    case["shape"] is [tokens, hidden, ffn]; kinds: normal (x ~ N(0, scale)), large (scale
    given, e.g. 100), zeros (x all zero: the output is silu(b_up) @ w_down^T)."""
    rng = np.random.default_rng(seed)
    tokens, hidden, ffn = (int(n) for n in case["shape"])
    dtype = getattr(torch, case["dtype"])
    kind = case.get("kind", "normal")
    scale = float(case.get("scale", 1.0))
    if kind not in ("normal", "large", "zeros"):
        raise ValueError(f"unknown tp_mlp workload kind {kind!r}")
    x = rng.standard_normal((tokens, hidden), dtype=np.float32) * np.float32(scale)
    if kind == "zeros":
        x[...] = 0.0
    w_up = rng.standard_normal((ffn, hidden), dtype=np.float32) / np.float32(np.sqrt(hidden))
    b_up = rng.standard_normal((ffn,), dtype=np.float32) * np.float32(0.1)
    w_down = rng.standard_normal((hidden, ffn), dtype=np.float32) / np.float32(np.sqrt(ffn))
    return {
        "x": _tensor(x, dtype),
        "w_up": _tensor(w_up, dtype),
        "b_up": _tensor(b_up, dtype),
        "w_down": _tensor(w_down, dtype),
    }


def _bounds(n: int, rank: int, world_size: int) -> tuple[int, int]:
    sizes = [len(part) for part in np.array_split(np.arange(n), world_size)]
    start = sum(sizes[:rank])
    return start, start + sizes[rank]


def shard_inputs(inputs: dict, rank: int, world_size: int) -> dict:
    """Rank `rank`'s inputs: x whole; its rows of w_up and b_up, its columns of w_down."""
    lo, hi = _bounds(inputs["w_up"].shape[0], rank, world_size)
    return {
        "x": inputs["x"].clone(),
        "w_up": inputs["w_up"][lo:hi].contiguous(),
        "b_up": inputs["b_up"][lo:hi].contiguous(),
        "w_down": inputs["w_down"][:, lo:hi].contiguous(),
    }
