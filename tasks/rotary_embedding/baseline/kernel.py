import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Rotary position embedding (half-split layout): for each position t and pair i,
    (x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos), x1 = x[..., :d/2], x2 = x[..., d/2:].

    Reference implementation: the angles recomputed every call, in float64."""

    def __init__(self, head_dim, base):
        super().__init__()
        self.head_dim = head_dim
        self.base = base

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t, d = x.shape[-2], x.shape[-1]
        half = d // 2
        inv = 1.0 / (self.base ** (torch.arange(half, dtype=torch.float64) / half))
        angles = torch.arange(t, dtype=torch.float64)[:, None] * inv[None, :]
        cos, sin = torch.cos(angles), torch.sin(angles)
        xd = x.double()
        x1, x2 = xd[..., :half], xd[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).float()


batch = 2
heads = 8
seq = 256
head_dim = 64


def get_inputs():
    return [torch.randn(batch, heads, seq, head_dim)]


def get_init_inputs():
    return [head_dim, 10000.0]
