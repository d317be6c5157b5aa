"""Faults: `kill -9` in the middle of a build, a full disk, a store nobody may write to. After
each, the store holds no half-written entry, verifies clean, and the next build finishes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from processes import live_pids

from rsi.digest import digest_file

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bwrap")]


def assert_store_whole(store: Path) -> None:
    """No temp file anywhere in cas/ or ac/, and every blob's content matches its name."""
    leftovers = [p for sub in ("cas", "ac") for p in (store / sub).rglob(".tmp-*")]
    assert leftovers == []
    for blob in (store / "cas").rglob("*"):
        if blob.is_file():
            assert digest_file(blob).hash == blob.name, f"half-written blob {blob}"


# ------------------------------------------------------------------------------ kill -9


def _sigkill(proc: subprocess.Popen) -> None:
    """kill -9, as a user or a CI timeout would, and reap it."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)


def test_kill_9_mid_build_then_rebuild_finishes_clean_without_rerunning_finished_work(
    build,
    command,
    make_workspace,
    rsi_argv,
    run_rsi,
    tmp_path,
):
    marker = f"{uuid.uuid4().int % 10**6:06d}"
    n = 8
    ws = make_workspace(
        tmp_path,
        {
            "BUILD.toml": "".join(
                command(f"s{i}", cmd=f"sleep 0.3{marker}; echo {i} > $(OUT)", outs=[f"s{i}.txt"])
                for i in range(n)
            )
            + command(
                "sum",
                cmd="cat $(SRCS) " + " ".join(f"$(location :s{i})" for i in range(n)) + " > $(OUT)",
                deps=[f":s{i}" for i in range(n)],
                outs=["sum.txt"],
            )
        },
    )
    events = tmp_path / "killed.jsonl"
    proc = subprocess.Popen(
        [*rsi_argv, "build", "--jobs", "2", "--events", str(events), "//:sum"],
        cwd=ws,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    finished: set[str] = set()
    try:
        deadline = time.monotonic() + 60
        while len(finished) < 2 and proc.poll() is None and time.monotonic() < deadline:
            finished = {
                e["label"]
                for e in _safe_events(events)
                if e["kind"] == "action_finished" and e.get("status") == "ok"
            }
            time.sleep(0.02)
        assert proc.poll() is None, "the build ended before it could be killed"
        assert len(finished) >= 2
    finally:
        _sigkill(proc)
    assert proc.returncode == -signal.SIGKILL
    assert "//:sum" not in finished
    deadline = time.monotonic() + 10
    while live_pids(f"0.3{marker}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live_pids(f"0.3{marker}") == []  # the sandboxed actions died with rsi

    assert_store_whole(ws / "cache")
    again = build(ws, "--jobs", "2", "//:sum")
    assert again.executed and not again.executed & finished
    assert "//:sum" in again.executed
    assert (ws / "out" / "sum.txt").read_text() == "".join(f"{i}\n" for i in range(n))
    verify = run_rsi(ws, "cache", "verify")
    assert verify.returncode == 0, verify
    assert list((ws / "cache" / "tmp").iterdir()) == []  # the killed build's scratch is gone


def test_kill_9_leaves_no_sandbox_or_action_process_behind(
    build, command, make_workspace, rsi_argv, tmp_path
):
    """Long actions, one with a detached grandchild, are running when rsi is SIGKILLed: every
    process of theirs dies with it (a persistent slot's runner included), and the next build
    removes the killed build's slot folders."""
    from rsi.executors.pool import scratch_root

    marker = f"{uuid.uuid4().int % 10**6:06d}"
    ws = make_workspace(
        tmp_path,
        {
            "BUILD.toml": command("a", cmd=f"sleep 38{marker}; echo > $(OUT)", outs=["a.txt"])
            + command(
                "b",
                cmd=f"(setsid sleep 39{marker} &); sleep 38{marker}; echo > $(OUT)",
                outs=["b.txt"],
            )
            + command("quick", cmd="echo > $(OUT)", outs=["q.txt"])
        },
    )
    proc = subprocess.Popen(
        [*rsi_argv, "build", "--jobs", "2", "//:a", "//:b"],
        cwd=ws,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        # NB: "sleep\0" + marker matches the sleeps themselves, not the shells around them
        while len(live_pids(f"sleep\0{38}{marker}")) < 2 or not live_pids(f"sleep\0{39}{marker}"):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.02)
    finally:
        _sigkill(proc)
    deadline = time.monotonic() + 10
    while (live_pids(f"38{marker}") or live_pids(f"39{marker}")) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert live_pids(f"38{marker}") == [] and live_pids(f"39{marker}") == []
    finally:
        for pid in live_pids(f"38{marker}") + live_pids(f"39{marker}"):
            os.kill(pid, signal.SIGKILL)
    build(ws, "//:quick")
    root = scratch_root()
    assert not (root.is_dir() and [p for p in root.iterdir() if f"-{proc.pid}-" in p.name])


def _safe_events(path: Path) -> list[dict]:
    """Events written so far; a line still being written is skipped."""
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        try:
            found.append(json.loads(line))
        except ValueError:
            pass
    return found


# ------------------------------------------------------------------------------ disk full


@pytest.fixture
def tiny_tmpfs(mount_tmpfs):
    """A 1 MiB tmpfs, unmounted afterwards."""
    return mount_tmpfs(1)


def test_full_disk_is_a_clear_error_exit_1_and_leaves_no_half_written_entry(
    build,
    command,
    make_workspace,
    run_rsi,
    tmp_path,
    tiny_tmpfs,
):
    big = os.urandom(3 << 20)  # more than the store's file system holds
    ws = make_workspace(
        tmp_path,
        {
            "big.bin": big,
            "BUILD.toml": command(
                "copy", cmd="cat $(SRCS) > $(OUT)", srcs=["big.bin"], outs=["copy.bin"]
            )
            + command("small", cmd="echo fine > $(OUT)", outs=["small.txt"]),
        },
    )
    run = build(ws, "//:copy", store=tiny_tmpfs, expect=1)
    text = run.stdout + run.stderr
    assert "No space left on device" in text
    assert "Traceback" not in run.stderr
    report = run.json()
    assert report["targets"]["//:copy"]["ok"] is False
    assert_store_whole(tiny_tmpfs)
    assert list((tiny_tmpfs / "ac").rglob("*.*")) == [] and not any(
        p.is_file() for p in (tiny_tmpfs / "ac").rglob("*")
    )
    verify = run_rsi(ws, "--store", str(tiny_tmpfs), "cache", "verify")
    assert verify.returncode == 0, verify
    ok = build(ws, "//:small", store=tiny_tmpfs)  # what fits still builds
    assert ok.executed == {"//:small"}


def test_action_filling_the_disk_fails_without_caching_anything(
    build,
    command,
    make_workspace,
    run_rsi,
    tmp_path,
    tiny_tmpfs,
):
    ws = make_workspace(
        tmp_path,
        {
            "BUILD.toml": command(
                "huge", cmd="head -c 3000000 /dev/zero > $(OUT)", outs=["huge.bin"]
            )
        },
    )
    run = build(ws, "//:huge", store=tiny_tmpfs, expect=1)
    assert run.json()["targets"]["//:huge"]["ok"] is False
    # NB: the action runs in scratch on a tmpfs of its own and succeeds; keeping its output is
    # what fails, an infrastructure error (retryable) that names the full disk
    [finished] = run.finished()
    assert finished["status"] == "error" and finished["retryable"] is True
    assert "No space left on device" in finished["message"]
    assert not any(p.is_file() for p in (tiny_tmpfs / "ac").rglob("*"))
    assert_store_whole(tiny_tmpfs)
    assert run_rsi(ws, "--store", str(tiny_tmpfs), "cache", "verify").returncode == 0


# ------------------------------------------------------------------------------ unwritable


@pytest.fixture
def shared_tmp():
    """A folder another user can enter (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="rsi-faults-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_unwritable_store_is_a_clear_error_exit_2_and_leaves_no_entry(
    build,
    command,
    make_workspace,
    run_rsi,
    shared_tmp,
):
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: cannot drop to an unprivileged user")
        as_user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    else:
        as_user = []
    ws = make_workspace(
        shared_tmp,
        {
            "src.txt": "data\n",
            "BUILD.toml": command("t", cmd="cat $(SRCS) > $(OUT)", srcs=["src.txt"], outs=["t"]),
        },
    )
    assert run_rsi(ws, "cache", "stats").returncode == 0  # creates the store
    if as_user:
        subprocess.run(["chown", "-R", "65534:65534", str(shared_tmp)], check=True)
    cas = ws / "cache" / "cas"
    for path in [cas, *cas.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)

    # NB: refused before anything is written (issue 30: exit 2, naming rsi.toml's `store`)
    run = build(ws, "//:t", expect=2, user=as_user)
    assert "field 'store'" in run.stderr and "cas is not writable" in run.stderr, run
    assert "Traceback" not in run.stderr
    assert not any(p.is_file() for p in (ws / "cache" / "ac").rglob("*"))
    assert_store_whole(ws / "cache")
    assert run_rsi(ws, "cache", "verify", user=as_user).returncode == 0


def test_a_live_builds_old_scratch_folder_is_never_swept(tmp_path, make_workspace, build):
    """Another build's long action keeps its scratch folder however old; a dead pid's goes."""
    ws = make_workspace(
        tmp_path, {"BUILD.toml": '[t]\nrule = "command"\nouts = ["o"]\ncmd = "echo > $(OUT)"\n'}
    )
    build(ws, "//:t")  # NB: creates the store; rsi refuses a store folder it did not create
    tmp = ws / "cache" / "tmp"
    live = tmp / f"scratch-{os.getpid()}-abc"
    dead = tmp / "scratch-999999999-abc"
    for folder in (live, dead):
        folder.mkdir()
        os.utime(folder, (time.time() - 7200, time.time() - 7200))
    build(ws, "//:t")
    assert live.exists()
    assert not dead.exists()
