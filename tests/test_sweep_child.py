"""The sweep's child (rsi.side_check.Sweep): half the sources of the re-check before export
stat'ed by a child forked during the plan's check. It only ever narrows what the parent looks
at again: an answer not whole, from a child that died or was killed, or one that did not look
at every odd source the parent holds, counts as nothing, and the parent stats those sources
itself. The end-to-end cases rewrite every vouched-for source while the re-run actions run and
check each one is still caught. No timing is asserted."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import time
from pathlib import Path

import pytest

from rsi import side_check


@pytest.fixture(autouse=True)
def forking(monkeypatch):
    """As a build's process is when its check finds an edit: one thread (a test process may
    run threads other tests left)."""
    monkeypatch.setattr(side_check, "_alone", lambda: True)
    monkeypatch.setenv("RSI_SIDE_CHECK", "always")


def _sig(path: str) -> tuple:
    st = os.lstat(path)
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _odd(paths) -> tuple[int, int]:
    count = xor = 0
    for p in paths:
        if hash(p) & 1:
            count += 1
            xor ^= hash(p)
    return count, xor


@pytest.mark.fast
@pytest.mark.parametrize(
    "data, want",
    [
        (b"end 0 0 0\n", ([], 0, 0)),
        (b"a/b\0end 1 3 -7\n", (["a/b"], 3, -7)),
        (b"a\nb\0c\0end 2 5 9\n", (["a\nb", "c"], 5, 9)),  # NB: a newline in a name is kept
        (b"", None),  # NB: nothing written: the child died before answering
        (b"a/b\0", None),  # NB: cut short before its ending line
        (b"a/b\0end 2 3 1\n", None),  # NB: fewer paths than it says it sent
        (b"end 0 0 0", None),  # NB: no final newline: not whole
        (b"end 0 0\n", None),
        (b"end x 0 0\n", None),
        (b"fin 0 0 0\n", None),
    ],
)
def test_only_a_whole_sweep_answer_is_used(data, want):
    assert side_check._parse_sweep(data) == want


@pytest.mark.fast
def test_the_child_names_exactly_the_odd_sources_moved_or_gone(tmp_path):
    sources: dict[str, list] = {}
    for i in range(64):
        p = tmp_path / f"s{i}"
        p.write_text(str(i))
        sources[str(p)] = [_sig(str(p)), "h", 1, []]
    sweep = side_check.start_sweep(sources)
    assert sweep is not None
    # NB: after the fork, before the go: what the child must see
    paths = list(sources)
    moved = set(paths[:10])
    for p in paths[:5]:
        os.utime(p, ns=(1, 1))
    for p in paths[5:10]:
        os.unlink(p)
    sources[paths[10]][0] = None  # NB: after the fork: the child's copy still has the signature
    assert sweep.go()
    named, count, xor = sweep.result()
    assert (count, xor) == _odd(paths)
    assert set(named) == {p for p in moved if hash(p) & 1}
    assert sweep.pid is None and sweep.fd is None


@pytest.mark.fast
def test_a_child_never_told_to_go_is_reaped(tmp_path):
    sweep = side_check.start_sweep({str(tmp_path): [None, "h", 0, []]})
    assert sweep is not None and sweep.pid is not None
    pid = sweep.pid
    sweep.cancel()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    sweep.cancel()  # NB: again: nothing
    assert sweep.go() is False and sweep.result() is None


@pytest.mark.fast
def test_a_child_exits_when_its_parent_drops_the_go(tmp_path):
    sweep = side_check.start_sweep({str(tmp_path): [None, "h", 0, []]})
    assert sweep is not None
    os.close(sweep.go_fd)  # NB: as a parent that died: the child reads end of file
    sweep.go_fd = None
    _, status = os.waitpid(sweep.pid, 0)
    sweep.pid = None
    assert os.waitstatus_to_exitcode(status) == 1  # NB: no sweep, no answer
    sweep.cancel()


@pytest.mark.fast
def test_the_child_holds_no_lock_of_the_parent(tmp_path):
    lock = tmp_path / "lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    sweep = side_check.start_sweep({str(tmp_path): [None, "h", 0, []]})
    assert sweep is not None
    try:
        os.close(fd)  # NB: the parent lets go while its child waits
        other = os.open(lock, os.O_RDWR)
        try:
            # NB: the child closes its copies first thing after the fork: allow it a moment
            # (a child that kept one would hold the lock until told to go)
            for _ in range(500):
                try:
                    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    time.sleep(0.01)
            else:
                pytest.fail("the sweep's child holds the parent's lock")
        finally:
            os.close(other)
    finally:
        sweep.cancel()


# ------------------------------------------------------------------------- end to end

N = 20  # NB: a sources_changed event lists 20 paths (and counts them all)


@pytest.fixture
def wide(command, make_workspace, tmp_path):
    """leaf_a (in/a.txt) and wide (in/s0..s19) -> top."""
    files = {f"in/s{i}.txt": f"s{i}\n" for i in range(N)}
    files["in/a.txt"] = "alpha\n"
    files["BUILD.toml"] = (
        command(
            "leaf_a",
            cmd="cat $(SRCS) > $(OUT) && ! grep -q fail $(SRCS)",
            srcs=["in/a.txt"],
            outs=["a.out"],
        )
        + command(
            "wide",
            cmd="cat $(SRCS) > $(OUT)",
            srcs=[f"in/s{i}.txt" for i in range(N)],
            outs=["wide.out"],
        )
        + command(
            "top",
            cmd="cat $(location :leaf_a) $(location :wide) > $(OUT)",
            deps=[":leaf_a", ":wide"],
            outs=["top.out"],
        )
    )
    return make_workspace(tmp_path, files)


def _one_change(ws_root: Path, monkeypatch, tmp_path) -> tuple[object, list[dict], list]:
    """Build, settle, change in/a.txt, build again rewriting every in/s*.txt right after the
    first attempt's actions ran (before its re-check); (report, events, each sweep's answer)."""
    from rsi import build as build_mod
    from rsi import scheduler
    from rsi.workspace import Workspace

    monkeypatch.setenv("RSI_BUILD_WATCH", "0")
    monkeypatch.setenv("RSI_HOST_LOCK", str(tmp_path / "host.lock"))
    ws = Workspace.load(ws_root)
    assert build_mod.build(ws, ["//:top"], progress=False).ok
    time.sleep(1.1)  # NB: past the racy window: the state's signatures stand for content
    assert build_mod.build(ws, ["//:top"], progress=False).counts["executed"] == 0
    answers: list = []
    real_result = side_check.Sweep.result

    def result(self):
        got = real_result(self)
        answers.append(got)
        return got

    monkeypatch.setattr(side_check.Sweep, "result", result)
    real_run = scheduler.Scheduler.run
    calls: list[set] = []

    def run(self, graph, wanted, *args, **kwargs):
        out = real_run(self, graph, wanted, *args, **kwargs)
        calls.append(set(wanted))
        if len(calls) == 1:
            for i in range(N):
                (ws_root / "in" / f"s{i}.txt").write_text(f"S{i} again\n")
        return out

    monkeypatch.setattr(scheduler.Scheduler, "run", run)
    (ws_root / "in" / "a.txt").write_text("alpha 2\n")
    events_path = tmp_path / "events.jsonl"
    with open(events_path, "w") as f:
        report = build_mod.build(ws, ["//:top"], progress=False, events_to=f)
    assert calls and not any(i.startswith("//:wide") for i in calls[0])
    events = [json.loads(line) for line in events_path.read_text().splitlines()]
    return report, events, answers


def _expect_all_caught(ws_root: Path, report, events) -> None:
    changed = [e for e in events if e["kind"] == "sources_changed"]
    want = sorted(str(ws_root / "in" / f"s{i}.txt") for i in range(N))
    assert changed and changed[0]["count"] == N and sorted(changed[0]["paths"]) == want
    assert report.ok
    top = (ws_root / "out" / "top.out").read_text()
    assert top == "alpha 2\n" + "".join(f"S{i} again\n" for i in range(N))


@pytest.mark.e2e
@pytest.mark.usefixtures("bwrap")
def test_every_source_rewritten_during_the_build_is_caught_with_the_child(
    wide, monkeypatch, tmp_path
):
    report, events, answers = _one_change(wide, monkeypatch, tmp_path)
    # NB: the child's answer was used, and named its half of the rewritten sources
    assert answers and answers[0] is not None
    named, count, _ = answers[0]
    assert count > 0 and set(named) >= {
        str(wide / "in" / f"s{i}.txt") for i in range(N) if hash(str(wide / "in" / f"s{i}.txt")) & 1
    }
    _expect_all_caught(wide, report, events)


def _dies(fd, sources):
    raise RuntimeError("the child fails before answering")


def _cut_short(fd, sources):
    os.write(fd, b"in/s1.txt\0")


def _killed(fd, sources):
    os.write(fd, b"in/s1.txt\0")
    os.kill(os.getpid(), signal.SIGKILL)


def _says_nothing_moved_of_fewer(fd, sources):
    # NB: a whole answer that looked at fewer sources than the parent holds: not taken
    os.write(fd, b"end 0 1 0\n")


def _says_nothing_moved_of_others(fd, sources):
    # NB: as many sources as the parent's, but not the same ones (another XOR): not taken
    count, xor = _odd(sources)
    os.write(fd, b"end 0 %d %d\n" % (count, xor ^ 2))


@pytest.mark.e2e
@pytest.mark.usefixtures("bwrap")
@pytest.mark.parametrize(
    "child",
    [_dies, _cut_short, _killed, _says_nothing_moved_of_fewer, _says_nothing_moved_of_others],
    ids=lambda f: f.__name__.strip("_"),
)
def test_every_source_rewritten_is_caught_whatever_the_child_does(
    wide, monkeypatch, tmp_path, child
):
    monkeypatch.setattr(side_check, "_sweep", child)
    report, events, answers = _one_change(wide, monkeypatch, tmp_path)
    assert answers  # NB: a child was forked and asked
    _expect_all_caught(wide, report, events)


@pytest.mark.e2e
@pytest.mark.usefixtures("bwrap")
def test_a_no_op_and_a_failed_build_leave_no_child(wide, monkeypatch, tmp_path):
    from rsi import build as build_mod
    from rsi.workspace import Workspace

    monkeypatch.setenv("RSI_HOST_LOCK", str(tmp_path / "host.lock"))
    started: list = []
    real = side_check.start_sweep

    def start(sources):
        got = real(sources)
        started.append(got)
        return got

    monkeypatch.setattr(side_check, "start_sweep", start)
    ws = Workspace.load(wide)
    assert build_mod.build(ws, ["//:top"], progress=False).ok
    time.sleep(1.1)
    # NB: touched, same content: the check hashes it, nothing runs, no re-check
    os.utime(wide / "in" / "a.txt")
    assert build_mod.build(ws, ["//:top"], progress=False).counts["executed"] == 0
    # NB: a changed source and a changed declaration: the plan is given up for a new analysis
    (wide / "in" / "a.txt").write_text("alpha 2\n")
    (wide / "BUILD.toml").write_text((wide / "BUILD.toml").read_text() + "\n")
    assert build_mod.build(ws, ["//:top"], progress=False).ok
    time.sleep(1.1)
    # NB: a changed source whose action fails: nothing exported, no re-check
    (wide / "in" / "a.txt").write_text("fail\n")
    assert not build_mod.build(ws, ["//:top"], progress=False).ok
    assert any(s is not None for s in started)
    for sweep in started:
        if sweep is not None:
            assert sweep.pid is None and sweep.fd is None and sweep.go_fd is None


class _Plan:
    """What `swept_since_check` reads of a plan, with the real `end_watch`."""

    def __init__(self, sources):
        from rsi import incremental

        self.watch = self.sweep_watch = self.sweeper = None
        self.state = {"sources": sources}
        self.unsettled: set = set()
        self.fresh: dict = {}
        self.dirs: dict = {}
        self._end = incremental.Plan.end_watch

    def end_watch(self):
        self._end(self)


class _Interrupting(dict):
    """Ctrl-C in the parent only, part way through its own half of the sweep."""

    def __init__(self, *a, parent: int, after: int, **k):
        super().__init__(*a, **k)
        self._parent, self._after = parent, after

    def items(self):
        for n, kv in enumerate(super().items()):
            if os.getpid() == self._parent and n == self._after:
                raise KeyboardInterrupt("Ctrl-C during the re-check")
            yield kv


@pytest.mark.fast
@pytest.mark.parametrize("missing", [10, 4000], ids=["small_answer", "answer_over_a_pipe"])
def test_an_interrupted_sweep_leaves_no_child_nor_pipe(tmp_path, missing):
    from rsi import incremental

    base = {
        str(tmp_path / ("a-long-source-path-name-" * 2 + f"{i:06d}")): [None, "h", 1, []]
        for i in range(2 * missing)
    }  # NB: none is there: the child names every odd one (4000: more than a pipe holds)
    sources = _Interrupting(base, parent=os.getpid(), after=len(base) // 2)
    p = _Plan(sources)
    p.sweeper = sweep = side_check.start_sweep(sources)
    assert sweep is not None
    pid = sweep.pid
    with pytest.raises(KeyboardInterrupt):
        incremental.swept_since_check(p, {}, "/nonexistent-store/")
    p.end_watch()  # NB: as rsi.build.build does after each attempt
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # NB: reaped already
    assert sweep.pid is None and sweep.fd is None and sweep.go_fd is None  # NB: pipes closed


@pytest.mark.fast
def test_the_child_holds_nothing_at_0_to_2_but_dev_null(tmp_path):
    # NB: a parent started with its standard descriptors closed may hold a lock's file there
    lock = tmp_path / "lock"
    saved = os.dup(1)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.dup2(fd, 1)
        fcntl.flock(1, fcntl.LOCK_EX)
        sweep = side_check.start_sweep({str(tmp_path): [None, "h", 0, []]})
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    assert sweep is not None
    try:
        targets = set()
        for _ in range(500):
            where = f"/proc/{sweep.pid}/fd"
            targets = set()
            for n in os.listdir(where):
                try:
                    targets.add(os.readlink(f"{where}/{n}"))
                except FileNotFoundError:  # NB: closed by the child between list and read
                    continue
            if str(lock) not in targets:
                break
            time.sleep(0.01)
        assert str(lock) not in targets
        assert os.readlink(f"/proc/{sweep.pid}/fd/1") == os.devnull
    finally:
        sweep.cancel()
        os.close(fd)
