"""SiLU-and-mul oracle: y = silu(g) * u with g = x[..., :d], u = x[..., d:] and
silu(g) = g * sigmoid(g), in float64 numpy with a sigmoid that never overflows (it takes exp of
non-positive numbers only)."""

from __future__ import annotations

import numpy as np
import torch


def _sigmoid(g: np.ndarray) -> np.ndarray:
    z = np.exp(-np.abs(g))  # in (0, 1]: never overflows
    return np.where(g >= 0, 1.0 / (1.0 + z), z / (1.0 + z))


def reference(x) -> np.ndarray:
    x64 = x.detach().to(torch.float64).numpy().copy()
    d = x64.shape[-1] // 2
    gate, up = x64[..., :d], x64[..., d:]
    return gate * _sigmoid(gate) * up
