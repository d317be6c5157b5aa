import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Angles computed once per sequence length (float64, then kept in float32); the rotation
    in float32 with no concatenation copies."""

    def __init__(self, head_dim, base):
        super().__init__()
        self.head_dim = head_dim
        self.base = base
        self._cache = {}

    def _tables(self, t, half):
        tables = self._cache.get((t, half))
        if tables is None:
            inv = 1.0 / (self.base ** (torch.arange(half, dtype=torch.float64) / half))
            angles = torch.arange(t, dtype=torch.float64)[:, None] * inv[None, :]
            tables = (torch.cos(angles).float(), torch.sin(angles).float())
            self._cache[(t, half)] = tables
        return tables

    def forward(self, x):
        t, d = x.shape[-2], x.shape[-1]
        half = d // 2
        cos, sin = self._tables(t, half)
        x1, x2 = x[..., :half], x[..., half:]
        out = torch.empty_like(x)
        torch.sub(x1 * cos, x2 * sin, out=out[..., :half])
        torch.add(x1 * sin, x2 * cos, out=out[..., half:])
        return out
