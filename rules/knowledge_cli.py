"""`rsi campaign knowledge CAMPAIGN QUERY` (rules/campaign/knowledge.py): retrieval within a budget,
recorded for the next round. Added to the `campaign` group by rules/campaign_cli.py. It must never
hold a campaign rule of its own."""

from __future__ import annotations

import sys

import click

from rules.campaign.knowledge import RESULT_SCHEMA
from rules.cli_support import emit_json, json_errors, run_service


@click.command("knowledge", cls=json_errors(RESULT_SCHEMA))
@click.argument("campaign")
@click.argument("query")
@click.option(
    "--budget",
    "budget_chars",
    type=click.IntRange(1),
    help="Characters (at most the declared budget).",
)
@click.option("--session", help="The dispatch id of the session asking.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def knowledge_cmd(ctx, campaign, query, budget_chars, session, as_json):
    """Retrieve material for QUERY from CAMPAIGN's knowledge sources within a budget; the
    record (digests, sources, what was cut) is referenced by the next round."""
    from rules.campaign.consult import query_knowledge

    doc = run_service(
        ctx,
        RESULT_SCHEMA,
        campaign,
        as_json,
        lambda svc: query_knowledge(
            svc.open(campaign), query, budget_chars=budget_chars, session=session
        ),
    )
    if as_json:
        emit_json(doc)
        return
    for item in doc["returned"]:
        click.echo(f"--- {item['source']} #{item['chunk']} (score {item['score']})")
        click.echo(item["text"])
    click.echo(
        f"--- record {doc['record']}: {len(doc['returned'])} returned, {len(doc['cut'])} cut "
        f"by the budget ({doc['used_chars']}/{doc['budget_chars']} chars)",
        err=True,
    )
    sys.exit(0)


__all__ = ["knowledge_cmd"]
