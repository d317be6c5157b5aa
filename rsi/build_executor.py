"""The build's executor: made by name (local, bwrap, docker, slurm, remote), routed per action
platform, and warmed in the background (a sandbox slot started before the first action needs
it). Must never decide what runs, and a warm-up failure never fails a build (it is a speed-up)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rsi.runtime import make_local_executor
from rsi.workspace import Workspace

if TYPE_CHECKING:
    from rsi.host import Capabilities


def executor_capabilities(executor: Any) -> Callable[[], Capabilities] | None:
    """What the executor can provide: its own `capabilities` when it declares them; none to
    check for a remote engine (its workers may have what this host lacks); otherwise what
    this host has, since a local executor runs actions here."""
    declared = getattr(executor, "capabilities", None)
    if declared is not None:
        return declared if callable(declared) else (lambda: declared)
    if getattr(executor, "name", "") == "remote":
        return None
    from rsi.host import host_capabilities

    return host_capabilities


def make_executor(name: str, ws: Workspace):
    if name == "remote":
        from rsi.remote import make_remote_executor  # type: ignore[import-not-found]

        return make_remote_executor(ws)
    return make_local_executor(name, ws)


class Routed:
    """The build's executor, except for actions whose platform names another one (a binding's
    `executor = "slurm"`): those go to that executor, made when first needed."""

    def __init__(self, executor: Any, ws: Workspace) -> None:
        self._executor, self._ws = executor, ws
        self._others: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _for(self, action: Any) -> Any:
        name = dict(action.platform).get("executor")
        if not name or name == self._ws.executor:
            return self._executor
        with self._lock:
            other = self._others.get(name)
            if other is None:
                other = self._others[name] = make_executor(name, self._ws)
        return other

    def run(self, action: Any, *args: Any, **kwargs: Any) -> Any:
        return self._for(action).run(action, *args, **kwargs)

    def capabilities(self) -> dict:
        """What the build's executor provides, and a configured Slurm cluster's nodes (an
        action routed there asks them, not this host)."""
        own = executor_capabilities(self._executor)
        caps = {k: frozenset(v) for k, v in (own() if own else {}).items()}
        if self._ws.slurm and self._ws.executor != "slurm":
            from rsi.executors.slurm import SlurmExecutor

            for k, v in SlurmExecutor(dict(self._ws.slurm)).capabilities().items():
                caps[k] = caps.get(k, frozenset()) | v
        return caps

    def __getattr__(self, name: str) -> Any:
        return getattr(self._executor, name)


class AfterWarmUp:
    """The executor, whose first action waits for the sandbox slot being started for it (then
    takes it) instead of starting a second one beside it."""

    def __init__(self, executor: Any, warming: threading.Thread) -> None:
        self._executor = executor
        self._warming: threading.Thread | None = warming

    def run(self, *args: Any, **kwargs: Any) -> Any:
        warming = self._warming
        if warming is not None:
            warming.join(timeout=60)  # NB: bounded: a slot that never starts is not waited on
            self._warming = None
        return self._executor.run(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._executor, name)


def warm_sandbox(executor: Any) -> Any:
    """In the background: sweep what killed builds left of the sandboxes, then start one
    persistent sandbox slot of the local executor, where it uses them (bwrap, a root host),
    for the first action to take instead of starting its own (tens of ms). Where the
    executor uses none, only the sweep runs (here); on any error, nothing more. The slot is
    the one every action of the default platform runs in; an unused one is closed at exit."""
    if not uses_slots(executor):
        clean_stale_sandboxes()
        return executor
    warming = threading.Thread(
        target=warm_slot, args=(executor,), name="rsi-warm-sandbox", daemon=True
    )
    warming.start()
    return AfterWarmUp(executor, warming)


def uses_slots(executor: Any) -> bool:
    return (
        getattr(executor, "name", "") == "local"
        and getattr(executor, "sandbox", "") == "bwrap"
        and bool(getattr(executor, "pool", False))
    )


def warm_slot(executor: Any) -> None:
    try:
        from rsi.executors.local import _pool_shape
        from rsi.executors.pool import POOL, pool_supported

        if pool_supported():
            shape = _pool_shape(executor.limits.for_action({}).scratch_bytes)
            slot = POOL.acquire(shape)
            POOL.release(shape, slot, True)
    except Exception:  # noqa: BLE001 - NB: a speed-up only; the executor starts its own
        pass
    # NB: after the slot, which the first action waits for; the sweep never takes a slot of
    # a live rsi (this one's included)
    try:
        clean_stale_sandboxes()
    except Exception:  # noqa: BLE001 - NB: best effort, as the build's own sweep is
        pass


def warm_in_background(ws: Workspace) -> threading.Thread:
    """`warm_sandbox`, the executor made on the background thread too: what the build does
    meanwhile (the state's checks, loading the graph) does not wait for its imports. The
    build makes its own executor later; the slot is the pool's, so it takes it all the same."""

    def work() -> None:
        try:
            executor = make_executor(ws.executor, ws)
        except Exception:  # noqa: BLE001 - NB: the build makes it again, and says what failed
            executor = None
        try:
            if executor is not None and uses_slots(executor):
                warm_slot(executor)
            else:
                try:
                    clean_stale_sandboxes()
                except Exception:  # noqa: BLE001 - NB: the build's own sweep is gone
                    pass
        finally:
            sys.setswitchinterval(interval)

    # NB: the slot's start is mostly waiting (bwrap, its runner's interpreter), but each step
    # of it in Python waits for the interpreter lock, which the build's own thread (importing,
    # checking) gives up only every switch interval (5 ms): shorter while the slot starts
    interval = sys.getswitchinterval()
    sys.setswitchinterval(min(interval, WARM_SWITCH_INTERVAL_S))
    warming = threading.Thread(target=work, name="rsi-warm-sandbox", daemon=True)
    warming.start()
    return warming


WARM_SWITCH_INTERVAL_S = 0.0005


def remote_cache(ws: Workspace):
    if not ws.remote:
        return None
    from rsi.remote import make_remote_cache  # type: ignore[import-not-found]

    return make_remote_cache(ws)


def clean_stale_sandboxes() -> None:
    """The memory cgroups and slot folders of killed builds: only a build that may run an
    action pays for importing the sandbox pool to look."""
    from rsi.executors.pool import remove_stale_slots

    remove_stale_slots()
