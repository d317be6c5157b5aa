"""What the bwrap-based executors share, so neither imports the other: the bwrap arguments every
sandbox gets, the name of host-Python toolchains, waiting for a sandboxed process (with its timeout
and cancellation), and which executor runs a toolchain of the other kind. It must never run an
action itself.

The local executor runs a container toolchain's actions through the bwrap executor, and the
bwrap executor runs host toolchains' actions through the local one; each finds the other here,
by name, when it first needs it.
"""

from __future__ import annotations

import importlib
import os
import select
import signal
import subprocess
import threading
import time
from typing import Any

from rsi.errors import ExecutionError

# NB: shared by every bwrap rsi starts: dies with rsi, own session (no TIOCSTI into the
# caller's terminal), a fixed hostname; and a private /proc and /dev
BWRAP_SESSION = ("--die-with-parent", "--new-session", "--hostname", "rsi")
BWRAP_KERNEL_FS = ("--proc", "/proc", "--dev", "/dev")
HOST_PYTHON = "host-python"

_EXECUTORS = {
    "container": ("rsi.executors.bwrap", "BwrapExecutor"),  # a toolchain with a rootfs
    "host": ("rsi.executors.local", "LocalExecutor"),  # `host` and host-python@… toolchains
}


def is_host_toolchain(toolchain: str | None) -> bool:
    return toolchain in (None, "host") or toolchain.startswith(HOST_PYTHON + "@")


def executor_for(kind: str, **kwargs: Any) -> Any:
    """A new executor for `kind` ("container" or "host") toolchains."""
    module, name = _EXECUTORS[kind]
    return getattr(importlib.import_module(module), name)(**kwargs)


def wait_process(proc: subprocess.Popen, timeout_s: float, cancel: threading.Event | None) -> bool:
    """Wait for exit, waking at once when it happens (pidfd), not on a polling tick."""
    deadline = time.monotonic() + timeout_s
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        poller = select.poll()
        if pidfd is not None:
            poller.register(pidfd, select.POLLIN)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                _kill_group(proc)
                return True
            step = min(remaining, 0.2 if cancel is not None else remaining)
            if pidfd is not None:
                if poller.poll(step * 1000):
                    proc.wait()
                    return False
            else:
                try:
                    proc.wait(timeout=step)
                    return False
                except subprocess.TimeoutExpired:
                    pass
            if cancel is not None and cancel.is_set():
                _kill_group(proc)
                raise ExecutionError("cancelled")
    except BaseException:
        _kill_group(proc)
        raise
    finally:
        if pidfd is not None:
            os.close(pidfd)
        # NB: an action's detached grandchildren share its process group or namespace;
        # killing the group after a normal exit sweeps up what bwrap/unshare did not.
        _kill_group(proc, reap=False)


def _kill_group(proc: subprocess.Popen, reap: bool = True) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if reap:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
