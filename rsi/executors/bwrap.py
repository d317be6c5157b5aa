"""The bwrap executor: the docker executor's sandbox without a daemon, in the same toolchain. It
must never run an action outside its toolchain's root filesystem.

The toolchain's rootfs tar is extracted once into the store and bound read-only as `/`; inputs
are read-only, only the declared output folders and /tmp, /dev/shm (folders of the action's
scratch) are writable, the action's limits hold (`ActionGuard`: memory cgroup, file size cap,
scratch counted), there is no network, the sandbox has its own pid namespace and dies with its
parent, and the action runs as an unprivileged user. A timeout kills bwrap, which takes the
whole pid namespace with it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

from rsi.action import Action, ActionResult
from rsi.errors import ExecutionError
from rsi.executors.base import (
    TRASH,
    ActionGuard,
    BwrapStatus,
    finish_run,
    host_facts,
    materialise_inputs,
    readonly_units,
)
from rsi.executors.sandbox import (
    BWRAP_KERNEL_FS,
    BWRAP_SESSION,
    executor_for,
    is_host_toolchain,
    wait_process,
)
from rsi.limits import Limits
from rsi.store import LocalStore
from rsi.toolchain.build import ToolchainInfo, lookup_toolchain, rootfs_dir
from rsi.toolchain.runtime import (
    EXEC_ROOT,
    SANDBOX_GID,
    SANDBOX_UID,
    action_environment,
    cpuset,
    platform_map,
    prepare_writable,
)


def bwrap_available() -> str | None:
    """None when bwrap can build a sandbox here, else the reason it cannot."""
    exe = shutil.which("bwrap")
    if exe is None:
        return "bwrap is not installed (apt-get install bubblewrap)"
    kwargs = _drop_privileges()
    probe = subprocess.run(
        [exe, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "true"],
        check=False,
        capture_output=True,
        text=True,
        **kwargs,
    )
    if probe.returncode != 0:
        return f"bwrap cannot create namespaces here: {probe.stderr.strip()}"
    return None


def _drop_privileges() -> dict:
    # NB: bwrap itself runs as the sandbox user when we are root, so nothing in the sandbox is
    # uid 0 outside it either; it then needs unprivileged user namespaces
    if os.geteuid() == 0:
        return {"user": SANDBOX_UID, "group": SANDBOX_GID, "extra_groups": []}
    return {}


class BwrapExecutor:
    name = "bwrap"
    copies_sources = True  # NB: materialise_inputs copies sources from the workspace

    def __init__(self, limits: Limits | None = None) -> None:
        reason = bwrap_available()
        if reason:
            raise ExecutionError(f"the bwrap executor cannot run: {reason}")
        self.limits = limits or Limits.default()

    def command(
        self,
        action: Action,
        root: Path,
        exec_dir: Path,
        writable: list[str],
        env: dict[str, str],
        scratch: Path | None = None,
    ) -> list[str]:
        """The bwrap command line; /tmp and /dev/shm are folders `tmp` and `shm` of the
        action's `scratch` (counted against its limit), or small tmpfs mounts without one."""
        cmd = [
            "bwrap",
            "--unshare-all",
            *BWRAP_SESSION,
            "--ro-bind",
            str(root),
            "/",
            *BWRAP_KERNEL_FS,
        ]
        if scratch is not None:
            cmd += [
                "--bind",
                str(scratch / "tmp"),
                "/tmp",
                "--bind",
                str(scratch / "shm"),
                "/dev/shm",
            ]
        else:
            cmd += ["--tmpfs", "/tmp"]
        if writable == [""]:
            cmd += ["--bind", str(exec_dir), EXEC_ROOT]
            for unit in readonly_units(action):
                cmd += ["--ro-bind", str(exec_dir / unit), f"{EXEC_ROOT}/{unit}"]
        else:
            cmd += ["--ro-bind", str(exec_dir), EXEC_ROOT]
            for unit in writable:
                cmd += ["--bind", str(exec_dir / unit), f"{EXEC_ROOT}/{unit}"]
        if os.geteuid() != 0:
            cmd += ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID)]
        cmd += ["--clearenv"]
        for key, value in sorted(env.items()):
            cmd += ["--setenv", key, value]
        cmd += ["--chdir", EXEC_ROOT, "--", *action.argv]
        if cpuset(action):
            cmd = ["taskset", "-c", cpuset(action), *cmd]
        return cmd

    def _toolchain(self, store: LocalStore, value: str) -> ToolchainInfo:
        return lookup_toolchain(store.root, value)

    def run(
        self, action: Action, store: LocalStore, cancel: threading.Event | None = None
    ) -> ActionResult:
        toolchain = platform_map(action).get("toolchain")
        if toolchain is not None and is_host_toolchain(toolchain):
            # NB: host toolchains have no rootfs; the local executor's bwrap mode is their sandbox
            local = executor_for("host", sandbox="bwrap", limits=self.limits)
            result = local.run(action, store, cancel)
            return result.replace(executor=self.name)
        if not toolchain or "@" not in toolchain:
            raise ExecutionError(
                f"{action.label or 'action'}: the bwrap executor needs a `toolchain` platform "
                "property <name>@recipe:<recipe digest> or <name>@<rootfs digest>",
                hint="declare the action's toolchain, or run it with the local executor",
            )
        if platform_map(action).get("accelerator"):
            raise ExecutionError(
                "the bwrap executor does not provide accelerators",
                hint="run accelerator actions with the docker executor",
            )
        limits = self.limits.for_action(platform_map(action))
        info = self._toolchain(store, toolchain)
        root = rootfs_dir(info)
        scratch = store.scratch_dir()
        exec_dir = scratch / "exec"
        exec_dir.mkdir()
        for name in ("tmp", "shm"):
            (scratch / name).mkdir()
            os.chmod(scratch / name, 0o1777)
        os.chmod(scratch, 0o711)
        started = time.time()
        guard = None
        try:
            materialise_inputs(action, store, exec_dir)
            writable = prepare_writable(exec_dir, action)
            os.chmod(exec_dir, 0o755)
            env = action_environment(info, action)
            cmd = self.command(action, root, exec_dir, writable, env, scratch)
            stdout_path, stderr_path = scratch / "stdout", scratch / "stderr"
            status = BwrapStatus()
            guard = ActionGuard(limits)
            with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
                t0 = time.perf_counter()
                try:
                    proc = guard.start_bwrap(
                        cmd,
                        status,
                        cwd="/",
                        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=err,
                        start_new_session=True,
                        **_drop_privileges(),
                    )
                except OSError as exc:
                    raise ExecutionError(f"cannot start bwrap: {exc}") from exc
                timed_out = wait_process(proc, action.timeout_s, cancel)
                wall = time.perf_counter() - t0
            oom = guard.close()
            status.require_started(stderr_path, timed_out)
            written, full = guard.scratch(scratch, action)
            exceeded, cut_short = limits.verdict(
                oom=oom, written=written, full=full, failed=proc.returncode != 0
            )
            return finish_run(
                store,
                action,
                exec_dir,
                exit_code=proc.returncode,
                timed_out=timed_out,
                killed="sandbox killed",
                cut_short=cut_short,
                stdout_path=stdout_path,
                stderr_path=stderr_path,
                executor=self.name,
                host={
                    **host_facts(),
                    "sandbox": "bwrap",
                    "rootfs": str(info.rootfs),
                    "limits": limits.facts("files on disk", guard.memory, exceeded),
                },
                started=started,
                wall_s=wall,
            )
        finally:
            if guard is not None:
                guard.close()
            TRASH.put(scratch)
