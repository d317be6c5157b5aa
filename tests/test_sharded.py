"""Mappings pickled in shards (rsi/sharded.py): equal to what was packed, in the same order,
and a read of one key unpickles the one shard that holds it; a pickled graph's edges are kept
so (a one-change build reads its dirty actions' edges, not all 100,000)."""

from __future__ import annotations

import pickle

import pytest

from rsi.label import Label
from rsi.sharded import SHARDS, Sharded, shard_of

pytestmark = pytest.mark.fast


def _loaded(sharded: Sharded) -> int:
    return sum(1 for part in sharded._shards if not isinstance(part, bytes))


def test_a_sharded_mapping_equals_what_was_packed_in_the_same_order():
    values = {f"//pkg:t{i}#Command": [f"//pkg:d{i}#Command"] for i in range(2000, 0, -1)}
    again = pickle.loads(pickle.dumps(Sharded.pack(values), pickle.HIGHEST_PROTOCOL))
    assert len(again) == len(values) and _loaded(again) == 0
    key = "//pkg:t7#Command"
    assert again[key] == values[key] and again.get(key) == values[key]
    assert _loaded(again) == 1  # NB: the one shard holding the key, not all
    assert again.get("missing", ()) == () and "missing" not in again
    with pytest.raises(KeyError):
        again["missing"]
    assert list(again) == list(values)  # NB: the packed order, whatever the shards
    assert dict(again.items()) == values
    twice = pickle.loads(pickle.dumps(again, pickle.HIGHEST_PROTOCOL))
    assert list(twice.items()) == list(values.items())


def test_the_shard_of_a_label_is_the_shard_of_its_text():
    assert shard_of(Label("a/b", "c")) == shard_of("//a/b:c")
    assert all(0 <= shard_of(f"k{i}") < SHARDS for i in range(100))


def test_a_pickled_graph_reads_only_the_shards_of_the_edges_asked_for(
    tmp_path, make_workspace, command
):
    from test_analysis_cache import _graph

    labels, graph = _graph(tmp_path, make_workspace, command)
    again = pickle.loads(pickle.dumps(graph, pickle.HIGHEST_PROTOCOL))
    top = next(a for a in graph.actions if a.startswith("//:top"))
    assert isinstance(again.preds, Sharded) and isinstance(again.succs, Sharded)
    assert again.preds[top] == graph.preds[top]
    assert _loaded(again.preds) == 1 and _loaded(again.succs) == 0
    assert again.descendants(graph.preds[top][0], set(graph.actions)) == {top}
    assert dict(again.preds.items()) == graph.preds and dict(again.succs.items()) == graph.succs
    assert again.actions_for(labels) == graph.actions_for(labels)


def test_deferred_entries_replace_theirs_when_their_shard_loads_and_survive_a_pickle():
    from rsi.sharded import ShardedDict

    values = {f"a{i}": [i] for i in range(500)}
    again = pickle.loads(pickle.dumps(ShardedDict.pack(values), pickle.HIGHEST_PROTOCOL))
    again.defer({"a7": [70], "a9": [90]})
    assert _loaded(again) == 0 and again.peek("a7") == [70] and _loaded(again) == 0
    assert again["a7"] == [70] and _loaded(again) == 1
    again["a8"] = [80]
    twice = pickle.loads(pickle.dumps(again, pickle.HIGHEST_PROTOCOL))
    assert twice["a9"] == [90] and twice["a8"] == [80] and twice["a1"] == [1]
    assert list(twice) == list(values) and len(twice) == len(values)


def test_an_unordered_sharded_dict_takes_new_keys_without_an_order():
    """Its walks go shard by shard; new keys, set or deferred then loaded, count once and are
    walked; a pickle keeps them; a value of None is a value."""
    from rsi.sharded import UnorderedShardedDict

    values = {f"h{i}": (i, None) for i in range(600)}
    again = pickle.loads(pickle.dumps(UnorderedShardedDict.pack(values), pickle.HIGHEST_PROTOCOL))
    assert type(again) is UnorderedShardedDict and _loaded(again) == 0
    again["new1"] = None
    assert _loaded(again) == 1 and len(again) == 601 and again.peek("new1", 0) is None
    again["h3"] = (3, 3)
    assert len(again) == 601
    twice = pickle.loads(pickle.dumps(again, pickle.HIGHEST_PROTOCOL))
    want = {**values, "new1": None, "h3": (3, 3)}
    assert len(twice) == len(want) and dict(twice.items()) == want and set(twice) == set(want)
    assert dict(twice.shard_items()) == want


def test_an_entry_sharded_dict_unpickles_only_the_entries_read():
    from rsi.sharded import EntryShardedDict

    values = {f"//:a{i}#Command": ["label", i, ("out", "ab" * 32, i)] for i in range(3000)}
    packed = pickle.loads(pickle.dumps(EntryShardedDict.pack(values), pickle.HIGHEST_PROTOCOL))
    assert list(packed) == list(values) and len(packed) == len(values)
    key = "//:a17#Command"
    entry = packed[key]
    assert entry == values[key]
    part = packed._shards[shard_of(key)]
    # NB: the shard holds its other entries still pickled: only the one read was unpickled
    assert sum(1 for v in part.values() if type(v) is not bytes) == 1
    assert packed.get("missing") is None and packed.get(key) is entry
    # NB: an entry changed in place after it was read is what pickles again
    entry[1] = -1
    packed.defer({"//:a18#Command": ["deferred"]})
    assert packed.peek("//:a18#Command") == ["deferred"]
    again = pickle.loads(pickle.dumps(packed, pickle.HIGHEST_PROTOCOL))
    assert again[key][1] == -1 and again["//:a18#Command"] == ["deferred"]
    walked = dict(again.shard_items())
    assert len(walked) == 3000 and walked["//:a5#Command"] == values["//:a5#Command"]
    assert all(type(v) is not bytes for v in walked.values())


def test_pick_gives_the_held_keys_with_their_values_deferred_ones_included():
    from rsi.sharded import ShardedDict

    values = {f"b{i}": (i, None if i % 3 else i) for i in range(600)}
    again = pickle.loads(pickle.dumps(ShardedDict.pack(values), pickle.HIGHEST_PROTOCOL))
    again.defer({"b5": (50, 50), "new": (1, 1)})
    asked = ["b1", "b3", "nope", "b5", "new", "b599", "b600"]
    # NB: a value of None is held (a blob's signature too recent to trust), not "absent"
    assert again.pick(asked) == [
        ("b1", (1, None)),
        ("b3", (3, 3)),
        ("b5", (50, 50)),
        ("new", (1, 1)),
        ("b599", (599, None)),
    ]
    assert again.pick([]) == [] and Sharded.pack({"x": None}).pick(["x", "y"]) == [("x", None)]


def test_pick_of_an_entry_sharded_dict_gives_entries_not_their_pickles():
    from rsi.sharded import EntryShardedDict

    values = {f"//:a{i}#X": [f"//:a{i}", "X", i] for i in range(300)}
    again = pickle.loads(pickle.dumps(EntryShardedDict.pack(values), pickle.HIGHEST_PROTOCOL))
    got = again.pick(["//:a3#X", "//:nope#X", "//:a299#X"])
    assert got == [("//:a3#X", ["//:a3", "X", 3]), ("//:a299#X", ["//:a299", "X", 299])]
    assert again.pick(["//:a3#X"]) == [("//:a3#X", again["//:a3#X"])]
