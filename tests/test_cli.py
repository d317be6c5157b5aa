"""The `rsi` command line, run as a real subprocess: build, query, graph, why, cache *, --json
output and the exit codes 0 (success), 1 (build failure or corrupt store), 2 (usage/declaration)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bwrap")]


@pytest.fixture
def ws(command, make_workspace, tmp_path):
    """gen (reads src.txt) -> use -> final; other is independent."""
    return make_workspace(
        tmp_path,
        {
            "src.txt": "hello\n",
            "BUILD.toml": command(
                "gen", cmd="tr a-z A-Z < $(SRCS) > $(OUT)", srcs=["src.txt"], outs=["gen.txt"]
            )
            + command(
                "use",
                cmd="cat $(location :gen) > $(OUT); echo used >> $(OUT)",
                deps=[":gen"],
                outs=["use.txt"],
            )
            + command("other", cmd="echo other > $(OUT)", outs=["other.txt"]),
            "sub/BUILD.toml": command(
                "final", cmd="cat $(location //:use) > $(OUT)", deps=["//:use"], outs=["final.txt"]
            ),
        },
    )


def _store_files(ws: Path) -> list[str]:
    root = ws / "cache"
    return sorted(
        str(p.relative_to(root))
        for sub in ("cas", "ac")
        for p in (root / sub).rglob("*")
        if p.is_file()
    )


# ------------------------------------------------------------------------------ build


def test_build_exits_0_and_prints_outputs(run_rsi, ws):
    run = run_rsi(ws, "build", "//sub:final")
    assert run.returncode == 0, run
    assert "//sub:final: ok (miss)" in run.stdout
    assert str(ws / "out" / "sub" / "final.txt") in run.stdout
    assert (ws / "out" / "sub" / "final.txt").read_text() == "HELLO\nused\n"


def test_build_json_report_parses(build, ws):
    report = build(ws, "//...").json()
    assert report["schema"] == "rsi.build_report/1" and report["ok"] is True
    assert set(report["targets"]) == {"//:gen", "//:use", "//:other", "//sub:final"}
    assert report["counts"]["executed"] == 4
    assert Path(report["events"]).is_file()
    target = report["targets"]["//:gen"]
    assert target["ok"] and target["cache"] == "miss" and target["failed"] == []


def test_build_exits_1_when_an_action_fails(build, command, make_workspace, run_rsi, tmp_path):
    ws = make_workspace(
        tmp_path, {"BUILD.toml": command("bad", cmd="echo oops >&2; exit 4", outs=["o"])}
    )
    run = run_rsi(ws, "build", "//:bad")
    assert run.returncode == 1, run
    assert "//:bad: FAILED" in run.stdout
    assert "//:bad#Command" in run.stdout + run.stderr
    report = build(ws, "//:bad", expect=1).json()
    assert report["ok"] is False and report["targets"]["//:bad"]["failed"]


@pytest.mark.parametrize(
    "args,needle",
    [
        (["build", "//:nope"], "no target //:nope"),
        (["build", "not-a-label"], "not a label"),
        (["build", "//missing:x"], "no package //missing"),
        (["build", "--no-such-option", "//:gen"], "No such option"),
        (["build"], "Missing argument"),
        (["build", "--jobs", "0", "//:gen"], "--jobs"),
        (["query", "deps(//:gen"], "cannot parse query"),
        (["query", "kind(//:gen)"], "kind takes two arguments"),
        (["graph", "--format", "svg", "//:gen"], "svg"),
        (["cache", "show", "nothing-matches"], "nothing in the cache matches"),
    ],
)
def test_usage_errors_exit_2(run_rsi, ws, args, needle):
    run = run_rsi(ws, *args)
    assert run.returncode == 2, run
    assert needle in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize(
    "args,needle",
    [
        (["build", "//:nope"], "no target //:nope"),
        (["build", "//missing:x"], "no package //missing"),
        (["build", "--no-such-option", "//:gen"], "No such option"),
        (["build"], "Missing argument"),
        (["build", "--jobs", "0", "//:gen"], "--jobs"),
        (["query", "deps(//:gen"], "cannot parse query"),
        (["cache", "show", "nothing-matches"], "nothing in the cache matches"),
    ],
)
def test_under_json_a_refusal_is_a_json_error_document_too(run_rsi, ws, args, needle):
    """An agent asking for --json gets the refusal as rsi.error/1 on stdout, with the same exit
    code; a person still reads the line on stderr; nothing is built or lost."""
    run_rsi(ws, "build", "//:gen")
    before = _store_files(ws)
    run = run_rsi(ws, *args, "--json")
    assert run.returncode == 2, run
    doc = json.loads(run.stdout)
    assert doc["schema"] == "rsi.error/1" and doc["state"] == "error"
    assert doc["exit_code"] == 2 and doc["command"] == " ".join(
        args[:2] if args[0] == "cache" else args[:1]
    )
    assert needle in doc["error"]["message"] and doc["error"]["code"]
    assert needle in run.stderr and "Traceback" not in run.stderr
    assert _store_files(ws) == before


def test_under_json_a_declaration_error_names_its_file_target_and_field(run_rsi, ws):
    build_file = ws / "sub" / "BUILD.toml"
    build_file.write_text(
        build_file.read_text() + '\n[broken]\nrule = "command"\ncmd = 3\nouts = ["b.txt"]\n'
    )
    run = run_rsi(ws, "build", "//sub:final", "--json")
    assert run.returncode == 2, run
    err = json.loads(run.stdout)["error"]
    assert err["code"] == "DeclarationError"
    assert err["file"].endswith("sub/BUILD.toml") and err["target"] == "//sub:broken"
    assert err["field"] == "cmd" and "sub/BUILD.toml" not in err["message"]
    run = run_rsi(ws, "build", "//sub:final")  # NB: without --json: text only, as before
    assert run.returncode == 2 and run.stdout == "" and "field 'cmd'" in run.stderr


def test_outside_a_workspace_is_a_usage_error(run_rsi, tmp_path):
    run = run_rsi(tmp_path, "build", "//:x", cwd=tmp_path)
    assert run.returncode == 2 and "not inside an rsi workspace" in run.stderr


def test_unknown_setting_in_rsi_toml_is_a_usage_error(make_workspace, run_rsi, tmp_path):
    ws = make_workspace(tmp_path, {"BUILD.toml": ""}, config="[workspace]\nsallt = 'x'\n")
    run = run_rsi(ws, "build", "//...")
    assert run.returncode == 2 and "sallt" in run.stderr and "rsi.toml" in run.stderr


def test_workspace_option_works_from_anywhere(run_rsi, ws, tmp_path):
    run = run_rsi(ws, "-C", str(ws), "build", "//:gen", cwd=tmp_path)
    assert run.returncode == 0, run


def test_store_option_puts_the_cache_elsewhere(run_rsi, ws, tmp_path):
    store = tmp_path / "elsewhere"
    assert run_rsi(ws, "--store", str(store), "build", "//:gen").returncode == 0
    assert (store / "STORE.json").is_file() and not (ws / "cache").exists()


# ------------------------------------------------------------------------------ query / graph


@pytest.fixture
def query(run_rsi):
    """`rsi query EXPR --json` in a workspace, as a list of labels."""

    def run(ws, expr: str) -> list[str]:
        got = run_rsi(ws, "query", expr, "--json")
        assert got.returncode == 0, got
        return [row["label"] for row in got.json()]

    return run


def test_query_pattern_lists_targets(query, run_rsi, ws):
    assert sorted(query(ws, "//...")) == ["//:gen", "//:other", "//:use", "//sub:final"]
    assert run_rsi(ws, "query", "//sub:all").stdout.split() == ["//sub:final"]


def test_query_deps_is_transitive_and_includes_the_target(query, ws):
    assert query(ws, "deps(//sub:final)") == ["//:gen", "//:use", "//sub:final"]


def test_query_rdeps_finds_dependents_across_packages(query, ws):
    assert query(ws, "rdeps(//:gen)") == ["//:gen", "//:use", "//sub:final"]
    assert query(ws, "rdeps(//:other)") == ["//:other"]


def test_query_kind_filters_by_rule(query, run_rsi, ws):
    assert query(ws, "kind(command, deps(//:use))") == ["//:gen", "//:use"]
    assert query(ws, "kind(nosuchrule, //...)") == []
    rows = run_rsi(ws, "query", "//:gen", "--json").json()
    assert rows == [{"label": "//:gen", "rule": "command"}]


def test_graph_dot_lists_nodes_and_dependency_edges(run_rsi, ws):
    run = run_rsi(ws, "graph", "//sub:final")
    assert run.returncode == 0, run
    lines = [line.strip() for line in run.stdout.splitlines()]
    assert lines[0] == "digraph rsi {" and lines[-1] == "}"
    assert '"//:gen" -> "//:use";' in lines and '"//:use" -> "//sub:final";' in lines
    assert '"//:other";' not in lines


def test_graph_json_parses(run_rsi, ws):
    doc = run_rsi(ws, "graph", "--format", "json", "//sub:final").json()
    assert doc["nodes"] == ["//:gen", "//:use", "//sub:final"]
    assert {(e["from"], e["to"]) for e in doc["edges"]} == {
        ("//:gen", "//:use"),
        ("//:use", "//sub:final"),
    }


def test_graph_of_actions(run_rsi, ws):
    doc = run_rsi(ws, "graph", "--actions", "--format", "json", "//:use").json()
    assert doc["nodes"] == ["//:gen#Command", "//:use#Command"]
    assert doc["edges"] == [{"from": "//:gen#Command", "to": "//:use#Command"}]


# ------------------------------------------------------------------------------ why


def test_why_names_the_changed_input(build, run_rsi, ws):
    build(ws, "//:use")
    (ws / "src.txt").write_text("changed\n")
    build(ws, "//:use")
    run = run_rsi(ws, "why", "//:use")
    assert run.returncode == 0, run
    assert "ran //:gen#Command" in run.stdout
    assert "input src.txt content changed" in run.stdout
    doc = run_rsi(ws, "why", "//:use", "--json").json()
    assert doc["fully_cached"] is False
    reasons = {a["action"]: a["why"] for a in doc["ran"]}
    assert any(r.startswith("input gen.txt content changed") for r in reasons["//:use#Command"])


def test_why_names_the_changed_attribute(build, run_rsi, ws):
    build(ws, "//:other")
    text = (ws / "BUILD.toml").read_text().replace("echo other", "echo OTHER")
    (ws / "BUILD.toml").write_text(text)
    build(ws, "//:other")
    run = run_rsi(ws, "why", "//:other")
    assert "attribute cmd changed" in run.stdout and "argv changed" in run.stdout


def test_why_of_a_label_that_names_no_target_exits_2_saying_so(build, run_rsi, ws):
    build(ws, "//:use")
    for label, words in (("//:nope", "no target //:nope"), ("//nopkg:x", "no package //nopkg")):
        run = run_rsi(ws, "why", label)
        assert run.returncode == 2 and words in run.stderr and "Traceback" not in run.stderr
        doc = run_rsi(ws, "why", label, "--json").json()
        assert doc["exit_code"] == 2 and words in doc["error"]["message"]
    # NB: a target that exists but was never built is no mistake
    run = run_rsi(ws, "why", "//:other")
    assert run.returncode == 0 and "no build of it is recorded" in run.stdout, run


def test_why_says_fully_cached(build, run_rsi, ws):
    build(ws, "//:use")
    build(ws, "//:use")
    run = run_rsi(ws, "why", "//:use")
    assert "fully cached" in run.stdout
    assert run_rsi(ws, "why", "//:use", "--json").json()["fully_cached"] is True


def test_why_tells_only_the_targets_own_story(build, run_rsi, ws):
    build(ws, "//...")
    (ws / "src.txt").write_text("changed\n")
    build(ws, "//...")  # gen, use, final rerun; other is cached
    other = run_rsi(ws, "why", "//:other", "--json").json()
    assert other["fully_cached"] is True and other["ran"] == [] and other["cached"] == 1
    use = run_rsi(ws, "why", "//:use", "--json").json()
    assert sorted(a["action"] for a in use["ran"]) == ["//:gen#Command", "//:use#Command"]


def test_why_for_a_target_never_built(run_rsi, ws):
    run = run_rsi(ws, "why", "//:other")
    assert run.returncode == 0 and "no build of it is recorded" in run.stdout


# ------------------------------------------------------------------------------ cache


def test_cache_ls_show_stats(build, run_rsi, ws):
    build(ws, "//:use")
    rows = run_rsi(ws, "cache", "ls", "--json").json()
    assert sorted(r["action"] for r in rows) == ["//:gen#Command", "//:use#Command"]
    assert all(r["exit_code"] == 0 and r["outputs"] == 1 and not r["corrupt"] for r in rows)
    shown = run_rsi(ws, "cache", "show", "//:gen", "--json").json()
    assert shown["action"] == "//:gen#Command"
    assert shown["description"]["inputs"].keys() == {"src.txt"}
    assert shown["result"]["exit_code"] == 0
    key_prefix = shown["key"][:10]
    assert run_rsi(ws, "cache", "show", key_prefix, "--json").json()["key"] == shown["key"]
    stats = run_rsi(ws, "cache", "stats", "--json").json()
    assert stats["action_results"] == 2 and stats["blobs"] > 0 and stats["builds_logged"] == 1
    human = run_rsi(ws, "cache", "stats")
    assert human.returncode == 0 and "action_results: 2" in human.stdout


def test_cache_ls_on_an_empty_store(run_rsi, ws):
    run = run_rsi(ws, "cache", "ls")
    assert run.returncode == 0 and "(empty)" in run.stdout


def test_cache_verify_clean_exits_0(build, run_rsi, ws):
    build(ws, "//...")
    run = run_rsi(ws, "cache", "verify", "--json")
    assert run.returncode == 0, run
    doc = run.json()
    assert doc["clean"] is True and doc["actions"] == 4 and doc["blobs"] > 4


def test_cache_gc_keeps_what_the_workspace_reaches_and_removes_the_rest(build, run_rsi, ws):
    first = build(ws, "//...")
    (ws / "src.txt").write_text("changed\n")  # gen, use and final get new keys
    text = (ws / "BUILD.toml").read_text()
    (ws / "BUILD.toml").write_text(text[: text.index("[other]")])  # //:other is gone
    second = build(ws, "//...")
    old_keys = {e["key"].split("/")[0] for e in first.finished()}
    live_keys = {e["key"].split("/")[0] for e in second.finished()}
    assert len(old_keys) == 4 and len(live_keys) == 3 and not old_keys & live_keys

    before = _store_files(ws)
    dry = run_rsi(ws, "cache", "gc", "--dry-run", "--json")
    assert dry.returncode == 0, dry
    plan = dry.json()
    assert plan["dry_run"] is True
    assert set(plan["removed_actions"]) == old_keys
    assert _store_files(ws) == before  # --dry-run removes nothing

    done = run_rsi(ws, "cache", "gc", "--json").json()
    assert set(done["removed_actions"]) == old_keys
    assert done["kept_actions"] == 3
    assert done["removed_blobs"] == plan["removed_blobs"]
    after = _store_files(ws)
    assert {f.rsplit("/", 1)[1] for f in after if f.startswith("ac/")} == live_keys
    assert all(f"cas/{b[:2]}/{b}" not in after for b in done["removed_blobs"])
    assert run_rsi(ws, "cache", "verify").returncode == 0
    again = build(ws, "//...")
    assert again.executed == set()  # everything the workspace reaches was kept
    assert (ws / "out" / "sub" / "final.txt").read_text() == "CHANGED\nused\n"


def test_cache_gc_human_dry_run_lists_entries(build, run_rsi, ws):
    build(ws, "//:gen")
    (ws / "src.txt").write_text("changed\n")
    build(ws, "//:gen")
    run = run_rsi(ws, "cache", "gc", "--dry-run")
    assert run.returncode == 0 and "would remove 1 action results" in run.stdout
    assert "\n  ac  " in run.stdout


def test_version_and_help(run_rsi, ws):
    assert run_rsi(ws, "--version").returncode == 0
    help_text = run_rsi(ws, "--help").stdout
    assert "Exit codes" in help_text and "build" in help_text


def test_json_outputs_all_parse(build, run_rsi, ws):
    build(ws, "//...")
    for args in (
        ["query", "//...", "--json"],
        ["graph", "--format", "json", "//..."],
        ["why", "//:gen", "--json"],
        ["cache", "ls", "--json"],
        ["cache", "show", "//:gen", "--json"],
        ["cache", "verify", "--json"],
        ["cache", "stats", "--json"],
        ["cache", "gc", "--dry-run", "--json"],
    ):
        run = run_rsi(ws, *args)
        assert run.returncode == 0, run
        json.loads(run.stdout)


def test_cache_gc_keeps_blobs_a_campaign_log_names_even_before_they_are_built(
    tmp_path, make_workspace, run_rsi
):
    """A candidate appended to a campaign's log but not built yet is referenced only by the
    log; gc must treat every digest a log names as a root."""
    from rsi.store import LocalStore

    ws = make_workspace(tmp_path, {"BUILD.toml": ""})
    store = LocalStore(ws / "cache")
    logged = store.put_bytes(b"def kernel(x):\n    return x\n")
    stray = store.put_bytes(b"nobody names me\n")
    log = store.root / "campaigns" / "abc" / "log.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text(
        json.dumps({"kind": "candidate", "files": {"kernel.py": str(logged)}})
        + "\n"
        + '{"kind": "cand'
    )  # NB: a torn last line from a crashed writer
    run = run_rsi(ws, "cache", "gc", "--json")
    assert run.returncode == 0, str(run)
    assert store.has(logged)
    assert not store.has(stray)
