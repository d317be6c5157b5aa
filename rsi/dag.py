"""Plain adjacency-list DAG helpers for analysis: a deterministic topological order and a cycle to
show when there is none. networkx (imported for `rsi query` and `rsi graph`) costs ~0.15 s to
import, more than analysing a campaign, so the build path does without it. It must never depend on
anything but the standard library."""

from __future__ import annotations

import heapq
from typing import Callable, Hashable, Iterable, Mapping, TypeVar

N = TypeVar("N", bound=Hashable)


class Cycle(Exception):
    """The graph has a cycle: `edges` is one, as (u, v) pairs along the edge direction."""

    def __init__(self, edges: list[tuple]) -> None:
        super().__init__(" -> ".join(str(u) for u, _ in edges))
        self.edges = edges


def topological_order(
    nodes: Iterable[N], succs: Mapping[N, Iterable[N]], key: Callable[[N], object] = str
) -> list[N]:
    """Every node after its predecessors; among the ready ones the least `key` first (the
    same order as networkx's lexicographical_topological_sort). Raises Cycle."""
    nodes = list(dict.fromkeys(nodes))
    indegree = dict.fromkeys(nodes, 0)
    for u in nodes:
        for v in succs.get(u, ()):
            indegree[v] += 1
    ready = [(key(n), i, n) for i, n in enumerate(nodes) if indegree[n] == 0]
    heapq.heapify(ready)
    order: list[N] = []
    tiebreak = len(nodes)
    while ready:
        _, _, u = heapq.heappop(ready)
        order.append(u)
        for v in succs.get(u, ()):
            indegree[v] -= 1
            if indegree[v] == 0:
                tiebreak += 1
                heapq.heappush(ready, (key(v), tiebreak, v))
    if len(order) < len(nodes):
        raise Cycle(find_cycle([n for n in nodes if indegree[n] > 0], succs))
    return order


def find_cycle(nodes: Iterable[N], succs: Mapping[N, Iterable[N]]) -> list[tuple[N, N]]:
    """One cycle among `nodes` (each of which lies on or leads into a cycle), as edges."""
    nodes = list(nodes)
    within = set(nodes)
    # NB: iterative DFS with colours; a grey successor closes a cycle on the current path
    colour: dict[N, int] = {}
    for start in nodes:
        if start in colour:
            continue
        path: list[N] = [start]
        iters = [iter(succs.get(start, ()))]
        colour[start] = 1
        while path:
            for v in iters[-1]:
                if v not in within:
                    continue
                if colour.get(v) == 1:
                    ring = path[path.index(v) :]
                    return list(zip(ring, ring[1:] + ring[:1], strict=True))
                if v not in colour:
                    colour[v] = 1
                    path.append(v)
                    iters.append(iter(succs.get(v, ())))
                    break
            else:
                colour[path.pop()] = 2
                iters.pop()
    return []
