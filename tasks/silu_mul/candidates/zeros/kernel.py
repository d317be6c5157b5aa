"""WRONG on purpose: returns zeros of the right shape, dtype and device."""

import torch


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros((*x.shape[:-1], x.shape[-1] // 2), dtype=x.dtype, device=x.device)
