"""Every identity covers what it claims: an analysis kept in memory (the build server) is served
only while its entry's file is the same content, not merely the same inode and size (a file
system reuses inodes); the build server's check of its own code sees a same-size rewrite whose
mtime was put back (ctime). Real files, rewritten in place."""

from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path

import pytest

from rsi import analysis_cache, server
from rsi.analysis_cache import Tracker, write_sealed
from rsi.store import LocalStore

pytestmark = pytest.mark.fast


def _rewrite_in_place_keeping_mtime(path: Path, data: bytes) -> None:
    """Same inode, same size, mtime put back: what inode reuse or a careful edit looks like."""
    st = os.stat(path)
    assert len(data) == st.st_size
    time.sleep(0.02)  # NB: the next clock tick, so the rewrite's ctime is a new one
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        st.st_ino,
        st.st_size,
        st.st_mtime_ns,
    )


def test_a_kept_analysis_is_not_served_for_an_entry_rewritten_with_the_same_inode_and_size(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(analysis_cache, "keeping", True)
    monkeypatch.setattr(analysis_cache, "_KEPT", {})
    store = LocalStore(tmp_path / "store")
    (store.root / "analysis").mkdir(exist_ok=True)
    entry = store.root / "analysis" / "k"
    write_sealed(store, entry, (["//:t"], "graph of the old declarations", Tracker(None)))
    assert analysis_cache.load_unchecked(store, "k")[1] == "graph of the old declarations"
    newer = tmp_path / "newer"
    write_sealed(store, newer, (["//:t"], "graph of the new declarations", Tracker(None)))
    _rewrite_in_place_keeping_mtime(entry, newer.read_bytes())
    assert analysis_cache.load_unchecked(store, "k")[1] == "graph of the new declarations"


def test_the_servers_code_check_sees_a_same_size_rewrite_with_its_mtime_put_back(
    tmp_path, monkeypatch
):
    module = tmp_path / "pkg_w30_code" / "__init__.py"
    module.parent.mkdir()
    module.write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("pkg_w30_code")
    try:
        known = server._loaded_files()
        assert str(module) in known
        _rewrite_in_place_keeping_mtime(module, b"VALUE = 2\n")
        assert server._loaded_files() != known
    finally:
        sys.modules.pop("pkg_w30_code", None)


def test_a_kept_analysis_outlives_the_touches_that_mark_it_used_and_nothing_else(
    tmp_path, monkeypatch
):
    """Each build that uses an analysis touches its entry (its access time, for pruning),
    which moves its ctime: the copy kept in memory must still be served after such a touch
    (it was read from disk again at every build that needed it: ~160 MB at 100,000 actions),
    and still not after a rewrite in place."""
    monkeypatch.setattr(analysis_cache, "keeping", True)
    monkeypatch.setattr(analysis_cache, "_KEPT", {})
    reads: list[Path] = []
    real = analysis_cache.read_sealed

    def counted(store, path):
        reads.append(path)
        return real(store, path)

    monkeypatch.setattr(analysis_cache, "read_sealed", counted)
    store = LocalStore(tmp_path / "store")
    (store.root / "analysis").mkdir(exist_ok=True)
    entry = store.root / "analysis" / "k"
    write_sealed(store, entry, (["//:t"], "graph one", Tracker(None)))
    os.utime(entry, ns=(1, os.stat(entry).st_mtime_ns))
    for _ in range(3):
        ctime = os.stat(entry).st_ctime_ns
        assert analysis_cache.load_unchecked(store, "k")[1] == "graph one"
        time.sleep(0.02)
        analysis_cache.touch_entry(entry)  # NB: as rsi.incremental does at each build
        assert os.stat(entry).st_ctime_ns != ctime  # NB: the touch did move it
    assert len(reads) == 1
    assert os.stat(entry).st_atime_ns > 1  # NB: marked used
    newer = tmp_path / "newer"
    write_sealed(store, newer, (["//:t"], "graph two", Tracker(None)))
    _rewrite_in_place_keeping_mtime(entry, newer.read_bytes())
    assert analysis_cache.load_unchecked(store, "k")[1] == "graph two"
    assert len(reads) == 2
