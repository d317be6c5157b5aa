"""The campaign family's rules, listed once (`RULES`, registered by rules/register.py): the
`campaign` declaration and its generated `<c>.round-N`, `.best`, `.final`, `.report` and
`.dashboard` targets, the external project and its baseline. Each rule lives in its own module;
they must never read the clock or run a measurement (the service enforces budget and
deadline).
"""

from __future__ import annotations

from rules.campaign.declaration import CAMPAIGN, _generate
from rules.campaign.final_rules import CAMPAIGN_FINAL
from rules.campaign.output_rules import CAMPAIGN_DASHBOARD, CAMPAIGN_REPORT
from rules.campaign.project_rules import CAMPAIGN_BASELINE, EXTERNAL_PROJECT
from rules.campaign.round_rules import CAMPAIGN_BEST, CAMPAIGN_ROUND

__all__ = ["RULES", "_generate"]


RULES = [
    CAMPAIGN,
    EXTERNAL_PROJECT,
    CAMPAIGN_BASELINE,
    CAMPAIGN_ROUND,
    CAMPAIGN_BEST,
    CAMPAIGN_FINAL,
    CAMPAIGN_REPORT,
    CAMPAIGN_DASHBOARD,
]
