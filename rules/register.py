"""The one place every rule family registers (entry point `rsi.rules`)."""

from __future__ import annotations

from rsi.rule import Rule


def rules() -> list[Rule]:
    from rules import command

    found: list[Rule] = [*command.RULES]
    try:
        from rules import domain
    except ImportError:  # NB: the domain family is optional until its module lands
        return found
    return found + list(domain.RULES)
