"""How a harness module loads its siblings: by file path, each once per process under the name
`_rsi_harness_<stem>`, so a class (WorkerFault, HarnessError) is one object for all of them.

The harness runs as `python -I` scripts with no sys.path to this folder; this module must never
load anything but a file of this folder, and never import rsi or rules.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path


def load(*stems: str) -> list[types.ModuleType]:
    """The sibling modules `stems` (file names without .py), in that order."""
    for stem in stems:
        name = f"_rsi_harness_{stem}"
        if name not in sys.modules:
            path = Path(__file__).resolve().with_name(f"{stem}.py")
            spec = importlib.util.spec_from_file_location(name, path)
            sys.modules[name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(sys.modules[name])
    return [sys.modules[f"_rsi_harness_{stem}"] for stem in stems]
