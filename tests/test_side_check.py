"""The side check (rsi/side_check.py): a no-op's output blobs stat'ed by a forked child. The
child only ever narrows what the parent looks at again; a child that dies, is cut short or
writes a garbled answer counts as having said nothing, and the parent stats every blob itself.
Each case corrupts a blob in place (same size, mode put back) and checks it is still caught:
the action runs again and the output is right. No timing is asserted."""

from __future__ import annotations

import os
import threading
import time

import pytest
import test_event_hits

from rsi import side_check

HASH = "ab" * 32


@pytest.fixture(autouse=True)
def forking(monkeypatch):
    """As a build's own process is when it plans: one thread. A test process may run threads
    other tests left (a whole run's), and the side check never forks beside them. Gives the
    real check."""
    real = side_check._alone
    monkeypatch.setattr(side_check, "_alone", lambda: True)
    return real


@pytest.mark.fast
@pytest.mark.parametrize(
    "data, want",
    [
        (b"end 0\n", set()),
        (f"{HASH}\nend 1\n".encode(), {HASH}),
        (f"{HASH}\n{HASH[::-1]}\nend 2\n".encode(), {HASH, HASH[::-1]}),
        (b"", None),  # NB: nothing written: the child died before answering
        (f"{HASH}\n".encode(), None),  # NB: cut short before its ending line
        (f"{HASH}\nend 2\n".encode(), None),  # NB: fewer hashes than it says it sent
        (f"{HASH}\nend 0\n".encode(), None),
        (b"end x\n", None),
        (b"end 0", None),  # NB: no final newline: not whole
        (b"\xff\nend 1\n", None),
    ],
)
def test_only_a_whole_answer_is_used(data, want):
    assert side_check._parse(data) == want


@pytest.mark.fast
def test_no_child_is_forked_beside_another_thread(monkeypatch, forking):
    monkeypatch.setenv("RSI_SIDE_CHECK", "always")
    monkeypatch.setattr(side_check, "_alone", forking)
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert side_check._alone() is False
        assert side_check.start("/nonexistent", {HASH: None}, {}) is None
    finally:
        stop.set()
        t.join()
    monkeypatch.setattr(side_check, "_alone", lambda: True)
    got = side_check.start("/nonexistent", {HASH: None}, {})
    assert got is not None and got.result() == {HASH}  # NB: no such blob: named


@pytest.mark.fast
def test_a_cancelled_child_is_reaped(monkeypatch):
    monkeypatch.setenv("RSI_SIDE_CHECK", "always")
    monkeypatch.setattr(side_check, "_answer", lambda *a: time.sleep(30))
    got = side_check.start("/nonexistent", {HASH: None}, {})
    assert got is not None and got.pid is not None
    pid = got.pid
    got.cancel()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    got.cancel()  # NB: again, or after its answer: nothing (its pid may be another's by now)


# NB: the event tests' workspace: in/a.txt -> leaf_a, in/b.txt -> leaf_b -> top (each copies)
fanin = test_event_hits.fanin


@pytest.fixture
def ws(fanin):
    return fanin


def _build(ws, monkeypatch, tmp_path):
    from rsi.build import build
    from rsi.workspace import Workspace

    monkeypatch.chdir(ws)
    monkeypatch.setenv("RSI_HOST_LOCK", str(tmp_path / "host.lock"))
    report = build(Workspace.discover(), ["//:top"], progress=False)
    assert report.ok
    return report


def _corrupt_leaf_a_output(ws):
    """leaf_a's output blob rewritten in place: same size, its mode put back."""
    out = b"alpha\n"  # NB: leaf_a copies in/a.txt
    (blob,) = [b for b in (ws / "cache" / "cas").glob("*/*") if b.read_bytes() == out]
    mode = blob.stat().st_mode
    os.chmod(blob, 0o644)
    blob.write_bytes(b"X" * len(out))
    os.chmod(blob, mode)


def _answers(monkeypatch) -> list:
    """What each side check's `result()` gave, as the builds ask."""
    seen: list = []
    real = side_check.SideCheck.result

    def result(self):
        got = real(self)
        seen.append(got)
        return got

    monkeypatch.setattr(side_check.SideCheck, "result", result)
    return seen


def _settled(ws, monkeypatch, tmp_path):
    assert _build(ws, monkeypatch, tmp_path).counts["executed"] == 3
    time.sleep(1.1)  # NB: past the racy window: the blobs' signatures stand for content
    _build(ws, monkeypatch, tmp_path)


