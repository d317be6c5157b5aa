"""Remote caching and execution over the Remote Execution API v2 (BuildGrid, Buildbarn,
BuildBuddy): the client, the rsi <-> REAPI mapping, and the cache and executor adapters the
scheduler calls. See docs/remote.md."""

from __future__ import annotations

from rsi.remote.cache import RemoteCache, RemoteSession
from rsi.remote.client import RemoteClient, ServerCapabilities
from rsi.remote.config import RemoteConfig
from rsi.remote.executor import RemoteExecutor, UnmetPlatform

__all__ = [
    "RemoteCache",
    "RemoteClient",
    "RemoteConfig",
    "RemoteExecutor",
    "RemoteSession",
    "ServerCapabilities",
    "UnmetPlatform",
]
