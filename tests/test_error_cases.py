"""Malformed inputs end in one clean error, never a traceback: exit 2, one `rsi: error:` line
naming the file and the field, and nothing written (no store, no out/; an existing store and
out/ exactly as they were). The tables cover every setting of rsi.toml (types, NULs, nan,
non-UTF-8, a remote that is not gRPC), the tables a task and a binding declare (shapes, sizes,
dtypes, policy keys), a label of the wrong kind for every label attribute of every rule, and
store and out/ folders rsi cannot write (immutable, a read-only mount)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from rsi.analysis import analyze
from rsi.analysis_cache import Tracker
from rsi.attrs import Attr
from rsi.digest import FileDigestMemo, digest_bytes
from rsi.errors import DeclarationError
from rsi.label import Label
from rsi.loader import Loader
from rsi.registry import load_rules

ROOT = Path(__file__).resolve().parent.parent
RULES = load_rules()
CMD = '[t]\nrule = "command"\ncmd = "echo hi > $(OUT)"\nouts = ["x"]\n'


def _tree(path: Path) -> dict[str, tuple]:
    """Every path under `path` with its kind, size and mtime (what "nothing written" compares)."""
    if not path.exists():
        return {}
    out = {}
    for p in sorted(path.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(path))] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def _assert_clean(run, file: str, field: str | None) -> None:
    """Exit 2 and one error line naming `file` (and `field`), no traceback."""
    assert run.returncode == 2, run
    assert "Traceback" not in run.stderr, run
    errors = [line for line in run.stderr.splitlines() if line.startswith("rsi: error:")]
    assert len(errors) == 1, run
    assert file in errors[0], run
    if field is not None:
        assert f"field '{field}'" in errors[0], run


# ------------------------------------------------------------------------------ rsi.toml

SETTINGS = [
    ('[workspace]\nstore = "a\\u0000b"\n', "store"),
    ('[workspace]\nsalt = "x\\u0000"\n', "salt"),
    ('[workspace]\nremote = "http://localhost:1234"\n', "remote"),
    ('[workspace]\nremote = "grpc://host"\n', "remote"),
    ('[workspace]\nremote = "grpc://h:99999"\n', "remote"),
    ('[workspace]\nexecutor = "remote"\nremote = "grpc:/x:1"\n', "remote"),
    ('[workspace]\njobs = "4"\n', "jobs"),
    ("[workspace]\njobs = 0\n", "jobs"),
    ("[workspace]\njobs = nan\n", "jobs"),
    ("[workspace]\njobs = true\n", "jobs"),
    ("[workspace]\nkeep_going = 1\n", "keep_going"),
    ('[workspace]\nexecutor = "nope"\n', "executor"),
    ("[workspace]\nexecutor = 3\n", "executor"),
    ('[workspace]\nrules = "rules.register"\n', "rules"),
    ('[workspace]\nrules = ["a\\u0000"]\n', "rules"),
    ('[workspace]\nrules = ["not a module"]\n', "rules"),
    ('[workspace]\ndigest_function = "md5"\n', "digest_function"),
    ('[workspace]\nremote_mode = "both"\n', "remote_mode"),
    ('[workspace]\nremote_fallback = "yes"\n', "remote_fallback"),
    ("[workspace]\nsalt = 5\n", "salt"),
    ("[workspace]\nstore = 1979-05-27\n", "store"),
    ("[workspace]\nstore = []\n", "store"),
    ('[workspace]\nstroe = "x"\n', "stroe"),
    ('[workspace]\n"k\\u0000" = 1\n', None),
    ("[limits]\nmemory_mb = 0\n", "memory_mb"),
    ("[limits]\nscratch_mb = 1.5\n", "scratch_mb"),
    ("[limits]\nscratch_mb = inf\n", "scratch_mb"),
    ('[slurm]\npartition = "x\\u0000"\n', "partition"),
]


@pytest.mark.fast
@pytest.mark.parametrize(
    "config,field", SETTINGS, ids=[f"{f}-{i}" for i, (_, f) in enumerate(SETTINGS)]
)
def test_a_malformed_setting_exits_2_naming_rsi_toml_and_the_field(
    config, field, make_workspace, run_rsi, tmp_path
):
    ws = make_workspace(tmp_path, {"p/BUILD.toml": CMD}, config=config)
    run = run_rsi(ws, "build", "//p:t")
    _assert_clean(run, "rsi.toml", field)
    assert not (ws / "cache").exists() and not (ws / "out").exists()


@pytest.mark.fast
@pytest.mark.parametrize(
    "raw", [b'[workspace]\nsalt = "\xff\xfe"\n', b"\xef\xbb\xbf\x80 = 1\n", b'store = "\xc3"\n']
)
def test_an_rsi_toml_that_is_not_utf8_exits_2_naming_it(raw, make_workspace, run_rsi, tmp_path):
    ws = make_workspace(tmp_path, {"p/BUILD.toml": CMD})
    (ws / "rsi.toml").write_bytes(raw)
    run = run_rsi(ws, "build", "//p:t")
    _assert_clean(run, "rsi.toml", None)
    assert "not UTF-8" in run.stderr and "line" in run.stderr
    assert not (ws / "cache").exists() and not (ws / "out").exists()


@pytest.mark.fast
def test_a_build_toml_that_is_not_utf8_exits_2_naming_it_and_the_line(
    make_workspace, run_rsi, tmp_path
):
    ws = make_workspace(tmp_path, {"p/BUILD.toml": CMD.encode() + b'doc = "\xff"\n'})
    run = run_rsi(ws, "build", "//p:t")
    _assert_clean(run, "p/BUILD.toml", None)
    assert "not UTF-8 text (byte 0xff on line 5)" in run.stderr, run
    assert not (ws / "out").exists() and not list((ws / "cache").glob("ac/*/*"))


@pytest.mark.fast
def test_a_remote_flag_that_is_not_grpc_is_a_usage_error(make_workspace, run_rsi, tmp_path):
    ws = make_workspace(tmp_path, {"p/BUILD.toml": CMD})
    run = run_rsi(ws, "build", "--remote", "http://localhost:1234", "//p:t")
    assert run.returncode == 2 and "Traceback" not in run.stderr, run
    assert "rsi: error: --remote:" in run.stderr and "grpc://HOST:PORT" in run.stderr
    assert not (ws / "cache").exists()


# ------------------------------------------------------------- task and binding tables


@pytest.fixture
def task_ws(make_workspace, tmp_path):
    """tasks/softmax copied into a workspace with a command target beside it."""
    ws = make_workspace(tmp_path)
    dest = ws / "sm"
    shutil.copytree(ROOT / "tasks/softmax", dest, ignore=shutil.ignore_patterns("__pycache__"))
    text = (dest / "BUILD.toml").read_text()
    text = re.sub(r"\n# The same binding inside.*?(?=\n\[fast\])", "\n", text, flags=re.S)
    text = re.sub(r"\n\[verdict_in_toolchain\].*?(?=\n\[|\Z)", "\n", text, flags=re.S)
    text = re.sub(r"\n\[campaign[^\]]*\].*?(?=\n\[|\Z)", "\n", text, flags=re.S)
    (dest / "BUILD.toml").write_text(text + "\n" + CMD.replace("[t]", "[cmd]"))
    return ws


CASE = '{name = "normal_f32", shape = [16, 128], dtype = "float32", kind = "normal"}'
WORKLOAD = '{name = "bench_f32", shape = [64, 1024], dtype = "float32", kind = "normal"}'
DECLARATIONS = [
    # (old text, new text, target, field, words in the message)
    (CASE, CASE.replace("[16, 128]", '"4x8"'), "task", "cases", "list of sizes"),
    (CASE, CASE.replace("[16, 128]", "[16, -128]"), "task", "cases", "-128"),
    (CASE, CASE.replace("[16, 128]", "[16, 0]"), "task", "cases", "size 0"),
    (CASE, CASE.replace("[16, 128]", "[16, 1.5]"), "task", "cases", "whole number"),
    (CASE, CASE.replace("[16, 128]", "[16, 4294967296]"), "task", "cases", "2**31"),
    (CASE, CASE.replace('"float32"', '"float33"'), "task", "cases", "float33"),
    (CASE, CASE.replace('dtype = "float32"', "dtype = 32"), "task", "cases", "dtype"),
    (CASE, CASE.replace('name = "normal_f32"', 'name = ""'), "task", "cases", "name"),
    (CASE, CASE.replace('"normal_f32"', '"normal_f64"'), "task", "cases", "twice"),
    (CASE, CASE.replace('"float32"', '"int8"'), "task", "cases", "no entry in tolerances"),
    ("float32 = {atol = 1e-06", "float33 = {atol = 1e-06", "task", "tolerances", "float33"),
    ("float32 = {atol = 1e-06", "float32 = {atol = -1.0", "task", "tolerances", "atol"),
    ("rtol = 1e-05}", "rtol = 1e-05, ztol = 1}", "task", "tolerances", "atol"),
    (WORKLOAD, WORKLOAD.replace("[64, 1024]", '"64x1024"'), "cpu", "measure", "list of sizes"),
    (WORKLOAD, WORKLOAD.replace('"float32"', '"half"'), "cpu", "measure", "half"),
    ("pairs = 30", "pairs = 0", "cpu", "measure", "pairs"),
    ("pairs = 30", "pair = 30", "cpu", "measure", "unknown key 'pair'"),
    ("samples = 10", 'samples = "10"', "cpu", "measure", "samples"),
    ('metric = "latency"', 'metric = "speed"', "cpu", "measure", "metric"),
    ("pairs = 30", "pairs = 1000000000", "cpu", "measure", "pairs"),
    ("pairs = 30, seed = 0", "pairs = 30, seed = -1", "cpu", "measure", "seed"),
    ("call_timeout_s = 20.0\nseed = 0", "call_timeout_s = 20.0\nseed = -1", "cpu", "seed", "-1"),
    ('function = "softmax"', 'function = "4x8"', "task", "entry", "not a Python name"),
    ("confidence = 0.95", "confidence = 1.5", "cpu", "assess", "confidence"),
    ("min_pairs = 5", "min_pairs = 0", "cpu", "assess", "min_pairs"),
    ("min_pairs = 5", "min_pair = 5", "cpu", "assess", "unknown key 'min_pair'"),
    # NB: labels of the wrong kind
    (
        '[fast]\nrule = "candidate"\ntask = ":task"',
        '[fast]\nrule = "candidate"\ntask = ":cmd"',
        "fast",
        "task",
        "not a `task`",
    ),
    (
        '[cpu]\nrule = "binding"\ntask = ":task"',
        '[cpu]\nrule = "binding"\ntask = ":fast"',
        "cpu",
        "task",
        "is a `candidate` target",
    ),
    (
        '[cpu]\nrule = "binding"\ntask = ":task"',
        '[cpu]\nrule = "binding"\ntask = ":task"\ntoolchain = ":task"',
        "cpu",
        "toolchain",
        "not a toolchain",
    ),
]


def _decl_ids():
    return [f"{d[2]}.{d[3]}-{i}" for i, d in enumerate(DECLARATIONS)]


@pytest.mark.e2e
@pytest.mark.parametrize("old,new,target,field,words", DECLARATIONS, ids=_decl_ids())
def test_a_malformed_declaration_exits_2_naming_build_toml_target_and_field(
    old, new, target, field, words, task_ws, run_rsi
):
    build_file = task_ws / "sm" / "BUILD.toml"
    text = build_file.read_text()
    assert old in text, old
    build_file.write_text(text.replace(old, new, 1))
    run = run_rsi(task_ws, "build", f"//sm:{target}")
    _assert_clean(run, "sm/BUILD.toml", field)
    assert f"//sm:{target}" in run.stderr and words in run.stderr, run
    assert not (task_ws / "out").exists()
    assert not list((task_ws / "cache").glob("ac/*/*")), "nothing ran, nothing was cached"


def _analyse(ws: Path, label: str):
    loader = Loader(ws, RULES)
    tracker = Tracker(FileDigestMemo(None))
    loader.tracker = tracker
    analyze(loader, [Label.parse(label)], store_put=digest_bytes, settings={}, tracker=tracker)


def _placeholder(a: Attr):
    """A value of the attribute's type (only to reach the label attributes)."""
    return {
        "string": a.choices[0] if a.choices else "x",
        "int": int(a.minimum or 0) + 1,
        "float": float(a.minimum or 0) + 1.0,
        "bool": False,
        "string_list": ["x"] if a.nonempty else [],
        "string_dict": {},
        "table": {},
        "table_list": [],
    }[a.kind]


