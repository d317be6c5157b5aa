"""A toolchain's rootfs is built by an action (a host step), never during analysis: analysing or
querying a workspace runs nothing and writes no toolchain; a build builds it once, reuses it
after, and a broken recipe fails that build naming the target and the field."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from rsi.errors import EXIT_BUILD_FAILED, ExecutionError
from rsi.label import Label
from rsi.toolchain import diff_locks, load_recipe
from rsi.toolchain.build import ToolchainError, ToolchainInfo, find_toolchain, toolchains_root

REPO = Path(__file__).resolve().parents[1]
SOFTMAX = REPO / "tasks" / "softmax"

TOOLCHAIN = """\
[tc]
rule = "toolchain"
suite = "bookworm"
packages = ["python3"]
"""
TASK = """\
[task]
rule = "task"
runtime = ["workloads.py", "oracle.py"]
baseline = "baseline"
framework = "numpy"
entry = {module = "kernel", function = "softmax"}
editable = ["kernel.py"]
tolerances = {float32 = {atol = 1e-06, rtol = 1e-05}}
cases = [{name = "normal_f32", shape = [16, 128], dtype = "float32", kind = "normal"}]

[in_tc]
rule = "binding"
task = ":task"
toolchain = "//toolchains:tc"
measure.workload = {name = "bench", shape = [64, 256], dtype = "float32", kind = "normal"}
measure.warmups = 1
measure.samples = 3
measure.pairs = 6
measure.probes = 4
measure.metric = "latency"
measure.direction = "minimize"
assess = {min_improvement = 0.05, confidence = 0.95, bootstrap_resamples = 200, min_pairs = 5}

[fast]
rule = "candidate"
task = ":task"
src = "cands/fast"

