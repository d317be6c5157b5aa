"""A sealed file (the build state, a cached analysis) is read in parts, never held whole: what is
unpickled is only ever what its seal vouches for, checked before it is unpickled and again as
it is, so a file altered in place in between is no memo, never a wrong one."""

from __future__ import annotations

import pickle

import pytest

from rsi import analysis_cache
from rsi.analysis_cache import read_sealed_head, write_sealed
from rsi.store import LocalStore

pytestmark = pytest.mark.fast

VALUE = {
    "sources": {f"in/leaf_{i}.txt": [i, "ab" * 32] for i in range(3000)},
    "big": b"x" * 3_000_000,
}


def _sealed(tmp_path):
    store = LocalStore(tmp_path / "store")
    path = tmp_path / "state"
    seal = write_sealed(store, path, VALUE)
    assert seal is not None
    return store, path, seal


def test_a_sealed_file_reads_back_under_its_seal(tmp_path):
    store, path, seal = _sealed(tmp_path)
    assert read_sealed_head(store, path) == (seal, VALUE)


def test_a_flipped_byte_or_a_cut_file_is_no_memo(tmp_path):
    store, path, _ = _sealed(tmp_path)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 1
    path.write_bytes(bytes(raw))
    assert read_sealed_head(store, path) == (None, None)
    store, path, _ = _sealed(tmp_path)
    path.write_bytes(path.read_bytes()[:-10])
    assert read_sealed_head(store, path) == (None, None)
    path.write_bytes(b"")
    assert read_sealed_head(store, path) == (None, None)


def test_a_file_altered_in_place_while_it_is_unpickled_is_no_memo(tmp_path, monkeypatch):
    """The first pass finds the seal right; before the second (the unpickling) another writer
    puts a different pickle of the same length in place: that object must not come back."""
    store, path, seal = _sealed(tmp_path)
    other = dict(VALUE, big=b"y" * 3_000_000)
    raw = path.read_bytes()
    forged = raw[: raw.index(b"\n") + 1] + pickle.dumps(other, protocol=pickle.HIGHEST_PROTOCOL)
    assert len(forged) == len(raw) and forged != raw
    real_load = pickle.load

    def load_after_a_write(f):
        with open(path, "r+b") as w:  # NB: in place, same inode, as a stray writer would
            w.write(forged)
        return real_load(f)

    monkeypatch.setattr(analysis_cache.pickle, "load", load_after_a_write)
    assert read_sealed_head(store, path) == (None, None)
