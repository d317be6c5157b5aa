"""Probe one KernelBench-format problem file (run by `rsi import kernelbench` in its own
interpreter: the file is the user's code). Prints one JSON document on stdout:

{"ok": true, "init": [...], "inputs": [{name, kind, shape, dtype} ...], "output": {shape,
dtype}, "defaults": {global: int}, "varied": [global, ...], "small": {global: int}} or
{"ok": false, "reason": "..."}.

A problem is a module with `class Model(nn.Module)`, `get_inputs()` and `get_init_inputs()`.
Module-level int constants that change the inputs' shapes but not the init inputs are the
problem's free sizes (`varied`): hidden cases draw them from ranges below their defaults.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import io
import json
import re
import sys
import tokenize

DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "bool")


class Refused(Exception):
    pass


def _code_without_comments(src: str) -> str:
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.STRING):
            out.append(tok.string)
    return " ".join(out)


def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _json_value(value):
    json.dumps(value)
    return value


def probe(path: str) -> dict:
    src = open(path, encoding="utf-8").read()
    try:
        tree = ast.parse(src)
    except SyntaxError as exc:
        raise Refused(f"not valid Python: {exc}") from None
    if re.search(r"\bcuda\b|\btriton\b|load_inline", _code_without_comments(src)):
        raise Refused("it needs CUDA (cuda, triton or load_inline in its code); CPU tasks only")
    ints = [
        node.targets[0].id
        for node in tree.body
        if isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
        and type(node.value.value) is int
    ]
    import torch

    try:
        mod = _load(path, "_rsi_problem")
    except Exception as exc:  # noqa: BLE001  the user's file
        raise Refused(f"importing it raised {type(exc).__name__}: {exc}") from None
    for name in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(mod, name):
            raise Refused(
                f"it defines no {name} (a KernelBench problem defines Model, "
                "get_inputs and get_init_inputs)"
            )
    try:
        init = _json_value(list(mod.get_init_inputs()))
    except TypeError:
        raise Refused(
            "get_init_inputs() returns values that are not plain numbers or lists "
            "(tensors as init inputs are not supported)"
        ) from None
    params = inspect.signature(mod.Model.forward).parameters
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params.values()):
        raise Refused("Model.forward takes *args or **kwargs; its inputs need names")
    names = [n for n in params if n != "self"]

    def run(globals_: dict) -> tuple[list, object]:
        saved = {g: getattr(mod, g) for g in globals_}
        try:
            for g, v in globals_.items():
                setattr(mod, g, v)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                inputs = list(mod.get_inputs())
                model = mod.Model(*init)
            with torch.no_grad():
                out = model(*inputs)
            return inputs, out
        finally:
            for g, v in saved.items():
                setattr(mod, g, v)

    try:
        inputs, out = run({})
    except Exception as exc:  # noqa: BLE001
        raise Refused(f"running Model on get_inputs() raised {type(exc).__name__}: {exc}") from None
    if len(inputs) != len(names):
        raise Refused(f"get_inputs() gives {len(inputs)} values, Model.forward takes {names}")
    described = []
    for name, value in zip(names, inputs, strict=True):
        if isinstance(value, torch.Tensor):
            dtype = str(value.dtype).removeprefix("torch.")
            if dtype not in DTYPES:
                raise Refused(f"input {name} has dtype {dtype}; supported: {', '.join(DTYPES)}")
            if value.device.type != "cpu":
                raise Refused(f"input {name} is on {value.device.type}; CPU tasks only")
            described.append(
                {"name": name, "kind": "tensor", "shape": list(value.shape), "dtype": dtype}
            )
        elif type(value) in (int, float, bool):
            described.append({"name": name, "kind": "scalar", "value": value})
        else:
            raise Refused(f"input {name} is a {type(value).__name__}; tensors or numbers only")
    if not isinstance(out, torch.Tensor):
        raise Refused(f"Model returns a {type(out).__name__}; one tensor is supported")
    out_dtype = str(out.dtype).removeprefix("torch.")
    if out_dtype not in ("float32", "float64", "bfloat16", "float16"):
        raise Refused(f"Model returns {out_dtype}; floating outputs only (compared to float64)")
    defaults = {g: getattr(mod, g) for g in ints}
    shapes = [d.get("shape") for d in described]
    varied = []
    for g in ints:
        v = defaults[g]
        if v < 2:
            continue
        trial = max(1, v // 2)
        try:
            with_g = dict(defaults, **{g: trial})
            for k, val in with_g.items():
                setattr(mod, k, val)
            init_changed = list(mod.get_init_inputs()) != init
        except Exception:  # noqa: BLE001
            init_changed = True
        finally:
            for k, val in defaults.items():
                setattr(mod, k, val)
        if init_changed:
            continue
        try:
            got, _ = run({g: trial})
        except Exception:  # noqa: BLE001  the size is tied to another: not free
            continue
        if [list(t.shape) if isinstance(t, torch.Tensor) else None for t in got] != shapes:
            varied.append(g)
    small = {g: max(1, defaults[g] // 8) for g in varied}
    if varied:
        try:
            run(small)
        except Exception:  # noqa: BLE001  sizes tied together: keep the defaults only
            varied, small = [], {}
    return {
        "ok": True,
        "init": init,
        "inputs": described,
        "output": {"shape": list(out.shape), "dtype": out_dtype},
        "defaults": {g: defaults[g] for g in varied},
        "varied": varied,
        "small": small,
    }


def main() -> int:
    try:
        doc = probe(sys.argv[1])
    except Refused as exc:
        doc = {"ok": False, "reason": str(exc)}
    except Exception as exc:  # noqa: BLE001
        doc = {"ok": False, "reason": f"probing it raised {type(exc).__name__}: {exc}"}
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
