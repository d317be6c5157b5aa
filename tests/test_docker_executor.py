"""The docker executor against a real engine: isolation, limits, cleanup, identity."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import docker.errors
import pytest

from rsi.action import Action
from rsi.digest import FileNode
from rsi.store import LocalStore
from rsi.toolchain.testing import (
    built_toolchain,
    bwrap_skip_reason,
    docker_skip_reason,
    skip_or_fail,
    test_store_dir,
)

pytestmark = pytest.mark.e2e

PROBE = textwrap.dedent("""
    import os, socket
    report = {"uid": os.getuid(), "gid": os.getgid()}
    for path in ["/etc/probe", "/usr/probe", "src/probe.py", "probe-top", "out/ok", "/tmp/ok"]:
        try:
            with open(path, "w") as f:
                f.write("x")
            report[path] = "written"
        except OSError as exc:
            report[path] = exc.errno
    try:
        socket.create_connection(("192.0.2.1", 80), timeout=1)
        report["network"] = "reached"
    except OSError as exc:
        report["network"] = exc.errno
    with open("/proc/self/status") as f:
        report["caps"] = [l.split()[1] for l in f if l.startswith("CapEff")][0]
        f.seek(0)
        report["nnp"] = [l.split()[1] for l in f if l.startswith("NoNewPrivs")][0]
    print(report)
