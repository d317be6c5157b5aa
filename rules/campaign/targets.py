"""Campaign rules: a binding (or an external project) plus a budget, and the targets derived
from the campaign's append-only log — `<c>.round-N`, `<c>.best`, `<c>.final`, `<c>.report`.

The `campaign` rule's `generate` hook reads the log while the package loads; everything else is
an action with a key. This module never reads the clock or runs a measurement; the service
(rules.campaign.service) enforces budget and deadline against the log.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Mapping

from rsi.action import UNCACHED_EXIT_ENV
from rsi.attrs import attr
from rsi.digest import Digest
from rsi.errors import RsiError
from rsi.label import Label
from rsi.rule import Artifact, GeneratedTarget, Provider, Rule, RuleContext
from rules.campaign.log import CampaignLog
from rules.campaign.model import Policy, ended_reason, policy_of, project_spec, state_of
from rules.campaign.paths import in_scope
from rules.campaign.snapshot import manifest_digest
from rules import steps
from rules.domain import (
    host_python_identity,
    render_action,
    toolchain_platform,
    verdict_actions,
)
from rules.providers import (
    BestInfo,
    BindingInfo,
    CampaignInfo,
    DashboardInfo,
    FinalInfo,
    ProjectBaseline,
    ProjectDecl,
    ReportInfo,
    RoundInfo,
    dep_info,
    dep_infos,
)
from rules.review import review_action
from rules.spec_checks import ASSESS_KEYS, check_policy
from rules.steps import ENV, HARNESS_EXEC, NO_SITE, PY, harness_files, plan_step


def tool_platform(platform: Mapping[str, str]) -> dict[str, str]:
    """The platform of a campaign's bookkeeping actions (round document, snapshot, selection,
    report, pending final): the toolchain only. They time nothing and touch no device, so they
    never inherit a binding's `accelerator` (or any device request) and never wait for one."""
    return {"toolchain": platform["toolchain"]} if "toolchain" in platform else {}


def _union(*groups: tuple[Artifact, ...]) -> tuple[Artifact, ...]:
    seen: dict[str, Artifact] = {}
    for group in groups:
        for art in group:
            seen.setdefault(art.path, art)
    return tuple(seen.values())


def _where(ctx: RuleContext) -> tuple[str, str]:
    return ctx.build_file, str(ctx.label)


def _binding_kind(info: Any) -> str | None:
    if isinstance(info, ProjectDecl):
        return "project"
    if isinstance(info, BindingInfo):
        return "task"
    return None


def _campaign(ctx: RuleContext) -> Provider:
    a = ctx.attrs
    policy = policy_of(a, *_where(ctx))
    binding = ctx.dep(a["binding"])
    kind = _binding_kind(binding.info)
    if kind is None:
        raise ctx.error(
            f"{a['binding']} is neither a binding nor an external_project",
            "binding",
            "point binding at a `binding` or `external_project` target",
        )
    return Provider(
        files=binding.files if kind == "task" else (),
        info=CampaignInfo(policy=policy.to_json(), kind=kind, binding=str(a["binding"])),
    )


def session_attrs(entries: list[dict]) -> dict[str, dict]:
    """Each bound dispatch of the log: {dispatch, session, model} (rules/campaign/agents.py)."""
    out = {}
    for e in entries:
        if e.get("kind") == "bind" and isinstance(e.get("dispatch"), str):
            out.setdefault(
                e["dispatch"],
                {"dispatch": e["dispatch"], "session": e.get("session"), "model": e.get("model")},
            )
    return out


