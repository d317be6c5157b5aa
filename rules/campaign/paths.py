"""Paths of a campaign's files: which names a snapshot skips, shell-style scope patterns, and a
walk that returns plain files only. Owns no campaign state; must never follow a symlink."""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

from rsi.errors import UsageError

DEFAULT_EXCLUDE = (
    ".git",
    ".hg",
    ".svn",
    "__pycache__",
    ".venv",
    "venv",
    "node_modules",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".tox",
    ".rsi",
)


def in_scope(rel: str, patterns: tuple[str, ...] | list[str]) -> bool:
    """Shell-style patterns on posix paths (`*` also crosses `/`); `dir/` names a whole folder."""
    for pat in patterns:
        if pat.endswith("/"):
            if rel.startswith(pat):
                return True
        elif fnmatch.fnmatchcase(rel, pat):
            return True
    return False


def walk_files(
    root: Path, exclude: tuple[str, ...] = DEFAULT_EXCLUDE, skip: tuple[Path, ...] = ()
) -> dict[str, Path]:
    """Regular files under `root` by posix relative path; symlinks are refused, not followed."""
    found: dict[str, Path] = {}
    skip_real = {os.path.realpath(p) for p in skip}
    for dirpath, dirnames, filenames in os.walk(root):
        keep = []
        for d in sorted(dirnames):
            full = Path(dirpath) / d
            if d in exclude or os.path.realpath(full) in skip_real:
                continue
            if full.is_symlink():
                raise UsageError(
                    f"{full} is a symlink; snapshots hold plain files only",
                    hint="replace the link by the file, or exclude it",
                )
            keep.append(d)
        dirnames[:] = keep
        for name in sorted(filenames):
            full = Path(dirpath) / name
            if name in exclude or name.endswith((".pyc", ".pyo")):
                continue
            if full.is_symlink():
                raise UsageError(
                    f"{full} is a symlink; snapshots hold plain files only",
                    hint="replace the link by the file, or exclude it",
                )
            if full.is_file():
                found[full.relative_to(root).as_posix()] = full
    return found
