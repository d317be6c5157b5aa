"""The remote settings of a workspace: where the server is, what to use it for, what to do when it
fails. Read from `--remote …` flags or the workspace config's `[remote]` table. It must never guess
a setting: an unknown key is an error."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from rsi.errors import UsageError
from rsi.remote.client import RemoteEndpoint

MODES = ("cache", "execute")
FALLBACKS = ("fail", "local")


@dataclass(frozen=True)
class RemoteConfig:
    """`mode`: 'cache' (remote cache, local execution) or 'execute' (remote execution, which
    implies the remote cache). `fallback`: 'fail' stops the build when the server is
    unreachable or failing; 'local' warns in the event stream and goes on locally."""

    url: str
    mode: str = "cache"
    fallback: str = "fail"
    upload: bool = True
    rpc_timeout_s: float = 30.0
    connect_timeout_s: float = 5.0
    queue_timeout_s: float = 300.0
    # NB: added to an action's own timeout: the time to fetch inputs and upload outputs.
    execution_margin_s: float = 120.0

    def __post_init__(self) -> None:
        RemoteEndpoint.parse(self.url)
        if self.mode not in MODES:
            raise UsageError(f"remote mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.fallback not in FALLBACKS:
            raise UsageError(
                f"remote fallback {self.fallback!r} is not one of {', '.join(FALLBACKS)}"
            )
        for name in ("rpc_timeout_s", "connect_timeout_s", "queue_timeout_s"):
            if getattr(self, name) <= 0:
                raise UsageError(f"remote {name.removesuffix('_s')} must be positive")

    @classmethod
    def from_mapping(cls, doc: Mapping[str, Any], **overrides: Any) -> RemoteConfig:
        """From the workspace config's `[remote]` table (keys as below, `-` or `_`), with
        command-line values in `overrides` winning."""
        known = {
            "url",
            "mode",
            "fallback",
            "upload",
            "rpc_timeout_s",
            "connect_timeout_s",
            "queue_timeout_s",
            "execution_margin_s",
        }
        values: dict[str, Any] = {}
        for key, value in doc.items():
            name = key.replace("-", "_")
            if name not in known:
                raise UsageError(
                    f"unknown key {key!r} in the [remote] table",
                    hint=f"known keys: {', '.join(sorted(known))}",
                )
            values[name] = value
        values.update({k: v for k, v in overrides.items() if v is not None})
        if "url" not in values:
            raise UsageError('the [remote] table needs url = "grpc://HOST:PORT"')
        return cls(**values)

    def with_(self, **changes: Any) -> RemoteConfig:
        return replace(self, **changes)
