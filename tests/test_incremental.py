"""Incremental builds served from the build state (rsi/incremental.py): a no-op build reports
every action as a hit without re-keying it, and nothing the state remembers can hide a change:
a same-size rewrite with its mtime put back, a deleted or corrupted cache entry, a changed
declaration. No timing is asserted anywhere here."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bwrap")]

ALL = {"//:leaf_a", "//:leaf_b", "//:top"}


@pytest.fixture
def fanin(command, make_workspace, tmp_path):
    """leaf_a, leaf_b -> top, each leaf copying its source and adding a line."""
    return make_workspace(
        tmp_path,
        {
            "in/a.txt": "alpha\n",
            "in/b.txt": "bravo\n",
            "BUILD.toml": command(
                "leaf_a",
                cmd="cat $(SRCS) > $(OUT) && echo a >> $(OUT)",
                srcs=["in/a.txt"],
                outs=["a.out"],
            )
            + command(
                "leaf_b",
                cmd="cat $(SRCS) > $(OUT) && echo b >> $(OUT)",
                srcs=["in/b.txt"],
                outs=["b.out"],
            )
            + command(
                "top",
                cmd="cat $(location :leaf_a) $(location :leaf_b) > $(OUT)",
                deps=[":leaf_a", ":leaf_b"],
                outs=["top.out"],
            ),
        },
    )


def _state_files(ws: Path) -> list[Path]:
    return sorted((ws / "cache" / "analysis").glob("state-*"))


def _settle(build, ws: Path) -> None:
    """Build until the state holds trusted signatures: a second no-op build more than the racy
    window after the files it records last changed."""
    time.sleep(1.1)
    build(ws, "//:top")
    time.sleep(1.1)
    run = build(ws, "//:top")
    assert run.executed == set() and run.cached == ALL


def _rewrite_same_size_same_mtime(path: Path, text: str) -> None:
    st = os.stat(path)
    assert len(text.encode()) == st.st_size
    path.write_text(text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == st.st_mtime_ns and os.stat(path).st_size == st.st_size


def test_no_op_build_reports_every_action_as_a_hit_with_its_events(build, fanin):
    first = build(fanin, "//:top")
    assert first.executed == ALL
    assert _state_files(fanin), "a successful build records its state"
    again = build(fanin, "//:top")
    assert again.executed == set() and again.cached == ALL
    report = again.json()
    assert report["counts"]["cached"] == 3 and report["counts"]["executed"] == 0
    assert report["targets"]["//:top"]["cache"] == "hit"
    assert (fanin / "out" / "top.out").read_text() == "alpha\na\nbravo\nb\n"
    ids = [e["id"] for e in again.events]
    assert ids == sorted(set(ids))
    keys = {e["label"]: e["key"] for e in first.finished()}
    assert {e["label"]: e["key"] for e in again.finished()} == keys


def test_same_size_rewrite_with_mtime_put_back_rebuilds_right_after_a_build(build, fanin):
    build(fanin, "//:top")
    build(fanin, "//:top")  # NB: the state exists; its signatures are still racy
    _rewrite_same_size_same_mtime(fanin / "in" / "a.txt", "ALPHA\n")
    run = build(fanin, "//:top")
    assert run.executed == {"//:leaf_a", "//:top"}
    assert (fanin / "out" / "top.out").read_text() == "ALPHA\na\nbravo\nb\n"


def test_same_size_rewrite_with_mtime_put_back_rebuilds_once_signatures_are_trusted(build, fanin):
    build(fanin, "//:top")
    _settle(build, fanin)
    _rewrite_same_size_same_mtime(fanin / "in" / "b.txt", "BRAVO\n")
    run = build(fanin, "//:top")
    assert run.executed == {"//:leaf_b", "//:top"}
    assert (fanin / "out" / "top.out").read_text() == "alpha\na\nBRAVO\nb\n"
    assert build(fanin, "//:top").executed == set()


def test_touching_a_source_reruns_nothing(build, fanin):
    build(fanin, "//:top")
    _settle(build, fanin)
    later = time.time() + 5
    os.utime(fanin / "in" / "a.txt", (later, later))
    assert build(fanin, "//:top").executed == set()
    assert build(fanin, "//:top").executed == set()


def test_changing_then_restoring_a_source_serves_the_old_results(build, fanin):
    build(fanin, "//:top")
    _settle(build, fanin)
    (fanin / "in" / "a.txt").write_text("changed, longer\n")
    assert build(fanin, "//:top").executed == {"//:leaf_a", "//:top"}
    (fanin / "in" / "a.txt").write_text("alpha\n")
    run = build(fanin, "//:top")
    assert run.executed == set() and run.cached == ALL
    assert (fanin / "out" / "top.out").read_text() == "alpha\na\nbravo\nb\n"


def test_a_deleted_action_cache_entry_is_rebuilt(build, fanin):
    first = build(fanin, "//:top")
    _settle(build, fanin)
    key = next(e["key"] for e in first.finished() if e["label"] == "//:leaf_a").split("/")[0]
    (fanin / "cache" / "ac" / key[:2] / key).unlink()
    run = build(fanin, "//:top")
    assert run.executed == {"//:leaf_a"}
    assert (fanin / "out" / "top.out").read_text() == "alpha\na\nbravo\nb\n"


def test_an_action_cache_entry_altered_in_place_is_never_trusted(build, fanin):
    """A no-op stats the action cache's 256 shard folders, not every entry: an entry removed
    or replaced (always by unlink or rename) changes its folder. One altered in place by
    something else is not looked at by a build the state serves (the state holds the result,
    whose blobs are checked), and any build that reads it verifies it and runs the action."""
    first = build(fanin, "//:top")
    _settle(build, fanin)
    key = next(e["key"] for e in first.finished() if e["label"] == "//:leaf_a").split("/")[0]
    entry = fanin / "cache" / "ac" / key[:2] / key
    raw = entry.read_bytes()
    os.chmod(entry, 0o644)
    entry.write_bytes(raw.replace(b"alpha", b"ALPHA") if b"alpha" in raw else b"X" * len(raw))
    assert build(fanin, "//:top").executed == set()
    assert (fanin / "out" / "top.out").read_text() == "alpha\na\nbravo\nb\n"
    run = build(fanin, "//:top", env={"RSI_INCREMENTAL": "0"})
    assert run.executed == {"//:leaf_a"}
    assert (fanin / "out" / "top.out").read_text() == "alpha\na\nbravo\nb\n"


def test_a_corrupted_output_blob_is_never_served(build, fanin):
    first = build(fanin, "//:top")
    _settle(build, fanin)
    key = next(e["key"] for e in first.finished() if e["label"] == "//:leaf_a").split("/")[0]
    entry = json.loads((fanin / "cache" / "ac" / key[:2] / key).read_text())
    blob_hash = entry["result"]["outputs"][0][1].split("/")[0]
    blob = fanin / "cache" / "cas" / blob_hash[:2] / blob_hash
    size = blob.stat().st_size
    os.chmod(blob, 0o644)
    blob.write_bytes(b"X" * size)  # NB: same size, in place
    run = build(fanin, "//:top")
    assert "//:leaf_a" in run.executed
    assert (fanin / "out" / "top.out").read_text() == "alpha\na\nbravo\nb\n"


def test_a_changed_declaration_is_analysed_again(build, command, fanin):
    build(fanin, "//:top")
    _settle(build, fanin)
    text = (fanin / "BUILD.toml").read_text().replace("echo a >>", "echo A >>")
    (fanin / "BUILD.toml").write_text(text)
    run = build(fanin, "//:top")
    assert run.executed == {"//:leaf_a", "//:top"}
    assert (fanin / "out" / "top.out").read_text() == "alpha\nA\nbravo\nb\n"


def test_a_deleted_source_fails_the_build_naming_it(build, fanin):
    build(fanin, "//:top")
    _settle(build, fanin)
    (fanin / "in" / "b.txt").unlink()
    run = build(fanin, "//:top", expect=None)
    assert run.returncode != 0
    assert "b.txt" in run.stdout + run.stderr


def test_deleted_output_under_out_is_written_again(build, fanin):
    build(fanin, "//:top")
    _settle(build, fanin)
    (fanin / "out" / "top.out").unlink()
    run = build(fanin, "//:top")
    assert run.executed == set()
    assert (fanin / "out" / "top.out").read_text() == "alpha\na\nbravo\nb\n"


def test_a_build_served_from_the_state_still_gives_its_graph_and_outcomes(fanin):
    """The engine API (the campaign commands read `report.graph` and `report.outcomes`)."""
    from rsi.build import build as run_build
    from rsi.workspace import Workspace

    ws = Workspace.load(fanin)
    first = run_build(ws, ["//:top"], progress=False)
    second = run_build(ws, ["//:top"], progress=False)
    assert first.ok and second.ok
    assert set(second.outcomes) == set(first.outcomes)
    for action_id, outcome in second.outcomes.items():
        assert outcome.status == "hit"
        assert outcome.key == first.outcomes[action_id].key
        want = first.outcomes[action_id].result.output_map
        assert {p: o.digest for p, o in outcome.result.output_map.items()} == {
            p: o.digest for p, o in want.items()
        }
    assert set(second.graph.actions) == set(first.graph.actions)
    assert second.targets["//:top"]["outputs"] == first.targets["//:top"]["outputs"]


def test_one_change_builds_in_a_row_are_served_from_the_state_without_analysis(fanin, monkeypatch):
    """A build after one source changed re-keys only that source's consumers from the state
    (no analysis, no graph walk of the rest) and records a state the next build can use:
    every source keeps all its consumers, whichever actions ran."""
    from rsi import build as build_mod
    from rsi.workspace import Workspace

    ws = Workspace.load(fanin)
    assert build_mod.build(ws, ["//:top"], progress=False).ok
    time.sleep(1.1)  # NB: past the racy window, so the state's signatures stand for content
    assert build_mod.build(ws, ["//:top"], progress=False).counts["executed"] == 0

    def no_analysis(*args, **kwargs):
        raise AssertionError("analysed again, though only a source changed")

    monkeypatch.setattr(build_mod, "analyse", no_analysis)

    def executed() -> set[str]:
        report = build_mod.build(ws, ["//:top"], progress=False)
        assert report.ok
        return {
            report.outcomes[i].id.split("#")[0]
            for i in report.outcomes
            if report.outcomes[i].status == "executed"
        }

    (fanin / "in" / "a.txt").write_text("alpha 2\n")
    assert executed() == {"//:leaf_a", "//:top"}
    (fanin / "in" / "b.txt").write_text("bravo 2\n")
    assert executed() == {"//:leaf_b", "//:top"}
    (fanin / "in" / "a.txt").write_text("alpha 3\n")
    assert executed() == {"//:leaf_a", "//:top"}
    assert executed() == set()
    assert (fanin / "out" / "top.out").read_text() == "alpha 3\na\nbravo 2\nb\n"


def test_a_one_change_build_keys_its_sources_from_the_state_not_the_file_memo(fanin, monkeypatch):
    """The sources the state's check hashed (changed) or vouched for (unchanged, trusted
    signature) are keyed from it: the memo of every file ever read is not loaded (at 100,000
    sources that cost ~130 ms), nothing is hashed twice, and what is built is right."""
    from rsi import build as build_mod
    from rsi.digest import FileDigestMemo
    from rsi.workspace import Workspace

    ws = Workspace.load(fanin)
    assert build_mod.build(ws, ["//:top"], progress=False).ok
    time.sleep(1.1)
    assert build_mod.build(ws, ["//:top"], progress=False).counts["executed"] == 0
    # NB: as if the edit were old: without the state's word the memo would be loaded
    monkeypatch.setattr(FileDigestMemo, "RACY_NS", -1)

    real_entries = FileDigestMemo._entries

    def loaded(self):
        if self.path is not None and self.path.name == "file-memo.json":
            raise AssertionError("the file memo was loaded")
        return real_entries.fget(self)

    monkeypatch.setattr(FileDigestMemo, "_entries", property(loaded))
    hashed: list[str] = []
    from rsi import digest as digest_mod
    from rsi import incremental

    real = digest_mod.digest_file

    def counting(path, *a, **k):
        hashed.append(str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(incremental, "digest_file", counting)
    monkeypatch.setattr(digest_mod, "digest_file", counting)
    (fanin / "in" / "a.txt").write_text("alpha 2\n")
    report = build_mod.build(ws, ["//:top"], progress=False)
    assert report.ok and report.counts["executed"] == 2
    assert (fanin / "out" / "top.out").read_text() == "alpha 2\na\nbravo\nb\n"
    assert hashed.count(str(fanin / "in" / "a.txt")) == 1
    monkeypatch.undo()
    assert build_mod.build(ws, ["//:top"], progress=False).counts["executed"] == 0


def test_why_after_a_build_served_from_the_state_names_the_changed_attribute(build, fanin):
    """A build that ran an action from the state recorded its description and attributes, so
    the next miss can say what changed. Builds whose attributes stayed the same carry the
    recorded ones forward (the target is not read again): twice here, then they change."""
    build(fanin, "//:top")
    _settle(build, fanin)
    (fanin / "in" / "a.txt").write_text("alpha 1\n")
    assert build(fanin, "//:top").executed == {"//:leaf_a", "//:top"}
    (fanin / "in" / "a.txt").write_text("alpha 2\n")
    assert build(fanin, "//:top").executed == {"//:leaf_a", "//:top"}
    text = (fanin / "BUILD.toml").read_text().replace("echo a >>", "echo A >>")
    (fanin / "BUILD.toml").write_text(text)
    run = build(fanin, "//:top")
    assert run.executed == {"//:leaf_a", "//:top"}
    assert "attribute cmd changed" in run.why("//:leaf_a")
    assert (fanin / "out" / "top.out").read_text() == "alpha 2\nA\nbravo\nb\n"


STAMP_RULE = """
from rsi.attrs import attr
from rsi.rule import Provider, Rule


