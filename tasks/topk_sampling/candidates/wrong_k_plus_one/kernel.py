import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Wrong: keeps k + 1 logits."""

    def __init__(self, k, temperature):
        super().__init__()
        self.k = k
        self.temperature = temperature

    def forward(self, logits):
        values, index = torch.topk(logits, self.k + 1, dim=-1)
        probs = torch.softmax(values / self.temperature, dim=-1)
        return torch.zeros_like(logits).scatter_(-1, index, probs)
