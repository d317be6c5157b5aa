"""Every action runs under a scratch limit and a memory limit (rsi.limits): going past either
is a failure of that action alone (`scratch_limit`, `memory_limit`), never an infrastructure
fault or a crash, and nothing of its scratch stays behind, in RAM least of all.

Limits here are small (16-48 MiB) and no action writes or allocates more than 96 MiB, so a
test that fails (no limit enforced) still cannot hurt the machine.
"""

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

from rsi.action import Action
from rsi.limits import MIB, Limits, cgroup_support
from rsi.store import LocalStore

LIMITS = "[limits]\nscratch_mb = 16\nmemory_mb = 48\n"
PATH = ("PATH", "/usr/bin:/bin")


def needs_cgroups() -> None:
    support = cgroup_support()
    if not support.version:
        pytest.skip(f"no memory cgroups here: {support.reason}")


def needs_pool() -> None:
    from rsi.executors.pool import pool_supported

    if not pool_supported():
        pytest.skip("persistent sandboxes need root (they run actions as uid 65534)")


@pytest.fixture(params=["persistent", "per-action"])
def mode(request, bwrap) -> dict[str, str]:
    """The environment that selects each bwrap path: a persistent slot or one per action."""
    if request.param == "persistent":
        needs_pool()
        return {"RSI_SANDBOX_POOL": "1"}
    return {"RSI_SANDBOX_POOL": "0"}


def failed_event(run, label: str) -> dict:
    [event] = [e for e in run.finished() if e["label"] == label]
    assert event["status"] == "failed", event  # NB: the action's failure, not "error" (infra)
    return event


@pytest.mark.e2e
@pytest.mark.parametrize("where", ["big", "/tmp/big", "/dev/shm/big"])
def test_writing_past_the_scratch_limit_fails_that_action_and_leaves_no_scratch(
    build, command, make_workspace, tmp_path, mode, where
):
    ws = make_workspace(
        tmp_path,
        {
            "BUILD.toml": command(
                "hog", cmd=f"head -c 40M /dev/zero > {where} && echo done > $(OUT)", outs=["o"]
            )
            + command("fine", cmd="head -c 4M /dev/zero > /tmp/x && echo ok > $(OUT)", outs=["f"])
        },
        config=LIMITS,
    )
    run = build(ws, "--keep-going", "//:hog", "//:fine", expect=1, env=mode)
    event = failed_event(run, "//:hog")
    assert event["reason"] == "scratch_limit", event
    assert event["message"].startswith("scratch_limit: "), event["message"]
    assert "16 MiB" in event["message"]
    assert run.executed == {"//:fine"}  # NB: under the limit is fine, in the same build
    assert list((ws / "cache" / "tmp").iterdir()) == []


@pytest.mark.e2e
def test_allocating_past_the_memory_limit_fails_that_action_and_the_host_is_fine(
    build, command, make_workspace, tmp_path, mode
):
    needs_cgroups()
    # NB: `tail -n 1` of a stream without newlines holds all of it in memory (96 MiB here)
    ws = make_workspace(
        tmp_path,
        {
            "BUILD.toml": command(
                "hog", cmd="head -c 96M /dev/zero | tail -n 1 > $(OUT)", outs=["o"]
            )
            + command("after", cmd="echo fine > $(OUT)", outs=["a"], deps=[])
        },
        config=LIMITS,
    )
    run = build(ws, "//:hog", expect=1, env=mode)
    event = failed_event(run, "//:hog")
    assert event["reason"] == "memory_limit", event
    assert event["message"].startswith("memory_limit: out of memory"), event["message"]
    assert "48 MiB" in event["message"]
    build(ws, "//:after", env=mode)  # NB: this rsi, its slots and the host go on
    assert (ws / "out" / "a").read_text() == "fine\n"


@pytest.mark.e2e
def test_scratch_on_a_slot_s_tmpfs_counts_against_memory_too(
    build, command, make_workspace, tmp_path
):
    """A slot's /tmp is RAM: with memory below scratch, filling it is `memory_limit` (even
    when the kernel picks the slot's runner), not a lost sandbox."""
    needs_cgroups()
    needs_pool()
    ws = make_workspace(
        tmp_path,
        {
            "BUILD.toml": command(
                "fill", cmd="head -c 80M /dev/zero > /tmp/f; echo > $(OUT)", outs=["o"]
            )
        },
        config="[limits]\nscratch_mb = 96\nmemory_mb = 24\n",
    )
    run = build(ws, "//:fill", expect=1)
    assert failed_event(run, "//:fill")["reason"] == "memory_limit"


