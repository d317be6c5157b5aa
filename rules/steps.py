"""The harness steps, defined once: what each runs (its script and the harness files it reads) and
its command line. Domain verdicts, campaign rounds, a project's rounds and the final's plan all
build their commands here, so a step's command line is written in one place. A step's command line
must never be written anywhere else.

A step's argv is `[*python, _rsi/harness/SCRIPT, *subcommand, --flag value, ...]`; the values
are exec paths (an action) or placeholders such as `{out}/check.json` (the final's plan, whose
runner substitutes them). `Step.run` turns one into an action: the step's harness files come
first among its inputs, so its key covers exactly the code it runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from rsi.action import UNCACHED_EXIT_ENV
from rsi.rule import Artifact, RuleContext

HARNESS_DIR = Path(__file__).resolve().parent / "harness"
HARNESS_EXEC = "_rsi/harness"
PY = ("python3", "-I", "-B")
# NB: a step whose script needs only the standard library runs without site-packages (-S): it
# starts in a third of the time (no .pth files, no editable finder) and can import nothing else
NO_SITE = "-S"
# NB: the interpreter placeholder of the final's plan (final.py runs it with the toolchain's)
PLAN_PY = ("{python}", "-I", "-B")
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}

# NB: each step gets only the files it runs (tests/test_steps.py derives them from the scripts'
# own sibling loads), so editing the renderer reruns no measurement and the GPU query in
# _common.py no assessment
# NB: what every referee step (check, measure, multi-rank) runs with, and what judges samples
_REFEREE = (
    "referee.py",
    "referee_protocol.py",
    "referee_timing.py",
    "proctree.py",
    "isolation.py",
    "siblings.py",
    "worker.py",
    "confine.py",
    "_common.py",
    "_core.py",
    "imports.py",
)
_STATS = ("stats.py", "sequential.py")
# NB: a measurement's parts below measure.py (multi-rank judges with measure_judge and _doc)
_MEASURE = ("measure_run.py", "measure_arm.py", "measure_judge.py", "measure_doc.py")
SCRIPTS: dict[str, tuple[str, ...]] = {
    "check": ("check.py", *_REFEREE),
    "measure": ("measure.py", *_MEASURE, *_REFEREE, *_STATS),
    "assess": ("assess.py", "stats.py", "sequential.py", "_core.py", "render.py"),
    "render": ("render.py",),
    "project": ("project.py",),
    "project_assess": (
        "project.py",
        "assess.py",
        "stats.py",
        "sequential.py",
        "_core.py",
        "render.py",
    ),
    "round": ("round.py",),
    "select": ("selection.py",),
    "snapshot": ("snapshot.py",),
    "report": ("report.py",),
    "final": ("final.py",),
    "dashboard": ("dashboard.py",),
    "review": ("review.py", "review_ast.py", "review_rules.py"),
    # NB: a candidate's pre-flight (rules/campaign/preflight.py): parse, import, signature
    "preflight": ("preflight.py",),
    # NB: a multi-rank binding's check and measure (one script, two subcommands)
    "multirank": (
        "multirank.py",
        "mr_task.py",
        "mr_check.py",
        "mr_measure.py",
        "mr_arm.py",
        "mr_lockstep.py",
        "mr_sandbox.py",
        "mr_worker.py",
        "check.py",
        "measure_judge.py",
        "measure_doc.py",
    )
    + _REFEREE
    + _STATS,
}
# NB: the jinja2 templates a step renders with (not Python: listed apart from SCRIPTS)
TEMPLATES: dict[str, tuple[str, ...]] = {
    "dashboard": ("base.html.j2", "campaign.html.j2"),
}


def harness_files(scripts: str) -> tuple[Artifact, ...]:
    """The harness files of `scripts` (a key of SCRIPTS), as action inputs."""
    files = [*SCRIPTS[scripts], *(f"templates/{t}" for t in TEMPLATES.get(scripts, ()))]
    return tuple(
        Artifact(f"{HARNESS_EXEC}/{name}", source=str(HARNESS_DIR / name)) for name in files
    )


@dataclass(frozen=True)
class Step:
    """One harness step: `script` (with `sub`, its subcommand) run with `flags` in order (a
    flag `baseline_check` is `--baseline-check`); one in `optional` is left out when its value
    is None. `scripts` names the harness files it reads (SCRIPTS); `exclusive` steps time
    something and run alone. The flags in `outs` name the files it writes (`out` first);
    `stdlib` steps import nothing outside the standard library and run without site-packages."""

    name: str
    script: str
    flags: tuple[str, ...]
    scripts: str
    sub: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    exclusive: bool = False
    outs: tuple[str, ...] = ("out",)
    stdlib: bool = False
    # NB: the exit code with which the step says "good documents, never to be cached" (a
    # measurement on a busy host: rules/harness/_core.py BUSY_EXIT; rsi/action.py)
    uncached_exit: int | None = None

    def argv(self, py: Iterable[str] = PY, **values: str | None) -> list[str]:
        unknown = set(values) - set(self.flags)
        if unknown:
            raise TypeError(f"step {self.name}: unknown flag(s) {sorted(unknown)}")
        argv = [*py, *((NO_SITE,) if self.stdlib else ()), f"{HARNESS_EXEC}/{self.script}"]
        argv += self.sub
        for flag in self.flags:
            value = values.get(flag)
            if value is None:
                if flag in self.optional:
                    continue
                raise TypeError(f"step {self.name}: --{flag} needs a value")
            argv += [f"--{flag.replace('_', '-')}", value]
        return argv

    def files(self) -> tuple[Artifact, ...]:
        return harness_files(self.scripts)

    @property
    def env(self) -> dict[str, str]:
        if self.uncached_exit is None:
            return ENV
        return {**ENV, UNCACHED_EXIT_ENV: str(self.uncached_exit)}

    def run(
        self,
        ctx: RuleContext,
        *,
        out: str,
        inputs: Iterable[Artifact],
        mnemonic: str,
        platform: Mapping[str, str],
        timeout_s: float,
        **values: str | None,
    ) -> Artifact:
        """The step as one action writing `out` (package-relative); returns that output."""
        return self.run_outputs(
            ctx,
            inputs=inputs,
            mnemonic=mnemonic,
            platform=platform,
            timeout_s=timeout_s,
            out=out,
            **values,
        )["out"]

    def run_outputs(
        self,
        ctx: RuleContext,
        *,
        inputs: Iterable[Artifact],
        mnemonic: str,
        platform: Mapping[str, str],
        timeout_s: float,
        **values: str | None,
    ) -> dict[str, Artifact]:
        """The step as one action writing every output flag given (package-relative paths);
        returns {flag: output}."""
        outs = {f: values[f] for f in self.outs if values.get(f) is not None}
        if "out" not in outs:
            raise TypeError(f"step {self.name}: --out needs a value")
        made = ctx.action(
            argv=self.argv(**dict(values, **{f: ctx.exec_path(p) for f, p in outs.items()})),
            inputs=[*self.files(), *inputs],
            outputs=list(outs.values()),
            mnemonic=mnemonic,
            env=self.env,
            platform=platform,
            timeout_s=timeout_s,
            **({"tags": ["exclusive"]} if self.exclusive else {}),
        )
        return dict(zip(outs, made, strict=True))


# NB: a catalog task's steps
# NB: a check or measurement of code that imports a package outside the judge's identity
# (rules/harness/imports.py) also exits BUSY_EXIT: judged and recorded, never cached
BUSY_EXIT = 75
CHECK = Step("check", "check.py", ("task", "impl", "spec", "out"), "check", uncached_exit=BUSY_EXIT)
# NB: a measurement on a busy host exits BUSY_EXIT (75) after writing its documents: the
# verdict says INCONCLUSIVE host_busy, and nothing of it is cached (building again re-measures)
MEASURE = Step(
    "measure",
    "measure.py",
    ("task", "baseline", "candidate", "spec", "out"),
    "measure",
    exclusive=True,
    uncached_exit=BUSY_EXIT,
)
# NB: the assessment writes the verdict and its table (`text`, render.py) in one action: the
# table is a function of the verdict and the check alone, and a regrade re-runs both
ASSESS = Step(
    "assess",
    "assess.py",
    ("spec", "samples", "check", "baseline_check", "calibration", "out", "text"),
    "assess",
    optional=("text",),
    outs=("out", "text"),
    stdlib=True,
)
RENDER = Step("render", "render.py", ("verdict", "check", "out"), "render", stdlib=True)

# NB: a multi-rank task's check and measure: the same flags and documents, run by
# multirank.py (world_size rank workers per arm-run, lockstep calls; rules/harness/SPEC.md)
MR_CHECK = Step(
    "mr_check",
    "multirank.py",
    CHECK.flags,
    "multirank",
    sub=("check",),
    uncached_exit=BUSY_EXIT,
)
MR_MEASURE = Step(
    "mr_measure",
    "multirank.py",
    MEASURE.flags,
    "multirank",
    sub=("measure",),
    exclusive=True,
    uncached_exit=BUSY_EXIT,
)


def judge_steps(spec) -> tuple[Step, Step]:
    """(check, measure) for a binding's spec: the multi-rank ones when it sets `ranks`."""
    return (MR_CHECK, MR_MEASURE) if spec.get("ranks") else (CHECK, MEASURE)


