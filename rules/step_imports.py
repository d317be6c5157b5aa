"""What the harness steps import from outside the standard library, read from their scripts
(rules/steps.py lists each step's), so that the interpreter identity a step's actions carry
covers those distributions and no other. Never imports or runs a harness script.
"""

from __future__ import annotations

import os
import re
import sys

from rules.steps import HARNESS_DIR, SCRIPTS

# NB: the steps whose results a verdict rests on, and so a binding's interpreter identity
JUDGE_STEPS = ("check", "measure", "assess", "render", "multirank")

# NB: an import statement alone on its line (a docstring's "import the implementation, ..." is
# no statement: prose does not match the strict form); imports inside functions count too
_NAME = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
_IMPORT = re.compile(
    rf"^[ \t]*(?:import[ \t]+({_NAME}(?:[ \t]+as[ \t]+\w+)?"
    rf"(?:[ \t]*,[ \t]*{_NAME}(?:[ \t]+as[ \t]+\w+)?)*)[ \t]*(?:#.*)?"
    rf"|from[ \t]+({_NAME})[ \t]+import\b.*)$",
    re.M,
)
_STDLIB = frozenset(sys.stdlib_module_names) | {"__future__"}

# script path -> (signature, top-level names it imports)
_SEEN: dict[str, tuple[tuple, frozenset[str]]] = {}


def script_imports(path: str) -> frozenset[str]:
    """Top-level module names `path` imports (absolute imports only), by its text."""
    st = os.stat(path)
    sig = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    got = _SEEN.get(path)
    if got is not None and got[0] == sig:
        return got[1]
    with open(path, encoding="utf-8") as f:
        text = f.read()
    names: set[str] = set()
    for m in _IMPORT.finditer(text):
        if m.group(1):
            names.update(part.split()[0].split(".")[0] for part in m.group(1).split(","))
        else:
            names.add(m.group(2).split(".")[0])
    found = frozenset(names)
    _SEEN[path] = (sig, found)
    return found


def step_imports(*steps: str) -> tuple[str, ...]:
    """The third-party top-level modules the scripts of `steps` (keys of SCRIPTS) import: not
    the standard library, not the harness's own sibling modules."""
    scripts = sorted({s for step in steps for s in SCRIPTS[step]})
    siblings = {os.path.splitext(s)[0] for s in os.listdir(HARNESS_DIR) if s.endswith(".py")}
    names: set[str] = set()
    for script in scripts:
        names |= script_imports(str(HARNESS_DIR / script))
    return tuple(sorted(names - _STDLIB - siblings))
