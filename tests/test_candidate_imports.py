"""What judged code imports beyond the judge's identity (rules/harness/imports.py): the action key
covers the harness's numpy and torch (and their requirements), not a package a candidate, baseline
or task imports on its own. Such a check or measurement is judged and says what it imported, but
is never cached, so a second Python environment with another version of it judges again instead
of reusing a result made under the first."""

from __future__ import annotations

import importlib.util
from importlib import metadata
import json
from pathlib import Path

import pytest
from eventlog import read_events
from small_task import FAST, small_task_files

REPO = Path(__file__).resolve().parents[1]


def _imports():
    spec = importlib.util.spec_from_file_location(
        "rsi_test_imports", REPO / "rules" / "harness" / "imports.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _folder(tmp_path: Path, name: str, files: dict[str, str]) -> Path:
    root = tmp_path / name
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.mark.fast
def test_only_imports_outside_the_identity_are_named(tmp_path):
    imp = _imports()
    covered = _folder(
        tmp_path,
        "covered",
        {
            "kernel.py": "import os, math\nimport numpy as np\nfrom torch import nn\n"
            "import helper\nfrom . import sibling\nfrom jinja2 import Template\n",
            "helper.py": "import sys\n",
            "sibling.py": "",
        },
    )
    # NB: stdlib, the identity's roots, a requirement of torch (jinja2), the folder's own
    # modules and relative imports are all covered
    assert imp.outside_identity([covered]) == {}
    outside = _folder(
        tmp_path,
        "outside",
        {
            "kernel.py": "import numpy\n\ndef f():\n    import blake3\n",
            "more.py": "from no_such_package_rsi.sub import x\n",
            "broken.py": "def (:\n",
        },
    )
    got = imp.outside_identity([covered, outside])
    assert got == {
        "blake3": f"blake3 {metadata.version('blake3')}",
        "no_such_package_rsi": "absent",
    }


@pytest.mark.fast
def test_an_unreadable_environment_is_never_taken_for_a_covered_one(tmp_path, monkeypatch):
    imp = _imports()
    folder = _folder(tmp_path, "c", {"kernel.py": "import blake3\n"})

    def broken():
        raise OSError("metadata unreadable")

    monkeypatch.setattr(imp.metadata, "packages_distributions", broken)
    got = imp.outside_identity([folder])
    assert list(got) == ["?"] and "metadata unreadable" in got["?"]


def _ran(events: Path) -> set[str]:
    return {
        e["mnemonic"]
        for e in read_events(events)
        if e["kind"] == "action_finished" and e.get("cache") == "miss"
    }


@pytest.mark.e2e
@pytest.mark.parametrize("extra", [False, True], ids=["numpy_only", "imports_blake3"])
def test_a_candidate_importing_an_extra_package_is_judged_again_never_reused(
    tmp_path, make_workspace, run_rsi, extra
):
    files = small_task_files()
    if extra:
        files["tasks/sm/cands/fast/kernel.py"] = "import blake3  # noqa: F401\n" + FAST
    ws = make_workspace(tmp_path, files)
    env = {"RSI_HOST_LOCK": str(tmp_path / "host.lock")}
    first, second = tmp_path / "e1.jsonl", tmp_path / "e2.jsonl"
    run = run_rsi(ws, "build", "//tasks/sm:verdict", "--events", str(first), env=env, timeout=600)
    assert run.returncode == 0, run.stderr
    check = next(ws.glob("out/**/fast/check.json"))
    recorded = json.loads(check.read_text())["imports_outside_identity"]
    assert {"Check", "Measure"} <= _ran(first)
    run = run_rsi(ws, "build", "//tasks/sm:verdict", "--events", str(second), env=env, timeout=600)
    assert run.returncode == 0, run.stderr
    if extra:
        assert recorded == {"blake3": f"blake3 {metadata.version('blake3')}"}
        # NB: nothing of it was kept: the second build checks and measures again
        assert {"Check", "Measure"} <= _ran(second)
    else:
        assert recorded == {}
        # NB: only the check is compared: a measurement on a busy host is never kept either
        assert "Check" not in _ran(second), _ran(second)
