"""The bwrap executor: the same toolchain rootfs, read-only, with no network and no leftovers."""

from __future__ import annotations

import os
import subprocess
import textwrap
import time
import uuid

import pytest

from rsi.action import Action
from rsi.digest import FileNode
from rsi.store import LocalStore
from rsi.toolchain import rootfs_dir
from rsi.toolchain.testing import (
    built_toolchain,
    bwrap_skip_reason,
    skip_or_fail,
    test_store_dir,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def bwrap_executor():
    reason = bwrap_skip_reason()
    if reason:
        skip_or_fail(reason)
    from rsi.executors.bwrap import BwrapExecutor

    return BwrapExecutor()


@pytest.fixture(scope="module")
def store() -> LocalStore:
    return LocalStore(test_store_dir())


@pytest.fixture(scope="module")
def numpy_tc():
    return built_toolchain("numpy")


def _action(store: LocalStore, tc, script: str, argv_extra=(), **kw) -> Action:
    src = store.put_bytes(script.encode())
    platform = {"toolchain": tc.platform_value, **kw.pop("platform", {})}
    return Action(
        argv=("python3", "src/probe.py", *argv_extra),
        inputs=(("src/probe.py", FileNode(src)),),
        outputs=kw.pop("outputs", ("out/ok",)),
        platform=tuple(platform.items()),
        timeout_s=kw.pop("timeout_s", 60),
        **kw,
    )


PROBE = textwrap.dedent("""
    import os, socket, sys
    report = {"uid": os.getuid(), "python": sys.version_info[:2], "pid": os.getpid(),
              "host_visible": os.path.exists("/work") or os.path.exists("/root/.cache")}
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
    import numpy
    report["numpy"] = numpy.__version__
    print(report)
""")


def test_sandbox_is_isolated_and_only_the_output_folder_is_writable(
    bwrap_executor, store, numpy_tc
) -> None:
    result = bwrap_executor.run(_action(store, numpy_tc, PROBE), store)
    assert result.ok, store.read_bytes(result.stderr).decode()
    report = eval(store.read_bytes(result.stdout).decode())
    assert report["uid"] == 65534 and report["python"] == (3, 11)
    assert report["numpy"] == "2.4.6" and not report["host_visible"]
    assert report["out/ok"] == "written" and report["/tmp/ok"] == "written"
    for path in ("/etc/probe", "/usr/probe", "src/probe.py", "probe-top"):
        assert report[path] in (13, 30), (path, report[path])
    assert report["network"] == 101
    assert report["pid"] < 10  # its own pid namespace
    assert result.executor == "bwrap"


def test_rootfs_is_extracted_once_and_stays_unchanged(bwrap_executor, store, numpy_tc) -> None:
    root = rootfs_dir(numpy_tc)
    before = sorted(os.listdir(root))
    assert bwrap_executor.run(_action(store, numpy_tc, "open('out/ok','w').write('1')"), store).ok
    assert rootfs_dir(numpy_tc) == root and sorted(os.listdir(root)) == before
    assert (root / "etc/rsi/lock.txt").exists()


def test_timeout_kills_every_process_of_the_sandbox(bwrap_executor, store, numpy_tc) -> None:
    marker = f"rsi-marker-{uuid.uuid4().hex}"
    script = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', "
        "sys.argv[1]])\ntime.sleep(300)\n"
    )
    action = _action(store, numpy_tc, script, argv_extra=(marker,), timeout_s=1.5)
    started = time.monotonic()
    result = bwrap_executor.run(action, store)
    assert time.monotonic() - started < 15
    assert result.timed_out and "timed out" in result.failure
    time.sleep(0.3)
    left = subprocess.run(
        ["pgrep", "-f", marker], check=False, capture_output=True, text=True
    ).stdout
    assert left.strip() == ""


def test_torch_toolchain_runs_with_pinned_threads(bwrap_executor, store) -> None:
    torch_tc = built_toolchain("torch-cpu")
    script = (
        "import torch; print(torch.__version__, torch.get_num_threads(), "
        "torch.ones(3).sum().item())"
    )
    action = _action(store, torch_tc, script, outputs=(), platform={"threads": "1"}, timeout_s=120)
    result = bwrap_executor.run(action, store)
    assert result.ok, store.read_bytes(result.stderr).decode()[-2000:]
    assert store.read_bytes(result.stdout).decode().split() == ["2.13.0+cpu", "1", "3.0"]


def test_host_toolchain_actions_run_in_the_local_bwrap_sandbox(bwrap_executor, store) -> None:
    from rsi.executors.local import host_python_identity

    action = Action(
        argv=("python3", "-c", "print('hi')"),
        platform=(("toolchain", host_python_identity()),),
        timeout_s=60,
    )
    result = bwrap_executor.run(action, store)
    assert result.ok and result.executor == "bwrap"
    assert store.read_bytes(result.stdout) == b"hi\n"
