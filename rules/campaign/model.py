"""The campaign model: its policy (budget, deadline, stop reasons), the state its log records, and
an opened campaign (its declaration, binding and editable scope) with the rules that say when it
takes a round and when its final may run. Reads no clock: callers pass `now`. It must never write
the log or read the clock."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from rsi.errors import DeclarationError, RsiError, UsageError
from rsi.label import Label
from rules.campaign.log import CampaignLog
from rules.campaign.paths import in_scope

STOP_REASONS = ("rounds", "deadline", "agent")


@dataclass(frozen=True)
class State:
    """What the log says: the start entry, the candidates in order, the stop entry if any, and
    the rounds given up on (`abandon` entries, by round number)."""

    start: dict | None
    candidates: tuple[dict, ...]
    stop: dict | None
    abandoned: Mapping[int, dict] = field(default_factory=dict)
    # NB: `regrade` entries, in order: the last one's `assess` is the assessment policy every
    # round is judged under from then on (its measurements stay)
    regrades: tuple[dict, ...] = ()

    @property
    def assess_override(self) -> dict:
        return dict((self.regrades[-1].get("assess") or {}) if self.regrades else {})

    @property
    def started_at(self) -> float | None:
        return (
            self.start["time"]
            if self.start
            else (self.candidates[0]["time"] if self.candidates else None)
        )


def state_of(entries: list[dict]) -> State:
    start = next((e for e in entries if e.get("kind") == "start"), None)
    cands = tuple(e for e in entries if e.get("kind") == "candidate")
    stop = next((e for e in entries if e.get("kind") == "stop"), None)
    abandoned: dict[int, dict] = {}
    for e in entries:
        if e.get("kind") == "abandon" and isinstance(e.get("round"), int):
            abandoned.setdefault(e["round"], e)
    regrades = tuple(e for e in entries if e.get("kind") == "regrade")
    return State(start, cands, stop, abandoned, regrades)


@dataclass(frozen=True)
class Policy:
    mode: str  # "exact" | "up_to"
    max_rounds: int
    deadline_s: float | None
    final_reserve_s: float
    stop_on: tuple[str, ...]
    final_seed: int

    def to_json(self) -> dict:
        return {
            "rounds": {self.mode: self.max_rounds},
            "deadline_s": self.deadline_s,
            "final_reserve_s": self.final_reserve_s,
            "stop_on": list(self.stop_on),
            "final_seed": self.final_seed,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], file: str, target: str) -> "Policy":
        return policy_of(
            {
                "rounds": doc["rounds"],
                "deadline_s": doc["deadline_s"],
                "final_reserve_s": doc["final_reserve_s"],
                "stop_on": doc["stop_on"],
                "final_seed": doc["final_seed"],
            },
            file,
            target,
        )


def policy_of(attrs: Mapping[str, Any], file: str, target: str) -> Policy:
    def bad(field_name: str, message: str, hint: str | None = None) -> DeclarationError:
        return DeclarationError(message, file=file, target=target, field=field_name, hint=hint)

    rounds = attrs["rounds"]
    if (
        not isinstance(rounds, dict)
        or len(rounds) != 1
        or next(iter(rounds)) not in ("exact", "up_to")
    ):
        raise bad(
            "rounds",
            f"expected {{exact = N}} or {{up_to = N}}, got {rounds!r}",
            "exact: the campaign is complete after exactly N rounds; up_to: at most N",
        )
    mode, n = next(iter(rounds.items()))
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise bad("rounds", f"{mode} must be a positive integer, got {n!r}")
    deadline = attrs["deadline_s"]
    reserve = attrs["final_reserve_s"]
    if deadline is not None and deadline <= 0:
        raise bad("deadline_s", "must be positive (seconds from the campaign's start)")
    if reserve < 0:
        raise bad("final_reserve_s", "must not be negative")
    if deadline is not None and reserve >= deadline:
        raise bad(
            "final_reserve_s",
            f"the final's reserve ({reserve:g} s) leaves no time for "
            f"rounds within deadline_s ({deadline:g} s)",
        )
    stop_on = attrs["stop_on"]
    if stop_on is None:
        stop_on = (
            ("rounds",)
            + (("deadline",) if deadline is not None else ())
            + (("agent",) if mode == "up_to" else ())
        )
    stop_on = tuple(stop_on)
    for reason in stop_on:
        if reason not in STOP_REASONS:
            raise bad(
                "stop_on",
                f"unknown stop reason {reason!r}",
                f"known reasons: {', '.join(STOP_REASONS)}",
            )
    if "rounds" not in stop_on:
        raise bad("stop_on", "must include 'rounds': a campaign whose budget is used is complete")
    if mode == "exact" and "agent" in stop_on:
        raise bad(
            "stop_on",
            "an exact-rounds campaign cannot accept an early stop by the agent",
            "use rounds = {up_to = N}, or drop 'agent' from stop_on",
        )
    if "deadline" in stop_on and deadline is None:
        raise bad("stop_on", "'deadline' is accepted but no deadline_s is declared")
    return Policy(mode, n, deadline, float(reserve), stop_on, int(attrs["final_seed"]))


def ended_reason(policy: Policy, state: State, now: float | None = None) -> str | None:
    """Why the campaign's rounds are over (None while open); `now=None` judges by the log only."""
    if state.stop is not None:
        return state.stop["reason"]
    if len(state.candidates) >= policy.max_rounds:
        return "rounds"
    if (
        now is not None
        and policy.deadline_s is not None
        and state.started_at is not None
        and now >= state.started_at + policy.deadline_s - policy.final_reserve_s
    ):
        return "deadline"
    return None


