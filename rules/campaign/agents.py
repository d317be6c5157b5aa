"""Agents as users of a campaign: what a task asks (its description and contract, for a brief
or an MCP tool), and the session handoff — `prepare` writes a brief into a fresh working folder
and registers one dispatch; `bind` records the host session (id, model, start) once; `record`
attaches the session's usage and transcript digest to its rounds.

Dispatches, bindings and records are campaign log entries (`dispatch`, `bind`, `session`),
appended under the log's lock like every other entry, so they are part of the campaign's
history; a candidate entry names its `session` (a dispatch id) and the report counts rounds
per session. Nothing here judges anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path
from typing import Any

from rsi.errors import UsageError
from rules.campaign.documents import budget_doc
from rules.campaign.model import (
    Campaign,
    CampaignClosed,
    effective_policy,
    iso,
    state_of,
    task_target,
)
from rules.campaign.start import append_start
from rules.campaign.usage import validate_usage

BRIEF_SCHEMA = "rsi.agent.brief/1"
DISPATCH_SCHEMA = "rsi.agent.dispatch/1"
SESSIONS_SCHEMA = "rsi.agent.sessions/1"
BRIEF_NAME = "BRIEF.md"


# =============================================================================== description


def task_description(camp: Campaign) -> dict:
    """What the campaign asks of a candidate: the task's TASK.md, its contract (entry,
    signature, editable scope), the binding's threads and workload, the budget now, and how
    to submit. Read from the declarations and the log; runs nothing."""
    state = state_of(camp.log.read())
    doc: dict[str, Any] = {
        "schema": "rsi.agent.task/1",
        "campaign": str(camp.label),
        "kind": camp.kind,
        "binding": str(camp.binding.label),
        "editable": list(camp.scope),
        "budget": budget_doc(effective_policy(camp, state), state, camp.clock()),
        "submit": {
            "cli": f"rsi round {camp.label} --from DIR --hypothesis TEXT --usage FILE --json",
            "mcp": "tool submit_round {campaign, files: {path: content}, hypothesis, usage, "
            "session}",
            "final": f"rsi campaign final {camp.label} --json",
        },
    }
    task = task_target(camp)
    if task is not None:
        a, b = task.attrs, camp.binding.attrs
        folder = Path(camp.ws.root) / task.label.package
        docs = {}
        for name in a.get("docs") or []:
            path = folder / name
            if path.is_file() and name.endswith(".md"):
                docs[name] = path.read_text(errors="replace")
        doc.update(
            task=str(task.label),
            task_md=docs.get("TASK.md"),
            docs=sorted(docs),
            contract={
                "framework": a.get("framework"),
                "device": b.get("device") or a.get("device"),
                "entry": dict(a.get("entry") or {}),
                "signature": a.get("signature") or "",
                "editable": list(a.get("editable") or []),
                "tolerances": a.get("tolerances"),
                "public_cases": [c.get("name") for c in a.get("cases") or []],
            },
            binding_policy={
                "threads": b.get("threads"),
                "call_timeout_s": b.get("call_timeout_s"),
                "measure": b.get("measure"),
                "assess": b.get("assess"),
            },
            review=dict(a.get("review") or {}),
        )
    else:
        a = camp.binding.attrs
        doc.update(
            task=None,
            task_md=None,
            docs=[],
            contract={
                "quality_cmd": a.get("quality_cmd"),
                "benchmark_cmd": a.get("benchmark_cmd"),
                "metric": a.get("metric"),
                "direction": a.get("direction"),
                "editable": list(a.get("editable") or []),
            },
        )
    return doc


# ================================================================================== handoff


def _now_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(6)}"


def brief_text(desc: dict, dispatch: dict, work: Path) -> str:
    b = desc["budget"]
    lines = [
        f"# Brief: {desc['campaign']}",
        "",
        f"Dispatch `{dispatch['id']}` (session: bind it first: `rsi agent bind "
        f"{desc['campaign']} {dispatch['id']} --session ID --model NAME`).",
        "",
        "## Task",
        "",
        (
            desc.get("task_md") or "(an external project: see its quality and benchmark commands)"
        ).strip(),
        "",
        "## Contract",
        "",
        "```json",
        json.dumps(desc["contract"], indent=1, sort_keys=True),
        "```",
        "",
        "## Editable scope",
        "",
        *(f"- `{e}`" for e in desc["editable"]),
        "",
        "Only these files count; anything else in a submission is refused (a task) or ignored "
        "(a project).",
        "",
        "## Budget",
        "",
        f"- rounds: {b['rounds_used']} of {b['max_rounds']} used ({b['mode']}), "
        f"{b['rounds_left']} left",
        f"- seconds left for rounds: {b['seconds_left_for_rounds']}",
        f"- seconds left for the final: {b['seconds_left_for_final']}",
        "",
        "## How to submit",
        "",
        f"Work in `{work}`. Each round:",
        "",
        "```console",
        f"$ rsi round {desc['campaign']} --from {work}/candidate --hypothesis TEXT "
        f"--session {dispatch['id']} --json",
        "```",
        "",
        f"or the MCP tool `submit_round` (`rsi mcp`) with `session: {dispatch['id']}`. Read "
        "`verdict`, `reasons`, `speedup`, `review` and `accepted`: a PASS counts only when its "
        "independent review passes. When you are done, report your usage: `rsi agent record "
        f"{desc['campaign']} {dispatch['id']} --usage FILE --transcript FILE`.",
        "",
    ]
    return "\n".join(lines)


def prepare(camp: Campaign, work: Path, *, note: str | None = None) -> dict:
    """Write a brief (BRIEF.md, brief.json) and the baseline's editable files (a task) into
    `work`, a fresh (absent or empty) folder, and register one dispatch in the log."""
    work = Path(work)
    if work.exists() and (not work.is_dir() or any(work.iterdir())):
        raise UsageError(
            f"{work} is not a fresh folder (it exists and is not empty)",
            hint="give a new folder for the agent's working copy",
        )
    desc = task_description(camp)
    with camp.log.locked():
        state = state_of(camp.log.read())
        if state.start is None and not state.candidates:
            from rsi.runtime import open_store

            append_start(camp, open_store(camp.ws), camp.clock())
        entry = camp.log.append(
            {
                "kind": "dispatch",
                "time": camp.clock(),
                "id": _now_id("d"),
                "work": str(work.resolve()),
                "note": note or None,
            }
        )
    work.mkdir(parents=True, exist_ok=True)
    (work / "candidate").mkdir()
    task = task_target(camp)
    if task is not None:
        base = Path(camp.ws.root) / task.label.package / task.attrs["baseline"]
        for name in task.attrs["editable"]:
            src = base / name
            if src.is_file():
                (work / "candidate" / name).write_bytes(src.read_bytes())
    text = brief_text(desc, entry, work.resolve())
    (work / BRIEF_NAME).write_text(text)
    brief = {
        "schema": BRIEF_SCHEMA,
        "campaign": str(camp.label),
        "dispatch": entry["id"],
        "work": str(work.resolve()),
        "task": desc,
        "brief_sha256": hashlib.sha256(text.encode()).hexdigest(),
    }
    (work / "brief.json").write_text(json.dumps(brief, indent=1, sort_keys=True) + "\n")
    return {
        "schema": DISPATCH_SCHEMA,
        "campaign": str(camp.label),
        "dispatch": entry["id"],
        "work": str(work.resolve()),
        "brief": str(work.resolve() / BRIEF_NAME),
        "brief_sha256": brief["brief_sha256"],
        "state": "dispatched",
    }


def sessions_of(entries: list[dict]) -> dict[str, dict]:
    """Every dispatch by id: its binding (host session, model, start), records and rounds."""
    out: dict[str, dict] = {}
    number = 0
    for e in entries:
        kind = e.get("kind")
        if kind == "dispatch":
            out[e["id"]] = {
                "dispatch": e["id"],
                "dispatched_at": e["time"],
                "work": e.get("work"),
                "note": e.get("note"),
                "bound": None,
                "records": [],
                "rounds": [],
            }
        elif kind == "bind" and e.get("dispatch") in out:
            out[e["dispatch"]]["bound"] = {
                "session": e.get("session"),
                "model": e.get("model"),
                "host": e.get("host"),
                "started_at": e.get("started_at"),
                "time": e["time"],
            }
        elif kind == "session" and e.get("dispatch") in out:
            out[e["dispatch"]]["records"].append(
                {k: e.get(k) for k in ("time", "usage", "transcript", "rounds")}
            )
        elif kind == "candidate":
            number += 1
            if e.get("session") in out:
                out[e["session"]]["rounds"].append(number)
    return out


def _dispatch(camp: Campaign, entries: list[dict], dispatch: str) -> dict:
    found = sessions_of(entries).get(dispatch)
    if found is None:
        raise UsageError(
            f"{camp.label} has no dispatch {dispatch!r}",
            hint=f"rsi agent prepare {camp.label} DIR registers one",
        )
    return found


def bind(
    camp: Campaign,
    dispatch: str,
    session: str,
    *,
    model: str | None = None,
    host: str | None = None,
    started_at: float | None = None,
) -> dict:
    """Record the host session that took `dispatch` (once: a second bind is refused)."""
    if not session or not session.strip():
        raise UsageError("--session must name the host session id")
    with camp.log.locked():
        entries = camp.log.read()
        found = _dispatch(camp, entries, dispatch)
        if found["bound"] is not None:
            raise CampaignClosed(
                "dispatch_bound",
                f"dispatch {dispatch} of {camp.label} is already bound to session "
                f"{found['bound']['session']!r} (model {found['bound']['model']!r}) since "
                f"{iso(found['bound']['time'])}; a dispatch is taken by one session",
                hint=f"rsi agent prepare {camp.label} DIR for another session",
            )
        now = camp.clock()
        camp.log.append(
            {
                "kind": "bind",
                "time": now,
                "dispatch": dispatch,
                "session": session.strip(),
                "model": model or None,
                "host": host or None,
                "started_at": now if started_at is None else float(started_at),
            }
        )
        entries = camp.log.read()
    return dict(_dispatch(camp, entries, dispatch), schema=DISPATCH_SCHEMA, state="bound")


def record(
    camp: Campaign,
    dispatch: str,
    *,
    usage: dict | None = None,
    transcript: bytes | None = None,
    transcript_digest: str | None = None,
) -> dict:
    """Attach the session's usage and transcript digest (sha256 of its bytes) to its rounds."""
    usage = validate_usage(usage or {}, "usage")
    if transcript is not None:
        transcript_digest = "sha256:" + hashlib.sha256(transcript).hexdigest()
    with camp.log.locked():
        entries = camp.log.read()
        found = _dispatch(camp, entries, dispatch)
        if found["bound"] is None:
            raise CampaignClosed(
                "dispatch_unbound",
                f"dispatch {dispatch} of {camp.label} has no session bound yet",
                hint=f"rsi agent bind {camp.label} {dispatch} --session ID first",
            )
        camp.log.append(
            {
                "kind": "session",
                "time": camp.clock(),
                "dispatch": dispatch,
                "usage": usage,
                "transcript": transcript_digest,
                "rounds": found["rounds"],
            }
        )
        entries = camp.log.read()
    return dict(_dispatch(camp, entries, dispatch), schema=DISPATCH_SCHEMA, state="recorded")


def check_session(camp: Campaign, session: str | None) -> str | None:
    """A round's `session` names a bound dispatch of this campaign (else a UsageError)."""
    if session is None:
        return None
    found = sessions_of(camp.log.read()).get(session)
    if found is None:
        raise UsageError(
            f"{camp.label} has no dispatch {session!r}",
            hint=f"rsi agent prepare {camp.label} DIR, then bind it",
        )
    if found["bound"] is None:
        raise UsageError(
            f"dispatch {session} of {camp.label} is not bound to a session yet",
            hint=f"rsi agent bind {camp.label} {session} --session ID",
        )
    return session


def sessions_document(camp: Campaign) -> dict:
    """rsi.agent.sessions/1: every dispatch with its session, records and rounds, and the
    rounds no session claimed."""
    entries = camp.log.read()
    sessions = sessions_of(entries)
    claimed = {n for s in sessions.values() for n in s["rounds"]}
    total = len(state_of(entries).candidates)
    return {
        "schema": SESSIONS_SCHEMA,
        "campaign": str(camp.label),
        "sessions": list(sessions.values()),
        "rounds_without_session": [n for n in range(1, total + 1) if n not in claimed],
    }


def host_name() -> str:
    return os.uname().nodename
