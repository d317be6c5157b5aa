"""Rules for optimisation tasks: `task`, `binding`, `candidate` and `verdict`.

A binding freezes a task, a toolchain and a measurement policy into one spec; a verdict for
(binding, candidate) is three actions — check, paired measure, assess — plus the binding's own
baseline check and A/A calibration, which every candidate of the binding shares by key.
The harness scripts under rules/harness run inside the sandbox; nothing here runs them.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import site
import sys
from pathlib import Path

from rsi.attrs import attr
from rsi.executors.host_python import host_python_identity as python_identity
from rsi.rule import Artifact, Provider, Rule, RuleContext
from rules import steps
from rules.providers import BindingInfo, CandidateInfo, TaskInfo, VerdictInfo, dep_info
from rules.review import review_rules
from rules.spec_checks import check_binding, check_task
from rules.step_imports import JUDGE_STEPS, step_imports

# NB: the harness steps are defined once, in rules/steps.py; these names stay importable here
HARNESS_SCRIPTS = {s: steps.SCRIPTS[s] for s in ("check", "measure", "assess", "render")}


# NB: what provides a task's framework where actions run on the interpreter rsi runs on: the
# extra of rsi's pyproject.toml that installs it (None: a dependency of rsi itself)
FRAMEWORK_EXTRAS = {"torch": "torch", "numpy": None}


def _host_can_import(module: str) -> bool:
    """Whether `python3 -I` on this interpreter (what host-python actions run) finds `module`:
    rsi's own sys.path without the current folder, $PYTHONPATH and the user's site folder."""
    skip = {os.path.realpath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    skip.add(os.path.realpath(os.getcwd()))
    try:
        skip.add(os.path.realpath(site.getusersitepackages()))
        skip -= {os.path.realpath(p) for p in site.getsitepackages()}
    except (AttributeError, OSError):
        pass
    paths = [p for p in sys.path if p and os.path.realpath(p) not in skip]
    return importlib.machinery.PathFinder.find_spec(module, paths) is not None


def check_framework(ctx: RuleContext, task_label, framework: str, field_name: str) -> None:
    """Refuse, at analysis, a binding on the interpreter rsi runs on when that interpreter
    lacks the task's framework: every check and measure would end in a harness fault
    ("No module named 'torch'"), the same for any candidate."""
    if _host_can_import(framework):
        return
    extra = FRAMEWORK_EXTRAS.get(framework)
    if extra:
        how = (
            f"install rsi's `{extra}` extra into this environment: pip install -e '.[{extra}]' "
            f"from the rsi checkout (pip install 'rsi[{extra}]' for a non-editable install; "
            "./scripts/setup.sh does it)"
        )
    else:
        how = f"install {framework} (pip install {framework}; a dependency of rsi: reinstall rsi)"
    raise ctx.error(
        f"task {task_label} needs the framework {framework!r}, which the interpreter rsi runs "
        f"on ({sys.executable}) cannot import; its checks and measurements would fail with "
        f"\"No module named '{framework}'\"",
        field_name,
        hint=f"{how}, or set `toolchain` to a toolchain target that has {framework}",
    )


def host_python_identity(steps_: tuple[str, ...] = JUDGE_STEPS) -> str:
    """`host-python@…` of the interpreter rsi runs on, as the harness `steps_` use it: its
    version and the distributions their scripts import (numpy, torch) with what those need;
    an unrelated package installed beside them (the MCP SDK) is not part of it."""
    return python_identity(step_imports(*steps_))


def toolchain_platform(ctx: RuleContext, label) -> dict[str, str]:
    """The interpreter actions run on: this one (`host-python@…`) or a built toolchain."""
    if label is None:
        return {"toolchain": host_python_identity()}
    value = ctx.dep(label).info.get("toolchain")
    if not isinstance(value, str) or not value:
        raise ctx.error(
            f"{label} is not a toolchain target",
            "toolchain",
            hint="point toolchain at a `toolchain` target (or leave it out for this interpreter)",
        )
    return {"toolchain": value}


# ------------------------------------------------------------------------------------- task


def _task(ctx: RuleContext) -> Provider:
    a = ctx.attrs
    check_task(a, ctx.error)
    runtime = tuple(ctx.source(f, "runtime") for f in a["runtime"])
    names = {Path(r.path).name for r in runtime}
    for needed in ("workloads.py", "oracle.py"):
        if needed not in names:
            raise ctx.error(f"runtime must include {needed}", "runtime")
    baseline = ctx.source_tree(a["baseline"], "baseline")
    base_names = sorted(r.path.rsplit("/", 1)[-1] for r in baseline)
    editable = list(a["editable"])
    if sorted(editable) != base_names:
        raise ctx.error(
            f"baseline folder holds {base_names} but editable lists {sorted(editable)}",
            "editable",
            hint="the baseline must be exactly the editable files",
        )
    if f"{a['entry'].get('module')}.py" not in editable:
        raise ctx.error("entry.module must name one of the editable files", "entry")
    if bool(a["entry"].get("function")) == bool(a["entry"].get("class")):
        raise ctx.error(
            "entry names either a function or a class (KernelBench's ModelNew contract)",
            "entry",
            hint='{module = "kernel", function = "softmax"} or {module = "kernel", class = '
            '"ModelNew"}',
        )
    for doc in a["docs"]:
        ctx.source(doc, "docs")  # NB: checked to exist, never an action input
    spec = {
        "task": ctx.label.name
        if ctx.label.name != "task"
        else ctx.label.package.rsplit("/", 1)[-1],
        "framework": a["framework"],
        "device": a["device"],
        "entry": dict(a["entry"]),
        "editable": editable,
        "tolerances": a["tolerances"],
        "cases": a["cases"],
        "hidden": _hidden(ctx, a["hidden_cases"]),
    }
    if a["multirank"]:
        if a["framework"] != "torch" or not a["entry"].get("function"):
            raise ctx.error(
                "a multi-rank task is a torch task whose entry is a function", "multirank"
            )
        spec["multirank"] = True  # NB: only when set, so single-process specs keep their keys
    task_dir = ctx.exec_path("")[:-1] if ctx.label.package else "."
    baseline_dir = ctx.exec_path(a["baseline"].rstrip("/"))
    review, review_files = review_rules(ctx, a["review"])
    return Provider(
        files=runtime + baseline,
        info=TaskInfo(
            spec=spec,
            task_dir=task_dir,
            baseline_dir=baseline_dir,
            runtime=runtime,
            baseline=baseline,
            editable=tuple(editable),
            review=review,
            review_files=review_files,
        ),
    )


TASK = Rule(
    name="task",
    doc="An optimisation task: runtime sources (workloads.py, oracle.py), the baseline folder "
    "(exactly the editable files), documentation that never invalidates results, the call "
    "contract and the correctness policy.",
    attrs={
        "runtime": attr(
            "string_list", "runtime sources: workloads.py, oracle.py (+ helpers)", nonempty=True
        ),
        "baseline": attr("string", "folder holding the baseline's editable files", nonempty=True),
        "docs": attr(
            "string_list", "documentation files (TASK.md, LICENSE); never inputs", default=[]
        ),
        "framework": attr("string", "numpy or torch", choices=("numpy", "torch")),
        "device": attr("string", "cpu or cuda", default="cpu", choices=("cpu", "cuda")),
        "entry": attr(
            "string_dict",
            "call contract: {module = ..., function = ...}, or {module = ..., class = ...} "
            "(KernelBench's ModelNew: built once from workloads.init_inputs(), called with the "
            "inputs in order)",
        ),
        "signature": attr("string", "the entry function's signature, for people", default=""),
        "editable": attr("string_list", "file names a candidate may replace", nonempty=True),
        "tolerances": attr("table", "per-dtype {atol, rtol} (numbers >= 0)"),
        "cases": attr(
            "table_list",
            "correctness cases: name (unique), shape (a list of sizes >= 1), dtype (one with a "
            "tolerance), kind, ... (checked at analysis: docs/declarations.md)",
        ),
        "hidden_cases": attr(
            "table",
            "cases every check adds, drawn with the run's secret seed: {count = N, ranges = "
            "[{shape = [[lo, hi], ...], dtype = ..., kind = ...}, ...]}",
            default={},
        ),
        "multirank": attr(
            "bool",
            "the candidate runs as several ranks (torch.distributed): its entry gets the "
            "rank-local inputs (workloads.shard_inputs) and `group`; its bindings set `ranks`",
            default=False,
        ),
        "review": attr(
            "table",
            "the independent review of a campaign round's source (rules/harness/review.py): "
            "{forbid = [modules or dotted calls], allow = [rule ids or modules waived], "
            'reviewer = "cmd {candidate} {baseline} {task}" (its JSON answer is evidence), '
            "reviewer_files = [files it needs], reviewer_timeout_s}. Never in the spec: "
            "changing it re-runs reviews only, never a check or a measurement (a campaign "
            "fixes it at its start with the rest of its judge)",
            default={},
        ),
        "doc": attr("string", "free text", default=""),
        "tags": attr("string_list", "", default=[]),
    },
    impl=_task,
)


def _hidden(ctx: RuleContext, hidden: dict) -> dict:
    """The declared ranges of hidden cases, checked here so a bad range is a declaration error."""
    if not hidden:
        return {}
    unknown = sorted(set(hidden) - {"count", "ranges"})
    if unknown:
        raise ctx.error(f"unknown keys {unknown} (count, ranges)", "hidden_cases")
    count, ranges = hidden.get("count", 0), hidden.get("ranges", [])
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= 64:
        raise ctx.error("count must be an integer from 0 to 64", "hidden_cases")
    if not isinstance(ranges, list) or (count and not ranges):
        raise ctx.error("ranges must be a non-empty list of tables", "hidden_cases")
    tolerances = ctx.attrs["tolerances"]
    for i, rng in enumerate(ranges):
        shape = rng.get("shape") if isinstance(rng, dict) else None
        ok = (
            isinstance(shape, list)
            and shape
            and all(
                isinstance(b, list)
                and len(b) in (2, 3)
                and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in b)
                and b[0] <= b[1]
                and (len(b) == 2 or b[0] % b[2] == 0)
                for b in shape
            )
        )
        if not ok:
            raise ctx.error(
                f"ranges[{i}].shape must be [[lo, hi], ...] (or [lo, hi, step] with "
                "lo a multiple of step) with 1 <= lo <= hi",
                "hidden_cases",
            )
        if "name" in rng:
            raise ctx.error(f"ranges[{i}] must not name its case (hidden_N)", "hidden_cases")
        dtype = rng.get("out_dtype", rng.get("dtype"))
        if dtype not in tolerances:
            raise ctx.error(f"ranges[{i}] dtype {dtype!r} has no tolerance", "hidden_cases")
    return {"count": count, "ranges": ranges}


# ---------------------------------------------------------------------------------- binding


BINDING_EXECUTORS = ("local", "bwrap", "docker", "slurm")


def _binding(ctx: RuleContext) -> Provider:
    a = ctx.attrs
    task = dep_info(ctx, "task", TaskInfo)
    spec = dict(task.spec)
    platform = toolchain_platform(ctx, a["toolchain"])
    check_binding(a, spec["tolerances"], ctx.error)
    if a["toolchain"] is None:
        check_framework(ctx, a["task"], spec["framework"], "toolchain")
    host_platform = dict(platform)
    device = a["device"] or spec["device"]
    if device not in ("cpu", "cuda"):
        raise ctx.error(f"device must be cpu or cuda, not {device!r}", "device")
    if a["accelerator"] and device == "cpu":
        raise ctx.error('an accelerator needs device = "cuda"', "accelerator")
    if a["executor"]:
        if a["executor"] not in BINDING_EXECUTORS:
            raise ctx.error(
                f"unknown executor {a['executor']!r}",
                "executor",
                hint=f"use one of {', '.join(BINDING_EXECUTORS)} (empty: the workspace's)",
            )
        # NB: a platform property, so the binding's checks and measurements (not its
        # bookkeeping) run there, and run elsewhere is another binding (other keys)
        platform["executor"] = a["executor"]
    if device != "cpu":
        if spec["framework"] != "torch":
            raise ctx.error(f"device {device!r} needs a torch task", "device")
        # NB: the property is what makes the docker executor request GPUs and a remote engine
        # pick a worker that has one; the harness itself refuses to run without a device
        platform["accelerator"] = a["accelerator"] or "cuda"
    spec.update(
        threads=a["threads"],
        call_timeout_s=a["call_timeout_s"],
        seed=a["seed"],
        params=a["params"],
        device=device,
        toolchain=platform["toolchain"],
    )
    ranks = _ranks(ctx, a["ranks"], spec, device)
    if ranks:
        spec["ranks"] = ranks  # NB: in every spec file, so a new world size is a new binding
    check_step, measure_step = steps.judge_steps(spec)
    check_spec = json.dumps(spec, sort_keys=True, indent=1)
    full = dict(spec, measure=a["measure"], assess=a["assess"], action_timeout_s=a["timeout_s"])
    full_spec = json.dumps(full, sort_keys=True, indent=1)
    n = ctx.label.name
    check_spec_file = ctx.write(f"{n}/check_spec.json", check_spec)
    spec_file = ctx.write(f"{n}/spec.json", full_spec)
    # NB: what measuring reads: everything but the assessment policy, so a changed policy
    # (min improvement, confidence, …) re-assesses retained measurements, never re-measures
    measure_spec_file = ctx.write(
        f"{n}/measure_spec.json",
        json.dumps({k: v for k, v in full.items() if k != "assess"}, sort_keys=True, indent=1),
    )
    task_dir, baseline_dir, runtime = task.task_dir, task.baseline_dir, task.runtime
    baseline_check = check_step.run(
        ctx,
        out=f"{n}/baseline_check.json",
        inputs=[*runtime, *task.baseline, check_spec_file],
        mnemonic="BaselineCheck",
        platform=platform,
        timeout_s=a["timeout_s"],
        task=task_dir,
        impl=baseline_dir,
        spec=check_spec_file.path,
    )
    calibration = measure_step.run(
        ctx,
        out=f"{n}/calibration.json",
        inputs=[*runtime, *task.baseline, measure_spec_file],
        mnemonic="Calibrate",
        platform=platform,
        timeout_s=a["timeout_s"],
        task=task_dir,
        baseline=baseline_dir,
        candidate=baseline_dir,
        spec=measure_spec_file.path,
    )
    return Provider(
        files=(baseline_check, calibration),
        info=BindingInfo(
            task=task,
            spec_file=spec_file,
            full_spec=full,
            measure_spec_file=measure_spec_file,
            check_spec_file=check_spec_file,
            platform=platform,
            host_platform=host_platform,
            device=device,
            baseline_check=baseline_check,
            calibration=calibration,
            timeout_s=a["timeout_s"],
        ),
    )


RANK_BACKENDS = {"gloo": "cpu", "nccl": "cuda"}
RANK_TOPOLOGIES = ("single-host",)


def _ranks(ctx: RuleContext, ranks: dict, spec: dict, device: str) -> dict:
    """A binding's `ranks`, checked against its task and device (empty: a single process)."""
    if not spec.get("multirank"):
        if ranks:
            raise ctx.error(
                f"task {ctx.attrs['task']} runs as one process; `ranks` needs a task declared "
                "with multirank = true",
                "ranks",
            )
        return {}
    unknown = sorted(set(ranks) - {"world_size", "backend", "topology"})
    if unknown:
        raise ctx.error(f"unknown keys {unknown} (world_size, backend, topology)", "ranks")
    world = ranks.get("world_size")
    if isinstance(world, bool) or not isinstance(world, int) or not 2 <= world <= 8:
        raise ctx.error(
            "world_size must be an integer from 2 to 8 (ranks on one host)",
            "ranks",
            hint='ranks = {world_size = 2, backend = "gloo", topology = "single-host"}',
        )
    backend = ranks.get("backend", "gloo" if device == "cpu" else "nccl")
    if RANK_BACKENDS.get(backend) != device:
        raise ctx.error(
            f"backend {backend!r} does not serve device {device!r} (gloo: cpu, nccl: cuda)",
            "ranks",
        )
    topology = ranks.get("topology", "single-host")
    if topology not in RANK_TOPOLOGIES:
        raise ctx.error(f"topology must be one of {list(RANK_TOPOLOGIES)}", "ranks")
    return {"world_size": world, "backend": backend, "topology": topology}


