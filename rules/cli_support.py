"""What every campaign-facing click command shares: the service over the workspace the `rsi` group
was given, JSON output, and refusals (an RsiError or a command-line error) as the command's JSON
error document under --json. Owns no command; must never import a command module."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from rsi.errors import EXIT_USAGE, RsiError
from rules.campaign.model import CampaignClosed
from rules.campaign.service import Campaigns


def service_for(ctx: click.Context) -> Campaigns:
    """The service over the workspace the `rsi` group was given (or found from the cwd);
    campaign labels are relative to the package of the cwd."""
    from rsi.workspace import Workspace

    obj = ctx.find_root().obj or {}
    root = obj.get("workspace")
    ws = Workspace.load(Path(root).resolve()) if root else Workspace.discover()
    if obj.get("store"):
        ws = ws.with_overrides(store=obj["store"])
    try:
        rel = Path.cwd().resolve().relative_to(ws.root)
        package = "" if str(rel) == "." else rel.as_posix()
    except ValueError:
        package = ""
    return Campaigns(ws, package=package)


def run_service(ctx: click.Context, schema: str, campaign: str, as_json: bool, call) -> dict:
    """`call(service)`'s document; a refusal is printed as JSON under --json (and exits)."""
    try:
        return call(service_for(ctx))
    except RsiError as exc:
        if as_json:
            fail_json(schema, campaign, exc)
        raise


def emit_json(doc: dict) -> None:
    click.echo(json.dumps(doc, indent=2, sort_keys=True, default=str))


def fail_json(schema: str, campaign: str, exc: RsiError) -> None:
    code = getattr(exc, "code", None) or type(exc).__name__
    emit_json(
        {
            "schema": schema,
            "campaign": campaign,
            "state": "refused" if isinstance(exc, CampaignClosed) else "error",
            "error": {"code": code, "message": exc.message, "hint": exc.hint},
        }
    )
    sys.exit(exc.exit_code)


def json_errors(schema: str) -> type[click.Command]:
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
                emit_json(
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
