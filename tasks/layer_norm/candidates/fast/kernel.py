import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    """The library's layer norm, in float32."""

    def __init__(self, hidden):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(hidden))
        self.bias = nn.Parameter(0.1 * torch.randn(hidden))

    def forward(self, x):
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, 1e-5)
