"""The campaign's job kinds (`rsi job submit round|final CAMPAIGN`, rsi/jobs/kinds.py), registered
through the `rsi.job_kinds` entry point: thin over the `Campaigns` service. It must never judge
anything the service would not.

- `round`: at submit, each `--from DIR` is snapshotted into the campaign's log (as `rsi
  candidate add`: content-addressed, idempotent, refused when the campaign takes no more
  rounds), so the job judges what the folder held then; `--round N` names an existing round.
  The runner judges each round in turn, charging the profile's rounds, calls, tokens and money
  with the candidate's usage record before it.
- `final`: checked at submit (refused when the rounds are not over), charged with the usage
  of every candidate of the campaign, then built as `rsi campaign final`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rsi.errors import UsageError
from rsi.jobs.kinds import JobKind
from rules.campaign.model import check_final_allowed, state_of
from rules.campaign.service import Campaigns
from rules.campaign.usage import parse_usage


def _campaign(args: dict, kind: str) -> str:
    names = list(args.get("targets") or [])
    if len(names) != 1:
        raise UsageError(f"rsi job submit {kind}: name exactly one campaign (//pkg:campaign)")
    return names[0]


def evidence_files(doc: Any, found: list[dict] | None = None, where: str = "") -> list[dict]:
    """Every `{digest, path}` evidence entry of a campaign document, once each."""
    found = [] if found is None else found
    if isinstance(doc, dict):
        if isinstance(doc.get("digest"), str) and isinstance(doc.get("path"), str):
            entry = {"path": doc["path"], "digest": doc["digest"], "from": where}
            if all(e["digest"] != entry["digest"] or e["path"] != entry["path"] for e in found):
                found.append(entry)
        for k, v in doc.items():
            evidence_files(v, found, f"{where}.{k}" if where else k)
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            evidence_files(v, found, f"{where}[{i}]")
    return found


def _prepare_round(ws: Any, args: dict, package: str) -> tuple[dict, dict]:
    campaign = _campaign(args, "round")
    srcs, number = list(args.get("srcs") or []), args.get("number")
    if bool(srcs) == (number is not None):
        raise UsageError("rsi job submit round: give --from DIR (repeatable) or --round N")
    if args.get("usage_file") and len(srcs) > 1:
        raise UsageError("--usage describes one candidate: submit one --from with it")
    svc = Campaigns(ws, package=package)
    numbers = []
    for src in srcs:
        usage = parse_usage(args.get("usage_file"))
        doc = svc.add(campaign, Path(src), hypothesis=args.get("hypothesis"), usage=usage)
        numbers.append(doc["round"])
    if number is not None:
        numbers.append(number)
    camp = svc.open(campaign)
    state = state_of(camp.log.read())
    rounds = []
    for n in numbers:
        if n > len(state.candidates):
            raise UsageError(f"{camp.label} has {len(state.candidates)} round(s); no round {n}")
        entry = state.candidates[n - 1]
        rounds.append({"round": n, "digest": entry["digest"], "usage": entry.get("usage")})
    spec = {"campaign": str(camp.label), "rounds": rounds}
    key = {"campaign": str(camp.label), "rounds": [[r["round"], r["digest"]] for r in rounds]}
    return spec, key


def _run_round(ctx: Any, spec: dict) -> dict:
    svc = Campaigns(ctx.ws, builder=ctx.builder)
    docs = []
    for r in spec["rounds"]:
        ctx.check()
        ctx.ledger.charge_round(r["usage"], f"round {r['round']}")
        ctx.event("job_round", round=r["round"], digest=r["digest"])
        docs.append(svc.round(spec["campaign"], number=r["round"], lock_timeout=ctx.lock_timeout))
        ctx.partial = {"ok": False, "result": {"rounds": docs}, "artifacts": evidence_files(docs)}
    ok = all(d["state"] == "done" for d in docs)
    return {"ok": ok, "result": {"rounds": docs}, "artifacts": evidence_files(docs)}


def total_usage(candidates: list[dict]) -> dict:
    """The usage of every candidate together; a field any candidate did not report is null."""

    def total(get) -> Any:
        values = [get(c.get("usage") or {}) for c in candidates]
        return None if any(v is None for v in values) else sum(values)

    return {
        "tokens": {
            k: total(lambda u, k=k: (u.get("tokens") or {}).get(k))
            for k in ("input", "output", "cached")
        },
        "calls": total(lambda u: u.get("calls")),
    }


def _prepare_final(ws: Any, args: dict, package: str) -> tuple[dict, dict]:
    campaign = _campaign(args, "final")
    if args.get("srcs") or args.get("number") is not None:
        raise UsageError("--from and --round are for `rsi job submit round`")
    svc = Campaigns(ws, package=package)
    camp = svc.open(campaign)
    state = state_of(camp.log.read())
    try:
        check_final_allowed(camp, state, camp.clock())
    except Exception as refused:
        # NB: a final already built stays readable after the deadline: the job returns it
        if getattr(refused, "code", None) != "deadline_passed":
            raise
    digests = [c["digest"] for c in state.candidates]
    spec = {"campaign": str(camp.label), "usage": total_usage(state.candidates)}
    key = {"campaign": str(camp.label), "candidates": digests, "abandoned": sorted(state.abandoned)}
    return spec, key


def _run_final(ctx: Any, spec: dict) -> dict:
    ctx.check()
    ctx.ledger.charge_usage(spec["usage"], "the campaign's candidates")
    doc = Campaigns(ctx.ws, builder=ctx.builder).final(
        spec["campaign"], lock_timeout=ctx.lock_timeout
    )
    return {"ok": doc["state"] == "done", "result": doc, "artifacts": evidence_files(doc)}


ROUND = JobKind(
    "round", "judge campaign rounds (as rsi round)", _prepare_round, _run_round, attach_done=True
)
FINAL = JobKind(
    "final",
    "build a campaign's final (as rsi campaign final)",
    _prepare_final,
    _run_final,
    attach_done=True,
)
