"""The remote executor: runs an action on a REAPI execution service and brings its outputs into the
local store, verified. Same interface as the local executors. It must never put an unverified output
into the local store.

A job that no worker takes fails at its queue deadline with a message naming the platform
properties it waits for; a server that is down or failing either fails the action or, with
fallback = local, warns in the event stream and runs it on the fallback executor.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from rsi.action import Action, ActionResult
from rsi.errors import ExecutionError, RemoteError
from rsi.executors.base import uncached_exit
from rsi.remote.cache import RemoteCache, RemoteSession
from rsi.remote.client import BlobMismatch, QueueTimeout, status_text
from rsi.remote.mapping import ACCELERATOR, CONTAINER_IMAGE, from_remote_result, to_remote_action
from rsi.store import LocalStore


class UnmetPlatform(ExecutionError):
    """No worker in the pool offers what the action's platform asks for."""


class RemoteExecutor:
    name = "remote"

    def __init__(self, session: RemoteSession, fallback: Any | None = None) -> None:
        self.session = session
        self.fallback = fallback
        self.cache = RemoteCache(session)

    def run(
        self, action: Action, store: LocalStore, cancel: threading.Event | None = None
    ) -> ActionResult:
        session = self.session
        if session.down is not None and self.fallback is not None:
            return self.fallback.run(action, store, cancel)
        try:
            session.raise_startup_error()
            return self._run_remote(action, store, cancel)
        except (QueueTimeout, UnmetPlatform):
            raise
        except BlobMismatch as exc:
            session.emit(
                {
                    "event": "remote.blob_rejected",
                    "severity": "warning",
                    "label": action.label,
                    "message": str(exc),
                }
            )
            if self.fallback is None:
                raise
            return self.fallback.run(action, store, cancel)
        except RemoteError as exc:
            if self.fallback is None:
                raise
            session.failed(exc, f"executing {action.label or action.key()}")
            return self.fallback.run(action, store, cancel)

    def _run_remote(
        self, action: Action, store: LocalStore, cancel: threading.Event | None
    ) -> ActionResult:
        session, client = self.session, self.session.client
        remote = to_remote_action(action)
        blobs: dict[Any, Any] = dict(remote.blobs)
        for digest in remote.input_files:
            blobs[digest] = store.blob_path(digest)
        t0 = time.perf_counter()
        sent = client.upload_missing(blobs)
        stages: list[str] = []

        def on_stage(stage: str) -> None:
            stages.append(stage)
            session.emit(
                {
                    "event": "remote.stage",
                    "label": action.label,
                    "stage": stage,
                    "remote_action": str(remote.digest),
                }
            )

        uncached = uncached_exit(action)

        def execute(skip_cache_lookup: bool = False):
            return client.execute(
                remote.digest,
                queue_timeout_s=session.config.queue_timeout_s,
                execution_timeout_s=action.timeout_s + session.config.execution_margin_s,
                skip_cache_lookup=skip_cache_lookup,
                cancel=cancel,
                on_stage=on_stage,
            )

        try:
            response = execute()
            if (
                uncached is not None
                and response.cached_result
                and response.status.code == 0
                and response.result.exit_code == uncached
            ):
                # NB: a server that caches failures served a result its action said must never
                # be served again (a measurement on a busy host): run it again, past the cache
                session.emit(
                    {
                        "event": "remote.uncached_result_served",
                        "severity": "warning",
                        "label": action.label,
                        "remote_action": str(remote.digest),
                        "message": f"the server served a cached exit {uncached}, which the "
                        "action declares uncacheable; executing it again (skip_cache_lookup)",
                    }
                )
                response = execute(skip_cache_lookup=True)
        except QueueTimeout as exc:
            raise UnmetPlatform(
                f"{action.label or 'action'}: {exc}; it needs platform "
                f"{_props(remote.platform)} and no worker offers {_unmet(remote.platform)}",
                hint="start `rsi worker` on a machine that offers it (--property KEY=VALUE), "
                "or drop the requirement from the target",
            ) from None
        if response.status.code != 0:
            raise RemoteError(
                f"remote execution of {action.label or remote.digest} failed: "
                f"{status_text(response.status)}"
            )
        view = from_remote_result(
            response.result,
            store.function,
            source="remote-cache" if response.cached_result else "remote-execution",
        )
        for data in view.inline.values():
            store.put_bytes(data)
        absent = client.download_to_store(view.result.blobs(), store)
        if absent:
            raise RemoteError(
                f"remote execution of {action.label or remote.digest} reported outputs the "
                f"CAS does not hold: {', '.join(map(str, sorted(absent)))}"
            )
        result = view.result
        timing = dict(result.timing)
        timing["remote_round_trip_s"] = round(time.perf_counter() - t0, 6)
        timing["uploaded_bytes"] = sent
        session.emit(
            {
                "event": "remote.executed",
                "label": action.label,
                "remote_action": str(remote.digest),
                "cached": bool(response.cached_result),
                "source": timing.get("remote"),
                "exit_code": result.exit_code,
            }
        )
        exit_code, host, cacheable = result.exit_code, dict(result.host), True
        if (
            uncached is not None
            and exit_code == uncached
            and not result.timed_out
            and not result.failure
        ):
            # NB: as the local executor does: good outputs made under a transient condition,
            # used by this build and never cached (the scheduler uploads nothing for it)
            exit_code, cacheable = 0, False
            host["uncached_exit"] = uncached
        return ActionResult(
            exit_code=exit_code,
            outputs=result.outputs,
            stdout=result.stdout,
            stderr=result.stderr,
            timed_out=result.timed_out,
            failure=result.failure,
            executor=f"remote:{result.executor}",
            host=host,
            timing=timing,
            cacheable=cacheable,
        )


def _props(platform: tuple[tuple[str, str], ...]) -> str:
    return ", ".join(f"{k}={v}" for k, v in platform) or "(none)"


def _unmet(platform: tuple[tuple[str, str], ...]) -> str:
    """The properties most likely unmet: accelerators first, else all but the wildcard image."""
    accel = [(k, v) for k, v in platform if k.startswith(ACCELERATOR)]
    return _props(
        tuple(accel) if accel else tuple((k, v) for k, v in platform if k != CONTAINER_IMAGE)
    )
