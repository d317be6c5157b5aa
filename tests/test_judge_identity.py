"""A judge's interpreter identity covers the packages its steps import and no others: real
second Python environments (venvs over this one's packages) sharing one store. An unrelated
package installed beside them changes no identity and locks no campaign; another numpy is
another identity, and the refusal names the package and version, not a file to check out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOFTMAX = REPO / "tasks" / "softmax"
SITE = next(p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p))
IDENTITY = "from rules.domain import host_python_identity; print(host_python_identity())"


def _env(root: Path, *, extra: bool = False, numpy_version: str | None = None) -> Path:
    """A venv whose own site-packages comes first, then this environment's (and rsi's
    checkout): `extra` installs an unrelated package there, `numpy_version` a numpy
    distribution of that version (this numpy's code under another dist-info)."""
    venv.create(root, with_pip=False, symlinks=True)
    site = Path(
        subprocess.check_output(
            [
                root / "bin" / "python",
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            ],
            text=True,
        ).strip()
    )
    (site / "zz_base.pth").write_text(f"{SITE}\n{REPO}\n")
    if extra:
        (site / "unrelated_sdk").mkdir()
        (site / "unrelated_sdk" / "__init__.py").write_text("")
        info = site / "unrelated_sdk-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Name: unrelated-sdk\nVersion: 1.0\nRequires-Dist: numpy\n")
        (info / "RECORD").write_text("unrelated_sdk/__init__.py,,\n")
    if numpy_version:
        import numpy

        (site / "numpy").symlink_to(Path(numpy.__file__).parent)
        info = site / f"numpy-{numpy_version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Name: numpy\nVersion: {numpy_version}\n")
        (info / "RECORD").write_text(f"numpy/__init__.py,,\n# {numpy_version}\n")
    return root / "bin" / "python"


