"""`rsi query`: a small language over the target graph. It must never run an action.

    EXPR := PATTERN | deps(EXPR) | rdeps(EXPR) | kind(RULE, EXPR)

`deps` is the transitive dependencies (and the targets themselves), `rdeps` the transitive
dependents within the whole workspace (`//...`), `kind` filters by rule name (a substring).
"""

from __future__ import annotations

import re

import networkx as nx

from rsi.analysis import find_targets
from rsi.errors import UsageError
from rsi.label import Label
from rsi.loader import Loader

_CALL = re.compile(r"^\s*(deps|rdeps|kind)\s*\((.*)\)\s*$", re.S)


def _split_args(text: str) -> list[str]:
    depth, cur, out = 0, "", []
    for ch in text:
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        cur += ch
    out.append(cur.strip())
    return out


def evaluate(loader: Loader, expr: str, current: str = "") -> list[Label]:
    m = _CALL.match(expr)
    if not m:
        if "(" in expr or ")" in expr:
            raise UsageError(
                f"cannot parse query {expr!r}",
                hint="use PATTERN, deps(EXPR), rdeps(EXPR) or kind(RULE, EXPR)",
            )
        return loader.expand(expr.split(), current)
    fn, body = m.group(1), m.group(2)
    args = _split_args(body)
    if fn == "kind":
        if len(args) != 2:
            raise UsageError("kind takes two arguments: kind(RULE, EXPR)")
        rule = args[0].strip("'\"")
        return [
            lb for lb in evaluate(loader, args[1], current) if rule in loader.target(lb).rule.name
        ]
    if len(args) != 1:
        raise UsageError(f"{fn} takes one argument")
    inner = evaluate(loader, args[0], current)
    if fn == "deps":
        graph = find_targets(loader, inner)[1].to_nx()
        found = set(inner)
        for lb in inner:
            found |= nx.ancestors(graph, lb)
        return sorted(found, key=str)
    universe = loader.expand(["//..."])
    graph = find_targets(loader, universe)[1].to_nx()
    found = set(inner)
    for lb in inner:
        if lb in graph:
            found |= nx.descendants(graph, lb)
    return sorted(found, key=str)