@pytest.mark.fast
def test_the_limits_come_from_the_action_s_platform_first(tmp_path):
    """`scratch`/`memory` platform properties override the workspace's defaults."""
    limits = Limits(scratch_bytes=16 * MIB, memory_bytes=48 * MIB)
    mine = limits.for_action({"scratch": "8m", "memory": "1g"})
    assert (mine.scratch_bytes, mine.memory_bytes) == (8 * MIB, 1 << 30)
    assert limits.for_action({}) == limits


@pytest.mark.e2e
def test_every_process_of_an_action_is_in_its_own_memory_cgroup(tmp_path, bwrap):
    needs_cgroups()
    from rsi.executors.local import LocalExecutor
    from rsi.executors.pool import pool_supported

    store = LocalStore(tmp_path / "store")
    action = Action(
        argv=("/bin/sh", "-c", "(cat /proc/self/cgroup) > o"),
        outputs=("o",),
        env=(PATH,),
        label="//t:cg",
    )
    mine = Path("/proc/self/cgroup").read_text()
    for pool in (True, False) if pool_supported() else (False,):
        limits = Limits(scratch_bytes=16 * MIB, memory_bytes=64 * MIB)
        result = LocalExecutor(pool=pool, limits=limits).run(action, store)
        assert result.ok, result.failure
        seen = store.read_bytes(result.output_map["o"].digest).decode()
        assert _memory_cgroup(seen) != _memory_cgroup(mine), (pool, seen)
        assert f"/rsi-{os.getpid()}-" in seen, (pool, seen)
        facts = result.host["limits"]
        assert facts["memory_bytes"] == 64 * MIB and facts["memory"].startswith("cgroup v")
        assert facts["scratch_bytes"] == 16 * MIB
    support = cgroup_support()
    from rsi.executors import pool as pool_module

    pool_module.POOL.close()
    assert not [p for p in support.parent.iterdir() if p.name.startswith(f"rsi-{os.getpid()}-")]


def _memory_cgroup(proc_cgroup: str) -> list[str]:
    return [x for x in proc_cgroup.splitlines() if ":memory:" in x or x.startswith("0::")]


@pytest.mark.e2e
def test_a_slot_s_scratch_is_gone_after_each_action_and_never_on_the_host(tmp_path, bwrap):
    """The slot's files live in tmpfs mounts of its own namespace: emptied after every action,
    and never in a host folder that could outlive it."""
    needs_pool()
    from rsi.executors import pool as pool_module
    from rsi.executors.local import LocalExecutor

    store = LocalStore(tmp_path / "store")
    limits = Limits(scratch_bytes=16 * MIB, memory_bytes=64 * MIB)
    executor = LocalExecutor(pool=True, limits=limits)
    before = _host_slot_folders()
    used: list = []
    acquire = pool_module.POOL.acquire
    pool_module.POOL.acquire = lambda shape: used.append(acquire(shape)) or used[-1]
    try:
        for script in ("head -c 8M /dev/zero > junk; echo > o", "head -c 40M /dev/zero > big"):
            executor.run(Action(argv=("/bin/sh", "-c", script), outputs=("o",), env=(PATH,)), store)
            slot = used[-1]
            assert not slot.exec_dir.exists()
            st = os.statvfs(slot.root)
            assert (st.f_blocks - st.f_bfree) * st.f_frsize < MIB  # NB: nothing left in RAM
            assert st.f_blocks * st.f_frsize <= 16 * MIB + 64 * MIB  # NB: sized: scratch + inputs
    finally:
        pool_module.POOL.acquire = acquire
        pool_module.POOL.close()
    assert _host_slot_folders() == before


def _host_slot_folders() -> set[str]:
    from rsi.executors.pool import scratch_root

    root = scratch_root()
    return {p.name for p in root.iterdir()} if root.is_dir() else set()


@pytest.mark.e2e
def test_kill_9_leaves_no_scratch_of_a_slot_in_ram(
    make_workspace, command, build, rsi_argv, tmp_path, bwrap
):
    """rsi SIGKILLed while an action of a persistent slot has written scratch: the slot's
    namespace (and with it its tmpfs mounts) is gone, nothing of it is in a host folder, and
    the next build removes the killed build's cgroups."""
    needs_pool()
    marker = f"41{uuid.uuid4().int % 10**6:06d}"
    ws = make_workspace(
        tmp_path,
        {
            "BUILD.toml": command(
                "a",
                cmd=f"head -c 8M /dev/zero > /tmp/f; head -c 8M /dev/zero > w; "
                f"sleep {marker}; echo > $(OUT)",
                outs=["a"],
            )
            + command("quick", cmd="echo > $(OUT)", outs=["q"])
        },
        config=LIMITS,
    )
    proc = subprocess.Popen(
        [*rsi_argv, "build", "//:a"], cwd=ws, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        while not live_pids(f"sleep\0{marker}"):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.02)
        [pid] = live_pids(f"sleep\0{marker}")
        namespace = os.readlink(f"/proc/{pid}/ns/mnt")
        held = [p for p in _slot_folders_of(proc.pid)]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 10
    while _holders(namespace) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _holders(namespace) == []  # NB: the namespace, its tmpfs mounts with it, is gone
    assert held == [] and _slot_folders_of(proc.pid) == []
    support = cgroup_support()
    build(ws, "//:quick")
    if support.parent:
        assert not [p for p in support.parent.iterdir() if p.name.startswith(f"rsi-{proc.pid}-")]


