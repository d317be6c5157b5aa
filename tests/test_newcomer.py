"""A newcomer's first hour: what a fresh clone must get right before anything is built.

Plain set-up installs what the README's commands need (the sandbox and toolchain builds); a
binding whose task's framework the interpreter lacks is refused at analysis naming the task,
the framework and rsi's extra that installs it; `rsi rules` shows every attribute; every
`judge.state` the code emits is documented; and gc asks the rule families for their roots
(`rsi.gc_roots`) instead of knowing about campaigns.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from rsi.analysis import analyze
from rsi.analysis_cache import Tracker
from rsi.digest import FileDigestMemo, digest_bytes
from rsi.errors import EXIT_USAGE, DeclarationError, RsiError
from rsi.label import Label
from rsi.loader import Loader
from rsi.registry import describe_rules, load_rules

ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------- set-up


def _setup_packages(tmp_path: Path, *args: str) -> list[str]:
    """The Debian packages scripts/setup.sh wants on a machine that has none of them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("dirname",):
        if not (bin_dir / tool).exists():
            (bin_dir / tool).symlink_to(shutil.which(tool))
    proc = subprocess.run(
        ["/bin/bash", str(ROOT / "scripts" / "setup.sh"), "--print-packages", *args],
        env={"PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


@pytest.mark.fast
def test_plain_setup_installs_the_sandbox_and_what_toolchain_builds_need(tmp_path):
    plain = _setup_packages(tmp_path)
    assert "bubblewrap" in plain and "mmdebstrap" in plain, plain
    assert "docker.io" not in plain  # NB: only the tests need a Docker engine
    test = set(_setup_packages(tmp_path, "--test"))
    assert {"bubblewrap", "mmdebstrap", "docker.io"} <= test
    # NB: the Slurm executor's tests run a real one-node cluster; plain use needs none
    assert {"slurmctld", "slurmd", "munge", "slurm-client"} <= test
    assert "slurmctld" not in plain


# --------------------------------------------------------------- a framework not installed


def _torch_extra() -> str:
    """The extra of pyproject.toml that installs torch (what the error must name)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    names = [n for n, reqs in extras.items() if any(r.startswith("torch") for r in reqs)]
    assert "torch" in names, extras
    return "torch"


@pytest.fixture
def rmsnorm_ws(make_workspace, tmp_path):
    ws = make_workspace(tmp_path)
    shutil.copytree(
        ROOT / "tasks" / "rmsnorm", ws / "rms", ignore=shutil.ignore_patterns("__pycache__")
    )
    return ws


def _analyze(ws: Path, *labels: str):
    loader = Loader(ws, load_rules())
    tracker = Tracker(FileDigestMemo(None))
    loader.tracker = tracker
    return analyze(
        loader,
        [Label.parse(lb) for lb in labels],
        store_put=digest_bytes,
        settings={},
        tracker=tracker,
    )


@pytest.mark.fast
def test_the_host_import_check_finds_installed_modules_only():
    from rules.domain import _host_can_import

    assert _host_can_import("numpy")
    assert not _host_can_import("rsi_no_such_framework_xyz")


@pytest.mark.fast
def test_a_torch_task_on_an_interpreter_without_torch_is_refused_naming_task_and_extra(
    rmsnorm_ws, monkeypatch
):
    import rules.domain

    _analyze(rmsnorm_ws, "//rms:verdict")  # NB: with torch installed it analyses
    monkeypatch.setattr(rules.domain, "_host_can_import", lambda module: module != "torch")
    with pytest.raises(DeclarationError) as info:
        _analyze(rmsnorm_ws, "//rms:verdict")
    err = info.value
    assert err.exit_code == EXIT_USAGE
    assert (err.target, err.field) == ("//rms:cpu", "toolchain")
    assert err.file and err.file.endswith("BUILD.toml")
    text = str(err)
    assert "//rms:task" in text and "'torch'" in text
    assert f"pip install -e '.[{_torch_extra()}]'" in text
    assert f"rsi[{_torch_extra()}]" in text
    assert "set `toolchain`" in text  # NB: a toolchain that has torch is the other way out


@pytest.mark.fast
def test_the_cli_refuses_a_torch_verdict_without_torch_with_exit_2(rmsnorm_ws, tmp_path):
    """The CLI path: exit 2 and one `rsi: error:` line naming task, framework and extra.
    (`rsi graph --actions` analyses as `rsi build` does, and runs nothing either way.)"""
    script = (
        "import sys, rules.domain as d\n"
        "d._host_can_import = lambda m: m != 'torch'\n"
        "from rsi.cli import run\n"
        "sys.argv = ['rsi', 'graph', '--actions', '--format', 'json', '//rms:verdict']\n"
        "run()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=rmsnorm_ws,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "RSI_HOST_LOCK": str(tmp_path / "host.lock")},
    )
    assert proc.returncode == 2, proc.stderr
    assert "rsi: error:" in proc.stderr and "Traceback" not in proc.stderr
    assert "//rms:task" in proc.stderr and "'torch'" in proc.stderr
    assert f".[{_torch_extra()}]" in proc.stderr
    assert not [p for p in (rmsnorm_ws / "cache").glob("ac/*/*") if p.is_file()]


# ------------------------------------------------------------------------------ rsi rules


@pytest.mark.fast
def test_rsi_rules_shows_every_attribute_with_kind_default_and_meaning(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from rsi.cli import main

    monkeypatch.chdir(tmp_path)  # NB: outside any workspace: the installed rules only
    result = CliRunner().invoke(main, ["rules"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out = result.output
    for rule in describe_rules(load_rules()):
        assert f"{rule['name']}: {rule['doc']}" in out
        for a in rule["attrs"]:
            need = "required" if a["required"] else f"default {json.dumps(a['default'])[:20]}"
            pattern = rf"^  {re.escape(a['name'])} +{re.escape(a['kind'])}, {re.escape(need)}"
            assert re.search(pattern, out, re.M), (rule["name"], a["name"], need)
    # compact: one line per rule and per attribute, and a blank line between rules
    n_lines = sum(1 + len(r["attrs"]) for r in describe_rules(load_rules()))
    assert len([line for line in out.splitlines() if line.strip()]) == n_lines


# ------------------------------------------------------------ campaign states in the docs


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise AssertionError(f"no function {name}")


def _strings(node: ast.AST) -> set[str]:
    """String constants a value expression can evaluate to (through `x if c else y`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.IfExp):
        return _strings(node.body) | _strings(node.orelse)
    return set()


def _state_values(func: ast.FunctionDef, names: tuple[str, ...] = ()) -> set[str]:
    """Every literal a function puts under a "state" key, assigns to one of `names`, or (for a
    function that returns a state) returns."""
    found: set[str] = set()
    for node in ast.walk(func):
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                if isinstance(k, ast.Constant) and k.value == "state":
                    found |= _strings(v)
        elif isinstance(node, ast.Assign):
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if any(t in names for t in targets):
                found |= _strings(node.value)
        elif isinstance(node, ast.Return) and node.value is not None and "return" in names:
            found |= _strings(node.value)
    return found


def _campaign_cli() -> ast.Module:
    """Every module of the campaign family (its package and its CLI adapter) as one tree."""
    paths = [
        *sorted((ROOT / "rules" / "campaign").glob("*.py")),
        ROOT / "rules" / "campaign_cli.py",
        ROOT / "rules" / "cli_support.py",
    ]
    body = [node for path in paths for node in ast.parse(path.read_text()).body]
    return ast.Module(body=body, type_ignores=[])


@pytest.mark.fast
def test_every_judge_state_the_code_can_emit_is_a_row_of_the_docs_table():
    states = _state_values(_function(_campaign_cli(), "judge_status"))
    assert {"not_started", "unchanged", "changed", "unrecorded", "unknown"} <= states, states
    doc = (ROOT / "docs" / "agents.md").read_text()
    table = doc[doc.index("| `judge.state` |") :].split("\n\n", 1)[0]
    for state in sorted(states):
        row = re.search(rf"^\| `{re.escape(state)}` \| (.+?) \|", table, re.M)
        assert row and len(row.group(1)) > 20, f"judge.state {state!r} has no row with a meaning"


@pytest.mark.fast
def test_every_round_and_final_state_of_campaign_status_is_documented():
    tree = _campaign_cli()
    states = _state_values(_function(tree, "attempt_state"), ("return",))
    states |= _state_values(_function(tree, "status_document"), ("rstate",))
    assert {"not_built", "failed_retryable", "interrupted", "building", "done"} <= states
    assert {"abandoned", "error", "not_started", "pending"} <= states
    doc = (ROOT / "docs" / "agents.md").read_text()
    for state in sorted(states):
        assert f"`{state}`" in doc, f"state {state!r} of `rsi campaign status` is undocumented"


# ------------------------------------------------------------------------------- gc roots


@pytest.mark.fast
def test_the_campaign_family_registers_its_gc_roots_by_entry_point():
    eps = {ep.name: ep.value for ep in metadata.entry_points(group="rsi.gc_roots")}
    assert eps.get("campaigns") == "rules.campaign:gc_roots", (
        f"{eps}: reinstall rsi (pip install -e . --no-deps) after editing pyproject.toml"
    )
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert declared["rsi.gc_roots"] == eps


@pytest.mark.fast
def test_the_engine_names_no_campaign_folder():
    """The engine knows nothing of campaigns: no path literal of theirs anywhere in rsi/."""
    for path in sorted((ROOT / "rsi").rglob("*.py")):
        if "_proto" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert not re.search(r"(^|/)campaigns(/|$)", node.value.strip()), (
                    f"{path.relative_to(ROOT)} names {node.value!r}"
                )


@pytest.mark.fast
def test_campaign_gc_roots_are_the_digests_its_logs_name(tmp_path):
    from rsi.store import LocalStore
    from rules.campaign import CampaignLog, gc_roots

    store = LocalStore(tmp_path / "store")
    assert list(gc_roots(store)) == []
    logged = store.put_bytes(b"def kernel(x):\n    return x\n")
    log = CampaignLog(store.root, "//pkg:campaign")
    with log.locked():
        log.append({"kind": "candidate", "files": {"kernel.py": str(logged)}, "note": "x/1"})
    with open(log.path, "a") as f:
        f.write('{"kind": "cand')  # NB: a torn last line of a crashed writer
    assert list(gc_roots(store)) == [str(logged)]


@pytest.mark.fast
def test_gc_keeps_what_every_registered_provider_names_and_stops_when_one_fails(
    tmp_path, monkeypatch
):
    import rsi.registry
    from rsi.cacheops import cache_gc
    from rsi.store import LocalStore

    store = LocalStore(tmp_path / "store")
    kept = store.put_bytes(b"a root of some family\n")
    also = store.put_bytes(b"another family's root\n")
    stray = store.put_bytes(b"nobody names me\n")
    providers = [
        ("one", lambda s: iter([kept])),  # a Digest
        ("two", lambda s: [also.hash]),  # a bare hash
    ]
    monkeypatch.setattr(rsi.registry, "gc_root_providers", lambda: providers)
    plan = cache_gc(store, set(), dry_run=True)
    assert plan["removed_blobs"] == [stray.hash]

    def broken(_store):
        yield kept
        raise OSError("the family's log cannot be read")

    providers.append(("three", broken))
    with pytest.raises(RsiError, match="'three' failed.*nothing was removed"):
        cache_gc(store, set(), dry_run=False)
    assert store.has(kept) and store.has(also) and store.has(stray)

    providers[-1] = ("three", lambda s: ["not a digest"])
    with pytest.raises(RsiError, match="not a digest"):
        cache_gc(store, set(), dry_run=False)
    assert store.has(stray)

    providers.pop()
    cache_gc(store, set(), dry_run=False)
    assert store.has(kept) and store.has(also) and not store.has(stray)


# ------------------------------------------------- paths that leave where they must stay


_SHA = "0" * 64


@pytest.mark.fast
@pytest.mark.parametrize("file", ["../../../tmp/x.whl", "/tmp/x.whl", "sub/x.whl", "..x.whl"])
def test_a_wheel_file_that_is_not_a_plain_name_is_refused_at_analysis(
    make_workspace, tmp_path, file
):
    """The download cache looks the file up, writes it and, on a bad hash, deletes it by this
    name: it must never reach a host file. Refused before anything is built."""
    ws = make_workspace(
        tmp_path,
        {
            "BUILD.toml": '[tc]\nrule = "toolchain"\nsuite = "bookworm"\n'
            'packages = ["python3"]\n'
            f'wheels = [{{name = "numpy", version = "2.4.6", file = "{file}", '
            f'sha256 = "{_SHA}"}}]\n'
        },
    )
    with pytest.raises(DeclarationError) as info:
        _analyze(ws, "//:tc")
    err = info.value
    assert (err.target, err.field) == ("//:tc", "wheels"), str(err)
    assert err.file and err.file.endswith("BUILD.toml")
    assert "plain file name" in str(err) and err.exit_code == EXIT_USAGE


_PROJECT = """
[proj]
rule = "external_project"
root = "proj"
editable = [EDITABLE]
protocol = [PROTOCOL]
quality_cmd = "python3 quality.py"
quality_field = "ok"
benchmark_cmd = "python3 bench.py"
metric = "seconds"
direction = "minimize"
"""


@pytest.mark.fast
@pytest.mark.parametrize(
    ("editable", "protocol", "field", "words"),
    [
        ('"../outside.py"', '"bench.py"', "editable", "a path with .."),
        ('"src/../../x.py"', '"bench.py"', "editable", "a path with .."),
        ('"/etc/passwd"', '"bench.py"', "editable", "an absolute path"),
        ('"src/work.py"', '"../bench.py"', "protocol", "a path with .."),
        ('"src/work.py"', '"/usr/bin/python3"', "protocol", "an absolute path"),
    ],
)
def test_an_external_project_pattern_leaving_its_root_is_refused_at_analysis(
    make_workspace, tmp_path, editable, protocol, field, words
):
    def project(editable: str, protocol: str, name: str) -> Path:
        text = _PROJECT.replace("EDITABLE", editable).replace("PROTOCOL", protocol)
        files = {"BUILD.toml": text, "proj/bench.py": "", "proj/src/work.py": ""}
        return make_workspace(tmp_path, files, name=name)

    _analyze(project('"src/work.py"', '"bench.py"', "ok"), "//:proj")  # NB: the sane one is fine
    ws = project(editable, protocol, "bad")
    with pytest.raises(DeclarationError) as info:
        _analyze(ws, "//:proj")
    err = info.value
    assert (err.target, err.field) == ("//:proj", field), str(err)
    assert "leaves the project root" in str(err) and words in str(err)


@pytest.mark.fast
@pytest.mark.parametrize(
    ("args", "schema", "words"),
    [
        (["round", "//pkg:c", "--round", "0"], "rsi.round/1", "--round"),
        (["round", "//pkg:c", "--no-such-option"], "rsi.round/1", "--no-such-option"),
        (["candidate", "add", "//pkg:c"], "rsi.candidate.add/1", "--from"),
        (["campaign", "abandon", "//pkg:c"], "rsi.campaign.abandon/1", "--round"),
        (
            ["campaign", "final", "//pkg:c", "--lock-timeout", "x"],
            "rsi.campaign.final_result/1",
            "--lock-timeout",
        ),
    ],
)
def test_a_command_line_click_refuses_is_a_json_error_under_json(
    make_workspace, run_rsi, tmp_path, args, schema, words
):
    ws = make_workspace(tmp_path, {"pkg/BUILD.toml": ""})
    run = run_rsi(ws, *args, "--json")
    assert run.returncode == 2, str(run)
    doc = run.json()
    assert doc["schema"] == schema and doc["state"] == "error" and doc["campaign"] == "//pkg:c"
    assert doc["error"]["code"] == "UsageError" and words in doc["error"]["message"]
    plain = run_rsi(ws, *args)  # NB: without --json, click's own text, exit 2 as before
    assert plain.returncode == 2 and "Usage:" in plain.stderr and not plain.stdout
