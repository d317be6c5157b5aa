"""A multi-rank task (issue 18 A): tasks/tp_mlp runs as `world_size` ranks (torch.distributed,
gloo here) judged by rules/harness/multirank.py. The referee forks the ranks itself, hands each
rank its shard, runs calls in lockstep, checks every rank's output and takes the slowest rank's
time; any rank's wrong output, exception, crash or hang is the candidate's failure, naming the
rank (hostile candidates in tests/fixtures/multirank). The binding pins world size, backend and
topology: changing them is a new binding."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from harness_support import TASKS, run_harness, task_spec

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "multirank"
TASK = TASKS / "tp_mlp"
PINNED_HOST = "host-python@0000000000000000000000000000000000000000000000000000000000000000"


def _workspace(make_workspace, tmp_path: Path, extra: str = "") -> Path:
    ws = make_workspace(tmp_path)
    shutil.copytree(TASK, ws / "tasks" / "tp_mlp")
    if extra:
        build = ws / "tasks" / "tp_mlp" / "BUILD.toml"
        build.write_text(build.read_text() + "\n" + extra)
    return ws


# ----------------------------------------------------------------------------- analysis


def _analyze(ws: Path, targets: list[str], tmp_path: Path, monkeypatch):
    import rules.domain
    from rsi.analysis import analyze
    from rsi.digest import digest_bytes
    from rsi.label import Label
    from rsi.loader import Loader
    from rsi.registry import load_rules

    monkeypatch.setattr(rules.domain, "host_python_identity", lambda: PINNED_HOST)
    labels = [Label.parse(t) for t in targets]
    return analyze(
        Loader(ws, load_rules(), {"store": str(tmp_path / "store")}),
        labels,
        store_put=digest_bytes,
        settings={},
    )


WORLD4 = """\
[cpu4]
rule = "binding"
task = ":task"
ranks = {world_size = 4, backend = "gloo", topology = "single-host"}
threads = 1
call_timeout_s = 10.0
measure.workload = {name = "bench_f32", shape = [64, 512, 2048], dtype = "float32"}
measure.warmups = 1
measure.samples = 6
measure.pairs = 6
measure.metric = "latency"
measure.direction = "minimize"
assess = {min_improvement = 0.05, confidence = 0.95, bootstrap_resamples = 2000, min_pairs = 5}
timeout_s = 300.0
"""


@pytest.mark.fast
def test_world_size_is_part_of_the_binding_and_a_change_is_a_new_binding(
    make_workspace, tmp_path, monkeypatch
):
    ws = _workspace(make_workspace, tmp_path, WORLD4)
    graph = _analyze(ws, ["//tasks/tp_mlp:cpu", "//tasks/tp_mlp:cpu4"], tmp_path, monkeypatch)
    by = {}
    for spec in graph.actions.values():
        by.setdefault((spec.mnemonic, spec.outputs[0].split("/")[-2]), spec)
    specs = {}
    for name in ("cpu", "cpu4"):
        check, calib = by[("BaselineCheck", name)], by[("Calibrate", name)]
        # NB: the multi-rank steps: multirank.py with its subcommand, its own harness files
        assert list(check.argv[3:5]) == ["_rsi/harness/multirank.py", "check"]
        assert list(calib.argv[3:5]) == ["_rsi/harness/multirank.py", "measure"]
        paths = {a.path for a in calib.inputs}
        assert "_rsi/harness/mr_worker.py" in paths and "_rsi/harness/worker.py" in paths
        assert "exclusive" in calib.tags
        spec_art = next(a for a in calib.inputs if a.path.endswith("measure_spec.json"))
        specs[name] = spec_art.digest
    provider = graph.providers
    from rsi.label import Label
    from rules.providers import BindingInfo

    ranks = {
        name: BindingInfo.of(provider[Label.parse(f"//tasks/tp_mlp:{name}")]).full_spec["ranks"]
        for name in ("cpu", "cpu4")
    }
    assert ranks["cpu"] == {"world_size": 2, "backend": "gloo", "topology": "single-host"}
    assert ranks["cpu4"]["world_size"] == 4
    # the same task and policy, another world: other spec contents, so other action keys
    assert specs["cpu"] != specs["cpu4"]


@pytest.mark.fast
def test_ranks_are_refused_where_they_cannot_hold(make_workspace, tmp_path, monkeypatch):
    from rsi.errors import RsiError

    bad = {
        "world_size = 1": 'ranks = {world_size = 1, backend = "gloo"}',
        "nccl on a cpu": 'ranks = {world_size = 2, backend = "nccl"}',
        "another topology": 'ranks = {world_size = 2, topology = "two-hosts"}',
        "unknown key": "ranks = {world_size = 2, nodes = 2}",
    }
    for why, line in bad.items():
        ws = _workspace(
            make_workspace,
            tmp_path / why.replace(" ", "_"),
            WORLD4.replace(
                'ranks = {world_size = 4, backend = "gloo", topology = "single-host"}', line
            ),
        )
        with pytest.raises(RsiError) as err:
            _analyze(ws, ["//tasks/tp_mlp:cpu4"], tmp_path / why.replace(" ", "_"), monkeypatch)
        assert "ranks" in str(err.value), why
    # a single-process task cannot take ranks at all
    ws = make_workspace(tmp_path / "single")
    shutil.copytree(TASKS / "rmsnorm", ws / "tasks" / "rmsnorm")
    build = ws / "tasks" / "rmsnorm" / "BUILD.toml"
    build.write_text(
        build.read_text().replace(
            '[cpu]\nrule = "binding"\ntask = ":task"\n',
            '[cpu]\nrule = "binding"\ntask = ":task"\nranks = {world_size = 2}\n',
        )
    )
    with pytest.raises(RsiError) as err:
        _analyze(ws, ["//tasks/rmsnorm:cpu"], tmp_path / "single", monkeypatch)
    assert "multirank = true" in str(err.value)


@pytest.mark.fast
def test_single_process_bindings_keep_their_steps():
    from rules import steps

    assert steps.judge_steps({"threads": 1}) == (steps.CHECK, steps.MEASURE)
    assert steps.judge_steps({"ranks": {"world_size": 2}}) == (steps.MR_CHECK, steps.MR_MEASURE)
    assert "multirank.py" not in steps.SCRIPTS["check"] + steps.SCRIPTS["measure"]


# -------------------------------------------------------------------------- the referee


def _spec(**overrides) -> dict:
    return task_spec("tp_mlp", **{"call_timeout_s": 5, **overrides})


def _check(tmp_path: Path, impl: Path, spec: dict | None = None) -> tuple[dict, float]:
    spec_path = tmp_path / f"{impl.name}.spec.json"
    spec_path.write_text(json.dumps(spec or _spec()))
    out = tmp_path / f"{impl.name}.check.json"
    started = time.monotonic()
    proc = run_harness(
        "multirank.py",
        [
            "check",
            "--task",
            str(TASK),
            "--impl",
            str(impl),
            "--spec",
            str(spec_path),
            "--out",
            str(out),
        ],
        tmp_path,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr  # never a harness fault
    return json.loads(out.read_text()), time.monotonic() - started


@pytest.mark.e2e
def test_a_rank_that_hangs_is_a_timeout_naming_it_within_the_call_limit(tmp_path, torch):
    doc, wall = _check(tmp_path, FIXTURES / "hang_rank1")
    assert doc["status"] == "candidate_failure" and doc["failure_kind"] == "timeout"
    first = doc["reasons"][0]
    assert first["rank"] == 1 and "rank(s) 1 did not finish" in first["detail"]
    assert "rank(s) 0 did" in first["detail"]
    assert wall < 60  # the call limit (5 s) plus start-up, never an endless wait
    assert [c["reason"] for c in doc["cases"][1:]] == ["not_run"] * (len(doc["cases"]) - 1)


@pytest.mark.e2e
def test_a_rank_that_dies_is_a_crash_naming_it(tmp_path, torch):
    doc, _ = _check(tmp_path, FIXTURES / "crash_rank0")
    assert doc["status"] == "candidate_failure" and doc["failure_kind"] == "crash"
    assert doc["reasons"][0]["rank"] == 0
    assert "rank 0 ended (signal 9)" in doc["reasons"][0]["detail"]


@pytest.mark.e2e
def test_a_rank_that_raises_is_named_at_once_while_the_other_waits(tmp_path, torch):
    doc, wall = _check(tmp_path, FIXTURES / "raise_rank1", _spec(call_timeout_s=60))
    assert doc["failure_kind"] == "exception" and doc["reasons"][0]["rank"] == 1
    assert "rank 1 gives up" in doc["reasons"][0]["detail"]
    assert wall < 50  # not the 60 s call limit: the other rank was left waiting, then killed


@pytest.mark.e2e
def test_a_rank_reaches_no_other_ranks_buffers_no_processes_no_seed(tmp_path, torch):
    doc, _ = _check(tmp_path, FIXTURES / "snoop")
    assert doc["status"] == "ok", doc["cases"][0]["log_tail"]  # it found nothing: right answer
    assert doc["referee"]["isolation"] == "namespaces" or doc["referee"]["isolation"]


@pytest.mark.e2e
def test_every_ranks_output_is_checked_and_named(tmp_path, torch):
    doc, _ = _check(tmp_path, TASK / "candidates" / "wrong")
    assert doc["failure_kind"] == "wrong_output"
    case = doc["cases"][0]
    assert [r["rank"] for r in case["ranks"]] == [0, 1]
    assert all(r["reason"] == "out_of_tolerance" for r in case["ranks"])
    assert case["failed_ranks"] == [0, 1] and case["detail"].startswith("rank 0: ")
    good, _ = _check(tmp_path, TASK / "candidates" / "fast")
    assert good["status"] == "ok" and good["n_passed"] == good["n_cases"]
    assert good["n_hidden"] == 2 and good["ranks"]["world_size"] == 2


# --------------------------------------------------------------------------- verdicts


@pytest.mark.e2e
def test_verdicts_pass_the_fast_candidate_and_fail_the_wrong_one_per_rank(
    make_workspace, build, tmp_path, torch
):
    ws = _workspace(make_workspace, tmp_path)
    started = time.monotonic()
    build(ws, "//tasks/tp_mlp:verdict", timeout=600)
    verdict_wall = time.monotonic() - started
    out = ws / "out" / "tasks" / "tp_mlp"
    verdict = json.loads((out / "verdict" / "verdict.json").read_text())
    # NB: a measurement on a busy host (others' work took the CPUs the ranks needed) is
    # INCONCLUSIVE host_busy and nothing else; on a quiet host the fast candidate passes
    if verdict["verdict"] == "INCONCLUSIVE":
        assert {r["code"] for r in verdict["reasons"]} == {"host_busy"}, verdict["reasons"]
    else:
        assert verdict["verdict"] == "PASS", verdict["reasons"]
    samples = json.loads((out / "_evidence" / "cpu" / "fast" / "samples.json").read_text())
    assert samples["ranks"]["world_size"] == 2
    for pair in samples["pairs"]:
        for arm in pair["arms"].values():
            assert len(arm["rank_samples_ns"]) == len(arm["samples_ns"])
            for per_rank, sample in zip(arm["rank_samples_ns"], arm["samples_ns"], strict=True):
                assert len(per_rank) == 2 and sample == max(per_rank)  # the slowest rank
    assert verdict_wall < 120, verdict_wall
    build(ws, "//tasks/tp_mlp:verdict_wrong", timeout=600)
    wrong = json.loads((out / "verdict_wrong" / "verdict.json").read_text())
    assert wrong["verdict"] == "FAIL"
    assert wrong["reasons"][0]["code"] == "candidate_check_failed"
    assert "rank 0:" in wrong["reasons"][0]["detail"]


CAMPAIGN = """\
[campaign]
rule = "campaign"
binding = ":cpu"
rounds = {up_to = 3}
deadline_s = 3600.0
final_reserve_s = 600.0
"""


@pytest.mark.e2e
def test_a_campaign_round_on_the_multi_rank_task(make_workspace, run_rsi, tmp_path, torch):
    ws = _workspace(make_workspace, tmp_path, CAMPAIGN)
    label = "//tasks/tp_mlp:campaign"
    run = run_rsi(
        ws,
        "round",
        label,
        "--from",
        str(ws / "tasks" / "tp_mlp" / "candidates" / "fast"),
        "--hypothesis",
        "one all_reduce in float32",
        "--json",
        timeout=600,
    )
    assert run.returncode == 0, str(run)
    doc = run.json()
    assert doc["schema"] == "rsi.round/1" and doc["round"] == 1 and doc["state"] == "done"
    # NB: the candidate is ~1.8x, but six pairs on a shared host can leave the interval's
    # lower bound under the threshold: a round is a judged round either way, never a FAIL
    assert doc["correctness"]["status"] == "ok", doc["correctness"]
    assert doc["verdict"] in ("PASS", "INCONCLUSIVE"), doc["reasons"]
    if doc["verdict"] == "INCONCLUSIVE":
        codes = {r["code"] for r in doc["reasons"]}
        assert codes <= {"below_threshold", "host_busy", "interference"}, doc["reasons"]
    status = run_rsi(ws, "campaign", "status", label, "--json")
    assert status.returncode == 0, str(status)
    judge = status.json()["judge"]
    assert judge.get("changes") in (None, [])


@pytest.mark.e2e
def test_the_gpu_binding_runs_one_nccl_rank_per_device(tmp_path, torch):
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs two visible CUDA devices (nccl: one rank per device)")
    ranks = {"world_size": 2, "backend": "nccl", "topology": "single-host"}
    doc, _ = _check(tmp_path, TASK / "candidates" / "fast", _spec(device="cuda", ranks=ranks))
    assert doc["status"] == "ok", doc["reasons"]
    wrong, _ = _check(tmp_path, TASK / "candidates" / "wrong", _spec(device="cuda", ranks=ranks))
    assert wrong["failure_kind"] == "wrong_output"


@pytest.mark.e2e
def test_a_cuda_multi_rank_spec_is_refused_without_a_gpu(tmp_path, torch):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    spec_path = tmp_path / "gpu.spec.json"
    ranks = {"world_size": 2, "backend": "nccl", "topology": "single-host"}
    spec_path.write_text(json.dumps(_spec(device="cuda", ranks=ranks)))
    out = tmp_path / "gpu.json"
    args = ["check", "--task", str(TASK), "--impl", str(TASK / "baseline")]
    proc = run_harness(
        "multirank.py", [*args, "--spec", str(spec_path), "--out", str(out)], tmp_path
    )
    assert proc.returncode == 2 and "no CUDA device" in proc.stderr and not out.exists()
