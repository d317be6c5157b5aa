"""Softmax over the last axis: subtracts the max in the input dtype, exponentiates in float64."""

import numpy as np


def softmax(x: np.ndarray) -> np.ndarray:
    e = (x - x.max(axis=-1, keepdims=True)).astype(np.float64)
    np.exp(e, out=e)
    total = e.sum(axis=-1, keepdims=True)
    out = e.astype(x.dtype)
    out /= total.astype(x.dtype)
    return out
