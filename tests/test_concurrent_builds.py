"""One writer per workspace's outputs (rsi/wslock.py, rsi/recheck.py): two real `rsi build`
processes on one workspace with a source edited between their starts leave out/ with the new
content, the older build saying its sources changed and building again; a build waiting for
the outputs lock says who holds it in one line and stops on Ctrl-C. The interleaving is made
deterministic by an action that blocks (in a `sleep` the test ends) only on the old content."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from eventlog import read_events
from processes import live_pids

pytestmark = pytest.mark.e2e


def _blocking_workspace(make_workspace, command, tmp_path: Path, marker: str) -> Path:
    # NB: `cat` copies the leaf into the output first; then, only on the old content, the
    # action blocks in a sleep carrying the marker, which the test kills to let it finish
    return make_workspace(
        tmp_path,
        {
            "leaf.txt": "old\n",
            "BUILD.toml": command(
                "t",
                cmd=(
                    f"cat $(SRCS) > $(OUT); if grep -q old $(SRCS); then sleep 300{marker}; fi;"
                    " true"
                ),
                srcs=["leaf.txt"],
                outs=["t.txt"],
            ),
        },
    )


def _start(rsi_argv, ws: Path, events: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [*rsi_argv, "build", "//:t", "--events", str(events), *extra],
        cwd=ws,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "RSI_SERVER": "0"},
    )


def _wait_for(pred, proc: subprocess.Popen, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert proc.poll() is None, f"{what}: the build ended early: {proc.communicate()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_an_older_build_never_exports_over_a_newer_one(make_workspace, command, tmp_path, rsi_argv):
    marker = f"{uuid.uuid4().int % 10**6:06d}"
    ws = _blocking_workspace(make_workspace, command, tmp_path, marker)
    a = _start(rsi_argv, ws, tmp_path / "a.jsonl")
    try:
        # NB: A's action has read the old leaf and blocks
        _wait_for(lambda: live_pids(f"sleep\0{300}{marker}"), a, "A's action to block")
        (ws / "leaf.txt").write_text("new\n")
        b = _start(rsi_argv, ws, tmp_path / "b.jsonl")
        out_b, err_b = b.communicate(timeout=120)
        assert b.returncode == 0, err_b
        assert (ws / "out" / "t.txt").read_text() == "new\n"
        for pid in live_pids(f"sleep\0{300}{marker}"):
            os.kill(pid, signal.SIGKILL)  # NB: A's action ends (its `; true` keeps it ok)
        out_a, err_a = a.communicate(timeout=120)
    finally:
        if a.poll() is None:
            a.kill()
            a.wait(10)
    # NB: A finished last: without the check it exported "old" over B's "new"
    assert (ws / "out" / "t.txt").read_text() == "new\n", (out_a, err_a)
    assert a.returncode == 0, err_a
    assert "sources changed during the build" in err_a and "leaf.txt" in err_a
    kinds = [e["kind"] for e in read_events(tmp_path / "a.jsonl")]
    changed = [e for e in read_events(tmp_path / "a.jsonl") if e["kind"] == "sources_changed"]
    assert changed and changed[0]["paths"] == [str(ws / "leaf.txt")] and changed[0]["again"]
    assert kinds[-1] == "build_finished"
    # NB: nothing running, and a plain build agrees that out/ is up to date
    again = subprocess.run(
        [*rsi_argv, "build", "//:t", "--json"],
        cwd=ws,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RSI_SERVER": "0"},
    )
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["counts"]["executed"] == 0
    assert (ws / "out" / "t.txt").read_text() == "new\n"


def test_a_build_that_saw_its_sources_change_says_so(make_workspace, command, tmp_path, rsi_argv):
    """No other build: the leaf changes while the only build runs; it builds again and exports
    the new content (the retry's action does not block)."""
    marker = f"{uuid.uuid4().int % 10**6:06d}"
    ws = _blocking_workspace(make_workspace, command, tmp_path, marker)
    a = _start(rsi_argv, ws, tmp_path / "a.jsonl")
    try:
        _wait_for(lambda: live_pids(f"sleep\0{300}{marker}"), a, "the action to block")
        (ws / "leaf.txt").write_text("new\n")
        for pid in live_pids(f"sleep\0{300}{marker}"):
            os.kill(pid, signal.SIGKILL)
        _, err = a.communicate(timeout=120)
    finally:
        if a.poll() is None:
            a.kill()
            a.wait(10)
    assert a.returncode == 0, err
    assert (ws / "out" / "t.txt").read_text() == "new\n"
    assert "sources changed during the build" in err


def test_a_wait_for_the_outputs_names_the_holder_and_stops_on_ctrl_c(
    make_workspace, command, tmp_path, rsi_argv
):
    ws = make_workspace(
        tmp_path,
        {"BUILD.toml": command("t", cmd="echo hi > $(OUT)", outs=["t.txt"])},
    )
    first = subprocess.run(
        [*rsi_argv, "build", "//:t"], cwd=ws, capture_output=True, text=True, timeout=120
    )
    assert first.returncode == 0, first.stderr
    from rsi import wslock

    path = wslock.lock_path(ws / "cache", ws / "out")
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "what": "//:other", "since": 0}).encode(), 0)
        waiter = _start(rsi_argv, ws, tmp_path / "w.jsonl")
        log = tmp_path / "w.jsonl"
        _wait_for(
            lambda: any(e["kind"] == "build_waiting" for e in read_events(log, True)),
            waiter,
            "the build to wait",
        )
        waiter.send_signal(signal.SIGINT)
        _, err = waiter.communicate(timeout=30)
    finally:
        os.close(fd)
    assert waiter.returncode == 130, err
    lines = [line for line in err.splitlines() if "waiting for" in line]
    assert len(lines) == 1, err
    assert f"pid {os.getpid()}" in lines[0] and "//:other" in lines[0] and "Ctrl-C" in lines[0]
    waiting = [e for e in read_events(tmp_path / "w.jsonl") if e["kind"] == "build_waiting"]
    assert waiting[0]["holder"]["pid"] == os.getpid()
    assert read_events(tmp_path / "w.jsonl")[-1]["kind"] == "build_finished"


