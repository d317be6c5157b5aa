"""Campaign commands for agents and people: `rsi candidate add`, `rsi round`, `rsi campaign
status|start|stop|abandon|final`. Registered through the `rsi.commands` entry point.

These commands are the only writers of a campaign's log and the only place the clock is read:
budget and deadline are checked here, under the log's lock. Everything they report about a
round comes from the round's targets (built, or looked up in the cache), never from here.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from rsi.errors import EXIT_USAGE, DeclarationError, RsiError, UsageError
from rsi.label import Label
from rules.campaign import (
    DEFAULT_EXCLUDE,
    HARNESS_DIR,
    JUDGE_CAMPAIGN_SCRIPTS,
    JUDGE_STEPS,
    CampaignLog,
    Policy,
    State,
    ended_reason,
    in_scope,
    manifest_digest,
    policy_of,
    project_spec,
    state_of,
    walk_files,
)
from rules.domain import HARNESS_SCRIPTS

ROUND_SCHEMA = "rsi.round/1"
ADD_SCHEMA = "rsi.candidate.add/1"
STATUS_SCHEMA = "rsi.campaign.status/1"
FINAL_SCHEMA = "rsi.campaign.final_result/1"
STOP_SCHEMA = "rsi.campaign.stop/1"
START_SCHEMA = "rsi.campaign.start/1"
ABANDON_SCHEMA = "rsi.campaign.abandon/1"
JUDGE_SCHEMA = "rsi.campaign.judge/1"
EXIT_REFUSED = 3
USAGE_KEYS = {
    "tokens": ("input", "output", "cached"),
    "calls": None,
    "wall_s": None,
    "device_s": None,
}


class CampaignClosed(RsiError):
    """The campaign refuses this request (budget used, deadline reached, stopped, still open)."""

    exit_code = EXIT_REFUSED

    def __init__(self, code: str, message: str, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.code = code


class JudgeChanged(DeclarationError):
    """What judges the campaign's rounds (binding specs, task runtime and baseline, harness
    scripts) differs from what was recorded at its start: rounds and the final are refused."""

    code = "judge_changed"


# =============================================================================== the campaign


@dataclass
class Campaign:
    ws: Any
    label: Label
    target: Any
    policy: Policy
    kind: str  # "task" | "project"
    binding: Any  # the binding or external_project target
    scope: list[str]
    log: CampaignLog
    # NB: what the campaign's commands read the time from and build with: a service (a job
    # runner, a dashboard, a test) passes its own; `builder(ws, patterns, events_to=,
    # lock_timeout=)` returns a BuildReport like rsi.build.build
    clock: Any = time.time
    builder: Any = None

    def sub(self, suffix: str) -> Label:
        return Label(self.label.package, f"{self.label.name}.{suffix}")

    def round_label(self, number: int) -> Label:
        return self.sub(f"round-{number}")


def _workspace(ctx: click.Context, **overrides: Any):
    from rsi.workspace import Workspace

    obj = ctx.find_root().obj or {}
    root = obj.get("workspace")
    ws = Workspace.load(Path(root).resolve()) if root else Workspace.discover()
    if obj.get("store"):
        overrides["store"] = obj["store"]
    return ws.with_overrides(**overrides)


def _current_package(ws) -> str:
    try:
        rel = Path.cwd().resolve().relative_to(ws.root)
    except ValueError:
        return ""
    return "" if str(rel) == "." else rel.as_posix()


def open_campaign(ws, text: str) -> Campaign:
    from rsi.build import make_loader

    loader = make_loader(ws)
    label = Label.parse(text, _current_package(ws))
    target = loader.target(label)
    if target.rule.name != "campaign":
        campaigns = [
            str(t.label)
            for t in loader.package(label.package).values()
            if t.rule.name == "campaign"
        ]
        raise UsageError(
            f"{label} is a target of rule {target.rule.name}, not a campaign",
            hint=("campaigns in this package: " + ", ".join(campaigns))
            if campaigns
            else 'declare one with rule = "campaign"',
        )
    policy = policy_of(target.attrs, target.file, str(label))
    binding = loader.target(target.attrs["binding"], wanted_by=target, field="binding")
    if binding.rule.name == "binding":
        task = loader.target(binding.attrs["task"], wanted_by=binding, field="task")
        kind, scope = "task", list(task.attrs["editable"])
    elif binding.rule.name == "external_project":
        kind, scope = "project", list(binding.attrs["editable"])
    else:
        raise DeclarationError(
            f"{binding.label} is a {binding.rule.name} target",
            file=target.file,
            target=str(label),
            field="binding",
            hint="point binding at a `binding` or `external_project` target",
        )
    return Campaign(
        ws, label, target, policy, kind, binding, scope, CampaignLog(ws.store_dir.resolve(), label)
    )


def effective_policy(camp: Campaign, state: State) -> Policy:
    """The policy recorded at the start (what the derived targets follow), else the declared one."""
    recorded = (state.start or {}).get("policy")
    if recorded:
        try:
            return Policy.from_json(recorded, camp.target.file, str(camp.label))
        except (DeclarationError, KeyError, TypeError):
            pass
    return camp.policy


def _project_drift(camp: Campaign, state: State) -> list[str]:
    recorded = ((state.start or {}).get("project") or {}).get("spec")
    if camp.kind != "project" or not recorded:
        return []
    try:
        live = project_spec(camp.binding.attrs, lambda m, f, h=None: DeclarationError(m))
    except DeclarationError as exc:
        return [
            f"{camp.binding.label} is now invalid ({exc.message}); the campaign keeps the "
            "judge it started with"
        ]
    changed = sorted(k for k in set(live) | set(recorded) if live.get(k) != recorded.get(k))
    return (
        [
            f"{camp.binding.label} changed since the start ({', '.join(changed)}); the campaign "
            "keeps the judge it started with"
        ]
        if changed
        else []
    )


def _check_policy_unchanged(camp: Campaign, state: State) -> None:
    if state.start is None:
        return
    was, now = state.start.get("policy"), camp.policy.to_json()
    changed = sorted(k for k in set(was or {}) | set(now) if (was or {}).get(k) != now.get(k))
    if state.start.get("binding") not in (None, str(camp.target.attrs["binding"])):
        changed.insert(0, "binding")
    if changed:
        raise DeclarationError(
            f"the campaign's declaration changed since it started ({', '.join(changed)}); a "
            "campaign's binding and budget are fixed at its start",
            file=camp.target.file,
            target=str(camp.label),
            field=changed[0],
            hint=f"restore the declaration as it was ({json.dumps(was, sort_keys=True)}), or "
            "declare a new campaign under another name",
        )


# ================================================================================= the judge


def _artifact_digest(store, art) -> str:
    if art.digest is not None:
        return str(art.digest)
    if art.symlink is not None:
        return f"symlink:{art.symlink}"
    return str(store.file_memo.digest(art.source))


def current_judge(camp: Campaign, store) -> dict:
    """Digests of everything that decides a round's verdict, the selection and the final, as
    the workspace holds them now: for a catalog task the binding's spec blobs (spec.json,
    check_spec.json: task contract, cases, tolerances, toolchain, measurement policy), the
    task's runtime and baseline files; for both kinds the harness scripts that judge. (An
    external project's commands, policy and tree are frozen at the start in full.)"""
    harness: set[str] = set(JUDGE_CAMPAIGN_SCRIPTS[camp.kind])
    doc: dict[str, Any] = {"schema": JUDGE_SCHEMA, "binding": str(camp.binding.label)}
    if camp.kind == "task":
        from rsi.build import load_graph

        for step in JUDGE_STEPS:
            harness.update(HARNESS_SCRIPTS[step])
        with store.lock(exclusive=False):
            _, graph = load_graph(camp.ws, [str(camp.binding.label)], store)
        info = graph.providers[camp.binding.label].info
        doc["spec"] = {
            "spec.json": _artifact_digest(store, info["spec_file"]),
            "check_spec.json": _artifact_digest(store, info["check_spec_file"]),
        }
        doc["runtime"] = {a.path: _artifact_digest(store, a) for a in info["runtime"]}
        doc["baseline"] = {a.path: _artifact_digest(store, a) for a in info["baseline"]}
    doc["harness"] = {
        name: str(store.file_memo.digest(HARNESS_DIR / name)) for name in sorted(harness)
    }
    return doc


def _flat(doc: Any, prefix: str = "", depth: int = 2) -> dict[str, Any]:
    if not isinstance(doc, dict) or depth == 0:
        return {prefix: doc}
    out: dict[str, Any] = {}
    for k, v in doc.items():
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k), depth - 1))
    return out


def _spec_fields(store, was: str, now: str) -> list[str]:
    """The spec fields that differ between two spec blobs (best effort: [] when unreadable)."""
    from rsi.digest import Digest

    try:
        old, new = (_flat(json.loads(store.read_bytes(Digest.parse(d)))) for d in (was, now))
    except (RsiError, ValueError, TypeError):
        return []
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


def judge_changes(recorded: dict, current: dict, store=None) -> list[str]:
    """One line per difference, naming the part and the file (and a spec's changed fields)."""
    changes = []
    if recorded.get("binding") not in (None, current.get("binding")):
        changes.append(f"binding {recorded['binding']} is now {current.get('binding')}")
    names = {
        "spec": "spec",
        "runtime": "task runtime file",
        "baseline": "baseline file",
        "harness": "harness script",
    }
    for part, noun in names.items():
        was, now = recorded.get(part) or {}, current.get(part) or {}
        for key in sorted(set(was) | set(now)):
            if was.get(key) == now.get(key):
                continue
            shown = str(HARNESS_DIR / key) if part == "harness" else key
            if key not in was:
                changes.append(f"{noun} {shown} was added")
            elif key not in now:
                changes.append(f"{noun} {shown} was removed")
            else:
                fields = (
                    _spec_fields(store, was[key], now[key])
                    if (part == "spec" and store is not None)
                    else []
                )
                changes.append(
                    f"{noun} {shown} changed" + (f" ({', '.join(fields)})" if fields else "")
                )
    return changes


