"""The local executor in its bwrap sandbox: fresh scratch folder, read-only inputs, cleared
environment, no network, declared outputs only, and a process tree that dies with the action."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest
from processes import live_pids

from rsi.action import Action
from rsi.digest import FileNode, SymlinkNode, digest_bytes
from rsi.executors import base as executor_base
from rsi.executors.local import LocalExecutor
from rsi.store import LocalStore

PATH = ("PATH", "/usr/bin:/bin")


@pytest.fixture
def store(tmp_path) -> LocalStore:
    return LocalStore(tmp_path / "store")


@pytest.fixture(params=["persistent", "per-action", "staged"])
def executor(bwrap, request, monkeypatch) -> LocalExecutor:
    """Every bwrap path: a persistent slot per job (root only), one bwrap per action, and one
    bwrap per action over a prepared input tree (root only; here for every action)."""
    from rsi.executors import staged
    from rsi.executors.pool import pool_supported

    if request.param in ("persistent", "staged") and not pool_supported():
        pytest.skip("persistent sandboxes need root (they run actions as uid 65534)")
    if request.param == "staged":
        monkeypatch.setattr(staged, "TREE_MIN_INPUTS", 0)
    ex = LocalExecutor(pool=request.param != "per-action")
    assert ex.sandbox == "bwrap"
    return ex


def sh(script: str, *, outputs=("o",), inputs=(), env=(PATH,), timeout_s: float = 60) -> Action:
    return Action(
        argv=("/bin/sh", "-c", script),
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        env=tuple(env),
        timeout_s=timeout_s,
        label="//test:action",
    )


def file_input(store: LocalStore, path: str, data: bytes, executable: bool = False):
    return path, FileNode(store.put_bytes(data), executable)


def output(store: LocalStore, result, path: str = "o") -> bytes:
    assert result.ok, (result.failure, result.exit_code, store.read_bytes(result.stderr))
    return store.read_bytes(result.output_map[path].digest)


def drain() -> None:
    trash = getattr(executor_base, "TRASH", None)
    if trash is not None:
        trash.drain()


# ------------------------------------------------------------------------------ scratch


@pytest.mark.e2e
def test_each_action_gets_a_fresh_empty_scratch_folder(store, executor):
    first = executor.run(sh("touch leftover; mkdir -p junk; echo 1 > o"), store)
    assert first.ok
    second = executor.run(sh('here=$(pwd; ls -A); echo "$here" > o'), store)
    assert output(store, second).decode().split() == ["/rsi/exec"]  # empty: nothing left over
    drain()
    assert list(store.tmp.iterdir()) == []


@pytest.mark.e2e
def test_inputs_are_materialised_at_their_paths(store, executor):
    inputs = [
        file_input(store, "pkg/data.txt", b"payload\n"),
        file_input(store, "tools/run.sh", b"#!/bin/sh\necho ran\n", executable=True),
    ]
    result = executor.run(sh("cat pkg/data.txt > o; ./tools/run.sh >> o", inputs=inputs), store)
    assert output(store, result) == b"payload\nran\n"


@pytest.mark.e2e
def test_symlink_inputs_are_materialised_as_links(store, executor):
    inputs = [file_input(store, "d/real.txt", b"real\n"), ("d/link", SymlinkNode("real.txt"))]
    result = executor.run(sh("readlink d/link > o; cat d/link >> o", inputs=inputs), store)
    assert output(store, result) == b"real.txt\nreal\n"


@pytest.mark.fast
@pytest.mark.parametrize(
    "inputs,outputs",
    [
        ([("d", SymlinkNode("/etc")), ("d/f", None)], ["o"]),  # written through the link
        ([("d", SymlinkNode("/etc"))], ["d/shadow"]),  # read back through the link
        ([("in.txt", None)], ["../o"]),
        ([("/abs.txt", None)], ["o"]),
    ],
)
def test_paths_that_could_leave_the_scratch_folder_are_refused(inputs, outputs):
    from rsi.errors import RsiError

    node = FileNode(digest_bytes(b"x"))
    with pytest.raises(RsiError, match="symlink input|not normalised"):
        Action(
            argv=("/bin/true",),
            inputs=tuple((p, n or node) for p, n in inputs),
            outputs=tuple(outputs),
            label="//test:action",
        )


# ------------------------------------------------------------------------------ read-only


@pytest.mark.e2e
@pytest.mark.parametrize(
    "input_path,out", [("in.txt", "o"), ("pkg/in.txt", "pkg/o"), ("src/in.txt", "o")]
)
def test_writing_to_an_input_fails_and_the_stored_input_is_unchanged(
    store, executor, input_path, out
):
    path, node = file_input(store, input_path, b"precious\n")
    script = (
        f"(echo evil > {path}) 2>/dev/null && echo wrote > {out} || echo refused > {out};"
        f"(rm -f {path}) 2>/dev/null; (chmod 666 {path}) 2>/dev/null;"
        f"(echo evil >> {path}) 2>/dev/null && echo appended >> {out};"
        f"cat {path} >> {out}"
    )
    result = executor.run(sh(script, inputs=[(path, node)], outputs=[out]), store)
    assert output(store, result, out) == b"refused\nprecious\n"
    assert store.read_bytes(node.digest) == b"precious\n"
    assert store.has_verified(node.digest)


# ------------------------------------------------------------------------------ environment


@pytest.mark.e2e
def test_environment_is_cleared_to_the_declared_variables(store, executor, monkeypatch):
    monkeypatch.setenv("RSI_TEST_HOST_SECRET", "leaked")
    result = executor.run(sh("env > o", env=[PATH, ("FOO", "bar")]), store)
    env = dict(line.split("=", 1) for line in output(store, result).decode().splitlines())
    assert env["FOO"] == "bar" and env["PATH"] == "/usr/bin:/bin"
    assert "RSI_TEST_HOST_SECRET" not in env and "HOME" not in env
    assert set(env) <= {"PATH", "FOO", "PWD", "SHLVL", "_", "OLDPWD"}


@pytest.mark.e2e
@pytest.mark.skipif(not os.path.exists("/etc/alternatives/awk"), reason="needs awk by alternatives")
def test_the_hosts_system_files_bound_in_etc_are_readable_by_the_action(store, executor):
    """/etc, which bwrap makes above the files bound in it, is 0755: an action run as the
    sandbox uid reads ld.so.cache, passwd, and the alternatives (awk is one)."""
    script = (
        "stat -c %a /etc > o; echo 'a b' | awk '{print $2}' >> o;"
        " grep -c '^root:' /etc/passwd >> o; head -c 11 /etc/ld.so.cache | tr -d '\\0' >> o"
    )
    result = executor.run(sh(script), store)
    assert store.read_bytes(result.stderr) == b""
    lines = output(store, result).decode().split("\n")
    # NB: ld.so.cache starts with its format's magic, new ("glibc-ld.so.cache") or old
    assert lines[:3] == ["755", "b", "1"] and lines[3] in ("glibc-ld.so", "ld.so-1.7.0"), lines


@pytest.mark.e2e
def test_workspace_and_store_are_invisible(store, executor, tmp_path):
    (tmp_path / "host-file").write_text("host")
    script = f"ls {tmp_path} > o 2>&1; ls {store.root} >> o 2>&1; echo done >> o"
    result = executor.run(sh(script), store)
    text = output(store, result).decode()
    assert "host-file" not in text and "cas" not in text


@pytest.mark.e2e
@pytest.mark.skipif(not os.path.exists("/usr/bin/python3"), reason="needs /usr/bin/python3")
def test_no_network_even_to_a_host_listener(store, executor):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):  # the listener is real
            server.accept()[0].close()
        probe = (
            "import socket\ntry:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=5)\n"
            "    print('connected')\nexcept OSError as e:\n    print('failed', e.errno)\n"
        )
        inputs = [file_input(store, "probe.py", probe.encode())]
        result = executor.run(sh("/usr/bin/python3 probe.py > o", inputs=inputs), store)
        text = output(store, result).decode()
        assert text.startswith("failed"), text
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing ever reached the host's listener
    finally:
        server.close()


# ------------------------------------------------------------------------------ outputs


@pytest.mark.e2e
def test_undeclared_outputs_are_ignored(store, executor):
    marker = uuid.uuid4().hex.encode()
    result = executor.run(sh(f"echo declared > o; echo {marker.decode()} > extra"), store)
    assert [o.path for o in result.outputs] == ["o"]
    assert not store.has(digest_bytes(marker + b"\n"))


@pytest.mark.e2e
def test_missing_declared_output_fails_naming_it(store, executor):
    result = executor.run(sh("echo one > o", outputs=["o", "sub/missing.txt"]), store)
    assert not result.ok
    assert "sub/missing.txt" in result.failure and "o," not in result.failure


@pytest.mark.e2e
def test_output_whose_folder_was_replaced_by_a_file_fails_naming_it(store, executor):
    result = executor.run(sh("rmdir sub; echo x > sub", outputs=["sub/o"]), store)
    assert not result.ok and "sub/o" in result.failure


@pytest.mark.e2e
def test_output_executable_bit_is_recorded(store, executor):
    result = executor.run(
        sh("echo '#!/bin/sh' > o; chmod +x o; echo data > d", outputs=["o", "d"]), store
    )
    assert result.ok
    assert result.output_map["o"].executable is True
    assert result.output_map["d"].executable is False


@pytest.mark.e2e
def test_stdout_and_stderr_are_kept_in_the_store(store, executor):
    result = executor.run(sh("echo to-out; echo to-err >&2; echo x > o"), store)
    assert store.read_bytes(result.stdout) == b"to-out\n"
    assert store.read_bytes(result.stderr) == b"to-err\n"
    assert result.host["sandbox"] == "bwrap"


@pytest.mark.e2e
def test_failing_command_reports_its_exit_code_and_keeps_stderr(store, executor):
    result = executor.run(sh("echo why it failed >&2; exit 7", outputs=["o"]), store)
    assert not result.ok and result.exit_code == 7
    assert store.read_bytes(result.stderr) == b"why it failed\n"


# ------------------------------------------------------------------------------ timeout


def _gone(pid: int, within_s: float = 5) -> bool:
    """True once `pid` no longer runs (bounded wait for the kernel to finish the kill)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