EXIT_REFUSED = 3


class CampaignClosed(RsiError):
    """The campaign refuses this request (budget used, deadline reached, stopped, still open)."""

    exit_code = EXIT_REFUSED

    def __init__(self, code: str, message: str, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.code = code


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


def open_campaign(ws, text: str, package: str = "") -> Campaign:
    """The campaign `text` names (a label, relative to `package`), with its binding."""
    from rsi.build_analysis import make_loader

    loader = make_loader(ws)
    label = Label.parse(text, package)
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


def iso(t: float | None) -> str | None:
    return None if t is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def round_refusal(camp: Campaign, state: State, now: float) -> CampaignClosed | None:
    p, name = camp.policy, str(camp.label)
    if state.stop is not None:
        return CampaignClosed(
            "campaign_stopped",
            f"{name} was stopped ({state.stop['reason']}) "
            f"at {iso(state.stop['time'])}; it takes no more rounds",
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
            f"{name}'s round window closed at {iso(close_at)} (deadline_s {p.deadline_s:g} "
            f"minus final_reserve_s {p.final_reserve_s:g} after the start at "
            f"{iso(state.started_at)}); it takes no more rounds",
            hint=f"the final may start until {iso(state.started_at + p.deadline_s)}: "
            f"rsi campaign final {name}",
        )
    return None


def check_final_allowed(camp: Campaign, state: State, now: float) -> None:
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
                f"{iso(state.started_at + p.deadline_s - p.final_reserve_s)}"
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
            f"{iso(state.started_at + p.deadline_s)}; the final had to start "
            f"within its reserve ({p.final_reserve_s:g} s)",
            hint=f"a final already built stays readable: rsi campaign status {name}",
        )


