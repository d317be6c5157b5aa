"""The fold (rsi/incremental.py): a no-op leaves the analysis' reads of sources (kind, mode, real
path) to the sources' own `lstat` check once an entry vouches for its read (a fifth item, True,
set only after the read was found as recorded by an `lstat` at the signature the entry holds).
Nothing it skips may hide a change: each way a read can change with the source's content left
alone (a chmod, a swap for a link or a folder, its folder swapped for a link) still makes the
analysis run again. No timing is asserted."""

from __future__ import annotations

import os
import shutil
import time

import pytest
import test_event_hits
from test_side_check import _build, _store  # NB: an in-process build of //:top, the store

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bwrap")]


# NB: the event tests' workspace: in/a.txt -> leaf_a, in/b.txt -> leaf_b -> top (each copies)
fanin = test_event_hits.fanin


@pytest.fixture
def ws(fanin):
    return fanin


@pytest.fixture
def watched(monkeypatch):
    """Each build's plan (None: analysed again) and the reads its analysis' check looked at."""
    from rsi import analysis_cache, incremental

    seen: dict[str, list] = {"plans": [], "only": []}
    real_plan, real_check = incremental._plan, analysis_cache._stats_unchanged

    def plan(*a, **k):
        got = real_plan(*a, **k)
        seen["plans"].append(got)
        return got

    def check(stats, lstats, unchanged=None, dirs=None, only=None):
        seen["only"].append(None if only is None else list(only))
        return real_check(stats, lstats, unchanged, dirs, only)

    monkeypatch.setattr(incremental, "_plan", plan)
    monkeypatch.setattr(analysis_cache, "_stats_unchanged", check)
    return seen


def _vouches(entry: list) -> bool:
    """The entry vouches for its read: a fifth item, the mode it was found at."""
    return len(entry) == 5 and isinstance(entry[4], int) and not isinstance(entry[4], bool)


def _state(ws) -> dict:
    """The build state as the next build loads it (its delta applied)."""
    from rsi import incremental

    (path,) = (ws / "cache" / "analysis").glob("state-*")
    return incremental._load(_store(), path.name[len("state-") :])[0]


def _sources(ws) -> dict:
    return _state(ws)["sources"]


def _folded(ws, monkeypatch, tmp_path, watched) -> None:
    """Built, then no-ops past the racy window until every source's entry vouches for its read
    and a no-op's check of the analysis' reads looks at no source."""
    assert _build(ws, monkeypatch, tmp_path).counts["executed"] == 3
    time.sleep(1.1)
    for _ in range(3):
        _build(ws, monkeypatch, tmp_path)
    sources = _sources(ws)
    assert sources and all(_vouches(entry) for entry in sources.values())
    watched["plans"].clear()
    watched["only"].clear()
    assert _build(ws, monkeypatch, tmp_path).counts["executed"] == 0
    assert watched["plans"][-1] is not None
    assert not any(str(ws / "in") in q for q in watched["only"][-1])


def test_a_no_op_leaves_vouched_reads_to_the_sources_check(ws, monkeypatch, tmp_path, watched):
    _folded(ws, monkeypatch, tmp_path, watched)


def _chmod(ws):
    os.chmod(ws / "in" / "a.txt", 0o755)


def _link_to_copy(ws):
    (ws / "elsewhere").mkdir()
    shutil.copy(ws / "in" / "a.txt", ws / "elsewhere" / "a.txt")
    (ws / "in" / "a.txt").unlink()
    (ws / "in" / "a.txt").symlink_to(ws / "elsewhere" / "a.txt")


def _folder_for_a_link(ws):
    """Same files, same inodes, same signatures: only their folder's real path moves."""
    (ws / "in").rename(ws / "moved")
    (ws / "in").symlink_to(ws / "moved")


def _a_dir(ws):
    (ws / "in" / "a.txt").unlink()
    (ws / "in" / "a.txt").mkdir()


