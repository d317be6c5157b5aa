"""`rsi why`: read a target's last build from the event logs and say what ran and why. It must never
build or change a store."""

from __future__ import annotations

import json

from rsi.fsutil import read_regular
from rsi.label import Label
from rsi.store import LocalStore


def _needed_actions(store: LocalStore, label: str, ws) -> set[str] | None:
    """The actions `label` needs (itself and its dependencies), or None when unknown."""
    if ws is None:
        return None
    from rsi.build_analysis import load_graph
    from rsi.errors import RsiError

    try:
        labels, graph = load_graph(ws, [label], store)
    except RsiError:
        return None
    return graph.actions_for(labels)


def explain(store: LocalStore, target: str, ws=None) -> dict:
    label = str(Label.parse(target, ""))
    # NB: a build of several targets logs them all; only this target's actions are its story
    needed = _needed_actions(store, label, ws)
    logs = sorted(store.events_dir.glob("*.jsonl"), key=lambda p: p.stat().st_mtime, reverse=True)
    for log in logs:
        ran, cached, found, build_id = [], 0, False, None
        summarised, seen = 0, set()  # NB: hits not listed (`actions_cached`), actions listed
        try:
            lines = read_regular(log).decode(errors="replace").splitlines()
        except OSError:
            continue
        requested = False
        for line in lines:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            kind = ev.get("kind")
            if kind == "build_started":
                build_id = ev.get("build_id")
            elif kind == "target_started" and ev.get("label") == label:
                requested = True
            elif kind == "actions_cached":
                if not ev.get("listed"):
                    summarised += int(ev.get("count") or 0)
            elif kind in ("action_finished", "action_skipped"):
                seen.add(ev.get("action"))
                if kind == "action_skipped":
                    continue
                if needed is not None and ev.get("action") not in needed:
                    continue
                found = True
                if ev.get("cache") in ("hit", "remote_hit"):
                    cached += 1
                else:
                    ran.append(
                        {
                            "action": ev.get("action"),
                            "label": ev.get("label"),
                            "status": ev.get("status"),
                            "why": ev.get("why") or [],
                            "message": ev.get("message"),
                        }
                    )
        if summarised:
            # NB: the hits are a count for the whole build: this target's share is what it
            # needs that the log names otherwise (ran, failed, skipped), at most that count
            mine = summarised if needed is None else len(needed - seen)
            cached += min(mine, summarised)
            found = found or cached > 0
        if requested and found:
            return {
                "label": label,
                "build_id": build_id,
                "events": str(log),
                "ran": ran,
                "cached": cached,
                "fully_cached": not ran,
            }
    return {
        "label": label,
        "build_id": None,
        "events": None,
        "ran": [],
        "cached": 0,
        "fully_cached": None,
    }
