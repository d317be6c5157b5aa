"""A candidate's pre-flight (`rsi candidate check`, the MCP tool `check_candidate`): the cheap
checks a round would fail on — files parse, the entry imports, exists and takes the baseline's
arguments — run in the sandbox in about a second, before a round is spent on them.

It never appends to the log, never counts in the budget and never measures or calls the entry
(so it can reveal nothing about hidden cases); it is rate-limited per campaign all the same,
and it is advice, never a verdict: the round judges the candidate again from scratch.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from rsi.action import Action
from rsi.digest import FileNode
from rsi.errors import RsiError, UsageError
from rules.campaign.documents import CHECK_SCHEMA
from rules.campaign.model import Campaign, CampaignClosed
from rules.campaign.paths import DEFAULT_EXCLUDE, in_scope, walk_files
from rules.campaign.snapshot import task_candidate_files
from rules.steps import ENV, HARNESS_DIR, HARNESS_EXEC, PY, SCRIPTS

# NB: generous for an agent's edit-check loop, tight enough that it is no oracle of anything
RATE_LIMIT = 60
RATE_WINDOW_S = 3600.0
TIMEOUT_S = 60.0
LOCK_WAIT_S = 120.0
RATE_FILE = "preflight.jsonl"


def _rate(camp: Campaign, now: float) -> dict:
    times: list[float] = []
    try:
        with open(camp.log.dir / RATE_FILE, encoding="utf-8") as f:
            for line in f:
                try:
                    t = float(json.loads(line)["time"])
                except (ValueError, KeyError, TypeError):
                    continue  # NB: a torn last line after a crash
                if now - RATE_WINDOW_S < t <= now:
                    times.append(t)
    except OSError:
        pass
    times.sort()
    return {
        "used": len(times),
        "limit": RATE_LIMIT,
        "window_s": RATE_WINDOW_S,
        "next_at": times[0] + RATE_WINDOW_S if len(times) >= RATE_LIMIT else None,
    }


def _record(camp: Campaign, now: float, digest: str) -> None:
    os.makedirs(camp.log.dir, exist_ok=True)
    with open(camp.log.dir / RATE_FILE, "a", encoding="utf-8") as f:
        f.write(json.dumps({"time": now, "candidate": digest}) + "\n")


def _candidate_files(camp: Campaign, src: Path) -> dict[str, Path]:
    if not src.is_dir():
        raise UsageError(
            f"--from {src}: {'not a folder' if src.exists() else 'no such folder'}",
            hint="give the folder that holds the candidate's editable files",
        )
    if camp.kind == "task":
        found = task_candidate_files(camp, src)
    else:
        exclude = DEFAULT_EXCLUDE + tuple(camp.binding.attrs["exclude"])
        found = walk_files(src, exclude, skip=(camp.ws.store_dir, camp.ws.out_dir))
        found = {r: p for r, p in found.items() if in_scope(r, camp.scope)}
    if not found:
        raise UsageError(
            f"--from {src}: no file of the editable scope ({', '.join(camp.scope)}) is there"
        )
    return found


def _task_of(camp: Campaign):
    from rsi.build_analysis import make_loader

    binding = camp.binding
    return make_loader(camp.ws).target(binding.attrs["task"], wanted_by=binding, field="task")


def _action(camp: Campaign, store, files: dict[str, Path]) -> tuple[Action, str | None]:
    """The pre-flight as an action: the script, the candidate (missing editable files from
    the baseline) and the baseline; for an external project the static checks only."""
    from rules.domain import host_python_identity

    inputs: dict[str, FileNode] = {}
    for name in SCRIPTS["preflight"]:
        inputs[f"{HARNESS_EXEC}/{name}"] = FileNode(store.put_file(HARNESS_DIR / name))
    entry: dict = {}
    note = None
    if camp.kind == "task":
        task = _task_of(camp)
        entry = dict(task.attrs["entry"])
        base_dir = Path(task.file).parent / task.attrs["baseline"]
        for rel in camp.scope:
            base = base_dir / rel
            if base.is_file():
                inputs[f"baseline/{rel}"] = FileNode(store.put_file(base))
                if rel not in files:
                    inputs[f"impl/{rel}"] = inputs[f"baseline/{rel}"]
        if camp.binding.attrs.get("toolchain"):
            note = (
                "imported with the interpreter rsi runs on, not the binding's toolchain: a "
                "module only that toolchain has fails here and may pass in the round"
            )
    for rel, path in files.items():
        inputs[f"impl/{rel}"] = FileNode(store.put_file(path), os.access(path, os.X_OK))
    argv = [
        *PY,
        f"{HARNESS_EXEC}/preflight.py",
        "--impl",
        "impl",
        "--baseline",
        "baseline",
        "--entry",
        json.dumps(entry, sort_keys=True),
        "--out",
        "preflight.json",
    ]
    return (
        Action(
            argv,
            inputs,
            ("preflight.json",),
            ENV,
            {"toolchain": host_python_identity(("preflight",))},
            timeout_s=TIMEOUT_S,
            label=str(camp.sub("preflight")),
            mnemonic="Preflight",
        ),
        note,
    )


def preflight(camp: Campaign, src: Path, *, now: float | None = None) -> dict:
    """Check the candidate in `src` and return the rsi.candidate.check/1 document."""
    from rsi.runtime import open_store
    from rsi.host import HostLock
    from rsi.runtime import make_local_executor

    now = time.time() if now is None else now
    files = _candidate_files(camp, src)
    rate = _rate(camp, now)
    if rate["next_at"] is not None:
        raise CampaignClosed(
            "preflight_rate_limited",
            f"{rate['used']} pre-flight checks of {camp.label} in the last "
            f"{RATE_WINDOW_S / 60:.0f} minutes (the limit is {RATE_LIMIT})",
            hint=f"the next is allowed in {rate['next_at'] - now:.0f} s; a round judges a "
            "candidate whatever its pre-flight said",
        )
    store = open_store(camp.ws)
    action, note = _action(camp, store, files)
    _record(camp, now, str(action.key()))
    t0 = time.monotonic()
    executor = make_local_executor("local", camp.ws)
    # NB: a shared holding: a measurement in progress elsewhere on this host is not disturbed
    with HostLock(timeout_s=LOCK_WAIT_S).slot(False, str(camp.sub("preflight"))):
        result = executor.run(action, store)
    outputs = {o.path: o.digest for o in result.outputs}
    doc: dict | None = None
    if result.ok and "preflight.json" in outputs:
        try:
            doc = json.loads(store.read_bytes(outputs["preflight.json"]))
        except (ValueError, RsiError):
            doc = None
    rate = _rate(camp, now)
    base = {
        "schema": CHECK_SCHEMA,
        "campaign": str(camp.label),
        "counted": False,
        "seconds": round(time.monotonic() - t0, 3),
        "rate": rate,
        "note": note,
    }
    if not isinstance(doc, dict) or not isinstance(doc.get("checks"), list):
        why = result.failure or f"exit {result.exit_code}"
        return {
            **base,
            "state": "error",
            "ok": False,
            "checks": [],
            "error": {
                "code": "preflight_fault",
                "message": f"the pre-flight step did not report ({why})",
                "hint": "retry; a round judges the candidate whatever its pre-flight said",
                "retryable": True,
            },
        }
    return {**base, "state": "checked", "ok": bool(doc.get("ok")), "checks": doc["checks"]}
