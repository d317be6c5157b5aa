"""Campaign commands for agents and people: `rsi candidate add`, `rsi round`, `rsi campaign
status|start|stop|abandon|regrade|final|report`. Registered through the `rsi.commands` entry point.
It must never hold a campaign rule of its own.

A thin adapter: each command parses its options, calls the in-process service
(rules.campaign.service.Campaigns, which holds every rule of the campaign and is the only
reader of the clock and writer of the log), and prints the document it returns — as JSON under
`--json`, else as text. A refusal under `--json` is the command's JSON error document too.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from rules.campaign.documents import (
    ABANDON_SCHEMA,
    ADD_SCHEMA,
    CHECK_SCHEMA,
    FINAL_SCHEMA,
    REGRADE_SCHEMA,
    REPORT_RESULT_SCHEMA,
    ROUND_SCHEMA,
    START_SCHEMA,
    STATUS_SCHEMA,
    STOP_SCHEMA,
)
from rules.campaign.model import CampaignClosed, iso
from rules.campaign.service import Campaigns
from rules.campaign.usage import parse_usage
from rules.cli_support import emit_json, json_errors, run_service
from rules.knowledge_cli import knowledge_cmd

__all__ = ["Campaigns", "CampaignClosed", "candidate", "campaign_group", "round_cmd"]


LOCK_TIMEOUT = click.option(
    "--lock-timeout",
    type=float,
    metavar="SECONDS",
    help="Give up (exit 1, retryable) when the host lock (RSI_HOST_LOCK) is not free within "
    "SECONDS (default: wait, saying who holds it).",
)


# ================================================================================== output


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


@click.group("candidate")
def candidate() -> None:
    """Submit candidates to a campaign's append-only log."""


@candidate.command("add", cls=json_errors(ADD_SCHEMA))
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
    doc = run_service(
        ctx,
        ADD_SCHEMA,
        campaign,
        as_json,
        lambda svc: svc.add(campaign, src, hypothesis=hypothesis, usage=parse_usage(usage_file)),
    )
    if as_json:
        emit_json(doc)
        return
    if not doc["added"]:
        click.echo(f"rsi: note: identical to round {doc['round']}; nothing was added", err=True)
    for rel in doc["ignored_outside_scope"]:
        click.echo(
            f"rsi: note: ignored {rel} (outside the editable scope, differs from the "
            "frozen baseline)",
            err=True,
        )
    click.echo(doc["label"])


@candidate.command("check", cls=json_errors(CHECK_SCHEMA))
@click.argument("campaign")
@click.option(
    "--from",
    "src",
    required=True,
    type=click.Path(),
    help="Folder holding the candidate's editable files (as for `rsi round --from`).",
)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def candidate_check(ctx: click.Context, campaign: str, src: str, as_json: bool) -> None:
    """Pre-flight a candidate without spending a round: every file parses, the entry module
    imports, the entry point exists and takes the baseline's arguments.

    Runs in the sandbox in about a second; appends nothing to the log, counts nothing in the
    budget, measures nothing and never calls the entry (so it reveals nothing about hidden
    cases); at most 60 per campaign and hour. Advice only: the round judges the candidate again.

    \b
    Exit codes:
      0  every check passed
      1  a check failed (or the pre-flight step could not report)
      2  usage error;  3  rate limit reached
    """
    doc = run_service(ctx, CHECK_SCHEMA, campaign, as_json, lambda svc: svc.check(campaign, src))
    if as_json:
        emit_json(doc)
    else:
        for c in doc["checks"]:
            where = c["file"] + (f":{c['line']}" if c.get("line") else "") if c["file"] else ""
            mark = "ok  " if c["ok"] else "FAIL"
            click.echo(f"{mark} {c['name']:<10} {where}  {c['detail']}")
        if doc.get("error"):
            click.echo(f"rsi: error: {doc['error']['message']}", err=True)
        if doc.get("note"):
            click.echo(f"rsi: note: {doc['note']}", err=True)
        r = doc["rate"]
        click.echo(
            f"pre-flight {'passed' if doc['ok'] else 'failed'} in {doc['seconds']:.2f} s "
            f"(not a round; {r['used']}/{r['limit']} checks this hour)"
        )
    sys.exit(0 if doc["ok"] else 1)


@click.command("round", cls=json_errors(ROUND_SCHEMA))
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
    "--session",
    help="The dispatch id (rsi agent prepare) whose bound session made this candidate.",
)
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
    session: str | None,
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
    doc = run_service(
        ctx,
        ROUND_SCHEMA,
        campaign,
        as_json,
        lambda svc: svc.round(
            campaign,
            src=src,
            number=number,
            hypothesis=hypothesis,
            usage=parse_usage(usage_file) if src is not None else None,
            events=events,
            lock_timeout=lock_timeout,
            session=session,
        ),
    )
    if as_json:
        emit_json(doc)
    else:
        if doc["added"] is False:
            click.echo(f"rsi: note: identical to round {doc['round']}; nothing was added", err=True)
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
    """Inspect and steer campaigns (status, start, stop, abandon, regrade, final, report)."""


