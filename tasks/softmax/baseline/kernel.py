"""Softmax over the last axis (baseline): computed in float64 for safety, then cast back."""

import numpy as np


def softmax(x: np.ndarray) -> np.ndarray:
    xf = x.astype(np.float64)
    e = np.exp(xf - xf.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(x.dtype)