BINDING = Rule(
    name="binding",
    doc="Task + toolchain + parameters + measurement policy, fixed before any candidate is "
    "measured. Changing any field is a new binding (new keys), never a silent change. "
    "Builds the baseline's own check and the A/A calibration (noise floor).",
    attrs={
        "task": attr("label", "the task target"),
        "toolchain": attr(
            "label",
            "a toolchain target (//toolchains:numpy); default: the interpreter rsi runs on",
            default=None,
        ),
        "device": attr(
            "string",
            "cpu or cuda; overrides the task's device (empty: the "
            "task's). A cuda binding's check and measure actions get the platform "
            "property `accelerator`, and the harness refuses to run without a GPU",
            default="",
        ),
        "executor": attr(
            "string",
            "where the binding's checks and measurements run: local, bwrap, docker or slurm "
            "(a [slurm] cluster: docs/slurm.md); empty: the workspace's executor. A platform "
            "property, so another executor is another binding",
            default="",
        ),
        "accelerator": attr(
            "string",
            "the `accelerator` platform value of a cuda binding "
            "(empty: `cuda`; a model such as `nvidia-h200` pins the GPU kind "
            "on a remote engine)",
            default="",
        ),
        "threads": attr(
            "int", "threads the implementation may use (pinned)", default=1, minimum=1, maximum=4096
        ),
        "call_timeout_s": attr(
            "float",
            "per-call limit; past it the candidate fails (timeout)",
            default=20.0,
            minimum=0,
            exclusive_minimum=True,
            maximum=86400,
        ),
        "seed": attr(
            "int", "seed of the correctness inputs", default=0, minimum=0, maximum=(1 << 63) - 1
        ),
        "params": attr("table", "free parameters recorded in the spec", default={}),
        "ranks": attr(
            "table",
            'a multi-rank task\'s world: {world_size = 2, backend = "gloo" (cpu) or "nccl" '
            '(cuda), topology = "single-host"}; part of the spec, so changing it is a new '
            "binding. Its checks and measurements run rules/harness/multirank.py",
            default={},
        ),
        "measure": attr(
            "table",
            "workload (a case), warmups, samples, pairs, metric, direction, seed, probes, "
            "value_checks, units_per_call, bytes_per_call, arm_timeout_s, sequential, "
            "first_look, look_every, stop_confidence, stop_improvement, stop_loss; no other key",
        ),
        "assess": attr(
            "table", "min_improvement, confidence, bootstrap_resamples, min_pairs; no other key"
        ),
        "timeout_s": attr(
            "float",
            "limit of each action",
            default=900.0,
            minimum=0,
            exclusive_minimum=True,
            maximum=7 * 86400,
        ),
        "doc": attr("string", "free text", default=""),
        "tags": attr("string_list", "", default=[]),
    },
    impl=_binding,
)


