"""WRONG on purpose: applies silu to the up half and multiplies by the gate half."""

import torch
import torch.nn.functional as F


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return (F.silu(x[..., d:].to(torch.float32)) * x[..., :d].to(torch.float32)).to(x.dtype)
