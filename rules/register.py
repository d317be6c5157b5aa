"""The one place every rule family registers (entry point `rsi.rules`)."""

from __future__ import annotations

from rsi.rule import Rule


def rules() -> list[Rule]:
    from rules import campaign, command, domain, toolchain

    return [*command.RULES, *domain.RULES, *toolchain.RULES, *campaign.RULES]