@pytest.mark.e2e
@pytest.mark.parametrize("sandbox", ["bwrap", "bwrap-per-action", "unshare", "none"])
def test_timeout_kills_the_whole_tree_including_a_detached_grandchild(store, sandbox):
    from rsi.executors.local import sandbox_mode

    if sandbox.startswith("bwrap") and sandbox_mode() != "bwrap":
        pytest.skip("bubblewrap is not usable here")
    executor = LocalExecutor(
        sandbox=sandbox[:5] if sandbox.startswith("bwrap") else sandbox, pool=sandbox == "bwrap"
    )
    marker = f"36{uuid.uuid4().int % 10**6:06d}"  # a unique `sleep` duration to find it by
    script = f"setsid sleep {marker} & echo $! > pid; sleep {marker}1"
    found: list[int] = []
    action = sh(script, outputs=["pid"], timeout_s=2)
    result_box = {}
    thread = threading.Thread(target=lambda: result_box.update(r=executor.run(action, store)))
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while thread.is_alive() and not found and time.monotonic() < deadline:
            found = [p for p in live_pids(f"sleep\0{marker}\0")]
            time.sleep(0.02)
        thread.join(60)
        assert not thread.is_alive()
        result = result_box["r"]
        assert result.timed_out and not result.ok
        assert "timed out" in result.failure
        assert found, "the detached grandchild was never seen running"
        for pid in found:
            assert _gone(pid), f"grandchild {pid} survived the timeout"
        assert live_pids(marker) == []
    finally:
        for pid in live_pids(marker):  # NB: only our own uniquely-marked sleeps
            os.kill(pid, 9)