# -------------------------------------------------------------------------------- candidate


def _candidate(ctx: RuleContext) -> Provider:
    a = ctx.attrs
    task = dep_info(ctx, "task", TaskInfo)
    files = ctx.source_tree(a["src"], "src")
    if not files:
        raise ctx.error(f"candidate folder {a['src']!r} is empty", "src")
    editable = set(task.editable)
    for f in files:
        name = f.path[len(ctx.exec_path(a["src"].rstrip("/"))) + 1 :]
        if f.symlink is not None:
            raise ctx.error(f"{a['src']}/{name} is a symlink; candidates are plain files", "src")
        if name not in editable:
            raise ctx.error(
                f"{a['src']}/{name} is outside the editable scope ({', '.join(sorted(editable))})",
                "src",
            )
    return Provider(
        files=files,
        info=CandidateInfo(
            dir=ctx.exec_path(a["src"].rstrip("/")), files=files, task=str(a["task"])
        ),
    )


CANDIDATE = Rule(
    name="candidate",
    doc="A snapshot of the editable files from a folder; its digest is the whole snapshot.",
    attrs={
        "task": attr("label", "the task whose editable scope applies"),
        "src": attr("string", "folder holding the candidate's files", nonempty=True),
        "hypothesis": attr("string", "why this should be faster", default=""),
        "doc": attr("string", "free text", default=""),
        "tags": attr("string_list", "", default=[]),
    },
    impl=_candidate,
)


