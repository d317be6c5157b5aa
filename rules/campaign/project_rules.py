"""The external-project rules: `external_project` (a frozen tree, its protocol files and commands)
and the campaign baseline that snapshots it into the store, plus the actions that judge one
project candidate. Must never run the project's commands at analysis time."""

import json
import os
from typing import Mapping

from rsi.attrs import attr
from rsi.digest import Digest
from rsi.errors import RsiError
from rsi.rule import Artifact, Provider, Rule, RuleContext
from rules.campaign.model import project_spec
from rules.campaign.rule_common import tool_platform
from rules import steps
from rules.domain import (
    render_action,
    toolchain_platform,
)
from rules.providers import (
    ProjectBaseline,
    ProjectDecl,
    dep_info,
)
from rules.steps import ENV, HARNESS_EXEC, NO_SITE, PY, harness_files


def _external_project(ctx: RuleContext) -> Provider:
    a = ctx.attrs
    spec = project_spec(a, lambda msg, field_name, hint=None: ctx.error(msg, field_name, hint))
    return Provider(
        info=ProjectDecl(
            spec=spec,
            root=a["root"],
            editable=tuple(a["editable"]),
            protocol=tuple(a["protocol"]),
            exclude=tuple(a["exclude"]),
            platform=toolchain_platform(ctx, a["toolchain"]),
            timeout_s=a["timeout_s"],
        )
    )


EXTERNAL_PROJECT = Rule(
    name="external_project",
    doc="A user's own repository as a source of work: what a candidate may edit, a quality "
    "command whose JSON output names a boolean, a benchmark command that prints samples, and "
    "the metric's direction. A campaign freezes the tree (protocol files hashed) when it "
    "starts; every command runs as a sandboxed action in a fresh scratch copy.",
    attrs={
        "root": attr(
            "string", "the project folder, absolute or relative to this package", nonempty=True
        ),
        "editable": attr(
            "string_list",
            "paths or shell patterns (relative to root) a candidate "
            "may change; 'dir/' names a folder",
            nonempty=True,
        ),
        "protocol": attr(
            "string_list",
            "files that define the judge (benchmark, quality); must "
            "exist and lie outside the editable scope",
            default=[],
        ),
        "quality_cmd": attr("string", "shell command; prints JSON on stdout", nonempty=True),
        "quality_field": attr(
            "string", "dotted path of the boolean in the quality JSON", nonempty=True
        ),
        "benchmark_cmd": attr(
            "string",
            "shell command; prints samples (one number per line, a JSON list, or one "
            '{"samples": [...]} object and nothing else beside it)',
            nonempty=True,
        ),
        "metric": attr(
            "string", "name of the sampled quantity (e.g. seconds, tokens_per_s)", nonempty=True
        ),
        "direction": attr("string", "minimize or maximize", choices=("minimize", "maximize")),
        "measure": attr("table", "{pairs = N}: paired AB/BA runs per measurement", default={}),
        "assess": attr(
            "table", "min_improvement, confidence, bootstrap_resamples, min_pairs", default={}
        ),
        "seed": attr("int", "exported as RSI_SEED (derived per pair) to the commands", default=0),
        "env": attr(
            "string_dict", "extra environment for the commands", default={}, environment=True
        ),
        "exclude": attr(
            "string_list",
            "names never snapshotted (besides .git, __pycache__, .venv, node_modules, ...)",
            default=[],
        ),
        "toolchain": attr(
            "label",
            "a toolchain target; default: the interpreter rsi runs on "
            "(`python3` in a command is the toolchain's interpreter)",
            default=None,
        ),
        "command_timeout_s": attr(
            "float",
            "limit of one command run",
            default=300.0,
            minimum=0,
            exclusive_minimum=True,
            maximum=7 * 86400,
        ),
        "timeout_s": attr(
            "float",
            "limit of each action",
            default=1800.0,
            minimum=0,
            exclusive_minimum=True,
            maximum=7 * 86400,
        ),
        "doc": attr("string", "free text", default=""),
        "tags": attr("string_list", "", default=[]),
    },
    impl=_external_project,
)


def digest_artifacts(
    ctx: RuleContext, base: str, files: Mapping[str, str], executable
) -> tuple[Artifact, ...]:
    exe = set(executable or ())
    arts = []
    for rel, digest in sorted(files.items()):
        norm = os.path.normpath(rel)
        if rel.startswith("/") or norm.startswith("..") or norm != rel:
            raise ctx.error(f"snapshot path {rel!r} is not a clean relative path", "files")
        try:
            d = Digest.parse(digest)
        except RsiError as exc:
            raise ctx.error(exc.message, "files") from None
        arts.append(Artifact(ctx.exec_path(f"{base}/{rel}"), digest=d, executable=rel in exe))
    return tuple(arts)


