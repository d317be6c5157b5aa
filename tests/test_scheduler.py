"""The scheduler through real builds: exactly the changed part reruns, early cutoff, parallelism
within resource classes, --keep-going, and an event stream that says why each miss missed."""

from __future__ import annotations

import os
import time

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bwrap")]

ALL = {"//:leaf_a", "//:leaf_b", "//:mid", "//:top"}


@pytest.fixture
def diamond(command, make_workspace, tmp_path):
    """leaf_a -> mid -> top <- leaf_b, each leaf reading one source file."""
    return make_workspace(
        tmp_path,
        {
            "in/a.txt": "alpha\n",
            "in/b.txt": "beta\n",
            "BUILD.toml": command(
                "leaf_a", cmd="tr a-z A-Z < $(SRCS) > $(OUT)", srcs=["in/a.txt"], outs=["a.out"]
            )
            + command(
                "leaf_b", cmd="tr a-z A-Z < $(SRCS) > $(OUT)", srcs=["in/b.txt"], outs=["b.out"]
            )
            + command(
                "mid",
                cmd="sed s/^/mid:/ $(location :leaf_a) > $(OUT)",
                deps=[":leaf_a"],
                outs=["mid.out"],
            )
            + command(
                "top",
                cmd="cat $(location :mid) $(location :leaf_b) > $(OUT)",
                deps=[":mid", ":leaf_b"],
                outs=["top.out"],
            ),
        },
    )


def test_first_build_runs_everything_and_writes_outputs(build, diamond):
    run = build(diamond, "//:top")
    assert run.executed == ALL
    assert run.json()["counts"] == {
        "actions": 4,
        "cached": 0,
        "executed": 4,
        "failed": 0,
        "skipped": 0,
        "incompatible": 0,
    }
    assert (diamond / "out" / "top.out").read_text() == "mid:ALPHA\nBETA\n"


def test_second_build_runs_nothing(build, diamond):
    build(diamond, "//:top")
    run = build(diamond, "//:top")
    assert run.executed == set() and run.cached == ALL
    assert run.json()["targets"]["//:top"]["cache"] == "hit"


def test_changing_one_leaf_input_reruns_exactly_its_downstream(build, diamond):
    build(diamond, "//:top")
    (diamond / "in" / "a.txt").write_text("gamma\n")
    run = build(diamond, "//:top")
    assert run.executed == {"//:leaf_a", "//:mid", "//:top"}
    assert run.cached == {"//:leaf_b"}
    assert (diamond / "out" / "top.out").read_text() == "mid:GAMMA\nBETA\n"


def test_touching_mtime_reruns_nothing(build, diamond):
    build(diamond, "//:top")
    future = time.time() + 3600
    for name in ("a.txt", "b.txt"):
        os.utime(diamond / "in" / name, (future, future))
    (diamond / "BUILD.toml").touch()
    run = build(diamond, "//:top")
    assert run.executed == set()


def test_rewriting_identical_content_reruns_nothing(build, diamond):
    build(diamond, "//:top")
    (diamond / "in" / "a.txt").unlink()
    (diamond / "in" / "a.txt").write_text("alpha\n")
    assert build(diamond, "//:top").executed == set()


def test_reverting_a_change_is_served_from_the_cache(build, diamond):
    build(diamond, "//:top")
    (diamond / "in" / "a.txt").write_text("changed\n")
    assert build(diamond, "//:top").executed == {"//:leaf_a", "//:mid", "//:top"}
    (diamond / "in" / "a.txt").write_text("alpha\n")
    run = build(diamond, "//:top")
    assert run.executed == set() and run.cached == ALL
    assert (diamond / "out" / "top.out").read_text() == "mid:ALPHA\nBETA\n"


def test_early_cutoff_keeps_downstream_cached_when_output_is_identical(
    build,
    command,
    make_workspace,
    tmp_path,
):
    ws = make_workspace(
        tmp_path,
        {
            "src.txt": "12345\n",
            "BUILD.toml": command(
                "length", cmd="wc -c < $(SRCS) > $(OUT)", srcs=["src.txt"], outs=["len.txt"]
            )
            + command(
                "report",
                cmd="echo length=`cat $(location :length)` > $(OUT)",
                deps=[":length"],
                outs=["report.txt"],
            ),
        },
    )
    build(ws, "//:report")
    (ws / "src.txt").write_text("54321\n")  # same length: `length` reruns, same output
    run = build(ws, "//:report")
    assert run.executed == {"//:length"}
    assert run.cached == {"//:report"}
    assert (ws / "out" / "report.txt").read_text() == "length=6\n"


