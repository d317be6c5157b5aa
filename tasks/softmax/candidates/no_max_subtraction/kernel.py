"""WRONG on purpose: skips the max subtraction, so exp overflows (or underflows to 0/0)."""

import numpy as np


def softmax(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(x)
        return e / e.sum(axis=-1, keepdims=True)
