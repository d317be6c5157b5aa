"""A build stopped by SIGINT (Ctrl-C) or SIGTERM (a CI job cancelled, `kill`): it exits at once
with 128 + the signal, its event log still ends with `build_finished` saying why, no process of
its actions is left running, and what finished before the signal stays cached."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid

import pytest
from eventlog import read_events
from processes import live_pids

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signalled_build_reports_why_it_ended_and_leaves_nothing_running(
    sig, build, command, make_workspace, rsi_argv, tmp_path
):
    marker = f"{uuid.uuid4().int % 10**6:06d}"
    ws = make_workspace(
        tmp_path,
        {
            "BUILD.toml": command("quick", cmd="echo quick > $(OUT)", outs=["q.txt"])
            + command(
                "long",
                cmd=f"(setsid sleep 91{marker} &); sleep 90{marker}; echo > $(OUT)",
                outs=["l.txt"],
                deps=[":quick"],
            )
        },
    )
    events = tmp_path / "events.jsonl"
    proc = subprocess.Popen(
        [*rsi_argv, "build", "//:long", "--events", str(events)],
        cwd=ws,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        # NB: "sleep\0" + marker matches the sleeps themselves, not the shell around them
        while not (live_pids(f"sleep\0{90}{marker}") and live_pids(f"sleep\0{91}{marker}")):
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr
            time.sleep(0.05)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    try:
        assert proc.returncode == 128 + sig, stderr
        deadline = time.monotonic() + 10
        while (live_pids(f"90{marker}") or live_pids(f"91{marker}")) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.05)
        assert live_pids(f"90{marker}") == [] and live_pids(f"91{marker}") == []
    finally:
        for pid in live_pids(f"90{marker}") + live_pids(f"91{marker}"):
            os.kill(pid, signal.SIGKILL)
    last = read_events(events, partial=True)[-1]
    assert last["kind"] == "build_finished" and last["ok"] is False
    assert last["reason"] == "interrupted" and last["signal"] == sig.name
    assert last["counts"]["actions"] == 2
    assert "Traceback" not in stderr
    again = build(ws, "//:quick")
    assert again.cached == {"//:quick"}  # what finished before the signal was kept
