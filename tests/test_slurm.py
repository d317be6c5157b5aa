"""The Slurm executor against a real one-node Slurm (slurmctld, slurmd, munged from the Debian
packages, started on loopback for this module: tests/slurm_support.py): actions, a verdict and
a campaign round run as Slurm jobs; Ctrl-C cancels the job and waits until it ended; Slurm's
time limit is the action's timeout; a node drained mid-build leaves the next action pending
until it is an infrastructure failure, and the build goes on once the node is back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_support import SlurmCluster, missing
from small_task import FAST, small_task_files


@pytest.fixture(scope="module")
def slurm():
    lacking = missing()
    if lacking:
        why = f"Slurm is not installed here (missing {', '.join(lacking)})"
        if os.environ.get("RSI_REQUIRE_SLURM") == "1":
            pytest.fail(f"RSI_REQUIRE_SLURM=1 but {why}")
        pytest.skip(why)
    cluster = SlurmCluster().start()
    try:
        yield cluster
    finally:
        cluster.stop()


def slurm_ws(make_workspace, tmp_path, files: dict, **settings) -> Path:
    conf = {"poll_s": 0.1, **settings}
    lines = "\n".join(f"{k} = {json.dumps(v)}" for k, v in conf.items())
    return make_workspace(
        tmp_path, files, config=f'[workspace]\nexecutor = "slurm"\n\n[slurm]\n{lines}\n'
    )


def host_of(ws: Path, run_rsi, env, action: str) -> dict:
    run = run_rsi(ws, "cache", "show", action, "--json", env=env)
    assert run.returncode == 0, str(run)
    doc = run.json()
    return (doc.get("result") or doc)["host"]


@pytest.mark.e2e
def test_actions_run_as_slurm_jobs_and_their_outputs_come_back_verified(
    slurm, make_workspace, tmp_path, command, build, run_rsi
):
    ws = slurm_ws(
        make_workspace,
        tmp_path,
        {
            "BUILD.toml": command("a", cmd="echo from-node > $(OUT)", outs=["a.txt"])
            + command(
                "b", cmd="cat $(location :a) > $(OUT); echo b >> $(OUT)", outs=["b.txt"]
            ).replace('outs = ["b.txt"]', 'outs = ["b.txt"]\ndeps = [":a"]'),
        },
    )
    run = build(ws, "//:b", env=slurm.env)
    assert (ws / "out" / "b.txt").read_text() == "from-node\nb\n"
    ran = [e for e in run.events if e["kind"] == "action_finished" and e.get("cache") == "miss"]
    assert len(ran) == 2
    host = host_of(ws, run_rsi, slurm.env, "//:b#Command")
    # NB: the node's facts, with the Slurm job that ran it
    assert host["slurm"]["state"] == "COMPLETED" and host["slurm"]["job_id"].isdigit()
    assert host["slurm"]["node"] == "localhost" and host["hostname"]
    assert not slurm.jobs(), "no job is left queued or running"
    assert not list((ws / "cache" / "slurm").glob("*")), "job folders are removed"
    # NB: cached: nothing is submitted again
    again = build(ws, "//:b", env=slurm.env)
    assert not [e for e in again.events if e["kind"] == "action_finished" and e["cache"] == "miss"]


@pytest.mark.e2e
def test_a_failing_action_is_its_own_failure_not_the_infrastructure(
    slurm, make_workspace, tmp_path, command, build
):
    ws = slurm_ws(
        make_workspace,
        tmp_path,
        {"BUILD.toml": command("bad", cmd="echo oops >&2; exit 3", outs=["x.txt"])},
    )
    run = build(ws, "//:bad", env=slurm.env, expect=1)
    failed = run.json()["targets"]["//:bad"]["failed"]
    assert failed and failed[0]["status"] == "failed", failed
    assert "exit" in failed[0]["message"] and "3" in failed[0]["message"], failed


@pytest.mark.e2e
def test_ctrl_c_cancels_the_slurm_job_and_waits_until_it_ended(
    slurm, make_workspace, tmp_path, command
):
    ws = slurm_ws(
        make_workspace,
        tmp_path,
        {"BUILD.toml": command("long", cmd="sleep 120; echo > $(OUT)", outs=["l.txt"])},
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "rsi.cli", "build", "//:long"],
        cwd=ws,
        env={**os.environ, **slurm.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not slurm.cmd("squeue", "-h", "-t", "RUNNING", "-o", "%i").split():
            assert time.monotonic() < deadline, "the job never started"
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    # NB: rsi returned only once Slurm said the job had ended
    assert not slurm.jobs(), slurm.cmd("squeue")


@pytest.mark.e2e
def test_slurms_time_limit_is_the_actions_timeout(slurm, make_workspace, tmp_path, command, build):
    ws = slurm_ws(
        make_workspace,
        tmp_path,
        {"BUILD.toml": command("slow", cmd="sleep 300; echo > $(OUT)", outs=["s.txt"])},
        time_limit_min=1,
    )
    t0 = time.monotonic()
    run = build(ws, "//:slow", env=slurm.env, expect=1, timeout=240)
    took = time.monotonic() - t0
    failed = run.json()["targets"]["//:slow"]["failed"]
    assert failed and "timed out" in failed[0]["message"], failed
    assert took < 200, f"killed by Slurm's 1-minute limit, not the 300 s sleep ({took:.0f} s)"
    assert not slurm.jobs()


@pytest.mark.e2e
def test_a_node_drained_mid_build_is_an_infrastructure_failure_then_the_build_goes_on(
    slurm, make_workspace, tmp_path, command, build
):
    ws = slurm_ws(
        make_workspace,
        tmp_path,
        {
            "BUILD.toml": command("first", cmd="sleep 4; echo 1 > $(OUT)", outs=["1.txt"])
            + command("second", cmd="cat $(location :first) > $(OUT)", outs=["2.txt"]).replace(
                'outs = ["2.txt"]', 'outs = ["2.txt"]\ndeps = [":first"]'
            ),
        },
        pending_timeout_s=4,
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "rsi.cli", "build", "--json", "//:second"],
        cwd=ws,
        env={**os.environ, **slurm.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not slurm.cmd("squeue", "-h", "-t", "RUNNING", "-o", "%i").split():
            assert time.monotonic() < deadline and proc.poll() is None, "first never started"
            time.sleep(0.1)
        slurm.cmd("scontrol", "update", "nodename=localhost", "state=drain", "reason=rsi-test")
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        slurm.cmd("scontrol", "update", "nodename=localhost", "state=resume", check=False)
    assert proc.returncode == 1, err
    doc = json.loads(out)
    failed = doc["targets"]["//:second"]["failed"]
    assert failed and failed[0]["status"] == "error", failed  # NB: infrastructure, retryable
    assert "pending" in failed[0]["message"], failed
    assert not slurm.jobs()
    # NB: the node is back: the first action is a hit, the second runs
    again = build(ws, "//:second", env=slurm.env)
    ran = {
        e["action"] for e in again.events if e["kind"] == "action_finished" and e["cache"] == "miss"
    }
    assert ran == {"//:second#Command"}, ran
    assert (ws / "out" / "2.txt").read_text() == "1\n"


@pytest.mark.e2e
def test_a_verdict_and_a_campaign_round_through_slurm(
    slurm, make_workspace, tmp_path, build, run_rsi
):
    ws = slurm_ws(
        make_workspace,
        tmp_path,
        small_task_files(),
    )
    build(ws, "//tasks/sm:verdict", env=slurm.env, timeout=600)
    verdict = json.loads((ws / "out" / "tasks/sm/verdict/verdict.json").read_text())
    assert verdict["verdict"] in ("PASS", "INCONCLUSIVE"), verdict
    for action in ("//tasks/sm:verdict#Check", "//tasks/sm:verdict#Measure"):
        run = run_rsi(ws, "cache", "show", action, "--json", env=slurm.env)
        if run.returncode == 0:  # NB: shared actions are shown under the target owning them
            assert (run.json().get("result") or run.json())["host"]["slurm"]["job_id"]
    cand = tmp_path / "round-cand"
    cand.mkdir()
    (cand / "kernel.py").write_text(FAST + "\n# another content than the verdict's candidate\n")
    run = run_rsi(
        ws,
        "round",
        "//tasks/sm:campaign",
        "--from",
        str(cand),
        "--json",
        env=slurm.env,
        timeout=600,
    )
    assert run.returncode == 0, str(run)
    doc = run.json()
    assert doc["round"] == 1 and doc["verdict"] in ("PASS", "INCONCLUSIVE"), doc
    assert not slurm.jobs()


@pytest.mark.e2e
def test_a_binding_can_send_only_its_checks_and_measurements_to_slurm(
    slurm, make_workspace, tmp_path, build, run_rsi
):
    files = small_task_files()
    files["tasks/sm/BUILD.toml"] = files["tasks/sm/BUILD.toml"].replace(
        '[small]\nrule = "binding"\n', '[small]\nrule = "binding"\nexecutor = "slurm"\n'
    )
    # NB: the workspace's executor stays local; [slurm] says where the cluster is
    ws = make_workspace(tmp_path, files, config="[slurm]\npoll_s = 0.1\n")
    build(ws, "//tasks/sm:verdict", env=slurm.env, timeout=600)
    judged = host_of(ws, run_rsi, slurm.env, "//tasks/sm:small#Calibrate")
    assert judged["slurm"]["state"] == "COMPLETED", judged
    assessed = host_of(ws, run_rsi, slurm.env, "//tasks/sm:verdict#Assess")
    assert "slurm" not in assessed, "the assessment is bookkeeping: it stays local"
    assert not slurm.jobs()


@pytest.mark.fast
def test_slurm_settings_are_checked_naming_the_file_and_the_key(tmp_path):
    from rsi.errors import DeclarationError
    from rsi.workspace import Workspace

    for text, field in (
        ('[slurm]\npartiton = "gpu"\n', "partiton"),
        ("[slurm]\ntime_limit_min = 0\n", "time_limit_min"),
        ('[slurm]\npoll_s = "fast"\n', "poll_s"),
        ("[slurm]\nextra_args = [1]\n", "extra_args"),
    ):
        (tmp_path / "rsi.toml").write_text(text)
        with pytest.raises(DeclarationError) as err:
            Workspace.load(tmp_path)
        assert err.value.field == field and str(tmp_path / "rsi.toml") in str(err.value.file)
    (tmp_path / "rsi.toml").write_text(
        '[workspace]\nexecutor = "slurm"\n[slurm]\npartition = "gpu"\ngres = "gpu:1"\n'
    )
    ws = Workspace.load(tmp_path)
    assert ws.executor == "slurm" and dict(ws.slurm) == {"partition": "gpu", "gres": "gpu:1"}


@pytest.mark.fast
def test_sbatch_asks_for_what_the_action_needs(tmp_path):
    from rsi.action import Action
    from rsi.executors.slurm import SlurmExecutor, decode_action, encode_action

    ex = SlurmExecutor(
        {"partition": "gpu", "account": "lab", "qos": "high", "gres": "gpu:1", "time_limit_min": 30}
    )
    timed = Action(
        argv=("python3", "m.py"),
        outputs=("o",),
        platform=(("accelerator", "cuda"), ("threads", "4")),
        timeout_s=7200,
        tags=("exclusive",),
        mnemonic="Measure",
    )
    args = ex._sbatch_args(timed, tmp_path)
    for want in (
        "--partition=gpu",
        "--account=lab",
        "--qos=high",
        "--gres=gpu:1",
        "--exclusive",
        "--cpus-per-task=4",
        "--time=30",  # NB: the ceiling, below the action's 2 h
        "--export=NIL",
    ):
        assert want in args, (want, args)
    plain = Action(argv=("sh", "-c", "true"), outputs=("o",), timeout_s=90)
    args = SlurmExecutor({"gres": "gpu:1"})._sbatch_args(plain, tmp_path)
    assert "--exclusive" not in args and not any(a.startswith("--gres") for a in args)
    assert "--time=3" in args  # NB: 90 s rounded up, plus a minute
    assert decode_action(encode_action(timed)) == timed
    assert SlurmExecutor({"gres": "gpu:1"}).capabilities()["accelerator"] >= {"cuda"}
    assert not SlurmExecutor({}).capabilities()["accelerator"]


@pytest.mark.e2e
def test_a_job_under_a_profile_that_names_slurm_runs_its_actions_there(
    slurm, make_workspace, tmp_path, command, run_rsi
):
    ws = make_workspace(
        tmp_path,
        {
            "BUILD.toml": command("t", cmd="echo job > $(OUT)", outs=["t.txt"]),
            "profiles/cluster.toml": 'executor = "slurm"\n[budget]\nwall_s = 300\n',
        },
        config="[slurm]\npoll_s = 0.1\n",
    )
    try:
        sub = run_rsi(ws, "job", "submit", "//:t", "--profile", "cluster", "--json", env=slurm.env)
        assert sub.returncode == 0, str(sub)
        job = sub.json()["id"]
        done = run_rsi(ws, "job", "wait", job, "--timeout", "120", "--json", env=slurm.env)
        assert done.json()["state"] == "succeeded", str(done)
        assert (ws / "out" / "t.txt").read_text() == "job\n"
        host = host_of(ws, run_rsi, slurm.env, "//:t#Command")
        assert host["slurm"]["state"] == "COMPLETED", host
    finally:
        from rsi.jobs.db import JobDB
        from rsi.jobs.service import cleanup_job

        if (ws / "cache" / "jobs" / "jobs.db").exists():
            with JobDB(ws / "cache") as db:
                for j in db.all():
                    if j["state"] in ("queued", "running") or j["cgroups"]:
                        cleanup_job(ws / "cache", j, wait_s=5)
