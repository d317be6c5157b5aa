"""The shared test helpers of tests/conftest.py (make_workspace, build, command), loaded under
their own module name: tests/remote/conftest.py shadows the name `conftest` here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "rsi_tests_conftest", Path(__file__).resolve().parents[1] / "conftest.py"
)
_module = importlib.util.module_from_spec(_spec)
sys.modules["rsi_tests_conftest"] = _module
_spec.loader.exec_module(_module)

build = _module.build
command = _module.command
make_workspace = _module.make_workspace