def _run(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RSI_SERVER")}
    return subprocess.run(
        [str(python), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def _identity(python: Path, cwd: Path) -> str:
    run = _run(python, "-c", IDENTITY, cwd=cwd)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


@pytest.mark.fast
def test_an_unrelated_package_keeps_the_identity_and_another_numpy_changes_it(tmp_path):
    here = _identity(Path(sys.executable), tmp_path)
    assert here.endswith(":numpy,torch"), here
    plain = _env(tmp_path / "plain")
    with_extra = _env(tmp_path / "extra", extra=True)
    other_numpy = _env(tmp_path / "numpy", numpy_version="9.9.9")
    assert _identity(plain, tmp_path) == here, "the same packages in another venv: one judge"
    assert _identity(with_extra, tmp_path) == here, "a package no step imports is not the judge"
    assert _identity(other_numpy, tmp_path) != here, "numpy is what the judge imports"


TASK_BUILD = """\
[task]
rule = "task"
runtime = ["workloads.py", "oracle.py"]
baseline = "baseline"
framework = "numpy"
entry = {module = "kernel", function = "softmax"}
editable = ["kernel.py"]
tolerances = {float32 = {atol = 1e-06, rtol = 1e-05}}
cases = [{name = "normal_f32", shape = [16, 128], dtype = "float32", kind = "normal"}]

[small]
rule = "binding"
task = ":task"
measure.workload = {name = "bench", shape = [64, 1024], dtype = "float32", kind = "normal"}
measure.samples = 5
measure.pairs = 6
assess = {min_improvement = 0.05, confidence = 0.95, bootstrap_resamples = 500, min_pairs = 5}

[campaign]
rule = "campaign"
binding = ":small"
rounds = {up_to = 6}
deadline_s = 3600.0
final_reserve_s = 600.0
"""
C = "//tasks/sm:campaign"


@pytest.mark.e2e
def test_a_campaign_goes_on_under_an_extra_and_names_the_package_that_moved(tmp_path):
    ws = tmp_path / "ws"
    (ws / "tasks" / "sm" / "baseline").mkdir(parents=True)
    (ws / "rsi.toml").write_text("")
    (ws / "tasks" / "sm" / "BUILD.toml").write_text(TASK_BUILD)
    for name in ("oracle.py", "workloads.py"):
        (ws / "tasks" / "sm" / name).write_bytes((SOFTMAX / name).read_bytes())
    (ws / "tasks" / "sm" / "baseline" / "kernel.py").write_bytes(
        (SOFTMAX / "baseline" / "kernel.py").read_bytes()
    )
    for n in range(3):
        (ws / f"cand{n}").mkdir()
        (ws / f"cand{n}" / "kernel.py").write_text(
            (SOFTMAX / "baseline" / "kernel.py").read_text() + f"\n# variant {n}\n"
        )
    home = Path(sys.executable)

    def rsi(python: Path, *args: str, expect: int = 0) -> dict:
        run = _run(python, "-m", "rsi.cli", *args, "--json", cwd=ws)
        assert run.returncode == expect, f"{args}: {run.returncode}\n{run.stdout}\n{run.stderr}"
        return json.loads(run.stdout)

    rsi(home, "campaign", "start", C)
    judge = json.loads(
        (ws / "cache").joinpath("campaigns").rglob("*.jsonl").__next__().read_text().splitlines()[0]
    )["judge"]
    assert "numpy" in judge["toolchain"] and "unrelated_sdk" not in judge["toolchain"]

    with_extra = _env(tmp_path / "extra", extra=True)
    assert rsi(with_extra, "candidate", "add", C, "--from", str(ws / "cand0"))["added"]

    other_numpy = _env(tmp_path / "numpy", numpy_version="9.9.9")
    refused = rsi(other_numpy, "candidate", "add", C, "--from", str(ws / "cand1"), expect=2)
    error = refused["error"]
    assert error["code"] == "judge_changed"
    from rsi.executors.host_python import packages

    mine = packages(["numpy"])["numpy"].split()[0]
    assert f"package numpy {mine} is now 9.9.9" in error["message"], error
    assert f"numpy=={mine}" in error["hint"] and "git checkout" not in error["hint"], error
    assert "spec.json changed" not in error["message"], "the package line explains it"

    # NB: the other environment's analysis is its own: this one is not refused after it
    assert rsi(home, "candidate", "add", C, "--from", str(ws / "cand2"))["added"]


@pytest.mark.fast
def test_the_judge_steps_import_numpy_and_torch_and_the_dashboard_jinja2(tmp_path):
    from rules.step_imports import JUDGE_STEPS, script_imports, step_imports

    assert step_imports(*JUDGE_STEPS) == ("numpy", "torch")
    assert step_imports("dashboard") == ("jinja2",)
    script = tmp_path / "s.py"
    script.write_text(
        '"""Docs.\n\nimport the implementation, then call it\n"""\n'
        "import os, numpy as np\n"
        "from torch.nn import functional  # a comment\n"
        "def f():\n    import scipy.linalg\n    from . import sibling\n"
    )
    assert script_imports(str(script)) == {"os", "numpy", "torch", "scipy"}


@pytest.mark.fast
def test_a_changed_package_is_named_with_both_versions_and_how_to_put_it_back():
    from rules.campaign.judging import _restore_hint, judge_changes

    was = {
        "binding": "//p:b",
        "toolchain": {"numpy": "2.0.0 a/1", "helper": "1.0 b/1"},
        "harness": {"check.py": "d/1"},
    }
    now = {
        "binding": "//p:b",
        "toolchain": {"numpy": "2.1.0 c/1", "helper": "1.0 e/1", "extra": "3 f/1"},
        "harness": {"check.py": "d/1"},
    }
    changes = judge_changes(was, now)
    assert changes == [
        "package extra 3 is now needed by the judge's imports",
        "package helper 1.0 was reinstalled with other files",
        "package numpy 2.0.0 is now 2.1.0",
    ]
    hint = _restore_hint(changes, was)
    assert "pip install helper==1.0 numpy==2.0.0" in hint and "git checkout" not in hint
    # NB: a judge recorded before judges named their packages has no toolchain part: nothing
    # is reported as added for it
    old = {k: v for k, v in was.items() if k != "toolchain"}
    assert judge_changes(old, now) == []
