"""The one place every rule family registers (entry point `rsi.rules`). It must never hold a rule
itself."""

from __future__ import annotations

from rsi.rule import Rule


def rules() -> list[Rule]:
    from rules import campaign, command, domain, toolchain

    return [*command.RULES, *domain.RULES, *toolchain.RULES, *campaign.RULES]


def host_imports() -> list[tuple[str, ...]]:
    """What this family's host-python actions import, one module set per identity they carry
    (entry point `rsi.host_imports`): a remote worker advertises each (rsi/worker.py)."""
    from rules.step_imports import JUDGE_STEPS, step_imports

    return [step_imports(*JUDGE_STEPS), step_imports("dashboard"), step_imports("preflight")]