def _generate(label: Label, attrs: dict, settings: Mapping[str, Any]) -> list[GeneratedTarget]:
    store = settings.get("store")
    if not store:
        return []
    log = CampaignLog(store, label)
    track = settings.get("track_file")
    if track is not None:
        track(log.path)  # NB: the analysis cache must see every append
    entries = log.read()
    state = state_of(entries)
    if state.start is None and not state.candidates:
        return []
    where = (f"{label.package}/BUILD.toml", str(label))
    # NB: a campaign is fixed at its start: its targets follow the policy and binding recorded
    # then (the CLI refuses to go on when the declaration has drifted; status reports it)
    recorded = (state.start or {}).get("policy")
    policy = Policy.from_json(recorded, *where) if recorded else policy_of(attrs, *where)
    name, pkg = label.name, label.package
    binding = (state.start or {}).get("binding") or str(attrs["binding"])
    out: list[GeneratedTarget] = []
    project = (state.start or {}).get("project")
    if project:
        base = f"{name}.baseline"
        out.append(
            GeneratedTarget(
                base,
                "campaign_baseline",
                {
                    "project": binding,
                    "files": project["files"],
                    "executable": project.get("executable", []),
                    "manifest": project["manifest"],
                    "spec": project.get("spec") or {},
                },
            )
        )
        binding = str(Label(pkg, base))
    rounds, abandoned = [], []
    sessions = session_attrs(entries)
    for number, cand in enumerate(state.candidates, 1):
        round_name = f"{name}.round-{number}"
        out.append(
            GeneratedTarget(
                round_name,
                "campaign_round",
                {
                    "binding": binding,
                    "campaign": str(label),
                    "round": number,
                    "files": cand["files"],
                    "executable": cand.get("executable", []),
                    "digest": cand["digest"],
                    "hypothesis": cand.get("hypothesis") or "",
                    "usage": cand.get("usage") or {},
                    "submitted_at": cand["time"],
                    "assess": state.assess_override,
                    "session": sessions.get(cand.get("session")) or {},
                    "knowledge": [k for k in cand.get("knowledge") or [] if isinstance(k, str)],
                },
            )
        )
        gave_up = state.abandoned.get(number)
        if gave_up is None:
            rounds.append(str(Label(pkg, round_name)))
        else:  # NB: still a round (it used the budget), never selected, never waited for
            abandoned.append(
                {
                    "round": number,
                    "label": str(Label(pkg, round_name)),
                    "reason": gave_up.get("reason") or "",
                    "time": gave_up["time"],
                    "candidate_digest": cand["digest"],
                    "hypothesis": cand.get("hypothesis") or None,
                    "usage": cand.get("usage") or {},
                }
            )
    if not state.candidates:
        return out
    best, final = str(Label(pkg, f"{name}.best")), str(Label(pkg, f"{name}.final"))
    reason = ended_reason(policy, state)
    out.append(
        GeneratedTarget(f"{name}.best", "campaign_best", {"rounds": rounds, "binding": binding})
    )
    out.append(
        GeneratedTarget(
            f"{name}.final",
            "campaign_final",
            {
                "binding": binding,
                "best": best,
                "rounds": rounds,
                "campaign": str(label),
                "ended": reason or "",
                "accepted": list(policy.stop_on),
                "rounds_used": len(state.candidates),
                "max_rounds": policy.max_rounds,
                "final_seed": policy.final_seed,
            },
        )
    )
    out.append(
        GeneratedTarget(
            f"{name}.report",
            "campaign_report",
            {
                "campaign": str(label),
                "rounds": rounds,
                "best": best,
                "final": final,
                "binding": binding,
                "abandoned": abandoned,
            },
        )
    )
    out.append(
        GeneratedTarget(
            f"{name}.dashboard",
            "campaign_dashboard",
            {
                "campaign": str(label),
                "rounds": rounds,
                "final": final,
                "report": str(Label(pkg, f"{name}.report")),
                "binding": binding,
                "kind": "project" if project else "task",
                "started_at": state.started_at,
                "max_rounds": policy.max_rounds,
            },
        )
    )
    return out


