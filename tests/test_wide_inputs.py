"""The table of a wide action's produced inputs that the incremental state keeps
(rsi.scheduler `wide_inputs`, rsi.incremental `Plan.inputs_of`): the next build that re-runs
that action reads its settled producers' outputs from the table. Whatever sequence of
changes, failures and returns to earlier content comes, the action is keyed with its
producers' outputs as they are now: never served from an earlier build's result."""

from __future__ import annotations

import time

import pytest

from rsi import incremental, scheduler

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bwrap")]

N = 4


@pytest.fixture
def wide(command, make_workspace, tmp_path, monkeypatch):
    """l0..l3 (each copies in/sI.txt, failing on "fail") -> top (their outputs, in order)."""
    monkeypatch.setattr(scheduler, "WIDE_INPUTS", 2)  # NB: top's 4 inputs make it wide
    monkeypatch.setenv("RSI_HOST_LOCK", str(tmp_path / "host.lock"))
    files = {f"in/s{i}.txt": f"s{i}\n" for i in range(N)}
    build = "".join(
        command(
            f"l{i}",
            cmd="cat $(SRCS) > $(OUT) && ! grep -q fail $(SRCS)",
            srcs=[f"in/s{i}.txt"],
            outs=[f"l{i}.out"],
        )
        for i in range(N)
    )
    build += command(
        "top",
        cmd="cat " + " ".join(f"$(location :l{i})" for i in range(N)) + " > $(OUT)",
        deps=[f":l{i}" for i in range(N)],
        outs=["top.out"],
    )
    files["BUILD.toml"] = build
    return make_workspace(tmp_path, files)


def _tables(monkeypatch) -> list:
    """Every table `Plan.inputs_of` gave, as the builds ask."""
    seen: list = []
    real = incremental.Plan.inputs_of

    def inputs_of(self, action_id):
        got = real(self, action_id)
        seen.append((action_id, got))
        return got

    monkeypatch.setattr(incremental.Plan, "inputs_of", inputs_of)
    return seen


def _build(ws_root):
    from rsi.build import build
    from rsi.workspace import Workspace

    return build(Workspace.load(ws_root), ["//:top"], progress=False)


def _write(ws_root, i: int, text: str) -> None:
    (ws_root / "in" / f"s{i}.txt").write_text(text)


def _expect(ws_root) -> None:
    report = _build(ws_root)
    assert report.ok, report.targets
    want = "".join((ws_root / "in" / f"s{i}.txt").read_text() for i in range(N))
    assert (ws_root / "out" / "top.out").read_text() == want


def test_a_wide_action_is_keyed_with_its_producers_outputs_as_they_are_now(wide, monkeypatch):
    tables = _tables(monkeypatch)
    _expect(wide)
    time.sleep(1.1)  # NB: past the racy window: the state's signatures stand for content
    steps = [
        (0, "s0 two\n"),
        (1, "s1 two\n"),  # NB: keyed with the table the build before wrote (s0 two)
        (0, "s0\n"),  # NB: back to the first build's content: top is a cache hit
        (2, "s2 two\n"),  # NB: so the table must hold s0's first output again
        (0, "s0 two\n"),
        (0, "s0 three\n"),
    ]
    for i, text in steps:
        _write(wide, i, text)
        _expect(wide)
    # NB: the table was there and read for top in each of those builds
    used = [t for a, t in tables if a.startswith("//:top") and t is not None]
    assert len(used) >= len(steps) - 1
    assert all(len(t) == N for t in used)


def test_a_failed_build_between_leaves_no_stale_table(wide, monkeypatch):
    _expect(wide)
    time.sleep(1.1)
    _write(wide, 0, "s0 two\n")
    _expect(wide)
    _write(wide, 1, "fail\n")  # NB: l1 fails: nothing recorded
    assert not _build(wide).ok
    _write(wide, 0, "s0 three\n")
    _write(wide, 1, "s1 two\n")
    _expect(wide)
    _write(wide, 3, "s3 two\n")
    _expect(wide)


def test_a_row_naming_another_producer_is_not_used(wide, monkeypatch):
    _expect(wide)
    time.sleep(1.1)
    real = incremental.Plan.inputs_of

    def swapped(self, action_id):
        got = real(self, action_id)
        if got is None:
            return None
        # NB: every row's producer and content swapped with the next one's
        rows = list(got.items())
        return {
            path: (rows[(n + 1) % len(rows)][1][0], *rows[(n + 1) % len(rows)][1][1:])
            for n, (path, _) in enumerate(rows)
        }

    monkeypatch.setattr(incremental.Plan, "inputs_of", swapped)
    _write(wide, 2, "s2 two\n")
    _expect(wide)
