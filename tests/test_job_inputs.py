"""A build job's key covers its inputs (rsi/inputs.py, rsi/jobs/kinds.py): a submit attaches to
a live job only when the declarations and sources it would read are the same; after an edit it
is a new run, whose output and artifact are the new content. Real detached runners; the first
job's action blocks (in a `sleep` the test ends) only on the old content."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from processes import live_pids

pytestmark = pytest.mark.e2e


def _rsi_json(rsi_argv, ws: Path, *args: str, timeout: float = 120) -> dict:
    proc = subprocess.run(
        [*rsi_argv, *args, "--json"],
        cwd=ws,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc
    return json.loads(proc.stdout)


def test_a_submit_after_an_edit_is_a_new_run_with_the_new_output(
    make_workspace, command, tmp_path, rsi_argv
):
    marker = f"{uuid.uuid4().int % 10**6:06d}"
    ws = make_workspace(
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
    first = _rsi_json(rsi_argv, ws, "job", "submit", "//:t")
    try:
        deadline = time.monotonic() + 60
        while not live_pids(f"sleep\0{300}{marker}"):
            assert time.monotonic() < deadline, "the first job's action never started"
            time.sleep(0.05)
        # NB: the same inputs attach to the running job
        same = _rsi_json(rsi_argv, ws, "job", "submit", "//:t")
        assert same["attached"] and same["id"] == first["id"]
        (ws / "leaf.txt").write_text("new\n")
        # NB: without the inputs in the key this attached to the blocked job and waited on it
        second = _rsi_json(rsi_argv, ws, "job", "submit", "//:t", "--wait", timeout=90)
        assert second["id"] != first["id"] and not second["attached"], second
        assert second["state"] == "succeeded", second
        got = _rsi_json(rsi_argv, ws, "job", "artifact", second["id"], "t.txt")
        assert got["text"] == "new\n"
        assert (ws / "out" / "t.txt").read_text() == "new\n"
    finally:
        for pid in live_pids(f"sleep\0{300}{marker}"):
            os.kill(pid, signal.SIGKILL)
    # NB: the first job, older, ends last: it builds again and leaves out/ new
    done = _rsi_json(rsi_argv, ws, "job", "wait", first["id"], "--timeout", "120", timeout=150)
    assert done["state"] == "succeeded", done
    assert (ws / "out" / "t.txt").read_text() == "new\n"
