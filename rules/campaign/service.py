"""The campaign commands as one in-process service (`Campaigns`): what `rsi candidate add`, `rsi
round` and `rsi campaign …` do, each returning its JSON document or raising its RsiError. It must
never print or parse command lines (the adapters do).

The service is the only writer of a campaign's log and the only reader of the clock (the one
it is given): budget and deadline are checked here, under the log's lock. What it reports of a
round comes from the round's targets (built, or looked up in the cache).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rsi.errors import RsiError, UsageError
from rsi.label import Label
from rules.campaign.documents import (
    ABANDON_SCHEMA,
    ADD_SCHEMA,
    FINAL_SCHEMA,
    REGRADE_FIELDS,
    REGRADE_SCHEMA,
    REPORT_RESULT_SCHEMA,
    START_SCHEMA,
    STOP_SCHEMA,
    budget_doc,
    files_evidence,
    frozen_summary,
    attempt_message,
    best_now,
    cached_outcomes,
    failures,
    ran,
    read_json_output,
    round_document,
    status_document,
    verdict_view,
)
from rules.campaign.agents import check_session
from rules.campaign.knowledge import pending_records
from rules.campaign.judging import (
    assess_only_change,
    check_judge_unchanged,
    check_policy_unchanged,
    current_judge,
    recorded_judge,
)
from rules.campaign.log import Attempts, campaign_flock
from rules.campaign.model import (
    check_final_allowed,
    effective_policy,
    ended_reason,
    Campaign,
    CampaignClosed,
    iso,
    open_campaign,
    round_refusal,
    state_of,
)
from rules.campaign.snapshot import snapshot_candidate
from rules.campaign.start import append_start
from rules.campaign.preflight import preflight
from rules.campaign.usage import validate_usage


def add_candidate(
    camp: Campaign,
    src: Path,
    hypothesis: str | None,
    usage: dict,
    session: str | None = None,
) -> dict:
    """Append the candidate (idempotent by content) and return {round, entry, added, ...}.
    `session`: the dispatch (rules/campaign/agents.py) whose session made it; the knowledge
    records retrieved since the previous candidate are referenced by the entry."""
    from rsi.runtime import open_store

    if not src.is_dir():
        # NB: checked here, not by click, so a --json caller gets a JSON refusal too
        raise UsageError(
            f"--from {src}: {'not a folder' if src.exists() else 'no such folder'}",
            hint="give the folder that holds the candidate's editable files",
        )
    store = open_store(camp.ws)
    with camp.log.locked():
        state = state_of(camp.log.read())
        check_policy_unchanged(camp, state)
        check_judge_unchanged(camp, state, store)
        now = camp.clock()
        started = False
        if state.start is None and not state.candidates:
            append_start(camp, store, now)
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
        refused = round_refusal(camp, state, now)
        if refused is not None:
            if refused.code == "deadline_reached" and state.stop is None:
                camp.log.append({"kind": "stop", "time": now, "reason": "deadline"})
            raise refused

        # NB: optional fields only when set, so an entry without them reads as it always did
        extra: dict = {"session": session} if session else {}
        knowledge = pending_records(camp.log.read(), session)
        if knowledge:
            extra["knowledge"] = knowledge
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
                **extra,
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


def build_labels(
    camp: Campaign, labels: list[Label], events, lock_timeout: float | None = None
) -> Any:
    from rsi.build import build

    ws = camp.ws.with_overrides(keep_going=True)
    return (camp.builder or build)(
        ws, [str(lb) for lb in labels], events_to=events, lock_timeout=lock_timeout
    )


def binding_cached(camp: Campaign, store, number: int) -> bool:
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
    with campaign_flock(
        locks / name("candidate", binding, entry["digest"]),
        f"round {number} of {camp.label} (or the same content in another round) is being "
        "judged by another process",
    ):
        if binding_cached(camp, store, number):
            return build_labels(camp, labels, events, lock_timeout)
        with campaign_flock(
            locks / name("binding", binding),
            f"another round under {binding} is building the binding's baseline evidence",
        ):
            return build_labels(camp, labels, events, lock_timeout)


ROUND_ATTEMPTS = 3


def round_error(camp: Campaign, number: int, doc: dict) -> dict:
    """End round `number` in the `error` state: an `abandon` entry marked `error`, so the
    campaign goes on (the round counts against the budget and is never selected)."""
    message = attempt_message(doc["errors"]) or "the build failed"
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
    session: str | None = None,
) -> dict:
    """`rsi round` in process: submit `src` as a new candidate and build its round, or build
    (retry) round `number`; returns the rsi.round/1 document. Raises RsiError for refusals
    (CampaignClosed), usage and declaration errors; an infrastructure fault is retried, then
    the round ends in the `error` state (the document says so)."""
    if (src is None) == (number is None):
        raise UsageError("give exactly one of --from DIR (a new candidate) or --round N")
    from rsi.runtime import open_store

    store = open_store(camp.ws)
    added = None
    if src is not None:
        res = add_candidate(camp, Path(src), hypothesis, usage or {}, session)
        number, added = res["round"], res["added"]
    else:
        state = state_of(camp.log.read())
        if number > len(state.candidates):
            raise UsageError(
                f"{camp.label} has {len(state.candidates)} round(s); there is no round {number}"
            )
        check_judge_unchanged(camp, state, store)
        gave_up = state.abandoned.get(number)
        if gave_up is not None:
            raise CampaignClosed(
                "round_abandoned",
                f"round {number} of {camp.label} was abandoned at "
                f"{iso(gave_up['time'])} ({gave_up.get('reason') or 'no reason given'}); "
                "it is never built for the campaign again",
                hint=f"submit a new candidate: rsi round {camp.label} --from DIR",
            )
    attempts, key = Attempts(camp.log, clock=camp.clock), f"round-{number}"
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
            failed=failures(report, camp.round_label(number)),
            added=added,
            state=state,
            now=camp.clock(),
            best=best_now(camp, store),
        )
        attempts.record(
            key,
            doc["state"],
            errors=doc["errors"],
            message=attempt_message(doc["errors"]),
            attempt=attempt,
            verdict_doc=verdict_view(doc) if doc["state"] == "done" else None,
        )
        if doc["state"] != "failed":
            break
    if doc["state"] == "failed":
        doc = round_error(camp, number, doc)
    return doc


ASSESS_LIMITS = {
    "min_improvement": (0.0, None),
    "confidence": (0.0, 1.0),
    "bootstrap_resamples": (1, None),
    "min_pairs": (1, None),
}


def before_regrade(
    camp: Campaign, store, numbers: list[int], declared: bool, cached
) -> dict[int, dict | None]:
    """The round documents before a regrade: `cached` (graph, outcomes) of the rounds as the
    log has them. Once the declaration's policy changed, the cached rounds are those under the
    policy fixed before: the last rsi.round/1 documents returned (kept in attempts.json) stand
    for them."""
    if not declared:
        if not numbers:
            return {}
        graph, outcomes = cached
        labels = {i: camp.round_label(i) for i in numbers}
        return {
            i: read_json_output(store, graph, outcomes, graph.providers[lb].info.doc)
            for i, lb in labels.items()
        }
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
    numbers = [i for i in range(1, len(state.candidates) + 1) if i not in state.abandoned]
    # NB: one analysis of the rounds (which hold the binding) serves the judge and the
    # documents before
    cached = None
    if numbers:
        with store.lock(exclusive=False):
            cached = cached_outcomes(camp.ws, store, [camp.round_label(i) for i in numbers])
    current = current_judge(camp, store, graph=cached and cached[0])
    declared = assess_only_change(recorded_judge(state), current, store)
    if declared is None:
        check_judge_unchanged(camp, state, store, current)
    before = before_regrade(camp, store, numbers, declared is not None, cached)
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
    report = build_labels(camp, [camp.round_label(i) for i in numbers], events, lock_timeout)
    graph = report.graph
    executed: dict[str, int] = {}
    for action_id, outcome in report.outcomes.items():
        if outcome.status == "executed":
            mnemonic = graph.actions[action_id].mnemonic
            executed[mnemonic] = executed.get(mnemonic, 0) + 1
    rounds = []
    for i in numbers:
        lb = camp.round_label(i)
        after = read_json_output(store, graph, report.outcomes, graph.providers[lb].info.doc)
        old, new = verdict_view(before[i]), verdict_view(after)
        if new is not None:
            Attempts(camp.log, clock=camp.clock).record(
                f"round-{i}", "done", verdict_doc=new, regraded=True
            )
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
                else ("built" if ran(graph, report.outcomes, lb, "samples") else "regraded"),
                "before": old,
                "after": new,
                "changed": changed,
                "errors": failures(report, lb),
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


def start_campaign(camp: Campaign, store) -> dict:
    """Start the campaign's clock now and (an external project) freeze its tree;
    rsi.campaign.start/1 (`started` false: it had started)."""
    with camp.log.locked():
        state = state_of(camp.log.read())
        check_policy_unchanged(camp, state)
        new = state.start is None and not state.candidates
        if new:
            append_start(camp, store, camp.clock())
            state = state_of(camp.log.read())
    project = (state.start or {}).get("project")
    return {
        "schema": START_SCHEMA,
        "campaign": str(camp.label),
        "started": new,
        "started_at": state.started_at,
        "log": str(camp.log.path),
        "frozen": frozen_summary(project),
        "budget": budget_doc(camp.policy, state, camp.clock()),
    }


def stop_campaign(camp: Campaign) -> dict:
    """End the campaign's rounds now (the agent's early stop, for campaigns that accept
    `agent`); rsi.campaign.stop/1 (`stopped_now` false: it had ended)."""
    with camp.log.locked():
        state = state_of(camp.log.read())
        check_policy_unchanged(camp, state)
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
    return {
        "schema": STOP_SCHEMA,
        "campaign": str(camp.label),
        "stopped_now": stopped,
        "budget": budget_doc(camp.policy, state, camp.clock()),
    }


def abandon_round(camp: Campaign, store, number: int, reason: str) -> dict:
    """Give up on round `number` (one without a verdict that keeps faulting): an `abandon`
    entry; rsi.campaign.abandon/1 (`abandoned_now` false: it already was)."""
    if not reason.strip():
        raise UsageError("--reason must say why the round is abandoned")
    with camp.log.locked():
        state = state_of(camp.log.read())
        if number > len(state.candidates):
            raise UsageError(
                f"{camp.label} has {len(state.candidates)} round(s); there is no round {number}"
            )
        check_policy_unchanged(camp, state)
        check_judge_unchanged(camp, state, store)
        entry = state.abandoned.get(number)
        now_ = entry is None
        if now_:
            label = camp.round_label(number)
            with store.lock(exclusive=False):
                graph, outcomes = cached_outcomes(camp.ws, store, [label])
            doc = read_json_output(store, graph, outcomes, graph.providers[label].info.doc)
            if doc is not None:
                raise CampaignClosed(
                    "round_has_verdict",
                    f"round {number} of {camp.label} has a verdict "
                    f"({doc['verdict']}); only a round without one can be abandoned",
                    hint="a verdict never blocks the campaign: nothing to give up on",
                )
            entry = camp.log.append(
                {"kind": "abandon", "time": camp.clock(), "round": number, "reason": reason.strip()}
            )
        state = state_of(camp.log.read())
    return {
        "schema": ABANDON_SCHEMA,
        "campaign": str(camp.label),
        "round": number,
        "label": str(camp.round_label(number)),
        "abandoned_now": now_,
        "reason": entry.get("reason"),
        "abandoned_at": entry["time"],
        "budget": budget_doc(effective_policy(camp, state), state, camp.clock()),
    }


def run_final(camp: Campaign, store, *, events=None, lock_timeout: float | None = None) -> dict:
    """Build the campaign's final (and report) once its rounds are over: rsi.campaign.
    final_result/1. Asking again returns the cached final; one that failed for an
    infrastructure fault runs again; after the deadline only a final already built is
    returned (else CampaignClosed `deadline_passed`)."""
    flabel, rlabel = camp.sub("final"), camp.sub("report")
    with camp.log.locked():
        state = state_of(camp.log.read())
        check_policy_unchanged(camp, state)
        check_judge_unchanged(camp, state, store)
        now = camp.clock()
        try:
            check_final_allowed(camp, state, now)
        except CampaignClosed as refused:
            if refused.code != "deadline_passed":
                raise
            late = refused  # NB: a final already built stays readable after the deadline
        else:
            late = None
            if ended_reason(camp.policy, state) is None and state.stop is None:
                camp.log.append({"kind": "stop", "time": now, "reason": "deadline"})
    attempts = Attempts(camp.log, clock=camp.clock)
    if late is not None:
        with store.lock(exclusive=False):
            graph, outcomes = cached_outcomes(camp.ws, store, [flabel, rlabel])
        if read_json_output(store, graph, outcomes, graph.providers[flabel].info.final) is None:
            raise late
        cache, failed = "hit", []
    else:
        attempts.record("final", "building")
        try:
            report = build_labels(camp, [flabel, rlabel], events, lock_timeout)
        except RsiError as exc:
            attempts.record("final", "failed", errors=[], message=exc.message)
            raise
        graph, outcomes = report.graph, report.outcomes
        cache, failed = report.targets[str(flabel)]["cache"], failures(report, flabel)
    prov = graph.providers[flabel]
    fdoc = read_json_output(store, graph, outcomes, prov.info.final)
    if late is None:
        attempts.record(
            "final",
            "done" if fdoc is not None else "failed",
            errors=failed,
            message=attempt_message(failed),
        )
    state = state_of(camp.log.read())
    return {
        "schema": FINAL_SCHEMA,
        "campaign": str(camp.label),
        "label": str(flabel),
        "state": "done" if fdoc is not None else "failed",
        "retryable": fdoc is None,
        "cache": cache,
        "final": fdoc,
        "evidence": files_evidence(camp, store, graph, outcomes, prov.files),
        "report": files_evidence(camp, store, graph, outcomes, graph.providers[rlabel].files),
        "errors": failed,
        "budget": budget_doc(camp.policy, state, camp.clock()),
        # NB: the one step whose design forbids evidence reuse by content
        "evidence_reuse": "never: the final re-runs the baseline check, calibration, check "
        "and paired measurement with fresh seeds and new pairs under its own keys, so it "
        "is never served from a round's evidence (its own result is cached)",
    }


# NB: what building a report may run by itself: bookkeeping over evidence that exists. A
# round's check or measurement, and the final, only ever run through `round` and `final`
REPORT_BOOKKEEPING = ("RoundDoc", "Snapshot", "Select", "FinalPending", "Report")


def campaign_report(
    camp: Campaign, store, *, events=None, lock_timeout: float | None = None
) -> dict:
    """The campaign's report (rsi.campaign.report/1 and report.md) as rsi.campaign.
    report_result/1: served from the cache, or built when only bookkeeping is missing (every
    round judged, the final built or still pending). Otherwise `unavailable`, naming what is
    missing: a report never measures a round or runs the final."""
    state = state_of(camp.log.read())
    if not state.candidates:
        raise UsageError(f"{camp.label} has no round yet; there is nothing to report")
    rlabel = camp.sub("report")
    with store.lock(exclusive=False):
        graph, outcomes = cached_outcomes(camp.ws, store, [rlabel])
    prov = graph.providers[rlabel]
    by_name = {a.path.rsplit("/", 1)[-1]: a for a in prov.files}
    doc = read_json_output(store, graph, outcomes, by_name["report.json"])
    cache, failed, missing = "hit", [], []
    if doc is None:
        missing = sorted(
            f"{graph.actions[a].mnemonic} {graph.actions[a].label}"
            for a in graph.actions_for([rlabel])
            if a not in outcomes and graph.actions[a].mnemonic not in REPORT_BOOKKEEPING
        )
        if not missing:
            check_judge_unchanged(camp, state, store)
            report = build_labels(camp, [rlabel], events, lock_timeout)
            graph, outcomes = report.graph, report.outcomes
            prov = graph.providers[rlabel]
            by_name = {a.path.rsplit("/", 1)[-1]: a for a in prov.files}
            doc = read_json_output(store, graph, outcomes, by_name["report.json"])
            cache, failed = report.targets[str(rlabel)]["cache"], failures(report, rlabel)
    out = {
        "schema": REPORT_RESULT_SCHEMA,
        "campaign": str(camp.label),
        "label": str(rlabel),
        "state": "done" if doc is not None else ("failed" if failed else "unavailable"),
        "cache": cache if doc is not None else None,
        "report": doc,
        "evidence": files_evidence(camp, store, graph, outcomes, prov.files),
        "errors": failed,
        "missing": missing,
    }
    if missing:
        out["detail"] = (
            "not built: some round has no evidence yet, or the final is due and not built "
            f"(rsi round {camp.label} --round N; rsi campaign final {camp.label})"
        )
    return out


class Campaigns:
    """The campaign commands as an in-process service, for whatever drives rounds without a
    shell (a job service, a dashboard, an agent server, a test): each method returns the
    command's JSON document or raises its RsiError (`CampaignClosed` with its `code` for a
    refusal). `clock` is what budgets, deadlines, log entries and attempts read the time from;
    `builder(ws, patterns, events_to=, lock_timeout=)` builds (rsi.build.build by default);
    `package` is what relative campaign labels are relative to."""

    def __init__(self, ws, *, clock=time.time, builder=None, package: str = "") -> None:
        self.ws, self.clock, self.builder, self.package = ws, clock, builder, package

    def open(self, campaign: str) -> Campaign:
        camp = open_campaign(self.ws, campaign, self.package)
        camp.clock, camp.builder = self.clock, self.builder
        return camp

    def _store(self, camp: Campaign):
        from rsi.runtime import open_store

        return open_store(camp.ws)

    def add(
        self,
        campaign: str,
        src: str | Path,
        *,
        hypothesis: str | None = None,
        usage: dict | None = None,
        session: str | None = None,
    ) -> dict:
        """rsi.candidate.add/1: append a candidate (idempotent by content); builds nothing.
        `session`: a bound dispatch of the campaign (rules/campaign/agents.py)."""

        camp = self.open(campaign)
        res = add_candidate(
            camp,
            Path(src),
            hypothesis,
            validate_usage(usage or {}, "usage"),
            check_session(camp, session),
        )
        return {
            "schema": ADD_SCHEMA,
            "campaign": str(camp.label),
            "round": res["round"],
            "label": str(camp.round_label(res["round"])),
            "added": res["added"],
            "digest": res["entry"]["digest"],
            "ignored_outside_scope": res["ignored_outside_scope"],
            "budget": budget_doc(camp.policy, res["state"], camp.clock()),
        }

    def check(self, campaign: str, src: str | Path) -> dict:
        """rsi.candidate.check/1: the candidate's pre-flight (parse, import, entry, signature);
        appends nothing, counts nothing, measures nothing (rules/campaign/preflight.py)."""
        camp = self.open(campaign)
        return preflight(camp, Path(src), now=camp.clock())

    def round(
        self,
        campaign: str,
        *,
        src: str | Path | None = None,
        number: int | None = None,
        hypothesis: str | None = None,
        usage: dict | None = None,
        events=None,
        lock_timeout: float | None = None,
        session: str | None = None,
    ) -> dict:
        """rsi.round/1: `src=` a folder (a new candidate) or `number=` (an existing round);
        `session`: a bound dispatch of the campaign whose session made the candidate."""

        if (src is None) == (number is None):
            raise UsageError("give exactly one of --from DIR (a new candidate) or --round N")
        camp = self.open(campaign)
        return run_round(
            camp,
            session=check_session(camp, session) if src is not None else None,
            src=None if src is None else Path(src),
            number=number,
            hypothesis=hypothesis,
            usage=validate_usage(usage or {}, "usage") if src is not None else None,
            events=events,
            lock_timeout=lock_timeout,
        )

    def status(self, campaign: str) -> dict:
        """rsi.campaign.status/1, from the log and the cache (runs nothing)."""
        camp = self.open(campaign)
        return status_document(camp, self._store(camp))

    def best(self, campaign: str) -> dict:
        """The campaign's best as the cache has it now (runs nothing)."""
        camp = self.open(campaign)
        return best_now(camp, self._store(camp))

    def start(self, campaign: str) -> dict:
        """rsi.campaign.start/1."""
        camp = self.open(campaign)
        return start_campaign(camp, self._store(camp))

    def stop(self, campaign: str) -> dict:
        """rsi.campaign.stop/1."""
        return stop_campaign(self.open(campaign))

    def abandon(self, campaign: str, number: int, reason: str) -> dict:
        """rsi.campaign.abandon/1."""
        camp = self.open(campaign)
        return abandon_round(camp, self._store(camp), number, reason)

    def regrade(
        self, campaign: str, *, events=None, lock_timeout: float | None = None, **assess: Any
    ) -> dict:
        """rsi.campaign.regrade/1: `assess` fields (min_improvement, confidence, …)."""
        camp = self.open(campaign)
        return regrade(camp, self._store(camp), assess, events=events, lock_timeout=lock_timeout)

    def final(self, campaign: str, *, events=None, lock_timeout: float | None = None) -> dict:
        """rsi.campaign.final_result/1."""
        camp = self.open(campaign)
        return run_final(camp, self._store(camp), events=events, lock_timeout=lock_timeout)

    def report(self, campaign: str, *, events=None, lock_timeout: float | None = None) -> dict:
        """rsi.campaign.report_result/1."""
        camp = self.open(campaign)
        return campaign_report(camp, self._store(camp), events=events, lock_timeout=lock_timeout)
