"""Probe one KernelBench-format problem file (run by `rsi import kernelbench` in its own
interpreter: the file is the user's code). Prints one JSON document on stdout: It must never run in
rsi's own process.

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

# NB: one call's inputs and output at most this big (the A/A calibration keeps a few dozen
# calls' inputs prepared; KernelBench's own sizes reach gigabytes, made for a big GPU)
DEFAULT_BUDGET = 16 << 20
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


def _int_globals(tree: ast.Module, mod) -> list[str]:
    """Module-level names assigned at the top level whose value is an int (`N = 2048 * 2`
    counts: the expression is evaluated by the module, not read from the source)."""
    names = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and len(targets) == 1:
            target = targets[0]
            if isinstance(target, ast.Name) and type(getattr(mod, target.id, None)) is int:
                if target.id not in names:
                    names.append(target.id)
    return names


class _Sizes:
    """Set module globals for a block, then put them back."""

    def __init__(self, mod, sizes: dict) -> None:
        self.mod, self.sizes = mod, sizes

    def __enter__(self) -> None:
        self.saved = {g: getattr(self.mod, g) for g in self.sizes}
        for g, v in self.sizes.items():
            setattr(self.mod, g, v)

    def __exit__(self, *exc) -> None:
        for g, v in self.saved.items():
            setattr(self.mod, g, v)


def _nbytes(values) -> int:
    import torch

    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


def _shapes(values) -> list:
    import torch

    return [list(v.shape) if isinstance(v, torch.Tensor) else None for v in values]


def _meta_call(mod, sizes: dict, with_output: bool) -> tuple[list, list, object]:
    """(init, inputs, output or None) at `sizes`, with every tensor on the meta device: shapes
    and dtypes without allocating a byte, so a problem sized for a big GPU can be sized here."""
    import torch

    with _Sizes(mod, sizes):
        init = list(mod.get_init_inputs())
        with torch.device("meta"), torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            inputs = list(mod.get_inputs())
        out = None
        if with_output:
            try:
                with torch.device("meta"), torch.no_grad():
                    out = mod.Model(*init)(*inputs)
            except Exception:  # noqa: BLE001  an op without a meta kernel: sized for real later
                out = None
    return init, inputs, out if isinstance(out, torch.Tensor) else None


def _call_bytes(mod, sizes: dict) -> int:
    _, inputs, out = _meta_call(mod, sizes, True)
    return _nbytes(inputs) + (_nbytes([out]) if out is not None else _nbytes(inputs))


def _fit(mod, sizes: dict, scalable: tuple[list, list], budget: int, measure) -> dict:
    """Halve the largest size until one call's inputs and output fit `budget`: the free sizes
    first, and the ones the model is built with (`scalable[1]`) only when those are all 1."""
    sizes = dict(sizes)
    free, tied = scalable
    while measure(sizes) > budget:
        candidates = [g for g in free if sizes[g] >= 2] or [g for g in tied if sizes[g] >= 2]
        if not candidates:
            raise Refused(
                f"a call needs {measure(sizes) / 2**20:.1f} MiB even with every free size at 1; "
                f"over the memory budget of {budget / 2**20:.1f} MiB (--max-call-mb)"
            )
        g = max(candidates, key=lambda name: sizes[name])
        sizes[g] //= 2
    return sizes


def probe(path: str, budget: int = DEFAULT_BUDGET) -> dict:
    src = open(path, encoding="utf-8").read()
    try:
        tree = ast.parse(src)
    except SyntaxError as exc:
        raise Refused(f"not valid Python: {exc}") from None
    if re.search(r"\bcuda\b|\btriton\b|load_inline", _code_without_comments(src)):
        raise Refused("it needs CUDA (cuda, triton or load_inline in its code); CPU tasks only")
    import torch

    try:
        mod = _load(path, "_rsi_problem")
    except MemoryError as exc:
        raise Refused(f"importing it ran out of memory under the probe's cap: {exc}") from None
    except Exception as exc:  # noqa: BLE001  the user's file
        if "can't allocate memory" in str(exc):
            raise Refused(
                f"importing it ran out of memory under the probe's cap: {str(exc)[:300]}"
            ) from None
        raise Refused(f"importing it raised {type(exc).__name__}: {exc}") from None
    for name in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(mod, name):
            raise Refused(
                f"it defines no {name} (a KernelBench problem defines Model, "
                "get_inputs and get_init_inputs)"
            )
    params = inspect.signature(mod.Model.forward).parameters
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params.values()):
        raise Refused("Model.forward takes *args or **kwargs; its inputs need names")
    names = [n for n in params if n != "self"]
    ints = _int_globals(tree, mod)
    defaults = {g: getattr(mod, g) for g in ints}
    try:
        init0, meta0, _ = _meta_call(mod, {}, False)
        _json_value(init0)
    except TypeError:
        raise Refused(
            "get_init_inputs() returns values that are not plain numbers or lists "
            "(tensors as init inputs are not supported)"
        ) from None
    except Exception as exc:  # noqa: BLE001
        raise Refused(
            f"get_inputs() cannot be sized without running it ({type(exc).__name__}: {exc})"
        ) from None
    shapes0 = _shapes(meta0)
    # NB: a free size changes the inputs' shapes and not the model; a tied one changes both
    free, tied = [], []
    for g in ints:
        if defaults[g] < 2:
            continue
        try:
            init_g, meta_g, _ = _meta_call(mod, {g: defaults[g] // 2}, False)
        except Exception:  # noqa: BLE001  the size is constrained by another: left alone
            continue
        if _shapes(meta_g) == shapes0:
            continue
        (free if init_g == init0 else tied).append(g)

    def run(sizes: dict) -> tuple[list, list, object]:
        with _Sizes(mod, sizes):
            init = list(mod.get_init_inputs())
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                inputs = list(mod.get_inputs())
                model = mod.Model(*init)
            with torch.no_grad():
                out = model(*inputs)
        return init, inputs, out

    # NB: sized on the meta device first (a problem made for a GPU allocates gigabytes), then
    # run for real once at the fitted sizes, then fitted again on the real output's size
    scalable = (free, tied)
    sizes = _fit(mod, defaults, scalable, budget, lambda s: _call_bytes(mod, s))
    for _ in range(4):
        try:
            init, inputs, out = run(sizes)
        except MemoryError as exc:
            raise Refused(f"running Model ran out of memory at the fitted sizes: {exc}") from None
        except Exception as exc:  # noqa: BLE001
            if "can't allocate memory" in str(exc):
                raise Refused(
                    f"running Model ran out of memory at the fitted sizes: {exc}"
                ) from None
            fitted = ", ".join(
                f"{g} {defaults[g]} -> {v}" for g, v in sizes.items() if v != defaults[g]
            )
            where = f" at the sizes fitted to the memory budget ({fitted})" if fitted else ""
            raise Refused(
                f"running Model on get_inputs(){where} raised {type(exc).__name__}: {exc}"
                + (
                    "; its sizes may be tied in ways the fitting cannot see (raise --max-call-mb)"
                    if fitted
                    else ""
                )
            ) from None
        if not isinstance(out, torch.Tensor):
            break
        real = _nbytes(inputs) + _nbytes([out])
        if real <= budget:
            break
        # NB: the meta estimate missed the output (no meta kernel): correct it by what was seen
        ratio = real / max(1, _call_bytes(mod, sizes))
        sizes = _fit(mod, sizes, scalable, budget, lambda s, r=ratio: _call_bytes(mod, s) * r)
    else:
        raise Refused(f"no sizes found that fit the memory budget of {budget / 2**20:.1f} MiB")
    try:
        _json_value(init)
    except TypeError:
        raise Refused(
            "get_init_inputs() returns values that are not plain numbers or lists "
            "(tensors as init inputs are not supported)"
        ) from None
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
    varied = list(free)
    # NB: tied sizes that had to shrink are fixed for the task (the model is built with them)
    fixed = {g: sizes[g] for g in tied if sizes[g] != defaults[g]}
    small = {g: max(1, sizes[g] // 8) for g in varied}
    if varied:
        try:
            run({**sizes, **small})
        except Exception:  # noqa: BLE001  sizes tied together: keep the fitted ones only
            varied, small = [], {}
    scaled = {g: [defaults[g], sizes[g]] for g in free + tied if sizes[g] != defaults[g]}
    return {
        "ok": True,
        "init": init,
        "inputs": described,
        "output": {"shape": list(out.shape), "dtype": out_dtype},
        "defaults": {g: sizes[g] for g in varied},
        "varied": varied,
        "small": small,
        "fixed": fixed,
        "size_policy": {
            "max_call_bytes": budget,
            "call_bytes": _nbytes(inputs) + _nbytes([out]),
            "scaled": scaled,
        },
    }


def main() -> int:
    budget = int(sys.argv[2]) if len(sys.argv) > 2 else DEFAULT_BUDGET
    try:
        doc = probe(sys.argv[1], budget)
    except Refused as exc:
        doc = {"ok": False, "reason": str(exc)}
    except MemoryError as exc:
        doc = {"ok": False, "reason": f"the probe ran out of memory (its cap): {exc}"}
    except Exception as exc:  # noqa: BLE001
        doc = {"ok": False, "reason": f"probing it raised {type(exc).__name__}: {exc}"}
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
