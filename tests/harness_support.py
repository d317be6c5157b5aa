"""Running the sandbox-side harness scripts directly, for tests/test_harness.py and
tests/test_gpu.py: the task spec examples, and check/measure as real subprocesses."""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "rules" / "harness"
TASKS = ROOT / "tasks"


def load_harness_module(stem: str, prefix: str = "_rsi_test"):
    """A harness script imported by path (the way the harness itself imports siblings)."""
    spec = importlib.util.spec_from_file_location(f"{prefix}_{stem}", HARNESS / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def task_spec(task: str, **overrides) -> dict:
    """The task's example spec with `overrides` (a dict value updates a section)."""
    spec = copy.deepcopy(json.loads((TASKS / task / "harness_spec.example.json").read_text()))
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key].update(value)
        else:
            spec[key] = value
    return spec


def run_harness(script: str, args: list[str], cwd: Path, timeout: float = 300):
    return subprocess.run(
        [sys.executable, "-I", "-B", str(HARNESS / script), *args],
        cwd=cwd,
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_check(tmp_path: Path, task: str, impl: Path, spec: dict, name: str = "check"):
    """(process, path of the evidence it was asked to write)."""
    spec_path = tmp_path / f"{name}.spec.json"
    spec_path.write_text(json.dumps(spec))
    out = tmp_path / f"{name}.json"
    args = [
        "--task",
        str(TASKS / task),
        "--impl",
        str(impl),
        "--spec",
        str(spec_path),
        "--out",
        str(out),
    ]
    return run_harness("check.py", args, tmp_path), out


def run_measure(
    tmp_path: Path, task: str, baseline: Path, candidate: Path, spec: dict, name: str = "measure"
):
    """(process, path of the evidence it was asked to write)."""
    spec_path = tmp_path / f"{name}.spec.json"
    spec_path.write_text(json.dumps(spec))
    out = tmp_path / f"{name}.json"
    args = [
        "--task",
        str(TASKS / task),
        "--baseline",
        str(baseline),
        "--candidate",
        str(candidate),
        "--spec",
        str(spec_path),
        "--out",
        str(out),
    ]
    return run_harness("measure.py", args, tmp_path), out


def isolation_unavailable(mode: str) -> str | None:
    """Why this host cannot run a worker in isolation `mode` (RSI_WORKER_ISOLATION), or None.
    NB: uid mode needs a root referee and an interpreter the worker's uid can run (a venv
    under a 0700 home cannot be)."""
    import os

    isolation = load_harness_module("isolation")
    if mode == "namespaces" and isolation.bwrap_path() is None:
        return "no bubblewrap here"
    if mode == "uid":
        if os.geteuid() != 0:
            return "uid mode needs a root referee"
        uid = isolation.WORKER_UID

        def drop():
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)

        try:
            subprocess.run(
                [sys.executable, "-I", "-c", "pass"], preexec_fn=drop, check=True, timeout=60
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return f"uid {uid} cannot run this interpreter ({exc})"
    return None


def open_to_worker_uid(path: Path) -> None:
    """Let uid mode's worker reach `path` (pytest's tmp folders are 0700): o+rx up the tree."""
    for folder in (path, *path.parents):
        if folder == Path("/"):
            break
        folder.chmod(folder.stat().st_mode | 0o005)
