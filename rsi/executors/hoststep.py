"""Host steps: actions rsi itself runs on this host, outside any sandbox, whatever executor the
build uses. One kind exists: building a toolchain's rootfs (`rsi.toolchain.step`), which needs
the package mirrors (network) and root, and writes its tree beside the CAS.

An action is a host step when its platform has `host-step = <kind>`; that property is part of
its key like any other. Host steps are scheduled, cached and reported like every action: the
scheduler hands them to `HostStepExecutor` instead of the build's executor (a remote engine
never sees them, and the local sandboxes never run them), and honours a cached result only
while `present` says what the step made is still there.
"""

from __future__ import annotations

import threading

from rsi.action import Action, ActionResult
from rsi.errors import ExecutionError
from rsi.store import LocalStore

HOST_STEP = "host-step"
# NB: the platform property of a toolchain's build step naming the value it provides
# (`<name>@recipe:<hex>`): the analysis runs every action with that `toolchain` after it
PROVIDES_TOOLCHAIN = "provides-toolchain"


def host_step_kind(action: Action) -> str | None:
    return dict(action.platform).get(HOST_STEP)


def _module(kind: str):
    if kind == "toolchain":
        from rsi.toolchain import step

        return step
    raise ExecutionError(f"unknown host step {kind!r}", hint="this rsi runs host-step=toolchain")


def present(action: Action, store: LocalStore) -> bool:
    """Whether a cached result of this host step may be served: what it made is in `store`."""
    kind = host_step_kind(action)
    return kind is None or _module(kind).built(action, store)


class HostStepExecutor:
    """Runs host steps in this process (their subprocesses in their own process groups)."""

    name = "host-step"
    copies_sources = False  # NB: inputs are read from the store: the scheduler uploads them

    def run(
        self, action: Action, store: LocalStore, cancel: threading.Event | None = None
    ) -> ActionResult:
        kind = host_step_kind(action)
        if kind is None:
            raise ExecutionError(f"{action.label or 'action'} is not a host step")
        return _module(kind).run(action, store, cancel)


HOST_STEPS = HostStepExecutor()
