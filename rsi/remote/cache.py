"""The remote cache as the scheduler sees it: `get(action)` before running, `put(action, result)`
after a success. Downloads land in the local store verified; a result is uploaded only when it
succeeded and every output still hashes to its digest. It must never upload a failed result or an
output that no longer hashes to its digest.

Events (dicts passed to `emit`, JSON-ready): remote.cache_hit, remote.cache_miss,
remote.upload, remote.upload_skipped, remote.blob_rejected, remote.warning (fallback taken).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from rsi.action import Action, ActionResult
from rsi.digest import Digest
from rsi.errors import RemoteError, StoreError
from rsi.remote.client import BlobMismatch, RemoteClient
from rsi.remote.config import RemoteConfig
from rsi.remote.mapping import (
    RemoteResultView,
    from_remote_result,
    to_remote_action,
    to_remote_result,
)
from rsi.store import LocalStore

Emit = Callable[[dict[str, Any]], None]


def _no_emit(event: dict[str, Any]) -> None:
    pass


class RemoteSession:
    """One build's connection to the remote: the client, the settings, the event sink and
    the 'server is down' latch that makes a fallback build stop asking after one failure."""

    def __init__(
        self,
        config: RemoteConfig,
        store: LocalStore,
        emit: Emit | None = None,
        client: RemoteClient | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.emit = emit or _no_emit
        self.client = client or RemoteClient(
            config.url,
            rpc_timeout_s=config.rpc_timeout_s,
            connect_timeout_s=config.connect_timeout_s,
            digest_function=store.function,
        )
        self.down: str | None = None
        self.startup_error: RemoteError | None = None
        self._lock = threading.Lock()

    def check(self) -> str:
        """Connect, read Capabilities and agree on the digest function (the store's; an error
        naming both when the server does not offer it). Returns the function."""
        function = self.client.digest_function
        if self.config.mode == "execute":
            caps = self.client.capabilities()
            if not caps.exec_enabled:
                raise RemoteError(
                    f"remote {self.config.url} offers no remote execution",
                    hint="use --remote-mode cache with this server, or one with execution on",
                )
        return function

    def raise_startup_error(self) -> None:
        """A server found down when the build started fails (or falls back) on first use."""
        exc, self.startup_error = self.startup_error, None
        if exc is not None:
            raise exc

    def failed(self, exc: RemoteError, doing: str) -> None:
        """A remote call failed: raise it (fallback = fail) or warn once and latch."""
        if self.config.fallback != "local":
            raise exc
        with self._lock:
            first = self.down is None
            if first:
                self.down = str(exc)
        if first:
            self.emit(
                {
                    "event": "remote.warning",
                    "severity": "warning",
                    "remote": self.config.url,
                    "while": doing,
                    "message": f"{exc}; continuing locally (remote fallback = local)",
                }
            )

    def close(self) -> None:
        self.client.close()


class RemoteCache:
    def __init__(self, session: RemoteSession) -> None:
        self.session = session

    @property
    def client(self) -> RemoteClient:
        return self.session.client

    def get(self, action: Action, store: LocalStore | None = None) -> ActionResult | None:
        """The remote result for `action` with its blobs now in the local store, or None
        (a miss, an incomplete or failed entry, a rejected blob, or the server down with
        fallback = local)."""
        session = self.session
        store = store or session.store
        if session.down is not None:
            return None
        session.raise_startup_error()
        remote = to_remote_action(action)
        try:
            proto = self.client.get_action_result(remote.digest)
            if proto is None:
                session.emit(self._event("remote.cache_miss", action, remote.digest))
                return None
            view = from_remote_result(proto, store.function, source="remote-cache")
            if not self._usable(action, view, remote.digest):
                return None
            return self._fetch(action, view, remote.digest, store)
        except BlobMismatch as exc:
            session.emit(
                {
                    **self._event("remote.blob_rejected", action, remote.digest),
                    "severity": "warning",
                    "message": str(exc),
                }
            )
            return None
        except RemoteError as exc:
            session.failed(exc, f"looking up {action.label or remote.digest}")
            return None

    def _usable(self, action: Action, view: RemoteResultView, digest: Digest) -> bool:
        result = view.result
        declared = set(action.outputs)
        got = {o.path for o in result.outputs}
        if not result.ok or got != declared:
            reason = (
                f"exit code {result.exit_code}"
                if result.exit_code != 0
                else f"outputs {sorted(got)} instead of {sorted(declared)}"
            )
            self.session.emit(
                {**self._event("remote.cache_miss", action, digest), "reason": reason}
            )
            return False
        return True

    def _fetch(
        self, action: Action, view: RemoteResultView, digest: Digest, store: LocalStore
    ) -> ActionResult | None:
        result = view.result
        for name, data in view.inline.items():
            stored = store.put_bytes(data)
            if stored != getattr(result, name):
                raise BlobMismatch(f"inline {name} stored as {stored}")
        absent = self.client.download_to_store(result.blobs(), store)
        if absent:
            self.session.emit(
                {
                    **self._event("remote.cache_miss", action, digest),
                    "reason": f"{len(absent)} blob(s) of the cached result are gone from the CAS",
                }
            )
            return None
        self.session.emit(
            {
                **self._event("remote.cache_hit", action, digest),
                "source": "remote-cache",
                "outputs": len(result.outputs),
            }
        )
        return result

    def put(self, action: Action, result: ActionResult, store: LocalStore | None = None) -> bool:
        """Upload a successful result whose outputs verify; True when it was uploaded."""
        session = self.session
        store = store or session.store
        if session.down is not None or not session.config.upload:
            return False
        session.raise_startup_error()
        remote = to_remote_action(action)
        if not result.ok:
            session.emit(
                {
                    **self._event("remote.upload_skipped", action, remote.digest),
                    "reason": "the action did not succeed",
                }
            )
            return False
        bad = [str(o.digest) for o in result.outputs if not store.has_verified(o.digest)]
        bad += [
            str(d) for d in (result.stdout, result.stderr) if d is not None and not store.has(d)
        ]
        if bad:
            session.emit(
                {
                    **self._event("remote.upload_skipped", action, remote.digest),
                    "reason": f"output(s) failed verification: {', '.join(bad)}",
                }
            )
            return False
        blobs: dict[Digest, Any] = dict(remote.blobs)
        for digest in result.blobs():
            blobs[digest] = store.blob_path(digest)
        try:
            sent = self.client.upload_missing(blobs)
            self.client.update_action_result(remote.digest, to_remote_result(result))
        except (RemoteError, StoreError) as exc:
            if isinstance(exc, RemoteError):
                session.failed(exc, f"uploading {action.label or remote.digest}")
                return False
            raise
        session.emit({**self._event("remote.upload", action, remote.digest), "bytes": sent})
        return True

    @staticmethod
    def _event(kind: str, action: Action, digest: Digest) -> dict[str, Any]:
        return {
            "event": kind,
            "label": action.label,
            "mnemonic": action.mnemonic,
            "action_key": str(action.key()),
            "remote_action": str(digest),
        }
