"""The target index ("why" and `rsi cache`): sharded by action id, so a build reads and
rewrites only the shards of the actions it recorded; an older store's one-file index is read
beneath the shards and folded into them at the first write; gc replaces it whole."""

from __future__ import annotations

import json

import pytest

from rsi.store import LocalStore
from rsi.store_index import LazyIndex


def _entry(n: int) -> dict:
    return {"key": f"{n:064x}/1", "pack": None, "attrs": None, "label": f"//:t{n}", "time": 0.0}


@pytest.mark.fast
def test_saving_a_few_entries_rewrites_only_their_shards(tmp_path):
    store = LocalStore(tmp_path / "store")
    store.target_index.save({f"//:t{n}#Command": _entry(n) for n in range(2000)})
    shards = {p.name: p.stat().st_mtime_ns for p in (store.targets / "index").iterdir()}
    assert len(shards) > 200  # NB: 2,000 ids over 256 shards
    assert len(store.target_index.load_all()) == 2000

    before = {p.name: p.read_bytes() for p in (store.targets / "index").iterdir()}
    store.target_index.save({"//:t7#Command": _entry(99)})
    after = {p.name: p.read_bytes() for p in (store.targets / "index").iterdir()}
    changed = [n for n in after if after[n] != before.get(n)]
    assert changed == [f"{store.target_index.shard_of('//:t7#Command')}.json"], changed
    assert store.target_index.load_all()["//:t7#Command"]["key"] == _entry(99)["key"]
    assert store.target_index.signature() is not None


@pytest.mark.fast
def test_a_lazy_index_reads_only_the_shards_it_is_asked_for(tmp_path, monkeypatch):
    store = LocalStore(tmp_path / "store")
    store.target_index.save({f"//:t{n}#Command": _entry(n) for n in range(500)})
    read = []
    real = store.target_index.load_shard
    monkeypatch.setattr(store.target_index, "load_shard", lambda s: read.append(s) or real(s))
    index = LazyIndex(store.target_index)
    assert index.get("//:t3#Command")["label"] == "//:t3"
    assert index.get("//:nothing#Command") is None
    index["//:new#Command"] = _entry(1)
    assert index.get("//:new#Command")["label"] == "//:t1"
    assert len(read) <= 3 and len(set(read)) == len(read), read


@pytest.mark.fast
def test_an_older_one_file_index_is_read_then_folded_into_shards(tmp_path):
    store = LocalStore(tmp_path / "store")
    legacy = {f"//:old{n}#Command": _entry(n) for n in range(50)}
    (store.targets / "index.json").write_text(json.dumps(legacy))
    assert store.target_index.load_all() == legacy
    assert LazyIndex(store.target_index).get("//:old3#Command") == legacy["//:old3#Command"]
    store.target_index.save({"//:new#Command": _entry(7)})
    assert not (store.targets / "index.json").exists()
    assert store.target_index.load_all() == {**legacy, "//:new#Command": _entry(7)}


@pytest.mark.fast
def test_gc_replaces_the_whole_index_and_drops_emptied_shards(tmp_path):
    store = LocalStore(tmp_path / "store")
    store.target_index.save({f"//:t{n}#Command": _entry(n) for n in range(300)})
    keep = {"//:t1#Command": _entry(1), "//:t2#Command": _entry(2)}
    store.target_index.replace_all(keep)
    assert store.target_index.load_all() == keep
    assert len(list((store.targets / "index").iterdir())) <= 2