def recorded_judge(state: State) -> dict | None:
    """The judge the campaign is fixed to: the start's, or the last regrade's that took a
    changed assessment policy from the declaration."""
    for entry in reversed(state.regrades):
        if entry.get("judge"):
            return entry["judge"]
    return (state.start or {}).get("judge")


def assess_only_change(recorded: dict, current: dict, store) -> list[str] | None:
    """The assessment-policy fields (`assess.…`) that differ between two judges when nothing
    else does (None: something else changed too, or nothing did)."""
    if not recorded or not current:
        return None
    if {k: v for k, v in recorded.items() if k != "spec"} != {
        k: v for k, v in current.items() if k != "spec"
    }:
        return None
    was, now = recorded.get("spec") or {}, current.get("spec") or {}
    if set(was) != set(now) or any(was[k] != now[k] for k in was if k != "spec.json"):
        return None
    if was.get("spec.json") == now.get("spec.json"):
        return None
    fields = _spec_fields(store, was["spec.json"], now["spec.json"])
    if not fields or not all(f.startswith("assess.") for f in fields):
        return None
    return fields


def judge_status(camp: Campaign, state: State, store) -> dict:
    """`unchanged`, `changed` (with `changes`), `unrecorded` (a log from before judges were
    recorded) or `unknown` (the binding cannot be analysed now: `error`)."""
    recorded = recorded_judge(state)
    if not recorded:
        return {
            "state": "unrecorded" if state.start or state.candidates else "not_started",
            "changes": [],
        }
    try:
        changes = judge_changes(recorded, current_judge(camp, store), store)
    except RsiError as exc:
        return {"state": "unknown", "changes": [], "error": exc.message}
    return {"state": "changed" if changes else "unchanged", "changes": changes}


def _check_judge_unchanged(camp: Campaign, state: State, store) -> None:
    """Refuse to judge anything under a judge other than the one recorded at the start."""
    if not recorded_judge(state):
        return
    judge = judge_status(camp, state, store)
    if judge["state"] == "unknown":
        raise JudgeChanged(
            f"the judge of {camp.label} cannot be checked against the one recorded at its "
            f"start: {judge['error']}",
            file=camp.target.file,
            target=str(camp.label),
            field="binding",
            hint="fix the binding's declaration as it was at the start",
        )
    if judge["state"] == "changed":
        fields = assess_only_change(recorded_judge(state), current_judge(camp, store), store)
        if fields:
            raise JudgeChanged(
                f"the assessment policy of {camp.label}'s binding changed since it was fixed "
                f"({', '.join(fields)}); rounds and the final are refused until the campaign "
                "takes it",
                file=camp.target.file,
                target=str(camp.label),
                field="binding",
                hint=f"rsi campaign regrade {camp.label} re-assesses every round under it from "
                "the retained measurements (nothing is measured again), or restore it",
            )
    if judge["state"] == "changed":
        raise JudgeChanged(
            f"the judge of {camp.label} changed since the campaign started: "
            f"{'; '.join(judge['changes'])}. A campaign's judge (its binding's specs, the task's "
            "runtime and baseline, the harness scripts) is fixed at its start; rounds and the "
            "final are refused so that no round is silently re-judged under another judge",
            file=camp.target.file,
            target=str(camp.label),
            field="binding",
            hint="restore what changed (e.g. `git checkout -- FILE`) to go on with this "
            "campaign, or declare a new campaign (another name) to judge under the new "
            "binding",
        )


# ==================================================================== attempts (derived state)


ATTEMPTS_SCHEMA = "rsi.campaign.attempts/1"


class Attempts:
    """The last build attempt of each round (and of the final) by `rsi round` / `rsi campaign
    final`: `building` (with its pid), `done` or `failed` (with the failed actions' messages).

    Derived, disposable state next to the log (`attempts.json`): it only lets `rsi campaign
    status` tell a round whose last build faulted (retryable) or was killed from one never
    built. The log stays the only source of truth, and a missing or unreadable file is simply
    no history. Written whole (temp file + rename) under its own lock; a failure to write it
    never fails a command."""

    def __init__(self, log: CampaignLog) -> None:
        self.path = log.dir / "attempts.json"
        self.lock_path = log.dir / "attempts.lock"

    def read(self) -> dict[str, dict]:
        try:
            doc = json.loads(self.path.read_bytes())
        except (OSError, ValueError):
            return {}
        if not isinstance(doc, dict) or doc.get("schema") != ATTEMPTS_SCHEMA:
            return {}
        last = doc.get("last")
        return (
            {k: v for k, v in last.items() if isinstance(v, dict)} if isinstance(last, dict) else {}
        )

    def record(self, key: str, outcome: str, **detail: Any) -> None:
        """Set the last attempt of `key` (`round-N` or `final`)."""
        from rsi.fsutil import atomic_write_bytes

        entry = {
            "outcome": outcome,
            "time": time.time(),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            **detail,
        }
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                last = self.read()
                last[key] = entry
                atomic_write_bytes(
                    self.path,
                    (
                        json.dumps(
                            {"schema": ATTEMPTS_SCHEMA, "last": last}, sort_keys=True, default=str
                        )
                        + "\n"
                    ).encode(),
                )
            finally:
                os.close(fd)
        except OSError:
            pass  # NB: disposable state; the log and the cache are what count


def attempt_state(attempt: dict | None) -> str:
    """What the last attempt says of a round that has no verdict in the cache."""
    if not attempt:
        return "not_built"
    outcome = attempt.get("outcome")
    if outcome == "building":
        if attempt.get("host") != socket.gethostname():
            return "building"
        try:
            os.kill(int(attempt.get("pid")), 0)
        except ProcessLookupError:
            return "interrupted"
        except (PermissionError, TypeError, ValueError, OverflowError):
            return "building"
        return "building"
    if outcome in ("failed", "not_built"):
        return "failed_retryable"
    return "not_built"  # NB: built once, but its result is no longer in the cache


# ============================================================================ budget and time


def _iso(t: float | None) -> str | None:
    return None if t is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def budget_doc(policy: Policy, state: State, now: float) -> dict:
    used = len(state.candidates)
    reason = ended_reason(policy, state, now)
    started = state.started_at
    close_at = final_at = None
    if policy.deadline_s is not None and started is not None:
        close_at = started + policy.deadline_s - policy.final_reserve_s
        final_at = started + policy.deadline_s
    final_allowed = (
        reason is not None
        and reason in policy.stop_on
        and (final_at is None or now < final_at)
        and used > 0
    )
    return {
        "mode": policy.mode,
        "max_rounds": policy.max_rounds,
        "rounds_used": used,
        "rounds_left": 0 if reason else policy.max_rounds - used,
        "deadline_s": policy.deadline_s,
        "final_reserve_s": policy.final_reserve_s,
        "started_at": started,
        "started_at_iso": _iso(started),
        "rounds_close_at": close_at,
        "final_deadline_at": final_at,
        "seconds_left_for_rounds": None
        if close_at is None or reason
        else round(max(0.0, close_at - now), 3),
        "seconds_left_for_final": None if final_at is None else round(max(0.0, final_at - now), 3),
        "state": "ended" if reason else "open",
        "ended_by": reason,
        "stop_on": list(policy.stop_on),
        "final_allowed": final_allowed,
    }


def _refusal(camp: Campaign, state: State, now: float) -> CampaignClosed | None:
    p, name = camp.policy, str(camp.label)
    if state.stop is not None:
        return CampaignClosed(
            "campaign_stopped",
            f"{name} was stopped ({state.stop['reason']}) "
            f"at {_iso(state.stop['time'])}; it takes no more rounds",
            hint=f"build its final: rsi campaign final {name}",
        )
    used = len(state.candidates)
    if used >= p.max_rounds:
        return CampaignClosed(
            "budget_exhausted",
            f"{name} has used all {p.max_rounds} rounds "
            f"({p.mode} {p.max_rounds}); it takes no more rounds",
            hint=f"build its final: rsi campaign final {name}",
        )
    if ended_reason(p, state, now) == "deadline":
        close_at = state.started_at + p.deadline_s - p.final_reserve_s
        return CampaignClosed(
            "deadline_reached",
            f"{name}'s round window closed at {_iso(close_at)} (deadline_s {p.deadline_s:g} "
            f"minus final_reserve_s {p.final_reserve_s:g} after the start at "
            f"{_iso(state.started_at)}); it takes no more rounds",
            hint=f"the final may start until {_iso(state.started_at + p.deadline_s)}: "
            f"rsi campaign final {name}",
        )
    return None


# ================================================================================ snapshots