def _toml(value) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


GOOD = {"task": ":task", "binding": ":cpu", "candidate": ":fast"}
LABEL_ATTRS = [
    (rule, name)
    for rule in sorted(RULES)
    if rule != "command"  # NB: its deps take targets of any kind
    for name, a in RULES[rule].attrs.items()
    if a.kind in ("label", "label_list")
]


@pytest.mark.fast
@pytest.mark.parametrize("rule,attr_name", LABEL_ATTRS, ids=[f"{r}.{a}" for r, a in LABEL_ATTRS])
def test_every_label_attribute_refuses_a_target_of_the_wrong_kind(rule, attr_name, task_ws):
    """A command target given to each label attribute of each rule (the others set to the
    right kind where the catalog has one): a declaration error naming a label field, never a
    TypeError from a rule."""
    lines = ["[probe]", f'rule = "{rule}"']
    for name, a in RULES[rule].attrs.items():
        if name == "rounds" and a.kind == "table":
            lines.append("rounds = {up_to = 3}")
        elif a.kind in ("label", "label_list"):
            if name != attr_name and not a.required:
                continue
            value = ":cmd" if name == attr_name else GOOD.get(name, ":cmd")
            lines.append(f"{name} = {json.dumps([value] if a.kind == 'label_list' else value)}")
        elif a.required:
            lines.append(f"{name} = {_toml(_placeholder(a))}")
    build_file = task_ws / "sm" / "BUILD.toml"
    build_file.write_text(build_file.read_text() + "\n" + "\n".join(lines) + "\n")
    with pytest.raises(DeclarationError) as info:
        _analyse(task_ws, "//sm:probe")
    err = info.value
    labels = {n for n, a in RULES[rule].attrs.items() if a.kind in ("label", "label_list")}
    assert err.field in labels, err
    assert err.target == "//sm:probe" and err.file.endswith("BUILD.toml"), err
    assert "//sm:cmd" in err.detail, err


