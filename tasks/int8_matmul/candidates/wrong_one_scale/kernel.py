import torch.nn as nn


class ModelNew(nn.Module):
    """Wrong: the column scales are forgotten."""

    def __init__(self):
        super().__init__()

    def forward(self, a, b, scale_a, scale_b):
        return (a.float() @ b.float()) * scale_a[:, None]
