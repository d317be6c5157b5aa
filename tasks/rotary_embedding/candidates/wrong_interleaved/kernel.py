import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Wrong: the interleaved layout (pairs 2i, 2i+1), not the half-split one."""

    def __init__(self, head_dim, base):
        super().__init__()
        self.head_dim = head_dim
        self.base = base

    def forward(self, x):
        t, d = x.shape[-2], x.shape[-1]
        half = d // 2
        inv = 1.0 / (self.base ** (torch.arange(half, dtype=torch.float64) / half))
        angles = torch.arange(t, dtype=torch.float64)[:, None] * inv[None, :]
        cos, sin = torch.cos(angles).float(), torch.sin(angles).float()
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2] = x1 * cos - x2 * sin
        out[..., 1::2] = x1 * sin + x2 * cos
        return out
