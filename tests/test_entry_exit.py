"""The console script's plain `rsi build TARGET...` ends without the interpreter's teardown
(rsi/entry.py `_leave`): what it printed, its exit code, its event log, the build state and
the sandbox slots it started must all be exactly as a normal exit leaves them, and a profiler
or coverage tool running it still gets to write its findings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bwrap")]

RSI = str(Path(sys.executable).with_name("rsi"))


@pytest.fixture
def ws(command, make_workspace, tmp_path):
    return make_workspace(
        tmp_path,
        {
            "in.txt": "hello\n",
            "BUILD.toml": command("a", srcs=["in.txt"], outs=["a.out"], cmd="cat in.txt > a.out")
            + "\n"
            + command("b", deps=[":a"], outs=["b.out"], cmd="cat a.out a.out > b.out")
            + "\n"
            + command("bad", outs=["x"], cmd="echo no >&2; exit 3"),
        },
    )


def _rsi(ws: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RSI_HOST_LOCK": str(tmp_path / "host.lock")}
    env.pop("RSI_SERVER", None)
    return subprocess.run(
        [RSI, *args], cwd=ws, env=env, capture_output=True, text=True, timeout=120
    )


def _last_log(ws: Path) -> list[dict]:
    logs = sorted((ws / "cache" / "events").glob("*.jsonl"), key=lambda p: p.stat().st_mtime_ns)
    return [json.loads(line) for line in logs[-1].read_text().splitlines()]


def _slot_processes() -> set[int]:
    """Running sandbox slots (bwrap with a runner as pid 1), by pid."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmd and cmd[0].endswith(b"bwrap") and b"--as-pid-1" in cmd:
                found.add(int(entry))
    return found


def test_a_plain_build_exits_as_a_normal_exit_would(ws, tmp_path):
    before = _slot_processes()
    run = _rsi(ws, tmp_path, "build", "//:b")
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0] == "//:b: ok (miss)"
    assert run.stdout.rstrip().endswith(")") and "2 executed" in run.stdout
    assert (ws / "out" / "b.out").read_text() == "hello\nhello\n"
    log = _last_log(ws)
    assert log[-1]["kind"] == "build_finished" and log[-1]["ok"] is True
    # NB: nothing it wrote was lost: the next build is served by the state it saved
    again = _rsi(ws, tmp_path, "build", "//:b")
    assert again.returncode == 0 and "//:b: ok (hit)" in again.stdout
    assert not _slot_processes() - before  # NB: its sandbox slots ended with it


def test_a_failed_plain_build_keeps_its_exit_code_and_messages(ws, tmp_path):
    run = _rsi(ws, tmp_path, "build", "//:bad")
    assert run.returncode == 1
    assert "//:bad: FAILED" in run.stdout and "exited with code 3" in run.stdout
    assert _last_log(ws)[-1]["ok"] is False
    wrong = _rsi(ws, tmp_path, "build", "//:nope")
    assert wrong.returncode == 2 and "rsi: error:" in wrong.stderr


def test_a_closed_stdout_is_reported_as_the_interpreter_would(ws, tmp_path):
    """Output to a reader that went away: the exit code says the write failed (120, as
    Python's own exit says when its last flush fails, or 1 from the failed print)."""
    env = {**os.environ, "RSI_HOST_LOCK": str(tmp_path / "host.lock")}
    proc = subprocess.Popen(
        [RSI, "build", "//:b"], cwd=ws, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    proc.stdout.close()  # NB: before it writes a line
    proc.wait(timeout=120)
    assert proc.returncode != 0
    assert (ws / "out" / "b.out").exists()


def test_a_profiler_still_writes_its_findings(ws, tmp_path):
    out = tmp_path / "build.prof"
    env = {**os.environ, "RSI_HOST_LOCK": str(tmp_path / "host.lock")}
    run = subprocess.run(
        [sys.executable, "-m", "cProfile", "-o", str(out), RSI, "build", "//:b"],
        cwd=ws,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert out.stat().st_size > 0