def _slot_folders_of(pid: int) -> list[Path]:
    from rsi.executors.pool import scratch_root

    root = scratch_root()
    return [p for p in root.iterdir() if f"-{pid}-" in p.name] if root.is_dir() else []


def _holders(namespace: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/mnt") == namespace:
                    found.append(int(entry))
            except OSError:
                pass
    return found


@pytest.mark.fast
def test_limits_are_settings_and_rsi_info_reports_them(make_workspace, run_rsi, tmp_path):
    ws = make_workspace(tmp_path, config=LIMITS)
    doc = run_rsi(ws, "info", "--json").json()
    assert doc["limits"]["scratch_bytes"] == 16 * MIB
    assert doc["limits"]["memory_bytes"] == 48 * MIB
    support = cgroup_support()
    if support.version:
        assert doc["limits"]["memory"] == f"cgroup {support.version}"
    else:
        assert doc["limits"]["memory_not_enforced_because"] == support.reason
    human = run_rsi(ws, "info")
    assert human.returncode == 0 and "16 MiB per action" in human.stdout, human
    for bad, field in (
        ("scratch_mb = 0", "scratch_mb"),
        ("memory_mb = 1.5", "memory_mb"),
        ("swap_mb = 1", "swap_mb"),
    ):
        (ws / "rsi.toml").write_text(f"[limits]\n{bad}\n")
        run = run_rsi(ws, "info")
        assert run.returncode == 2 and f"field '{field}'" in run.stderr, run


@pytest.mark.fast
def test_rsi_info_says_when_memory_is_not_enforced(make_workspace, run_rsi, tmp_path):
    ws = make_workspace(tmp_path)
    run = run_rsi(ws, "info", "--json", env={"RSI_CGROUPS": "0"})
    doc = run.json()
    assert doc["limits"]["memory"] == "not enforced"
    assert "RSI_CGROUPS=0" in doc["limits"]["memory_not_enforced_because"]
    assert json.loads(run.stdout)["limits"]["memory_bytes"] > 0


@pytest.mark.fast
def test_cgroup_v2_makes_action_cgroups_next_to_rsi_s_own_or_says_why_not(tmp_path, monkeypatch):
    """The v2 choice, on a stand-in hierarchy: a cgroup holding processes cannot have children
    with controllers, so actions go in its parent (which has the memory controller when this
    one does); at the top, rsi enables it; without it, the reason is kept (this host may only
    have v1, where that branch runs for real)."""
    from rsi import limits

    top = tmp_path / "cg"
    ours = top / "system.slice" / "rsi.scope"
    ours.mkdir(parents=True)
    (top / "system.slice" / "cgroup.subtree_control").write_text("cpu memory pids\n")
    (ours / "cgroup.controllers").write_text("cpu memory pids\n")
    monkeypatch.delenv("RSI_CGROUPS", raising=False)
    monkeypatch.setattr(limits, "_own_cgroup_paths", lambda: [("v2", ours, False)])
    found = limits.cgroup_support.__wrapped__()
    assert (found.version, found.parent) == ("v2", top / "system.slice")
    assert not list((top / "system.slice").glob("rsi-*"))  # NB: the probe cleaned up

    (top / "cgroup.controllers").write_text("cpu memory\n")
    (top / "cgroup.subtree_control").write_text("cpu\n")
    monkeypatch.setattr(limits, "_own_cgroup_paths", lambda: [("v2", top, True)])
    found = limits.cgroup_support.__wrapped__()
    assert (found.version, found.parent) == ("v2", top)
    assert (top / "cgroup.subtree_control").read_text() == "+memory"

    (ours / "cgroup.controllers").write_text("cpu pids\n")
    monkeypatch.setattr(limits, "_own_cgroup_paths", lambda: [("v2", ours, False)])
    found = limits.cgroup_support.__wrapped__()
    assert found.version is None and "has no memory controller" in found.reason
    monkeypatch.setenv("RSI_CGROUPS", "0")
    assert "RSI_CGROUPS=0" in limits.cgroup_support.__wrapped__().reason