@pytest.mark.parametrize(
    "change", [_chmod, _link_to_copy, _folder_for_a_link, _a_dir], ids=lambda f: f.__name__
)
def test_a_read_changed_under_a_vouched_source_is_analysed_again(
    ws, monkeypatch, tmp_path, watched, change
):
    _folded(ws, monkeypatch, tmp_path, watched)
    before = (ws / "out" / "top.out").read_text()
    change(ws)
    watched["plans"].clear()
    from rsi.build import build
    from rsi.errors import DeclarationError
    from rsi.workspace import Workspace

    if change is _a_dir:
        # NB: a folder where a file source was: refused by the analysis, not reused
        with pytest.raises(DeclarationError, match="in/a.txt"):
            build(Workspace.discover(), ["//:top"], progress=False)
    else:
        report = build(Workspace.discover(), ["//:top"], progress=False)
        assert report.ok and (ws / "out" / "top.out").read_text() == before
    assert watched["plans"][0] is None  # NB: the analysis' check failed: analysed again


def test_a_touched_source_is_checked_until_it_vouches_again(ws, monkeypatch, tmp_path, watched):
    _folded(ws, monkeypatch, tmp_path, watched)
    a = ws / "in" / "a.txt"
    a.write_text(a.read_text())  # NB: same content, new signature
    watched["only"].clear()
    assert _build(ws, monkeypatch, tmp_path).counts["executed"] == 0
    assert str(a) in watched["only"][-1]  # NB: its signature moved: its read is checked
    # NB: a few touched sources leave the state as it was: its entry, vouching or not, holds
    # the old signature, so the next check looks at the read again
    st = a.stat()
    assert _sources(ws)[str(a)][0] != (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    time.sleep(1.1)
    for _ in range(2):
        _build(ws, monkeypatch, tmp_path)
    assert _vouches(_sources(ws)[str(a)])
    watched["only"].clear()
    _build(ws, monkeypatch, tmp_path)
    assert str(a) not in watched["only"][-1]


def test_a_source_re_keyed_by_a_run_vouches_for_nothing(ws, monkeypatch, tmp_path, watched):
    """The signature a run records for an edited source is the run's, not the `lstat`'s the
    analysis' check saw: its entry drops the fifth item (a chmod between the two would
    otherwise go unseen), until a check finds its read at that signature again."""
    _folded(ws, monkeypatch, tmp_path, watched)
    a = ws / "in" / "a.txt"
    a.write_text("alpha 2\n")
    time.sleep(1.1)  # NB: past the racy window: the run records a signature that stands
    assert _build(ws, monkeypatch, tmp_path).counts["executed"] == 2
    entry = _sources(ws)[str(a)]
    st = a.stat()
    assert entry[0] == (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    assert not _vouches(entry)
    _build(ws, monkeypatch, tmp_path)
    assert _vouches(_sources(ws)[str(a)])


def test_a_source_changed_between_the_check_and_the_run_vouches_for_nothing(
    ws, monkeypatch, tmp_path, watched
):
    """leaf_a runs again for another reason (its cache entry is gone) while its source was
    found as recorded; the source is made executable after the check and before the run keys
    it, long enough before for the run's signature to stand. The re-check before export sees
    the new mode and the build goes again (analysed again); the entry then holds the new
    signature, and vouches only for the read as the new analysis made it."""
    _folded(ws, monkeypatch, tmp_path, watched)
    a = ws / "in" / "a.txt"
    for entry in (ws / "cache" / "ac").glob("*/*"):
        if b"alpha" in entry.read_bytes() or "a.out" in entry.read_text(errors="replace"):
            entry.unlink()
    _chmod_before_the_run(monkeypatch, a)
    _build(ws, monkeypatch, tmp_path)
    entry = _sources(ws)[str(a)]
    st = a.stat()
    assert entry[0] == (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    _vouching_holds(ws)
    assert any(plan is None for plan in watched["plans"])  # NB: analysed again
    assert _build(ws, monkeypatch, tmp_path).counts["executed"] == 0
    assert _vouches(_sources(ws)[str(a)])


def _chmod_before_the_run(monkeypatch, a):
    """`a` made executable as the scheduler starts, a second before it keys anything (long
    enough for the signature the run records to stand); returns the real `Scheduler.run`."""
    from rsi import scheduler

    real_run = scheduler.Scheduler.run

    def run(self, *args, **kwargs):
        if not a.stat().st_mode & 0o111:
            os.chmod(a, 0o755)
            time.sleep(1.1)
        return real_run(self, *args, **kwargs)

    monkeypatch.setattr(scheduler.Scheduler, "run", run)
    return real_run


def _vouching_holds(ws) -> None:
    """Every entry that vouches for its read, while its source is at the entry's signature,
    has the read as recorded: kind, executable bit, its own real path."""
    state = _state(ws)
    stats = state["tracker"].stats
    for q, entry in state["sources"].items():
        if not _vouches(entry):
            continue
        st = os.lstat(q)
        if entry[0] != (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns):
            continue
        want = stats[q]
        assert entry[4] == st.st_mode
        assert want[2] == q == os.path.realpath(q)
        assert want[:2] == ["dir" if os.path.isdir(q) else "file", bool(st.st_mode & 0o111)]


def test_a_cold_build_of_settled_sources_vouches_at_once(ws, monkeypatch, tmp_path, watched):
    """Sources older than the racy window: the state the first build writes already vouches
    for their reads, so the first no-op writes nothing and checks no source's read."""
    time.sleep(1.1)
    assert _build(ws, monkeypatch, tmp_path).counts["executed"] == 3
    assert all(_vouches(entry) for entry in _sources(ws).values())
    _vouching_holds(ws)
    watched["only"].clear()
    assert _build(ws, monkeypatch, tmp_path).counts["executed"] == 0
    assert not any(str(ws / "in") in q for q in watched["only"][-1])
    # NB: it may settle the blobs the build wrote (racy then), never a source's entry
    from rsi import incremental

    for delta in (ws / "cache" / "analysis").glob("delta-*"):
        _, got = incremental.read_sealed_head(_store(), delta)
        assert not got["sources"]


def test_a_source_made_executable_during_a_cold_build_is_not_vouched_for(
    ws, monkeypatch, tmp_path, watched
):
    """Made executable after the analysis read it and long enough before the run keys it for
    the run's signature to stand: the entry must not vouch for the read the analysis made."""
    from rsi import scheduler

    time.sleep(1.1)
    a = ws / "in" / "a.txt"
    real_run = _chmod_before_the_run(monkeypatch, a)
    _build(ws, monkeypatch, tmp_path)
    _vouching_holds(ws)
    monkeypatch.setattr(scheduler.Scheduler, "run", real_run)
    watched["plans"].clear()
    assert _build(ws, monkeypatch, tmp_path).counts["executed"] == 0
    _vouching_holds(ws)


def test_a_vouching_entry_at_another_mode_has_its_read_checked(ws, monkeypatch, tmp_path, watched):
    """On a file system that keeps no ctime for a chmod, a source could be at its signature
    with another mode: the entry holds the mode it vouched at, and any other is checked (the
    entry altered here to stand for that file system)."""
    from rsi import incremental

    _folded(ws, monkeypatch, tmp_path, watched)
    a = str(ws / "in" / "a.txt")
    state = _state(ws)
    state["sources"][a][4] ^= 0o100
    incremental.save(_store(), state)
    watched["only"].clear()
    watched["plans"].clear()
    assert _build(ws, monkeypatch, tmp_path).counts["executed"] == 0
    assert a in watched["only"][-1] and watched["plans"][-1] is not None
    _build(ws, monkeypatch, tmp_path)
    assert _sources(ws)[a][4] == os.lstat(a).st_mode


@pytest.mark.parametrize(
    "fold",
    [None, "garbage", {"folders": "x", "rest": [], "count": [0, 0]}, {"folders": [], "rest": []}],
    ids=["missing", "not a dict", "folders not a list", "no count"],
)
def test_a_state_with_a_fold_that_does_not_fit_checks_every_read(
    ws, monkeypatch, tmp_path, watched, fold
):
    """A sealed state whose fold is missing or malformed (an older writer, a bug): the build
    neither fails nor skips a read: the analysis' check looks at every source's read."""
    from rsi import incremental

    _folded(ws, monkeypatch, tmp_path, watched)
    state = _state(ws)
    state["fold"] = fold
    incremental.save(_store(), state)
    watched["only"].clear()
    watched["plans"].clear()
    assert _build(ws, monkeypatch, tmp_path).counts["executed"] == 0
    assert watched["plans"][-1] is not None and watched["only"][-1] is None
