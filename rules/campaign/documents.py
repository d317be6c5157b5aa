"""The documents campaign commands return (rsi.round/1, rsi.campaign.status/1, …), read from
the log and the cache: what they say of a round comes from its targets' outputs, never from
here. Nothing in this module runs an action."""

from __future__ import annotations

import json
from typing import Any

from rsi.errors import DeclarationError, RsiError
from rsi.label import Label
from rules.campaign.judging import check_policy_unchanged, judge_status, project_drift
from rules.campaign.log import (
    EVIDENCE_INDEX,
    Attempts,
    attempt_state,
    read_index,
    update_index,
)
from rules.campaign.model import (
    Campaign,
    Policy,
    State,
    effective_policy,
    ended_reason,
    iso,
    state_of,
)
from rules.steps import HARNESS_DIR

ROUND_SCHEMA = "rsi.round/1"
ADD_SCHEMA = "rsi.candidate.add/1"
CHECK_SCHEMA = "rsi.candidate.check/1"
STATUS_SCHEMA = "rsi.campaign.status/1"
FINAL_SCHEMA = "rsi.campaign.final_result/1"
STOP_SCHEMA = "rsi.campaign.stop/1"
START_SCHEMA = "rsi.campaign.start/1"
ABANDON_SCHEMA = "rsi.campaign.abandon/1"
REGRADE_SCHEMA = "rsi.campaign.regrade/1"
REPORT_RESULT_SCHEMA = "rsi.campaign.report_result/1"


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
        "started_at_iso": iso(started),
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


def outcome_of(graph, outcomes, art):
    return outcomes.get(graph.producer(art.producer)) if art.producer else None


def artifact_evidence(ws, store, graph, outcomes, art) -> dict:
    outcome = outcome_of(graph, outcomes, art)
    result = outcome.result if outcome is not None and outcome.ok else None
    out = result.output_map.get(art.path) if result else None
    if out is None:
        return {"digest": None, "path": None, "blob": None}
    return {
        "digest": str(out.digest),
        "path": str(ws.out_dir / art.path),
        "blob": str(store.blob_path(out.digest)),
    }


def read_json_output(store, graph, outcomes, art) -> dict | None:
    outcome = outcome_of(graph, outcomes, art)
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
    from rsi.build_analysis import load_graph
    from rsi.events import EventLog
    from rsi.scheduler import Scheduler

    _, graph = load_graph(ws, [str(lb) for lb in labels], store)
    lookup = Scheduler(store, None, EventLog(None, progress=False), salt=ws.salt)
    return graph, lookup.lookup(graph, graph.actions_for(labels))


