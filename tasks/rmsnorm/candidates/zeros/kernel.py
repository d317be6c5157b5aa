"""WRONG on purpose: returns zeros of the right shape and dtype."""

import torch


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.zeros(x.shape, dtype=x.dtype)