def test_an_edited_copy_under_out_is_restored_from_the_cache(build, diamond):
    build(diamond, "//:top")
    (diamond / "out" / "top.out").write_text("tampered\n")
    run = build(diamond, "//:top")
    assert run.executed == set()
    assert (diamond / "out" / "top.out").read_text() == "mid:ALPHA\nBETA\n"


def test_dependency_outputs_not_consumed_by_a_target_do_not_rebuild_it(build, diamond):
    build(diamond, "//:top")
    (diamond / "in" / "b.txt").write_text("delta\n")
    run = build(diamond, "//:mid")
    assert run.executed == set()  # //:mid does not depend on leaf_b


# --------------------------------------------------------------------------- salt


def test_salt_in_rsi_toml_invalidates_every_key(build, diamond):
    build(diamond, "//:top")
    (diamond / "rsi.toml").write_text('[workspace]\nsalt = "v2"\n')
    run = build(diamond, "//:top")
    assert run.executed == ALL
    assert any("salt changed" in reason for reason in run.why("//:leaf_a"))
    assert build(diamond, "//:top").executed == set()


def test_salt_on_the_command_line_invalidates_every_key(build, diamond):
    build(diamond, "//:top")
    assert build(diamond, "//:top", "--salt", "experiment-7").executed == ALL
    assert build(diamond, "//:top", "--salt", "experiment-7").executed == set()
    assert build(diamond, "//:top").executed == set()  # unsalted results are still there


# --------------------------------------------------------------------------- parallelism


def _interval(path) -> tuple[int, int]:
    start, end = (int(x) for x in path.read_text().split())
    assert start <= end
    return start, end


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


@pytest.fixture
def timed(command):
    """A target whose action records when it started and ended (ns), sleeping in between."""

    def target(name: str, sleep: float, **extra) -> str:
        return command(
            name,
            cmd=f"date +%s%N > $(OUT); sleep {sleep}; date +%s%N >> $(OUT)",
            outs=[f"{name}.t"],
            **extra,
        )

    return target


def test_jobs_2_runs_independent_actions_in_parallel(build, make_workspace, timed, tmp_path):
    ws = make_workspace(tmp_path, {"BUILD.toml": timed("p1", 1) + timed("p2", 1)})
    build(ws, "--jobs", "2", "//:p1", "//:p2")
    assert _overlap(_interval(ws / "out" / "p1.t"), _interval(ws / "out" / "p2.t"))
    run = build(ws, "--jobs", "1", "--salt", "serial", "//:p1", "//:p2")
    assert run.executed == {"//:p1", "//:p2"}
    assert not _overlap(_interval(ws / "out" / "p1.t"), _interval(ws / "out" / "p2.t"))


def test_jobs_is_the_most_commands_running_at_once(build, make_workspace, timed, tmp_path):
    """Six independent actions at `--jobs 2`: two commands at a time, never three."""
    ws = make_workspace(tmp_path, {"BUILD.toml": "".join(timed(f"q{i}", 0.3) for i in range(6))})
    run = build(ws, "--jobs", "2", "//:all")
    assert len(run.executed) == 6
    spans = [_interval(ws / "out" / f"q{i}.t") for i in range(6)]
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    assert most == 2, spans


def test_exclusive_action_never_overlaps_another(build, make_workspace, timed, tmp_path):
    ws = make_workspace(
        tmp_path,
        {
            "BUILD.toml": timed("bench", 0.3, tags=["exclusive"])
            + "".join(timed(f"n{i}", 0.5) for i in range(3))
        },
    )
    run = build(ws, "--jobs", "4", "//:all")
    assert len(run.executed) == 4
    bench = _interval(ws / "out" / "bench.t")
    others = [_interval(ws / "out" / f"n{i}.t") for i in range(3)]
    assert not any(_overlap(bench, other) for other in others)
    assert any(_overlap(a, b) for i, a in enumerate(others) for b in others[i + 1 :])
    started = [e for e in run.events if e["kind"] == "action_started"]
    assert [e["exclusive"] for e in started if e["label"] == "//:bench"] == [True]


# --------------------------------------------------------------------------- failures


