"""Reading a build's JSON-lines event log in tests."""

from __future__ import annotations

import json
from pathlib import Path


def read_events(path: Path, partial: bool = False) -> list[dict]:
    """Every event in `path` ([] when absent). `partial`: the log is still being written, so a
    line that does not parse yet (the one being written) is skipped instead of failing."""
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            found.append(json.loads(line))
        except ValueError:
            if not partial:
                raise
    return found
