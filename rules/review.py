"""The independent review of a round's candidate (rules/harness/review.py): the task's declared
review rules, checked while the package loads, and the `Review` action a campaign round runs
beside its check and measurement.

The review reads the frozen candidate, the baseline, the binding's public spec (case shapes,
workload, seeds, threads), the rules and the check's evidence; it writes `review.json`
(rsi.review/1: verdict pass/fail/inconclusive and findings with rule, file and line). Its key
names the binding's evidence folder and the candidate's content, like the check's, so the same
content is reviewed once. It never feeds the assessment: a verdict's numbers are the referee's
alone, and a review can only withhold acceptance (selection and the final).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from rsi.rule import Artifact, RuleContext
from rules import steps

REVIEW_KEYS = ("forbid", "allow", "reviewer", "reviewer_files", "reviewer_timeout_s")


def review_rules(ctx: RuleContext, table: Mapping[str, Any]) -> tuple[dict, tuple[Artifact, ...]]:
    """A task's `review` table checked: ({forbid, allow, reviewer, reviewer_timeout_s}, the
    reviewer's files as action inputs). Errors name the field."""
    unknown = sorted(set(table) - set(REVIEW_KEYS))
    if unknown:
        raise ctx.error(f"unknown keys {unknown} ({', '.join(REVIEW_KEYS)})", "review")
    rules: dict[str, Any] = {}
    for key in ("forbid", "allow", "reviewer_files"):
        value = table.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise ctx.error(f"review.{key} must be a list of non-empty strings", "review")
        rules[key] = sorted(set(value))
    reviewer = table.get("reviewer", "")
    if not isinstance(reviewer, str):
        raise ctx.error("review.reviewer must be a command line (a string)", "review")
    rules["reviewer"] = reviewer.strip()
    timeout = table.get("reviewer_timeout_s", 300.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ctx.error("review.reviewer_timeout_s must be a positive number", "review")
    rules["reviewer_timeout_s"] = float(timeout)
    if rules["reviewer_files"] and not rules["reviewer"]:
        raise ctx.error("review.reviewer_files needs review.reviewer", "review")
    files = tuple(ctx.source(f, "review") for f in rules.pop("reviewer_files"))
    return rules, files


def review_action(
    ctx: RuleContext,
    info,
    cand_files,
    cand_dir: str,
    prefix: str,
    check: Artifact,
    platform: Mapping[str, str],
) -> Artifact:
    """The `Review` action of one candidate under a task binding (`info`: its BindingInfo):
    `{prefix}review.json`, beside the check and samples."""
    task = info.task
    rules = dict(getattr(task, "review", None) or {})
    rules_file = ctx.write(
        f"{prefix}review_rules.json", json.dumps(rules, sort_keys=True, indent=1)
    )
    extra = tuple(getattr(task, "review_files", ()) or ())
    timeout = 120.0 + (float(rules.get("reviewer_timeout_s") or 0) if rules.get("reviewer") else 0)
    return steps.REVIEW.run(
        ctx,
        out=f"{prefix}review.json",
        inputs=[*cand_files, *info.baseline, info.spec_file, rules_file, check, *extra],
        mnemonic="Review",
        platform=platform,
        timeout_s=timeout,
        task=info.task_dir,
        candidate=cand_dir,
        baseline=info.baseline_dir,
        spec=info.spec_file.path,
        rules=rules_file.path,
        check=check.path,
    )