# NB: an external project's steps: its own commands, run by project.py over the frozen tree
# (`overlay`: the candidate's files over it; none: the baseline itself)
QUALITY = Step(
    "quality",
    "project.py",
    ("spec", "base", "overlay", "out"),
    "project",
    sub=("quality",),
    optional=("overlay",),
)
BENCH = Step(
    "bench",
    "project.py",
    ("spec", "base", "overlay", "out"),
    "project",
    sub=("bench",),
    optional=("overlay",),
    exclusive=True,
)
PROJECT_ASSESS = Step(
    "project_assess",
    "project.py",
    ASSESS.flags[:-1],
    "project_assess",
    sub=("assess",),
)

# NB: a campaign round's document, from its verdict and check
ROUND_DOC = Step(
    "round",
    "round.py",
    ("meta", "verdict", "check", "review", "out"),
    "round",
    optional=("review",),
    stdlib=True,
)

# NB: the independent review of a candidate's source (rules/review.py): beside the check and
# measurement, never an input of the assessment
REVIEW = Step(
    "review",
    "review.py",
    ("task", "candidate", "baseline", "spec", "rules", "check", "out"),
    "review",
    optional=("check",),
    stdlib=True,
)

STEPS = {
    s.name: s
    for s in (CHECK, MEASURE, ASSESS, RENDER, QUALITY, BENCH, PROJECT_ASSESS, ROUND_DOC, REVIEW)
}


def plan_step(name: str, step: Step, **values: Any) -> dict:
    """A step of the final's plan: its argv with the plan's placeholders."""
    doc = {"name": name, "argv": step.argv(PLAN_PY, **values)}
    if step.uncached_exit is not None:
        doc["uncached_exit"] = step.uncached_exit
    return doc
