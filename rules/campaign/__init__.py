"""The campaign family: a budgeted series of rounds under one binding (or external project). It
re-exports the package's public names and must never hold logic of its own.

- `model`: the policy, the state a log records, an opened campaign, when it takes a round
- `log`: the append-only log, attempts and the evidence index, gc roots
- `snapshot`: candidate and project snapshots (`{path: digest}` manifests)
- `usage`: what producing a candidate cost, validated
- `judging`: the judge recorded at the start, and what changed since
- `documents`: the JSON documents the commands return, read from the log and the cache
- `service`: `Campaigns`, every command in process (the CLI, rules/campaign_cli.py, adapts it)
- `live`: what `rsi dashboard` (rules/dashboard_cli.py) shows, read from the logs and the cache
  without writing anything
- `targets`: the rules (`campaign`, `external_project` and the generated targets)
- `agents`: what a task asks (for a brief or an MCP tool) and the session handoff (dispatch,
  bind, record; rounds per session)
- `knowledge`: retrieval from declared sources within a budget, recorded for the next round

The harness steps the targets run are defined once, in rules/steps.py.
"""

from __future__ import annotations

from rules.campaign.judging import JUDGE_CAMPAIGN_SCRIPTS, JUDGE_STEPS, JudgeChanged
from rules.campaign.log import LOG_SCHEMA, Attempts, CampaignLog, campaign_dir, gc_roots
from rules.campaign.model import (
    STOP_REASONS,
    Campaign,
    CampaignClosed,
    Policy,
    State,
    ended_reason,
    open_campaign,
    policy_of,
    project_spec,
    state_of,
)
from rules.campaign.service import Campaigns
from rules.campaign.paths import DEFAULT_EXCLUDE, in_scope, walk_files
from rules.campaign.snapshot import manifest_digest
from rules.campaign.targets import RULES, _generate

__all__ = [
    "DEFAULT_EXCLUDE",
    "JUDGE_CAMPAIGN_SCRIPTS",
    "JUDGE_STEPS",
    "LOG_SCHEMA",
    "RULES",
    "STOP_REASONS",
    "Attempts",
    "Campaign",
    "CampaignClosed",
    "CampaignLog",
    "Campaigns",
    "JudgeChanged",
    "Policy",
    "State",
    "_generate",
    "campaign_dir",
    "ended_reason",
    "gc_roots",
    "in_scope",
    "manifest_digest",
    "open_campaign",
    "policy_of",
    "project_spec",
    "state_of",
    "walk_files",
]