@pytest.mark.e2e
@pytest.mark.usefixtures("bwrap")
@pytest.mark.parametrize(
    "child",
    [
        "honest",
        "honest, every shard the child's",
        "honest, every shard the parent's",
        "dies",  # NB: raises before writing: exits 1
        "cut short",  # NB: writes a hash but no ending line
        "killed",  # NB: SIGKILLed mid-answer
    ],
)
def test_a_corrupted_blob_is_caught_whatever_the_child_does(ws, monkeypatch, tmp_path, child):
    monkeypatch.setenv("RSI_SIDE_CHECK", "always")
    _settled(ws, monkeypatch, tmp_path)
    _corrupt_leaf_a_output(ws)
    if child == "honest, every shard the child's":
        monkeypatch.setattr(side_check, "PARENT_SHARDS", 0)
    elif child == "honest, every shard the parent's":
        monkeypatch.setattr(side_check, "PARENT_SHARDS", 256)
    elif child == "dies":
        monkeypatch.setattr(side_check, "_answer", lambda *a: 1 / 0)
    elif child == "cut short":
        monkeypatch.setattr(side_check, "_answer", lambda fd, *a: os.write(fd, b"zz\n"))
    elif child == "killed":
        monkeypatch.setattr(side_check, "_answer", lambda *a: os.kill(os.getpid(), 9))
    answers = _answers(monkeypatch)
    report = _build(ws, monkeypatch, tmp_path)
    assert report.counts["executed"] >= 1
    assert (ws / "out" / "top.out").read_text() == "alpha\nbravo\n"
    assert len(answers) == 1  # NB: the child was forked and asked
    if child == "honest, every shard the child's":
        assert answers[0] is not None and len(answers[0]) == 1  # NB: that blob alone
    elif child.startswith("honest"):
        assert answers[0] is not None  # NB: the parent's share of the shards is its own
        if child.endswith("parent's"):
            assert answers[0] == set()
    else:
        assert answers[0] is None  # NB: no usable answer: the parent stat'ed every blob


@pytest.mark.e2e
@pytest.mark.usefixtures("bwrap")
def test_an_honest_child_of_an_unchanged_store_names_nothing(ws, monkeypatch, tmp_path):
    monkeypatch.setenv("RSI_SIDE_CHECK", "always")
    _settled(ws, monkeypatch, tmp_path)
    answers = _answers(monkeypatch)
    assert _build(ws, monkeypatch, tmp_path).counts["executed"] == 0
    assert answers == [set()]


@pytest.mark.e2e
@pytest.mark.usefixtures("bwrap")
def test_a_plan_given_up_reaps_its_child(ws, monkeypatch, tmp_path):
    """A changed declaration: the plan gives up before it asks the child, and stops it."""
    monkeypatch.setenv("RSI_SIDE_CHECK", "always")
    _settled(ws, monkeypatch, tmp_path)
    started: list = []
    real = side_check.start

    def start(*a, **k):
        got = real(*a, **k)
        started.append(got.pid if got is not None else None)
        return got

    monkeypatch.setattr(side_check, "start", start)
    answers = _answers(monkeypatch)
    build_toml = ws / "BUILD.toml"
    build_toml.write_text(build_toml.read_text().replace("cat $(SRCS)", "cat  $(SRCS)", 1))
    assert _build(ws, monkeypatch, tmp_path).ok
    assert started and started[0] is not None and answers == []
    with pytest.raises(ChildProcessError):
        os.waitpid(started[0], os.WNOHANG)


@pytest.mark.e2e
@pytest.mark.usefixtures("bwrap")
@pytest.mark.parametrize("side", ["0", "always"])
def test_the_blobs_a_one_change_build_made_stay_checked(ws, monkeypatch, tmp_path, side):
    """A re-run action's new blobs are too new for their signatures to stand (None): the delta
    must keep them all the same, or no later build would look at them. One rewritten in place
    afterwards is caught: its action runs again and the output is right."""
    from rsi import incremental

    monkeypatch.setenv("RSI_SIDE_CHECK", side)
    _settled(ws, monkeypatch, tmp_path)
    (ws / "in" / "a.txt").write_text("alpha 2\n")
    assert _build(ws, monkeypatch, tmp_path).counts["executed"] == 2
    (delta,) = (ws / "cache" / "analysis").glob("delta-*")  # NB: a delta, not a whole state
    top = (ws / "out" / "top.out").read_bytes()
    (blob,) = [b for b in (ws / "cache" / "cas").glob("*/*") if b.read_bytes() == top]
    _, got = incremental.read_sealed_head(_store(), delta)
    assert blob.name in got["blobs"]
    mode = blob.stat().st_mode
    os.chmod(blob, 0o644)
    blob.write_bytes(b"X" * len(top))
    os.chmod(blob, mode)
    time.sleep(1.1)
    report = _build(ws, monkeypatch, tmp_path)
    assert report.counts["executed"] >= 1
    assert (ws / "out" / "top.out").read_bytes() == top


def _store():
    from rsi.runtime import open_store
    from rsi.workspace import Workspace

    return open_store(Workspace.discover())