# ---------------------------------------------------------------------------------- verdict


def check_action(
    ctx: RuleContext, binding: Provider, cand_files, cand_dir: str, prefix: str
) -> Artifact:
    info = BindingInfo.of(binding)
    return steps.judge_steps(info.full_spec)[0].run(
        ctx,
        out=f"{prefix}check.json",
        inputs=[*info.runtime, *cand_files, info.check_spec_file],
        mnemonic="Check",
        platform=info.platform,
        timeout_s=info.timeout_s,
        task=info.task_dir,
        impl=cand_dir,
        spec=info.check_spec_file.path,
    )


def measure_action(
    ctx: RuleContext, binding: Provider, cand_files, cand_dir: str, prefix: str
) -> Artifact:
    info = BindingInfo.of(binding)
    return steps.judge_steps(info.full_spec)[1].run(
        ctx,
        out=f"{prefix}samples.json",
        inputs=[*info.runtime, *info.baseline, *cand_files, info.measure_spec_file],
        mnemonic="Measure",
        platform=info.platform,
        timeout_s=info.timeout_s,
        task=info.task_dir,
        baseline=info.baseline_dir,
        candidate=cand_dir,
        spec=info.measure_spec_file.path,
    )


def evidence_prefix(binding_label, candidate_label) -> str:
    """Where a (binding, candidate) pair's check and samples live: the same path whichever
    target asks, so a `check`, a `measure` and a `verdict` target share one action each."""
    return f"_evidence/{binding_label.name}/{candidate_label.name}/"


