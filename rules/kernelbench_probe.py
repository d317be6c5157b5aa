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
import contextlib
import importlib.util
import inspect
import io
import json
import re
import signal
import sys
import tokenize

# NB: one call's inputs and output at most this big (the A/A calibration keeps a few dozen
# calls' inputs prepared; KernelBench's own sizes reach gigabytes, made for a big GPU)
DEFAULT_BUDGET = 16 << 20
# NB: the model's parameters at most this big: each arm's worker holds them and the oracle
# twice that (float64); KernelBench's level 2 builds 4 GiB Linear layers
DEFAULT_PARAM_BUDGET = 256 << 20
# NB: how many times a real run that ran out of the probe's cap is tried again at a quarter of
# its call's bytes (what a forward allocates inside is seen only by running it)
MEMORY_REFITS = 4
DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "bool")
# NB: an integer output (argmax, indices) is compared exactly: the float64 oracle orders the
# same input values as the float32 model does
OUTPUT_DTYPES = ("float32", "float64", "bfloat16", "float16", "int64", "int32")


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


def _size_sites(tree: ast.Module, mod) -> list[str]:
    """The module-level sizes a problem's shapes may be made of, as sites: `n` for an int
    global (`N = 2048 * 2` counts: the value is read from the module, not the source; so do
    `h = w = 128` and `h, w = 64, 32`), `shape[i]` for each int element of a tuple or list
    global (`input_shape = (4096,)`)."""
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        for target in targets:
            elts = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
            names += [t.id for t in elts if isinstance(t, ast.Name) and t.id not in names]
    sites: list[str] = []
    for name in names:
        value = getattr(mod, name, None)
        if type(value) is int:
            sites.append(name)
        elif type(value) in (tuple, list) and 0 < len(value) <= 8:
            sites += [f"{name}[{i}]" for i, v in enumerate(value) if type(v) is int]
    return sites


def _aliases(tree: ast.Module, sites: list[str]) -> dict[str, str]:
    """{site: the global it was written from}: `input_shape = (num_classes,)` makes
    `input_shape[0]` an alias of `num_classes`, `k = n` makes `k` one of `n` (a size written
    twice in the source is one size: halving one copy alone would break the problem)."""
    known = set(sites)
    direct: dict[str, str] = {}
    for node in tree.body:
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target, value = node.targets[0], node.value
        if not isinstance(target, ast.Name):
            continue
        if isinstance(value, ast.Name) and target.id in known:
            direct[target.id] = value.id
        elif isinstance(value, (ast.Tuple, ast.List)):
            for i, elt in enumerate(value.elts):
                if isinstance(elt, ast.Name) and f"{target.id}[{i}]" in known:
                    direct[f"{target.id}[{i}]"] = elt.id

    def root(site: str) -> str:
        seen = {site}
        while site in direct and direct[site] not in seen:
            site = direct[site]
            seen.add(site)
        return site

    return {site: root(site) for site in sites}


def _site(site: str) -> tuple[str, int | None]:
    name, _, index = site.partition("[")
    return name, (int(index[:-1]) if index else None)


def _get(mod, site: str) -> int:
    name, index = _site(site)
    value = getattr(mod, name)
    return value if index is None else value[index]


def _with_sites(mod, sizes: dict) -> dict:
    """{global name: new value} that sets every site of every unit in `sizes` ("a=b[0]": the
    sites a unit halves together; a tuple keeps its type)."""
    out: dict = {}
    for unit, n in sizes.items():
        for site in unit.split("="):
            _set_site(mod, out, site, n)
    return out


def _set_site(mod, out: dict, site: str, n: int) -> None:
    name, index = _site(site)
    if index is None:
        out[name] = n
        return
    value = out.get(name, getattr(mod, name))
    items = list(value)
    items[index] = n
    out[name] = type(value)(items)


class _Sizes:
    """Set module sizes (sites, see `_size_sites`) for a block, then put the globals back."""

    def __init__(self, mod, sizes: dict) -> None:
        self.mod, self.values = mod, _with_sites(mod, sizes)

    def __enter__(self) -> None:
        self.saved = {g: getattr(self.mod, g) for g in self.values}
        for g, v in self.values.items():
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


# NB: a forward on the meta device is usually free, but some ops decompose into Python loops
# there (an LSTM: 47 s, three times its real run): one that takes over META_FORWARD_MAX_S of
# CPU is cut short, and the probe stops running forwards on meta (it sizes by the inputs,
# corrected by the real run)
META_FORWARD_MAX_S = 5.0
_META_FORWARD = {"on": True}


