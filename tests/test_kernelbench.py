"""`rsi import kernelbench` (rules/kernelbench.py) on problem files of our own in KernelBench's
format (tests/fixtures/kernelbench): imported tasks pass `rsi catalog check` (their baseline is
the problem's Model, checked against Model in float64 on the problem's sizes, edge kinds and
hidden sizes), a ModelNew candidate gets a verdict, a wrong one FAILs, and what cannot be
imported is refused with its reason and writes nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "kernelbench"


def _import(ws: Path, run_rsi, *names: str):
    return run_rsi(
        ws, "import", "kernelbench", "--json", *(str(FIXTURES / n) for n in names), timeout=300
    )


@pytest.mark.e2e  # NB: the probe imports torch (fast tests never do)
def test_cuda_and_complex_problems_are_refused_with_the_reason_and_write_nothing(
    tmp_path, make_workspace, run_rsi, torch
):
    ws = make_workspace(tmp_path)
    run = _import(ws, run_rsi, "4_Needs_cuda.py", "5_Complex_input.py")
    assert run.returncode == 2, str(run)
    doc = json.loads(run.stdout)
    assert doc["written"] == []
    reasons = [r["reason"] for r in doc["refused"]]
    assert "it needs CUDA" in reasons[0]
    assert "input x has dtype complex64" in reasons[1]
    assert not (ws / "tasks").exists()


@pytest.mark.e2e
def test_a_problem_becomes_a_task_with_its_free_sizes_and_the_modelnew_contract(
    tmp_path, make_workspace, run_rsi, torch
):
    ws = make_workspace(tmp_path)
    run = _import(ws, run_rsi, "1_Linear_bias_GELU.py", "2_Sum_over_a_dimension.py")
    assert run.returncode == 0, str(run)
    written = {w["task"]: w for w in json.loads(run.stdout)["written"]}
    # NB: in_features feeds get_init_inputs (the weights' shape): not free; batch_size is
    assert written["//tasks/kb_linear_bias_gelu:task"]["free_sizes"] == ["batch_size"]
    assert written["//tasks/kb_sum_over_a_dimension:task"]["free_sizes"] == [
        "batch_size",
        "dim1",
        "dim2",
    ]
    pkg = ws / "tasks" / "kb_linear_bias_gelu"
    assert (pkg / "problem.py").read_bytes() == (FIXTURES / "1_Linear_bias_GELU.py").read_bytes()
    assert "class ModelNew(nn.Module)" in (pkg / "baseline" / "kernel.py").read_text()
    build = (pkg / "BUILD.toml").read_text()
    assert 'entry = {module = "kernel", class = "ModelNew"}' in build
    assert "hidden_cases = {count = 4" in build
    again = _import(ws, run_rsi, "1_Linear_bias_GELU.py")
    assert again.returncode == 2 and "exists (--force" in again.stdout


@pytest.mark.e2e
def test_imported_tasks_pass_catalog_check_and_judge_modelnew_candidates(
    tmp_path, make_workspace, run_rsi, build, torch, bwrap
):
    ws = make_workspace(tmp_path)
    problems = (
        "1_Linear_bias_GELU.py",
        "2_Sum_over_a_dimension.py",
        "3_Scaled_residual.py",
        "8_Layer_norm_tied.py",
        "9_Margin_loss_written_twice.py",
        "10_Index_of_largest.py",
    )
    assert _import(ws, run_rsi, *problems).returncode == 0
    assert run_rsi(ws, "catalog", "update", "--yes").returncode == 0
    check = run_rsi(ws, "catalog", "check", "--json", timeout=900)
    assert check.returncode == 0, str(check)
    statuses = {r["binding"]: r["status"] for r in json.loads(check.stdout)["baseline_checks"]}
    # NB: kb_layer_norm_tied's model is built with a fitted dim1: its baseline (kernel.py),
    # oracle and workloads all use it, or this check fails
    assert statuses == {
        "//tasks/kb_linear_bias_gelu:cpu": "ok",
        "//tasks/kb_scaled_residual:cpu": "ok",
        "//tasks/kb_sum_over_a_dimension:cpu": "ok",
        "//tasks/kb_layer_norm_tied:cpu": "ok",
        # NB: a size written twice, halved as one; an integer output compared exactly
        "//tasks/kb_margin_loss_written_twice:cpu": "ok",
        "//tasks/kb_index_of_largest:cpu": "ok",
    }

    pkg = ws / "tasks" / "kb_linear_bias_gelu"
    for name in ("linear_gelu_addmm", "linear_relu_wrong"):
        (pkg / "candidates" / name).mkdir(parents=True)
        shutil.copy(FIXTURES / "candidates" / f"{name}.py", pkg / "candidates" / name / "kernel.py")
    with open(pkg / "BUILD.toml", "a") as f:
        for name in ("linear_gelu_addmm", "linear_relu_wrong"):
            f.write(
                f'\n[{name}]\nrule = "candidate"\ntask = ":task"\nsrc = "candidates/{name}"\n'
                f'\n[verdict_{name}]\nrule = "verdict"\nbinding = ":cpu"\ncandidate = ":{name}"\n'
            )
    build(
        ws,
        "//tasks/kb_linear_bias_gelu:verdict_linear_gelu_addmm",
        "//tasks/kb_linear_bias_gelu:verdict_linear_relu_wrong",
        "--keep-going",
        timeout=900,
    )
    out = ws / "out" / "tasks" / "kb_linear_bias_gelu"
    good = json.loads((out / "verdict_linear_gelu_addmm" / "verdict.json").read_text())
    wrong = json.loads((out / "verdict_linear_relu_wrong" / "verdict.json").read_text())
    # NB: a correct candidate: PASS, or INCONCLUSIVE when the gain is small or the host busy
    assert good["verdict"] in ("PASS", "INCONCLUSIVE"), good["reasons"]
    assert good["candidate_failure_kind"] is None
    assert wrong["verdict"] == "FAIL"
    assert wrong["candidate_failure_kind"] == "wrong_output"


@pytest.mark.e2e
def test_a_problem_sized_for_a_big_gpu_is_fitted_to_the_memory_budget(
    tmp_path, make_workspace, run_rsi, torch
):
    """KernelBench's own sizes reach gigabytes; the probe sizes them on the meta device (under
    its memory cap: 4 GiB inputs would not fit it) and halves them until a call fits."""
    ws = make_workspace(tmp_path)
    run = _import(ws, run_rsi, "6_Big_square_matmul.py")
    assert run.returncode == 0, str(run)
    [w] = json.loads(run.stdout)["written"]
    policy = w["size_policy"]
    assert policy["scaled"] == {"N": [32768, 1024]}
    assert policy["call_bytes"] == 3 * 1024 * 1024 * 4 <= policy["max_call_bytes"] == 16 << 20
    pkg = ws / "tasks" / "kb_big_square_matmul"
    assert '"scaled": {"N": [32768, 1024]}' in (pkg / "workloads.py").read_text()
    assert "N` 32768 -> 1024" in (pkg / "TASK.md").read_text()
    assert "shape = [1024]" in (pkg / "BUILD.toml").read_text()
    tight = _import_with(ws, run_rsi, "6_Big_square_matmul.py", "--max-call-mb", "1", "--force")
    assert tight.returncode == 0, str(tight)
    [w] = json.loads(tight.stdout)["written"]
    assert w["size_policy"]["scaled"] == {"N": [32768, 256]}


@pytest.mark.e2e
def test_sizes_that_build_the_model_shrink_only_when_the_free_ones_cannot(
    tmp_path, make_workspace, run_rsi, torch
):
    ws = make_workspace(tmp_path)
    run = _import(ws, run_rsi, "8_Layer_norm_tied.py")
    assert run.returncode == 0, str(run)
    [w] = json.loads(run.stdout)["written"]
    assert w["free_sizes"] == ["batch_size"]
    assert w["size_policy"]["scaled"] == {"batch_size": [16, 1], "dim1": [256, 128]}
    pkg = ws / "tasks" / "kb_layer_norm_tied"
    assert 'FIXED = {"dim1": 128}' in (pkg / "workloads.py").read_text()
    assert 'FIXED = {"dim1": 128}' in (pkg / "oracle.py").read_text()
    assert (pkg / "baseline" / "kernel.py").read_text().endswith("dim1 = 128\n")
    assert (pkg / "problem.py").read_bytes() == (FIXTURES / "8_Layer_norm_tied.py").read_bytes()


@pytest.mark.e2e
def test_a_problem_that_runs_out_of_the_probes_memory_is_refused_as_such(
    tmp_path, make_workspace, run_rsi, torch
):
    ws = make_workspace(tmp_path)
    run = _import(ws, run_rsi, "7_Allocates_at_import.py")
    assert run.returncode == 2, str(run)
    [refused] = json.loads(run.stdout)["refused"]
    assert "ran out of memory under the probe's cap" in refused["reason"]
    assert not (ws / "tasks").exists()


def _import_with(ws: Path, run_rsi, name: str, *flags: str):
    return run_rsi(ws, "import", "kernelbench", "--json", *flags, str(FIXTURES / name), timeout=300)


@pytest.mark.e2e
def test_a_size_written_twice_is_halved_as_one_and_chained_names_are_sizes(
    tmp_path, make_workspace, run_rsi, torch
):
    """`rows` and `feature_shape = (16384,)` must stay equal (halving one alone breaks the
    broadcast), as must `classes` and `score_shape = (classes,)` (the labels' range);
    `height = width = 512` are two sizes. The fitting sees both, so neither problem
    is refused, and the task's workloads set every site of a size."""
    ws = make_workspace(tmp_path)
    run = _import(
        ws,
        run_rsi,
        "9_Margin_loss_written_twice.py",
        "10_Index_of_largest.py",
        "11_Class_scores_alias.py",
    )
    assert run.returncode == 0, str(run)
    written = {w["task"].split(":")[0]: w for w in json.loads(run.stdout)["written"]}
    margin = written["//tasks/kb_margin_loss_written_twice"]
    assert margin["free_sizes"] == ["rows=feature_shape[0]"]
    [(before, after)] = margin["size_policy"]["scaled"].values()
    assert before == 16384 and after < before
    assert margin["size_policy"]["call_bytes"] <= 16 << 20
    # NB: `score_shape = (classes,)`: an alias in the source, one size
    alias = written["//tasks/kb_class_scores_alias"]
    assert alias["free_sizes"] == ["samples", "classes=score_shape[0]"]
    index = written["//tasks/kb_index_of_largest"]
    assert index["free_sizes"] == ["batch", "height", "width"]
    pkg = ws / "tasks" / "kb_index_of_largest"
    # NB: argmax's output is an integer: compared exactly, never within a float tolerance
    assert "tolerances = {int64 = {atol = 0, rtol = 0}}" in (pkg / "BUILD.toml").read_text()
    # NB: the task's own workloads make inputs at a hidden-case size: both sites move together
    workloads = ws / "tasks" / "kb_margin_loss_written_twice" / "workloads.py"
    probe = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('w', {str(workloads)!r})\n"
        "w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w)\n"
        "x = w.make_inputs({'shape': [40], 'kind': 'normal'}, 7)\n"
        "print(list(x['scores'].shape), list(x['labels'].shape))\n"
    )
    shown = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert shown.stdout.split() == ["[40,", "40]", "[40]"], shown.stderr


