import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """topk instead of a full sort; softmax over the k kept values only, in float32."""

    def __init__(self, k, temperature):
        super().__init__()
        self.k = k
        self.temperature = temperature

    def forward(self, logits):
        values, index = torch.topk(logits, self.k, dim=-1)
        probs = torch.softmax(values / self.temperature, dim=-1)
        return torch.zeros_like(logits).scatter_(-1, index, probs)