CAMPAIGN = Rule(
    name="campaign",
    doc="A budgeted series of rounds under one binding (or external project). Candidates arrive "
    "through `rsi candidate add` / `rsi round` into an append-only log; the targets "
    "<name>.round-N, <name>.best, <name>.final, <name>.report and <name>.dashboard (the HTML "
    "report) are derived from it.",
    attrs={
        "binding": attr("label", "the binding (or external_project) every round is judged under"),
        "rounds": attr("table", "{exact = N} or {up_to = N}"),
        "deadline_s": attr(
            "float",
            "wall-clock seconds from the campaign's start (its first log "
            "entry) to the end of the final",
            default=None,
        ),
        "final_reserve_s": attr(
            "float",
            "the last seconds before the deadline, kept for the final: rounds are refused in them",
            default=0.0,
        ),
        "stop_on": attr(
            "string_list",
            "the reasons that complete the campaign: rounds (budget "
            "used), deadline (round window closed), agent (`rsi campaign stop`, "
            "up_to only); default: all that apply",
            default=None,
        ),
        "final_seed": attr(
            "int",
            "mixed into every seed of the final's specs, so its inputs differ from every round's",
            default=1,
        ),
        "knowledge": attr(
            "table",
            'what `rsi campaign knowledge` may retrieve: {enabled = true, sources = ["docs", '
            '"evidence", "notes", or package-relative files/folders], budget_chars = 6000}; '
            "fixed at the start (switching it is a new campaign)",
            default=None,
        ),
        "doc": attr("string", "free text", default=""),
        "tags": attr("string_list", "", default=[]),
    },
    impl=_campaign,
    generate=_generate,
)


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