@pytest.mark.e2e
def test_an_action_cannot_pass_its_failure_off_as_a_sandbox_fault(store):
    """bwrap reports the child's start on --json-status-fd; text on stderr proves nothing."""
    from rsi.executors.local import sandbox_mode

    if sandbox_mode() != "bwrap":
        pytest.skip("bubblewrap is not usable here")
    result = LocalExecutor(sandbox="bwrap").run(sh("echo 'bwrap: pretend' >&2; exit 1"), store)
    assert result.exit_code == 1 and not result.ok


# ------------------------------------------------------------------------------ persistent slots


@pytest.fixture
def pooled(bwrap) -> LocalExecutor:
    from rsi.executors.pool import pool_supported

    if not pool_supported():
        pytest.skip("persistent sandboxes need root (they run actions as uid 65534)")
    return LocalExecutor(pool=True)


@pytest.mark.e2e
def test_a_reused_slot_passes_nothing_from_one_action_to_the_next(store, pooled, monkeypatch):
    """/tmp, /dev/shm, System V IPC and background processes all end with their action."""
    from rsi.executors import pool

    used: list = []
    acquire = pool.POOL.acquire
    monkeypatch.setattr(pool.POOL, "acquire", lambda shape: used.append(acquire(shape)) or used[-1])
    marker = f"37{uuid.uuid4().int % 10**6:06d}"
    listing = sh(
        "ls -A /tmp > t; ls -A /dev/shm > s; tail -n +2 /proc/sysvipc/shm > i",
        outputs=["t", "s", "i"],
    )
    # NB: /tmp is not always empty: an interpreter installed under /tmp is bound there
    before = pooled.run(listing, store)
    clean = [output(store, before, name) for name in ("t", "s", "i")]
    assert clean[1:] == [b"", b""]
    first = pooled.run(
        sh(
            f"echo secret > /tmp/left; echo secret > /dev/shm/left; mkdir /tmp/d; chmod 0 /tmp/d;"
            f" ipcmk -M 4096 > /dev/null; (setsid sleep {marker} &); echo 1 > o"
        ),
        store,
    )
    assert first.ok and store.read_bytes(first.stderr) == b"", store.read_bytes(first.stderr)
    assert first.host["sandbox_slot"] == "persistent"
    second = pooled.run(listing, store)
    assert [output(store, second, name) for name in ("t", "s", "i")] == clean
    assert live_pids(f"sleep\0{marker}") == []
    assert len(used) == 3 and used[0] is used[1] is used[2]  # NB: one slot served all three


