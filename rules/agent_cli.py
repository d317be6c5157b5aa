"""Agent commands: `rsi agent prepare|bind|dispatch|record|sessions` (session handoff), a thin
adapter over rules/campaign/agents.py (`rsi campaign knowledge` is rules/knowledge_cli.py). It holds
no campaign rule and must never write the log itself."""

from __future__ import annotations

from pathlib import Path

import click

from rules.campaign.agents import DISPATCH_SCHEMA, SESSIONS_SCHEMA
from rules.campaign.usage import parse_usage
from rules.cli_support import emit_json, json_errors, run_service


@click.group("agent")
def agent_group() -> None:
    """Hand a campaign to an agent session: prepare a brief, bind the session, record it."""


@agent_group.command("prepare", cls=json_errors(DISPATCH_SCHEMA))
@click.argument("campaign")
@click.argument("work", type=click.Path())
@click.option("--note", help="Free text kept with the dispatch.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def prepare_cmd(ctx: click.Context, campaign: str, work: str, note: str | None, as_json: bool):
    """Write a brief (BRIEF.md, brief.json, candidate/ with the baseline's editable files) into
    WORK, a fresh folder, and register one dispatch in CAMPAIGN's log."""
    from rules.campaign.agents import prepare

    doc = run_service(
        ctx,
        DISPATCH_SCHEMA,
        campaign,
        as_json,
        lambda svc: prepare(svc.open(campaign), Path(work), note=note),
    )
    if as_json:
        emit_json(doc)
    else:
        click.echo(f"dispatch {doc['dispatch']}: brief {doc['brief']}")


def _bind(ctx, campaign, dispatch, session, model, host, started_at, as_json):
    from rules.campaign.agents import bind

    doc = run_service(
        ctx,
        DISPATCH_SCHEMA,
        campaign,
        as_json,
        lambda svc: bind(
            svc.open(campaign), dispatch, session, model=model, host=host, started_at=started_at
        ),
    )
    if as_json:
        emit_json(doc)
    else:
        click.echo(f"dispatch {dispatch}: bound to session {session}")


BIND_OPTIONS = [
    click.argument("campaign"),
    click.argument("dispatch"),
    click.option("--session", required=True, help="The host's session id."),
    click.option("--model", help="The model the session runs."),
    click.option("--host", help="The agent host (e.g. the harness or product that runs it)."),
    click.option("--started-at", type=float, help="Epoch seconds the session started."),
    click.option("--json", "as_json", is_flag=True),
    click.pass_context,
]


def _with(options, fn):
    for opt in reversed(options):
        fn = opt(fn)
    return fn


def _bind_cmd(name: str, doc: str) -> click.Command:
    def cmd(ctx, campaign, dispatch, session, model, host, started_at, as_json):
        _bind(ctx, campaign, dispatch, session, model, host, started_at, as_json)

    cmd.__doc__ = doc
    return agent_group.command(name, cls=json_errors(DISPATCH_SCHEMA))(_with(BIND_OPTIONS, cmd))


_bind_cmd(
    "bind",
    "Record the host session (id, model, start) that took DISPATCH; a second bind is refused.",
)
_bind_cmd("dispatch", "The same as `rsi agent bind`.")


@agent_group.command("record", cls=json_errors(DISPATCH_SCHEMA))
@click.argument("campaign")
@click.argument("dispatch")
@click.option("--usage", "usage_file", help="JSON file ('-' for stdin): the session's usage.")
@click.option("--transcript", type=click.Path(exists=True, dir_okay=False), help="Its transcript.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def record_cmd(ctx, campaign, dispatch, usage_file, transcript, as_json):
    """Attach the session's usage and its transcript's digest to its rounds."""
    from rules.campaign.agents import record

    data = Path(transcript).read_bytes() if transcript else None
    doc = run_service(
        ctx,
        DISPATCH_SCHEMA,
        campaign,
        as_json,
        lambda svc: record(
            svc.open(campaign), dispatch, usage=parse_usage(usage_file), transcript=data
        ),
    )
    if as_json:
        emit_json(doc)
    else:
        click.echo(f"dispatch {dispatch}: recorded (rounds {doc['rounds']})")


@agent_group.command("sessions", cls=json_errors(SESSIONS_SCHEMA))
@click.argument("campaign")
@click.pass_context
def sessions_cmd(ctx, campaign):
    """Every dispatch of CAMPAIGN with its session, records and rounds (JSON)."""
    from rules.campaign.agents import sessions_document

    emit_json(
        run_service(
            ctx, SESSIONS_SCHEMA, campaign, True, lambda svc: sessions_document(svc.open(campaign))
        )
    )


__all__ = ["agent_group"]
