"""SiLU-and-mul (baseline): float32 math, sigmoid, two products, each a new tensor, cast back."""

import torch


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    gate = x[..., :d].to(torch.float32)
    up = x[..., d:].to(torch.float32)
    return (gate * torch.sigmoid(gate) * up).to(x.dtype)