def harness_module(stem: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        f"_rsi_campaign_{stem}", HARNESS_DIR / f"{stem}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def select_from_rounds(store, graph, outcomes, label: Label) -> dict | None:
    """best.json as the Select action would write it, from the rounds' cached documents (None
    while some round has none): a round never has to build `best`, so concurrent rounds never
    run (and replace) each other's actions through it."""
    docs = []
    for rlabel in graph.targets[label].attrs["rounds"]:
        rlabel = Label.parse(str(rlabel))
        prov = graph.providers.get(rlabel)
        doc = None if prov is None else read_json_output(store, graph, outcomes, prov.info.doc)
        if doc is None:
            return None
        docs.append(doc)
    return harness_module("selection").select(docs)


def best_summary(store, graph, outcomes, label: Label) -> dict:
    if graph is None or label not in graph.providers:
        # NB: no round is missing evidence, and none has passed: `none`, as documented
        return {
            "state": "none",
            "label": str(label),
            "detail": "no round has been submitted",
            "n_rounds": 0,
        }
    doc = read_json_output(store, graph, outcomes, graph.providers[label].info.best)
    if doc is None:
        doc = select_from_rounds(store, graph, outcomes, label)
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
    "review",
    "accepted",
    "session",
    "knowledge",
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
    round_doc = read_json_output(store, graph, outcomes, prov.info.doc)
    evidence = {
        name: artifact_evidence(camp.ws, store, graph, outcomes, getattr(prov.info, key))
        for name, key in (
            ("round", "doc"),
            ("verdict", "verdict"),
            ("check", "check"),
            ("samples", "samples"),
            ("table", "table"),
        )
    }
    if getattr(prov.info, "review", None) is not None:
        evidence["review"] = artifact_evidence(camp.ws, store, graph, outcomes, prov.info.review)
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
    counted, why_not = round_counted(doc)
    doc["counted"], doc["not_counted_because"] = counted, why_not
    if isinstance(doc.get("speedup"), dict):
        # NB: an interval is plotted and quoted beside the verdict; it says itself whether
        # it counts, so a reader of the speedup alone never takes a FAIL's gain as real
        doc["speedup"] = {**doc["speedup"], "counted": counted}
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


def round_counted(doc: dict) -> tuple[bool, str | None]:
    """Whether a round's speedup counts (toward best, the final, the campaign's gain), and if
    not, why: only a PASS whose review passed (or that has none) counts."""
    if doc.get("state") != "done":
        return False, "no verdict (the round's build did not finish)"
    if doc.get("verdict") != "PASS":
        return False, f"verdict {doc.get('verdict')}: only a PASS counts"
    review = doc.get("review")
    if isinstance(review, dict) and review.get("verdict") != "pass":
        return False, f"review {review.get('verdict')}: a PASS counts only when its review passes"
    return True, None


def evidence_reuse(camp: Campaign, number: int, graph, outcomes, now: float) -> dict:
    """For round `number`'s check, samples and verdict: produced by this build (`reused`
    false), or reused from the cache, and then `from` the round that produced it (any round of
    any campaign of this store: evidence is keyed by the binding and the candidate's content,
    never by the round; null when its producer is not on record, e.g. `rsi build`)."""
    prov = graph.providers[camp.round_label(number)]
    index_path = camp.log.store_root / "campaigns" / EVIDENCE_INDEX
    index = read_index(index_path)
    here = {"campaign": str(camp.label), "round": number, "label": str(camp.round_label(number))}
    produced, out = {}, {}
    for part in ("check", "samples", "verdict"):
        art = getattr(prov.info, part)
        outcome = outcome_of(graph, outcomes, art)
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
        update_index(index_path, produced)
    return out


def attempt_message(errors: list[dict]) -> str | None:
    if not errors:
        return None
    first = next((e for e in errors if e.get("status") != "skipped"), errors[0])
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{first['action']}: {first['status']}: {first['message']}{more}"


def failures(report, label: Label) -> list[dict]:
    return [
        {"action": f["action"], "status": f["status"], "message": f["message"]}
        for f in report.targets.get(str(label), {}).get("failed", [])
    ]


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
        doc = read_json_output(
            store, graph, outcomes, graph.providers[camp.round_label(i)].info.doc
        )
        gave_up = state.abandoned.get(i)
        last = attempts.get(f"round-{i}")
        if gave_up is not None:
            rstate = "error" if gave_up.get("error") else "abandoned"
        elif doc:
            rstate = "done"
        else:
            rstate = attempt_state(last)
        # NB: a host_busy round's verdict (INCONCLUSIVE) is shown from its last attempt; it is
        # not in the cache, so it is never counted and `rsi round --round N` measures anew
        busy = (last or {}).get("verdict_doc") if rstate == "host_busy" else None
        row = {
            "round": i,
            "label": str(camp.round_label(i)),
            "state": rstate,
            "retryable": rstate not in ("done", "abandoned", "error"),
            "verdict": doc["verdict"] if doc else (busy or {}).get("verdict"),
            "speedup": doc["speedup"] if doc else (busy or {}).get("speedup"),
            "failure_kind": doc["correctness"]["failure_kind"] if doc else None,
            "review": (doc.get("review") or {}).get("verdict") if doc else None,
            "accepted": doc.get("accepted") if doc else None,
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
        fdoc = read_json_output(store, graph, outcomes, graph.providers[flabel].info.final)
        pending = graph.providers[flabel].info.state == "pending"
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
    usage = harness_module("report").usage_totals([r["usage"] or {} for r in rounds])
    project = (state.start or {}).get("project")
    drift = project_drift(camp, state)
    try:
        check_policy_unchanged(camp, state)
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
        "frozen": frozen_summary(project),
        "warnings": drift,
    }


REGRADE_FIELDS = ("verdict", "speedup", "threshold", "min_improvement", "reasons")


def ran(graph, outcomes, label: Label, part: str) -> bool:
    outcome = outcome_of(graph, outcomes, getattr(graph.providers[label].info, part))
    return outcome is not None and outcome.status == "executed"


def verdict_view(doc: dict | None) -> dict | None:
    if doc is None:
        return None
    view = {k: doc.get(k) for k in REGRADE_FIELDS}
    view["reasons"] = sorted(
        r if isinstance(r, str) else r.get("code") for r in doc.get("reasons") or []
    )
    return view


def frozen_summary(project: dict | None) -> dict | None:
    """What status and start say of an external project's frozen tree (None: a task)."""
    if not project:
        return None
    return {
        "root": project["root"],
        "manifest": project["manifest"],
        "n_files": project["n_files"],
        "protocol": project["protocol"],
    }


def files_evidence(camp: Campaign, store, graph, outcomes, files) -> dict:
    """`{file name: evidence}` of a target's files (digest, path under out/, blob)."""
    return {
        a.path.rsplit("/", 1)[-1]: artifact_evidence(camp.ws, store, graph, outcomes, a)
        for a in files
    }
