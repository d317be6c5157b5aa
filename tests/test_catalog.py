"""The task catalog (rules/catalog.py): tasks/catalog.lock pins every task's descriptor;
`rsi catalog check` names the task and field of every change, analysis error and failing
baseline; `rsi catalog update` writes only with --yes and leaves unexpected folders alone."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from rsi.workspace import Workspace
from rules.catalog import LOCK_FILE, Catalog

ROOT = Path(__file__).resolve().parent.parent


def _softmax_only(ws: Path) -> None:
    dest = ws / "tasks" / "softmax"
    shutil.copytree(ROOT / "tasks" / "softmax", dest, ignore=shutil.ignore_patterns("__pycache__"))
    build_file = dest / "BUILD.toml"
    text = build_file.read_text()
    # NB: as tests/test_domain.py: the host binding only (no toolchain rootfs, no campaigns),
    # and a small measurement: the catalog builds the binding (baseline check + calibration)
    text = re.sub(r"\n# The same binding inside.*?(?=\n\[fast\])", "\n", text, flags=re.S)
    text = re.sub(r"\n\[verdict_in_toolchain\].*?(?=\n\[|\Z)", "\n", text, flags=re.S)
    text = re.sub(r"\n\[campaign[^\]]*\].*?(?=\n\[|\Z)", "\n", text, flags=re.S)
    text = re.sub(r"pairs = \d+", "pairs = 6", text)
    build_file.write_text(text)


@pytest.fixture
def catalog_ws(tmp_path, make_workspace, run_rsi):
    ws = make_workspace(tmp_path)
    _softmax_only(ws)
    run = run_rsi(ws, "catalog", "update", "--yes")
    assert run.returncode == 0, str(run)
    assert (ws / LOCK_FILE).is_file()
    return ws


@pytest.mark.fast
def test_the_shipped_tasks_match_their_lock():
    """CI's guard: a committed change to any shipped task that the lock does not record fails
    here (`rsi catalog update` shows it; `--yes` accepts it)."""
    doc = Catalog(Workspace.load(ROOT)).check(run=False)
    assert doc["ok"], json.dumps(doc["problems"], indent=1)
    assert set(doc["analysed"]) >= {"softmax", "rmsnorm", "silu_mul"}


@pytest.mark.fast
def test_a_changed_case_is_named_by_task_and_field_and_the_lock_is_kept(catalog_ws, run_rsi):
    build_file = catalog_ws / "tasks" / "softmax" / "BUILD.toml"
    lock_before = (catalog_ws / LOCK_FILE).read_bytes()
    build_file.write_text(build_file.read_text().replace("shape = [16, 128]", "shape = [16, 129]"))
    run = run_rsi(catalog_ws, "catalog", "check", "--no-run", "--json")
    assert run.returncode == 1, str(run)
    problems = json.loads(run.stdout)["problems"]
    fields = {(p["task"], p["field"]) for p in problems}
    assert ("softmax", "cases[0].shape[1]") in fields, problems
    assert all(p["file"] == "tasks/softmax/BUILD.toml" for p in problems)
    assert (catalog_ws / LOCK_FILE).read_bytes() == lock_before

    human = run_rsi(catalog_ws, "catalog", "check", "--no-run")
    assert human.returncode == 1
    assert "softmax: tasks/softmax/BUILD.toml:cases[0].shape[1]: changed" in human.stderr


@pytest.mark.fast
def test_an_edited_oracle_and_a_planted_baseline_file_are_caught(catalog_ws, run_rsi):
    pkg = catalog_ws / "tasks" / "softmax"
    (pkg / "oracle.py").write_text((pkg / "oracle.py").read_text() + "\n# tuned\n")
    (pkg / "baseline" / "helper.py").write_text("X = 1\n")
    doc = json.loads(run_rsi(catalog_ws, "catalog", "check", "--no-run", "--json").stdout)
    changes = {p["field"]: p["error"] for p in doc["problems"]}
    assert changes["files.oracle.py"].startswith("changed")
    assert changes["files.baseline/helper.py"].startswith("added")


@pytest.mark.fast
def test_update_writes_only_with_yes_and_leaves_unexpected_folders_alone(catalog_ws, run_rsi):
    notes = catalog_ws / "tasks" / "notes"
    notes.mkdir()
    (notes / "README.md").write_text("not a task\n")
    binding = catalog_ws / "tasks" / "softmax" / "BUILD.toml"
    binding.write_text(
        binding.read_text().replace("min_improvement = 0.05", "min_improvement = 0.1")
    )
    lock_before = (catalog_ws / LOCK_FILE).read_bytes()

    dry = run_rsi(catalog_ws, "catalog", "update")
    assert dry.returncode == 0, str(dry)
    assert "bindings.cpu.assess.min_improvement: 0.05 -> 0.1" in dry.stdout
    assert "tasks/notes: not a task (no BUILD.toml); left alone" in dry.stdout
    assert "nothing written" in dry.stdout
    assert (catalog_ws / LOCK_FILE).read_bytes() == lock_before

    ls = json.loads(run_rsi(catalog_ws, "catalog", "ls", "--json").stdout)
    assert [r["status"] for r in ls["tasks"]] == ["changed since the lock"]

    yes = run_rsi(catalog_ws, "catalog", "update", "--yes")
    assert yes.returncode == 0 and "wrote" in yes.stdout
    assert (catalog_ws / LOCK_FILE).read_bytes() != lock_before
    assert run_rsi(catalog_ws, "catalog", "check", "--no-run").returncode == 0
    assert (notes / "README.md").read_text() == "not a task\n"


@pytest.mark.fast
def test_a_task_missing_from_the_lock_and_a_broken_lock_are_errors(catalog_ws, run_rsi):
    lock = catalog_ws / LOCK_FILE
    doc = json.loads(lock.read_text())
    doc["tasks"]["gone"] = doc["tasks"].pop("softmax")
    lock.write_text(json.dumps(doc))
    out = json.loads(run_rsi(catalog_ws, "catalog", "check", "--no-run", "--json").stdout)
    errors = {(p["task"], p["error"]) for p in out["problems"]}
    assert ("softmax", "not in the catalog lock") in errors
    assert ("gone", "in the catalog lock but no longer declared under tasks/") in errors

    lock.write_text("{not json")
    run = run_rsi(catalog_ws, "catalog", "check", "--no-run")
    assert run.returncode == 1
    assert "tasks/catalog.lock" in run.stderr and "cannot read the catalog lock" in run.stderr


@pytest.mark.e2e
def test_check_runs_the_baseline_check_and_a_baseline_failing_its_oracle_is_an_error(
    catalog_ws, run_rsi, bwrap
):
    ok = run_rsi(catalog_ws, "catalog", "check", "--json", timeout=600)
    assert ok.returncode == 0, str(ok)
    rows = json.loads(ok.stdout)["baseline_checks"]
    assert [(r["binding"], r["status"]) for r in rows] == [("//tasks/softmax:cpu", "ok")]

    kernel = catalog_ws / "tasks" / "softmax" / "baseline" / "kernel.py"
    kernel.write_text(
        kernel.read_text() + "\n\n_real = softmax\n\ndef softmax(x):\n    return _real(x) * 1.01\n"
    )
    run_rsi(catalog_ws, "catalog", "update", "--yes")  # NB: accepted, so only the run fails
    bad = run_rsi(catalog_ws, "catalog", "check", "--json", timeout=600)
    assert bad.returncode == 1, str(bad)
    problems = json.loads(bad.stdout)["problems"]
    assert [(p["task"], p["field"]) for p in problems] == [("softmax", "cpu: baseline")]
    assert "the baseline fails its own check (wrong_output)" in problems[0]["error"]


@pytest.mark.fast
def test_task_md_says_what_the_declaration_says_and_drift_is_caught(catalog_ws, run_rsi):
    page = catalog_ws / "tasks" / "softmax" / "TASK.md"
    text = page.read_text()
    assert "| `cpu` | cpu | 1 | float32 64x1024 normal | 6 x 10 | latency (minimize) |" in text
    assert "- Editable (a candidate is exactly these files): `kernel.py`" in text
    assert "| float32 | 1e-06 | 1e-05 |" in text

    build_file = catalog_ws / "tasks" / "softmax" / "BUILD.toml"
    build_file.write_text(build_file.read_text().replace("samples = 10", "samples = 12", 1))
    run = run_rsi(catalog_ws, "catalog", "check", "--no-run", "--json")
    problems = json.loads(run.stdout)["problems"]
    assert {
        "task": "softmax",
        "file": "tasks/softmax/TASK.md",
        "field": "docs",
        "error": "TASK.md's generated block no longer matches the declaration",
        "hint": "`rsi catalog update --yes` regenerates it from BUILD.toml",
    } in problems
    assert page.read_text() == text, "check never writes"

    assert run_rsi(catalog_ws, "catalog", "update", "--yes").returncode == 0
    assert "| 6 x 12 |" in page.read_text()
    assert page.read_text().startswith(text.split("<!-- rsi catalog")[0]), "prose kept"
    assert run_rsi(catalog_ws, "catalog", "check", "--no-run").returncode == 0


@pytest.mark.e2e
def test_the_shipped_catalog_passes_its_whole_check(
    tmp_path, make_workspace, run_rsi, bwrap, torch
):
    """What CI runs over the shipped catalog: lock, analysis, and every host binding's baseline
    check (and calibration) built from scratch, in a store of its own."""
    ws = make_workspace(tmp_path)
    for folder in ("tasks", "toolchains"):
        shutil.copytree(ROOT / folder, ws / folder, ignore=shutil.ignore_patterns("__pycache__"))
    run = run_rsi(ws, "catalog", "check", "--json", timeout=2400)
    doc = json.loads(run.stdout)
    assert run.returncode == 0 and doc["ok"], json.dumps(doc["problems"], indent=1)
    statuses = {r["binding"]: r["status"] for r in doc["baseline_checks"]}
    host = {b: s for b, s in statuses.items() if not s.startswith("skipped")}
    assert len(host) >= 11 and set(host.values()) == {"ok"}, statuses
