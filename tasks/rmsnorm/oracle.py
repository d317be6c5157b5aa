"""RMSNorm oracle: y = x / sqrt(mean(x^2 over the last axis) + eps) * weight, in float64 numpy."""

from __future__ import annotations

import numpy as np
import torch


def reference(x, weight, eps) -> np.ndarray:
    x64 = x.detach().to(torch.float64).numpy().copy()
    w64 = weight.detach().to(torch.float64).numpy().copy()
    mean_square = np.einsum("ij,ij->i", x64, x64)[:, None] / x64.shape[-1]
    return x64 / np.sqrt(mean_square + float(eps)) * w64
