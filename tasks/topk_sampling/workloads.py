"""Workloads of the KernelBench problem in problem.py (`rsi import kernelbench`).

make_inputs(case, seed): the problem's get_inputs() with torch's RNG seeded by `seed` (the
referee's secret) and the free sizes (VARIED, in order) set from case["shape"]; kinds: normal,
large (x100), tiny (x1e-3), transposed (the same values as non-contiguous views)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

VARIED = ["batch", "vocab"]
NAMES = ["logits"]
INIT = [50, 0.8]
INIT_SEED = 0
SCALE = {"normal": 1.0, "large": 100.0, "tiny": 1e-3, "transposed": 1.0}


def _load():
    path = Path(__file__).resolve().parent / "problem.py"
    spec = importlib.util.spec_from_file_location(f"_rsi_problem_{id(path)}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_P = _load()


def init_inputs() -> list:
    return list(INIT)


def make_inputs(case: dict, seed: int) -> dict:
    kind = case.get("kind", "normal")
    if kind not in SCALE:
        raise ValueError(f"unknown workload kind {kind!r}")
    sizes = dict(zip(VARIED, (int(n) for n in case.get("shape") or []), strict=False))
    saved = {g: getattr(_P, g) for g in sizes}
    try:
        for g, n in sizes.items():
            setattr(_P, g, n)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed) % (1 << 63))
            values = list(_P.get_inputs())
    finally:
        for g, n in saved.items():
            setattr(_P, g, n)
    out = {}
    for name, value in zip(NAMES, values, strict=True):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            value = value * SCALE[kind] if SCALE[kind] != 1.0 else value
            if kind == "transposed" and value.dim() >= 2:
                value = value.transpose(-1, -2).contiguous().transpose(-1, -2)
        out[name] = value
    return out
