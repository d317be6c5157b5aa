import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    """Wrong: a true convolution (kernel flipped), where the problem means cross-correlation."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)

    def forward(self, x):
        return F.conv2d(x, self.conv.weight.flip(-1, -2), self.conv.bias, padding=1)
