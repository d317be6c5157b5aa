"""Workloads of the KernelBench problem in problem.py (`rsi import kernelbench`).

make_inputs(case, seed): the problem's get_inputs() with torch's RNG seeded by `seed` (the
referee's secret) and the free sizes (VARIED, in order) set from case["shape"]; kinds: normal,
large (x4), tiny (x1e-3), transposed (the same values as non-contiguous views).

NB: "large" is x4 here, not the importer's x100: q and k both scale, so the scores grow with
the square. At x100 they spread ~1e4 apart, the softmax is an argmax, and near-ties are decided
by float32 rounding: a correct float32 kernel (the library's own fused attention) missed the
float64 oracle on 17 of 30 seeds. At x4 it missed on 0 of 300 (x30: 26 of 30)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

VARIED = ["batch", "heads", "seq", "head_dim"]
NAMES = ["q", "k", "v"]
INIT = []
INIT_SEED = 0
SCALE = {"normal": 1.0, "large": 4.0, "tiny": 1e-3, "transposed": 1.0}


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