@pytest.fixture
def failing(command, make_workspace, tmp_path):
    return make_workspace(
        tmp_path,
        {
            "BUILD.toml": command("a_fail", cmd="exit 3", outs=["a"])
            + command("b_ok", cmd="echo ok > $(OUT)", outs=["b"])
            + command("c_down", cmd="cat $(SRCS) > $(OUT)", deps=[":a_fail"], outs=["c"])
        },
    )


def test_without_keep_going_the_build_stops_at_the_first_failure(build, failing):
    run = build(failing, "--jobs", "1", "//:all", expect=1)
    report = run.json()
    assert report["ok"] is False
    assert run.executed == set()
    assert {e["label"] for e in run.finished()} == {"//:a_fail"}
    assert report["targets"]["//:b_ok"]["ok"] is False
    assert report["counts"]["skipped"] == 2
    assert not (failing / "out" / "b").exists()


def test_keep_going_builds_everything_not_downstream_of_a_failure(build, failing):
    run = build(failing, "--jobs", "1", "--keep-going", "//:all", expect=1)
    report = run.json()
    assert run.executed == {"//:b_ok"}
    assert report["targets"]["//:b_ok"]["ok"] is True
    failed = [e for e in run.finished() if e["status"] == "failed"]
    assert [(e["label"], e["exit_code"]) for e in failed] == [("//:a_fail", 3)]
    skipped = [e for e in run.events if e["kind"] == "action_skipped"]
    assert [(e["label"], e["because"]) for e in skipped] == [("//:c_down", "//:a_fail#Command")]
    assert (failing / "out" / "b").read_text() == "ok\n"


def test_failed_action_is_not_cached(build, failing):
    build(failing, "//:a_fail", expect=1)
    run = build(failing, "//:a_fail", expect=1)
    assert [e["cache"] for e in run.finished()] == ["miss"]


# --------------------------------------------------------------------------- event stream


