"""Real BuildGrid 0.4.4 servers for the remote tests, started once per session on free
loopback ports: a cache-only one (CAS + AC in memory) and, for execution, one backed by its
own PostgreSQL plus an in-process `rsi worker`. Skips, with the reason, only when BuildGrid
cannot be installed (scripts/buildgrid/setup.sh)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "buildgrid"))

import servers


def _ensure_buildgrid() -> None:
    if servers.BGD.exists():
        return
    if os.environ.get("RSI_BUILDGRID_AUTOINSTALL", "1") == "1":
        subprocess.run(
            ["bash", str(ROOT / "scripts/buildgrid/setup.sh")], capture_output=True, check=False
        )
    if not servers.BGD.exists():
        reason = f"BuildGrid is not installed at {servers.BGD} (run scripts/buildgrid/setup.sh)"
        if os.environ.get("RSI_REQUIRE_BUILDGRID") == "1":
            pytest.fail(f"RSI_REQUIRE_BUILDGRID=1 but {reason}")
        pytest.skip(reason)


@pytest.fixture(scope="session")
def cache_server():
    _ensure_buildgrid()
    with servers.BuildGridServer("cache") as server:
        yield server


@pytest.fixture(scope="session")
def exec_server():
    _ensure_buildgrid()
    try:
        server = servers.BuildGridServer("execution").start()
    except servers.Unavailable as exc:
        pytest.skip(str(exc))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def worker(exec_server, tmp_path_factory):
    """One `rsi worker` (local executor) serving the execution server."""
    from rsi.worker import Worker

    events: list[dict] = []
    bot = Worker(
        exec_server.url,
        tmp_path_factory.mktemp("worker"),
        on_event=events.append,
        poll_timeout_s=5.0,
    )
    stop = threading.Event()
    thread = threading.Thread(target=bot.run, args=(stop,), daemon=True)
    thread.start()
    bot.events = events
    yield bot
    stop.set()
    thread.join(timeout=15)
