import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Layer norm over the last axis with a learned scale and shift (eps 1e-5).

    Reference implementation: mean and variance in float64, written out, cast back."""

    def __init__(self, hidden):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(hidden))
        self.bias = nn.Parameter(0.1 * torch.randn(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xd = x.double()
        mean = xd.mean(dim=-1, keepdim=True)
        var = ((xd - mean) ** 2).mean(dim=-1, keepdim=True)
        y = (xd - mean) / torch.sqrt(var + 1e-5)
        return (y * self.weight.double() + self.bias.double()).to(x.dtype)


rows = 256
hidden = 1024


def get_inputs():
    return [torch.randn(rows, hidden)]


def get_init_inputs():
    return [hidden]
