"""The remote cache against a real BuildGrid: digest function negotiation, sharing evidence
between two workspaces, verified downloads, guarded uploads, and a server that goes away."""

from __future__ import annotations

import pytest
from remote_helpers import build, command, make_workspace

from rsi.action import Action, ActionResult
from rsi.digest import FileNode, digest_bytes
from rsi.errors import RemoteError
from rsi.executors.local import LocalExecutor
from rsi.remote import RemoteCache, RemoteConfig, RemoteSession
from rsi.remote.client import DigestFunctionMismatch, RemoteClient
from rsi.store import LocalStore

pytestmark = pytest.mark.e2e


def _diamond(url: str) -> dict:
    return {
        "in/a.txt": "alpha\n",
        "BUILD.toml": command(
            "up", cmd="tr a-z A-Z < $(SRCS) > $(OUT)", srcs=["in/a.txt"], outs=["a.out"]
        )
        + command(
            "top",
            cmd="cat $(location :up) $(location :up) > $(OUT)",
            deps=[":up"],
            outs=["top.out"],
        ),
    }


def _config(url: str, extra: str = "") -> str:
    return f'[workspace]\ndigest_function = "sha256"\nremote = "{url}"\n{extra}'


def _action(
    store: LocalStore,
    text: bytes = b"hello\n",
    cmd: str = "cat in.txt > out.txt",
    outputs: tuple[str, ...] = ("out.txt",),
) -> Action:
    node = FileNode(store.put_bytes(text))
    return Action(
        argv=("sh", "-c", cmd),
        inputs=(("in.txt", node),),
        outputs=outputs,
        digest_function=store.function,
        label="//t:x",
    )


def _session(url: str, store: LocalStore, events: list | None = None, **kw) -> RemoteSession:
    return RemoteSession(
        RemoteConfig(url, **kw), store, (events if events is not None else []).append
    )


def test_buildgrid_capabilities_choose_sha256(cache_server):
    with RemoteClient(cache_server.url) as client:
        caps = client.capabilities()
        assert caps.digest_functions == ("sha256",)
        assert client.digest_function == "sha256"
        assert caps.max_batch_total_size_bytes > 0


def test_workspace_without_a_digest_function_adopts_the_remotes_sha256(cache_server, tmp_path):
    files = {
        "in/a.txt": "negotiated\n",
        "BUILD.toml": command(
            "only", cmd="cat $(SRCS) > $(OUT)", srcs=["in/a.txt"], outs=["only.out"]
        ),
    }
    ws = make_workspace(tmp_path, files, config=f'[workspace]\nremote = "{cache_server.url}"\n')
    run = build(ws, "//:only")
    assert run.executed == {"//:only"}
    meta = (ws / "cache" / "STORE.json").read_text()
    assert '"sha256"' in meta


def test_blake3_workspace_against_sha256_remote_is_a_clear_error(cache_server, tmp_path):
    ws = make_workspace(
        tmp_path,
        _diamond(cache_server.url),
        config=f'[workspace]\ndigest_function = "blake3"\nremote = "{cache_server.url}"\n',
    )
    run = build(ws, "//:top", expect=None)
    assert run.returncode != 0
    assert "hashes with blake3" in run.stderr and "offers only sha256" in run.stderr
    assert "digest_function = sha256" in run.stderr
    with pytest.raises(DigestFunctionMismatch):
        _session(cache_server.url, LocalStore(tmp_path / "b3")).check()


def test_second_workspace_builds_from_the_remote_cache_with_zero_actions(cache_server, tmp_path):
    files = _diamond(cache_server.url)
    first = make_workspace(tmp_path, files, config=_config(cache_server.url), name="first")
    second = make_workspace(tmp_path, files, config=_config(cache_server.url), name="second")
    assert build(first, "//:top").executed == {"//:up", "//:top"}
    run = build(second, "//:top")
    assert run.executed == set()
    assert {e["label"]: e["cache"] for e in run.finished()} == {
        "//:up": "remote_hit",
        "//:top": "remote_hit",
    }
    assert (second / "out" / "top.out").read_text() == "ALPHA\nALPHA\n"


def test_large_blobs_round_trip_through_bytestream(cache_server, tmp_path):
    big = bytes(range(256)) * (6 * 4096 + 7)  # above BuildGrid's 4 MiB batch limit
    digest = digest_bytes(big, "sha256")
    with RemoteClient(cache_server.url) as client:
        assert digest.size > client.capabilities().max_batch_total_size_bytes
        client.upload_missing({digest: big})
        store = LocalStore(tmp_path / "s", "sha256")
        assert client.download_to_store([digest], store) == set()
        assert store.read_bytes(digest) == big