@campaign_group.command("status", cls=json_errors(STATUS_SCHEMA))
@click.argument("campaign")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def campaign_status(ctx: click.Context, campaign: str, as_json: bool) -> None:
    """Rounds, verdicts, best, budget, usage totals and the final's state — from the log and the
    cache only; runs nothing."""
    doc = run_service(ctx, STATUS_SCHEMA, campaign, as_json, lambda svc: svc.status(campaign))
    if as_json:
        emit_json(doc)
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
        elif r["state"] == "host_busy":
            what += f" ({r['verdict']}, not kept: run `rsi round {doc['campaign']} --round "
            what += f"{r['round']}` to measure again)"
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


@campaign_group.command("start", cls=json_errors(START_SCHEMA))
@click.argument("campaign")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def campaign_start(ctx: click.Context, campaign: str, as_json: bool) -> None:
    """Start CAMPAIGN's clock now and (for an external project) freeze its tree. Optional: the
    first candidate starts a campaign that was not started."""
    doc = run_service(ctx, START_SCHEMA, campaign, as_json, lambda svc: svc.start(campaign))
    if as_json:
        emit_json(doc)
        return
    click.echo(
        f"{doc['campaign']}: {'started' if doc['started'] else 'already started'} at "
        f"{iso(doc['started_at'])}"
    )
    frozen = doc["frozen"]
    if frozen:
        click.echo(
            f"  frozen {frozen['n_files']} files of {frozen['root']} "
            f"(manifest {frozen['manifest']})"
        )


@campaign_group.command("stop", cls=json_errors(STOP_SCHEMA))
@click.argument("campaign")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def campaign_stop(ctx: click.Context, campaign: str, as_json: bool) -> None:
    """End CAMPAIGN's rounds now (the agent's early stop; up_to campaigns that accept 'agent')."""
    doc = run_service(ctx, STOP_SCHEMA, campaign, as_json, lambda svc: svc.stop(campaign))
    if as_json:
        emit_json(doc)
        return
    b = doc["budget"]
    click.echo(
        f"{doc['campaign']}: {'stopped' if doc['stopped_now'] else 'already ended'} "
        f"({b['ended_by']}); final allowed: {'yes' if b['final_allowed'] else 'no'}"
    )


@campaign_group.command("abandon", cls=json_errors(ABANDON_SCHEMA))
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
    doc = run_service(
        ctx, ABANDON_SCHEMA, campaign, as_json, lambda svc: svc.abandon(campaign, number, reason)
    )
    if as_json:
        emit_json(doc)
        return
    click.echo(
        f"{doc['label']}: {'abandoned' if doc['abandoned_now'] else 'already abandoned'} "
        f"({doc['reason']}); it still counts against the budget "
        f"({doc['budget']['rounds_used']}/{doc['budget']['max_rounds']} used)"
    )


@campaign_group.command("regrade", cls=json_errors(REGRADE_SCHEMA))
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
    given = {
        "min_improvement": min_improvement,
        "confidence": confidence,
        "bootstrap_resamples": bootstrap_resamples,
        "min_pairs": min_pairs,
    }
    doc = run_service(
        ctx,
        REGRADE_SCHEMA,
        campaign,
        as_json,
        lambda svc: svc.regrade(
            campaign,
            events=events,
            lock_timeout=lock_timeout,
            **{k: v for k, v in given.items() if v is not None},
        ),
    )
    if as_json:
        emit_json(doc)
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


@campaign_group.command("final", cls=json_errors(FINAL_SCHEMA))
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
    doc = run_service(
        ctx,
        FINAL_SCHEMA,
        campaign,
        as_json,
        lambda svc: svc.final(campaign, events=events, lock_timeout=lock_timeout),
    )
    if as_json:
        emit_json(doc)
    else:
        fdoc = doc["final"]
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


@campaign_group.command("report", cls=json_errors(REPORT_RESULT_SCHEMA))
@click.argument("campaign")
@click.option("--events", type=click.File("w"), help="Also write the build's event stream.")
@LOCK_TIMEOUT
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def campaign_report(
    ctx: click.Context, campaign: str, events, lock_timeout: float | None, as_json: bool
) -> None:
    """Print CAMPAIGN's report (rounds, why each did not pass, selection, final, usage): from
    the cache, or built when only bookkeeping is missing. It never measures a round or runs
    the final: a round without evidence, or a final that is due, makes it `unavailable`.

    \b
    Exit codes: 0 report built, 1 unavailable or failed, 2 usage.
    """
    doc = run_service(
        ctx,
        REPORT_RESULT_SCHEMA,
        campaign,
        as_json,
        lambda svc: svc.report(campaign, events=events, lock_timeout=lock_timeout),
    )
    if as_json:
        emit_json(doc)
    else:
        md = (doc["evidence"].get("report.md") or {}).get("path")
        if doc["state"] == "done" and md:
            click.echo(Path(md).read_text().rstrip())
        else:
            click.echo(f"{doc['label']}: {doc['state']} ({doc.get('detail', '')})")
            for what in doc["missing"]:
                click.echo(f"  missing: {what}")
            for err in doc["errors"]:
                click.echo(f"  {err['action']}: {err['status']}: {err['message']}")
    sys.exit(0 if doc["state"] == "done" else 1)


# NB: `rsi campaign knowledge` lives in its own module (rules/knowledge_cli.py)
campaign_group.add_command(knowledge_cmd)