def verdict_actions(
    ctx: RuleContext,
    binding: Provider,
    cand_files,
    cand_dir: str,
    prefix: str = "",
    evidence: str | None = None,
    assess_spec: Artifact | None = None,
) -> dict[str, Artifact]:
    """Check, paired measure and assess for one candidate; usable by other rule families.

    `evidence` is the folder of the check and samples (default `prefix`); `prefix` that of the
    verdict and its table. `assess_spec` replaces the binding's spec for the assessment only
    (a campaign's regraded policy); check and measure never read it.
    """
    info = BindingInfo.of(binding)
    evidence = prefix if evidence is None else evidence
    spec_file = info.spec_file if assess_spec is None else assess_spec
    out = {
        "check": check_action(ctx, binding, cand_files, cand_dir, evidence),
        "samples": measure_action(ctx, binding, cand_files, cand_dir, evidence),
    }
    made = steps.ASSESS.run_outputs(
        ctx,
        inputs=[
            spec_file,
            out["samples"],
            out["check"],
            info.baseline_check,
            info.calibration,
        ],
        mnemonic="Assess",
        platform=info.host_platform,
        timeout_s=120,
        spec=spec_file.path,
        samples=out["samples"].path,
        check=out["check"].path,
        baseline_check=info.baseline_check.path,
        calibration=info.calibration.path,
        out=f"{prefix}verdict.json",
        text=f"{prefix}verdict.txt",
    )
    out["verdict"], out["table"] = made["out"], made["text"]
    return out


