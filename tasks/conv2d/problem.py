import torch
import torch.nn as nn


class Model(nn.Module):
    """2-D convolution, 3x3, stride 1, padding 1, with bias.

    Reference implementation: unfold (im2col) then a float64 matmul."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        cols = torch.nn.functional.unfold(x.double(), 3, padding=1)  # n, c*9, h*w
        weight = self.conv.weight.double().reshape(self.conv.out_channels, -1)
        y = weight @ cols + self.conv.bias.double()[:, None]
        return y.reshape(n, self.conv.out_channels, h, w).float()


batch = 4
in_channels = 16
out_channels = 32
height = 32
width = 32


def get_inputs():
    return [torch.randn(batch, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]