@pytest.mark.fast
def test_a_wrong_kind_through_the_cli_is_one_line(task_ws, run_rsi):
    build_file = task_ws / "sm" / "BUILD.toml"
    build_file.write_text(
        build_file.read_text() + '\n[v]\nrule = "verdict"\nbinding = ":task"\ncandidate = ":fast"\n'
    )
    run = run_rsi(task_ws, "build", "//sm:v")
    _assert_clean(run, "sm/BUILD.toml", "binding")
    assert "TypeError" not in run.stderr and "is a `task` target" in run.stderr
    assert not (task_ws / "cache").exists() or not list((task_ws / "cache").glob("ac/*/*"))


# --------------------------------------------------------------- store and out/ folders


def _chattr(flag: str, path: Path) -> bool:
    got = subprocess.run(["chattr", "-R", flag, str(path)], capture_output=True, check=False)
    return got.returncode == 0


@pytest.fixture
def built(make_workspace, run_rsi, tmp_path):
    """A workspace that built once (a store and out/ to keep as they are)."""
    ws = make_workspace(tmp_path, {"p/BUILD.toml": CMD})
    assert run_rsi(ws, "build", "//p:t").returncode == 0
    (ws / "p" / "BUILD.toml").write_text(CMD.replace("hi", "changed"))
    return ws


