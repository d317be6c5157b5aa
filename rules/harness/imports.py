"""Which distributions a judged folder's code imports beyond the judge's identity. The interpreter
identity in a check's or measurement's action key covers the harness's own imports (numpy, torch
and what they require); a candidate, baseline or task that imports anything else (scipy, numba)
would get the same key under another version of it, so such a run is judged but never cached.

Reads source text only (`ast`, by the referee, before any worker starts); it must never import
the modules it names. Stdlib only.
"""

from __future__ import annotations

import ast
import re
import sys
import importlib.util
from pathlib import Path

# NB: the modules the judge's identity is computed from (rules/step_imports.py reads the same
# from the step scripts); their requirements' closure is covered too
IDENTITY_ROOTS = ("numpy", "torch")
_STDLIB = frozenset(sys.stdlib_module_names) | {"__future__"}
_REQ_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


class _Metadata:
    """`importlib.metadata`, imported on first use. NB: importing it (email, zipfile, csv) cost
    a check and a measurement ~40 ms of start-up each (85 on a busy host), and a folder that
    imports nothing beyond the stdlib and the identity's roots (every shipped task) never
    reads it."""

    def __getattr__(self, name: str):
        import importlib.metadata

        return getattr(importlib.metadata, name)


metadata = _Metadata()


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def source_imports(folder: Path) -> tuple[set[str], set[str]]:
    """(top-level names the folder's .py files import absolutely, names the folder itself
    provides). A file that does not parse names nothing (the check reports it)."""
    names: set[str] = set()
    local: set[str] = set()
    if not folder.is_dir():
        return names, local
    for path in folder.rglob("*.py"):
        local.add(path.relative_to(folder).parts[0].removesuffix(".py"))
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except (SyntaxError, ValueError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module.split(".")[0])
    return names, local


def _covered() -> set[str]:
    """Normalised names of the dists the identity covers: the roots' and their requirements'
    closure (extras left out, as the identity leaves them out)."""
    owners = metadata.packages_distributions()
    todo = [d for root in IDENTITY_ROOTS for d in owners.get(root, [])]
    seen: set[str] = set()
    while todo:
        name = _norm(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for req in requires:
            if "extra" in req.partition(";")[2]:
                continue
            m = _REQ_NAME.match(req)
            if m:
                todo.append(m.group(1))
    return seen


def outside_identity(folders) -> dict[str, str]:
    """{module: "dist version" | "unpackaged" | "absent"} for each third-party top-level module
    the folders' code imports that the judge's identity does not cover; when the installed
    distributions cannot be read, one `?` entry saying why (so the run is not cached either)."""
    try:
        return _outside(folders)
    except Exception as exc:  # NB: fail closed: a result we cannot place is never cached
        return {"?": f"unreadable: {type(exc).__name__}: {exc}"[:300]}


def _outside(folders) -> dict[str, str]:
    names: set[str] = set()
    local: set[str] = set()
    for folder in folders:
        got, here = source_imports(Path(folder))
        names |= got
        local |= here
    wanted = sorted(n for n in names - _STDLIB - local - set(IDENTITY_ROOTS) if n.isidentifier())
    if not wanted:
        return {}
    owners = metadata.packages_distributions()
    covered = _covered()
    out: dict[str, str] = {}
    for name in wanted:
        dists = owners.get(name, [])
        if any(_norm(d) in covered for d in dists):
            continue
        if dists:
            try:
                out[name] = f"{dists[0]} {metadata.version(dists[0])}"
            except metadata.PackageNotFoundError:
                out[name] = f"{dists[0]} ?"
        else:
            try:
                found = importlib.util.find_spec(name) is not None
            except (ImportError, ValueError):
                found = False
            out[name] = "unpackaged" if found else "absent"
    return out