""")


@pytest.fixture(scope="module")
def docker_executor():
    reason = docker_skip_reason()
    if reason:
        skip_or_fail(reason)
    from rsi.executors.docker import DockerExecutor

    return DockerExecutor(memory="1g")


@pytest.fixture(scope="module")
def store() -> LocalStore:
    return LocalStore(test_store_dir())


@pytest.fixture(scope="module")
def numpy_tc():
    return built_toolchain("numpy")


def _action(store: LocalStore, tc, script: str, **kw) -> Action:
    src = store.put_bytes(script.encode())
    platform = {"toolchain": tc.platform_value, **kw.pop("platform", {})}
    return Action(
        argv=("python3", "src/probe.py"),
        inputs=(("src/probe.py", FileNode(src)),),
        outputs=kw.pop("outputs", ("out/ok",)),
        platform=tuple(platform.items()),
        timeout_s=kw.pop("timeout_s", 60),
        **kw,
    )


def _stdout(store: LocalStore, result) -> str:
    return store.read_bytes(result.stdout).decode()


def _rsi_containers(docker_executor, **labels) -> list:
    filters = {"label": [f"{k}={v}" for k, v in labels.items()] or ["rsi.executor"]}
    return docker_executor.client.containers.list(all=True, filters=filters)


def test_container_is_isolated_and_only_the_output_folder_is_writable(
    docker_executor, store, numpy_tc
) -> None:
    result = docker_executor.run(_action(store, numpy_tc, PROBE), store)
    assert result.ok, store.read_bytes(result.stderr).decode()
    report = eval(_stdout(store, result))
    assert report["uid"] == 65534 and report["gid"] == 65534
    assert report["out/ok"] == "written" and report["/tmp/ok"] == "written"
    for path in ("/etc/probe", "/usr/probe", "src/probe.py", "probe-top"):
        assert report[path] in (13, 30), (path, report[path])  # EACCES or EROFS
    assert report["network"] == 101  # ENETUNREACH: no interface but loopback
    assert int(report["caps"], 16) == 0 and report["nnp"] == "1"
    assert result.executor == "docker" and result.host["image"] == numpy_tc.image_id
    assert [o.path for o in result.outputs] == ["out/ok"]


def test_container_is_removed_after_a_normal_run(docker_executor, store, numpy_tc) -> None:
    action = _action(store, numpy_tc, "open('out/ok', 'w').write('1')")
    assert docker_executor.run(action, store).ok
    assert _rsi_containers(docker_executor, **{"rsi.action": action.key().hash}) == []


def test_docker_load_gives_the_image_id_computed_from_the_tar(docker_executor, numpy_tc) -> None:
    from rsi.toolchain.image import ensure_loaded

    with contextlib.suppress(docker.errors.ImageNotFound):
        docker_executor.client.images.remove(numpy_tc.image_id, force=True)
    docker_executor._loaded.discard(numpy_tc.image_id)
    got = ensure_loaded(
        docker_executor.client, numpy_tc.image_config, numpy_tc.rootfs_tar, numpy_tc.rootfs_sha256
    )
    assert got == numpy_tc.image_id
    image = docker_executor.client.images.get(got)
    assert image.tags == []
    assert image.attrs["Created"].startswith("2025-01-01T00:00:00")


def test_timeout_kills_the_container_and_removes_it(docker_executor, store, numpy_tc) -> None:
    action = _action(store, numpy_tc, "import time; time.sleep(120)", timeout_s=1.5)
    started = time.monotonic()
    result = docker_executor.run(action, store)
    assert time.monotonic() - started < 20
    assert result.timed_out and not result.ok and "timed out" in result.failure
    assert _rsi_containers(docker_executor, **{"rsi.action": action.key().hash}) == []


def test_out_of_memory_is_reported_as_such(docker_executor, store, numpy_tc) -> None:
    script = "blocks = []\nwhile True:\n    blocks.append(bytearray(16 << 20))\n"
    action = _action(store, numpy_tc, script, platform={"memory": "96m"}, timeout_s=60)
    result = docker_executor.run(action, store)
    assert not result.ok and not result.timed_out
    assert result.host["oom_killed"] is True
    assert "out of memory" in result.failure
    assert _rsi_containers(docker_executor, **{"rsi.action": action.key().hash}) == []


def test_cancel_kills_and_removes_the_container(docker_executor, store, numpy_tc) -> None:
    import threading

    from rsi.errors import ExecutionError

    cancel = threading.Event()
    action = _action(store, numpy_tc, "import time; time.sleep(120)")
    threading.Timer(1.0, cancel.set).start()
    with pytest.raises(ExecutionError, match="cancelled"):
        docker_executor.run(action, store, cancel)
    assert _rsi_containers(docker_executor, **{"rsi.action": action.key().hash}) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_killing_the_build_removes_its_container(
    docker_executor, store, numpy_tc, sig, tmp_path: Path
) -> None:
    driver = tmp_path / "driver.py"
    driver.write_text(
        textwrap.dedent(f"""
        from rsi.action import Action
        from rsi.digest import FileNode
        from rsi.store import LocalStore
        from rsi.executors.docker import DockerExecutor
        store = LocalStore({str(store.root)!r})
        src = store.put_bytes(b"import time; time.sleep(120)")
        action = Action(argv=("python3", "s.py"), inputs=(("s.py", FileNode(src)),),
                        platform=(("toolchain", {numpy_tc.platform_value!r}),), timeout_s=100)
        DockerExecutor().run(action, store)
    """)
    )
    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen(
        [sys.executable, str(driver)], cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)}
    )
    deadline = time.monotonic() + 60
    while not _rsi_containers(docker_executor, **{"rsi.pid": str(proc.pid)}):
        assert time.monotonic() < deadline and proc.poll() is None, "container never started"
        time.sleep(0.2)
    time.sleep(0.5)
    proc.send_signal(sig)
    proc.wait(timeout=60)
    assert _rsi_containers(docker_executor, **{"rsi.pid": str(proc.pid)}) == []


def test_thread_count_and_cpu_set_are_pinned_by_the_platform(
    docker_executor, store, numpy_tc
) -> None:
    script = (
        "import os; print(sorted(os.sched_getaffinity(0)), os.environ['OMP_NUM_THREADS'], "
        "os.environ['OPENBLAS_NUM_THREADS'])"
    )
    action = _action(
        store, numpy_tc, script, outputs=(), platform={"threads": "1", "cpuset": "0", "cpus": "1"}
    )
    result = docker_executor.run(action, store)
    assert result.ok, store.read_bytes(result.stderr).decode()
    assert _stdout(store, result).split() == ["[0]", "1", "1"]


def test_accelerator_platform_requests_gpus(docker_executor, store, numpy_tc, tmp_path) -> None:
    action = _action(store, numpy_tc, "pass", platform={"accelerator": "nvidia", "gpus": "1"})
    kwargs = docker_executor.container_kwargs(action, numpy_tc, tmp_path, ["out"])
    (request,) = kwargs["device_requests"]
    assert request["Count"] == 1 and request["Capabilities"] == [["gpu"]]
    plain = _action(store, numpy_tc, "pass")
    assert "device_requests" not in docker_executor.container_kwargs(
        plain, numpy_tc, tmp_path, ["out"]
    )


def test_accelerator_action_sees_the_gpu(docker_executor, store, numpy_tc) -> None:
    runtimes = docker_executor.client.info().get("Runtimes", {})
    if "nvidia" not in runtimes and not os.path.exists("/dev/nvidia0"):
        pytest.skip("no NVIDIA GPU or nvidia container runtime on this machine")
    script = "import os; print(sorted(p for p in os.listdir('/dev') if p.startswith('nvidia')))"
    result = docker_executor.run(
        _action(store, numpy_tc, script, outputs=(), platform={"accelerator": "nvidia"}), store
    )
    assert result.ok and "nvidia0" in _stdout(store, result)


def test_same_action_key_and_outputs_on_docker_and_bwrap(docker_executor, store, numpy_tc) -> None:
    reason = bwrap_skip_reason()
    if reason:
        skip_or_fail(reason)
    from rsi.executors.bwrap import BwrapExecutor

    script = (
        "import numpy as np\nrng = np.random.default_rng(0)\n"
        "open('out/ok', 'w').write(repr(float((rng.random((64, 64)) @ "
        "rng.random((64, 64))).sum())))\n"
    )
    action = _action(store, numpy_tc, script, platform={"threads": "1"})
    via_docker = docker_executor.run(action, store)
    via_bwrap = BwrapExecutor().run(action, store)
    assert via_docker.ok and via_bwrap.ok
    assert via_docker.outputs == via_bwrap.outputs
    assert (via_docker.executor, via_bwrap.executor) == ("docker", "bwrap")
    assert via_docker.host["hostname"] and via_bwrap.host["sandbox"] == "bwrap"
    other = _action(
        store, numpy_tc, script, platform={"threads": "1", "toolchain": "numpy@" + "0" * 64}
    )
    assert other.key() != action.key()
