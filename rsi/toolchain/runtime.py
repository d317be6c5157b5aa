"""What the docker and bwrap executors share about running an action inside a toolchain:
the environment, the writable folders, the sandbox user, and the platform properties they honour.

Both executors must derive these the same way, so one action behaves the same in either; every
input here is part of the action's key (env, outputs, platform), never host state.
"""

from __future__ import annotations

import os
from pathlib import Path

from rsi.action import Action
from rsi.toolchain.build import ToolchainInfo

SANDBOX_UID = 65534
SANDBOX_GID = 65534
EXEC_ROOT = "/rsi/exec"
# NB: `threads` pins every common threading runtime, so a benchmark's parallelism is declared
THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)


def platform_map(action: Action) -> dict[str, str]:
    return dict(action.platform)


def action_environment(info: ToolchainInfo, action: Action) -> dict[str, str]:
    """The toolchain's image env, then `threads` pins, then the action's own env (wins)."""
    env = dict(info.env)
    threads = platform_map(action).get("threads")
    if threads:
        env.update({var: str(int(threads)) for var in THREAD_VARS})
    env.update(dict(action.env))
    return env


def writable_units(action: Action) -> list[str]:
    """Folders (exec-root relative) that must be writable: the outputs' parent folders, fewest.

    An output declared at the top of the exec root makes the whole exec root writable ("").
    """
    parents = sorted({os.path.dirname(out) for out in action.outputs})
    if "" in parents:
        return [""]
    units: list[str] = []
    for p in parents:
        if not any(p == u or p.startswith(u + "/") for u in units):
            units.append(p)
    return units


def prepare_writable(exec_dir: Path, action: Action) -> list[str]:
    """Create the writable folders and hand them to the sandbox user; return them."""
    units = writable_units(action)
    for unit in units:
        d = exec_dir / unit if unit else exec_dir
        d.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            os.chown(d, SANDBOX_UID, SANDBOX_GID)
        os.chmod(d, 0o755)
    return units


def cpu_count(action: Action) -> float | None:
    value = platform_map(action).get("cpus")
    return float(value) if value else None


def cpuset(action: Action) -> str | None:
    return platform_map(action).get("cpuset") or None


def memory_limit(action: Action, default: str) -> str:
    return platform_map(action).get("memory") or default
