"""The declaration reference in docs/ is generated from the rule registry and must be current."""

from __future__ import annotations

from pathlib import Path

import pytest

from rsi.registry import describe_rules, load_rules, rules_markdown

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent


def test_declaration_reference_lists_every_rule_and_attribute() -> None:
    text = (ROOT / "docs" / "declarations.md").read_text()
    head = (ROOT / "docs" / "declarations.head.md").read_text()
    want = head + rules_markdown(describe_rules(load_rules()))
    assert text == want, "docs/declarations.md is stale: run scripts/gen-docs.sh"


def test_every_attribute_has_a_kind_and_every_rule_a_doc() -> None:
    for rule in describe_rules(load_rules()):
        assert rule["doc"], rule["name"]
        for attr in rule["attrs"]:
            assert attr["kind"], (rule["name"], attr["name"])