@pytest.mark.e2e
def test_actions_in_a_slot_run_as_another_uid_and_cannot_touch_the_runner(store, pooled):
    result = pooled.run(
        sh(
            "id -u > o; (kill -9 1; kill -INT 1) 2>/dev/null; cat /proc/1/environ >> o 2>&1;"
            " echo alive >> o"
        ),
        store,
    )
    text = output(store, result).decode()
    assert text.startswith("65534\n") and "Permission denied" in text
    after = pooled.run(sh("echo still-serving > o"), store)
    assert output(store, after) == b"still-serving\n"


@pytest.mark.e2e
def test_a_slot_that_dies_mid_action_is_an_infrastructure_error_and_is_replaced(store, pooled):
    from rsi.errors import ExecutionError
    from rsi.executors import pool

    marker = f"38{uuid.uuid4().int % 10**6:06d}"
    box: dict = {}

    def run() -> None:
        try:
            box["r"] = pooled.run(sh(f"sleep {marker}; echo x > o"), store)
        except ExecutionError as exc:
            box["e"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 20
    while not live_pids(f"sleep\0{marker}") and time.monotonic() < deadline:
        time.sleep(0.02)
    [pid] = live_pids(f"sleep\0{marker}")
    runner = pid
    while b"-I\0-S\0-c\0" not in Path(f"/proc/{runner}/cmdline").read_bytes():
        runner = int(Path(f"/proc/{runner}/stat").read_text().rsplit(")", 1)[1].split()[1])
    os.kill(runner, 9)  # NB: from the host, which may; an action may not (test above)
    thread.join(60)
    assert "e" in box and "stopped answering" in str(box["e"]), box
    assert _gone(pid)
    assert output(store, pooled.run(sh("echo fresh > o"), store)) == b"fresh\n"
    assert all(s.alive() for idle in pool.POOL._idle.values() for s in idle)


@pytest.mark.e2e
def test_a_source_changed_after_its_digest_was_taken_is_refused(store, pooled, tmp_path):
    from rsi.errors import ExecutionError

    src = tmp_path / "src.txt"
    src.write_bytes(b"as hashed\n")
    node = FileNode(digest_bytes(b"as hashed\n"))
    src.write_bytes(b"edited meanwhile\n")
    action = Action(
        argv=("/bin/sh", "-c", "cat in.txt > o"),
        inputs=(("in.txt", node),),
        outputs=("o",),
        sources=(("in.txt", str(src)),),
        label="//test:action",
    )
    with pytest.raises(ExecutionError, match="changed while the build was running"):
        pooled.run(action, store)
    src.write_bytes(b"as hashed\n")
    assert output(store, pooled.run(action, store)) == b"as hashed\n"


@pytest.mark.fast
def test_a_small_tmpfs_is_not_used_for_scratch(monkeypatch):
    """Docker's default 64 MiB /dev/shm would fail large outputs; scratch then goes to /tmp."""
    from rsi.executors import pool

    real = os.statvfs

    class Small:
        f_blocks, f_frsize = 16384, 4096  # 64 MiB

    monkeypatch.delenv("RSI_SCRATCH", raising=False)
    monkeypatch.setattr(os, "statvfs", lambda p: Small() if p == "/dev/shm" else real(p))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    assert pool.scratch_root() == Path("/tmp") / f"rsi-{os.geteuid()}"
    monkeypatch.setenv("RSI_SCRATCH", "/somewhere/else")
    assert pool.scratch_root() == Path("/somewhere/else")


@pytest.mark.e2e
def test_no_message_queue_key_or_log_state_survives_into_the_next_action(store, pooled):
    """POSIX message queues, the uid's keyrings and the log files the action owned are all
    fresh for the next action of the same slot."""
    import platform
    import sys

    py = sys.executable  # NB: the slot binds this interpreter (its runner)
    add_key, keyctl = {"x86_64": (248, 250), "aarch64": (217, 219)}.get(
        platform.machine(), (None, None)
    )
    leave = (
        f"{py} -I -S -c 'import ctypes, os\n"
        "l = ctypes.CDLL(None, use_errno=True)\n"
        'q = l.mq_open(b"/leak", os.O_CREAT | os.O_RDWR, 0o666, None)\n'
        'assert q >= 0 and l.mq_send(q, b"secret", 6, 0) == 0\n'
        + (
            f'assert l.syscall({add_key}, b"user", b"leakkey", b"secret", 6,'
            " ctypes.c_int(-4)) > 0\n"
            if add_key
            else ""
        )
        + "' && chmod 0 /rsi/stdout /rsi/stderr && echo left > o"
    )
    first = pooled.run(sh(leave), store)
    assert output(store, first) == b"left\n"
    look = (
        f"{py} -I -S -c 'import ctypes, os\n"
        "l = ctypes.CDLL(None, use_errno=True)\n"
        'print(l.mq_open(b"/leak", os.O_RDWR))\n'
        # NB: KEYCTL_SEARCH of the user keyring; a cleared key may still be listed in
        # /proc/keys until the kernel collects it, but it can no longer be found or read
        + (f'print(l.syscall({keyctl}, 10, -4, b"user", b"leakkey", 0))\n' if keyctl else "")
        + "' > o; ls /dev/mqueue >> o; echo to-log"
    )
    second = pooled.run(sh(look), store)
    assert output(store, second) == (b"-1\n-1\n" if keyctl else b"-1\n")
    assert store.read_bytes(second.stdout) == b"to-log\n"


@pytest.mark.e2e
def test_actions_get_default_signal_dispositions(store, executor):
    """The runner is Python, which ignores SIGPIPE; an action must not inherit that (a slot
    and a per-action sandbox give the same result)."""
    result = executor.run(sh("(yes; echo $? > o) | head -n 1 > /dev/null"), store)
    assert output(store, result) == b"141\n"


@pytest.mark.e2e
def test_a_slot_outlives_the_thread_that_started_it(store, pooled):
    """bwrap's --die-with-parent follows the starting *thread*; slots must not use it, or a
    worker's per-lease thread (or a build's pool thread) would leave a dying slot behind."""
    from rsi.executors import pool

    box: dict = {}
    thread = threading.Thread(target=lambda: box.update(r=pooled.run(sh("echo a > o"), store)))
    thread.start()
    thread.join()
    assert output(store, box["r"]) == b"a\n"
    time.sleep(0.3)
    started = pool.POOL._count
    assert output(store, pooled.run(sh("echo b > o"), store)) == b"b\n"
    assert pool.POOL._count == started  # NB: served by the slot that thread started
