import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    """Wrong: the bias is left out of the epilogue."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return F.gelu(x @ self.linear.weight.t())
