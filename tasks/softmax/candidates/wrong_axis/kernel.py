"""WRONG on purpose: normalises over the first axis instead of the last."""

import numpy as np


def softmax(x: np.ndarray) -> np.ndarray:
    xf = x.astype(np.float64)
    xf -= xf.max(axis=0, keepdims=True)
    np.exp(xf, out=xf)
    xf /= xf.sum(axis=0, keepdims=True)
    return xf.astype(x.dtype)
