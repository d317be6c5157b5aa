"""Remote execution against a real BuildGrid with PostgreSQL and an in-process `rsi worker`:
a command action and a check action end to end, a job no worker can take failing at its
deadline with the unmet property named, and a local fallback when the server is down."""

from __future__ import annotations

import json
import time

import pytest
from remote_helpers import build, command, make_workspace

from rsi.action import Action
from rsi.digest import FileNode
from rsi.executors.local import LocalExecutor, host_python_identity
from rsi.remote import RemoteConfig, RemoteExecutor, RemoteSession, UnmetPlatform
from rsi.remote.mapping import to_remote_action
from rsi.store import LocalStore

pytestmark = pytest.mark.e2e

CHECK = b"""
import json, sys
got = open("candidate/out.txt").read().split()
want = open("oracle/expected.txt").read().split()
ok = got == want
json.dump({"verdict": "PASS" if ok else "FAIL", "compared": len(want)}, open("verdict.json", "w"))
print("checked", len(want), "values")
"""


def _executor(url: str, store: LocalStore, events: list, **kw) -> RemoteExecutor:
    config = RemoteConfig(url, mode="execute", **kw)
    return RemoteExecutor(RemoteSession(config, store, events.append))


def test_command_action_runs_on_a_worker(exec_server, worker, tmp_path):
    store = LocalStore(tmp_path / "s", "sha256")
    events: list = []
    node = FileNode(store.put_bytes(b"remote input\n"))
    action = Action(
        argv=("sh", "-c", "tr a-z A-Z < in.txt > out/up.txt; echo ran"),
        inputs=(("in.txt", node),),
        outputs=("out/up.txt",),
        platform=(("toolchain", "host"),),
        digest_function="sha256",
        label="//r:cmd",
    )
    result = _executor(exec_server.url, store, events, queue_timeout_s=30).run(action, store)
    assert result.ok, result
    assert store.read_bytes(result.outputs[0].digest) == b"REMOTE INPUT\n"
    assert store.read_bytes(result.stdout) == b"ran\n"
    assert result.executor == "remote:local" and result.timing["remote"] == "remote-execution"
    assert "EXECUTING" in [e.get("stage") for e in events]
    assert any(e["event"] == "worker.lease" and e["exit_code"] == 0 for e in worker.events)


def test_check_action_runs_on_a_worker_with_the_host_python_toolchain(
    exec_server, worker, tmp_path
):
    store = LocalStore(tmp_path / "s", "sha256")
    inputs = (
        ("check.py", FileNode(store.put_bytes(CHECK))),
        ("candidate/out.txt", FileNode(store.put_bytes(b"1 2 3\n"))),
        ("oracle/expected.txt", FileNode(store.put_bytes(b"1 2 3\n"))),
    )
    action = Action(
        argv=("python3", "check.py"),
        inputs=inputs,
        outputs=("verdict.json",),
        platform=(("toolchain", host_python_identity()),),
        digest_function="sha256",
        label="//r:check",
    )
    result = _executor(exec_server.url, store, [], queue_timeout_s=30).run(action, store)
    assert result.ok, store.read_bytes(result.stderr)
    verdict = json.loads(store.read_bytes(result.outputs[0].digest))
    assert verdict == {"verdict": "PASS", "compared": 3}


def test_job_needing_an_accelerator_nobody_offers_fails_at_its_deadline(
    exec_server, worker, tmp_path
):
    store = LocalStore(tmp_path / "s", "sha256")
    action = Action(
        argv=("true",),
        platform=(("accelerator", "nvidia-b300"),),
        digest_function="sha256",
        label="//r:gpu",
    )
    executor = _executor(exec_server.url, store, [], queue_timeout_s=3)
    t0 = time.monotonic()
    with pytest.raises(UnmetPlatform) as caught:
        executor.run(action, store)
    assert time.monotonic() - t0 < 15
    message = str(caught.value)
    assert "accelerator=nvidia-b300" in message and "no worker" in message