def snapshot_action(
    ctx: RuleContext,
    src_dir: str,
    files: tuple[Artifact, ...],
    dest: str,
    platform: Mapping[str, str],
) -> tuple[Artifact, ...]:
    """Copy the snapshot to outputs: `rsi cache gc` keeps blobs that results reference."""
    if not files:
        return ()
    rels = [f.path[len(src_dir) + 1 :] for f in files]
    return ctx.action(
        argv=[
            *PY,
            NO_SITE,
            f"{HARNESS_EXEC}/snapshot.py",
            "--from",
            src_dir,
            "--to",
            ctx.exec_path(dest),
        ],
        inputs=[*harness_files("snapshot"), *files],
        outputs=[f"{dest}/{r}" for r in rels],
        mnemonic="Snapshot",
        env=ENV,
        platform=platform,
        timeout_s=120,
    )


def _campaign_baseline(ctx: RuleContext) -> Provider:
    a = ctx.attrs
    decl = dep_info(ctx, "project", ProjectDecl)
    name = ctx.label.name
    platform = decl.platform
    base_dir = ctx.exec_path(f"{name}/base")
    base = digest_artifacts(ctx, f"{name}/base", a["files"], a["executable"])
    spec = dict(a["spec"] or decl.spec, frozen_manifest=a["manifest"])
    spec_file = ctx.write(f"{name}/project_spec.json", json.dumps(spec, sort_keys=True, indent=1))
    timeout = decl.timeout_s
    baseline_check = steps.QUALITY.run(
        ctx,
        out=f"{name}/baseline_check.json",
        inputs=[*base, spec_file],
        mnemonic="BaselineQuality",
        platform=platform,
        timeout_s=timeout,
        spec=spec_file.path,
        base=base_dir,
    )
    calibration = steps.BENCH.run(
        ctx,
        out=f"{name}/calibration.json",
        inputs=[*base, spec_file],
        mnemonic="Calibrate",
        platform=platform,
        timeout_s=timeout,
        spec=spec_file.path,
        base=base_dir,
    )
    snap = snapshot_action(ctx, base_dir, base, f"{name}/frozen", tool_platform(platform))
    return Provider(
        files=(baseline_check, calibration, *snap),
        info=ProjectBaseline(
            spec_file=spec_file,
            base=base,
            base_dir=base_dir,
            baseline_check=baseline_check,
            calibration=calibration,
            platform=platform,
            timeout_s=timeout,
            editable=tuple(spec["editable"]),
            manifest=a["manifest"],
        ),
    )


CAMPAIGN_BASELINE = Rule(
    name="campaign_baseline",
    doc="(generated) An external project's tree frozen at campaign start, with its own quality "
    "run and A/A calibration, shared by every round.",
    attrs={
        "project": attr("label", "the external_project target"),
        "files": attr("table", "{path: digest} of the frozen tree"),
        "executable": attr("string_list", "executable files", default=[]),
        "manifest": attr("string", "digest of the frozen manifest"),
        "spec": attr(
            "table", "the judge (commands, scope, policy) recorded at the start", default={}
        ),
    },
    impl=_campaign_baseline,
)


def project_actions(
    ctx: RuleContext, base: Provider, cand_files, cand_dir: str, prefix: str
) -> dict[str, Artifact]:
    """Quality, paired benchmark, assessment and table for one candidate of a project."""
    info = ProjectBaseline.of(base)
    spec, platform, timeout = info.spec_file, info.platform, info.timeout_s
    out: dict[str, Artifact] = {}
    runs = {"spec": spec.path, "base": info.base_dir, "overlay": cand_dir}
    out["check"] = steps.QUALITY.run(
        ctx,
        out=f"{prefix}check.json",
        inputs=[*info.base, *cand_files, spec],
        mnemonic="Quality",
        platform=platform,
        timeout_s=timeout,
        **runs,
    )
    out["samples"] = steps.BENCH.run(
        ctx,
        out=f"{prefix}samples.json",
        inputs=[*info.base, *cand_files, spec],
        mnemonic="Bench",
        platform=platform,
        timeout_s=timeout,
        **runs,
    )
    out["verdict"] = steps.PROJECT_ASSESS.run(
        ctx,
        out=f"{prefix}verdict.json",
        inputs=[spec, out["samples"], out["check"], info.baseline_check, info.calibration],
        mnemonic="Assess",
        platform=platform,
        timeout_s=120,
        spec=spec.path,
        samples=out["samples"].path,
        check=out["check"].path,
        baseline_check=info.baseline_check.path,
        calibration=info.calibration.path,
    )
    out["table"] = render_action(ctx, out["verdict"], out["check"], prefix, platform)
    return out