[verdict]
rule = "verdict"
binding = ":in_tc"
candidate = ":fast"
"""
KERNEL = "import numpy as np\n\n\ndef softmax(x):\n    e = np.exp(x - x.max(-1, keepdims=True))\n"
KERNEL += "    return e / e.sum(-1, keepdims=True)\n"


def _workspace(make_workspace, tmp_path: Path, toolchain: str = TOOLCHAIN) -> Path:
    return make_workspace(
        tmp_path,
        {
            "toolchains/BUILD.toml": toolchain,
            "tasks/sm/BUILD.toml": TASK,
            "tasks/sm/oracle.py": (SOFTMAX / "oracle.py").read_bytes(),
            "tasks/sm/workloads.py": (SOFTMAX / "workloads.py").read_bytes(),
            "tasks/sm/baseline/kernel.py": KERNEL,
            "tasks/sm/cands/fast/kernel.py": KERNEL,
        },
        config='[workspace]\nstore = "store"\n',
    )


def _recipe_hex(ws: Path) -> str:
    return load_recipe(ws / "toolchains" / "BUILD.toml", "tc").digest().hash


def _nothing_built(ws: Path) -> None:
    assert not (ws / "toolchains" / "tc.lock").exists()
    assert not (ws / "store" / "toolchains").exists()
    assert sorted(p.name for p in (ws / "toolchains").iterdir()) == ["BUILD.toml"]


# --------------------------------------------------------------------------------- analysis


@pytest.mark.fast
def test_analysis_declares_the_build_step_and_runs_nothing(make_workspace, tmp_path, monkeypatch):
    """The rule only reads the recipe: no subprocess, no toolchain build, nothing written beside
    the declaration or under <store>/toolchains; users name the recipe and run after the step."""
    import importlib

    import rsi.toolchain.step as step
    from rsi.build_analysis import load_graph
    from rsi.runtime import open_store
    from rsi.workspace import Workspace

    def refuse(*args, **kwargs):
        raise AssertionError(f"analysis ran something: {args[:1]}")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(subprocess, "run", refuse)
    tc_build = importlib.import_module("rsi.toolchain.build")  # NB: not the `build` function
    monkeypatch.setattr(tc_build, "build", refuse)
    monkeypatch.setattr(tc_build, "_build_into", refuse)
    monkeypatch.setattr(step, "build", refuse)
    ws_root = _workspace(make_workspace, tmp_path)
    ws = Workspace.load(ws_root)
    labels, graph = load_graph(ws, ["//tasks/sm:verdict"], open_store(ws), use_cache=False)
    _nothing_built(ws_root)

    value = f"tc@recipe:{_recipe_hex(ws_root)}"
    step = graph.actions["//toolchains:tc#ToolchainBuild"]
    assert dict(step.platform) == {"host-step": "toolchain", "provides-toolchain": value}
    assert step.outputs == ("toolchains/tc.toolchain.json", "toolchains/tc.lock")
    assert graph.providers[Label.parse("//toolchains:tc")].info["toolchain"] == value
    wanted = graph.actions_for(labels)
    assert step.id in wanted  # NB: a build of the verdict builds the toolchain first
    users = [a for a in wanted if dict(graph.actions[a].platform).get("toolchain") == value]
    assert {graph.actions[a].mnemonic for a in users} >= {"Check", "Measure", "BaselineCheck"}
    for a in users:
        assert step.id in graph.preds[a], a


@pytest.mark.fast
def test_query_and_graph_of_an_unbuilt_toolchain_run_nothing_and_write_no_toolchain(
    make_workspace, tmp_path, run_rsi
):
    """The real CLI: `rsi query` and `rsi graph` (which analyses) with a mmdebstrap on PATH
    that would leave a mark: no mark, no lock beside BUILD.toml, no <store>/toolchains."""
    ws = _workspace(make_workspace, tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mark = tmp_path / "mmdebstrap-ran"
    fake = bin_dir / "mmdebstrap"
    fake.write_text(f"#!/bin/sh\ntouch {mark}\nexit 1\n")
    fake.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    got = run_rsi(ws, "query", "deps(//tasks/sm:verdict)", env=env)
    assert got.returncode == 0 and "//toolchains:tc" in got.stdout, str(got)
    got = run_rsi(ws, "graph", "--actions", "--format", "json", "//tasks/sm:verdict", env=env)
    assert got.returncode == 0, str(got)
    edges = got.json()["edges"]
    assert {"from": "//toolchains:tc#ToolchainBuild", "to": "//tasks/sm:verdict#Check"} in edges
    assert not mark.exists()
    _nothing_built(ws)


# ----------------------------------------------------------------- the step, with a fake builder


def _fake_builder(calls: list[str], fail: Exception | None = None):
    """Stands for rsi.toolchain.build.build: writes a tiny 'tree' where the real one would."""

    def fake(recipe, store_dir, **kw):
        calls.append(recipe.name)
        assert kw.get("write_lock") is False  # NB: never beside the declaration
        if fail is not None:
            raise fail
        from rsi.digest import digest_bytes

        directory = toolchains_root(store_dir) / recipe.digest().hash
        directory.mkdir(parents=True, exist_ok=True)
        tar = b"not really a tar"
        (directory / "rootfs.tar").write_bytes(tar)
        info = ToolchainInfo(
            name=recipe.name,
            recipe_digest=recipe.digest().hash,
            rootfs=digest_bytes(tar),
            rootfs_sha256=hashlib.sha256(tar).hexdigest(),
            image_id="sha256:" + "0" * 64,
            lock={"deb:python3": "3.11.2-1+b1"},
            path=directory,
            source_date_epoch=recipe.source_date_epoch,
            env=dict(recipe.env),
        )
        previous = kw.get("previous_lock")
        if previous is not None:
            info = ToolchainInfo(**{**info.__dict__, "changes": diff_locks(previous, info.lock)})
        (directory / "info.json").write_text(json.dumps(info.to_json()))
        index = toolchains_root(store_dir) / "by-rootfs"
        index.mkdir(exist_ok=True)
        doc = {"name": recipe.name, "recipe_digest": info.recipe_digest}
        (index / f"{info.rootfs.hash}.json").write_text(json.dumps(doc))
        return info

    return fake


def _build(ws_root: Path, *patterns: str):
    from rsi.build import build
    from rsi.workspace import Workspace

    return build(Workspace.load(ws_root), list(patterns), progress=False)


@pytest.mark.fast
def test_the_step_builds_once_is_reused_and_reruns_when_its_tree_is_gone(
    make_workspace, tmp_path, monkeypatch
):
    import rsi.toolchain.step as step

    calls: list[str] = []
    monkeypatch.setattr(step, "build", _fake_builder(calls))
    ws = _workspace(make_workspace, tmp_path)
    report = _build(ws, "//toolchains:tc")
    assert report.ok and calls == ["tc"], report.to_json()
    assert report.counts["executed"] == 1
    hexd = _recipe_hex(ws)
    built = json.loads((ws / "out" / "toolchains" / "tc.toolchain.json").read_text())
    assert built["toolchain"] == f"tc@recipe:{hexd}"
    assert built["rootfs_platform"].startswith("tc@") and built["lock_changes"] is None
    assert (ws / "out" / "toolchains" / "tc.lock").read_text().endswith("deb python3=3.11.2-1+b1\n")
    assert not (ws / "toolchains" / "tc.lock").exists()
    # NB: executors map the recipe value to the tree
    assert (
        find_toolchain(ws / "store", f"tc@recipe:{hexd}").rootfs
        == find_toolchain(ws / "store", built["rootfs_platform"]).rootfs
    )

    report = _build(ws, "//toolchains:tc")
    assert report.ok and calls == ["tc"], report.to_json()  # NB: reused, not rebuilt

    # NB: the tree lives beside the CAS: a cached step whose tree is gone runs again
    for p in (toolchains_root(ws / "store") / hexd).iterdir():
        p.unlink()
    (toolchains_root(ws / "store") / hexd).rmdir()
    report = _build(ws, "//toolchains:tc")
    assert report.ok and calls == ["tc", "tc"], report.to_json()


@pytest.mark.fast
def test_a_checked_in_lock_is_an_input_and_moved_packages_are_named(
    make_workspace, tmp_path, monkeypatch
):
    import rsi.toolchain.step as step

    monkeypatch.setattr(step, "build", _fake_builder([]))
    ws = _workspace(make_workspace, tmp_path)
    (ws / "toolchains" / "tc.lock").write_text("deb python3=3.11.2-1\n")
    assert _build(ws, "//toolchains:tc").ok
    built = json.loads((ws / "out" / "toolchains" / "tc.toolchain.json").read_text())
    assert built["lock_changes"] == ["~ deb:python3: 3.11.2-1 -> 3.11.2-1+b1"]
    assert (ws / "toolchains" / "tc.lock").read_text() == "deb python3=3.11.2-1\n"  # untouched


@pytest.mark.fast
def test_a_failed_toolchain_build_names_the_target_and_the_field(
    make_workspace, tmp_path, monkeypatch
):
    import rsi.toolchain.step as step

    broken = ToolchainError("tc: x.whl has sha256 1111, the recipe pins 0000", field="wheels")
    calls: list[str] = []
    monkeypatch.setattr(step, "build", _fake_builder(calls, fail=broken))
    ws = _workspace(make_workspace, tmp_path)
    report = _build(ws, "//tasks/sm:verdict")
    assert not report.ok and calls == ["tc"]
    from rsi.buildcmd import exit_code

    assert exit_code(report) == EXIT_BUILD_FAILED
    failed = report.outcomes["//toolchains:tc#ToolchainBuild"]
    assert failed.status == "failed"
    assert "toolchain //toolchains:tc failed to build, field 'wheels'" in failed.message
    assert "sha256" in failed.message
    check = report.outcomes["//tasks/sm:verdict#Check"]
    assert check.status == "skipped" and "//toolchains:tc#ToolchainBuild" in check.message
    assert not (ws / "store" / "toolchains").exists()


@pytest.mark.fast
def test_an_unbuilt_recipe_value_is_an_infrastructure_error_naming_the_target(tmp_path) -> None:
    with pytest.raises(ExecutionError) as info:
        find_toolchain(tmp_path, "numpy@recipe:" + "a" * 64)
    assert "not built" in info.value.message and "//toolchains:numpy" in info.value.hint


# ------------------------------------------------------------------------- real builds (root)


def _tiny_wheel(folder: Path) -> tuple[str, str]:
    """A valid wheel `rsipin-1.0`; (file name, its sha256)."""
    name = "rsipin-1.0-py3-none-any.whl"
    meta = "rsipin-1.0.dist-info"
    with zipfile.ZipFile(folder / name, "w") as z:
        z.writestr("rsipin/__init__.py", "")
        z.writestr(f"{meta}/METADATA", "Metadata-Version: 2.1\nName: rsipin\nVersion: 1.0\n")
        z.writestr(
            f"{meta}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        z.writestr(f"{meta}/RECORD", "")
    return name, hashlib.sha256((folder / name).read_bytes()).hexdigest()


@pytest.mark.e2e
def test_a_wheel_with_the_wrong_sha256_fails_the_build_naming_target_and_field(
    make_workspace, tmp_path, build
):
    """pip really downloads the pinned file (from a local index, offline), its sha256 is not
    the pin: exit 1, the target and `wheels` named, nothing built, no lock written."""
    links = tmp_path / "links"
    links.mkdir()
    wheel, _ = _tiny_wheel(links)
    pin = f'{{name = "rsipin", version = "1.0", file = "{wheel}", sha256 = "{"0" * 64}"}}'
    recipe = TOOLCHAIN + f"wheels = [{pin}]\n"
    ws = _workspace(make_workspace, tmp_path, recipe)
    env = {
        "RSI_TOOLCHAIN_CACHE": str(tmp_path / "dl"),
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(links),
    }
    got = build(ws, "//toolchains:tc", expect=EXIT_BUILD_FAILED, env=env)
    failed = [e for e in got.finished() if e.get("status") == "failed"]
    assert [e["label"] for e in failed] == ["//toolchains:tc"], str(got)
    msg = failed[0]["message"]
    assert "toolchain //toolchains:tc failed to build, field 'wheels'" in msg, msg
    assert f"{wheel} has sha256" in msg and "the recipe pins " + "0" * 64 in msg, msg
    assert not (ws / "store" / "toolchains" / _recipe_hex(ws)).exists()
    assert not (ws / "toolchains" / "tc.lock").exists()


@pytest.mark.e2e
def test_a_real_build_builds_the_rootfs_once_and_reuses_it(make_workspace, tmp_path, build):
    """mmdebstrap for real (root; the shared download cache keeps .debs): the first build runs
    the step and writes the lock under out/, the second is a cache hit that builds nothing."""
    if os.geteuid() != 0:
        pytest.skip("building toolchains needs root (mmdebstrap --mode=root)")
    ws = _workspace(make_workspace, tmp_path)
    try:
        _build_twice(ws, build)
    finally:  # NB: a rootfs of ~100 MB: not left for pytest's rotation of temporary folders
        shutil.rmtree(ws / "store" / "toolchains", ignore_errors=True)


def _build_twice(ws: Path, build) -> None:
    got = build(ws, "//toolchains:tc", timeout=900)
    assert got.executed == {"//toolchains:tc"}, str(got)
    hexd = _recipe_hex(ws)
    tar = toolchains_root(ws / "store") / hexd / "rootfs.tar"
    first = tar.stat()
    built = json.loads((ws / "out" / "toolchains" / "tc.toolchain.json").read_text())
    info = find_toolchain(ws / "store", built["toolchain"])
    assert built["rootfs"] == str(info.rootfs) and built["rootfs_platform"] == info.platform_value
    lock = (ws / "out" / "toolchains" / "tc.lock").read_text()
    assert "deb python3=" in lock
    assert not (ws / "toolchains" / "tc.lock").exists()

    again = build(ws, "//toolchains:tc")
    assert again.cached == {"//toolchains:tc"} and not again.executed, str(again)
    assert tar.stat().st_mtime_ns == first.st_mtime_ns and tar.stat().st_ino == first.st_ino
    for out in ("tc.toolchain.json", "tc.lock"):
        assert (ws / "out" / "toolchains" / out).exists()


@pytest.mark.e2e
def test_an_action_naming_the_recipe_runs_in_the_tree_built_from_it() -> None:
    """What rules give (`numpy@recipe:<hex>`) runs in the same tree as `numpy@<rootfs hex>`,
    and the result records which tree that was."""
    from rsi.action import Action
    from rsi.digest import FileNode
    from rsi.store import LocalStore
    from rsi.toolchain.testing import (
        built_toolchain,
        bwrap_skip_reason,
        skip_or_fail,
        test_store_dir,
    )

    reason = bwrap_skip_reason()
    if reason:
        skip_or_fail(reason)
    from rsi.executors.bwrap import BwrapExecutor

    tc = built_toolchain("numpy")
    store = LocalStore(test_store_dir())
    script = store.put_bytes(b"import numpy\nopen('out/v', 'w').write(numpy.__version__)\n")
    action = Action(
        argv=("python3", "src/v.py"),
        inputs=(("src/v.py", FileNode(script)),),
        outputs=("out/v",),
        platform=(("toolchain", tc.recipe_value),),
        timeout_s=60,
    )
    result = BwrapExecutor().run(action, store)
    assert result.ok, result
    assert store.read_bytes(result.output_map["out/v"].digest) == b"2.4.6"
    assert result.host["rootfs"] == str(tc.rootfs)
    assert find_toolchain(store.root, tc.recipe_value) == tc


@pytest.mark.fast
def test_a_cancelled_build_stops_its_subprocess_with_its_process_group(tmp_path) -> None:
    """Ctrl-C of a build sets `cancel`: mmdebstrap or pip (here a shell and its child) end."""
    import importlib
    import threading
    import time

    tc_build = importlib.import_module("rsi.toolchain.build")
    cancel = threading.Event()
    pid_file = tmp_path / "child"
    threading.Timer(0.5, cancel.set).start()
    t0 = time.monotonic()
    with pytest.raises(ToolchainError, match="cancelled"):
        tc_build._call(["sh", "-c", f"sleep 60 & echo $! > {pid_file}; wait"], cancel)
    assert time.monotonic() - t0 < 20
    child = int(pid_file.read_text())
    for _ in range(50):
        try:  # NB: a zombie (state Z) has ended; a pid 1 that does not reap keeps it listed
            if Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
        except FileNotFoundError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the child {child} of the cancelled step is still running")