class _TooSlow(BaseException):
    """Raised by the CPU-time alarm of `_deadline` (a BaseException: the user's `except
    Exception` must not swallow it)."""


@contextlib.contextmanager
def _deadline(seconds: float):
    def expire(signum, frame):
        raise _TooSlow()

    # NB: CPU time, not wall time: a loaded host must not cut short a forward that is only
    # waiting for a CPU (a ConvTranspose3d took over 2 s of wall time at load 3)
    previous = signal.signal(signal.SIGPROF, expire)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


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
        if with_output and _META_FORWARD["on"]:
            try:
                with torch.device("meta"), torch.no_grad(), _deadline(META_FORWARD_MAX_S):
                    out = mod.Model(*init)(*inputs)
            except _TooSlow:
                _META_FORWARD["on"], out = False, None
            except Exception:  # noqa: BLE001  an op without a meta kernel: sized for real later
                out = None
    return init, inputs, out if isinstance(out, torch.Tensor) else None


def _call_bytes(mod, sizes: dict) -> int:
    _, inputs, out = _meta_call(mod, sizes, True)
    return _nbytes(inputs) + (_nbytes([out]) if out is not None else _nbytes(inputs))


def _param_bytes(mod, sizes: dict) -> int:
    """The model's parameters and buffers at `sizes`, built on the meta device (0 when it cannot
    be built there: the real run under the probe's cap says the rest)."""
    import torch

    try:
        with _Sizes(mod, sizes):
            init = list(mod.get_init_inputs())
            with torch.device("meta"):
                model = mod.Model(*init)
        return _nbytes([*model.parameters(), *model.buffers()])
    except Exception:  # noqa: BLE001  the user's code
        return 0


def _fit(
    mod, sizes: dict, scalable: tuple[list, list], budget: int, measure, param_budget: int
) -> dict:
    """Halve the largest size until one call's inputs and output fit `budget`, the free sizes
    first and the ones the model is built with (`scalable[1]`) only when those are all 1; and
    until the model's parameters fit `param_budget` (only sizes the model is built with move
    those)."""
    sizes = dict(sizes)
    free, tied = scalable
    while True:
        call, params = measure(sizes), _param_bytes(mod, sizes)
        if call > budget:
            candidates = [g for g in free if sizes[g] >= 2] or [g for g in tied if sizes[g] >= 2]
            if not candidates:
                raise Refused(
                    f"a call needs {call / 2**20:.1f} MiB even with every free size at 1; "
                    f"over the memory budget of {budget / 2**20:.1f} MiB (--max-call-mb)"
                )
        elif params > param_budget:
            candidates = [g for g in tied if sizes[g] >= 2]
            if not candidates:
                raise Refused(
                    f"its parameters need {params / 2**20:.1f} MiB even with every size the "
                    f"model is built with at 1; over the budget of {param_budget / 2**20:.1f} "
                    "MiB (--max-param-mb)"
                )
        else:
            return sizes
        g = max(candidates, key=lambda name: sizes[name])
        sizes[g] //= 2