@pytest.mark.e2e
def test_a_model_whose_weights_exceed_the_parameter_budget_is_built_smaller(
    tmp_path, make_workspace, run_rsi, torch
):
    """No call budget sees a 1 GiB weight matrix; the parameter budget does: the sizes the model
    is built with are halved until its parameters fit, recorded in the task."""
    ws = make_workspace(tmp_path)
    run = _import(ws, run_rsi, "12_Wide_linear_sum.py")
    assert run.returncode == 0, str(run)
    [w] = json.loads(run.stdout)["written"]
    policy = w["size_policy"]
    assert policy["max_param_bytes"] == 256 << 20
    assert 0 < policy["param_bytes"] <= 256 << 20
    assert set(policy["scaled"]) == {"features_in", "features_out"}
    pkg = ws / "tasks" / "kb_wide_linear_sum"
    assert "MiB of model parameters" in (pkg / "TASK.md").read_text()
    tight = _import_with(ws, run_rsi, "12_Wide_linear_sum.py", "--max-param-mb", "4", "--force")
    assert tight.returncode == 0, str(tight)
    [w] = json.loads(tight.stdout)["written"]
    assert w["size_policy"]["param_bytes"] <= 4 << 20


@pytest.mark.e2e
def test_a_problem_that_allocates_too_much_inside_is_run_again_smaller(
    tmp_path, make_workspace, run_rsi, torch
):
    """The call fits its budget, but the forward's own seq_len^2 matrix does not fit the probe's
    cap: the run out of memory is tried again at a quarter of the call, recorded, not refused."""
    ws = make_workspace(tmp_path)
    run = _import(ws, run_rsi, "13_Token_similarity.py")
    assert run.returncode == 0, str(run)
    [w] = json.loads(run.stdout)["written"]
    policy = w["size_policy"]
    assert policy["memory_refits"] >= 1
    assert policy["scaled"]["seq_len"][1] <= 16384


