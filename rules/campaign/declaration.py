"""The `campaign` rule: a binding (or an external project) plus a budget, and its `generate` hook,
which reads the append-only log while the package loads and declares `<c>.round-N`, `.best`,
`.final`, `.report` and `.dashboard`. Must never read the clock or run a measurement."""

from typing import Any, Mapping

from rsi.attrs import attr
from rsi.label import Label
from rsi.rule import GeneratedTarget, Provider, Rule, RuleContext
from rules.campaign.rule_common import binding_kind, declared_where
from rules.campaign.log import CampaignLog
from rules.campaign.model import Policy, ended_reason, policy_of, state_of
from rules.providers import (
    CampaignInfo,
)


def _campaign(ctx: RuleContext) -> Provider:
    a = ctx.attrs
    policy = policy_of(a, *declared_where(ctx))
    binding = ctx.dep(a["binding"])
    kind = binding_kind(binding.info)
    if kind is None:
        raise ctx.error(
            f"{a['binding']} is neither a binding nor an external_project",
            "binding",
            "point binding at a `binding` or `external_project` target",
        )
    return Provider(
        files=binding.files if kind == "task" else (),
        info=CampaignInfo(policy=policy.to_json(), kind=kind, binding=str(a["binding"])),
    )


def session_attrs(entries: list[dict]) -> dict[str, dict]:
    """Each bound dispatch of the log: {dispatch, session, model} (rules/campaign/agents.py)."""
    out = {}
    for e in entries:
        if e.get("kind") == "bind" and isinstance(e.get("dispatch"), str):
            out.setdefault(
                e["dispatch"],
                {"dispatch": e["dispatch"], "session": e.get("session"), "model": e.get("model")},
            )
    return out


def _generate(label: Label, attrs: dict, settings: Mapping[str, Any]) -> list[GeneratedTarget]:
    store = settings.get("store")
    if not store:
        return []
    log = CampaignLog(store, label)
    track = settings.get("track_file")
    if track is not None:
        track(log.path)  # NB: the analysis cache must see every append
    entries = log.read()
    state = state_of(entries)
    if state.start is None and not state.candidates:
        return []
    where = (f"{label.package}/BUILD.toml", str(label))
    # NB: a campaign is fixed at its start: its targets follow the policy and binding recorded
    # then (the CLI refuses to go on when the declaration has drifted; status reports it)
    recorded = (state.start or {}).get("policy")
    policy = Policy.from_json(recorded, *where) if recorded else policy_of(attrs, *where)
    name, pkg = label.name, label.package
    binding = (state.start or {}).get("binding") or str(attrs["binding"])
    out: list[GeneratedTarget] = []
    project = (state.start or {}).get("project")
    if project:
        base = f"{name}.baseline"
        out.append(
            GeneratedTarget(
                base,
                "campaign_baseline",
                {
                    "project": binding,
                    "files": project["files"],
                    "executable": project.get("executable", []),
                    "manifest": project["manifest"],
                    "spec": project.get("spec") or {},
                },
            )
        )
        binding = str(Label(pkg, base))
    rounds, abandoned = [], []
    sessions = session_attrs(entries)
    for number, cand in enumerate(state.candidates, 1):
        round_name = f"{name}.round-{number}"
        out.append(
            GeneratedTarget(
                round_name,
                "campaign_round",
                {
                    "binding": binding,
                    "campaign": str(label),
                    "round": number,
                    "files": cand["files"],
                    "executable": cand.get("executable", []),
                    "digest": cand["digest"],
                    "hypothesis": cand.get("hypothesis") or "",
                    "usage": cand.get("usage") or {},
                    "submitted_at": cand["time"],
                    "assess": state.assess_override,
                    "session": sessions.get(cand.get("session")) or {},
                    "knowledge": [k for k in cand.get("knowledge") or [] if isinstance(k, str)],
                },
            )
        )
        gave_up = state.abandoned.get(number)
        if gave_up is None:
            rounds.append(str(Label(pkg, round_name)))
        else:  # NB: still a round (it used the budget), never selected, never waited for
            abandoned.append(
                {
                    "round": number,
                    "label": str(Label(pkg, round_name)),
                    "reason": gave_up.get("reason") or "",
                    "time": gave_up["time"],
                    "candidate_digest": cand["digest"],
                    "hypothesis": cand.get("hypothesis") or None,
                    "usage": cand.get("usage") or {},
                }
            )
    if not state.candidates:
        return out
    best, final = str(Label(pkg, f"{name}.best")), str(Label(pkg, f"{name}.final"))
    reason = ended_reason(policy, state)
    out.append(
        GeneratedTarget(f"{name}.best", "campaign_best", {"rounds": rounds, "binding": binding})
    )
    out.append(
        GeneratedTarget(
            f"{name}.final",
            "campaign_final",
            {
                "binding": binding,
                "best": best,
                "rounds": rounds,
                "campaign": str(label),
                "ended": reason or "",
                "accepted": list(policy.stop_on),
                "rounds_used": len(state.candidates),
                "max_rounds": policy.max_rounds,
                "final_seed": policy.final_seed,
            },
        )
    )
    out.append(
        GeneratedTarget(
            f"{name}.report",
            "campaign_report",
            {
                "campaign": str(label),
                "rounds": rounds,
                "best": best,
                "final": final,
                "binding": binding,
                "abandoned": abandoned,
            },
        )
    )
    out.append(
        GeneratedTarget(
            f"{name}.dashboard",
            "campaign_dashboard",
            {
                "campaign": str(label),
                "rounds": rounds,
                "final": final,
                "report": str(Label(pkg, f"{name}.report")),
                "binding": binding,
                "kind": "project" if project else "task",
                "started_at": state.started_at,
                "max_rounds": policy.max_rounds,
            },
        )
    )
    return out


CAMPAIGN = Rule(
    name="campaign",
    doc="A budgeted series of rounds under one binding (or external project). Candidates arrive "
    "through `rsi candidate add` / `rsi round` into an append-only log; the targets "
    "<name>.round-N, <name>.best, <name>.final, <name>.report and <name>.dashboard (the HTML "
    "report) are derived from it.",
    attrs={
        "binding": attr("label", "the binding (or external_project) every round is judged under"),
        "rounds": attr("table", "{exact = N} or {up_to = N}"),
        "deadline_s": attr(
            "float",
            "wall-clock seconds from the campaign's start (its first log "
            "entry) to the end of the final",
            default=None,
        ),
        "final_reserve_s": attr(
            "float",
            "the last seconds before the deadline, kept for the final: rounds are refused in them",
            default=0.0,
        ),
        "stop_on": attr(
            "string_list",
            "the reasons that complete the campaign: rounds (budget "
            "used), deadline (round window closed), agent (`rsi campaign stop`, "
            "up_to only); default: all that apply",
            default=None,
        ),
        "final_seed": attr(
            "int",
            "mixed into every seed of the final's specs, so its inputs differ from every round's",
            default=1,
        ),
        "knowledge": attr(
            "table",
            'what `rsi campaign knowledge` may retrieve: {enabled = true, sources = ["docs", '
            '"evidence", "notes", or package-relative files/folders], budget_chars = 6000}; '
            "fixed at the start (switching it is a new campaign)",
            default=None,
        ),
        "doc": attr("string", "free text", default=""),
        "tags": attr("string_list", "", default=[]),
    },
    impl=_campaign,
    generate=_generate,
)
