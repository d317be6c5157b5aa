"""Tensor-parallel MLP oracle: y = silu(x @ w_up^T + b_up) @ w_down^T over the whole layer, in
float64 numpy. Every rank must return all of y (the row-parallel down-projection's partial sums,
all-reduced), so each rank's expected output is this one (`rank_output`)."""

from __future__ import annotations

import numpy as np
import torch


def _f64(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float64).numpy().copy()


def reference(x, w_up, b_up, w_down) -> np.ndarray:
    h = _f64(x) @ _f64(w_up).T + _f64(b_up)
    a = h / (1.0 + np.exp(-h))
    return a @ _f64(w_down).T


def rank_output(reference: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """What rank `rank` must return: the whole output (replicated on every rank)."""
    return reference
