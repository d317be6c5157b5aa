"""Analysis: targets become actions. The target graph and the action graph are networkx DAGs.

Rules run here, in dependency order, each seeing only its attributes and its dependencies'
providers. Nothing is executed and no file content is read except through digests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import networkx as nx

from rsi.digest import Digest, digest_value
from rsi.errors import DeclarationError
from rsi.label import Label
from rsi.loader import Loader, Target
from rsi.rule import ActionSpec, Provider, RuleContext


@dataclass
class BuildGraph:
    targets: dict[Label, Target] = field(default_factory=dict)
    providers: dict[Label, Provider] = field(default_factory=dict)
    target_actions: dict[Label, list[str]] = field(default_factory=dict)
    actions: dict[str, ActionSpec] = field(default_factory=dict)
    target_graph: nx.DiGraph = field(default_factory=nx.DiGraph)  # edge: dep -> dependent
    action_graph: nx.DiGraph = field(default_factory=nx.DiGraph)  # edge: producer -> consumer

    def actions_for(self, labels: Iterable[Label]) -> set[str]:
        """Every action needed to produce these targets' files (their producers, transitively)."""
        wanted: set[str] = set()
        for label in labels:
            ids = self.target_actions.get(label, [])
            for a in ids:
                wanted.add(a)
                wanted |= nx.ancestors(self.action_graph, a)
            for art in self.providers[label].all_files:
                if art.producer:
                    wanted.add(art.producer)
                    wanted |= nx.ancestors(self.action_graph, art.producer)
        return wanted


def _find_cycle(loader: Loader, roots: list[Label]) -> tuple[dict[Label, Target], nx.DiGraph]:
    graph = nx.DiGraph()
    targets: dict[Label, Target] = {}
    stack: list[Label] = list(roots)
    for label in roots:
        targets[label] = loader.target(label)
        graph.add_node(label)
    while stack:
        label = stack.pop()
        target = targets[label]
        for name, a in target.rule.attrs.items():
            if not a.is_dependency:
                continue
            value = target.attrs.get(name)
            deps = [value] if a.kind == "label" and value is not None else list(value or ())
            for dep in deps:
                if dep not in targets:
                    targets[dep] = loader.target(dep, wanted_by=target, field=name)
                    stack.append(dep)
                graph.add_edge(dep, label, field=name)
    if not nx.is_directed_acyclic_graph(graph):
        cycle = nx.find_cycle(graph)
        chain = [str(cycle[0][1])] + [str(v) for _, v in cycle[1:]] + [str(cycle[0][1])]
        first = targets[cycle[0][1]]
        raise DeclarationError(
            "dependency cycle: " + " -> ".join(chain), file=first.file, target=str(first.label),
            field=graph.edges[cycle[0]]["field"] if "field" in graph.edges[cycle[0]] else None,
            hint="break the cycle by removing one of these dependencies",
        )
    return targets, graph


def analyze(
    loader: Loader,
    roots: list[Label],
    *,
    store_put: Callable[[bytes], Digest],
    settings: Mapping[str, Any],
) -> BuildGraph:
    targets, target_graph = _find_cycle(loader, roots)
    bg = BuildGraph(targets=targets, target_graph=target_graph)
    for label in nx.lexicographical_topological_sort(target_graph, key=str):
        target = targets[label]
        deps = {d: bg.providers[d] for d in target_graph.predecessors(label)}
        ctx = RuleContext(
            label=label, rule=target.rule, attrs=target.attrs, workspace_root=loader.root,
            build_file=target.file, deps=deps, store_put=store_put, settings=settings,
        )
        provider = target.rule.impl(ctx)
        if not isinstance(provider, Provider):
            raise DeclarationError(f"rule {target.rule.name} returned {type(provider).__name__}, "
                                   "not a Provider", file=target.file, target=str(label))
        attrs_digest = digest_value(_jsonable(target.attrs)).hash
        ids = []
        for spec in ctx.actions:
            object.__setattr__(spec, "attrs_digest", attrs_digest)
            bg.actions[spec.id] = spec
            bg.action_graph.add_node(spec.id)
            ids.append(spec.id)
        bg.target_actions[label] = ids
        bg.providers[label] = provider
    producers: dict[str, str] = {}
    for spec in bg.actions.values():
        for path in spec.outputs:
            other = producers.setdefault(path, spec.label)
            if other != spec.label:
                t = targets[Label.parse(spec.label)]
                raise DeclarationError(
                    f"output {path} is also declared by {other}", file=t.file, target=spec.label,
                    field="outs", hint="every output path must belong to one target",
                )
    for spec in bg.actions.values():
        for art in spec.inputs:
            if art.producer:
                if art.producer not in bg.actions:
                    raise DeclarationError(f"{spec.label}: input {art.path} has unknown producer")
                bg.action_graph.add_edge(art.producer, spec.id)
    return bg


def _jsonable(value: Any) -> Any:
    if isinstance(value, Label):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value
