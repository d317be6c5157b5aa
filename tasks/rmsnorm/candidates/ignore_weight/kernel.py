"""WRONG on purpose: never applies the weight."""

import torch


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.to(torch.float32)
    return (xf / torch.sqrt(torch.mean(xf * xf, dim=-1, keepdim=True) + eps)).to(x.dtype)
