"""Package locks of a built root filesystem and the difference between two of them. It must never
build anything.

A lock is one `kind name=version` line per installed Debian package (`deb`) and Python
distribution (`wheel`), sorted. It is read from the tree itself after the build, so it says what
the mirror actually served, not what the recipe hoped for.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

LOCK_HEADER = "# rsi toolchain lock: one 'kind name=version' line per installed package\n"


def read_tree_lock(root: Path) -> dict[str, str]:
    """{"deb:<pkg>": version, "wheel:<dist>": version} of the tree at `root`."""
    lock: dict[str, str] = {}
    admindir = root / "var/lib/dpkg"
    if admindir.is_dir():
        out = subprocess.run(
            [
                "dpkg-query",
                f"--admindir={admindir}",
                "-W",
                "-f",
                "${db:Status-Abbrev}\t${Package}\t${Version}\n",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        for line in out.splitlines():
            status, pkg, version = line.split("\t")
            if status.startswith("ii"):
                lock[f"deb:{pkg}"] = version
    for site in sorted(root.glob("usr/local/lib/python3*/dist-packages")):
        for dist in sorted(site.glob("*.dist-info")):
            meta = _metadata(dist / "METADATA")
            if meta:
                lock[f"wheel:{_normalise(meta[0])}"] = meta[1]
    return lock


def _metadata(path: Path) -> tuple[str, str] | None:
    name = version = None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break
                if line.startswith("Name:"):
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("Version:"):
                    version = line.split(":", 1)[1].strip()
    except OSError:
        return None
    return (name, version) if name and version else None


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def format_lock(lock: dict[str, str]) -> str:
    lines = [f"{key.split(':', 1)[0]} {key.split(':', 1)[1]}={lock[key]}" for key in sorted(lock)]
    return LOCK_HEADER + "".join(line + "\n" for line in lines)


def parse_lock(text: str) -> dict[str, str]:
    lock: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        kind, rest = line.split(" ", 1)
        name, version = rest.split("=", 1)
        lock[f"{kind}:{name}"] = version
    return lock


def read_lock_file(path: str | os.PathLike) -> dict[str, str] | None:
    try:
        return parse_lock(Path(path).read_text())
    except FileNotFoundError:
        return None


@dataclass(frozen=True)
class LockDiff:
    """What moved between two locks; keys are `kind:name`."""

    added: tuple[tuple[str, str], ...] = ()
    removed: tuple[tuple[str, str], ...] = ()
    changed: tuple[tuple[str, str, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)

    @property
    def packages(self) -> list[str]:
        """Every `kind:name` that differs."""
        return sorted({k for k, *_ in self.added + self.removed + self.changed})

    def describe(self) -> list[str]:
        out = [f"+ {k}={v}" for k, v in self.added]
        out += [f"- {k}={v}" for k, v in self.removed]
        out += [f"~ {k}: {old} -> {new}" for k, old, new in self.changed]
        return out

    def to_json(self) -> dict:
        return {
            "added": {k: v for k, v in self.added},
            "removed": {k: v for k, v in self.removed},
            "changed": {k: [old, new] for k, old, new in self.changed},
        }


def diff_locks(old: dict[str, str], new: dict[str, str]) -> LockDiff:
    return LockDiff(
        added=tuple((k, new[k]) for k in sorted(set(new) - set(old))),
        removed=tuple((k, old[k]) for k in sorted(set(old) - set(new))),
        changed=tuple((k, old[k], new[k]) for k in sorted(set(old) & set(new)) if old[k] != new[k]),
    )
