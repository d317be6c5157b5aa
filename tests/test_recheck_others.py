"""The re-check before export given the fold's list of the reads that are no source's
(rsi/build.py `_moved`, `Tracker.moved_reads_since`): those are still looked at, so only the
sources the caller vouched for are skipped."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.fast


def test_the_recheck_with_the_folds_list_still_sees_a_read_that_is_no_source(tmp_path):
    """`moved_reads_since` given the fold's list of the other reads (rsi/build.py `_moved`):
    a read that is no source's, made executable since, is still reported; a source the
    caller vouched for is not looked at."""
    from rsi.analysis_cache import Tracker
    from rsi.digest import FileDigestMemo

    src, other = tmp_path / "src.txt", tmp_path / "listed.txt"
    src.write_text("s\n")
    other.write_text("o\n")
    tracker = Tracker(FileDigestMemo(tmp_path / "memo.json"))
    tracker.stat(src)
    tracker.stat(other)
    sources = {str(src): []}
    assert tracker.moved_reads_since(sources, set(), {}, {}, [str(other)]) == []
    os.chmod(src, 0o755)  # NB: vouched for by the caller (its own check): not looked at here
    assert tracker.moved_reads_since(sources, set(), {}, {}, [str(other)]) == []
    os.chmod(other, 0o755)
    assert tracker.moved_reads_since(sources, set(), {}, {}, [str(other)]) != []
    assert tracker.moved_reads_since(sources, set(), {}, {}, None) != []
