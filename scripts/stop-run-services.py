#!/usr/bin/env python3
"""Stop what one `./scripts/test.sh` run started and left running: dockerd (and the containerd
it started), BuildGrid servers and their PostgreSQL, anything else.

    scripts/stop-run-services.py RUN_ID

test.sh exports RSI_TEST_RUN_ID=<RUN_ID> before it starts anything, so every process the run
starts carries it in its environment (/proc/PID/environ holds the environment a process was
started with); a service that was already running before the run does not, and is left alone.
Called once the tests have ended, so whatever still carries the id is a leftover. dockerd gets
SIGTERM first, alone, so that it stops its containers and its containerd itself; then the rest
get SIGTERM, and SIGKILL after a grace period. Prints one line per process it stopped.
Stdlib only (it runs even when .venv could not be set up). Needs to read other processes'
environments: as root, every process; otherwise only the caller's own.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def _ancestors() -> set[int]:
    """This process and every process above it (test.sh itself carries the id)."""
    found, pid = set(), os.getpid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return found


def carrying(run_id: str) -> dict[int, str]:
    """{pid: command line} of live processes started with RSI_TEST_RUN_ID=run_id."""
    needle = f"RSI_TEST_RUN_ID={run_id}".encode()
    skip = _ancestors()
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in skip:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone, or not ours to read
            continue
        if cmd:  # a zombie has an empty command line: nothing to stop
            found[int(name)] = cmd
    return found


def _signal(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _wait_gone(run_id: str, pids: set[int], timeout_s: float) -> set[int]:
    deadline = time.monotonic() + timeout_s
    while True:
        alive = pids & set(carrying(run_id))
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.2)


def stop(run_id: str) -> int:
    left = carrying(run_id)
    if not left:
        return 0
    for pid, cmd in sorted(left.items()):
        print(f"test.sh: stopping what this run started: {pid} {cmd[:120]}", file=sys.stderr)
    daemons = {pid for pid, cmd in left.items() if os.path.basename(cmd.split()[0]) == "dockerd"}
    _signal(daemons, signal.SIGTERM)
    _wait_gone(run_id, daemons, 30)
    rest = set(carrying(run_id))
    _signal(rest, signal.SIGTERM)
    stubborn = _wait_gone(run_id, rest | daemons, 15)
    _signal(stubborn, signal.SIGKILL)
    stubborn = _wait_gone(run_id, stubborn, 5)
    for pid in sorted(stubborn):
        print(f"test.sh: {pid} is still running after SIGKILL", file=sys.stderr)
    # NB: a stopped daemon whose parent had exited is reaped by init a moment later; until then
    # it still shows in `pgrep` as <defunct>
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in left):
        time.sleep(0.1)
    return 1 if stubborn else 0


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1]:
        sys.exit(f"usage: {sys.argv[0]} RUN_ID")
    sys.exit(stop(sys.argv[1]))
