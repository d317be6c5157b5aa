"""WRONG on purpose: leaves eps out, so an all-zero row gives NaN and tiny rows blow up."""

import torch


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.to(torch.float32)
    y = xf / torch.sqrt(torch.mean(xf * xf, dim=-1, keepdim=True))
    return (y * weight.to(torch.float32)).to(x.dtype)
