"""The judge of a campaign: digests of everything that decides its verdicts (binding specs, task
runtime and baseline, harness scripts), recorded at the start; a later change refuses rounds and the
final (or, for an assessment policy alone, asks for a regrade). It must never run a candidate or
read the clock."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from rsi.errors import DeclarationError, RsiError
from rsi.executors.host_python import identity_imports, legacy_identity, packages
from rules.campaign.model import Campaign, State, knowledge_policy, project_spec
from rules.providers import BindingInfo
from rules.steps import HARNESS_DIR, SCRIPTS

# NB: the scripts that decide a verdict, the selection and the final: a campaign records their
# digests at its start and refuses to go on when one changes (rendering and reporting scripts
# are presentation and may change freely)
JUDGE_STEPS = ("check", "measure", "assess")
JUDGE_CAMPAIGN_SCRIPTS = {
    "task": ("selection.py", "final.py", "review.py", "review_ast.py", "review_rules.py"),
    # NB: assess.py loads sequential.py (the design's interval): a change to it is a new judge
    "project": (
        "project.py",
        "assess.py",
        "stats.py",
        "sequential.py",
        "_core.py",
        "selection.py",
        "final.py",
    ),
}


JUDGE_SCHEMA = "rsi.campaign.judge/1"


class JudgeChanged(DeclarationError):
    """What judges the campaign's rounds (binding specs, task runtime and baseline, harness
    scripts) differs from what was recorded at its start: rounds and the final are refused."""

    code = "judge_changed"


def project_drift(camp: Campaign, state: State) -> list[str]:
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


def check_policy_unchanged(camp: Campaign, state: State) -> None:
    if state.start is None:
        return
    was, now = state.start.get("policy"), camp.policy.to_json()
    changed = sorted(k for k in set(was or {}) | set(now) if (was or {}).get(k) != now.get(k))
    if state.start.get("binding") not in (None, str(camp.target.attrs["binding"])):
        changed.insert(0, "binding")
    if "knowledge" in state.start:
        # NB: knowledge on or off (and its sources and budget) is fixed at the start too
        if state.start["knowledge"] != knowledge_policy(camp.target.attrs):
            changed.append("knowledge")
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


def _artifact_digest(store, art) -> str:
    if art.digest is not None:
        return str(art.digest)
    if art.symlink is not None:
        return f"symlink:{art.symlink}"
    return str(store.file_memo.digest(art.source))


def current_judge(camp: Campaign, store, graph=None) -> dict:
    """Digests of everything that decides a round's verdict, the selection and the final, as
    the workspace holds them now: for a catalog task the binding's spec blobs (spec.json,
    check_spec.json: task contract, cases, tolerances, toolchain, measurement policy), the
    task's runtime and baseline files; for both kinds the harness scripts that judge. (An
    external project's commands, policy and tree are frozen at the start in full.) `graph`: an
    analysis of the workspace as it is now that holds the binding, where the caller has one."""
    harness: set[str] = set(JUDGE_CAMPAIGN_SCRIPTS[camp.kind])
    doc: dict[str, Any] = {"schema": JUDGE_SCHEMA, "binding": str(camp.binding.label)}
    if camp.kind == "task":
        from rsi.build_analysis import load_graph

        for step in JUDGE_STEPS:
            harness.update(SCRIPTS[step])
        if graph is None or camp.binding.label not in graph.providers:
            with store.lock(exclusive=False):
                _, graph = load_graph(camp.ws, [str(camp.binding.label)], store)
        info = BindingInfo.of(graph.providers[camp.binding.label])
        if info.full_spec.get("ranks"):
            harness.update(SCRIPTS["multirank"])  # NB: a multi-rank binding's judge
        doc["spec"] = {
            "spec.json": _artifact_digest(store, info.spec_file),
            "check_spec.json": _artifact_digest(store, info.check_spec_file),
        }
        imports = identity_imports(str(info.full_spec.get("toolchain") or ""))
        if imports:
            # NB: the packages behind the interpreter's identity (the spec holds only its
            # digest), so a change names the package and version that moved
            doc["toolchain"] = packages(imports)
        doc["runtime"] = {a.path: _artifact_digest(store, a) for a in info.runtime}
        doc["baseline"] = {a.path: _artifact_digest(store, a) for a in info.baseline}
        # NB: the task's review rules decide acceptance: fixed at the start like the rest
        doc["review"] = {
            "rules": "sha256:"
            + hashlib.sha256(
                json.dumps(dict(info.task.review), sort_keys=True).encode()
            ).hexdigest(),
            **{a.path: _artifact_digest(store, a) for a in info.task.review_files},
        }
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


def _spec_diff(store, was: str, now: str) -> dict[str, tuple]:
    """{field: (old, new)} of the spec fields that differ between two spec blobs (best
    effort: {} when unreadable)."""
    from rsi.digest import Digest

    try:
        old, new = (_flat(json.loads(store.read_bytes(Digest.parse(d)))) for d in (was, now))
    except (RsiError, ValueError, TypeError):
        return {}
    return {
        k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)
    }


def _spec_fields(store, was: str, now: str) -> list[str]:
    """The spec fields that differ between two spec blobs (best effort: [] when unreadable)."""
    return list(_spec_diff(store, was, now))


def _version(entry: str) -> str:
    return entry.split(" ", 1)[0]


def _package_changes(was: dict, now: dict) -> list[str]:
    """One line per package of the judge's interpreter that moved since the start."""
    out = []
    for name in sorted(set(was) | set(now)):
        old, new = was.get(name), now.get(name)
        if old == new:
            continue
        if name.startswith("module "):
            out.append(
                f"interpreter: {name} was {old or 'from a package'}, "
                f"is now {new or 'from a package'}"
            )
        elif old is None:
            out.append(f"package {name} {_version(new)} is now needed by the judge's imports")
        elif new is None or new == "absent":
            out.append(f"package {name} {_version(old)} is no longer installed")
        elif old == "absent":
            out.append(f"package {name} was missing and is now {_version(new)}")
        elif _version(old) != _version(new):
            out.append(f"package {name} {_version(old)} is now {_version(new)}")
        else:
            out.append(f"package {name} {_version(old)} was reinstalled with other files")
    return out