@pytest.mark.fast
@pytest.mark.parametrize("folder", ["cache", "cache/ac", "cache/events", "out"])
def test_an_immutable_store_or_out_folder_exits_2_and_writes_nothing(folder, built, run_rsi):
    if os.geteuid() != 0 or shutil.which("chattr") is None:
        pytest.skip("chattr +i needs root and e2fsprogs")
    before = {"cache": _tree(built / "cache"), "out": _tree(built / "out")}
    if not _chattr("+i", built / folder):
        pytest.skip(f"this file system has no immutable flag ({built})")
    try:
        run = run_rsi(built, "build", "//p:t")
        after = {"cache": _tree(built / "cache"), "out": _tree(built / "out")}
    finally:
        _chattr("-i", built / folder)
    _assert_clean(run, "rsi.toml" if folder.startswith("cache") else "out", None)
    assert ("field 'store'" in run.stderr) == folder.startswith("cache"), run
    assert after == before, "nothing was written"


@pytest.mark.fast
def test_a_store_on_a_read_only_mount_exits_2_and_writes_nothing(
    mount_tmpfs, make_workspace, run_rsi, tmp_path
):
    store = mount_tmpfs(16)
    ws = make_workspace(tmp_path, {"p/BUILD.toml": CMD}, config=f'[workspace]\nstore = "{store}"\n')
    assert run_rsi(ws, "build", "//p:t").returncode == 0
    (ws / "p" / "BUILD.toml").write_text(CMD.replace("hi", "changed"))
    before = {"cache": _tree(store), "out": _tree(ws / "out")}
    remount = subprocess.run(["mount", "-o", "remount,ro", str(store)], capture_output=True)
    if remount.returncode != 0:
        pytest.skip(f"cannot remount read-only: {remount.stderr!r}")
    run = run_rsi(ws, "build", "//p:t")
    _assert_clean(run, "rsi.toml", "store")
    assert "read-only file system" in run.stderr, run
    assert {"cache": _tree(store), "out": _tree(ws / "out")} == before
    # NB: --store names the flag, not rsi.toml
    run = run_rsi(ws, "--store", str(store), "build", "//p:t")
    assert run.returncode == 2 and "rsi: error: --store:" in run.stderr, run