def render_action(
    ctx: RuleContext, verdict: Artifact, check: Artifact, prefix: str, platform
) -> Artifact:
    """The verdict table people read (`verdict.txt`) from a verdict and its check."""
    return steps.RENDER.run(
        ctx,
        out=f"{prefix}verdict.txt",
        inputs=[verdict, check],
        mnemonic="Render",
        platform=platform,
        timeout_s=60,
        verdict=verdict.path,
        check=check.path,
    )


def _verdict(ctx: RuleContext) -> Provider:
    a = ctx.attrs
    dep_info(ctx, "binding", BindingInfo)
    binding = ctx.dep(a["binding"])
    cand = dep_info(ctx, "candidate", CandidateInfo)
    out = verdict_actions(
        ctx,
        binding,
        cand.files,
        cand.dir,
        prefix=f"{ctx.label.name}/",
        evidence=evidence_prefix(a["binding"], a["candidate"]),
    )
    return Provider(
        files=(out["verdict"], out["table"], out["check"], out["samples"]),
        info=VerdictInfo(show=out["table"].path, verdict=out["verdict"].path),
    )


VERDICT = Rule(
    name="verdict",
    doc="Correctness check, paired measurement and assessment of one candidate under one "
    "binding: PASS / FAIL / INCONCLUSIVE with reasons, speedup interval and noise floor.",
    attrs={
        "binding": attr("label", "the binding target"),
        "candidate": attr("label", "the candidate target"),
        "doc": attr("string", "free text", default=""),
        "tags": attr("string_list", "", default=[]),
    },
    impl=_verdict,
)


