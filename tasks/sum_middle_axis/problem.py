import torch
import torch.nn as nn


class Model(nn.Module):
    """Sum over a non-last axis: y[b, 0, j] = sum_i x[b, i, j].

    Reference implementation: moves the axis last, makes it contiguous and sums in float64."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        moved = x.transpose(1, 2).contiguous().double()
        return moved.sum(dim=-1, keepdim=True).transpose(1, 2).float()


batch = 16
reduce = 256
inner = 256


def get_inputs():
    return [torch.randn(batch, reduce, inner)]


def get_init_inputs():
    return []
