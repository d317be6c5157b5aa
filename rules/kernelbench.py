"""`rsi import kernelbench FILE...`: KernelBench-format problem files become catalog tasks.

A problem file defines `class Model(nn.Module)`, `get_inputs()` and `get_init_inputs()`. Each
becomes `tasks/<name>/`:

- `problem.py`: the file, verbatim (provenance: its SHA-256 is in TASK.md and the catalog);
- `baseline/kernel.py`: the file with `Model` renamed `ModelNew`, the candidate contract as
  KernelBench defines it (entry `{module = "kernel", class = "ModelNew"}`: built once from the
  init inputs with a fixed seed, then called as `model(*inputs)`);
- `workloads.py`: `get_inputs()` under the referee's secret seed, with the problem's free sizes
  (module-level ints that change input shapes but not the init inputs) set from the case's
  `shape`; kinds `normal`, `large` (x100), `tiny` (x1e-3), `transposed` (non-contiguous views);
- `oracle.py`: `Model` itself, built from the same init inputs and seed, run in float64;
- `BUILD.toml` (task, a `cpu` binding) and `TASK.md`.

Sizes are fitted to a memory budget per call first (`--max-call-mb`; the probe sizes the
problem on torch's meta device and halves the largest size, free ones first, until a call's
inputs and output fit): KernelBench's own sizes are made for a large GPU. The cases are the
fitted sizes in every kind, the free sizes at an eighth, and hidden cases drawn from [eighth,
default] of each free size. What cannot be imported (CUDA code,
an unsupported dtype, inputs that are not tensors or numbers, a Model that fails on its own
inputs) is refused with the reason, and nothing is written for it.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import click

from rsi.errors import EXIT_USAGE, RsiError

PROBE = Path(__file__).resolve().parent / "kernelbench_probe.py"
TOLERANCES = {
    "float32": {"atol": 1e-3, "rtol": 1e-3},
    "float64": {"atol": 1e-8, "rtol": 1e-8},
    "bfloat16": {"atol": 2e-2, "rtol": 2e-2},
    "float16": {"atol": 2e-3, "rtol": 2e-3},
    "int64": {"atol": 0, "rtol": 0},
    "int32": {"atol": 0, "rtol": 0},
}
INIT_SEED = 0
# NB: the probe's own cap (it sizes on the meta device and runs once at the fitted sizes)
PROBE_CAP_BYTES = 3 << 30
DEFAULT_CALL_BYTES = 16 << 20
# NB: kept equal to the probe's DEFAULT_PARAM_BUDGET (the probe runs as a script, not imported)
DEFAULT_PARAM_BYTES = 256 << 20


class ImportRefused(RsiError):
    exit_code = EXIT_USAGE


def task_name(path: Path) -> str:
    """`1_Square_matrix_multiplication_.py` -> `kb_square_matrix_multiplication`."""
    stem = re.sub(r"^\d+_", "", path.stem).lower()
    stem = re.sub(r"[^a-z0-9]+", "_", stem).strip("_")
    return f"kb_{stem}" or "kb_problem"


def _cap_memory(limit: int):
    def apply() -> None:
        import resource

        # NB: private writable memory (the heap, tensors): the probe is the user's code
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))

    return apply


def probe(
    path: Path,
    timeout_s: float = 300,
    max_call_bytes: int = DEFAULT_CALL_BYTES,
    max_param_bytes: int = DEFAULT_PARAM_BYTES,
) -> dict:
    """Probe `path` in its own interpreter, its memory capped at PROBE_CAP_BYTES: a problem
    that cannot be sized or fitted is refused with the reason, and so is one that runs out."""
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-I",
                "-B",
                str(PROBE),
                str(path),
                str(max_call_bytes),
                str(max_param_bytes),
            ],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            preexec_fn=_cap_memory(PROBE_CAP_BYTES),
        )
    except subprocess.TimeoutExpired:
        raise ImportRefused(f"{path}: probing it took over {timeout_s:g} s") from None
    try:
        doc = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = proc.stderr.strip()[-500:]
        if proc.returncode < 0 or "can't allocate memory" in tail or "MemoryError" in tail:
            raise ImportRefused(
                f"{path}: the probe failed (exit {proc.returncode}) under its memory cap of "
                f"{PROBE_CAP_BYTES >> 20} MiB: {tail}"
            ) from None
        raise ImportRefused(f"{path}: probing it failed (exit {proc.returncode}): {tail}") from None
    if not doc.get("ok"):
        raise ImportRefused(f"{path}: not imported: {doc.get('reason')}")
    return doc


def _toml(value) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def _cases(doc: dict) -> tuple[list[dict], dict]:
    out = doc["output"]["dtype"]
    shape = [doc["defaults"][g] for g in doc["varied"]]
    cases = [
        {"name": f"{kind}_default", "shape": shape, "dtype": out, "kind": kind}
        for kind in ("normal", "large", "tiny", "transposed")
    ]
    hidden: dict = {}
    if doc["varied"]:
        small = [doc["small"][g] for g in doc["varied"]]
        cases.append({"name": "normal_small", "shape": small, "dtype": out, "kind": "normal"})
        cases.append(
            {"name": "transposed_small", "shape": small, "dtype": out, "kind": "transposed"}
        )
        ranges = [[lo, hi] for lo, hi in zip(small, shape, strict=True)]
        hidden = {
            "count": 4,
            "ranges": [
                {"shape": ranges, "dtype": out, "kind": "normal"},
                {"shape": ranges, "dtype": out, "kind": "transposed"},
            ],
        }
    return cases, hidden


WORKLOADS = '''"""Workloads of the KernelBench problem in problem.py (`rsi import kernelbench`).

