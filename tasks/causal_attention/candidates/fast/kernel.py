import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    """The library's fused causal attention, float32, no materialised mask."""

    def __init__(self):
        super().__init__()

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