def test_a_build_whose_sources_keep_changing_fails_and_exports_nothing(
    make_workspace, command, tmp_path, rsi_argv
):
    marker = f"{uuid.uuid4().int % 10**6:06d}"
    ws = make_workspace(
        tmp_path,
        {
            "leaf.txt": "v0\n",
            "BUILD.toml": command(
                "t",
                cmd=f"cat $(SRCS) > $(OUT); sleep 300{marker}; true",
                srcs=["leaf.txt"],
                outs=["t.txt"],
            ),
        },
    )
    a = _start(rsi_argv, ws, tmp_path / "a.jsonl")
    try:
        for attempt in range(1, 4):
            # NB: each attempt's action has read the leaf; it changes before the export
            _wait_for(lambda: live_pids(f"sleep\0{300}{marker}"), a, f"attempt {attempt}")
            (ws / "leaf.txt").write_text(f"v{attempt}\n")
            for pid in live_pids(f"sleep\0{300}{marker}"):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while live_pids(f"sleep\0{300}{marker}") and time.monotonic() < deadline:
                time.sleep(0.05)
        _, err = a.communicate(timeout=120)
    finally:
        for pid in live_pids(f"sleep\0{300}{marker}"):
            os.kill(pid, signal.SIGKILL)
        if a.poll() is None:
            a.kill()
            a.wait(10)
    assert a.returncode == 1, err
    assert "sources changed during the build" in err and "leaf.txt" in err
    assert not (ws / "out" / "t.txt").exists()
    events = read_events(tmp_path / "a.jsonl")
    assert [e["attempt"] for e in events if e["kind"] == "sources_changed"] == [1, 2]
    finished = [e for e in events if e["kind"] == "target_finished"]
    assert len(finished) == 1 and not finished[0]["ok"]
    assert finished[0]["failed"][0]["status"] == "sources_changed"
    assert events[-1]["kind"] == "build_finished" and not events[-1]["ok"]