def _pair(ctx: RuleContext, make) -> Provider:
    a = ctx.attrs
    dep_info(ctx, "binding", BindingInfo)
    cand = dep_info(ctx, "candidate", CandidateInfo)
    out = make(
        ctx,
        ctx.dep(a["binding"]),
        cand.files,
        cand.dir,
        evidence_prefix(a["binding"], a["candidate"]),
    )
    return Provider(files=(out,))


def _check(ctx: RuleContext) -> Provider:
    return _pair(ctx, check_action)


def _measure(ctx: RuleContext) -> Provider:
    return _pair(ctx, measure_action)


def _pair_rule(name: str, doc: str, impl) -> Rule:
    return Rule(
        name=name,
        doc=doc,
        impl=impl,
        attrs={
            "binding": attr("label", "the binding target"),
            "candidate": attr("label", "the candidate target"),
            "doc": attr("string", "free text", default=""),
            "tags": attr("string_list", "", default=[]),
        },
    )


CHECK = _pair_rule(
    "check",
    "The correctness check of one candidate under one binding (shared with the "
    "verdict of the same pair): per-case errors, pass/fail and failure kind.",
    _check,
)
MEASURE = _pair_rule(
    "measure",
    "The paired, exclusive timing of one candidate against the baseline under one "
    "binding (shared with the verdict of the same pair): raw samples with input digests.",
    _measure,
)


def _calibration(ctx: RuleContext) -> Provider:
    return Provider(files=(dep_info(ctx, "binding", BindingInfo).calibration,))


CALIBRATION = Rule(
    name="calibration",
    doc="The binding's A/A calibration (baseline against itself): the noise floor every "
    "verdict of the binding uses. The action is the binding's own, built once.",
    attrs={
        "binding": attr("label", "the binding target"),
        "doc": attr("string", "free text", default=""),
        "tags": attr("string_list", "", default=[]),
    },
    impl=_calibration,
)

RULES = [TASK, BINDING, CANDIDATE, VERDICT, CHECK, MEASURE, CALIBRATION]
