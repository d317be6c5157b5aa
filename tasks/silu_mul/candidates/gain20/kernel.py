"""SiLU-and-mul in float32 like the baseline, but the products run in place on the sigmoid's
buffer (fewer temporaries). A modest gain: the detection benchmark's ~20 % candidate."""

import torch


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    gate = x[..., :d].to(torch.float32)
    up = x[..., d:].to(torch.float32)
    return torch.sigmoid(gate).mul_(gate).mul_(up).to(x.dtype)
