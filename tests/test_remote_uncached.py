"""A server that caches failures (BuildGrid with `cache-failed-actions: true`, the default of
its LRU cache) may serve an exit that its action declared uncacheable: the remote executor
must not take that as this build's answer, but execute the action again past the cache. The
real-server path (nothing cached at all) is tests/remote/test_remote_execution.py; the
server's cache policy is the one thing a double stands in for here."""

from __future__ import annotations

import pytest

from rsi.action import Action, ActionResult
from rsi.digest import FileNode
from rsi.remote.executor import RemoteExecutor
from rsi.remote.mapping import to_remote_result
from rsi.store import LocalStore

pytestmark = pytest.mark.fast


class _Config:
    queue_timeout_s = 5.0
    execution_margin_s = 5.0


class _Client:
    """Answers Execute as a failure-caching server would: the first ask from its cache."""

    def __init__(self, store: LocalStore, out) -> None:
        self.calls: list[bool] = []
        self.store, self.out = store, out

    def upload_missing(self, blobs) -> int:
        return 0

    def execute(self, digest, *, skip_cache_lookup=False, **_):
        from rsi.remote._proto.build.bazel.remote.execution.v2 import (
            remote_execution_pb2 as re_pb2,
        )

        self.calls.append(skip_cache_lookup)
        stored = ActionResult(exit_code=75, outputs=(self.out,), executor="local")
        return re_pb2.ExecuteResponse(
            result=to_remote_result(stored), cached_result=not skip_cache_lookup
        )

    def download_to_store(self, digests, store) -> set:
        return set()


class _Session:
    down = None
    config = _Config()

    def __init__(self, client) -> None:
        self.client, self.events = client, []

    def raise_startup_error(self) -> None:
        return None

    def emit(self, event: dict) -> None:
        self.events.append(event)


def _run(tmp_path, env):
    from rsi.action import OutputFile

    store = LocalStore(tmp_path / "s", "sha256")
    out = OutputFile("m.txt", store.put_bytes(b"measured\n"), False)
    client = _Client(store, out)
    session = _Session(client)
    executor = RemoteExecutor.__new__(RemoteExecutor)
    executor.session, executor.fallback = session, None
    action = Action(
        argv=("sh", "-c", "exit 75"),
        inputs=(("in.txt", FileNode(store.put_bytes(b"x"))),),
        outputs=("m.txt",),
        env=env,
        digest_function="sha256",
        label="//r:busy",
    )
    return executor.run(action, store), client, session


def test_a_cached_uncacheable_exit_is_executed_again_past_the_cache(tmp_path):
    result, client, session = _run(tmp_path, (("RSI_UNCACHED_EXIT", "75"),))
    assert client.calls == [False, True]  # NB: the cached answer, then skip_cache_lookup
    warned = [e for e in session.events if e["event"] == "remote.uncached_result_served"]
    assert len(warned) == 1 and warned[0]["severity"] == "warning"
    assert result.ok and result.cacheable is False and result.host["uncached_exit"] == 75


def test_without_the_opt_in_a_cached_exit_75_is_a_failure_asked_once(tmp_path):
    result, client, session = _run(tmp_path, ())
    assert client.calls == [False]
    assert not [e for e in session.events if e["event"] == "remote.uncached_result_served"]
    assert not result.ok and result.exit_code == 75 and result.cacheable