def _stamp(ctx):
    out = ctx.exec_path(ctx.attrs["out"])
    files = ctx.action(
        argv=["/bin/sh", "-c", "echo %s > " + out],
        inputs=[],
        outputs=[ctx.attrs["out"]],
        mnemonic="Stamp",
        env={"PATH": "/usr/bin:/bin"},
    )
    return Provider(files=files)


def rules():
    return [Rule(name="stamp", doc="writes a word", attrs={"out": attr("string", "file")},
                 impl=_stamp)]
"""


def test_a_changed_rule_is_analysed_again(build, make_workspace, tmp_path):
    """The state stands for an analysis made by this code: a rule family's source that
    changed after the state was settled means analysing again."""
    ws = make_workspace(
        tmp_path,
        {
            "BUILD.toml": '[t]\nrule = "stamp"\nout = "t.txt"\n',
            "stamp_rules.py": STAMP_RULE % "one",
        },
        config='[workspace]\nrules = ["stamp_rules:rules"]\n',
    )
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(ws), os.environ.get("PYTHONPATH")) if p)}
    assert build(ws, "//:t", env=env).executed == {"//:t"}
    time.sleep(1.1)
    assert build(ws, "//:t", env=env).executed == set()
    assert build(ws, "//:t", env=env).executed == set()
    (ws / "stamp_rules.py").write_text(STAMP_RULE % "three")
    run = build(ws, "//:t", env=env)
    assert run.executed == {"//:t"}
    assert (ws / "out" / "t.txt").read_text() == "three\n"
    assert build(ws, "//:t", env=env).executed == set()


def test_a_touched_source_is_hashed_again_without_writing_the_state_again(build, fanin):
    """Touching one small source costs its hash, not a new state (at 100,000 actions, writing
    the state is the larger cost); it stays as correct: a later same-size rewrite rebuilds."""
    build(fanin, "//:top")
    _settle(build, fanin)
    (state,) = _state_files(fanin)
    before = (state.stat().st_ino, state.stat().st_mtime_ns)
    later = time.time() + 5
    os.utime(fanin / "in" / "a.txt", (later, later))
    assert build(fanin, "//:top").executed == set()
    assert build(fanin, "//:top").executed == set()
    assert (state.stat().st_ino, state.stat().st_mtime_ns) == before
    _rewrite_same_size_same_mtime(fanin / "in" / "a.txt", "ALPHA\n")
    assert build(fanin, "//:top").executed == {"//:leaf_a", "//:top"}
    assert (fanin / "out" / "top.out").read_text() == "ALPHA\na\nbravo\nb\n"


def test_a_one_change_build_writes_a_delta_beside_the_state_not_the_state(build, fanin):
    """What a build changed goes to `delta-<request>`, which extends the state file it names:
    the state file itself is not rewritten, and a delta naming another state is ignored."""
    build(fanin, "//:top")
    _settle(build, fanin)
    (state,) = _state_files(fanin)
    before = (state.stat().st_ino, state.stat().st_mtime_ns)
    (fanin / "in" / "a.txt").write_text("alpha 2\n")
    assert build(fanin, "//:top").executed == {"//:leaf_a", "//:top"}
    assert (state.stat().st_ino, state.stat().st_mtime_ns) == before
    delta = state.parent / ("delta-" + state.name[len("state-") :])
    assert delta.is_file()
    assert build(fanin, "//:top").executed == set()
    (fanin / "in" / "b.txt").write_text("bravo 2\n")
    assert build(fanin, "//:top").executed == {"//:leaf_b", "//:top"}
    assert build(fanin, "//:top").executed == set()
    assert (fanin / "out" / "top.out").read_text() == "alpha 2\na\nbravo 2\nb\n"
    # NB: the state without its delta is older, never wrong: every claim is checked again
    stale = delta.read_bytes()
    delta.unlink()
    assert build(fanin, "//:top").executed == set()
    assert (fanin / "out" / "top.out").read_text() == "alpha 2\na\nbravo 2\nb\n"
    delta.write_bytes(stale)
    (fanin / "in" / "a.txt").write_text("alpha\n")
    (fanin / "in" / "b.txt").write_text("bravo\n")
    run = build(fanin, "//:top")
    assert run.executed == set() and run.cached == ALL
    assert (fanin / "out" / "top.out").read_text() == "alpha\na\nbravo\nb\n"


def test_an_action_that_says_uncached_serves_its_build_and_runs_again_next_time(
    build, command, make_workspace, tmp_path
):
    """An action whose env sets RSI_UNCACHED_EXIT=75 and exits 75 (a measurement on a busy
    host does) has good outputs for this build: its dependents run and out/ gets them. Nothing
    of it is cached, so the next build runs it again, with or without the build state; the same
    exit without the opt-in is a failure, as any other non-zero exit."""
    counter = tmp_path / "runs"
    counter.mkdir()
    ws = make_workspace(
        tmp_path,
        {
            "BUILD.toml": command(
                "busy",
                cmd="echo measured > $(OUT); exit 75",
                outs=["busy.out"],
                env={"RSI_UNCACHED_EXIT": "75"},
            )
            + command(
                "judge",
                cmd="cat $(location :busy) > $(OUT); echo judged >> $(OUT)",
                deps=[":busy"],
                outs=["judge.out"],
            )
            + command("plain", cmd="echo x > $(OUT); exit 75", outs=["plain.out"]),
        },
    )
    first = build(ws, "//:judge")
    assert first.executed == {"//:busy", "//:judge"}
    assert (ws / "out" / "judge.out").read_text() == "measured\njudged\n"
    assert not _state_files(ws)  # NB: the state would vouch for it: none is kept
    time.sleep(1.1)
    second = build(ws, "//:judge")
    assert "//:busy" in second.executed  # NB: not served from the cache
    assert second.cached == {"//:judge"}  # NB: same outputs, so the judge's key is the same
    failed = build(ws, "//:plain", expect=None)
    assert failed.returncode == 1
