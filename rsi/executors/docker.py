"""The docker executor: one action, one container started by image ID from its toolchain.

The container has no network, a read-only root, inputs bound read-only, only the declared output
folders writable, a tmpfs /tmp, the action's limits (memory, swap included; /tmp and each
file it writes capped at its scratch limit; CPU, pids), a non-root user, no capabilities and
no-new-privileges. It is removed after every outcome: exit, timeout, OOM, cancel, Ctrl-C and
SIGTERM of the build. It never pulls: the image is loaded from the toolchain's own tar.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests

from rsi.action import Action, ActionResult
from rsi.errors import ExecutionError
from rsi.executors.base import (
    TRASH,
    count_scratch,
    finish_run,
    host_facts,
    materialise_inputs,
)
from rsi.limits import Limits, parse_size
from rsi.store import LocalStore
from rsi.toolchain.build import ToolchainInfo, lookup_toolchain
from rsi.toolchain.image import ensure_loaded
from rsi.toolchain.runtime import (
    EXEC_ROOT,
    SANDBOX_GID,
    SANDBOX_UID,
    action_environment,
    cpu_count,
    cpuset,
    platform_map,
    prepare_writable,
)

LABEL = "rsi.executor"
# NB: the SDK surfaces engine trouble as its own errors or as raw requests errors
DOCKER_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException, OSError)
_live: dict[str, Any] = {}
_live_lock = threading.Lock()
_sigterm_installed = False


def docker_client(timeout: int = 120):
    """A Docker SDK client for the local engine, or ExecutionError saying how to get one."""
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
        return client
    except DOCKER_ERRORS as exc:
        raise ExecutionError(
            f"no Docker engine reachable: {exc}",
            hint="start one (scripts/ci-docker.sh does it) or set DOCKER_HOST",
        ) from None


def _remove_live() -> None:
    with _live_lock:
        containers = list(_live.values())
        _live.clear()
    for container in containers:
        with contextlib.suppress(*DOCKER_ERRORS):
            container.remove(force=True)


def _on_sigterm(signum, frame) -> None:
    # NB: remove our containers, then die of SIGTERM as the default handler would
    _remove_live()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _install_sigterm_cleanup() -> None:
    global _sigterm_installed
    if _sigterm_installed or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _on_sigterm)
    import atexit

    atexit.register(_remove_live)
    _sigterm_installed = True


class DockerExecutor:
    name = "docker"
    copies_sources = True  # NB: materialise_inputs copies sources from the workspace

    def __init__(
        self,
        client=None,
        *,
        memory: str | None = None,
        pids_limit: int = 1024,
        limits: Limits | None = None,
    ) -> None:
        """`limits` (default: the host's) bound every container's memory (`--memory`, swap
        included), its /tmp (a tmpfs of the scratch limit) and each file it writes (`--ulimit
        fsize`); `memory` overrides the memory limit."""
        self.client = client or docker_client()
        self.limits = limits or Limits.default()
        if memory:
            self.limits = self.limits.replace(memory_bytes=parse_size(memory, "memory"))
        self.pids_limit = pids_limit
        self._loaded: set[str] = set()
        self._server = self.client.version().get("Version")
        _install_sigterm_cleanup()
        self.sweep()

    def sweep(self) -> int:
        """Remove containers left by an rsi process on this host that no longer runs."""
        removed = 0
        for c in self.client.containers.list(all=True, filters={"label": LABEL}):
            labels = c.labels or {}
            if labels.get("rsi.host") != socket.gethostname():
                continue
            try:
                os.kill(int(labels.get("rsi.pid", "0")), 0)
                continue
            except (ProcessLookupError, ValueError):
                pass
            except PermissionError:
                continue
            with contextlib.suppress(*DOCKER_ERRORS):
                c.remove(force=True)
                removed += 1
        return removed

    def image_for(self, info: ToolchainInfo) -> str:
        if info.image_id not in self._loaded:
            try:
                ensure_loaded(self.client, info.image_config, info.rootfs_tar, info.rootfs_sha256)
            except (*DOCKER_ERRORS, RuntimeError) as exc:
                raise ExecutionError(f"cannot load image for {info.platform_value}: {exc}") from exc
            self._loaded.add(info.image_id)
        return info.image_id

    def container_kwargs(
        self, action: Action, info: ToolchainInfo, exec_dir: Path, writable: list[str]
    ) -> dict[str, Any]:
        """Everything `containers.create` gets besides the image (pure; tests inspect it)."""
        from docker.types import DeviceRequest, Mount

        mounts = []
        if writable == [""]:
            mounts.append(Mount(EXEC_ROOT, str(exec_dir), type="bind", read_only=False))
        else:
            mounts.append(Mount(EXEC_ROOT, str(exec_dir), type="bind", read_only=True))
            for unit in writable:
                mounts.append(
                    Mount(f"{EXEC_ROOT}/{unit}", str(exec_dir / unit), type="bind", read_only=False)
                )
        if writable == [""]:
            from rsi.executors.base import readonly_units

            for unit in readonly_units(action):
                mounts.append(
                    Mount(f"{EXEC_ROOT}/{unit}", str(exec_dir / unit), type="bind", read_only=True)
                )
        from docker.types import Ulimit

        limits = self.limits.for_action(platform_map(action))
        memory, scratch = limits.memory_bytes, limits.scratch_bytes
        kwargs: dict[str, Any] = dict(  # noqa: C408 - mirrors the SDK's keyword names
            command=list(action.argv),
            environment=action_environment(info, action),
            working_dir=EXEC_ROOT,
            user=f"{SANDBOX_UID}:{SANDBOX_GID}",
            network_mode="none",
            read_only=True,
            mounts=mounts,
            tmpfs={"/tmp": f"rw,nosuid,nodev,size={scratch},mode=1777"},
            ulimits=[Ulimit(name="fsize", soft=scratch, hard=scratch)],
            mem_limit=memory,
            memswap_limit=memory,
            pids_limit=self.pids_limit,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            hostname="rsi",
            ipc_mode="private",
            labels={
                LABEL: self.name,
                "rsi.pid": str(os.getpid()),
                "rsi.host": socket.gethostname(),
                "rsi.action": action.key().hash,
            },
        )
        cpus = cpu_count(action)
        if cpus:
            kwargs["nano_cpus"] = int(cpus * 1e9)
        if cpuset(action):
            kwargs["cpuset_cpus"] = cpuset(action)
        accelerator = platform_map(action).get("accelerator")
        if accelerator:
            # NB: any accelerator value ("nvidia", "cuda", a model name) asks for GPUs; the
            # count comes from `gpus` or `accelerator-count`, default all of them
            props = platform_map(action)
            count = int(props.get("gpus") or props.get("accelerator-count") or -1)
            kwargs["device_requests"] = [DeviceRequest(count=count, capabilities=[["gpu"]])]
        return kwargs

    def _toolchain(self, store: LocalStore, value: str) -> ToolchainInfo:
        return lookup_toolchain(store.root, value)

    def run(
        self, action: Action, store: LocalStore, cancel: threading.Event | None = None
    ) -> ActionResult:
        toolchain = platform_map(action).get("toolchain")
        if not toolchain or "@" not in toolchain:
            raise ExecutionError(
                f"{action.label or 'action'}: the docker executor needs a `toolchain` platform "
                "property <name>@recipe:<recipe digest> or <name>@<rootfs digest>",
                hint="declare the action's toolchain, or run it with the local executor",
            )
        info = self._toolchain(store, toolchain)
        image = self.image_for(info)
        limits = self.limits.for_action(platform_map(action))
        scratch = store.scratch_dir()
        exec_dir = scratch / "exec"
        exec_dir.mkdir()
        os.chmod(scratch, 0o711)
        started = time.time()
        container = None
        try:
            materialise_inputs(action, store, exec_dir)
            writable = prepare_writable(exec_dir, action)
            os.chmod(exec_dir, 0o755)
            kwargs = self.container_kwargs(action, info, exec_dir, writable)
            try:
                container = self.client.containers.create(image, **kwargs)
            except DOCKER_ERRORS as exc:
                raise ExecutionError(f"cannot create container from {image}: {exc}") from exc
            with _live_lock:
                _live[container.id] = container
            t0 = time.perf_counter()
            try:
                container.start()
            except DOCKER_ERRORS as exc:
                hint = (
                    "this engine has no GPU runtime; install nvidia-container-toolkit"
                    if "device driver" in str(exc)
                    else None
                )
                raise ExecutionError(f"cannot start container: {exc}", hint=hint) from exc
            exit_code, timed_out = self._wait(container, action.timeout_s, cancel)
            wall = time.perf_counter() - t0
            container.reload()
            state = container.attrs.get("State", {})
            oom = bool(state.get("OOMKilled"))
            written, full = count_scratch(scratch, action, limits.scratch_bytes)
            exceeded, cut_short = limits.verdict(
                oom=oom, written=written, full=full, failed=exit_code != 0
            )
            stdout_path, stderr_path = scratch / "stdout", scratch / "stderr"
            stdout_path.write_bytes(container.logs(stdout=True, stderr=False))
            stderr_path.write_bytes(container.logs(stdout=False, stderr=True))
            return finish_run(
                store,
                action,
                exec_dir,
                exit_code=exit_code,
                timed_out=timed_out,
                killed="container killed",
                cut_short=cut_short,
                stdout_path=stdout_path,
                stderr_path=stderr_path,
                executor=self.name,
                host={
                    **host_facts(),
                    "sandbox": "docker",
                    "docker_server": self._server,
                    "image": image,
                    "rootfs": str(info.rootfs),
                    "oom_killed": oom,
                    "limits": limits.facts("files on disk, /tmp a tmpfs", "docker", exceeded),
                },
                started=started,
                wall_s=wall,
            )
        finally:
            if container is not None:
                _remove(container)
                with _live_lock:
                    _live.pop(container.id, None)
            TRASH.put(scratch)

    def _wait(
        self, container, timeout_s: float, cancel: threading.Event | None
    ) -> tuple[int, bool]:
        done: dict[str, Any] = {}

        def waiter() -> None:
            try:
                done["status"] = container.wait()
            except DOCKER_ERRORS as exc:
                done["error"] = exc

        thread = threading.Thread(target=waiter, daemon=True)
        thread.start()
        deadline = time.monotonic() + timeout_s
        while thread.is_alive():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                _kill(container)
                thread.join(30)
                return -signal.SIGKILL, True
            thread.join(min(remaining, 0.05) if cancel is not None else remaining)
            if cancel is not None and cancel.is_set() and thread.is_alive():
                _kill(container)
                raise ExecutionError("cancelled")
        if "error" in done:
            raise ExecutionError(f"lost the container while waiting: {done['error']}")
        return int(done["status"].get("StatusCode", -1)), False


def _remove(container, attempts: int = 5) -> None:
    """Remove a container for sure: a busy engine may refuse once ("removal in progress")."""
    import docker

    for attempt in range(attempts):
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            return
        except DOCKER_ERRORS:
            time.sleep(0.2 * (attempt + 1))
            continue
        try:
            container.reload()
        except docker.errors.NotFound:
            return
        except DOCKER_ERRORS:
            pass
        time.sleep(0.2 * (attempt + 1))


def _kill(container) -> None:
    with contextlib.suppress(*DOCKER_ERRORS):
        container.kill()