def test_unregistered_platform_property_is_refused_with_the_servers_reason(
    exec_server, worker, tmp_path
):
    from rsi.errors import RemoteError

    store = LocalStore(tmp_path / "s", "sha256")
    action = Action(argv=("true",), platform=(("colour", "green"),), digest_function="sha256")
    with pytest.raises(RemoteError, match="colour"):
        _executor(exec_server.url, store, [], queue_timeout_s=5).run(action, store)


def test_server_down_with_fallback_runs_locally_and_warns(tmp_path):
    store = LocalStore(tmp_path / "s", "sha256")
    events: list = []
    config = RemoteConfig(
        "grpc://127.0.0.1:9", mode="execute", fallback="local", connect_timeout_s=1
    )
    executor = RemoteExecutor(RemoteSession(config, store, events.append), fallback=LocalExecutor())
    action = Action(
        argv=("sh", "-c", "echo local > o.txt"), outputs=("o.txt",), digest_function="sha256"
    )
    result = executor.run(action, store)
    assert result.ok and result.executor == "local"
    assert events[0]["event"] == "remote.warning" and "unreachable" in events[0]["message"]


def test_cli_build_with_remote_executor_runs_on_the_worker(exec_server, worker, tmp_path):
    ws = make_workspace(
        tmp_path,
        {
            "in/a.txt": "alpha\n",
            "BUILD.toml": command(
                "up", cmd="tr a-z A-Z < $(SRCS) > $(OUT)", srcs=["in/a.txt"], outs=["a.out"]
            ),
        },
        config=(
            f'[workspace]\ndigest_function = "sha256"\nremote = "{exec_server.url}"\n'
            'remote_mode = "execute"\nexecutor = "remote"\n'
        ),
    )
    before = len(worker.events)
    run = build(ws, "//:up")
    assert run.executed == {"//:up"}
    assert (ws / "out" / "a.out").read_text() == "ALPHA\n"
    assert any(e["event"] == "worker.lease" for e in worker.events[before:])


def test_an_uncached_exit_runs_remotely_every_time_and_is_never_cached(
    exec_server, worker, tmp_path
):
    """An action that declares RSI_UNCACHED_EXIT=75 and exits 75 (a measurement on a busy
    host) is a success for its build on a worker too, and nothing caches it: the worker sends
    the server exit 75 (BuildGrid keeps no failures), the client maps it back to a success
    marked uncacheable, and asking again executes it again. The same exit without the opt-in
    is a failure."""
    store = LocalStore(tmp_path / "s", "sha256")
    events: list = []
    nonce = str(time.time_ns()).encode()  # NB: a fresh action digest for this session's server

    def action(env: tuple) -> Action:
        return Action(
            argv=("sh", "-c", "cat in.txt > out/m.txt; echo measured >> out/m.txt; exit 75"),
            inputs=(("in.txt", FileNode(store.put_bytes(nonce))),),
            outputs=("out/m.txt",),
            env=env,
            platform=(("toolchain", "host"),),
            digest_function="sha256",
            label="//r:busy",
        )

    busy = action((("RSI_UNCACHED_EXIT", "75"),))
    executor = _executor(exec_server.url, store, events, queue_timeout_s=30)
    leases = len(worker.events)
    for round_ in range(2):
        result = executor.run(busy, store)
        assert result.ok and result.exit_code == 0, result
        assert result.cacheable is False and result.host["uncached_exit"] == 75
        assert store.read_bytes(result.outputs[0].digest) == nonce + b"measured\n"
        assert result.timing["remote"] == "remote-execution", round_  # NB: never the cache
    assert len(worker.events) - leases == 2
    session = executor.session
    assert session.client.get_action_result(to_remote_action(busy).digest) is None
    plain = executor.run(action(()), store)
    assert not plain.ok and plain.exit_code == 75 and plain.cacheable
