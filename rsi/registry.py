"""Finding rule families: the `rsi.rules` entry point group, plus modules a workspace names.

Each entry point is a callable returning a list of `Rule`s. The engine imports rule code only
through here, so it never depends on a particular family.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import Iterable

from rsi.errors import DeclarationError
from rsi.rule import Rule

ENTRY_POINT_GROUP = "rsi.rules"


def _load(ref: str) -> list[Rule]:
    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise DeclarationError(f"cannot import rule module {module_name!r}: {exc}",
                               file="rsi.toml", field="rules") from None
    factory = getattr(module, attr or "rules", None)
    if factory is None:
        raise DeclarationError(f"{module_name} has no {attr or 'rules'}", file="rsi.toml",
                               field="rules")
    found = factory() if callable(factory) else factory
    return list(found)


def load_rules(extra: Iterable[str] = ()) -> dict[str, Rule]:
    rules: dict[str, Rule] = {}
    sources = [ep.value for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)]
    for ref in [*sources, *extra]:
        for rule in _load(ref):
            if rule.name in rules and rules[rule.name] is not rule:
                raise DeclarationError(f"rule {rule.name!r} is registered twice ({ref})")
            rules[rule.name] = rule
    return rules
