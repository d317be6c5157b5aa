"""Opening what a build runs with: a workspace's store and its local executors.

Both `build.py` and `remote/` need these (a remote session opens the store; remote execution
falls back to the local executor), and `build.py` imports `remote/`; so they live here, below
both, and `remote/` never imports `build.py`.
"""

from __future__ import annotations

from typing import Any

from rsi.errors import RsiError
from rsi.store import LocalStore

LOCAL_EXECUTORS = ("local", "bwrap", "docker")


def open_store(ws: Any) -> LocalStore:
    ws.check_store()
    return LocalStore(ws.store_dir, ws.digest_function)


def make_local_executor(name: str, ws: Any) -> Any:
    """The executor `name` (local, bwrap, docker or slurm) with the workspace's limits."""
    from rsi.limits import Limits

    limits = Limits.from_workspace(ws)
    if name == "local":
        from rsi.executors.local import LocalExecutor

        return LocalExecutor(limits=limits)
    if name == "bwrap":
        from rsi.executors.bwrap import BwrapExecutor

        return BwrapExecutor(limits=limits)
    if name == "docker":
        from rsi.executors.docker import DockerExecutor

        return DockerExecutor(limits=limits)
    if name == "slurm":
        from rsi.executors.slurm import SlurmExecutor

        return SlurmExecutor(dict(getattr(ws, "slurm", ())), limits=limits)
    raise RsiError(f"unknown executor {name!r}", hint="use local, bwrap, docker, slurm or remote")
