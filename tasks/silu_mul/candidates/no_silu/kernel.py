"""WRONG on purpose: multiplies the halves without the silu activation."""

import torch


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return (x[..., :d].to(torch.float32) * x[..., d:].to(torch.float32)).to(x.dtype)
