"""Softmax over the last axis, computed in the input dtype with in-place passes."""

import numpy as np


def softmax(x: np.ndarray) -> np.ndarray:
    e = x - x.max(axis=-1, keepdims=True)
    np.exp(e, out=e)
    e /= e.sum(axis=-1, keepdims=True)
    return e
