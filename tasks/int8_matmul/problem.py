import torch
import torch.nn as nn


class Model(nn.Module):
    """Int8 quantised matmul with per-row and per-column scales:
    y[i, j] = scale_a[i] * scale_b[j] * sum_k a[i, k] * b[k, j], with a, b int8.

    Reference implementation: dequantise both operands to float64, then matmul."""

    def __init__(self):
        super().__init__()

    def forward(self, a, b, scale_a, scale_b):
        ad = a.double() * scale_a.double()[:, None]
        bd = b.double() * scale_b.double()[None, :]
        return (ad @ bd).float()


M = 128
K = 256
N = 256


def get_inputs():
    a = torch.randint(-127, 128, (M, K), dtype=torch.int8)
    b = torch.randint(-127, 128, (K, N), dtype=torch.int8)
    scale_a = torch.rand(M) * 0.02 + 0.001
    scale_b = torch.rand(N) * 0.02 + 0.001
    return [a, b, scale_a, scale_b]


def get_init_inputs():
    return []
