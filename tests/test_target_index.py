"""The target index ("why" and `rsi cache`): sharded by action id, so a build reads and
rewrites only the shards of the actions it recorded; an older store's one-file index is read
beneath the shards and folded into them at the first write; gc replaces it whole."""

from __future__ import annotations

import json

import pytest

from rsi.store import LazyIndex, LocalStore


def _entry(n: int) -> dict:
    return {"key": f"{n:064x}/1", "pack": None, "attrs": None, "label": f"//:t{n}", "time": 0.0}


@pytest.mark.fast
def test_saving_a_few_entries_rewrites_only_their_shards(tmp_path):
    store = LocalStore(tmp_path / "store")
    store.save_target_index({f"//:t{n}#Command": _entry(n) for n in range(2000)})
    shards = {p.name: p.stat().st_mtime_ns for p in (store.targets / "index").iterdir()}
    assert len(shards) > 200  # NB: 2,000 ids over 256 shards
    assert len(store.load_target_index()) == 2000

    before = {p.name: p.read_bytes() for p in (store.targets / "index").iterdir()}
    store.save_target_index({"//:t7#Command": _entry(99)})
    after = {p.name: p.read_bytes() for p in (store.targets / "index").iterdir()}
    changed = [n for n in after if after[n] != before.get(n)]
    assert changed == [f"{store.index_shard('//:t7#Command')}.json"], changed
    assert store.load_target_index()["//:t7#Command"]["key"] == _entry(99)["key"]
    assert store.index_signature() is not None


@pytest.mark.fast
def test_a_lazy_index_reads_only_the_shards_it_is_asked_for(tmp_path, monkeypatch):
    store = LocalStore(tmp_path / "store")
    store.save_target_index({f"//:t{n}#Command": _entry(n) for n in range(500)})
    read = []
    real = store.load_index_shard
    monkeypatch.setattr(store, "load_index_shard", lambda s: read.append(s) or real(s))
    index = LazyIndex(store)
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
    assert store.load_target_index() == legacy
    assert LazyIndex(store).get("//:old3#Command") == legacy["//:old3#Command"]
    store.save_target_index({"//:new#Command": _entry(7)})
    assert not (store.targets / "index.json").exists()
    assert store.load_target_index() == {**legacy, "//:new#Command": _entry(7)}


@pytest.mark.fast
def test_gc_replaces_the_whole_index_and_drops_emptied_shards(tmp_path):
    store = LocalStore(tmp_path / "store")
    store.save_target_index({f"//:t{n}#Command": _entry(n) for n in range(300)})
    keep = {"//:t1#Command": _entry(1), "//:t2#Command": _entry(2)}
    store.write_target_index(keep)
    assert store.load_target_index() == keep
    assert len(list((store.targets / "index").iterdir())) <= 2
