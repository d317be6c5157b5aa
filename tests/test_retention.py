"""What the store keeps of its speed-ups and logs stays bounded: analysis entries, incremental
states and build event logs are pruned to the most recently used few (and a byte budget),
never the one just written; the cache proper (cas/, ac/) is `rsi cache gc`'s alone."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest

from rsi import analysis_cache, fsutil
from rsi.build_housekeeping import prune_event_logs


def _files(folder, names_sizes, start_ns=1_000_000_000_000_000_000):
    folder.mkdir(parents=True, exist_ok=True)
    for i, (name, size) in enumerate(names_sizes):
        path = folder / name
        path.write_bytes(b"x" * size)
        t = start_ns + i * 1_000_000_000  # NB: in order: the last is the most recent
        os.utime(path, ns=(t, t))


@pytest.mark.fast
def test_prune_keeps_the_most_recently_used_and_never_the_one_just_written(tmp_path):
    folder = tmp_path / "analysis"
    _files(folder, [(f"a{i}", 10) for i in range(6)] + [("state-x", 10), ("a9.tmp-1", 10)])
    fsutil.touch(folder / "a0")  # NB: used just now: the newest
    removed = fsutil.prune(
        folder, keep=3, keep_bytes=1 << 20, match=lambda n: not n.startswith("state-"), spare="a1"
    )
    left = sorted(p.name for p in folder.iterdir())
    # NB: a1 is spared although old; a0 was touched; a5, a4 are the newest; states and
    # another writer's temp file are not this call's to remove
    assert sorted(removed) == ["a2", "a3"], removed
    assert left == ["a0", "a1", "a4", "a5", "a9.tmp-1", "state-x"], left


@pytest.mark.fast
def test_prune_respects_the_byte_budget(tmp_path):
    folder = tmp_path / "analysis"
    _files(folder, [("old", 600), ("mid", 600), ("new", 600)])
    fsutil.prune(folder, keep=10, keep_bytes=1000, match=lambda n: True, spare="new")
    assert sorted(p.name for p in folder.iterdir()) == ["new"]


@pytest.mark.fast
def test_a_store_keeps_a_bounded_number_of_analyses_and_event_logs(tmp_path, monkeypatch):
    from rsi.store import LocalStore

    store = LocalStore(tmp_path / "store")
    monkeypatch.setattr(analysis_cache, "KEEP_ANALYSES", 2)
    for i in range(5):
        analysis_cache.save(store, f"key{i}", [], {"n": i}, tracker=None)
        t = 1_000_000_000_000_000_000 + i * 1_000_000_000
        os.utime(store.root / "analysis" / f"key{i}", ns=(t, t))
    left = sorted(p.name for p in (store.root / "analysis").iterdir())
    assert left == ["key3", "key4"], left
    # NB: reading an entry marks it used: it outlives a newer one that was not read
    fsutil.touch(store.root / "analysis" / "key3")
    analysis_cache.save(store, "key5", [], {"n": 5}, tracker=None)
    assert sorted(p.name for p in (store.root / "analysis").iterdir()) == ["key3", "key5"]

    monkeypatch.setattr("rsi.build_housekeeping.KEEP_EVENT_LOGS", 3)
    _files(store.events_dir, [(f"b{i}.jsonl", 5) for i in range(6)] + [("notes.txt", 5)])
    prune_event_logs(SimpleNamespace(events_dir=store.events_dir), "b0.jsonl")
    left = sorted(p.name for p in store.events_dir.iterdir())
    # NB: the current log is kept beside the newest three
    assert left == ["b0.jsonl", "b3.jsonl", "b4.jsonl", "b5.jsonl", "notes.txt"], left


@pytest.mark.fast
def test_a_state_s_delta_is_no_analysis_and_goes_with_its_state(tmp_path, monkeypatch):
    """`delta-<request>` and `outs-<request>` (rsi/incremental.py) beside `state-<request>`:
    pruning analyses neither counts nor removes them; pruning states removes a state's delta
    and its outputs' sidecar with it."""
    from rsi import incremental
    from rsi.store import LocalStore

    store = LocalStore(tmp_path / "store")
    folder = store.root / "analysis"
    monkeypatch.setattr(analysis_cache, "KEEP_ANALYSES", 1)
    monkeypatch.setattr(analysis_cache, "KEEP_STATES", 1)
    _files(folder, [("delta-r0", 5), ("delta-r1", 5), ("outs-r1", 5)])
    analysis_cache.save(store, "key0", [], {"n": 0}, tracker=None)
    assert sorted(p.name for p in folder.iterdir()) == ["delta-r0", "delta-r1", "key0", "outs-r1"]
    state = {"request": "r0", "actions": {}, "blobs": {}}
    assert incremental.save(store, state) is not None
    assert not (folder / "delta-r0").exists()  # NB: folded into the state just written
    assert (folder / "outs-r0").exists() and state["outs_seal"]
    t = 1_000_000_000_000_000_000
    os.utime(folder / "state-r0", ns=(t, t))
    (folder / "delta-r0").write_bytes(b"x")  # NB: as a later build of r0 would leave it
    incremental.save(store, {"request": "r1", "actions": {}, "blobs": {}})
    assert sorted(p.name for p in folder.iterdir()) == ["key0", "outs-r1", "state-r1"]


@pytest.mark.fast
def test_an_orphaned_delta_or_sidecar_goes_once_it_is_old(tmp_path):
    """`delta-<request>` or `outs-<request>` with no `state-<request>` beside it (an older rsi
    pruned the state; a build died between the two writes) is removed once an hour old; one
    with its state, or younger (another build may be about to write its state), stays."""
    from rsi import incremental

    folder = tmp_path / "analysis"
    names = ("state-a", "outs-a", "delta-a", "outs-b", "delta-c", "outs-d", "key0")
    _files(folder, [(n, 5) for n in names])  # NB: all of them years old
    young = time.time() - incremental.ORPHAN_AGE_S / 2
    os.utime(folder / "outs-d", (young, young))
    incremental._drop_orphans(folder)
    assert sorted(p.name for p in folder.iterdir()) == [
        "delta-a",
        "key0",
        "outs-a",
        "outs-d",
        "state-a",
    ]
