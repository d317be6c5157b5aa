"""Targets whose actions need a device the host lacks (Bazel's incompatible targets): a pattern
skips them and everything downstream ("skipped: needs cuda") and the build passes if the rest
built; naming one explicitly fails with that reason. The engine compares an action's platform
with what the executor provides; `RSI_HOST_ACCELERATORS` stands in for the host's devices."""

from __future__ import annotations

import os

import pytest

# NB: a rule family of the test workspace: one action whose platform asks for `accelerator`,
# the way rules/domain.py declares a cuda binding's actions
DEVICE_RULE = """
from rsi.attrs import attr
from rsi.rule import Provider, Rule


def _device_command(ctx):
    a = ctx.attrs
    inputs = [f for dep in a["deps"] for f in ctx.dep(dep).all_files]
    out = ctx.exec_path(a["out"])
    platform = {"accelerator": a["accelerator"]} if a["accelerator"] else {}
    files = ctx.action(
        argv=["/bin/sh", "-c", "cat /dev/null " + " ".join(f.path for f in inputs) + " > " + out],
        inputs=inputs,
        outputs=[a["out"]],
        mnemonic="Device",
        env={"PATH": "/usr/bin:/bin"},
        platform=platform,
    )
    return Provider(files=files)


def rules():
    return [
        Rule(
            name="device_command",
            doc="an action that asks for an accelerator",
            attrs={
                "out": attr("string", "output file"),
                "accelerator": attr("string", "accelerator it needs", default=""),
                "deps": attr("label_list", "inputs", default=[]),
            },
            impl=_device_command,
        )
    ]
"""


@pytest.fixture
def mixed(make_workspace, command, tmp_path):
    """CPU targets, a target that needs cuda, one downstream of it, and a CPU action that both
    a CPU target and the cuda target use."""
    build_toml = (
        command("prep", cmd="echo prep > $(OUT)", outs=["prep.txt"])
        + command("cpu", cmd="cat $(location :prep) > $(OUT)", outs=["cpu.txt"], deps=[":prep"])
        + '[gpu]\nrule = "device_command"\nout = "gpu.txt"\naccelerator = "cuda"\n'
        'deps = [":prep"]\n\n'
        + command("report", cmd="cat $(location :gpu) > $(OUT)", outs=["r.txt"], deps=[":gpu"])
    )
    return make_workspace(
        tmp_path,
        {"BUILD.toml": build_toml, "device_rules.py": DEVICE_RULE},
        config='[workspace]\nrules = ["device_rules:rules"]\n',
    )


def _env(ws, accelerators: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ws), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, "RSI_HOST_ACCELERATORS": accelerators}


@pytest.mark.e2e
def test_a_pattern_skips_targets_needing_a_device_the_host_lacks_and_passes(build, mixed):
    run = build(mixed, "//...", "--keep-going", env=_env(mixed, ""))
    report = run.json()
    assert report["ok"] is True
    targets = report["targets"]
    assert targets["//:gpu"]["skipped"] == "needs cuda"
    assert targets["//:report"]["skipped"] == "needs cuda"  # downstream of it: skipped too
    assert targets["//:cpu"]["ok"] is True and targets["//:cpu"]["skipped"] is None
    assert (mixed / "out" / "cpu.txt").read_text() == "prep\n"
    assert report["counts"]["incompatible"] == 2 and report["counts"]["failed"] == 0
    # nothing that needs cuda started; the event stream says why each was skipped
    assert not [e for e in run.events if e["kind"] == "action_started" and "gpu" in e["label"]]
    skipped = {e["action"]: e for e in run.events if e["kind"] == "action_skipped"}
    assert skipped["//:gpu#Device"]["needs"] == "cuda"
    assert skipped["//:gpu#Device"]["because"] is None
    assert skipped["//:report#Command"]["because"] == "//:gpu#Device"
    finished = {e["label"]: e for e in run.events if e["kind"] == "target_finished"}
    assert finished["//:gpu"]["skipped"] == "needs cuda"
    assert run.events[-1]["kind"] == "build_finished" and run.events[-1]["ok"] is True


@pytest.mark.e2e
def test_a_pattern_without_keep_going_also_skips_them(build, mixed):
    run = build(mixed, "//...", env=_env(mixed, ""))
    assert run.json()["targets"]["//:gpu"]["skipped"] == "needs cuda"
    assert run.json()["targets"]["//:cpu"]["ok"] is True


@pytest.mark.e2e
def test_the_human_output_lists_skipped_targets_with_the_reason(run_rsi, mixed):
    run = run_rsi(mixed, "build", "//...", env=_env(mixed, ""))
    assert run.returncode == 0, run
    assert "//:gpu: skipped: needs cuda" in run.stdout
    assert "//:report: skipped: needs cuda" in run.stdout


@pytest.mark.e2e
def test_naming_a_target_that_needs_a_missing_device_fails_with_the_reason(build, mixed):
    run = build(mixed, "//:gpu", expect=1, env=_env(mixed, ""))
    target = run.json()["targets"]["//:gpu"]
    assert target["ok"] is False and target["skipped"] is None
    assert [f["status"] for f in target["failed"]] == ["incompatible"]
    assert "needs cuda" in target["failed"][0]["message"]
    assert not [e for e in run.events if e["kind"] == "action_started" and "gpu" in e["label"]]


@pytest.mark.e2e
def test_naming_a_target_downstream_of_one_fails_even_within_a_pattern(build, mixed):
    run = build(mixed, "//...", "//:report", "--keep-going", expect=1, env=_env(mixed, ""))
    targets = run.json()["targets"]
    assert targets["//:report"]["ok"] is False and targets["//:report"]["skipped"] is None
    assert any("needs cuda" in f["message"] for f in targets["//:report"]["failed"])
    assert targets["//:cpu"]["ok"] is True  # --keep-going: the rest still builds


@pytest.mark.e2e
def test_a_host_that_has_the_device_builds_those_targets(build, mixed):
    run = build(mixed, "//...", env=_env(mixed, "cuda"))
    targets = run.json()["targets"]
    assert all(t["ok"] and t["skipped"] is None for t in targets.values())
    assert "//:gpu" in run.executed


@pytest.mark.e2e
def test_a_device_model_the_host_lacks_is_named(build, make_workspace, tmp_path):
    ws = make_workspace(
        tmp_path,
        {
            "BUILD.toml": '[h]\nrule = "device_command"\nout = "h.txt"\n'
            'accelerator = "nvidia-h200"\n',
            "device_rules.py": DEVICE_RULE,
        },
        config='[workspace]\nrules = ["device_rules:rules"]\n',
    )
    run = build(ws, "//...", env=_env(ws, "cuda,nvidia-a100"))
    assert run.json()["targets"]["//:h"]["skipped"] == "needs nvidia-h200"


@pytest.mark.fast
def test_remote_execution_is_not_limited_by_this_hosts_devices() -> None:
    from rsi.build_executor import executor_capabilities
    from rsi.host import host_capabilities

    class Remote:
        name = "remote"

    class Local:
        name = "local"

    assert executor_capabilities(Remote()) is None
    assert executor_capabilities(Local()) is host_capabilities