make_inputs(case, seed): the problem's get_inputs() with torch's RNG seeded by `seed` (the
referee's secret) and the free sizes (VARIED, in order) set from case["shape"]; kinds: normal,
large (x100), tiny (x1e-3), transposed (the same values as non-contiguous views)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

VARIED = {varied}
NAMES = {names}
INIT = {init}
INIT_SEED = {seed}
# NB: the sizes the import fitted to its memory budget (size policy: {policy}); set on the
# problem module before every use, so its get_inputs() makes what the task was checked with
FIXED = {fixed}
SCALE = {{"normal": 1.0, "large": 100.0, "tiny": 1e-3, "transposed": 1.0}}


def _load():
    path = Path(__file__).resolve().parent / "problem.py"
    spec = importlib.util.spec_from_file_location(f"_rsi_problem_{{id(path)}}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, value in FIXED.items():
        setattr(module, name, tuple(value) if isinstance(value, list) else value)
    return module


_P = _load()


def _set(unit: str, n: int) -> None:
    # NB: a unit is the sites one size is written at ("batch_size=input_shape[0]"), set together
    for site in unit.split("="):
        name, _, index = site.partition("[")
        if not index:
            setattr(_P, name, n)
            continue
        value = getattr(_P, name)
        items = list(value)
        items[int(index[:-1])] = n
        setattr(_P, name, type(value)(items))


def init_inputs() -> list:
    return list(INIT)


def make_inputs(case: dict, seed: int) -> dict:
    kind = case.get("kind", "normal")
    if kind not in SCALE:
        raise ValueError(f"unknown workload kind {{kind!r}}")
    sizes = dict(zip(VARIED, (int(n) for n in case.get("shape") or []), strict=False))
    names = {{site.partition("[")[0] for unit in sizes for site in unit.split("=")}}
    saved = {{g: getattr(_P, g) for g in names}}
    try:
        for unit, n in sizes.items():
            _set(unit, n)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed) % (1 << 63))
            values = list(_P.get_inputs())
    finally:
        for g, n in saved.items():
            setattr(_P, g, n)
    out = {{}}
    for name, value in zip(NAMES, values, strict=True):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            value = value * SCALE[kind] if SCALE[kind] != 1.0 else value
            if kind == "transposed" and value.dim() >= 2:
                value = value.transpose(-1, -2).contiguous().transpose(-1, -2)
        out[name] = value
    return out
