"""A campaign's `final` target: the plan that re-judges the selected round on fresh evidence (the
same steps a round runs, written once in rules/steps.py). Must never select a round itself."""

import json
from typing import Any, Mapping

from rsi.action import UNCACHED_EXIT_ENV
from rsi.attrs import attr
from rsi.rule import Provider, Rule, RuleContext
from rules.campaign.rule_common import tool_platform, union
from rules import steps
from rules.providers import (
    BestInfo,
    BindingInfo,
    FinalInfo,
    ProjectBaseline,
    RoundInfo,
    dep_info,
    dep_infos,
)
from rules.steps import ENV, HARNESS_EXEC, NO_SITE, PY, harness_files, plan_step


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
        inputs=union(harness_files("final"), tuple(inputs), (plan_file, best), tuple(cand_files)),
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
