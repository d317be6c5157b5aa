"""WRONG on purpose: takes the mean square over the rows (dim 0) instead of the hidden axis."""

import torch


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.to(torch.float32)
    y = xf / torch.sqrt(torch.mean(xf * xf, dim=0, keepdim=True) + eps)
    return (y * weight.to(torch.float32)).to(x.dtype)
