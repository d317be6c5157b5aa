"""`rsi info`: the sandbox this host gives actions and every action's limits, with how each is
enforced (or why it is not), and which stat loop the incremental state's check runs (and why
not the C one). Owns that report only; it must never change a limit or start a sandbox (it
reads what rsi/limits.py, rsi/native.py and the executors say).
"""

from __future__ import annotations

from typing import Any

from rsi import __version__, native
from rsi.executors.local import sandbox_mode
from rsi.executors.pool import bwrap_has_size, pool_supported
from rsi.limits import MEMORY_FRACTION, Limits, cgroup_support, host_memory_bytes, human


def describe(ws: Any = None) -> dict:
    """What `rsi info` shows: the sandbox, and every action's limits on this host and how
    each is enforced (with the reason where one is not)."""
    limits = Limits.from_workspace(ws) if ws is not None else Limits.default()
    support = cgroup_support()
    sandbox = sandbox_mode()
    pooled = sandbox == "bwrap" and pool_supported()
    return {
        "version": __version__,
        "workspace": str(ws.root) if ws is not None else None,
        "executor": ws.executor if ws is not None else "local",
        "sandbox": sandbox,
        "persistent_slots": pooled,
        "stat_loop": native.describe(),
        "host_memory_bytes": host_memory_bytes(),
        "limits": {
            "scratch_bytes": limits.scratch_bytes,
            "scratch_from": "rsi.toml" if getattr(ws, "scratch_mb", None) else "default",
            "scratch": (
                "a tmpfs of that size per persistent slot (/tmp, /dev/shm too)"
                if pooled and bwrap_has_size()
                else "files on disk, each capped at the limit, counted when the action ends"
            ),
            "memory_bytes": limits.memory_bytes,
            "memory_from": (
                "rsi.toml"
                if getattr(ws, "memory_mb", None)
                else f"default: 1/{MEMORY_FRACTION} of {human(host_memory_bytes())}"
            ),
            "memory": support.label or "not enforced",
            "memory_cgroup": str(support.parent) if support.parent else None,
            "memory_not_enforced_because": None if support.version else support.reason,
        },
    }


def render(doc: dict) -> str:
    """`rsi info` for people."""
    lim = doc["limits"]
    lines = [
        f"rsi {doc['version']}",
        f"workspace   {doc['workspace'] or '(none: defaults)'}",
        f"executor    {doc['executor']}",
        f"sandbox     {doc['sandbox']}"
        + (", persistent slots" if doc["persistent_slots"] else ", one per action"),
        f"stat loop   {doc['stat_loop']} (the incremental state's check)",
        f"scratch     {human(lim['scratch_bytes'])} per action ({lim['scratch_from']}): "
        + lim["scratch"],
        f"memory      {human(lim['memory_bytes'])} per action ({lim['memory_from']}): "
        + (
            f"{lim['memory']} under {lim['memory_cgroup']}"
            if lim["memory_cgroup"]
            else f"NOT ENFORCED: {lim['memory_not_enforced_because']}"
        ),
    ]
    return "\n".join(lines)
