"""What `rsi dashboard` shows of a workspace's campaigns, read from their logs and the cache without
writing anything: no build, no analysis cache entry, no blob, no evidence index entry. It must never
write.

Each campaign's view is the dashboard's view model (rules/harness/dashboard.py, the renderer the
`<campaign>.dashboard` target runs in its action), computed here from the rounds' cached
documents, plus what only the live store knows: rounds still without a verdict, and where
reused evidence was first produced (the store's evidence index).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from rsi.errors import RsiError
from rsi.label import Label
from rules.campaign.documents import harness_module, outcome_of, read_json_output
from rules.campaign.log import EVIDENCE_INDEX, Attempts, attempt_state, read_index
from rules.campaign.model import effective_policy, ended_reason, open_campaign, state_of


@dataclass
class CampaignView:
    """One campaign as the dashboard shows it: `view` (rsi.campaign.dashboard/1) or `error`,
    the task it belongs to, and the evidence blobs its page links (digest text -> name)."""

    label: str
    task: str
    view: dict | None = None
    error: str | None = None
    blobs: dict[str, str] = field(default_factory=dict)

    @property
    def version(self) -> str:
        doc = {"view": self.view, "error": self.error}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def campaign_labels(ws) -> list[Label]:
    """Every `campaign` target of the workspace."""
    from rsi.build_analysis import make_loader

    loader = make_loader(ws)
    labels = loader.expand(["//..."], "")
    return sorted(lb for lb in labels if loader.target(lb).rule.name == "campaign")


def open_store_readonly(ws):
    """The workspace's store, or None when it has never been written (opening it would
    create it)."""
    from rsi.store import LocalStore

    root = ws.store_dir.resolve()
    if not (root / "STORE.json").is_file():
        return None
    return LocalStore(root, ws.digest_function)


def _cached(ws, store, labels: list[Label]):
    """(graph, outcomes): what a build of `labels` would serve from the cache. Analysed with
    digests only (rule-written blobs are not stored) and never through the analysis cache."""
    from rsi.analysis import analyze
    from rsi.build_analysis import make_loader
    from rsi.digest import digest_bytes
    from rsi.events import EventLog
    from rsi.scheduler import Scheduler

    graph = analyze(
        make_loader(ws),
        labels,
        store_put=lambda data: digest_bytes(data, store.function),
        settings={"salt": ws.salt, "store": str(store.root)},
        function=store.function,
    )
    lookup = Scheduler(store, None, EventLog(None, progress=False), salt=ws.salt)
    return graph, lookup.lookup(graph, graph.actions_for(labels))


def _task_of(camp) -> str:
    if camp.kind == "task":
        return str(Label.parse(str(camp.binding.attrs["task"]), camp.binding.label.package))
    return str(camp.binding.label)


def campaign_view(ws, store, label: Label | str) -> CampaignView:
    try:
        camp = open_campaign(ws, str(label))
    except RsiError as exc:
        return CampaignView(str(label), "", error=exc.message)
    out = CampaignView(str(camp.label), _task_of(camp))
    try:
        out.view = _view(ws, store, camp, out.blobs)
    except RsiError as exc:
        out.error = exc.message
    return out


def _blob(blobs: dict, store, graph, outcomes, art) -> str | None:
    """The page's link to an output's blob, recorded as one the server may serve."""
    outcome = outcome_of(graph, outcomes, art)
    result = outcome.result if outcome is not None and outcome.ok else None
    found = result.output_map.get(art.path) if result else None
    if found is None:
        return None
    name = art.path.rsplit("/", 1)[-1]
    blobs[str(found.digest)] = name
    return f"/evidence/{found.digest}?name={name}"


def _view(ws, store, camp, blobs: dict) -> dict:
    dash, report_mod, select = (harness_module(s) for s in ("dashboard", "report", "selection"))
    state = state_of(camp.log.read())
    policy = effective_policy(camp, state)
    meta: dict[str, Any] = {
        "campaign": str(camp.label),
        "binding": str(camp.target.attrs["binding"]),
        "kind": camp.kind,
        "started_at": state.started_at,
        "max_rounds": policy.max_rounds,
        "links": {},
        "final_links": {},
    }
    n = len(state.candidates)
    docs, verdicts, pending, reuse, abandoned = [], {}, [], {}, []
    final: dict = {"state": "not_started", "message": "no round has been submitted"}
    if n and store is not None:
        labels = [camp.round_label(i) for i in range(1, n + 1)] + [camp.sub("final")]
        graph, outcomes = _cached(ws, store, labels)
        index = read_index(store.root / "campaigns" / EVIDENCE_INDEX)
        attempts = Attempts(camp.log).read()
        for i, entry in enumerate(state.candidates, 1):
            info = graph.providers[camp.round_label(i)].info
            gave_up = state.abandoned.get(i)
            doc = None if gave_up else read_json_output(store, graph, outcomes, info.doc)
            if gave_up is not None:
                abandoned.append(_abandoned(camp, i, entry, gave_up))
            elif doc is None:
                pending.append(_pending(camp, i, entry, attempt_state(attempts.get(f"round-{i}"))))
            else:
                docs.append(doc)
                verdicts[i] = read_json_output(store, graph, outcomes, info.verdict) or {}
                meta["links"][str(i)] = {
                    name: link
                    for name, art in (
                        ("round.json", info.doc),
                        ("verdict.json", info.verdict),
                        ("check.json", info.check),
                        ("samples.json", info.samples),
                        ("verdict.txt", info.table),
                    )
                    if (link := _blob(blobs, store, graph, outcomes, art)) is not None
                }
                where = index.get(_digest_of(graph, outcomes, info.verdict) or "")
                if where:
                    here = where.get("campaign") == str(camp.label) and where.get("round") == i
                    reuse[i] = {
                        "reused": not here,
                        "from": None
                        if here
                        else {"campaign": where.get("campaign"), "round": where.get("round")},
                    }
        fprov = graph.providers[camp.sub("final")]
        fdoc = read_json_output(store, graph, outcomes, fprov.info.final)
        if fdoc is not None:
            final = fdoc
            meta["final_links"] = {
                a.path.rsplit("/", 1)[-1]: link
                for a in fprov.files
                if (link := _blob(blobs, store, graph, outcomes, a)) is not None
            }
        elif ended_reason(policy, state) is None:
            final = {"state": "pending", "message": "the campaign is still open"}
        else:
            final = {
                "state": "not_built",
                "message": f"the rounds are over; build it with `rsi campaign final {camp.label}`",
            }
    elif n:
        pending = [_pending(camp, i, e, "not_built") for i, e in enumerate(state.candidates, 1)]
    best = select.select(docs)
    report = report_mod.report(str(camp.label), docs, best, final, abandoned)
    live = {"pending": pending, "reuse": reuse}
    return dash.view(report, docs, verdicts, meta, live=live)


def _digest_of(graph, outcomes, art) -> str | None:
    outcome = outcome_of(graph, outcomes, art)
    result = outcome.result if outcome is not None and outcome.ok else None
    found = result.output_map.get(art.path) if result else None
    return None if found is None else str(found.digest)


def _pending(camp, i: int, entry: dict, attempt: str) -> dict:
    detail = {
        "building": "being judged now",
        "failed_retryable": "its last build failed; retry it",
        "interrupted": "its last build was interrupted; retry it",
        "host_busy": "judged while the host was busy (INCONCLUSIVE, not kept); ask again",
    }.get(attempt, "not judged yet")
    return {
        "round": i,
        "label": str(camp.round_label(i)),
        "hypothesis": entry.get("hypothesis"),
        "candidate_digest": entry["digest"],
        "submitted_at": entry["time"],
        "usage": entry.get("usage") or {},
        "detail": detail,
    }


def _abandoned(camp, i: int, entry: dict, gave_up: dict) -> dict:
    return {
        "round": i,
        "label": str(camp.round_label(i)),
        "reason": gave_up.get("reason") or "",
        "time": gave_up["time"],
        "candidate_digest": entry["digest"],
        "hypothesis": entry.get("hypothesis"),
        "usage": entry.get("usage") or {},
    }


def signals(ws, labels: list[Label]) -> str:
    """A cheap fingerprint of what changes when a round lands: each campaign's log and
    attempts file (size and mtime)."""
    from rules.campaign.log import campaign_dir

    parts = []
    root = ws.store_dir.resolve()
    for lb in labels:
        d = campaign_dir(root, lb)
        for name in ("log.jsonl", "attempts.json"):
            try:
                st = (d / name).stat()
                parts.append(f"{lb}/{name}:{st.st_size}:{st.st_mtime_ns}")
            except OSError:
                parts.append(f"{lb}/{name}:-")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()
