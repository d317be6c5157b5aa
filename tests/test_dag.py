"""rsi/dag.py against networkx on random graphs: the same order, and a real cycle when any."""

from __future__ import annotations

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsi.dag import Cycle, find_cycle, topological_order

edges_st = st.lists(st.tuples(st.integers(0, 14), st.integers(0, 14)), max_size=40)


@pytest.mark.fast
@settings(max_examples=300, deadline=None)
@given(edges_st, st.integers(1, 15))
def test_order_is_networkx_lexicographic_order_or_a_cycle(edges, n):
    nodes = [f"n{i:02}" for i in range(n)]
    edges = [(f"n{u:02}", f"n{v:02}") for u, v in edges if u < n and v < n]
    g = nx.DiGraph()
    g.add_nodes_from(nodes)
    g.add_edges_from(edges)
    succs = {u: list(g.successors(u)) for u in g}
    if nx.is_directed_acyclic_graph(g):
        assert topological_order(nodes, succs) == list(
            nx.lexicographical_topological_sort(g, key=str)
        )
    else:
        with pytest.raises(Cycle) as err:
            topological_order(nodes, succs)
        ring = err.value.edges
        assert ring and all(g.has_edge(u, v) for u, v in ring)
        assert all(ring[i][1] == ring[(i + 1) % len(ring)][0] for i in range(len(ring)))


@pytest.mark.fast
def test_self_loop_and_no_cycle():
    assert find_cycle(["a"], {"a": ["a"]}) == [("a", "a")]
    assert find_cycle(["a", "b"], {"a": ["b"]}) == []
    with pytest.raises(Cycle, match="a -> b"):
        topological_order(["a", "b", "c"], {"a": ["b"], "b": ["a"], "c": []})
