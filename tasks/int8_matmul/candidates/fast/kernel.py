import torch.nn as nn


class ModelNew(nn.Module):
    """float32 matmul of the int8 operands (every product and partial sum below 2^24 is exact
    for K < 1040), scales applied once to the result."""

    def __init__(self):
        super().__init__()

    def forward(self, a, b, scale_a, scale_b):
        return (a.float() @ b.float()) * scale_a[:, None] * scale_b[None, :]