def test_event_stream_lines_have_schema_id_parent_and_kind(build, read_events, diamond):
    run = build(diamond, "//:top")
    events = run.events
    assert events[0]["kind"] == "build_started" and events[0]["parent"] is None
    assert events[-1]["kind"] == "build_finished" and events[-1]["ok"] is True
    ids = [e["id"] for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    for e in events:
        assert e["schema"] == "rsi.events/1"
        assert isinstance(e["kind"], str)
        if e is not events[0]:
            assert e["parent"] in ids[: ids.index(e["id"])]
    started = {e["id"]: e for e in events if e["kind"] == "action_started"}
    for e in run.finished():
        assert e["parent"] in started and started[e["parent"]]["action"] == e["action"]
    log = diamond / "cache" / "events" / f"{events[0]['build_id']}.jsonl"
    assert read_events(log) == events  # the store keeps the same stream


def test_miss_says_which_input_changed(build, diamond):
    build(diamond, "//:top")
    (diamond / "in" / "a.txt").write_text("changed\n")
    run = build(diamond, "//:top")
    assert any(r.startswith("input in/a.txt content changed") for r in run.why("//:leaf_a"))
    assert any(r.startswith("input a.out content changed") for r in run.why("//:mid"))
    assert all("in/a.txt" not in r for r in run.why("//:top"))


def test_miss_says_which_env_changed(build, command, make_workspace, tmp_path):
    def ws_with(mode: str):
        return make_workspace(
            tmp_path,
            {"BUILD.toml": command("t", cmd="echo $MODE > $(OUT)", outs=["t"], env={"MODE": mode})},
        )

    ws = ws_with("fast")
    build(ws, "//:t")
    ws_with("slow")
    run = build(ws, "//:t")
    assert "env MODE changed ('fast' -> 'slow')" in run.why("//:t")
    assert (ws / "out" / "t").read_text() == "slow\n"


def test_miss_says_the_target_attributes_changed(build, diamond):
    build(diamond, "//:top")
    text = (diamond / "BUILD.toml").read_text().replace("sed s/^/mid:/", "sed s/^/MID:/")
    (diamond / "BUILD.toml").write_text(text)
    run = build(diamond, "//:top")
    assert run.executed == {"//:mid", "//:top"}
    why = run.why("//:mid")
    assert "attribute cmd changed" in why and "argv changed" in why


def test_first_build_of_an_action_says_so(build, diamond):
    run = build(diamond, "//:leaf_a")
    assert run.why("//:leaf_a") == ["no earlier build of this action is recorded"]


def test_identical_actions_of_two_targets_are_shared_and_run_once(tmp_path, make_workspace):
    """Like Bazel's shared actions: the same action (same outputs, same everything) declared by
    two targets is one node in the action graph; a different action on that path is an error."""
    ws = make_workspace(tmp_path, {})
    from rsi.analysis import analyze
    from rsi.loader import Loader
    from rsi.registry import load_rules
    from rsi.label import Label
    from rsi.store import LocalStore
    from rsi.rule import Rule, Provider
    from rsi.attrs import attr
    from rsi.errors import DeclarationError

    def impl(ctx):
        out = ctx.action(
            argv=["sh", "-c", f"echo {ctx.attrs['text']} > shared.txt"],
            inputs=[],
            outputs=["shared.txt"],
            mnemonic="Write",
        )
        return Provider(files=out)

    writer = Rule("writer", {"text": attr("string", "")}, impl, doc="test")
    (ws / "BUILD.toml").write_text(
        '[a]\nrule = "writer"\ntext = "same"\n'
        '[b]\nrule = "writer"\ntext = "same"\n'
        '[c]\nrule = "writer"\ntext = "other"\n'
    )
    store = LocalStore(tmp_path / "store")
    loader = Loader(ws, {**load_rules(), "writer": writer})
    graph = analyze(
        loader, [Label("", "a"), Label("", "b")], store_put=store.put_bytes, settings={}
    )
    assert len(graph.actions) == 1
    assert graph.actions_for([Label("", "a")]) == graph.actions_for([Label("", "b")])
    with pytest.raises(DeclarationError, match="also declared by //:a"):
        analyze(
            Loader(ws, {**load_rules(), "writer": writer}),
            [Label("", "a"), Label("", "c")],
            store_put=store.put_bytes,
            settings={},
        )


def test_changing_a_sources_mode_or_deleting_it_is_seen_through_the_analysis_cache(
    tmp_path, make_workspace, build, run_rsi
):
    """Existence and the executable bit are read at analysis; a cached analysis must notice."""
    ws = make_workspace(
        tmp_path,
        {
            "run.sh": "echo hi\n",
            "BUILD.toml": '[t]\nrule = "command"\nsrcs = ["run.sh"]\nouts = ["o"]\n'
            'cmd = "ls -l $(SRCS) | cut -c1-10 > $(OUT)"\n',
        },
    )
    build(ws, "//:t")
    os.chmod(ws / "run.sh", 0o755)
    again = build(ws, "//:t")
    assert again.executed == {"//:t"}
    assert any("executable bit" in w for w in again.why("//:t"))
    assert (ws / "out" / "o").read_text().startswith("-r-x")
    (ws / "run.sh").unlink()
    gone = run_rsi(ws, "build", "//:t")
    assert gone.returncode == 2 and "run.sh" in gone.stderr


def test_action_cache_entries_are_group_committed_after_their_blobs_are_synced(
    diamond, monkeypatch
):
    """No fsync per file during a run: one store sync, then a batch of entries. Each entry is
    written only after a sync that came after its own output blobs were written."""
    from rsi import build as build_mod
    from rsi.store import LocalStore
    from rsi.workspace import Workspace

    calls: list[tuple] = []
    real_sync, real_put, real_file = (
        LocalStore.sync,
        LocalStore.put_action_result,
        LocalStore.put_file,
    )

    def sync(self):
        calls.append(("sync",))
        return real_sync(self)

    def put_action_result(self, key, result):
        calls.append(("ac", {o.digest for o in result.outputs}))
        return real_put(self, key, result)

    def put_file(self, src, **kw):
        digest = real_file(self, src, **kw)
        calls.append(("blob", digest, self.sync_each))
        return digest

    monkeypatch.setattr(LocalStore, "sync", sync)
    monkeypatch.setattr(LocalStore, "put_action_result", put_action_result)
    monkeypatch.setattr(LocalStore, "put_file", put_file)
    report = build_mod.build(Workspace.discover(diamond), ["//:top"], progress=False)
    assert report.ok and report.counts["executed"] == 4
    entries = [i for i, c in enumerate(calls) if c[0] == "ac"]
    assert len(entries) == 4
    for i in entries:
        for digest in calls[i][1]:
            j = next(k for k, c in enumerate(calls) if c[0] == "blob" and c[1] == digest)
            assert any(calls[k][0] == "sync" for k in range(j + 1, i)), calls
    assert all(c[2] is False for c in calls if c[0] == "blob")  # NB: no per-blob fsync
    assert calls[-1] == ("sync",)