def probe(
    path: str, budget: int = DEFAULT_BUDGET, param_budget: int = DEFAULT_PARAM_BUDGET
) -> dict:
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
    # NB: forward(x, h0=None, c0=None) called with one input: the defaults are the problem's
    required = [n for n in names if params[n].default is inspect.Parameter.empty]
    sites = _size_sites(tree, mod)
    values = {g: _get(mod, g) for g in sites}
    try:
        init0, meta0, out0 = _meta_call(mod, {}, True)
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
    # NB: where Model runs on the meta device at the problem's sizes, a halving must keep it
    # running: that is how a size written out twice (`batch_size` and `input_shape =
    # (4096,)` both 4096) shows itself, and the two are halved together
    forward_on_meta = out0 is not None

    def halved(change: dict) -> tuple[list, list] | None:
        try:
            init_g, meta_g, out_g = _meta_call(mod, change, forward_on_meta)
        except Exception:  # noqa: BLE001  the size is constrained by another
            return None
        return None if forward_on_meta and out_g is None else (init_g, meta_g)

    # NB: a size (a unit: sites halved together, named "a=b") is free when it changes the
    # inputs' shapes and not the model, tied when it changes both, inner when it changes the
    # model only; tied and inner ones shrink only for a budget the free ones cannot meet
    free, tied, inner = [], [], []
    defaults: dict[str, int] = {}
    taken: set[str] = set()
    roots = _aliases(tree, sites)
    for g in sites:
        if values[g] < 2 or g in taken:
            continue
        unit = [h for h in sites if h not in taken and roots[h] == roots[g]]
        got = halved({h: values[g] // 2 for h in unit})
        if got is None:
            unit = [h for h in sites if values[h] == values[g] and h not in taken]
            got = halved({h: values[g] // 2 for h in unit}) if len(unit) > 1 else None
        if got is None or (_shapes(got[1]) == shapes0 and got[0] == init0):
            continue
        taken.update(unit)
        name = "=".join(unit)
        defaults[name] = values[g]
        if got[0] == init0:
            free.append(name)
        elif _shapes(got[1]) == shapes0:
            inner.append(name)  # NB: only the model (a layer's width): moves its parameters
        else:
            tied.append(name)

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
    scalable = (free, tied + inner)
    sizes = _fit(mod, defaults, scalable, budget, lambda s: _call_bytes(mod, s), param_budget)
    refits = 0
    for _ in range(4 + MEMORY_REFITS):
        try:
            init, inputs, out = run(sizes)
        except Exception as exc:  # noqa: BLE001
            memory = isinstance(exc, MemoryError) or "can't allocate memory" in str(exc)
            if memory and refits < MEMORY_REFITS:
                # NB: what it allocates inside (an attention matrix of seq_len^2) no budget on
                # inputs, output or parameters sees: a quarter of the call's bytes, and again
                refits += 1
                quarter = max(1, _call_bytes(mod, sizes) // 4)
                try:
                    sizes = _fit(
                        mod, sizes, scalable, quarter, lambda s: _call_bytes(mod, s), param_budget
                    )
                    continue
                except Refused:
                    pass
            if memory:
                raise Refused(
                    f"running Model ran out of memory at the fitted sizes (after {refits} "
                    f"smaller tries): {str(exc)[:300]}"
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
        sizes = _fit(
            mod, sizes, scalable, budget, lambda s, r=ratio: _call_bytes(mod, s) * r, param_budget
        )
    else:
        raise Refused(f"no sizes found that fit the memory budget of {budget / 2**20:.1f} MiB")
    try:
        _json_value(init)
    except TypeError:
        raise Refused(
            "get_init_inputs() returns values that are not plain numbers or lists "
            "(tensors as init inputs are not supported)"
        ) from None
    if not len(required) <= len(inputs) <= len(names):
        raise Refused(f"get_inputs() gives {len(inputs)} values, Model.forward takes {names}")
    names = names[: len(inputs)]
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
    if out_dtype not in OUTPUT_DTYPES:
        raise Refused(
            f"Model returns {out_dtype}; supported outputs: {', '.join(OUTPUT_DTYPES)} "
            "(floating ones compared to float64 within tolerance, integer ones exactly)"
        )
    varied = list(free)
    # NB: the smallest sizes hidden cases draw: an eighth of the fitted ones, or a quarter or a
    # half where the problem cannot run that small (a pooling window of 11 over 8 pixels)
    small: dict = {}
    for divisor in (8, 4, 2):
        trial = {g: max(1, sizes[g] // divisor) for g in varied}
        try:
            run({**sizes, **trial})
        except Exception:  # noqa: BLE001  the user's code, at sizes it was not written for
            continue
        small = trial
        break
    if not small:
        varied = []  # NB: no smaller size runs: every case is at the fitted sizes
    # NB: what had to shrink and is not a case's `shape` is fixed for the task: sizes the model
    # is built with, and free sizes that no longer vary. Never left at the problem's own sizes:
    # those are what the fitting found too big
    fixed = _with_sites(
        mod,
        {g: sizes[g] for g in free + tied + inner if g not in varied and sizes[g] != defaults[g]},
    )
    fixed = {g: list(v) if isinstance(v, tuple) else v for g, v in fixed.items()}
    scaled = {g: [defaults[g], sizes[g]] for g in free + tied + inner if sizes[g] != defaults[g]}
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
            "max_param_bytes": param_budget,
            "param_bytes": _param_bytes(mod, sizes),
            "scaled": scaled,
            "memory_refits": refits,
        },
    }


def main() -> int:
    budget = int(sys.argv[2]) if len(sys.argv) > 2 else DEFAULT_BUDGET
    param_budget = int(sys.argv[3]) if len(sys.argv) > 3 else DEFAULT_PARAM_BUDGET
    try:
        doc = probe(sys.argv[1], budget, param_budget)
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
