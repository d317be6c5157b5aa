"""A sealed file (the build state, a cached analysis) is read in parts, never held whole: what is
unpickled is only ever what its seal vouches for. A sectioned file (rsi.sections) has its
payload read once, checked, and unpickled from memory; a file of the older layout (a seal and
one pickle) is checked before it is unpickled and again as it is. So a file altered in place
meanwhile is no memo, or the one sealed, never a wrong one."""

from __future__ import annotations

import pickle

import pytest

from rsi import analysis_cache
from rsi.analysis_cache import read_sealed_head, write_sealed
from rsi.digest import digest_bytes
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


def _sealed_older(tmp_path):
    """The older layout, as an rsi before sections wrote it: the payload's digest, a pickle."""
    store = LocalStore(tmp_path / "store")
    path = tmp_path / "state"
    payload = pickle.dumps(VALUE, protocol=pickle.HIGHEST_PROTOCOL)
    seal = digest_bytes(payload, store.function).hash
    path.write_bytes(seal.encode() + b"\n" + payload)
    return store, path, seal


def test_a_file_of_the_older_layout_reads_back(tmp_path):
    store, path, seal = _sealed_older(tmp_path)
    assert read_sealed_head(store, path) == (seal, VALUE)


def test_a_sectioned_file_altered_in_place_before_it_is_unpickled_is_what_was_sealed(
    tmp_path, monkeypatch
):
    """The payload, checked, is unpickled from memory: another writer putting a different
    pickle in place meanwhile changes nothing of what comes back."""
    from rsi import sections

    store, path, seal = _sealed(tmp_path)
    raw = path.read_bytes()
    real = sections.io.BytesIO

    def after_a_write(data=b""):
        with open(path, "r+b") as w:  # NB: in place, same inode, as a stray writer would
            w.write(raw.replace(b"x" * 1000, b"y" * 1000))
        return real(data)

    monkeypatch.setattr(sections.io, "BytesIO", after_a_write)
    assert read_sealed_head(store, path) == (seal, VALUE)
    assert path.read_bytes() != raw


def test_a_file_altered_in_place_while_it_is_unpickled_is_no_memo(tmp_path, monkeypatch):
    """The older layout: the first pass finds the seal right; before the second (the
    unpickling) another writer puts a different pickle of the same length in place: that
    object must not come back."""
    store, path, seal = _sealed_older(tmp_path)
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
