"""What producing a candidate cost (tokens, calls, wall and device seconds), as the agent
reports it: validated, every value a number >= 0 or null (never a made-up 0)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rsi.errors import UsageError

USAGE_KEYS = {
    "tokens": ("input", "output", "cached"),
    "calls": None,
    "wall_s": None,
    "device_s": None,
}


BLANK = {
    "tokens": {"input": None, "output": None, "cached": None},
    "calls": None,
    "wall_s": None,
    "device_s": None,
}


def parse_usage(path: str | None) -> dict:
    """Validated usage from a JSON file (`-`: stdin); None: nothing reported (all null)."""
    if path is None:
        return validate_usage(None)
    where = "stdin" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
        doc = json.loads(text)
    except OSError as exc:
        raise UsageError(f"--usage {where}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"--usage {where}: not JSON: {exc}") from None
    return validate_usage(doc, f"--usage {where}")


def validate_usage(doc: Any, where: str = "usage") -> dict:
    """Validated usage; every value a number >= 0 or null, missing values null (never 0)."""
    if doc is None:
        return dict(BLANK, tokens=dict(BLANK["tokens"]))
    if not isinstance(doc, dict):
        raise UsageError(
            f"{where}: expected a JSON object",
            hint='e.g. {"tokens": {"input": 1200, "output": 300, "cached": null}, '
            '"calls": 3, "wall_s": 41.5, "device_s": null}',
        )

    def number(value: Any, field_name: str, integer: bool) -> Any:
        if value is None:
            return None
        ok = isinstance(value, int) if integer else isinstance(value, (int, float))
        if isinstance(value, bool) or not ok or value < 0 or value != value:
            raise UsageError(
                f"{where}: field {field_name!r} must be a "
                f"{'whole' if integer else ''} number >= 0 or null, got {value!r}"
            )
        return value

    unknown = sorted(set(doc) - set(USAGE_KEYS))
    if unknown:
        raise UsageError(
            f"{where}: unknown field(s) {unknown}",
            hint="known fields: tokens.input, tokens.output, tokens.cached, calls, "
            "wall_s, device_s",
        )
    out = dict(BLANK, tokens=dict(BLANK["tokens"]))
    tokens = doc.get("tokens")
    if tokens is not None:
        if not isinstance(tokens, dict) or set(tokens) - set(USAGE_KEYS["tokens"]):
            raise UsageError(f"{where}: tokens must be an object with input, output, cached")
        for k in USAGE_KEYS["tokens"]:
            out["tokens"][k] = number(tokens.get(k), f"tokens.{k}", True)
    t = out["tokens"]
    if t["cached"] is not None and t["input"] is not None and t["cached"] > t["input"]:
        raise UsageError(
            f"{where}: tokens.cached ({t['cached']}) exceeds tokens.input ({t['input']})",
            hint="cached tokens are the part of the input served "
            "from a prompt cache; count them in input too (never added twice)",
        )
    out["calls"] = number(doc.get("calls"), "calls", True)
    out["wall_s"] = number(doc.get("wall_s"), "wall_s", False)
    out["device_s"] = number(doc.get("device_s"), "device_s", False)
    return out