def test_failed_action_is_never_uploaded(cache_server, tmp_path):
    store = LocalStore(tmp_path / "s", "sha256")
    events: list = []
    cache = RemoteCache(_session(cache_server.url, store, events))
    action = _action(store, cmd="echo boom >&2; exit 3")
    result = LocalExecutor().run(action, store)
    assert result.exit_code == 3
    assert cache.put(action, result, store) is False
    assert cache.get(action, store) is None
    assert events[0]["event"] == "remote.upload_skipped"


def test_output_that_fails_verification_is_not_uploaded(cache_server, tmp_path):
    store = LocalStore(tmp_path / "s", "sha256")
    cache = RemoteCache(_session(cache_server.url, store))
    action = _action(store, text=b"verify me\n")
    result = LocalExecutor().run(action, store)
    blob = store.blob_path(result.outputs[0].digest)
    blob.chmod(0o644)
    blob.write_bytes(b"tampered!\n")
    assert cache.put(action, result, store) is False
    assert cache.get(action, LocalStore(tmp_path / "other", "sha256")) is None


class _CorruptingCas:
    """Wraps the CAS stub so BatchReadBlobs answers with flipped bytes (a corrupt remote)."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def BatchReadBlobs(self, request, timeout=None):
        reply = self._inner.BatchReadBlobs(request, timeout=timeout)
        for response in reply.responses:
            if response.data:
                response.data = bytes([response.data[0] ^ 0xFF]) + response.data[1:]
        return reply


def test_mismatching_remote_blob_is_rejected_and_the_action_rebuilt(cache_server, tmp_path):
    producer = LocalStore(tmp_path / "p", "sha256")
    action = _action(producer, text=b"corrupt me on the way back\n")
    result = LocalExecutor().run(action, producer)
    assert RemoteCache(_session(cache_server.url, producer)).put(action, result, producer)

    consumer = LocalStore(tmp_path / "c", "sha256")
    events: list = []
    session = _session(cache_server.url, consumer, events)
    session.client._cas = _CorruptingCas(session.client._cas)
    assert RemoteCache(session).get(action, consumer) is None
    assert [e["event"] for e in events] == ["remote.blob_rejected"]
    assert not consumer.has(result.outputs[0].digest)
    assert list(consumer.tmp.iterdir()) == []


def test_unreachable_server_fails_with_a_clear_message(tmp_path):
    store = LocalStore(tmp_path / "s", "sha256")
    session = _session("grpc://127.0.0.1:9", store, connect_timeout_s=1)
    with pytest.raises(RemoteError, match="grpc://127.0.0.1:9 is unreachable"):
        session.check()


def test_unreachable_server_with_fallback_builds_locally_and_warns(tmp_path):
    ws = make_workspace(
        tmp_path, _diamond(""), config=_config("grpc://127.0.0.1:9", "remote_fallback = true\n")
    )
    run = build(ws, "//:top")
    assert run.executed == {"//:up", "//:top"}
    warnings = [e for e in run.events if e["kind"] in ("warning", "remote.warning")]
    assert warnings and "unreachable" in str(warnings[0])


def test_server_dying_mid_build_leaves_nothing_half_written(tmp_path):
    import servers

    store = LocalStore(tmp_path / "s", "sha256")
    with servers.BuildGridServer("cache") as server:
        producer = LocalStore(tmp_path / "p", "sha256")
        action = _action(producer, text=b"x" * (5 << 20))
        action = Action(
            argv=("sh", "-c", "cat in.txt > out.txt"),
            inputs=action.inputs,
            outputs=("out.txt",),
            digest_function="sha256",
        )
        result = LocalExecutor().run(action, producer)
        assert RemoteCache(_session(server.url, producer)).put(action, result, producer)
        events: list = []
        cache = RemoteCache(_session(server.url, store, events, fallback="local", rpc_timeout_s=5))
        cache.session.check()
    # the server is gone now
    assert cache.get(action, store) is None
    assert events and events[-1]["event"] == "remote.warning"
    assert "unreachable" in events[-1]["message"] or "did not answer" in events[-1]["message"]
    assert list(store.tmp.iterdir()) == []
    assert all(
        store.has_verified(type(d)(h, p.stat().st_size))
        for h, p in store.iter_blobs()
        for d in [result.outputs[0].digest]
    )


def test_result_metadata_survives_the_round_trip(cache_server, tmp_path):
    producer = LocalStore(tmp_path / "p", "sha256")
    action = _action(producer, text=b"meta\n")
    result: ActionResult = LocalExecutor().run(action, producer)
    assert RemoteCache(_session(cache_server.url, producer)).put(action, result, producer)
    consumer = LocalStore(tmp_path / "c", "sha256")
    got = RemoteCache(_session(cache_server.url, consumer)).get(action, consumer)
    assert got is not None
    assert got.outputs == result.outputs and got.stdout == result.stdout
    assert got.host == result.host and got.executor == result.executor
    assert got.timing["remote"] == "remote-cache"
