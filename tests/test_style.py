"""The code is formatted and linted as pyproject.toml says (ruff), so CI fails on drift."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> list[str]:
    venv_ruff = Path(sys.executable).with_name("ruff")
    if venv_ruff.exists():
        return [str(venv_ruff)]
    found = shutil.which("ruff")
    if found is None:
        pytest.fail(
            "ruff is not installed: it is in rsi's `test` extra (./scripts/setup.sh --test)"
        )
    return [found]


@pytest.mark.parametrize("args", [["format", "--check"], ["check"]], ids=["format", "lint"])
def test_ruff_passes(args):
    proc = subprocess.run(
        [*_ruff(), *args, "."], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, f"ruff {' '.join(args)}:\n{proc.stdout}{proc.stderr}"