'''

ORACLE = '''"""Oracle of the KernelBench problem in problem.py: Model itself, built from the
task's init inputs with torch's RNG seeded as the worker seeds it, run in float64."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import torch

NAMES = {names}
INIT = {init}
INIT_SEED = {seed}
FIXED = {fixed}
_MODEL = None


def _model():
    global _MODEL
    if _MODEL is None:
        path = Path(__file__).resolve().parent / "problem.py"
        spec = importlib.util.spec_from_file_location(f"_rsi_oracle_{{id(path)}}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for name, value in FIXED.items():
            setattr(module, name, tuple(value) if isinstance(value, list) else value)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(INIT_SEED)
            model = module.Model(*INIT)
        _MODEL = model.double().eval().requires_grad_(False)
    return _MODEL


def reference(**inputs) -> np.ndarray:
    args = [
        v.detach().to(torch.float64) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
        for v in (inputs[name] for name in NAMES)
    ]
    with torch.no_grad():
        out = _model()(*args)
    return out.detach().to(torch.float64).numpy().copy()
'''


def render(path: Path, name: str, doc: dict) -> dict[str, str]:
    """{relative path: text} of the task folder for one probed problem."""
    src = path.read_text(encoding="utf-8")
    digest = hashlib.sha256(src.encode()).hexdigest()
    kernel = re.sub(r"\bModel\b", "ModelNew", src)
    fixed = doc.get("fixed") or {}
    policy = doc.get("size_policy") or {}
    if fixed:
        kernel += (
            "\n\n# rsi import: sizes fitted to the task's memory budget (the model is built "
            "with them)\n"
            + "".join(f"{g} = {tuple(v) if isinstance(v, list) else v}\n" for g, v in fixed.items())
        )
    names = [i["name"] for i in doc["inputs"]]
    cases, hidden = _cases(doc)
    out_dtype = doc["output"]["dtype"]
    tolerances = {out_dtype: TOLERANCES[out_dtype]}
    shape = [doc["defaults"][g] for g in doc["varied"]]
    measure = {
        "workload": {"name": "bench", "shape": shape, "dtype": out_dtype, "kind": "normal"},
        "warmups": 3,
        "samples": 10,
        "pairs": 30,
        "seed": 0,
        "probes": 32,
        "value_checks": 3,
        "metric": "latency",
        "direction": "minimize",
    }
    assess = {"min_improvement": 0.05, "confidence": 0.95, "bootstrap_resamples": 2000}
    build = [
        f"# {name}: imported by `rsi import kernelbench` from {path.name} (problem.py, verbatim).",
        "# Edit the declaration freely; `rsi catalog update` shows and pins the change.",
        "",
        "[task]",
        'rule = "task"',
        'runtime = ["workloads.py", "oracle.py", "problem.py"]',
        'baseline = "baseline"',
        'docs = ["TASK.md"]',
        'framework = "torch"',
        'device = "cpu"',
        'entry = {module = "kernel", class = "ModelNew"}',
        f'signature = "ModelNew(*get_init_inputs())({", ".join(names)}) -> Tensor"',
        'editable = ["kernel.py"]',
        f"tolerances = {_toml(tolerances)}",
        "cases = [",
        *[f"  {_toml(c)}," for c in cases],
        "]",
    ]
    if hidden:
        build.append(f"hidden_cases = {_toml(hidden)}")
    build += [
        "",
        "[cpu]",
        'rule = "binding"',
        'task = ":task"',
        "threads = 1",
        "call_timeout_s = 60.0",
        "seed = 0",
        f"measure = {_toml(measure)}",
        f"assess = {_toml(assess)}",
        "",
    ]
    free = ", ".join(f"`{g}` (default {doc['defaults'][g]})" for g in doc["varied"]) or "none"
    task_md = (
        f"# {name}\n\n"
        f"Imported from the KernelBench-format problem `{path.name}` (SHA-256 `{digest}`), kept "
        "verbatim as `problem.py`.\n\n"
        "A candidate is `kernel.py` defining `class ModelNew`, KernelBench's contract: it is "
        "built once as `ModelNew(*get_init_inputs())` with torch's RNG seeded by 0 (so its "
        "parameters match `Model`'s), then called as `model(*inputs)` with the inputs of "
        f"`get_inputs()`: {', '.join(names)}. The oracle is `Model` itself in float64.\n\n"
        f"Free sizes (set from a case's `shape`, in this order): {free}. Hidden cases draw "
        "them between an eighth of the default and the default.\n"
    )
    if policy.get("scaled"):
        changes = ", ".join(f"`{g}` {a} -> {b}" for g, (a, b) in policy["scaled"].items())
        task_md += (
            f"\nSizes fitted to a memory budget of {policy['max_call_bytes'] / 2**20:g} MiB per "
            f"call (inputs and output; `rsi import kernelbench --max-call-mb`) and "
            f"{policy.get('max_param_bytes', DEFAULT_PARAM_BYTES) / 2**20:g} MiB of model "
            f"parameters (`--max-param-mb`): {changes}. "
            "The problem's own sizes are made for a large GPU; these are the defaults here.\n"
        )
    return {
        "problem.py": src,
        "baseline/kernel.py": kernel,
        "workloads.py": WORKLOADS.format(
            varied=json.dumps(doc["varied"]),
            names=json.dumps(names),
            init=json.dumps(doc["init"]),
            seed=INIT_SEED,
            fixed=json.dumps(fixed),
            policy=json.dumps(policy, sort_keys=True),
        ),
        "oracle.py": ORACLE.format(
            names=json.dumps(names),
            init=json.dumps(doc["init"]),
            seed=INIT_SEED,
            fixed=json.dumps(fixed),
        ),
        "BUILD.toml": "\n".join(build),
        "TASK.md": task_md,
    }


def import_problems(
    root: Path,
    files: list[Path],
    into: str = "tasks",
    force: bool = False,
    name: str = "",
    max_call_bytes: int = DEFAULT_CALL_BYTES,
    max_param_bytes: int = DEFAULT_PARAM_BYTES,
):
    """Import each file; returns (written, refused) lists. A refused file writes nothing."""
    written, refused = [], []
    for path in files:
        task = name or task_name(path)
        dest = root / into / task
        try:
            if not path.is_file():
                raise ImportRefused(f"{path}: no such file")
            if dest.exists() and not force:
                raise ImportRefused(
                    f"{path}: {dest.relative_to(root)} exists (--force replaces its files)"
                )
            doc = probe(path, max_call_bytes=max_call_bytes, max_param_bytes=max_param_bytes)
            files_out = render(path, task, doc)
        except ImportRefused as exc:
            refused.append({"file": str(path), "reason": exc.message})
            continue
        for rel, text in files_out.items():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        written.append(
            {
                "file": str(path),
                "task": f"//{into}/{task}:task",
                "folder": str(dest.relative_to(root)),
                "free_sizes": doc["varied"],
                "inputs": doc["inputs"],
                "size_policy": doc.get("size_policy"),
            }
        )
    return written, refused


@click.group("import")
def import_group() -> None:
    """Turn problems from other formats into rsi tasks.

    \b
      rsi import kernelbench 1_Square_matrix_multiplication_.py ...
    """


@import_group.command("kernelbench")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--into", default="tasks", show_default=True, help="package folder for the tasks")
@click.option("--force", is_flag=True, help="replace the files of a task folder that exists")
@click.option(
    "--name", default="", help="the task folder's name (one file only; default kb_<stem>)"
)
@click.option(
    "--max-call-mb",
    type=click.FloatRange(min=0.001, max=4096),
    default=DEFAULT_CALL_BYTES / 2**20,
    show_default=True,
    help="memory budget of one call (its inputs and output): the problem's sizes are halved, "
    "free sizes first, until a call fits; recorded in the task's workloads.py and TASK.md",
)
@click.option(
    "--max-param-mb",
    type=click.FloatRange(min=0.001, max=65536),
    default=DEFAULT_PARAM_BYTES / 2**20,
    show_default=True,
    help="memory budget of the model's parameters: the sizes the model is built with are halved "
    "until they fit (each arm holds them; the float64 oracle twice that); recorded likewise",
)
@click.option("--json", "as_json", is_flag=True, help="what was written and refused, as JSON")
@click.pass_context
def kernelbench_cmd(
    ctx: click.Context,
    files,
    into: str,
    force: bool,
    name: str,
    max_call_mb: float,
    max_param_mb: float,
    as_json: bool,
) -> None:
    """Import KernelBench-format problem files (Model, get_inputs, get_init_inputs) as tasks
    under tasks/kb_<name>/ with the problem's Model as baseline and (in float64) oracle.

    Each file is probed in its own interpreter first; one that cannot be imported (CUDA code,
    an unsupported dtype, ...) is refused with the reason and writes nothing. Afterwards run
    `rsi catalog update --yes` to pin the new tasks, and `rsi catalog check` to run their
    baselines. Exit 0 if every file was imported, 2 if any was refused."""
    from rsi.workspace import Workspace

    obj = ctx.find_root().obj or {}
    root = obj.get("workspace")
    ws = Workspace.load(Path(root).resolve()) if root else Workspace.discover()
    if name and len(files) != 1:
        raise click.UsageError("--name names one task: give one file with it")
    if name and not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise click.UsageError(f"--name {name!r}: lower-case letters, digits and _ only")
    written, refused = import_problems(
        ws.root,
        [p.resolve() for p in files],
        into,
        force,
        name,
        max_call_bytes=int(max_call_mb * 2**20),
        max_param_bytes=int(max_param_mb * 2**20),
    )
    if as_json:
        click.echo(json.dumps({"written": written, "refused": refused}, indent=1))
    else:
        for w in written:
            sizes = ", ".join(w["free_sizes"]) or "none"
            click.echo(f"imported {w['file']} -> {w['folder']} ({w['task']}; free sizes {sizes})")
            scaled = (w.get("size_policy") or {}).get("scaled") or {}
            if scaled:
                fitted = ", ".join(f"{g} {a} -> {b}" for g, (a, b) in scaled.items())
                click.echo(
                    "  sizes fitted to the memory budgets (--max-call-mb, --max-param-mb): "
                    + fitted
                )
        for r in refused:
            click.echo(f"refused: {r['reason']}", err=True)
        if written:
            click.echo("next: rsi catalog update --yes && rsi catalog check")
    sys.exit(EXIT_USAGE if refused else 0)