def parse_usage(path: str | None) -> dict:
    """Validated usage; every value a number >= 0 or null, missing values null (never 0)."""
    blank = {
        "tokens": {"input": None, "output": None, "cached": None},
        "calls": None,
        "wall_s": None,
        "device_s": None,
    }
    if path is None:
        return blank
    where = "stdin" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
        doc = json.loads(text)
    except OSError as exc:
        raise UsageError(f"--usage {where}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"--usage {where}: not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise UsageError(
            f"--usage {where}: expected a JSON object",
            hint='e.g. {"tokens": {"input": 1200, "output": 300, "cached": null}, '
            '"calls": 3, "wall_s": 41.5, "device_s": null}',
        )

    def number(value: Any, field_name: str, integer: bool) -> Any:
        if value is None:
            return None
        ok = isinstance(value, int) if integer else isinstance(value, (int, float))
        if isinstance(value, bool) or not ok or value < 0 or value != value:
            raise UsageError(
                f"--usage {where}: field {field_name!r} must be a "
                f"{'whole' if integer else ''} number >= 0 or null, got {value!r}"
            )
        return value

    unknown = sorted(set(doc) - set(USAGE_KEYS))
    if unknown:
        raise UsageError(
            f"--usage {where}: unknown field(s) {unknown}",
            hint="known fields: tokens.input, tokens.output, tokens.cached, calls, "
            "wall_s, device_s",
        )
    out = dict(blank, tokens=dict(blank["tokens"]))
    tokens = doc.get("tokens")
    if tokens is not None:
        if not isinstance(tokens, dict) or set(tokens) - set(USAGE_KEYS["tokens"]):
            raise UsageError(
                f"--usage {where}: tokens must be an object with input, output, cached"
            )
        for k in USAGE_KEYS["tokens"]:
            out["tokens"][k] = number(tokens.get(k), f"tokens.{k}", True)
    t = out["tokens"]
    if t["cached"] is not None and t["input"] is not None and t["cached"] > t["input"]:
        raise UsageError(
            f"--usage {where}: tokens.cached ({t['cached']}) exceeds tokens.input ({t['input']})",
            hint="cached tokens are the part of the input served "
            "from a prompt cache; count them in input too (never added twice)",
        )
    out["calls"] = number(doc.get("calls"), "calls", True)
    out["wall_s"] = number(doc.get("wall_s"), "wall_s", False)
    out["device_s"] = number(doc.get("device_s"), "device_s", False)
    return out


def freeze_project(camp: Campaign, store) -> dict:
    """Hash and store the external project's tree: the baseline and protocol of this campaign."""
    b = camp.binding
    root = Path(b.attrs["root"])
    if not root.is_absolute():
        root = camp.ws.root / b.label.package / root
    root = root.resolve()
    if not root.is_dir():
        raise DeclarationError(
            f"the project folder {root} does not exist",
            file=b.file,
            target=str(b.label),
            field="root",
            hint="root is absolute or relative to the package folder",
        )
    exclude = DEFAULT_EXCLUDE + tuple(b.attrs["exclude"])
    found = walk_files(root, exclude, skip=(camp.ws.store_dir, camp.ws.out_dir))
    for pat in b.attrs["protocol"]:
        if pat not in found and not (pat.endswith("/") and any(r.startswith(pat) for r in found)):
            raise DeclarationError(
                f"protocol file {pat!r} is not in {root}",
                file=b.file,
                target=str(b.label),
                field="protocol",
            )
    for pat in b.attrs["editable"]:
        if not any(in_scope(r, [pat]) for r in found):
            raise DeclarationError(
                f"editable pattern {pat!r} matches no file in {root}",
                file=b.file,
                target=str(b.label),
                field="editable",
            )
    files, exe = {}, []
    for rel, path in sorted(found.items()):
        files[rel] = str(store.put_file(path))
        if os.access(path, os.X_OK):
            exe.append(rel)
    manifest = manifest_digest(files, exe)
    protocol = {rel: d for rel, d in files.items() if in_scope(rel, b.attrs["protocol"])}

    def error(message: str, field_name: str, hint: str | None = None) -> DeclarationError:
        return DeclarationError(
            message, file=b.file, target=str(b.label), field=field_name, hint=hint
        )

    return {
        "root": str(root),
        "files": files,
        "executable": exe,
        "manifest": manifest,
        "protocol": protocol,
        "n_files": len(files),
        "spec": project_spec(b.attrs, error),
    }


def snapshot_candidate(camp: Campaign, src: Path, state: State, store) -> dict:
    from rsi.digest import digest_file

    if not src.is_dir():
        raise UsageError(
            f"--from {src}: not a folder",
            hint="pass the folder holding the candidate's editable files",
        )
    if camp.kind == "task":
        found = walk_files(src)
        outside = sorted(r for r in found if r not in camp.scope)
        if outside:
            raise UsageError(
                f"--from {src}: {', '.join(outside)} lie outside the editable scope "
                f"({', '.join(camp.scope)})",
                hint="a candidate folder holds only (some of) the editable files",
            )
        take, ignored = found, []
        base_files, base_exe = {}, []
    else:
        project = state.start["project"]
        scope = (project.get("spec") or {}).get("editable") or camp.scope
        exclude = DEFAULT_EXCLUDE + tuple(camp.binding.attrs["exclude"])
        found = walk_files(src, exclude, skip=(camp.ws.store_dir, camp.ws.out_dir))
        take = {r: p for r, p in found.items() if in_scope(r, scope)}
        base_files = {r: d for r, d in project["files"].items() if in_scope(r, scope)}
        base_exe = [r for r in project.get("executable", []) if r in base_files]
        ignored = sorted(
            r
            for r, p in found.items()
            if not in_scope(r, scope)
            and (
                r not in project["files"]
                or str(digest_file(p, store.function)) != project["files"][r]
            )
        )
    if not take:
        raise UsageError(
            f"--from {src}: no file of the editable scope ({', '.join(camp.scope)}) is there"
        )
    files, exe = dict(base_files), set(base_exe)
    for rel, path in sorted(take.items()):
        files[rel] = str(store.put_file(path))
        exe.discard(rel)
        if os.access(path, os.X_OK):
            exe.add(rel)
    executable = sorted(exe)
    return {
        "files": files,
        "executable": executable,
        "digest": manifest_digest(files, executable),
        "ignored_outside_scope": ignored,
    }


# ============================================================================== log commands


def add_candidate(camp: Campaign, src: Path, hypothesis: str | None, usage: dict) -> dict:
    """Append the candidate (idempotent by content) and return {round, entry, added, ...}."""
    from rsi.build import open_store

    if not src.is_dir():
        # NB: checked here, not by click, so a --json caller gets a JSON refusal too
        raise UsageError(
            f"--from {src}: {'not a folder' if src.exists() else 'no such folder'}",
            hint="give the folder that holds the candidate's editable files",
        )
    store = open_store(camp.ws)
    with camp.log.locked():
        state = state_of(camp.log.read())
        _check_policy_unchanged(camp, state)
        _check_judge_unchanged(camp, state, store)
        now = camp.clock()
        started = False
        if state.start is None and not state.candidates:
            _append_start(camp, store, now)
            started = True
            state = state_of(camp.log.read())
        snap = snapshot_candidate(camp, src.resolve(), state, store)
        for number, cand in enumerate(state.candidates, 1):
            # NB: an abandoned round is given up on: the same content may come back as a new one
            if cand["digest"] == snap["digest"] and number not in state.abandoned:
                return {
                    "round": number,
                    "entry": cand,
                    "added": False,
                    "started": started,
                    "ignored_outside_scope": snap["ignored_outside_scope"],
                    "state": state,
                }
        refused = _refusal(camp, state, now)
        if refused is not None:
            if refused.code == "deadline_reached" and state.stop is None:
                camp.log.append({"kind": "stop", "time": now, "reason": "deadline"})
            raise refused
        entry = camp.log.append(
            {
                "kind": "candidate",
                "time": now,
                "digest": snap["digest"],
                "files": snap["files"],
                "executable": snap["executable"],
                "hypothesis": hypothesis or None,
                "usage": usage,
                "source": str(src.resolve()),
            }
        )
        state = state_of(camp.log.read())
        return {
            "round": len(state.candidates),
            "entry": entry,
            "added": True,
            "started": started,
            "ignored_outside_scope": snap["ignored_outside_scope"],
            "state": state,
        }


def _append_start(camp: Campaign, store, now: float) -> dict:
    project = freeze_project(camp, store) if camp.kind == "project" else None
    # NB: the judge is fixed before any candidate is measured: a later change is refused
    return camp.log.append(
        {
            "kind": "start",
            "time": now,
            "campaign": str(camp.label),
            "binding": str(camp.target.attrs["binding"]),
            "work": camp.kind,
            "policy": camp.policy.to_json(),
            "project": project,
            "judge": current_judge(camp, store),
        }
    )


# ============================================================================ reading results


def _outcome(graph, outcomes, art):
    return outcomes.get(graph.producer(art.producer)) if art.producer else None


def _artifact_evidence(ws, store, graph, outcomes, art) -> dict:
    outcome = _outcome(graph, outcomes, art)
    result = outcome.result if outcome is not None and outcome.ok else None
    out = result.output_map.get(art.path) if result else None
    if out is None:
        return {"digest": None, "path": None, "blob": None}
    return {
        "digest": str(out.digest),
        "path": str(ws.out_dir / art.path),
        "blob": str(store.blob_path(out.digest)),
    }


def _read_json_output(store, graph, outcomes, art) -> dict | None:
    outcome = _outcome(graph, outcomes, art)
    result = outcome.result if outcome is not None and outcome.ok else None
    out = result.output_map.get(art.path) if result else None
    if out is None:
        return None
    try:
        return json.loads(store.read_bytes(out.digest))
    except (RsiError, ValueError):
        return None


def cached_outcomes(ws, store, labels: list[Label]):
    """What a build of `labels` would serve from the cache, running nothing."""
    from rsi.build import load_graph
    from rsi.events import EventLog
    from rsi.scheduler import Scheduler

    _, graph = load_graph(ws, [str(lb) for lb in labels], store)
    lookup = Scheduler(store, None, EventLog(None, progress=False), salt=ws.salt)
    return graph, lookup.lookup(graph, graph.actions_for(labels))


def _select_from_rounds(store, graph, outcomes, label: Label) -> dict | None:
    """best.json as the Select action would write it, from the rounds' cached documents (None
    while some round has none): a round never has to build `best`, so concurrent rounds never
    run (and replace) each other's actions through it."""
    docs = []
    for rlabel in graph.targets[label].attrs["rounds"]:
        rlabel = Label.parse(str(rlabel))
        prov = graph.providers.get(rlabel)
        doc = None if prov is None else _read_json_output(store, graph, outcomes, prov.info["doc"])
        if doc is None:
            return None
        docs.append(doc)
    return _harness_module("select").select(docs)


def best_summary(store, graph, outcomes, label: Label) -> dict:
    if graph is None or label not in graph.providers:
        # NB: no round is missing evidence, and none has passed: `none`, as documented
        return {
            "state": "none",
            "label": str(label),
            "detail": "no round has been submitted",
            "n_rounds": 0,
        }
    doc = _read_json_output(store, graph, outcomes, graph.providers[label].info["best"])
    if doc is None:
        doc = _select_from_rounds(store, graph, outcomes, label)
    if doc is None:
        return {
            "state": "unavailable",
            "label": str(label),
            "detail": "not built: some round has no evidence yet (still running, or its "
            "last attempt failed: retry it with `rsi round CAMPAIGN --round N`, "
            "or give up on a round that keeps faulting with `rsi campaign "
            "abandon CAMPAIGN --round N --reason TEXT`)",
        }
    sel = doc["selected"]
    if sel is None:
        return {
            "state": "none",
            "label": str(label),
            "detail": "no round has passed yet",
            "n_rounds": doc["n_rounds"],
        }
    return {
        "state": "selected",
        "label": str(label),
        "round": sel["round"],
        "round_label": sel["label"],
        "candidate_digest": sel["candidate_digest"],
        "speedup": sel["speedup"],
        "verdict": sel["verdict"],
        "n_rounds": doc["n_rounds"],
        "n_eligible": doc["n_eligible"],
        "rule": doc["rule"],
    }


ROUND_FIELDS = (
    "verdict",
    "reasons",
    "speedup",
    "noise_floor",
    "threshold",
    "min_improvement",
    "n_pairs",
    "metric",
    "direction",
    "correctness",
    "candidate",
    "usage",
    "submitted_at",
)


def round_document(
    camp: Campaign,
    number: int,
    graph,
    outcomes,
    store,
    *,
    cache: str | None,
    failed: list[dict],
    added: bool | None,
    state: State,
    now: float,
    best: dict | None = None,
) -> dict:
    label = camp.round_label(number)
    prov = graph.providers[label]
    round_doc = _read_json_output(store, graph, outcomes, prov.info["doc"])
    evidence = {
        name: _artifact_evidence(camp.ws, store, graph, outcomes, prov.info[key])
        for name, key in (
            ("round", "doc"),
            ("verdict", "verdict"),
            ("check", "check"),
            ("samples", "samples"),
            ("table", "table"),
        )
    }
    doc: dict[str, Any] = {
        "schema": ROUND_SCHEMA,
        "campaign": str(camp.label),
        "round": number,
        "label": str(label),
        "kind": camp.kind,
    }
    if round_doc is not None:
        doc["state"] = "done"
        doc.update({k: round_doc.get(k) for k in ROUND_FIELDS})
    else:
        entry = state.candidates[number - 1]
        doc["state"] = "failed" if failed else "not_built"
        doc.update({k: None for k in ROUND_FIELDS})
        doc["candidate"] = {
            "digest": entry["digest"],
            "files": entry["files"],
            "hypothesis": entry.get("hypothesis"),
        }
        doc["usage"], doc["submitted_at"] = entry.get("usage"), entry["time"]
    doc["retryable"] = doc["state"] != "done"
    doc["cache"] = cache
    doc["added"] = added
    doc["evidence"] = evidence
    doc["errors"] = failed
    if doc["state"] != "done":
        doc["hint"] = (
            f"no verdict yet (an infrastructure fault or an interrupted build is never "
            f"cached): retry with `rsi round {camp.label} --round {number}`; if it "
            f"keeps faulting, `rsi campaign abandon {camp.label} --round {number} "
            "--reason TEXT` stops it from blocking best, final and report"
        )
    doc["budget"] = budget_doc(effective_policy(camp, state), state, now)
    if best is None:
        best = best_summary(store, graph, outcomes, camp.sub("best"))
    doc["best"] = best
    reuse = evidence_reuse(camp, number, graph, outcomes, now)
    doc["evidence_reuse"] = reuse
    # NB: `reused`: nothing of the judge ran for this round: its check and measurement (and
    # so its verdict) are those of the same content under the same binding, judged before
    doc["reused"] = all(r is not None and r["reused"] for r in reuse.values())
    return doc


def best_now(camp: Campaign, store) -> dict:
    """The campaign's best as the cache has it now (runs nothing)."""
    if not state_of(camp.log.read()).candidates:
        return best_summary(store, None, {}, camp.sub("best"))
    try:
        with store.lock(exclusive=False):
            graph, outcomes = cached_outcomes(camp.ws, store, [camp.sub("best")])
    except RsiError as exc:
        return {"state": "unavailable", "label": str(camp.sub("best")), "detail": exc.message}
    return best_summary(store, graph, outcomes, camp.sub("best"))


EVIDENCE_INDEX = "evidence-index.json"


def _read_index(path: Path) -> dict:
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _update_index(path: Path, entries: dict) -> None:
    """Add `entries` (output digest -> where it was produced) to the store's evidence index:
    derived, disposable state (a failure to write it never fails a round)."""
    from rsi.fsutil import atomic_write_bytes

    try:
        fd = os.open(path.with_name(EVIDENCE_INDEX + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            index = _read_index(path)
            for digest, where in entries.items():
                index.setdefault(digest, where)  # NB: the first producer is the source
            atomic_write_bytes(path, (json.dumps(index, sort_keys=True) + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass


def evidence_reuse(camp: Campaign, number: int, graph, outcomes, now: float) -> dict:
    """For round `number`'s check, samples and verdict: produced by this build (`reused`
    false), or reused from the cache, and then `from` the round that produced it (any round of
    any campaign of this store: evidence is keyed by the binding and the candidate's content,
    never by the round; null when its producer is not on record, e.g. `rsi build`)."""
    prov = graph.providers[camp.round_label(number)]
    index_path = camp.log.store_root / "campaigns" / EVIDENCE_INDEX
    index = _read_index(index_path)
    here = {"campaign": str(camp.label), "round": number, "label": str(camp.round_label(number))}
    produced, out = {}, {}
    for part in ("check", "samples", "verdict"):
        art = prov.info[part]
        outcome = _outcome(graph, outcomes, art)
        result = outcome.result if outcome is not None and outcome.ok else None
        found = result.output_map.get(art.path) if result else None
        if found is None:
            out[part] = None
            continue
        digest = str(found.digest)
        if outcome.status == "executed":
            produced[digest] = dict(here, time=now)
            out[part] = {"reused": False, "digest": digest, "from": None}
        else:
            out[part] = {"reused": True, "digest": digest, "from": index.get(digest)}
    if produced:
        _update_index(index_path, produced)
    return out


def _attempt_message(errors: list[dict]) -> str | None:
    if not errors:
        return None
    first = next((e for e in errors if e.get("status") != "skipped"), errors[0])
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{first['action']}: {first['status']}: {first['message']}{more}"


def _build(camp: Campaign, labels: list[Label], events, lock_timeout: float | None = None) -> Any:
    from rsi.build import build

    ws = camp.ws.with_overrides(keep_going=True)
    return (camp.builder or build)(
        ws, [str(lb) for lb in labels], events_to=events, lock_timeout=lock_timeout
    )


@contextmanager
def _campaign_flock(path: Path, waiting: str):
    """An exclusive flock on `path` (a file in the campaign's folder); a wait says why on
    stderr and stays interruptible (Ctrl-C)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            click.echo(f"rsi: waiting: {waiting}", err=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _binding_cached(camp: Campaign, store, number: int) -> bool:
    """Whether every action of round `number`'s binding (baseline check, A/A calibration; a
    project's frozen baseline) is in the cache, looked up without running anything."""
    label = camp.round_label(number)
    try:
        with store.lock(exclusive=False):
            graph, outcomes = cached_outcomes(camp.ws, store, [label])
        binding = Label.parse(str(graph.targets[label].attrs["binding"]))
        wanted = graph.actions_for([binding])
    except (RsiError, KeyError):
        return False
    return all(a in outcomes for a in wanted)


def build_round(
    camp: Campaign, store, number: int, events, lock_timeout: float | None = None
) -> Any:
    """Build round `number` alone (never `best`, which would build every other round too).

    Concurrent rounds of one campaign never run each other's actions: one build of a round at
    a time (its lock in the campaign folder: a retry waits for the build in progress and is
    then served from the cache), and the binding's shared actions are built by one round at a
    time until they are cached, so every round is judged against the same calibration and no
    result a caller was given is ever replaced by a rerun."""
    import hashlib

    labels = [camp.round_label(number)]
    entry = state_of(camp.log.read()).candidates[number - 1]
    binding = str(camp.target.attrs["binding"])
    locks = camp.log.store_root / "campaigns" / "locks"

    def name(*parts: str) -> str:
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32] + ".lock"

    # NB: keyed by what the evidence is keyed by (binding and content), store-wide: the same
    # content submitted to two campaigns at once is judged once, the other waits and reuses it
    with _campaign_flock(
        locks / name("candidate", binding, entry["digest"]),
        f"round {number} of {camp.label} (or the same content in another round) is being "
        "judged by another process",
    ):
        if _binding_cached(camp, store, number):
            return _build(camp, labels, events, lock_timeout)
        with _campaign_flock(
            locks / name("binding", binding),
            f"another round under {binding} is building the binding's baseline evidence",
        ):
            return _build(camp, labels, events, lock_timeout)


LOCK_TIMEOUT = click.option(
    "--lock-timeout",
    type=float,
    metavar="SECONDS",
    help="Give up (exit 1, retryable) when the host lock (RSI_HOST_LOCK) is not free within "
    "SECONDS (default: wait, saying who holds it).",
)


def _failures(report, label: Label) -> list[dict]:
    return [
        {"action": f["action"], "status": f["status"], "message": f["message"]}
        for f in report.targets.get(str(label), {}).get("failed", [])
    ]


# ================================================================================== output


def _emit_json(doc: dict) -> None:
    click.echo(json.dumps(doc, indent=2, sort_keys=True, default=str))


def _fail_json(schema: str, campaign: str, exc: RsiError) -> None:
    code = getattr(exc, "code", None) or type(exc).__name__
    _emit_json(
        {
            "schema": schema,
            "campaign": campaign,
            "state": "refused" if isinstance(exc, CampaignClosed) else "error",
            "error": {"code": code, "message": exc.message, "hint": exc.hint},
        }
    )
    sys.exit(exc.exit_code)


def _fmt_speed(sp: dict | None) -> str:
    if not sp:
        return "speedup: null"
    return f"speedup {sp['point']:.3f}x [{sp['lo']:.3f}, {sp['hi']:.3f}] at {sp['confidence']:.0%}"


def _budget_line(b: dict) -> str:
    parts = [f"rounds {b['rounds_used']}/{b['max_rounds']} ({b['mode']}), {b['rounds_left']} left"]
    if b["seconds_left_for_rounds"] is not None:
        parts.append(f"{b['seconds_left_for_rounds']:.0f}s left for rounds")
    if b["seconds_left_for_final"] is not None:
        parts.append(f"{b['seconds_left_for_final']:.0f}s left for the final")
    parts.append(b["state"] + (f" ({b['ended_by']})" if b["ended_by"] else ""))
    return "budget: " + ", ".join(parts)


def _best_line(best: dict) -> str:
    if best["state"] != "selected":
        return f"best: {best['state']} ({best.get('detail', '')})"
    return f"best: round {best['round']}, {_fmt_speed(best['speedup'])}"


# ================================================================================ commands


def _json_errors(schema: str) -> type[click.Command]:
    """A command class whose command-line refusals (a bad option value, a missing argument,
    an unknown option) are, under --json, the command's JSON error document too (exit 2),
    like every other refusal: an agent never has to parse click's text."""

    class JsonErrors(click.Command):
        def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
            wants_json = "--json" in args
            # NB: click's parser consumes `args`; the campaign is read before it does
            first = args[0] if args and not args[0].startswith("-") else None
            try:
                return super().parse_args(ctx, args)
            except click.UsageError as exc:
                if not wants_json:
                    raise
                _emit_json(
                    {
                        "schema": schema,
                        "campaign": first,
                        "state": "error",
                        "error": {
                            "code": "UsageError",
                            "message": exc.format_message(),
                            "hint": f"see {ctx.command_path} --help",
                        },
                    }
                )
                ctx.exit(EXIT_USAGE)

    return JsonErrors


@click.group("candidate")
def candidate() -> None:
    """Submit candidates to a campaign's append-only log."""


@candidate.command("add", cls=_json_errors(ADD_SCHEMA))
@click.argument("campaign")
@click.option(
    "--from",
    "src",
    required=True,
    type=click.Path(),
    help="Folder holding the candidate's editable files (for an external project: "
    "the working copy; only the editable scope is taken).",
)
@click.option("--hypothesis", help="Why this candidate should be faster (kept in the log).")
@click.option(
    "--usage",
    "usage_file",
    help="JSON file ('-' for stdin) with what producing "
    "this candidate cost: tokens {input, output, cached}, calls, wall_s, device_s.",
)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def candidate_add(
    ctx: click.Context,
    campaign: str,
    src: str,
    hypothesis: str | None,
    usage_file: str | None,
    as_json: bool,
) -> None:
    """Append a candidate to CAMPAIGN's log and print its round's label.

    The same content submitted again names the existing round and adds nothing. Refused (exit 3)
    when the campaign takes no more rounds.
    """
    try:
        camp = open_campaign(_workspace(ctx), campaign)
        usage = parse_usage(usage_file)
        res = add_candidate(camp, Path(src), hypothesis, usage)
    except RsiError as exc:
        if as_json:
            _fail_json(ADD_SCHEMA, campaign, exc)
        raise
    label = str(camp.round_label(res["round"]))
    if as_json:
        _emit_json(
            {
                "schema": ADD_SCHEMA,
                "campaign": str(camp.label),
                "round": res["round"],
                "label": label,
                "added": res["added"],
                "digest": res["entry"]["digest"],
                "ignored_outside_scope": res["ignored_outside_scope"],
                "budget": budget_doc(camp.policy, res["state"], camp.clock()),
            }
        )
        return
    if not res["added"]:
        click.echo(f"rsi: note: identical to round {res['round']}; nothing was added", err=True)
    for rel in res["ignored_outside_scope"]:
        click.echo(
            f"rsi: note: ignored {rel} (outside the editable scope, differs from the "
            "frozen baseline)",
            err=True,
        )
    click.echo(label)


ROUND_ATTEMPTS = 3


def _round_error(camp: Campaign, number: int, doc: dict) -> dict:
    """End round `number` in the `error` state: an `abandon` entry marked `error`, so the
    campaign goes on (the round counts against the budget and is never selected)."""
    message = _attempt_message(doc["errors"]) or "the build failed"
    with camp.log.locked():
        state = state_of(camp.log.read())
        if number not in state.abandoned:
            camp.log.append(
                {
                    "kind": "abandon",
                    "time": camp.clock(),
                    "round": number,
                    "reason": f"error: an infrastructure fault in {ROUND_ATTEMPTS} attempts: "
                    + message.splitlines()[0][:500],
                    "error": True,
                }
            )
    return dict(
        doc,
        state="error",
        retryable=False,
        hint=f"the round ended in the error state after {ROUND_ATTEMPTS} attempts; it counts "
        "against the budget, is never selected, and blocks nothing; submit a new candidate",
    )


def run_round(
    camp: Campaign,
    *,
    src: Path | None = None,
    number: int | None = None,
    hypothesis: str | None = None,
    usage: dict | None = None,
    events=None,
    lock_timeout: float | None = None,
) -> dict:
    """`rsi round` in process: submit `src` as a new candidate and build its round, or build
    (retry) round `number`; returns the rsi.round/1 document. Raises RsiError for refusals
    (CampaignClosed), usage and declaration errors; an infrastructure fault is retried, then
    the round ends in the `error` state (the document says so)."""
    if (src is None) == (number is None):
        raise UsageError("give exactly one of --from DIR (a new candidate) or --round N")
    from rsi.build import open_store

    store = open_store(camp.ws)
    added = None
    if src is not None:
        res = add_candidate(camp, Path(src), hypothesis, usage or {})
        number, added = res["round"], res["added"]
    else:
        state = state_of(camp.log.read())
        if number > len(state.candidates):
            raise UsageError(
                f"{camp.label} has {len(state.candidates)} round(s); there is no round {number}"
            )
        _check_judge_unchanged(camp, state, store)
        gave_up = state.abandoned.get(number)
        if gave_up is not None:
            raise CampaignClosed(
                "round_abandoned",
                f"round {number} of {camp.label} was abandoned at "
                f"{_iso(gave_up['time'])} ({gave_up.get('reason') or 'no reason given'}); "
                "it is never built for the campaign again",
                hint=f"submit a new candidate: rsi round {camp.label} --from DIR",
            )
    attempts, key = Attempts(camp.log), f"round-{number}"
    # NB: a candidate's own failure is a verdict (the referee attributes every abnormal end
    # after the import to it); what fails a build is an infrastructure fault, retried at
    # most twice, after which the round ends in the explicit `error` state and no longer
    # blocks best, final or report
    for attempt in range(1, ROUND_ATTEMPTS + 1):
        attempts.record(key, "building")
        try:
            report = build_round(camp, store, number, events, lock_timeout)
        except RsiError as exc:
            attempts.record(key, "failed", errors=[], message=exc.message)
            raise
        state = state_of(camp.log.read())
        rt = report.targets[str(camp.round_label(number))]
        doc = round_document(
            camp,
            number,
            report.graph,
            report.outcomes,
            store,
            cache=rt["cache"],
            failed=_failures(report, camp.round_label(number)),
            added=added,
            state=state,
            now=camp.clock(),
            best=best_now(camp, store),
        )
        attempts.record(
            key,
            doc["state"],
            errors=doc["errors"],
            message=_attempt_message(doc["errors"]),
            attempt=attempt,
            verdict_doc=_verdict_view(doc) if doc["state"] == "done" else None,
        )
        if doc["state"] != "failed":
            break
    if doc["state"] == "failed":
        doc = _round_error(camp, number, doc)
    return doc


class Campaigns:
    """The campaign commands as an in-process service, for whatever drives rounds without a
    shell (a job service, a dashboard, an agent server, a test): each method returns the
    command's JSON document or raises its RsiError. `clock` is what budgets, deadlines and log
    entries read the time from; `builder` builds (rsi.build.build by default)."""

    def __init__(self, ws, *, clock=time.time, builder=None) -> None:
        self.ws, self.clock, self.builder = ws, clock, builder

    def open(self, campaign: str) -> Campaign:
        camp = open_campaign(self.ws, campaign)
        camp.clock, camp.builder = self.clock, self.builder
        return camp

    def _store(self, camp: Campaign):
        from rsi.build import open_store

        return open_store(camp.ws)

    def round(self, campaign: str, **kw: Any) -> dict:
        """rsi.round/1: `src=` a folder (a new candidate) or `number=` (an existing round)."""
        return run_round(self.open(campaign), **kw)

    def status(self, campaign: str) -> dict:
        camp = self.open(campaign)
        return status_document(camp, self._store(camp))

    def best(self, campaign: str) -> dict:
        camp = self.open(campaign)
        return best_now(camp, self._store(camp))

    def regrade(self, campaign: str, events=None, **assess: Any) -> dict:
        camp = self.open(campaign)
        return regrade(camp, self._store(camp), assess, events=events)


@click.command("round", cls=_json_errors(ROUND_SCHEMA))
@click.argument("campaign")
@click.option(
    "--from",
    "src",
    type=click.Path(),
    help="Submit this folder as a new candidate, then build its round.",
)
@click.option(
    "--round", "number", type=click.IntRange(1), help="Build (or retry) an existing round instead."
)
@click.option("--hypothesis", help="Why this candidate should be faster.")
@click.option("--usage", "usage_file", help="JSON file ('-' for stdin) with the agent's usage.")
@click.option(
    "--events",
    type=click.File("w"),
    help="Also write the build's event stream (JSON lines) to this file.",
)
@LOCK_TIMEOUT
@click.option("--json", "as_json", is_flag=True, help="Print one rsi.round/1 document.")
@click.pass_context
def round_cmd(
    ctx: click.Context,
    campaign: str,
    src: str | None,
    number: int | None,
    hypothesis: str | None,
    usage_file: str | None,
    events,
    lock_timeout: float | None,
    as_json: bool,
) -> None:
    """Submit a candidate and build its round in one call (or rebuild round N).

    \b
    Exit codes:
      0  the round has a verdict (PASS, FAIL or INCONCLUSIVE)
      1  no verdict: an infrastructure fault; the round is retryable (--round N)
      2  usage or declaration error
      3  refused: the campaign takes no more rounds (budget, deadline, stopped)
    """
    try:
        if (src is None) == (number is None):
            raise UsageError("give exactly one of --from DIR (a new candidate) or --round N")
        camp = open_campaign(_workspace(ctx), campaign)
        doc = run_round(
            camp,
            src=None if src is None else Path(src),
            number=number,
            hypothesis=hypothesis,
            usage=parse_usage(usage_file) if src is not None else None,
            events=events,
            lock_timeout=lock_timeout,
        )
        added, number = doc["added"], doc["round"]
    except RsiError as exc:
        if as_json:
            _fail_json(ROUND_SCHEMA, campaign, exc)
        raise
    if as_json:
        _emit_json(doc)
    else:
        if added is False:
            click.echo(f"rsi: note: identical to round {number}; nothing was added", err=True)
        click.echo(
            f"{doc['label']}: {doc['state']}" + (f" ({doc['cache']})" if doc["cache"] else "")
        )
        if doc["state"] == "done" and doc["evidence"]["table"]["path"]:
            click.echo(Path(doc["evidence"]["table"]["path"]).read_text().rstrip())
        for err in doc["errors"]:
            click.echo(f"  {err['action']}: {err['status']}: {err['message']}")
        if doc.get("hint"):
            click.echo(f"  hint: {doc['hint']}")
        click.echo(_budget_line(doc["budget"]))
        click.echo(_best_line(doc["best"]))
    sys.exit(0 if doc["state"] == "done" else 1)


@click.group("campaign")
def campaign_group() -> None:
    """Inspect and steer campaigns (status, start, stop, abandon, final)."""


@campaign_group.command("status", cls=_json_errors(STATUS_SCHEMA))
@click.argument("campaign")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def campaign_status(ctx: click.Context, campaign: str, as_json: bool) -> None:
    """Rounds, verdicts, best, budget, usage totals and the final's state — from the log and the
    cache only; runs nothing."""
    from rsi.build import open_store

    try:
        camp = open_campaign(_workspace(ctx), campaign)
        doc = status_document(camp, open_store(camp.ws))
    except RsiError as exc:
        if as_json:
            _fail_json(STATUS_SCHEMA, campaign, exc)
        raise
    if as_json:
        _emit_json(doc)
        return
    click.echo(f"{doc['campaign']} ({doc['kind']}, binding {doc['binding']})")
    click.echo(_budget_line(doc["budget"]))
    for r in doc["rounds"]:
        sp = f"  {_fmt_speed(r['speedup'])}" if r["speedup"] else ""
        what = r["state"] if r["state"] != "done" else r["verdict"]
        if r["state"] == "abandoned":
            what += f" ({r['abandoned']['reason']})"
        elif r["state"] == "failed_retryable" and (r["last_attempt"] or {}).get("message"):
            what += f" ({r['last_attempt']['message'].splitlines()[0][:120]})"
        click.echo(
            f"  round {r['round']}: {what}{sp}"
            + (f"  — {r['hypothesis']}" if r["hypothesis"] else "")
        )
    click.echo(_best_line(doc["best"]))
    fin = doc["final"]
    click.echo(
        f"final: {fin['state']}"
        + (f" {fin['verdict']}" if fin.get("verdict") else "")
        + (f" ({fin['detail']})" if fin.get("detail") else "")
    )
    totals = doc["usage"]["totals"]
    click.echo(
        "usage: " + ", ".join(f"{k}={'null' if v is None else v}" for k, v in totals.items())
    )
    for warning in doc["warnings"]:
        click.echo(f"warning: {warning}")


def _harness_module(stem: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        f"_rsi_campaign_{stem}", HARNESS_DIR / f"{stem}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def status_document(camp: Campaign, store) -> dict:
    now = camp.clock()
    state = state_of(camp.log.read())
    n = len(state.candidates)
    graph, outcomes = None, {}
    if n:
        with store.lock(exclusive=False):
            graph, outcomes = cached_outcomes(
                camp.ws,
                store,
                [
                    *(camp.round_label(i) for i in range(1, n + 1)),
                    camp.sub("best"),
                    camp.sub("final"),
                ],
            )
    attempts = Attempts(camp.log).read()
    rounds = []
    for i, entry in enumerate(state.candidates, 1):
        doc = _read_json_output(
            store, graph, outcomes, graph.providers[camp.round_label(i)].info["doc"]
        )
        gave_up = state.abandoned.get(i)
        last = attempts.get(f"round-{i}")
        if gave_up is not None:
            rstate = "error" if gave_up.get("error") else "abandoned"
        elif doc:
            rstate = "done"
        else:
            rstate = attempt_state(last)
        row = {
            "round": i,
            "label": str(camp.round_label(i)),
            "state": rstate,
            "retryable": rstate not in ("done", "abandoned", "error"),
            "verdict": doc["verdict"] if doc else None,
            "speedup": doc["speedup"] if doc else None,
            "failure_kind": doc["correctness"]["failure_kind"] if doc else None,
            "candidate_digest": entry["digest"],
            "hypothesis": entry.get("hypothesis"),
            "submitted_at": entry["time"],
            "usage": entry.get("usage"),
            "last_attempt": None
            if not last
            else {
                "outcome": last.get("outcome"),
                "attempt": last.get("attempt"),
                "time": last.get("time"),
                "message": last.get("message"),
                "errors": last.get("errors") or [],
            },
        }
        if gave_up is not None:
            row["abandoned"] = {"time": gave_up["time"], "reason": gave_up.get("reason")}
        rounds.append(row)
    final = {"state": "not_started", "label": None}
    if n:
        flabel = camp.sub("final")
        fdoc = _read_json_output(store, graph, outcomes, graph.providers[flabel].info["final"])
        pending = graph.providers[flabel].info["state"] == "pending"
        if pending:
            still_open = not ended_reason(effective_policy(camp, state), state)
            final = {
                "state": "pending",
                "label": str(flabel),
                "detail": "the campaign is still open"
                if still_open
                else "the campaign ended by a reason it does not accept",
            }
        elif fdoc is None:
            last = attempts.get("final")
            fstate = attempt_state(last)
            why = ((last or {}).get("message") or "no message").splitlines()[0]
            detail = {
                "failed_retryable": f"its last build failed ({why}); run `rsi campaign "
                f"final {camp.label}` again",
                "interrupted": "its last build was interrupted; run `rsi campaign final "
                f"{camp.label}` again",
                "building": "being built now",
            }.get(fstate, f"run `rsi campaign final {camp.label}`")
            final = {"state": fstate, "label": str(flabel), "detail": detail}
        else:
            final = {
                "state": fdoc["state"],
                "label": str(flabel),
                "verdict": fdoc.get("verdict"),
                "speedup": fdoc.get("speedup"),
                "selected": fdoc.get("selected"),
                "reasons": fdoc.get("reasons"),
            }
    usage = _harness_module("report").usage_totals([r["usage"] or {} for r in rounds])
    project = (state.start or {}).get("project")
    drift = _project_drift(camp, state)
    try:
        _check_policy_unchanged(camp, state)
    except DeclarationError as exc:
        drift.append(exc.message)
    judge = judge_status(camp, state, store)
    if judge["state"] == "changed":
        drift.append(
            f"the judge changed since the start ({'; '.join(judge['changes'])}): "
            "rounds and the final are refused (and rounds shown here are looked up "
            "under the current judge); restore what changed, or declare a new campaign"
        )
    elif judge["state"] == "unknown":
        drift.append(f"the judge cannot be checked against the start: {judge['error']}")
    elif judge["state"] == "unrecorded":
        drift.append(
            "no judge was recorded at this campaign's start (an older rsi): changes to "
            "the binding's files cannot be detected"
        )
    policy = effective_policy(camp, state)
    return {
        "schema": STATUS_SCHEMA,
        "campaign": str(camp.label),
        "kind": camp.kind,
        "binding": str(camp.target.attrs["binding"]),
        "log": str(camp.log.path),
        "budget": budget_doc(policy, state, now),
        "rounds": rounds,
        "counts": {
            **{
                v: sum(1 for r in rounds if r["verdict"] == v and r["state"] == "done")
                for v in ("PASS", "FAIL", "INCONCLUSIVE")
            },
            "abandoned": len(state.abandoned),
        },
        "judge": judge,
        "best": best_summary(store, graph, outcomes, camp.sub("best")),
        "final": final,
        "usage": usage,
        "frozen": None
        if not project
        else {
            "root": project["root"],
            "manifest": project["manifest"],
            "n_files": project["n_files"],
            "protocol": project["protocol"],
        },
        "warnings": drift,
    }


@campaign_group.command("start", cls=_json_errors(START_SCHEMA))
@click.argument("campaign")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def campaign_start(ctx: click.Context, campaign: str, as_json: bool) -> None:
    """Start CAMPAIGN's clock now and (for an external project) freeze its tree. Optional: the
    first candidate starts a campaign that was not started."""
    from rsi.build import open_store

    try:
        camp = open_campaign(_workspace(ctx), campaign)
        store = open_store(camp.ws)
        with camp.log.locked():
            state = state_of(camp.log.read())
            _check_policy_unchanged(camp, state)
            new = state.start is None and not state.candidates
            if new:
                _append_start(camp, store, camp.clock())
                state = state_of(camp.log.read())
    except RsiError as exc:
        if as_json:
            _fail_json(START_SCHEMA, campaign, exc)
        raise
    project = (state.start or {}).get("project")
    doc = {
        "schema": START_SCHEMA,
        "campaign": str(camp.label),
        "started": new,
        "started_at": state.started_at,
        "log": str(camp.log.path),
        "frozen": None
        if not project
        else {
            "root": project["root"],
            "manifest": project["manifest"],
            "n_files": project["n_files"],
            "protocol": project["protocol"],
        },
        "budget": budget_doc(camp.policy, state, camp.clock()),
    }
    if as_json:
        _emit_json(doc)
    else:
        click.echo(
            f"{camp.label}: {'started' if new else 'already started'} at {_iso(state.started_at)}"
        )
        if project:
            click.echo(
                f"  frozen {project['n_files']} files of {project['root']} "
                f"(manifest {project['manifest']})"
            )


@campaign_group.command("stop", cls=_json_errors(STOP_SCHEMA))
@click.argument("campaign")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def campaign_stop(ctx: click.Context, campaign: str, as_json: bool) -> None:
    """End CAMPAIGN's rounds now (the agent's early stop; up_to campaigns that accept 'agent')."""
    try:
        camp = open_campaign(_workspace(ctx), campaign)
        with camp.log.locked():
            state = state_of(camp.log.read())
            _check_policy_unchanged(camp, state)
            now = camp.clock()
            reason = ended_reason(camp.policy, state, now)
            if reason is None:
                if "agent" not in camp.policy.stop_on:
                    raise CampaignClosed(
                        "stop_not_accepted",
                        f"{camp.label} does not accept an early stop "
                        f"(stop_on = {list(camp.policy.stop_on)}, rounds {camp.policy.mode} "
                        f"{camp.policy.max_rounds}); {len(state.candidates)} round(s) used",
                        hint="submit the remaining rounds, or wait for the deadline",
                    )
                if not state.candidates:
                    raise CampaignClosed(
                        "no_rounds",
                        f"{camp.label} has no round yet; a campaign stops after at least one",
                    )
                camp.log.append({"kind": "stop", "time": now, "reason": "agent"})
                stopped = True
            else:
                if reason == "deadline" and state.stop is None:
                    camp.log.append({"kind": "stop", "time": now, "reason": "deadline"})
                stopped = False
            state = state_of(camp.log.read())
    except RsiError as exc:
        if as_json:
            _fail_json(STOP_SCHEMA, campaign, exc)
        raise
    doc = {
        "schema": STOP_SCHEMA,
        "campaign": str(camp.label),
        "stopped_now": stopped,
        "budget": budget_doc(camp.policy, state, camp.clock()),
    }
    if as_json:
        _emit_json(doc)
    else:
        b = doc["budget"]
        click.echo(
            f"{camp.label}: {'stopped' if stopped else 'already ended'} "
            f"({b['ended_by']}); final allowed: {'yes' if b['final_allowed'] else 'no'}"
        )


@campaign_group.command("abandon", cls=_json_errors(ABANDON_SCHEMA))
@click.argument("campaign")
@click.option(
    "--round", "number", type=click.IntRange(1), required=True, help="The round to give up on."
)
@click.option("--reason", required=True, help="Why (kept in the log and the report).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def campaign_abandon(
    ctx: click.Context, campaign: str, number: int, reason: str, as_json: bool
) -> None:
    """Give up on round N of CAMPAIGN, one without a verdict that keeps faulting.

    An `abandon` entry is appended to the log (crash-safe, like every entry). The round still
    counts against the budget, is never selected, and no longer blocks best, final and report.
    Refused (exit 3) for a round that already has a verdict; asking again is a no-op.
    """
    from rsi.build import open_store

    try:
        if not reason.strip():
            raise UsageError("--reason must say why the round is abandoned")
        camp = open_campaign(_workspace(ctx), campaign)
        store = open_store(camp.ws)
        with camp.log.locked():
            state = state_of(camp.log.read())
            if number > len(state.candidates):
                raise UsageError(
                    f"{camp.label} has {len(state.candidates)} round(s); there is no round {number}"
                )
            _check_policy_unchanged(camp, state)
            _check_judge_unchanged(camp, state, store)
            entry = state.abandoned.get(number)
            now_ = entry is None
            if now_:
                label = camp.round_label(number)
                with store.lock(exclusive=False):
                    graph, outcomes = cached_outcomes(camp.ws, store, [label])
                doc = _read_json_output(store, graph, outcomes, graph.providers[label].info["doc"])
                if doc is not None:
                    raise CampaignClosed(
                        "round_has_verdict",
                        f"round {number} of {camp.label} has a verdict "
                        f"({doc['verdict']}); only a round without one can be abandoned",
                        hint="a verdict never blocks the campaign: nothing to give up on",
                    )
                entry = camp.log.append(
                    {
                        "kind": "abandon",
                        "time": camp.clock(),
                        "round": number,
                        "reason": reason.strip(),
                    }
                )
            state = state_of(camp.log.read())
    except RsiError as exc:
        if as_json:
            _fail_json(ABANDON_SCHEMA, campaign, exc)
        raise
    doc = {
        "schema": ABANDON_SCHEMA,
        "campaign": str(camp.label),
        "round": number,
        "label": str(camp.round_label(number)),
        "abandoned_now": now_,
        "reason": entry.get("reason"),
        "abandoned_at": entry["time"],
        "budget": budget_doc(effective_policy(camp, state), state, camp.clock()),
    }
    if as_json:
        _emit_json(doc)
    else:
        click.echo(
            f"{doc['label']}: {'abandoned' if now_ else 'already abandoned'} "
            f"({doc['reason']}); it still counts against the budget "
            f"({doc['budget']['rounds_used']}/{doc['budget']['max_rounds']} used)"
        )


REGRADE_SCHEMA = "rsi.campaign.regrade/1"
REGRADE_FIELDS = ("verdict", "speedup", "threshold", "min_improvement", "reasons")
ASSESS_LIMITS = {
    "min_improvement": (0.0, None),
    "confidence": (0.0, 1.0),
    "bootstrap_resamples": (1, None),
    "min_pairs": (1, None),
}


def _ran(graph, outcomes, label: Label, part: str) -> bool:
    outcome = _outcome(graph, outcomes, graph.providers[label].info[part])
    return outcome is not None and outcome.status == "executed"


def _verdict_view(doc: dict | None) -> dict | None:
    if doc is None:
        return None
    view = {k: doc.get(k) for k in REGRADE_FIELDS}
    view["reasons"] = sorted(
        r if isinstance(r, str) else r.get("code") for r in doc.get("reasons") or []
    )
    return view


def cached_round_docs(camp: Campaign, store, numbers: list[int]) -> dict[int, dict | None]:
    """Each round's document as the cache has it now (runs nothing; None: not built)."""
    if not numbers:
        return {}
    labels = [camp.round_label(i) for i in numbers]
    with store.lock(exclusive=False):
        graph, outcomes = cached_outcomes(camp.ws, store, labels)
    return {
        i: _read_json_output(store, graph, outcomes, graph.providers[lb].info["doc"])
        for i, lb in zip(numbers, labels, strict=True)
    }


def _before_regrade(
    camp: Campaign, store, state: State, numbers: list[int], declared: bool
) -> dict[int, dict | None]:
    """The round documents before a regrade. Once the declaration's policy changed, the
    cached rounds are those under the policy fixed before: the last rsi.round/1 documents
    returned (kept in attempts.json) stand for them."""
    if not declared:
        return cached_round_docs(camp, store, numbers)
    last = Attempts(camp.log).read()
    return {i: (last.get(f"round-{i}") or {}).get("verdict_doc") for i in numbers}


def regrade(
    camp: Campaign,
    store,
    assess: dict,
    *,
    events=None,
    lock_timeout: float | None = None,
) -> dict:
    """Re-assess every round (abandoned ones aside) under the campaign's assessment policy
    with `assess` applied, from the measurements already in the cache: check and measure keys
    do not depend on the assessment policy, so no measure action runs (the document counts
    them). The new policy is a `regrade` entry in the log, so later rounds, best, final and
    report follow it. Returns rsi.campaign.regrade/1 with what changed in each verdict."""
    if camp.kind != "task":
        raise UsageError(
            f"{camp.label} judges an external project: regrade is for catalog-task campaigns",
            hint="an external project's assessment policy is frozen with its tree at the start",
        )
    for name, value in assess.items():
        lo, hi = ASSESS_LIMITS[name]
        if value < lo or (hi is not None and value >= hi) or (name == "confidence" and value <= 0):
            raise UsageError(
                f"--{name.replace('_', '-')} {value} is out of range"
                + (f" ({lo} < value < {hi})" if hi is not None else f" (at least {lo})")
            )
    state = state_of(camp.log.read())
    if not state.candidates:
        raise UsageError(f"{camp.label} has no round to regrade")
    # NB: a declaration whose assessment policy (only) changed is taken: the new judge is
    # recorded with the regrade, and the rounds' verdicts before it are those under the old
    current = current_judge(camp, store)
    declared = assess_only_change(recorded_judge(state), current, store)
    if declared is None:
        _check_judge_unchanged(camp, state, store)
    numbers = [i for i in range(1, len(state.candidates) + 1) if i not in state.abandoned]
    before = _before_regrade(camp, store, state, numbers, declared is not None)
    with camp.log.locked():
        state = state_of(camp.log.read())
        was = state.assess_override
        # NB: a changed declaration replaces the policy; given values apply on top of it
        policy = dict({} if declared else was, **assess)
        if policy != was or declared:
            entry = {"kind": "regrade", "time": camp.clock(), "assess": policy, "was": was}
            if declared:
                entry.update(judge=current, declared=declared)
            camp.log.append(entry)
    report = _build(camp, [camp.round_label(i) for i in numbers], events, lock_timeout)
    graph = report.graph
    executed: dict[str, int] = {}
    for action_id, outcome in report.outcomes.items():
        if outcome.status == "executed":
            mnemonic = graph.actions[action_id].mnemonic
            executed[mnemonic] = executed.get(mnemonic, 0) + 1
    rounds = []
    for i in numbers:
        lb = camp.round_label(i)
        after = _read_json_output(store, graph, report.outcomes, graph.providers[lb].info["doc"])
        old, new = _verdict_view(before[i]), _verdict_view(after)
        if new is not None:
            Attempts(camp.log).record(f"round-{i}", "done", verdict_doc=new, regraded=True)
        changed = (
            sorted(k for k in REGRADE_FIELDS if (old or {}).get(k) != (new or {}).get(k))
            if old is not None and new is not None
            else []
        )
        rounds.append(
            {
                "round": i,
                "label": str(lb),
                # NB: `built`: it had no measurement yet, so this build measured it
                "state": "failed"
                if new is None
                else ("built" if _ran(graph, report.outcomes, lb, "samples") else "regraded"),
                "before": old,
                "after": new,
                "changed": changed,
                "errors": _failures(report, lb),
            }
        )
    return {
        "schema": REGRADE_SCHEMA,
        "campaign": str(camp.label),
        "assess": policy,
        "was": was,
        "logged": policy != was or bool(declared),
        "declared_changes": declared or [],
        "rounds": rounds,
        "n_changed": sum(1 for r in rounds if r["changed"]),
        "executed": executed,
        "measure_actions": sum(executed.get(m, 0) for m in ("Measure", "Calibrate", "Check")),
        "best": best_now(camp, store),
        "wall_s": report.wall_s,
    }


@campaign_group.command("regrade", cls=_json_errors(REGRADE_SCHEMA))
@click.argument("campaign")
@click.option("--min-improvement", type=float, help="New assess.min_improvement (e.g. 0.05).")
@click.option("--confidence", type=float, help="New assess.confidence (e.g. 0.95).")
@click.option("--bootstrap-resamples", type=int, help="New assess.bootstrap_resamples.")
@click.option("--min-pairs", type=int, help="New assess.min_pairs.")
@click.option("--events", type=click.File("w"), help="Also write the build's event stream.")
@LOCK_TIMEOUT
@click.option("--json", "as_json", is_flag=True, help="Print one rsi.campaign.regrade/1 document.")
@click.pass_context
def campaign_regrade(
    ctx: click.Context,
    campaign: str,
    min_improvement: float | None,
    confidence: float | None,
    bootstrap_resamples: int | None,
    min_pairs: int | None,
    events,
    lock_timeout: float | None,
    as_json: bool,
) -> None:
    """Re-assess every round of CAMPAIGN from its retained measurements (no measure action
    runs), under the assessment policy with the options given applied; lists what changed in
    each verdict. The new policy is logged: later rounds, best, final and report follow it.

    \b
    Exit codes: 0 every round has a verdict (a round never built before is measured now:
    state `built`); 1 some round's build failed (retry it); 2 usage error."""
    from rsi.build import open_store

    given = {
        "min_improvement": min_improvement,
        "confidence": confidence,
        "bootstrap_resamples": bootstrap_resamples,
        "min_pairs": min_pairs,
    }
    try:
        camp = open_campaign(_workspace(ctx), campaign)
        doc = regrade(
            camp,
            open_store(camp.ws),
            {k: v for k, v in given.items() if v is not None},
            events=events,
            lock_timeout=lock_timeout,
        )
    except RsiError as exc:
        if as_json:
            _fail_json(REGRADE_SCHEMA, campaign, exc)
        raise
    if as_json:
        _emit_json(doc)
    else:
        click.echo(
            f"{doc['campaign']}: regraded {len(doc['rounds'])} round(s) under assess "
            f"{json.dumps(doc['assess'], sort_keys=True)}; {doc['n_changed']} verdict(s) changed, "
            f"{doc['measure_actions']} measure action(s) run"
        )
        for r in doc["rounds"]:
            if r["state"] != "regraded":
                click.echo(f"  round {r['round']}: {r['state']}")
            elif r["changed"]:
                for k in r["changed"]:
                    click.echo(f"  round {r['round']}: {k}: {r['before'][k]} -> {r['after'][k]}")
            else:
                click.echo(f"  round {r['round']}: unchanged ({r['after']['verdict']})")
        click.echo(_best_line(doc["best"]))
    sys.exit(0 if all(r["state"] != "failed" for r in doc["rounds"]) else 1)


@campaign_group.command("final", cls=_json_errors(FINAL_SCHEMA))
@click.argument("campaign")
@click.option("--events", type=click.File("w"), help="Also write the build's event stream.")
@LOCK_TIMEOUT
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def campaign_final(
    ctx: click.Context, campaign: str, events, lock_timeout: float | None, as_json: bool
) -> None:
    """Build CAMPAIGN's final (and report) once its rounds are over: an independent re-measure
    of the selected candidate. Asking again returns the cached final; a final that failed for
    an infrastructure fault runs again.

    \b
    Exit codes: 0 final built, 1 infrastructure fault (retry), 2 usage, 3 refused.
    """
    try:
        camp = open_campaign(_workspace(ctx), campaign)
        from rsi.build import open_store

        store = open_store(camp.ws)
        flabel, rlabel = camp.sub("final"), camp.sub("report")
        with camp.log.locked():
            state = state_of(camp.log.read())
            _check_policy_unchanged(camp, state)
            _check_judge_unchanged(camp, state, store)
            now = camp.clock()
            try:
                _final_allowed(camp, state, now)
            except CampaignClosed as refused:
                if refused.code != "deadline_passed":
                    raise
                late = refused  # NB: a final already built stays readable after the deadline
            else:
                late = None
                if ended_reason(camp.policy, state) is None and state.stop is None:
                    camp.log.append({"kind": "stop", "time": now, "reason": "deadline"})
        if late is not None:
            with store.lock(exclusive=False):
                graph, outcomes = cached_outcomes(camp.ws, store, [flabel, rlabel])
            fart = graph.providers[flabel].info["final"]
            if _read_json_output(store, graph, outcomes, fart) is None:
                raise late
            cache, failed = "hit", []
        else:
            attempts = Attempts(camp.log)
            attempts.record("final", "building")
            try:
                report = _build(camp, [flabel, rlabel], events, lock_timeout)
            except RsiError as exc:
                attempts.record("final", "failed", errors=[], message=exc.message)
                raise
            graph, outcomes = report.graph, report.outcomes
            cache, failed = report.targets[str(flabel)]["cache"], _failures(report, flabel)
        prov = graph.providers[flabel]
        fdoc = _read_json_output(store, graph, outcomes, prov.info["final"])
        if late is None:
            attempts.record(
                "final",
                "done" if fdoc is not None else "failed",
                errors=failed,
                message=_attempt_message(failed),
            )
        state = state_of(camp.log.read())
        doc = {
            "schema": FINAL_SCHEMA,
            "campaign": str(camp.label),
            "label": str(flabel),
            "state": "done" if fdoc is not None else "failed",
            "retryable": fdoc is None,
            "cache": cache,
            "final": fdoc,
            "evidence": {
                a.path.rsplit("/", 1)[-1]: _artifact_evidence(camp.ws, store, graph, outcomes, a)
                for a in prov.files
            },
            "report": {
                a.path.rsplit("/", 1)[-1]: _artifact_evidence(camp.ws, store, graph, outcomes, a)
                for a in graph.providers[rlabel].files
            },
            "errors": failed,
            "budget": budget_doc(camp.policy, state, camp.clock()),
            # NB: the one step whose design forbids evidence reuse by content
            "evidence_reuse": "never: the final re-runs the baseline check, calibration, check "
            "and paired measurement with fresh seeds and new pairs under its own keys, so it "
            "is never served from a round's evidence (its own result is cached)",
        }
    except RsiError as exc:
        if as_json:
            _fail_json(FINAL_SCHEMA, campaign, exc)
        raise
    if as_json:
        _emit_json(doc)
    else:
        click.echo(f"{doc['label']}: {doc['state']} ({doc['cache']})")
        table = doc["evidence"].get("verdict.txt", {}).get("path")
        if fdoc and fdoc.get("state") == "done" and table:
            click.echo(f"selected: round {fdoc['selected']['round']}")
            click.echo(Path(table).read_text().rstrip())
        elif fdoc:
            click.echo(f"{fdoc['state']}: {fdoc.get('message', '')}")
        for err in doc["errors"]:
            click.echo(f"  {err['action']}: {err['status']}: {err['message']}")
        if doc["report"].get("report.md", {}).get("path"):
            click.echo(f"report: {doc['report']['report.md']['path']}")
    sys.exit(0 if doc["state"] == "done" else 1)


def _final_allowed(camp: Campaign, state: State, now: float) -> None:
    p, name = camp.policy, str(camp.label)
    if not state.candidates:
        raise CampaignClosed("no_rounds", f"{name} has no round; there is nothing to confirm")
    reason = ended_reason(p, state, now)
    if reason is None:
        left = p.max_rounds - len(state.candidates)
        how = [f"use the {left} remaining round(s)"]
        if "agent" in p.stop_on:
            how.append(f"stop it now: rsi campaign stop {name}")
        if p.deadline_s is not None and "deadline" in p.stop_on:
            how.append(
                f"or wait for the round window to close at "
                f"{_iso(state.started_at + p.deadline_s - p.final_reserve_s)}"
            )
        raise CampaignClosed(
            "campaign_open",
            f"{name} is still open ({len(state.candidates)} "
            f"of {p.max_rounds} rounds, {p.mode}); its final comes after its "
            "rounds",
            hint="; ".join(how),
        )
    if reason not in p.stop_on:
        raise CampaignClosed(
            "stop_not_accepted",
            f"{name} ended by '{reason}', which it does not "
            f"accept (stop_on = {list(p.stop_on)}): it has no valid final",
        )
    if p.deadline_s is not None and now >= state.started_at + p.deadline_s:
        raise CampaignClosed(
            "deadline_passed",
            f"{name}'s deadline passed at "
            f"{_iso(state.started_at + p.deadline_s)}; the final had to start "
            f"within its reserve ({p.final_reserve_s:g} s)",
            hint=f"a final already built stays readable: rsi campaign status {name}",
        )
