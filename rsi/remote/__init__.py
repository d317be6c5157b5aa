"""Remote caching and execution over the Remote Execution API v2 (BuildGrid, Buildbarn, BuildBuddy):
the client, the rsi <-> REAPI mapping, and the cache and executor adapters the scheduler calls. See
docs/remote.md. It must never trust a downloaded blob before it verifies.

Entry points for the engine: `make_remote_cache(ws)`, `make_remote_executor(ws)`,
`negotiate_digest_function(url)` and `bind_events(adapter, events)`.
"""

from __future__ import annotations

import os

# NB: gRPC's fork handlers print noise into, and can break, the sandboxes rsi forks after a
# remote call; rsi never uses gRPC in a forked child.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from typing import Any

from rsi.errors import RemoteError
from rsi.remote.cache import RemoteCache, RemoteSession
from rsi.remote.client import DigestFunctionMismatch, RemoteClient, ServerCapabilities
from rsi.remote.config import RemoteConfig
from rsi.remote.executor import RemoteExecutor, UnmetPlatform

__all__ = [
    "DigestFunctionMismatch",
    "RemoteCache",
    "RemoteClient",
    "RemoteConfig",
    "RemoteExecutor",
    "RemoteSession",
    "ServerCapabilities",
    "UnmetPlatform",
    "bind_events",
    "make_remote_cache",
    "make_remote_executor",
    "negotiate_digest_function",
]


def negotiate_digest_function(url: str, timeout_s: float = 5.0) -> str:
    """The function a workspace without an explicit `digest_function` should use with this
    remote: BLAKE3 where offered, otherwise SHA-256."""
    with RemoteClient(url, connect_timeout_s=timeout_s, rpc_timeout_s=timeout_s) as client:
        return client.capabilities().choose_digest_function()


def _session(ws: Any, *, fallback: str) -> RemoteSession:
    from rsi.runtime import open_store

    config = RemoteConfig(url=ws.remote, mode=ws.remote_mode, fallback=fallback)
    session = RemoteSession(config, open_store(ws))
    try:
        session.check()
    except DigestFunctionMismatch:
        raise
    except RemoteError as exc:
        if not ws.remote_fallback:
            raise
        # NB: raised again from the first call, where the scheduler (or the executor's own
        # fallback) turns it into a warning event and goes on locally.
        session.startup_error = exc
    return session


def make_remote_cache(ws: Any) -> RemoteCache:
    """The scheduler's remote cache for a workspace. Errors propagate (the scheduler applies
    `remote_fallback`), except that a server down at start with fallback on yields a cache
    that always misses and warns once."""
    return RemoteCache(_session(ws, fallback="fail"))


def make_remote_executor(ws: Any) -> RemoteExecutor:
    """`--executor remote`: runs actions on the workspace's remote; with `remote_fallback`,
    on the local executor when the server is down or failing (with a warning event)."""
    session = _session(ws, fallback="local" if ws.remote_fallback else "fail")
    fallback = None
    if ws.remote_fallback:
        from rsi.runtime import make_local_executor

        fallback = make_local_executor("local", ws)
    return RemoteExecutor(session, fallback=fallback)


def bind_events(
    adapter: RemoteCache | RemoteExecutor, events: Any, parent: int | None = None
) -> None:
    """Send the adapter's events (`remote.*`) into a build's EventLog."""

    def emit(event: dict) -> None:
        fields = dict(event)
        kind = fields.pop("event")
        events.emit(kind, parent, **fields)

    adapter.session.emit = emit
