"""The local executor: one action, one fresh scratch folder, a cleared environment, read-only
inputs, no network, and a process tree that is gone when the action ends. It must never leave a
process of an action running after the action ends.

Sandboxing prefers bubblewrap (new namespaces, a root built from read-only binds, the workspace
and the store invisible), falls back to `unshare` (no network, own pid namespace), and only then
to a plain process group, which it reports in every result as `sandbox: none`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from functools import lru_cache
from pathlib import Path

from rsi.action import Action, ActionResult
from rsi.digest import FileNode
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
from rsi.executors import staged
from rsi.executors.host_python import (  # NB: host_python_identity: named here for callers
    host_python_identity as host_python_identity,
)
from rsi.executors.host_python import is_this_interpreter
from rsi.executors.pool import (
    POOL,
    SLOT_ROOT,
    bwrap_has_perms,
    bwrap_has_size,
    pool_supported,
    prepare_exec_dir,
    tmpfs_args,
)
from rsi.executors.sandbox import (
    BWRAP_KERNEL_FS,
    BWRAP_SESSION,
    HOST_PYTHON,
    executor_for,
    wait_process,
)
from rsi.limits import Limits, cgroup_support
from rsi.store import LocalStore

# NB: inputs up to this size are copied into a pooled slot's tmpfs; above it, hard links
POOL_MAX_INPUT_BYTES = 64 << 20

EXEC_ROOT = "/rsi/exec"


@lru_cache(maxsize=1)
def sandbox_mode() -> str:
    """'bwrap', 'unshare' or 'none': the strongest isolation that works on this machine."""
    forced = os.environ.get("RSI_SANDBOX")
    if forced in ("bwrap", "unshare", "none"):
        return forced
    bwrap = shutil.which("bwrap")
    if bwrap:
        from rsi.executors import probes

        def works() -> bool:
            probe = subprocess.run(
                [bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "true"],
                capture_output=True,
            )
            return probe.returncode == 0

        # NB: kept between builds under the binary's and the host's signatures (a process
        # start saved on every build that runs something); only a working bwrap is kept
        binary = probes.binary_key("bwrap")
        key = None if binary is None else [binary, probes.host_key()]
        if probes.cached("bwrap-works", key, works, keep=bool):
            return "bwrap"
    unshare = shutil.which("unshare")
    if unshare:
        probe = subprocess.run(
            [unshare, "--net", "--pid", "--fork", "--kill-child", "--map-root-user", "true"],
            capture_output=True,
        )
        if probe.returncode == 0:
            return "unshare"
    return "none"


@lru_cache(maxsize=1)
def _system_binds() -> tuple[str, ...]:
    args: list[str] = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    # NB: made here, 0755 as the host's: bwrap would make /etc, above the files bound in it,
    # 0700, and an action run as the sandbox uid could read none of them (no ld.so.cache, so
    # every exec probes ~20 library paths; no /etc/alternatives, so no awk; no passwd)
    args += ["--perms", "0755", "--dir", "/etc"] if bwrap_has_perms() else ["--dir", "/etc"]
    for etc in (
        "/etc/alternatives",
        "/etc/ld.so.cache",
        "/etc/ld.so.conf",
        "/etc/ld.so.conf.d",
        "/etc/passwd",
        "/etc/group",
        "/etc/nsswitch.conf",
        "/etc/localtime",
    ):
        if os.path.exists(etc):
            args += ["--ro-bind", etc, etc]
    return tuple(args)


@lru_cache(maxsize=1)
def _python_binds() -> tuple[str, ...]:
    seen: list[str] = []
    for p in (sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))):
        real = os.path.realpath(p)
        if not any(real == s or real.startswith(s + "/") for s in seen):
            seen.append(real)
    args: list[str] = []
    made: set[str] = set()
    for p in seen:
        if not p.startswith("/usr/"):
            # NB: folders bwrap creates above a bind copy the host's mode (/root is 0700);
            # made 0755 here, so a sandbox running as another uid can reach the interpreter
            parent = os.path.dirname(p)
            chain = []
            while parent not in ("/", "") and parent not in made:
                chain.append(parent)
                made.add(parent)
                parent = os.path.dirname(parent)
            for d in reversed(chain):
                args += ["--perms", "0755", "--dir", d] if bwrap_has_perms() else ["--dir", d]
            args += ["--ro-bind", p, p]
    return tuple(args)


def gpu_binds() -> list[str]:
    """bwrap arguments exposing the host's NVIDIA devices (and /sys, read-only, which the
    driver libraries consult) to an action whose platform asks for an `accelerator`. Without
    a GPU there is nothing to bind, and the harness refuses such an action itself."""
    import glob

    devices = sorted(glob.glob("/dev/nvidia*"))
    if not devices:
        return []
    args: list[str] = []
    for dev in devices:
        args += ["--dev-bind", dev, dev]
    return [*args, "--ro-bind", "/sys", "/sys"]


@lru_cache(maxsize=8)
def _pool_shape(scratch_bytes: int) -> tuple[str, ...]:
    """The bwrap arguments of every persistent slot of this scratch size (GPU actions never
    use one). The slot's runner is this interpreter, so its install is bound in every slot.
    `/tmp` and `/dev/shm` hold `scratch_bytes` each, `/rsi` that plus room for the inputs."""
    no_accelerator = Action(argv=("true",))
    return (
        *LocalExecutor._sandbox_args(no_accelerator, list(_python_binds()), scratch_bytes),
        *tmpfs_args(SLOT_ROOT, "0755", scratch_bytes + POOL_MAX_INPUT_BYTES),
    )


@lru_cache(maxsize=1)
def _setpriv() -> str | None:
    """util-linux setpriv under /usr (bound into every sandbox), or None."""
    for path in ("/usr/bin/setpriv", "/usr/sbin/setpriv"):
        if os.access(path, os.X_OK):
            return path
    return None


def _tmpfs_bytes(action: Action) -> int:
    """What the inputs take on a tmpfs, in whole pages."""
    return sum(
        -(-n.digest.size // 4096) * 4096 for _, n in action.inputs if isinstance(n, FileNode)
    )


class LocalExecutor:
    name = "local"
    copies_sources = True  # NB: materialise_inputs copies sources from the workspace

    def __init__(
        self, sandbox: str | None = None, pool: bool = True, limits: Limits | None = None
    ) -> None:
        self.sandbox = sandbox or sandbox_mode()
        self.pool = pool
        self.limits = limits or Limits.default()

    def _argv(self, action: Action) -> tuple[list[str], list[str]]:
        """(argv to run, extra bwrap binds) after resolving the action's toolchain."""
        argv = list(action.argv)
        platform = dict(action.platform)
        toolchain = platform.get("toolchain", "host")
        binds: list[str] = []
        if toolchain.startswith(HOST_PYTHON + "@"):
            if not is_this_interpreter(toolchain):
                raise ExecutionError(
                    f"action needs {toolchain} but this interpreter (the packages it names) "
                    "is not that one",
                    hint="run with the same environment, or rebuild so the key matches this one",
                )
            if argv[0] in ("python3", "python"):
                argv[0] = sys.executable
            binds += list(_python_binds())
        elif toolchain != "host":
            raise ExecutionError(
                f"the local executor cannot provide toolchain {toolchain!r}",
                hint="use --executor bwrap or docker for container toolchains",
            )
        return argv, binds

    def run(
        self, action: Action, store: LocalStore, cancel: threading.Event | None = None
    ) -> ActionResult:
        toolchain = dict(action.platform).get("toolchain", "host")
        if toolchain != "host" and not toolchain.startswith(HOST_PYTHON + "@"):
            # NB: a container toolchain runs in its own rootfs; bwrap is the cheap way there
            return executor_for("container", limits=self.limits).run(action, store, cancel)
        limits = self.limits.for_action(dict(action.platform))
        tree = staged.open_tree(store, action) if self._staged(action) else None
        if tree is None and self._pooled(action):
            return self._run_pooled(action, store, cancel, limits)
        scratch = store.scratch_dir()
        exec_dir = scratch / "exec" if tree is None else tree.exec_dir
        started = time.time()
        guard = None
        try:
            if tree is None:
                exec_dir.mkdir()
                materialise_inputs(action, store, exec_dir, link=self.sandbox == "bwrap")
            argv, extra_binds = self._argv(action)
            for name in ("tmp", "shm"):  # NB: its /tmp and /dev/shm, counted as scratch
                (scratch / name).mkdir()
                os.chmod(scratch / name, 0o1777)
            if tree is None:
                cmd, cwd = self._wrap(action, argv, extra_binds, exec_dir)
            else:
                cmd, cwd = self._wrap_tree(action, argv, extra_binds, scratch, exec_dir)
            stdout_path, stderr_path = scratch / "stdout", scratch / "stderr"
            env = dict(action.env)
            token = None
            if self.sandbox == "none":
                # NB: with no pid namespace, a grandchild that calls setsid leaves the process
                # group; this token in its environment is how the sweep below finds it
                token = os.urandom(16).hex()
                env[SWEEP_VAR] = token
            status = BwrapStatus() if self.sandbox == "bwrap" else None
            guard = ActionGuard(limits)
            with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
                t0 = time.perf_counter()
                popen = dict(
                    cwd=cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                )
                try:
                    if status is not None:
                        proc = guard.start_bwrap(cmd, status, **popen)
                    else:
                        # NB: sh finds the program by its own PATH: resolved here, as Popen would
                        exe = shutil.which(cmd[0], path=env.get("PATH", os.defpath)) or cmd[0]
                        proc = guard.spawn([exe, *cmd[1:]], **popen)
                except OSError as exc:
                    raise ExecutionError(f"cannot start {cmd[0]}: {exc}") from exc
                try:
                    timed_out = self._wait(proc, action.timeout_s, cancel)
                finally:
                    if token is not None:
                        sweep_processes(token, exec_dir)
                wall = time.perf_counter() - t0
            oom = guard.close()
            if status is not None:
                status.require_started(stderr_path, timed_out)
            written, full = guard.scratch(scratch, action)
            if tree is not None:  # NB: its outputs, and whatever else it left in the tree
                in_tree, full_tree = tree.written(limits.scratch_bytes)
                written, full = written + in_tree, full + full_tree
            exceeded, cut_short = limits.verdict(
                oom=oom, written=written, full=full, failed=proc.returncode != 0
            )
            return finish_run(
                store,
                action,
                exec_dir,
                exit_code=proc.returncode,
                timed_out=timed_out,
                killed="process tree killed",
                cut_short=cut_short,
                stdout_path=stdout_path,
                stderr_path=stderr_path,
                executor=self.name,
                host={
                    **host_facts(),
                    "sandbox": self.sandbox,
                    **({"sandbox_inputs": "prepared tree"} if tree is not None else {}),
                    "limits": limits.facts("files on disk", guard.memory, exceeded),
                },
                started=started,
                wall_s=wall,
            )
        finally:
            if guard is not None:
                guard.close()
            if tree is not None:
                tree.close()
            TRASH.put(scratch)

    def _staged(self, action: Action) -> bool:
        """A prepared tree of the store's (rsi.executors.staged) when the action has many
        inputs and its own bwrap sandbox can run it as the sandbox uid, which owns no blob."""
        if self.sandbox != "bwrap" or not self.pool or not pool_supported():
            return False
        if dict(action.platform).get("accelerator") or not staged.usable(action):
            return False
        return _setpriv() is not None

    def _wrap_tree(
        self,
        action: Action,
        argv: list[str],
        extra_binds: list[str],
        scratch: Path,
        exec_dir: Path,
    ) -> tuple[list[str], str]:
        """bwrap over a prepared tree: bound whole at the exec root (no bind per input), the
        command run as the sandbox uid, which cannot change a root-owned read-only input in
        folders it may not rename in (rsi.executors.staged)."""
        setpriv = _setpriv()
        assert setpriv is not None
        uid = str(staged.SANDBOX_UID)
        return [
            "bwrap",
            *self._sandbox_args(action, extra_binds, scratch=scratch),
            # NB: only to drop to the sandbox uid: setpriv's setuid clears every capability
            "--cap-add",
            "CAP_SETUID",
            "--cap-add",
            "CAP_SETGID",
            "--dir",
            "/rsi",
            "--bind",
            str(exec_dir),
            EXEC_ROOT,
            "--chdir",
            EXEC_ROOT,
            "--",
            setpriv,
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--",
            *argv,
        ], "/"

    def _pooled(self, action: Action) -> bool:
        """A persistent slot when bwrap is the sandbox, this process may hand out uids, and
        the inputs are small enough to copy onto a tmpfs (large ones are hard-linked from the
        store into a per-action sandbox instead)."""
        if self.sandbox != "bwrap" or not self.pool or not pool_supported():
            return False
        if dict(action.platform).get("accelerator"):
            return False
        return _tmpfs_bytes(action) <= POOL_MAX_INPUT_BYTES

    def _run_pooled(
        self,
        action: Action,
        store: LocalStore,
        cancel: threading.Event | None,
        limits: Limits,
    ) -> ActionResult:
        argv, _ = self._argv(action)
        shape = _pool_shape(limits.scratch_bytes)
        slot = POOL.acquire(shape)
        healthy = False
        started = time.time()
        try:
            exec_dir = slot.fresh_exec_dir()
            materialise_inputs(action, store, exec_dir)
            prepare_exec_dir(exec_dir, [rel for rel, _ in action.inputs], list(action.outputs))
            resp = slot.run(argv, dict(action.env), action.timeout_s, cancel, limits.memory_bytes)
            if resp.get("error"):
                raise ExecutionError(f"sandbox slot: {resp['error']}")
            exit_code = int(resp.get("exit_code") or 0)
            exceeded, cut_short = limits.verdict(
                oom=bool(resp.get("oom")),
                written=resp.get("written"),
                full=list(resp.get("full") or []),
                failed=exit_code != 0,
            )
            scratch = "tmpfs per slot" if bwrap_has_size() else "tmpfs per slot, unsized"
            result = finish_run(
                store,
                action,
                exec_dir,
                exit_code=exit_code,
                timed_out=bool(resp.get("timed_out")),
                killed="process tree killed",
                cut_short=cut_short,
                stdout_path=slot.stdout,
                stderr_path=slot.stderr,
                executor=self.name,
                host={
                    **host_facts(),
                    "sandbox": "bwrap",
                    "sandbox_slot": "persistent",
                    "limits": limits.facts(
                        scratch, cgroup_support().label if slot.cgroup else None, exceeded
                    ),
                },
                started=started,
                wall_s=float(resp.get("wall_s") or 0.0),
            )
            slot.clear()
            healthy = slot.alive()
            return result
        finally:
            POOL.release(shape, slot, healthy)

    @staticmethod
    def _sandbox_args(
        action: Action,
        extra_binds: list[str],
        scratch_bytes: int | None = None,
        scratch: Path | None = None,
    ):
        """The bwrap arguments that shape the sandbox (namespaces, the root, /tmp). A
        persistent slot (`scratch_bytes`) gets sized tmpfs mounts at /tmp and /dev/shm; a
        per-action sandbox binds folders `tmp` and `shm` of its `scratch` there."""
        tmp = (
            ["--bind", str(scratch / "shm"), "/dev/shm", "--bind", str(scratch / "tmp"), "/tmp"]
            if scratch is not None
            else [
                *tmpfs_args("/dev/shm", "1777", scratch_bytes),
                *tmpfs_args("/tmp", "1777", scratch_bytes),
            ]
        )
        # NB: explicit namespaces, not --unshare-all: a user namespace doubles start-up cost
        return [
            "--unshare-net",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            *BWRAP_SESSION,
            *_system_binds(),
            *BWRAP_KERNEL_FS,
            *tmp,
            # NB: after /tmp, so an interpreter living under /tmp stays visible
            *extra_binds,
            *(gpu_binds() if dict(action.platform).get("accelerator") else []),
        ]

    def _wrap(
        self, action: Action, argv: list[str], extra_binds: list[str], exec_dir: Path
    ) -> tuple[list[str], str]:
        if self.sandbox == "bwrap":
            cmd = [
                "bwrap",
                # NB: the action's /tmp and /dev/shm are folders next to exec_dir
                *self._sandbox_args(action, extra_binds, scratch=exec_dir.parent),
                "--dir",
                "/rsi",
                "--bind",
                str(exec_dir),
                EXEC_ROOT,
            ]
            for unit in readonly_units(action):
                cmd += ["--ro-bind", str(exec_dir / unit), f"{EXEC_ROOT}/{unit}"]
            cmd += ["--chdir", EXEC_ROOT, "--", *argv]
            return cmd, "/"
        if self.sandbox == "unshare":
            flags = ["--net", "--pid", "--fork", "--kill-child"]
            if os.geteuid() != 0:
                flags.append("--map-root-user")
            return ["unshare", *flags, "--", *argv], str(exec_dir)
        return argv, str(exec_dir)

    _wait = staticmethod(wait_process)


SWEEP_VAR = "RSI_ACTION_TOKEN"


def sweep_processes(token: str, exec_dir: Path) -> int:
    """Kill every process that carries this action's token or works inside its folder.

    The fallback for `sandbox: none`, where no namespace ends with the action.
    """
    needle = f"{SWEEP_VAR}={token}".encode()
    prefix = str(exec_dir)
    killed = 0
    for _ in range(3):  # NB: a killed parent may have forked meanwhile; sweep until quiet
        found = 0
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    hit = needle in f.read()
                if not hit:
                    cwd = os.readlink(f"/proc/{entry}/cwd")
                    hit = cwd == prefix or cwd.startswith(prefix + "/")
                if hit:
                    os.kill(int(entry), signal.SIGKILL)
                    found += 1
            except (OSError, ValueError):
                continue
        killed += found
        if not found:
            break
    return killed