@pytest.mark.fast
def test_a_store_to_be_made_under_a_read_only_folder_exits_2(
    mount_tmpfs, make_workspace, run_rsi, tmp_path
):
    parent = mount_tmpfs(4)
    if subprocess.run(["mount", "-o", "remount,ro", str(parent)], capture_output=True).returncode:
        pytest.skip("cannot remount read-only")
    ws = make_workspace(
        tmp_path, {"p/BUILD.toml": CMD}, config=f'[workspace]\nstore = "{parent}/store"\n'
    )
    run = run_rsi(ws, "build", "//p:t")
    _assert_clean(run, "rsi.toml", "store")
    assert not (ws / "out").exists()


@pytest.mark.fast
def test_the_build_function_itself_refuses_an_immutable_store(built):
    """Campaign rounds, jobs and the server call rsi.build.build, not the CLI: the check that
    nothing is written into a store rsi cannot write is made there too."""
    from rsi.build import build
    from rsi.errors import RsiError
    from rsi.workspace import Workspace

    if os.geteuid() != 0 or shutil.which("chattr") is None:
        pytest.skip("chattr +i needs root and e2fsprogs")
    before = _tree(built / "cache")
    if not _chattr("+i", built / "cache"):
        pytest.skip(f"this file system has no immutable flag ({built})")
    try:
        with pytest.raises(RsiError) as info:
            build(Workspace.load(built), ["//p:t"])
        after = _tree(built / "cache")
    finally:
        _chattr("-i", built / "cache")
    assert info.value.exit_code == 2 and "cannot be written" in info.value.message
    assert after == before
