"""SiLU-and-mul with torch's fused silu kernel in the input dtype, then an in-place multiply:
two passes and one temporary instead of the baseline's casts, sigmoid and two products."""

import torch
import torch.nn.functional as F


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]).mul_(x[..., d:])
