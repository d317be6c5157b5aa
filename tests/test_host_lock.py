"""The machine-wide lock timing actions take (RSI_HOST_LOCK): a build waiting on it says who
holds it (event and stderr), Ctrl-C ends the wait at once, `--lock-timeout` bounds it, and this
test suite uses a lock of its own. The holder is always a real `rsi build` subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from eventlog import read_events

from rsi.host import DEFAULT_HOST_LOCK, HostLock


def _until(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


@pytest.fixture
def start_holder(make_workspace, command, rsi_argv, tmp_path):
    """Starts a real build holding the host lock (exclusively: a long timing action; shared: a
    long ordinary one) in its own workspace; returns its process once it holds the lock, and
    stops it afterwards."""
    procs: list[subprocess.Popen] = []

    def start(exclusive: bool = True) -> subprocess.Popen:
        tags = ["exclusive"] if exclusive else []
        marker = uuid.uuid4().hex[:8]
        ws = make_workspace(
            tmp_path,
            {
                "BUILD.toml": command(
                    "hold", cmd=f"sleep 120 # {marker}\necho > $(OUT)", outs=["h"], tags=tags
                )
            },
            name="holder",
        )
        proc = subprocess.Popen(
            [*rsi_argv, "build", "//:hold"],
            cwd=ws,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs.append(proc)
        lock = HostLock()
        _until(
            lambda: (
                any(h.pid == proc.pid and h.exclusive == exclusive for h in lock.holders())
                or proc.poll() is not None
            ),
            "the holder build holds the host lock",
        )
        assert proc.poll() is None, "the holder build ended early"
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


@pytest.fixture
def holder(start_holder) -> subprocess.Popen:
    return start_holder(exclusive=True)


@pytest.fixture
def waiter(make_workspace, command, tmp_path):
    """A workspace whose only target is a quick timing action (it needs the lock alone)."""
    return make_workspace(
        tmp_path,
        {"BUILD.toml": command("time", cmd="echo > $(OUT)", outs=["t"], tags=["exclusive"])},
        name="waiter",
    )


@pytest.mark.fast
def test_the_suite_uses_a_host_lock_of_its_own():
    path = os.environ.get("RSI_HOST_LOCK")
    assert path and path != DEFAULT_HOST_LOCK
    assert Path(path).parent.name.startswith("rsi-test-hostlock-")
    assert HostLock().path == Path(path)


@pytest.mark.e2e
def test_a_build_waiting_for_the_host_lock_says_who_holds_it(build, holder, waiter):
    t0 = time.monotonic()
    run = build(waiter, "//:time", "--lock-timeout", "3", expect=1, timeout=60)
    assert time.monotonic() - t0 < 30
    waits = [e for e in run.events if e["kind"] == "host_lock_wait"]
    assert waits, run
    assert waits[0]["label"] == "//:time" and waits[0]["mode"] == "exclusive"
    assert waits[0]["lock"] == os.environ["RSI_HOST_LOCK"]
    [held] = waits[0]["holders"]
    assert held["pid"] == holder.pid and held["label"] == "//:hold"
    assert held["mode"] == "exclusive" and held["since"] <= waits[0]["time"]
    assert f"held by pid {holder.pid} //:hold (exclusive, for " in run.stderr
    # NB: one line per wait of a few seconds, not one per poll
    assert run.stderr.count("waits for the host lock") == 1, run.stderr


@pytest.mark.e2e
def test_a_timing_action_waiting_on_ordinary_actions_names_their_build(build, start_holder, waiter):
    other = start_holder(exclusive=False)
    run = build(waiter, "//:time", "--lock-timeout", "2", expect=1, timeout=60)
    waits = [e for e in run.events if e["kind"] == "host_lock_wait"]
    assert waits, run
    [held] = waits[0]["holders"]
    assert held["pid"] == other.pid and held["mode"] == "shared"
    assert held["label"] == "//:hold" and held["since"] <= waits[0]["time"]
    assert f"held by pid {other.pid} //:hold (shared, for " in run.stderr


@pytest.mark.e2e
def test_lock_timeout_fails_the_action_clearly_and_runs_nothing(build, holder, waiter):
    run = build(waiter, "//:time", "--lock-timeout", "1", expect=1, timeout=60)
    [finished] = run.finished()
    assert finished["status"] == "error" and finished["retryable"] is True
    assert "waiting for the host lock" in finished["message"]
    assert f"pid {holder.pid}" in finished["message"]
    assert not (waiter / "out" / "t").exists()
    assert run.events[-1]["kind"] == "build_finished" and run.events[-1]["ok"] is False
    assert holder.poll() is None  # the holder was never disturbed


@pytest.mark.fast
def test_a_lock_timeout_that_is_not_a_number_of_seconds_is_a_usage_error(run_rsi, waiter):
    for bad in ("-1", "nan", "soon"):
        run = run_rsi(waiter, "build", "//:time", "--lock-timeout", bad)
        assert run.returncode == 2, run
        assert "Traceback" not in run.stderr


@pytest.mark.e2e
def test_ctrl_c_while_waiting_for_the_host_lock_exits_at_once(holder, waiter, rsi_argv):
    events = waiter.parent / "waiter-events.jsonl"
    proc = subprocess.Popen(
        [*rsi_argv, "build", "//:time", "--events", str(events)],
        cwd=waiter,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _until(
            lambda: (
                any(e["kind"] == "action_started" for e in read_events(events, partial=True))
                or proc.poll() is not None
            ),
            "the timing action is about to run",
        )
        started = time.monotonic()
        while time.monotonic() - started < 5 and not any(
            e["kind"] == "host_lock_wait" for e in read_events(events, partial=True)
        ):
            time.sleep(0.05)
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 130, stderr
    last = read_events(events, partial=True)[-1]
    assert last["kind"] == "build_finished" and last["ok"] is False
    assert last["reason"] == "interrupted" and last["signal"] == "SIGINT"
    assert holder.poll() is None


@pytest.mark.e2e
def test_a_waiting_build_goes_on_once_the_holder_is_done(build, holder, waiter):
    import threading

    def stop_holder() -> None:
        time.sleep(2)
        holder.send_signal(signal.SIGINT)

    threading.Thread(target=stop_holder, daemon=True).start()
    run = build(waiter, "//:time", timeout=60)
    kinds = [e["kind"] for e in run.events]
    assert "host_lock_wait" in kinds and "host_lock_acquired" in kinds
    acquired = next(e for e in run.events if e["kind"] == "host_lock_acquired")
    assert acquired["waited_s"] >= 1
    assert (waiter / "out" / "t").exists()


@pytest.mark.fast
def test_round_and_campaign_final_take_a_lock_timeout(run_rsi, waiter):
    for args in (("round", "--help"), ("campaign", "final", "--help")):
        run = run_rsi(waiter, *args)
        assert run.returncode == 0, run
        assert "--lock-timeout" in run.stdout