def project_spec(a: Mapping[str, Any], error) -> dict:
    """The judge of an external project as data (rsi.project.spec/1); `error(message, field,
    hint=None)` builds the exception to raise."""
    if a["direction"] not in ("minimize", "maximize"):
        raise error("direction must be minimize or maximize", "direction")
    for field_name in ("editable", "protocol"):
        for pat in a[field_name]:
            # NB: patterns match paths inside the frozen tree; one that leaves it matches
            # nothing, and would only be refused later, at the campaign's start
            if pat.startswith("/") or ".." in pat.split("/") or "\x00" in pat:
                raise error(
                    f"{field_name} pattern {pat!r} leaves the project root "
                    f"({'an absolute path' if pat.startswith('/') else 'a path with ..'})",
                    field_name,
                    "name files relative to the project root, without '..'",
                )
    for pat in a["protocol"]:
        if in_scope(pat, a["editable"]):
            raise error(
                f"protocol file {pat!r} is inside the editable scope",
                "protocol",
                "a candidate must never be able to change its own judge",
            )
    m = dict(a["measure"])
    unknown = set(m) - {"pairs"}
    if unknown:
        raise error(
            f"unknown measure key(s) {sorted(unknown)}",
            "measure",
            "measure takes pairs (the benchmark command does its own warm-up)",
        )
    pairs = m.get("pairs", 8)
    if isinstance(pairs, bool) or not isinstance(pairs, int) or pairs < 1:
        raise error("measure.pairs must be a positive integer", "measure")
    assess = {
        "min_improvement": 0.05,
        "confidence": 0.95,
        "bootstrap_resamples": 2000,
        "min_pairs": 5,
        **a["assess"],
    }
    unknown = set(assess) - {"min_improvement", "confidence", "bootstrap_resamples", "min_pairs"}
    if unknown:
        raise error(f"unknown assess key(s) {sorted(unknown)}", "assess")
    if pairs < assess["min_pairs"]:
        raise error(
            f"measure.pairs ({pairs}) is below assess.min_pairs "
            f"({assess['min_pairs']}): no verdict could ever PASS",
            "measure",
        )
    return {
        "schema": "rsi.project.spec/1",
        "editable": list(a["editable"]),
        "protocol": list(a["protocol"]),
        "quality": {
            "cmd": a["quality_cmd"],
            "field": a["quality_field"],
            "timeout_s": a["command_timeout_s"],
        },
        "benchmark": {"cmd": a["benchmark_cmd"], "timeout_s": a["command_timeout_s"]},
        "measure": {"pairs": pairs, "metric": a["metric"], "direction": a["direction"]},
        "assess": assess,
        "env": dict(a["env"]),
        "seed": a["seed"],
        "threads": None,
    }


# ============================================================================ declaration parts

KNOWLEDGE_DEFAULT = {
    "enabled": True,
    "sources": ["docs", "evidence", "notes"],
    "budget_chars": 6000,
}


def knowledge_policy(attrs: dict, file: str = "", target: str = "") -> dict:
    """The campaign's `knowledge` table, checked, with defaults applied."""
    table = attrs.get("knowledge")
    table = {} if table is None else table
    unknown = sorted(set(table) - set(KNOWLEDGE_DEFAULT))
    if unknown:
        raise DeclarationError(
            f"knowledge: unknown keys {unknown} (enabled, sources, budget_chars)",
            file=file,
            target=target,
            field="knowledge",
        )
    doc = dict(KNOWLEDGE_DEFAULT, **table)
    if not isinstance(doc["enabled"], bool):
        raise DeclarationError("knowledge.enabled must be true or false", field="knowledge")
    sources = doc["sources"]
    if not isinstance(sources, list) or not all(isinstance(s, str) and s for s in sources):
        raise DeclarationError("knowledge.sources must be a list of names", field="knowledge")
    budget = doc["budget_chars"]
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise DeclarationError(
            "knowledge.budget_chars must be a positive integer", field="knowledge"
        )
    return {"enabled": doc["enabled"], "sources": list(sources), "budget_chars": budget}


def task_target(camp: Campaign):
    """The catalog task a task campaign's binding names (None for a project campaign)."""
    from rsi.build_analysis import make_loader

    if camp.kind != "task":
        return None
    loader = make_loader(camp.ws)
    return loader.target(camp.binding.attrs["task"], wanted_by=camp.binding, field="task")