def _interpreter_only(diff: dict[str, tuple]) -> bool:
    return list(diff) == ["toolchain"] and all(
        str(v or "").startswith("host-python@") for v in diff["toolchain"]
    )


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
        "review": "review",
    }
    # NB: a judge recorded before it named its packages has no `toolchain` part: the spec's
    # toolchain field alone says that the interpreter moved
    packages_now = recorded.get("toolchain") is not None
    if packages_now:
        changes += _package_changes(recorded["toolchain"], current.get("toolchain") or {})
    interpreter_told = False
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
                diff = (
                    _spec_diff(store, was[key], now[key])
                    if (part == "spec" and store is not None)
                    else {}
                )
                if diff and _interpreter_only(diff):
                    old_id, new_id = diff["toolchain"]
                    if packages_now or old_id == legacy_identity() or interpreter_told:
                        # NB: explained by the package lines, or the same interpreter under
                        # the identity rsi gave it before identities named their modules
                        continue
                    interpreter_told = True
                    changes.append(
                        f"interpreter: the judge's packages differ from the start's "
                        f"(toolchain {old_id} is now {new_id})"
                    )
                    continue
                changes.append(
                    f"{noun} {shown} changed" + (f" ({', '.join(diff)})" if diff else "")
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
    # NB: a judge recorded before judges named their packages has no `toolchain` part
    skip = {"spec"} | ({"toolchain"} if "toolchain" not in recorded else set())
    if {k: v for k, v in recorded.items() if k not in skip} != {
        k: v for k, v in current.items() if k not in skip
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


def judge_status(camp: Campaign, state: State, store, current: dict | None = None) -> dict:
    """`unchanged`, `changed` (with `changes`), `unrecorded` (a log from before judges were
    recorded) or `unknown` (the binding cannot be analysed now: `error`). `current`: the
    current judge where the caller has it already."""
    recorded = recorded_judge(state)
    if not recorded:
        return {
            "state": "unrecorded" if state.start or state.candidates else "not_started",
            "changes": [],
        }
    try:
        if current is None:
            current = current_judge(camp, store)
        changes = judge_changes(recorded, current, store)
    except RsiError as exc:
        return {"state": "unknown", "changes": [], "error": exc.message}
    return {"state": "changed" if changes else "unchanged", "changes": changes}


def check_judge_unchanged(camp: Campaign, state: State, store, current: dict | None = None) -> None:
    """Refuse to judge anything under a judge other than the one recorded at the start."""
    if not recorded_judge(state):
        return
    judge = judge_status(camp, state, store, current)
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
        if current is None:
            current = current_judge(camp, store)
        fields = assess_only_change(recorded_judge(state), current, store)
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
            "runtime and baseline, the harness scripts, the packages they import) is fixed at "
            "its start; rounds and the final are refused so that no round is silently "
            "re-judged under another judge",
            file=camp.target.file,
            target=str(camp.label),
            field="binding",
            hint=_restore_hint(judge["changes"], recorded_judge(state)),
        )


def _restore_hint(changes: list[str], recorded: dict) -> str:
    """What to do next: for the interpreter's packages, which versions to put back (never a
    `git checkout` of a file nobody changed); for files, restore them."""
    interpreter = [c for c in changes if c.startswith(("package ", "interpreter:"))]
    files = len(interpreter) < len(changes)
    parts = []
    if interpreter:
        moved = {c.split(" ")[1] for c in interpreter if c.startswith("package ")}
        was = recorded.get("toolchain") or {}
        pins = [
            f"{n}=={_version(was[n])}" for n in sorted(moved) if was.get(n, "absent") != "absent"
        ]
        parts.append(
            "run rsi from the Python environment the campaign started in"
            + (f", or put its packages back (pip install {' '.join(pins)})" if pins else "")
        )
    if files:
        parts.append("restore the changed files named above as they were at the start")
    return (
        " and ".join(parts) + " to go on with this campaign, or declare a new campaign "
        "(another name) to judge under what is there now"
    )