@pytest.mark.e2e
def test_a_forward_with_optional_arguments_takes_the_inputs_the_problem_gives(
    tmp_path, make_workspace, run_rsi, torch
):
    """forward(x, h0=None) with get_inputs() giving x alone: the task's inputs are x, and the
    default stands, as KernelBench calls it."""
    ws = make_workspace(tmp_path)
    run = _import(ws, run_rsi, "14_Recurrent_optional_state.py")
    assert run.returncode == 0, str(run)
    [w] = json.loads(run.stdout)["written"]
    assert [i["name"] for i in w["inputs"]] == ["x"]
    build = (ws / "tasks" / "kb_recurrent_optional_state" / "BUILD.toml").read_text()
    assert 'signature = "ModelNew(*get_init_inputs())(x) -> Tensor"' in build


@pytest.mark.e2e
def test_fitted_sizes_stay_fitted_when_an_eighth_of_them_cannot_run(
    tmp_path, make_workspace, run_rsi, torch
):
    """An eighth of the fitted image (8 px) is smaller than the 11 px window. The hidden cases'
    smallest sizes are then a quarter or a half, and the task's cases never fall back to the
    problem's own 16 GiB input (which the first importer did: the baseline check was killed at
    its memory limit)."""
    ws = make_workspace(tmp_path)
    run = _import(ws, run_rsi, "15_Wide_window_pooling.py")
    assert run.returncode == 0, str(run)
    [w] = json.loads(run.stdout)["written"]
    assert "side" in w["free_sizes"]
    workloads = ws / "tasks" / "kb_wide_window_pooling" / "workloads.py"
    build_toml = workloads.parent / "BUILD.toml"
    probe = (
        "import importlib.util, json\n"
        f"spec = importlib.util.spec_from_file_location('w', {str(workloads)!r})\n"
        "w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w)\n"
        "import tomllib, pathlib\n"
        f"build = tomllib.loads(pathlib.Path({str(build_toml)!r}).read_text())\n"
        "task = build['task']\n"
        "sizes = [w.make_inputs(c, 1)['images'].numel() * 4 for c in task['cases']]\n"
        "lows = [[lo for lo, hi in r['shape']] for r in task['hidden_cases']['ranges']]\n"
        "print(json.dumps({'bytes': sizes, 'lows': lows, 'varied': w.VARIED}))\n"
    )
    shown = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    doc = json.loads(shown.stdout)
    assert max(doc["bytes"]) <= 16 << 20, doc
    side = doc["varied"].index("side")
    assert all(low[side] >= 11 for low in doc["lows"]), doc