def _digest_artifacts(
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


def _snapshot_action(
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
    base = _digest_artifacts(ctx, f"{name}/base", a["files"], a["executable"])
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
    snap = _snapshot_action(ctx, base_dir, base, f"{name}/frozen", tool_platform(platform))
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


def evidence_dir(ctx: RuleContext, binding: Label | str) -> str:
    """Where a round's judge evidence lives for `binding`: package-relative, named by the
    binding (its package too when that is another one)."""
    label = Label.parse(str(binding))
    if label.package == ctx.label.package:
        return f"_evidence/{label.name}"
    return f"_evidence/{label.package.replace('/', '.')}.{label.name}"


def _round(ctx: RuleContext) -> Provider:
    a = ctx.attrs
    dep_info(ctx, "binding", BindingInfo, ProjectBaseline)
    check_policy(a["assess"], ASSESS_KEYS, "assess", ctx.error)
    binding = ctx.dep(a["binding"])
    name = ctx.label.name
    kind = "project" if isinstance(binding.info, ProjectBaseline) else "task"
    # NB: the candidate and its evidence live at paths named by the binding and the content
    # (never by the round or the campaign), so the same content under the same binding has
    # the same check, measure and assess keys in any round of any campaign of this package:
    # it is judged once, and every later round reuses that evidence
    content = manifest_digest(a["files"], a["executable"]).split("/")[0]
    evidence = f"{evidence_dir(ctx, a['binding'])}/{content}/"
    cand_rel = f"_cand/{content}"
    cand_dir = ctx.exec_path(cand_rel)
    files = _digest_artifacts(ctx, cand_rel, a["files"], a["executable"])
    if not files:
        raise ctx.error("the candidate holds no files", "files")
    if kind == "task":
        info = BindingInfo.of(binding)
        editable = set(info.editable)
        outside = sorted(set(a["files"]) - editable)
        if outside:
            raise ctx.error(
                f"{', '.join(outside)} lie outside the editable scope "
                f"({', '.join(sorted(editable))})",
                "files",
            )
        assess_spec, verdict_dir = None, evidence
        full = info.full_spec
        if a["assess"] and dict(full["assess"], **a["assess"]) != full["assess"]:
            text = json.dumps(
                dict(full, assess=dict(full["assess"], **a["assess"])), sort_keys=True, indent=1
            )
            # NB: a regraded policy's verdict lives apart from the declared policy's
            policy = hashlib.sha256(text.encode()).hexdigest()[:16]
            verdict_dir = f"{evidence}assess-{policy}/"
            assess_spec = ctx.write(f"{verdict_dir}assess_spec.json", text)
        out = verdict_actions(
            ctx,
            binding,
            files,
            cand_dir,
            prefix=verdict_dir,
            evidence=evidence,
            assess_spec=assess_spec,
        )
        # NB: beside the check (under the content's evidence folder, so it is reviewed once);
        # it reads source and evidence, times nothing and needs no device
        out["review"] = review_action(
            ctx, info, files, cand_dir, evidence, out["check"], tool_platform(info.platform)
        )
    else:
        patterns = ProjectBaseline.of(binding).editable
        outside = sorted(f for f in a["files"] if not in_scope(f, patterns))
        if outside:
            raise ctx.error(f"{', '.join(outside)} lie outside the editable scope", "files")
        out = project_actions(ctx, binding, files, cand_dir, prefix=evidence)
    platform = binding.info.platform
    tools = tool_platform(platform)
    meta = ctx.write(
        f"{name}/meta.json",
        json.dumps(
            {
                "campaign": a["campaign"],
                "round": a["round"],
                "label": str(ctx.label),
                "kind": kind,
                "digest": a["digest"],
                "files": dict(sorted(a["files"].items())),
                "hypothesis": a["hypothesis"],
                "usage": a["usage"],
                "submitted_at": a["submitted_at"],
                # NB: only when set, so a round without them keeps its document's key
                **({"session": dict(a["session"])} if a["session"] else {}),
                **({"knowledge": list(a["knowledge"])} if a["knowledge"] else {}),
            },
            sort_keys=True,
            indent=1,
        ),
    )
    review = out.get("review")
    doc = steps.ROUND_DOC.run(
        ctx,
        out=f"{name}/round.json",
        inputs=[meta, out["verdict"], out["check"], *((review,) if review else ())],
        mnemonic="RoundDoc",
        platform=tools,
        timeout_s=60,
        meta=meta.path,
        verdict=out["verdict"].path,
        check=out["check"].path,
        review=review.path if review else None,
    )
    snap = _snapshot_action(ctx, cand_dir, files, f"{name}/files", tools)
    return Provider(
        files=(
            doc,
            out["verdict"],
            out["table"],
            out["check"],
            out["samples"],
            *((review,) if review else ()),
            *snap,
        ),
        info=RoundInfo(
            show=out["table"].path,
            round=a["round"],
            doc=doc,
            verdict=out["verdict"],
            check=out["check"],
            samples=out["samples"],
            table=out["table"],
            cand_files=files,
            cand_dir=cand_dir,
            kind=kind,
            platform=platform,
            review=review,
        ),
    )


CAMPAIGN_ROUND = Rule(
    name="campaign_round",
    doc="(generated) One campaign round: the logged candidate materialised from the store and "
    "judged under the campaign's binding, plus its round document (round.json).",
    attrs={
        "binding": attr("label", "the binding, or the campaign's frozen project baseline"),
        "campaign": attr("string", "the campaign label"),
        "round": attr("int", "1-based round number"),
        "files": attr("table", "{path: digest} of the candidate"),
        "executable": attr("string_list", "executable files of the candidate", default=[]),
        "digest": attr("string", "the candidate's manifest digest"),
        "hypothesis": attr("string", "why the agent expects it to be faster", default=""),
        "usage": attr("table", "what the agent reported spending", default={}),
        "submitted_at": attr("float", "log time of the entry"),
        "assess": attr(
            "table",
            "the assessment policy of the campaign's last regrade (empty: the binding's)",
            default={},
        ),
        "session": attr(
            "table",
            "the agent session that made the candidate: dispatch, session, model (empty: none "
            "named)",
            default={},
        ),
        "knowledge": attr(
            "string_list",
            "digests of the knowledge records retrieved before the candidate was submitted",
            default=[],
        ),
    },
    impl=_round,
)


def _best(ctx: RuleContext) -> Provider:
    docs = [r.doc for r in dep_infos(ctx, "rounds", RoundInfo)]
    platform = tool_platform(dep_info(ctx, "binding", BindingInfo, ProjectBaseline).platform)
    argv = [*PY, NO_SITE, f"{HARNESS_EXEC}/select.py"]
    for d in docs:
        argv += ["--round", d.path]
    best = ctx.action(
        argv=[*argv, "--out", ctx.exec_path(f"{ctx.label.name}/best.json")],
        inputs=[*harness_files("select"), *docs],
        outputs=[f"{ctx.label.name}/best.json"],
        mnemonic="Select",
        env=ENV,
        platform=platform,
        timeout_s=60,
    )[0]
    return Provider(files=(best,), info=BestInfo(best=best))


CAMPAIGN_BEST = Rule(
    name="campaign_best",
    doc="(generated) The campaign's best round: highest paired improvement against its own "
    "baseline among PASS rounds (never absolute numbers across rounds); abandoned rounds "
    "are not among its rounds.",
    attrs={
        "rounds": attr("label_list", "the round targets (abandoned rounds left out)"),
        "binding": attr("label", "the binding, or the frozen project baseline"),
    },
    impl=_best,
)


FINAL_TASK_OUTPUTS = (
    "final.json",
    "spec.json",
    "check_spec.json",
    "baseline_check.json",
    "check.json",
    "calibration.json",
    "samples.json",
    "verdict.json",
    "verdict.txt",
)


FINAL_PROJECT_OUTPUTS = (
    "final.json",
    "spec.json",
    "baseline_check.json",
    "check.json",
    "calibration.json",
    "samples.json",
    "verdict.json",
    "verdict.txt",
)


# NB: the final re-runs a round's steps under its own plan: the same command lines (rules/
# steps.py) with placeholders final.py fills in (`{out}`, `{candidate}`, the specs, python)
TASK_FINAL_STEPS = (steps.CHECK, steps.MEASURE, steps.ASSESS)
PROJECT_FINAL_STEPS = (steps.QUALITY, steps.BENCH, steps.PROJECT_ASSESS, steps.RENDER)


def _verdict_plan(assess: steps.Step) -> list[dict]:
    """The assessment and its table, over the plan's own outputs (a task's assessment writes
    the table itself; a project's is rendered after it)."""
    evidence = {
        "spec": "{spec}",
        "samples": "{out}/samples.json",
        "check": "{out}/check.json",
        "baseline_check": "{out}/baseline_check.json",
        "calibration": "{out}/calibration.json",
        "out": "{out}/verdict.json",
    }
    if "text" in assess.outs:
        return [plan_step("verdict", assess, **evidence, text="{out}/verdict.txt")]
    return [
        plan_step("verdict", assess, **evidence),
        plan_step(
            "table",
            steps.RENDER,
            verdict="{out}/verdict.json",
            check="{out}/check.json",
            out="{out}/verdict.txt",
        ),
    ]


def _task_plan(info: BindingInfo) -> dict:
    task, base = info.task_dir, info.baseline_dir
    check_step, measure_step = steps.judge_steps(info.full_spec)
    check = {"task": task, "spec": "{check_spec}"}
    measure = {"task": task, "baseline": base, "spec": "{spec}"}
    return {
        "specs": {"spec": info.spec_file.path, "check_spec": info.check_spec_file.path},
        "outputs": list(FINAL_TASK_OUTPUTS),
        "steps": [
            plan_step(
                "baseline_check", check_step, **check, impl=base, out="{out}/baseline_check.json"
            ),
            plan_step("check", check_step, **check, impl="{candidate}", out="{out}/check.json"),
            plan_step(
                "calibration",
                measure_step,
                **measure,
                candidate=base,
                out="{out}/calibration.json",
            ),
            plan_step(
                "samples",
                measure_step,
                **measure,
                candidate="{candidate}",
                out="{out}/samples.json",
            ),
            *_verdict_plan(steps.ASSESS),
        ],
    }


def _project_plan(info: ProjectBaseline) -> dict:
    runs = {"spec": "{spec}", "base": info.base_dir}
    return {
        "specs": {"spec": info.spec_file.path},
        "outputs": list(FINAL_PROJECT_OUTPUTS),
        "steps": [
            plan_step("baseline_check", steps.QUALITY, **runs, out="{out}/baseline_check.json"),
            plan_step(
                "check", steps.QUALITY, **runs, overlay="{candidate}", out="{out}/check.json"
            ),
            plan_step("calibration", steps.BENCH, **runs, out="{out}/calibration.json"),
            plan_step(
                "samples", steps.BENCH, **runs, overlay="{candidate}", out="{out}/samples.json"
            ),
            *_verdict_plan(steps.PROJECT_ASSESS),
        ],
    }


def _pending_message(a: Mapping[str, Any]) -> str:
    if not a["ended"]:
        return (
            f"the campaign is still open ({a['rounds_used']} of {a['max_rounds']} rounds "
            "used); the final is built once it ends: use the budget, reach the deadline, or "
            f"`rsi campaign stop {a['campaign']}` where the campaign accepts it"
        )
    return (
        f"the campaign ended by '{a['ended']}', which it does not accept "
        f"(stop_on = {list(a['accepted'])}): it has no valid final"
    )


def _final(ctx: RuleContext) -> Provider:
    a = ctx.attrs
    name = ctx.label.name
    platform = tool_platform(dep_info(ctx, "binding", BindingInfo, ProjectBaseline).platform)
    # NB: checked before the pending branch too, so a wrong kind is refused either way
    rounds = dep_infos(ctx, "rounds", RoundInfo)
    best = dep_info(ctx, "best", BestInfo).best
    if not a["ended"] or a["ended"] not in a["accepted"]:
        doc = ctx.action(
            argv=[
                *PY,
                NO_SITE,
                f"{HARNESS_EXEC}/final.py",
                "--pending",
                _pending_message(a),
                "--out-dir",
                ctx.exec_path(name),
            ],
            inputs=harness_files("final"),
            outputs=[f"{name}/final.json"],
            mnemonic="FinalPending",
            env=ENV,
            platform=platform,
            timeout_s=60,
        )[0]
        return Provider(files=(doc,), info=FinalInfo(final=doc, state="pending", show=None))
    info = dep_info(ctx, "binding", BindingInfo, ProjectBaseline)
    if isinstance(info, ProjectBaseline):
        plan, used = _project_plan(info), PROJECT_FINAL_STEPS
        inputs = [*info.base, info.spec_file]
    else:
        info = BindingInfo.of(ctx.dep(a["binding"]))
        plan, used = _task_plan(info), (*steps.judge_steps(info.full_spec), steps.ASSESS)
        inputs = [*info.runtime, *info.baseline, info.spec_file, info.check_spec_file]
    inputs = [*(f for step in used for f in step.files()), *inputs]
    plan["schema"] = "rsi.campaign.final_plan/1"
    plan["candidates"] = {str(r.round): r.cand_dir for r in rounds}
    plan_file = ctx.write(f"{name}/plan.json", json.dumps(plan, sort_keys=True, indent=1))
    cand_files = [f for r in rounds for f in r.cand_files]
    outs = ctx.action(
        argv=[
            *PY,
            NO_SITE,
            f"{HARNESS_EXEC}/final.py",
            "--plan",
            plan_file.path,
            "--best",
            best.path,
            "--seed",
            str(a["final_seed"]),
            "--out-dir",
            ctx.exec_path(name),
        ],
        inputs=_union(harness_files("final"), tuple(inputs), (plan_file, best), tuple(cand_files)),
        outputs=[f"{name}/{o}" for o in plan["outputs"]],
        mnemonic="Final",
        # NB: final.py exits 75 when a step's documents must not be cached (a busy host)
        env={**ENV, UNCACHED_EXIT_ENV: str(steps.BUSY_EXIT)},
        platform=info.platform,
        timeout_s=float(info.timeout_s) * 4,
        tags=["exclusive"],
    )
    by_name = {o.path.rsplit("/", 1)[-1]: o for o in outs}
    return Provider(
        files=outs,
        info=FinalInfo(
            final=by_name["final.json"], state="ended", show=by_name["verdict.txt"].path
        ),
    )


CAMPAIGN_FINAL = Rule(
    name="campaign_final",
    doc="(generated) The campaign's final: an independent re-measure of the selected candidate "
    "against the baseline with fresh seeds and fresh processes (its own action keys). Until "
    "the campaign ends, a pending document.",
    attrs={
        "binding": attr("label", "the binding, or the frozen project baseline"),
        "best": attr("label", "the campaign's best target"),
        "rounds": attr("label_list", "the round targets (abandoned rounds left out)"),
        "campaign": attr("string", "the campaign label"),
        "ended": attr("string", "why the rounds are over ('' while open)", default=""),
        "accepted": attr("string_list", "the campaign's stop_on"),
        "rounds_used": attr("int", "rounds in the log (abandoned ones included)"),
        "max_rounds": attr("int", "the campaign's round budget"),
        "final_seed": attr("int", "the campaign's final_seed", default=1),
    },
    impl=_final,
)


def _report(ctx: RuleContext) -> Provider:
    a = ctx.attrs
    name = ctx.label.name
    docs = [r.doc for r in dep_infos(ctx, "rounds", RoundInfo)]
    best = dep_info(ctx, "best", BestInfo).best
    final = dep_info(ctx, "final", FinalInfo).final
    argv = [*PY, NO_SITE, f"{HARNESS_EXEC}/report.py", "--campaign", a["campaign"]]
    for d in docs:
        argv += ["--round", d.path]
    extra = []
    if a["abandoned"]:
        gave_up = ctx.write(
            f"{name}/abandoned.json", json.dumps(a["abandoned"], sort_keys=True, indent=1)
        )
        argv += ["--abandoned", gave_up.path]
        extra.append(gave_up)
    outs = ctx.action(
        argv=[
            *argv,
            "--best",
            best.path,
            "--final",
            final.path,
            "--out-json",
            ctx.exec_path(f"{name}/report.json"),
            "--out-md",
            ctx.exec_path(f"{name}/report.md"),
        ],
        inputs=[*harness_files("report"), *docs, best, final, *extra],
        outputs=[f"{name}/report.json", f"{name}/report.md"],
        mnemonic="Report",
        env=ENV,
        platform=tool_platform(dep_info(ctx, "binding", BindingInfo, ProjectBaseline).platform),
        timeout_s=60,
    )
    return Provider(files=outs, info=ReportInfo(json=outs[0], markdown=outs[1], show=outs[1].path))


CAMPAIGN_REPORT = Rule(
    name="campaign_report",
    doc="(generated) The campaign's report: rounds, selection, final and usage (JSON + Markdown).",
    attrs={
        "campaign": attr("string", "the campaign label"),
        "rounds": attr("label_list", "the round targets (abandoned rounds left out)"),
        "best": attr("label", "the best target"),
        "final": attr("label", "the final target"),
        "binding": attr("label", "the binding, or the frozen project baseline"),
        "abandoned": attr(
            "table_list",
            "the abandoned rounds: round, label, reason, time, candidate_digest, hypothesis, usage",
            default=[],
        ),
    },
    impl=_report,
)


def _dashboard(ctx: RuleContext) -> Provider:
    a = ctx.attrs
    name = ctx.label.name
    rounds = dep_infos(ctx, "rounds", RoundInfo)
    report = dep_info(ctx, "report", ReportInfo)
    dep_info(ctx, "final", FinalInfo)
    dep_info(ctx, "binding", BindingInfo, ProjectBaseline)
    final = ctx.dep(a["final"])
    page = f"{name}/index.html"
    here = os.path.dirname(ctx.exec_path(page))

    def link(art: Artifact) -> str:
        # NB: relative, so the page works wherever out/ is, and its bytes name no host path
        return os.path.relpath(art.path, here)

    links = {
        str(r.round): {
            "round.json": link(r.doc),
            "verdict.json": link(r.verdict),
            "check.json": link(r.check),
            "samples.json": link(r.samples),
            "verdict.txt": link(r.table),
        }
        for r in rounds
    }
    meta = ctx.write(
        f"{name}/meta.json",
        json.dumps(
            {
                "campaign": a["campaign"],
                "binding": str(a["binding"]),
                "kind": a["kind"],
                "started_at": a["started_at"],
                "max_rounds": a["max_rounds"],
                "links": links,
                "final_links": {f.path.rsplit("/", 1)[-1]: link(f) for f in final.files},
            },
            sort_keys=True,
            indent=1,
        ),
    )
    argv = [*PY, f"{HARNESS_EXEC}/dashboard.py", "--meta", meta.path, "--report", report.json.path]
    for r in rounds:
        argv += ["--round", r.doc.path, "--verdict", r.verdict.path]
    outs = ctx.action(
        argv=[
            *argv,
            "--out-html",
            ctx.exec_path(page),
            "--out-json",
            ctx.exec_path(f"{name}/dashboard.json"),
            "--out-txt",
            ctx.exec_path(f"{name}/summary.txt"),
        ],
        inputs=_union(
            harness_files("dashboard"),
            (meta, report.json),
            tuple(f for r in rounds for f in (r.doc, r.verdict)),
        ),
        outputs=[page, f"{name}/dashboard.json", f"{name}/summary.txt"],
        mnemonic="Dashboard",
        env=ENV,
        # NB: rendered by the interpreter rsi runs on, which has jinja2 (a dependency of rsi),
        # whatever toolchain the binding's rounds ran in; it times nothing and needs no device
        platform={"toolchain": host_python_identity(("dashboard",))},
        timeout_s=120,
    )
    evidence = tuple(f for r in rounds for f in (r.doc, r.verdict, r.check, r.samples, r.table))
    return Provider(
        files=_union(outs, evidence, tuple(final.files), (report.json, report.markdown)),
        info=DashboardInfo(html=outs[0], json=outs[1], text=outs[2], show=outs[2].path),
    )


CAMPAIGN_DASHBOARD = Rule(
    name="campaign_dashboard",
    doc="(generated) The campaign's HTML report (index.html: curves, intervals, reasons, "
    "cost, final, fingerprint; self-contained), its view model (dashboard.json) and a text "
    "summary with the same fields. Building it also copies the evidence it links under out/.",
    attrs={
        "campaign": attr("string", "the campaign label"),
        "rounds": attr("label_list", "the round targets (abandoned rounds left out)"),
        "final": attr("label", "the final target"),
        "report": attr("label", "the report target"),
        "binding": attr("label", "the binding, or the frozen project baseline"),
        "kind": attr("string", "task or project"),
        "started_at": attr("float", "log time of the campaign's start", default=None),
        "max_rounds": attr("int", "the campaign's round budget"),
    },
    impl=_dashboard,
)


RULES = [
    CAMPAIGN,
    EXTERNAL_PROJECT,
    CAMPAIGN_BASELINE,
    CAMPAIGN_ROUND,
    CAMPAIGN_BEST,
    CAMPAIGN_FINAL,
    CAMPAIGN_REPORT,
    CAMPAIGN_DASHBOARD,
]
