import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    """The library's direct float32 convolution."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)

    def forward(self, x):
        return F.conv2d(x, self.conv.weight, self.conv.bias, padding=1)
