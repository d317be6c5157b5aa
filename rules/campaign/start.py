"""A campaign's start entry: the judge, the frozen project tree and the knowledge policy, fixed
before any candidate is measured. Owns that one entry; must never append anything else."""

from __future__ import annotations

from rules.campaign.judging import current_judge
from rules.campaign.knowledge import start_fields as knowledge_start
from rules.campaign.model import Campaign
from rules.campaign.snapshot import freeze_project


def append_start(camp: Campaign, store, now: float) -> dict:
    project = freeze_project(camp, store) if camp.kind == "project" else None
    # NB: the judge is fixed before any candidate is measured: a later change is refused
    return camp.log.append(
        {
            "kind": "start",
            "time": now,
            "campaign": str(camp.label),
            "binding": str(camp.target.attrs["binding"]),
            "work": camp.kind,
            "policy": camp.policy.to_json(),
            "project": project,
            "judge": current_judge(camp, store),
            **knowledge_start(camp),
        }
    )
