"""Durable jobs (`rsi job`, docs/jobs.md): profiles and budget accounting, the jobs database
under concurrent clients, and real detached runners: surviving the submitting shell, kill -9
and resume with nothing cached re-executed, cancel leaving no process and no scratch, each
budget stopping a job with its name, 20 concurrent submits."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from eventlog import read_events
from processes import live_pids
from small_task import FAST, small_task_files

from rsi.errors import DeclarationError
from rsi.jobs import contain
from rsi.jobs.profile import BudgetStop, Ledger, load_profile, parse_profile

# ================================================================================ helpers


@pytest.fixture
def job_env(tmp_path, monkeypatch):
    """Environment for every rsi subprocess of a test: its own host lock, and every runner it
    starts is killed (and its cgroup removed) when the test ends, whatever happened."""
    env = {"RSI_HOST_LOCK": str(tmp_path / "host.lock")}
    monkeypatch.setenv("RSI_HOST_LOCK", env["RSI_HOST_LOCK"])
    stores: list[Path] = []
    yield env, stores
    from rsi.jobs.db import JobDB
    from rsi.jobs.service import cleanup_job

    for store in stores:
        if not (store / "jobs" / "jobs.db").exists():
            continue
        with JobDB(store) as db:
            for job in db.all():
                if job["state"] in ("queued", "running") or job["cgroups"]:
                    cleanup_job(store, job, wait_s=5)


def rsi(ws: Path, env: dict, *args: str, expect: int | None = 0, timeout: float = 120):
    proc = subprocess.run(
        [sys.executable, "-m", "rsi.cli", *args],
        cwd=ws,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    if expect is not None:
        assert proc.returncode == expect, f"rsi {' '.join(args)}: {proc.returncode}\n{proc}"
    return proc


def rsi_json(ws: Path, env: dict, *args: str, expect: int | None = 0, timeout: float = 120):
    proc = rsi(ws, env, *args, "--json", expect=expect, timeout=timeout)
    return json.loads(proc.stdout)


def workspace(make_workspace, command, tmp_path, stores, marker: str, extra: str = "") -> Path:
    ws = make_workspace(
        tmp_path,
        {
            "BUILD.toml": command("quick", cmd="echo quick > $(OUT)", outs=["q.txt"])
            + command(
                "slow",
                cmd=f"sleep 2.{marker}; cat $(location :quick) > $(OUT)",
                outs=["s.txt"],
                deps=[":quick"],
            )
            + command(
                "hang",
                cmd=f"(setsid sleep 91{marker} &); sleep 90{marker}; echo > $(OUT)",
                outs=["h.txt"],
                deps=[":quick"],
            )
            + extra
        },
    )
    stores.append(ws / "cache")
    return ws


def wait_for(pred, timeout: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def events_of(ws: Path, job: str) -> list[dict]:
    return read_events(ws / "cache" / "jobs" / job / "events.jsonl", partial=True)


def finished_runner(doc: dict) -> None:
    """The job ended and its runner process is gone."""
    for pid in doc["runner"]["pids"]:
        wait_for(
            lambda pid=pid: (
                not os.path.exists(f"/proc/{pid}")
                or Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
            ),
            10,
            f"runner {pid} to exit",
        )


def no_scratch_of(ws: Path, pids: list[int]) -> None:
    tmp = ws / "cache" / "tmp"
    left = [e.name for e in tmp.iterdir() if e.name.split("-")[1:2] in ([str(p)] for p in pids)]
    assert left == [], left


# ======================================================================== profiles, budgets

PROFILE = b"""
doc = "test"
[budget]
rounds = 2
tokens = 1000
money_usd = 0.5
wall_s = 60
action_timeout_s = 5.5
retries = 1
disk_bytes = "2m"
memory_bytes = 1048576
[prices]
input_per_mtok = 100.0
output_per_mtok = 200.0
"""


@pytest.mark.fast
def test_a_profile_is_validated_and_addressed_by_its_bytes(tmp_path):
    p = parse_profile(PROFILE, name="t", path="profiles/t.toml")
    assert p.budget["disk_bytes"] == 2 << 20 and p.budget["memory_bytes"] == 1 << 20
    assert p.budget["wall_s"] == 60 and p.prices["input_per_mtok"] == 100.0
    again = parse_profile(PROFILE, name="other", path=None)
    assert again.digest == p.digest  # NB: by content, not by name
    changed = parse_profile(PROFILE.replace(b"rounds = 2", b"rounds = 3"), name="t", path=None)
    assert changed.digest != p.digest  # NB: changing a profile is a new profile
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "t.toml").write_bytes(PROFILE)
    assert load_profile(tmp_path, "t").digest == p.digest
    assert load_profile(tmp_path, None).budget == {}  # NB: no default.toml: no budget
    (tmp_path / "profiles" / "default.toml").write_bytes(b"[budget]\nrounds = 1\n")
    assert load_profile(tmp_path, None).budget == {"rounds": 1}


@pytest.mark.fast
@pytest.mark.parametrize(
    "text, field",
    [
        (b"[budget]\nround = 1\n", "budget.round"),
        (b"[budget]\nrounds = -1\n", "budget.rounds"),
        (b"[budget]\nrounds = 1.5\n", "budget.rounds"),
        (b"[budget]\ntokens = true\n", "budget.tokens"),
        (b"[budget]\nwall_s = 0\n", "budget.wall_s"),
        (b'[budget]\ndisk_bytes = "lots"\n', "budget.disk_bytes"),
        (b"[prices]\nper_token = 1\n", "prices.per_token"),
        (b"budget = 3\n", "budget"),
        (b"[limits]\n", "limits"),
        (b'executor = "cluster"\n', "executor"),
    ],
)
def test_profile_errors_name_the_file_and_the_field(text, field):
    with pytest.raises(DeclarationError) as err:
        parse_profile(text, name="p", path="/ws/profiles/p.toml")
    assert "/ws/profiles/p.toml" in str(err.value) and f"'{field}'" in str(err.value)


@pytest.mark.fast
def test_a_profile_may_say_where_its_jobs_run():
    prof = parse_profile(b'executor = "slurm"\n[budget]\nrounds = 2\n', name="p", path=None)
    assert prof.executor == "slurm" and prof.to_json()["executor"] == "slurm"
    assert parse_profile(b"", name="none", path=None).executor is None


@pytest.mark.fast
def test_not_toml_and_a_missing_profile_are_clear(tmp_path):
    with pytest.raises(DeclarationError, match="not valid TOML"):
        parse_profile(b"[budget\n", name="p", path="p.toml")
    with pytest.raises(Exception, match="no such profile"):
        load_profile(tmp_path, "nightly")


def _ledger(**budget) -> Ledger:
    text = "[budget]\n" + "".join(f"{k} = {v!r}\n" for k, v in budget.items())
    text += "[prices]\ninput_per_mtok = 1000.0\noutput_per_mtok = 2000.0\n"
    return Ledger(parse_profile(text.encode(), name="t", path=None))


USAGE = {"tokens": {"input": 100, "output": 50, "cached": None}, "calls": 2}


@pytest.mark.fast
def test_each_counted_budget_stops_at_its_limit_naming_it():
    led = _ledger(rounds=2)
    led.charge_round(USAGE, "round 1")
    led.charge_round(USAGE, "round 2")
    with pytest.raises(BudgetStop) as stop:
        led.charge_round(USAGE, "round 3")
    assert stop.value.reason == "budget:rounds" and stop.value.used == 2
    led = _ledger(tokens=300)
    led.charge_round(USAGE, "round 1")
    led.charge_round(USAGE, "round 2")
    assert led.used["tokens"] == 300
    with pytest.raises(BudgetStop, match="tokens = 300 reached"):
        led.charge_round(USAGE, "round 3")
    led = _ledger(calls=3)
    led.charge_round(USAGE, "round 1")
    with pytest.raises(BudgetStop) as stop:
        led.charge_round(USAGE, "round 2")
    assert stop.value.reason == "budget:calls"
    # NB: 100 input tokens at 1000 USD/Mtok + 50 output at 2000 USD/Mtok = 0.2 USD a round
    led = _ledger(money_usd=0.5)
    led.charge_round(USAGE, "round 1")
    led.charge_round(USAGE, "round 2")
    with pytest.raises(BudgetStop) as stop:
        led.charge_round(USAGE, "round 3")
    assert stop.value.reason == "budget:money_usd" and stop.value.used == pytest.approx(0.4)
    led = _ledger(retries=1)
    led.charge_retry("retry 1")
    with pytest.raises(BudgetStop, match="retries"):
        led.charge_retry("retry 2")
    led = _ledger(wall_s=10)
    led.check_wall(9.9)
    with pytest.raises(BudgetStop) as stop:
        led.check_wall(10.0)
    assert stop.value.reason == "budget:wall_s"
    for name in ("disk_bytes", "memory_bytes", "action_timeout_s"):
        led = _ledger(**{name: 100})
        led.check_amount(name, 99, "x")
        with pytest.raises(BudgetStop) as stop:
            led.check_amount(name, 100, "x")
        assert stop.value.reason == f"budget:{name}"


@pytest.mark.fast
def test_unknown_usage_is_never_counted_as_zero():
    unknown = {"tokens": {"input": None, "output": None, "cached": None}, "calls": None}
    led = _ledger(tokens=10**9)
    with pytest.raises(BudgetStop) as stop:
        led.charge_round(unknown, "round 1")
    assert stop.value.reason == "budget:tokens" and stop.value.used is None
    assert "unknown" in stop.value.message
    # NB: without a budget, unknown stays unknown (null), and so does every later total
    led = _ledger()
    led.charge_round(unknown, "round 1")
    led.charge_round(USAGE, "round 2")
    assert led.used["tokens"] is None and led.used["calls"] is None and led.used["rounds"] == 2
    # NB: money needs prices for every part: cached tokens priced separately but not reported
    text = b"[budget]\nmoney_usd = 5.0\n[prices]\ninput_per_mtok = 1.0\noutput_per_mtok = 1.0\n"
    text += b"cached_per_mtok = 0.1\n"
    led = Ledger(parse_profile(text, name="t", path=None))
    with pytest.raises(BudgetStop, match="money_usd"):
        led.charge_round(USAGE, "round 1")
    # NB: and a real 0 is a value
    zero = {"tokens": {"input": 0, "output": 0, "cached": 0}, "calls": 0}
    led = _ledger(tokens=0, calls=0)
    led.charge_round(zero, "round 1")
    assert led.used["tokens"] == 0 and led.used["calls"] == 0


# ================================================================= database, state, events


@pytest.mark.fast
def test_concurrent_submits_get_one_job_per_input_and_the_database_stays_whole(
    tmp_path, monkeypatch
):
    from rsi.jobs import service
    from rsi.jobs.db import JobDB
    from rsi.workspace import Workspace

    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "rsi.toml").write_text("")
    ws = Workspace.load(tmp_path / "ws").with_overrides()
    started: list[str] = []
    monkeypatch.setattr(
        contain, "plan_cgroups", lambda job: {"containment": "session", "cgroups": [], "join": []}
    )
    monkeypatch.setattr(
        service, "_start_runner", lambda db, root, job, plan, cwd: started.append(job)
    )
    docs: dict[int, dict] = {}
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            docs[i] = service.submit(ws, "build", {"targets": [f"//:t{i % 10}"]})
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    by_target: dict[str, set[str]] = {}
    for i, doc in docs.items():
        by_target.setdefault(f"t{i % 10}", set()).add(doc["id"])
    assert all(len(ids) == 1 for ids in by_target.values()), by_target
    assert len({d["id"] for d in docs.values()}) == 10 == len(started)
    assert sum(d["attached"] for d in docs.values()) == 10
    with JobDB(ws.store_dir) as db:
        assert db.integrity() == "ok" and len(db.all()) == 10
    # NB: a queued record whose runner was never recorded is interrupted once the grace ends
    job = service.status(ws, started[0])
    assert job["state"] == "queued"
    monkeypatch.setattr(service, "QUEUE_GRACE_S", 0.0)
    assert service.status(ws, started[0])["state"] == "interrupted"


@pytest.mark.fast
def test_a_runner_is_recognised_by_pid_start_time_and_boot():
    me, ticks, boot = os.getpid(), contain.proc_start_ticks(os.getpid()), contain.boot_id()
    assert contain.same_process(me, ticks, boot)
    assert not contain.same_process(me, ticks + 1, boot)  # NB: the pid was reused
    assert not contain.same_process(me, ticks, "another-boot")  # NB: rebooted
    assert not contain.same_process(2**22 + 17, None, boot)
    assert not contain.same_process(None, None, boot)


@pytest.mark.fast
def test_build_events_are_renumbered_into_the_job_stream_and_read_by_cursor(tmp_path):
    from rsi.events import EventLog
    from rsi.jobs.events import JobEvents, read_events

    path = tmp_path / "events.jsonl"
    seen: list[str] = []
    stream = JobEvents(path, observe=lambda e: seen.append(e["kind"]))
    root = stream.emit("job_started", None, job="j-1")
    stream.parent_for_builds = root
    for _ in range(2):  # NB: two builds, each numbering its events from 1
        log = EventLog(None, also=stream, progress=False, list_hits=True)
        b = log.emit("build_started", build_id="b")
        log.emit_hits(b, [("//:a#C", "//:a", "C", "k/1"), ("//:b#C", "//:b", "C", "k/2")])
        log.emit("build_finished", b, ok=True)
        log.close()  # NB: a build closing its log leaves the job's stream open
    stream.emit("job_finished", root, state="succeeded")
    stream.finish()
    events, _ = read_events(path)
    assert [e["id"] for e in events] == list(range(1, 11))
    assert {e["schema"] for e in events} == {"rsi.events/1"}
    starts = [e for e in events if e["kind"] == "build_started"]
    assert [e["parent"] for e in starts] == [root, root]
    hits = [e for e in events if e["kind"] == "action_finished"]
    assert [h["parent"] for h in hits] == [starts[0]["id"]] * 2 + [starts[1]["id"]] * 2
    assert seen.count("action_finished") == 4
    after, _ = read_events(path, after=7)
    assert [e["id"] for e in after] == [8, 9, 10]
    # NB: a resumed job appends to the same stream, going on from the last id
    assert JobEvents(path).emit("job_started", None) == 11


# ============================================================================ real runners


@pytest.mark.e2e
def test_a_job_outlives_the_shell_that_submitted_it(
    make_workspace, command, tmp_path, job_env, rsi_argv
):
    env, stores = job_env
    marker = f"{uuid.uuid4().int % 10**6:06d}"
    ws = workspace(make_workspace, command, tmp_path, stores, marker)
    out = tmp_path / "submit.json"
    argv = " ".join(rsi_argv)
    shell = subprocess.Popen(
        ["/bin/sh", "-c", f"{argv} job submit //:slow --json > {out}; exec sleep 600"],
        cwd=ws,
        env={**os.environ, **env},
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: out.exists() and out.read_text().strip().endswith("}"), 60, "submit")
        doc = json.loads(out.read_text())
        os.killpg(shell.pid, signal.SIGKILL)  # NB: the shell, its group and its session leader
        shell.wait(10)
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)
            shell.wait(10)
    assert doc["attached"] is False and doc["state"] in ("queued", "running")
    assert doc["submit_s"] < 5
    done = rsi_json(ws, env, "job", "wait", doc["id"], "--timeout", "90")
    assert done["state"] == "succeeded", done
    assert (ws / "out" / "s.txt").read_text() == "quick\n"
    kinds = [e["kind"] for e in events_of(ws, doc["id"])]
    assert kinds[0] == "job_started" and kinds[-1] == "job_finished" and "build_finished" in kinds
    assert done["profile"]["digest"] and done["containment"] in ("cgroup", "session")
    finished_runner(done)
    assert all(not Path(c).exists() for c in done["cgroups"])
    # NB: the evidence: the profile digest in the events, outputs by digest
    last = events_of(ws, doc["id"])[-1]
    assert last["profile_digest"] == done["profile"]["digest"]
    files = rsi_json(ws, env, "job", "artifact", doc["id"])["files"]
    assert {f["path"] for f in files} == {"s.txt"}
    got = rsi(ws, env, "job", "artifact", doc["id"], "s.txt").stdout
    assert got == "quick\n"


@pytest.mark.e2e
def test_kill_9_of_the_runner_then_resume_reruns_nothing_that_was_cached(
    make_workspace, command, tmp_path, job_env
):
    env, stores = job_env
    marker = f"{uuid.uuid4().int % 10**6:06d}"
    ws = workspace(make_workspace, command, tmp_path, stores, marker)
    job = rsi_json(ws, env, "job", "submit", "//:slow")["id"]

    def slow_started() -> bool:
        return any(
            e["kind"] == "action_started" and e["label"] == "//:slow" for e in events_of(ws, job)
        ) and any(
            e["kind"] == "action_finished" and e["label"] == "//:quick" and e["status"] == "ok"
            for e in events_of(ws, job)
        )

    wait_for(slow_started, 60, "//:slow to start after //:quick finished")
    doc = rsi_json(ws, env, "job", "status", job)
    os.kill(doc["runner"]["pid"], signal.SIGKILL)
    wait_for(lambda: rsi_json(ws, env, "job", "status", job)["state"] == "interrupted", 20)
    before = events_of(ws, job)
    done_before = {
        e["action"]
        for e in before
        if e["kind"] == "action_finished" and e["status"] == "ok" and e["cache"] == "miss"
    }
    assert done_before == {"//:quick#Command"}
    # NB: the same job submitted again attaches to it (to be resumed, never run twice)
    again = rsi_json(ws, env, "job", "submit", "//:slow")
    assert again["attached"] is True and again["id"] == job and again["state"] == "interrupted"
    rsi_json(ws, env, "job", "resume", job)
    done = rsi_json(ws, env, "job", "wait", job, "--timeout", "90")
    assert done["state"] == "succeeded" and done["starts"] == 2, done
    after = events_of(ws, job)[len(before) :]
    assert after[0]["kind"] == "job_started" and after[0]["resumed"] is True
    reran = {
        e["action"]
        for e in after
        if e["kind"] == "action_finished" and e["cache"] == "miss" and e["action"] in done_before
    }
    assert reran == set()  # NB: 0 cached actions re-executed
    # NB: its hit is summarised (RSI_EVENTS_HITS is not set for the job)
    assert any(e["kind"] == "actions_cached" and e["count"] >= 1 for e in after), after
    assert [e["id"] for e in events_of(ws, job)] == list(range(1, len(events_of(ws, job)) + 1))
    finished_runner(done)
    assert live_pids(f"2.{marker}") == []


@pytest.mark.e2e
@pytest.mark.parametrize("cgroups", ["", "freezer", "0"], ids=["cgroup", "freezer", "session"])
def test_cancel_leaves_no_process_and_no_scratch(
    cgroups, make_workspace, command, tmp_path, job_env
):
    env, stores = job_env
    env = dict(env, RSI_JOB_CGROUPS=cgroups)
    marker = f"{uuid.uuid4().int % 10**6:06d}"
    ws = workspace(make_workspace, command, tmp_path, stores, marker)
    job = rsi_json(ws, env, "job", "submit", "//:hang")
    want = "session" if cgroups == "0" else "cgroup"
    assert job["containment"] == want
    if cgroups == "freezer":
        assert "/freezer/" in job["cgroups"][0]
    wait_for(lambda: live_pids(f"sleep\0{90}{marker}") and live_pids(f"sleep\0{91}{marker}"), 60)
    doc = rsi_json(ws, env, "job", "status", job["id"])
    pids = doc["runner"]["pids"]
    # NB: --grace 0: no runner clean-up, the job's tree is killed from outside
    out = rsi_json(ws, env, "job", "cancel", job["id"], "--grace", "0", "--reason", "test")
    rep = out["report"]
    assert out["state"] == "cancelled" and rep["verified"] is True, out
    assert rep["left"] == [] and rep["job_tmp_removed"] is True
    assert "test" in out["cancelled_by"] and out["cancelled_at"]
    assert live_pids(f"90{marker}") == [] and live_pids(f"91{marker}") == []
    finished_runner(doc)
    assert all(not Path(c).exists() for c in doc["cgroups"])
    no_scratch_of(ws, pids)
    assert not (ws / "cache" / "jobs" / job["id"] / "tmp").exists()
    status = rsi_json(ws, env, "job", "status", job["id"])
    assert status["state"] == "cancelled" and status["cancel"]["by"] == out["cancelled_by"]
    assert events_of(ws, job["id"])[-1]["state"] == "cancelled"
    again = rsi_json(ws, env, "job", "cancel", job["id"])
    assert again["cancelled_now"] is False


@pytest.mark.e2e
def test_a_graceful_cancel_ends_the_build_and_its_stream(
    make_workspace, command, tmp_path, job_env
):
    env, stores = job_env
    marker = f"{uuid.uuid4().int % 10**6:06d}"
    ws = workspace(make_workspace, command, tmp_path, stores, marker)
    job = rsi_json(ws, env, "job", "submit", "//:hang")["id"]
    wait_for(lambda: live_pids(f"sleep\0{90}{marker}"), 60)
    out = rsi_json(ws, env, "job", "cancel", job)
    assert out["report"]["verified"] and out["report"]["runner"]["scratch_removed"]
    kinds = [e["kind"] for e in events_of(ws, job)]
    assert kinds[-2:] == ["build_finished", "job_finished"]
    assert events_of(ws, job)[-2]["reason"] == "interrupted"
    assert live_pids(f"90{marker}") == [] and live_pids(f"91{marker}") == []


BUDGETS = {
    "wall_s": ("wall_s = 1.0", "hang"),
    "action_timeout_s": ("action_timeout_s = 1.0", "hang"),
    "disk_bytes": ('disk_bytes = "1m"', "after_big"),
    "memory_bytes": ('memory_bytes = "64m"', "hog"),
    "tokens": ("tokens = 1000", "quick"),
    "calls": ("calls = 10", "quick"),
    "money_usd": ("money_usd = 1.0", "quick"),
    "retries": ("retries = 1", "quick"),
}


@pytest.mark.e2e
@pytest.mark.parametrize("budget", list(BUDGETS))
def test_each_budget_stops_a_job_with_its_name(budget, make_workspace, command, tmp_path, job_env):
    env, stores = job_env
    marker = f"{uuid.uuid4().int % 10**6:06d}"
    extra = (
        command("big", cmd="head -c 3000000 /dev/zero > $(OUT)", outs=["big.bin"])
        + command("after_big", cmd="sleep 5; echo > $(OUT)", outs=["a.txt"], deps=[":big"])
        + command(
            "hog",
            cmd="dd if=/dev/zero of=/dev/shm/x bs=1M count=200 2>/dev/null; sleep 5; echo > $(OUT)",
            outs=["m.txt"],
        )
    )
    ws = workspace(make_workspace, command, tmp_path, stores, marker, extra)
    line, target = BUDGETS[budget]
    (ws / "profiles").mkdir()
    (ws / "profiles" / "p.toml").write_text(f"[budget]\n{line}\n")
    args = ["job", "submit", f"//:{target}", "--profile", "p"]
    holder = None
    if budget == "retries":
        # NB: the host lock held exclusively elsewhere: each attempt's action gives up waiting
        # (a retryable infrastructure fault), the job retries once, then stops
        holder = open(env["RSI_HOST_LOCK"], "a+")
        fcntl.flock(holder, fcntl.LOCK_EX)
        args += ["--lock-timeout", "0.3"]
    try:
        job = rsi_json(ws, env, *args)
        done = rsi_json(ws, env, "job", "wait", job["id"], "--timeout", "90", expect=1)
    finally:
        if holder is not None:
            holder.close()
    assert done["state"] == "stopped" and done["stop_reason"] == f"budget:{budget}", done
    assert budget in done["detail"]
    last = events_of(ws, job["id"])[-1]
    assert last["kind"] == "job_finished" and last["stop_reason"] == f"budget:{budget}"
    assert any(
        e["kind"] == "job_budget" and e["budget"] == budget for e in events_of(ws, job["id"])
    )
    if budget in ("tokens", "calls", "money_usd"):
        assert done["usage"][budget] is None and "unknown" in done["detail"]
        assert not any(e["kind"] == "build_started" for e in events_of(ws, job["id"]))
    if budget == "retries":
        assert done["usage"]["retries"] == 1
        assert sum(e["kind"] == "build_started" for e in events_of(ws, job["id"])) == 2
    finished_runner(done)
    assert live_pids(f"90{marker}") == [] and live_pids(f"91{marker}") == []
    assert all(not Path(c).exists() for c in done["cgroups"])


@pytest.mark.e2e
def test_twenty_concurrent_submits(make_workspace, command, tmp_path, job_env, rsi_argv):
    env, stores = job_env
    targets = "".join(
        command(f"t{i}", cmd=f"sleep 1; echo {i} > $(OUT)", outs=[f"t{i}.txt"]) for i in range(10)
    )
    ws = make_workspace(tmp_path, {"BUILD.toml": targets})
    stores.append(ws / "cache")
    rsi(ws, env, "job", "ls")  # NB: the store and the database exist before the rush
    procs = [
        subprocess.Popen(
            [*rsi_argv, "job", "submit", f"//:t{i % 10}", "--json"],
            cwd=ws,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        for i in range(20)
    ]
    docs = []
    for i, proc in enumerate(procs):
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        docs.append((i % 10, json.loads(out)))
    ids: dict[int, set[str]] = {}
    for target, doc in docs:
        ids.setdefault(target, set()).add(doc["id"])
    finals = {}
    for target, v in ids.items():
        for job in v:
            finals[job] = rsi_json(ws, env, "job", "wait", job, "--timeout", "180")
            assert finals[job]["state"] == "succeeded", finals[job]
        assert (ws / "out" / f"t{target}.txt").read_text() == f"{target}\n"
        # NB: the same inputs attach to a live job; a build job that had already succeeded
        # is built anew (its sources may have changed since; every action is then a hit)
        if len(v) == 2:
            first, second = sorted(v, key=lambda j: finals[j]["submitted_at"])
            assert finals[first]["finished_at"] <= finals[second]["submitted_at"]
        else:
            assert len(v) == 1
    attached = sum(d["attached"] for _, d in docs)
    assert attached + len(finals) == 20
    from rsi.jobs.db import JobDB

    with JobDB(ws / "cache") as db:
        assert db.integrity() == "ok" and len(db.all()) == len(finals)
    listed = rsi_json(ws, env, "job", "ls")
    assert len(listed) == len(finals) and {d["state"] for d in listed} == {"succeeded"}


@pytest.mark.e2e
def test_a_round_job_judges_the_candidate_as_it_was_at_submit(tmp_path, make_workspace, job_env):
    env, stores = job_env
    ws = make_workspace(tmp_path, small_task_files())
    stores.append(ws / "cache")
    cand = tmp_path / "cand"
    cand.mkdir()
    (cand / "kernel.py").write_text(FAST)
    sub = rsi_json(ws, env, "job", "submit", "round", "//tasks/sm:campaign", "--from", str(cand))
    # NB: the folder changes after the submit: the job judges what was submitted
    (cand / "kernel.py").write_text("def softmax(x):\n    return x\n")
    done = rsi_json(ws, env, "job", "wait", sub["id"], "--timeout", "300", timeout=320)
    assert done["state"] == "succeeded", done
    status = rsi_json(ws, env, "campaign", "status", "//tasks/sm:campaign")
    (only,) = status["rounds"]
    assert only["round"] == 1 and only["state"] == "done", only
    # NB: the submitted content, not the folder's later one (which fails correctness)
    assert only["failure_kind"] is None and only["verdict"] in ("PASS", "INCONCLUSIVE"), only
    art = rsi_json(ws, env, "job", "artifact", sub["id"])
    assert art, "the round's evidence is fetchable by digest"
    # NB: asking for the same round again attaches to the job that judged it
    again = rsi_json(ws, env, "job", "submit", "round", "//tasks/sm:campaign", "--round", "1")
    assert again["attached"] is True and again["id"] == sub["id"], again
    assert len(rsi_json(ws, env, "campaign", "status", "//tasks/sm:campaign")["rounds"]) == 1
