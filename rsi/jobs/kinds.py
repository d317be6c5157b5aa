"""What a job runs: a kind. `build` (targets, like `rsi build`) is the engine's own; rule
families add kinds through the `rsi.job_kinds` entry point group (the campaign family adds
`round` and `final`, rules/campaign/jobs.py), so the engine never imports `rules/`.

A kind has two halves:

- `prepare(ws, args, package)`, in the submitting process: check the request and freeze what
  the job will use (a campaign round snapshots its candidate into the campaign's log here, so
  later edits of the folder change nothing), and return `(spec, key)`: the JSON the runner
  gets, and what identifies the job's inputs (digested with the profile and the executor
  settings into the job's key: a second submit with the same key attaches to the first).
  `attach_done`: whether a succeeded job with the same key is attached to (its inputs are
  snapshots) or a new one made (a build reads the workspace's sources when it runs). A build's
  key holds the digest of what it would read at submit (`rsi.inputs`): the analysis, every
  declaration and every source, so a submit after an edit never attaches to an older run.
- `run(ctx, spec)`, in the runner: do the work through `ctx.build` (rsi.build.build with the
  job's event stream, executor settings and budgets), charging `ctx.ledger` before each unit;
  returns `{"ok": bool, "result": doc, "artifacts": [...]}`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from rsi.errors import RsiError, UsageError

KINDS_GROUP = "rsi.job_kinds"


@dataclass(frozen=True)
class JobKind:
    name: str
    doc: str
    prepare: Callable[[Any, dict, str], tuple[dict, dict]]
    run: Callable[[Any, dict], dict]
    attach_done: bool = False


def _prepare_build(ws: Any, args: dict, package: str) -> tuple[dict, dict]:
    from rsi.label import Pattern

    targets = list(args.get("targets") or [])
    if not targets:
        raise UsageError("rsi job submit: name at least one target (or `round`/`final`)")
    if args.get("srcs") or args.get("number") is not None:
        raise UsageError("--from and --round are for `rsi job submit round CAMPAIGN`")
    patterns = []
    for text in targets:
        Pattern.parse(text, package)  # NB: a bad label fails the submit (exit 2), not the job
        patterns.append(text)
    spec = {"patterns": patterns, "package": package}
    # NB: the key names what the build would read now (declarations, sources, code): a submit
    # attaches only to a job of the same inputs; after an edit it is a new job
    from rsi.inputs import request_inputs  # NB: the analysis' imports, for this kind only

    try:
        inputs = request_inputs(ws, patterns, package)
    except RsiError as exc:
        # NB: the job fails with this, as the build would; the same failure attaches
        inputs = f"not analysed: {type(exc).__name__}: {exc}"
    return spec, {"patterns": patterns, "package": package, "inputs": inputs}


def build_artifacts(report: Any) -> list[dict]:
    """Every file of the named targets, by digest (as `out/` has them)."""
    found: list[dict] = []
    graph = report.graph
    if graph is None:
        return found
    from rsi.label import Label

    for label_text, t in report.targets.items():
        if not t.get("ok"):
            continue
        label = Label.parse(label_text)
        for art in graph.providers[label].files:
            if art.producer is None:
                continue
            outcome = report.outcomes.get(graph.producer(art.producer))
            result = getattr(outcome, "result", None)
            out = result.output_map.get(art.path) if result else None
            if out is None:
                continue
            found.append(
                {
                    "label": label_text,
                    "path": art.path,
                    "digest": str(out.digest),
                    "executable": bool(out.executable),
                }
            )
    return found


def _run_build(ctx: Any, spec: dict) -> dict:
    # NB: a build reports no agent usage: a calls, tokens or money budget cannot be checked
    # against it and stops the job (unknown is never zero)
    ctx.ledger.charge_usage(None, "this build (no usage record)")
    while True:
        report = ctx.build(spec["patterns"], package=spec.get("package", ""))
        if report.ok or not ctx.last_build_retryable():
            break
        if ctx.ledger.profile.limit("retries") is None:
            break
        ctx.ledger.charge_retry("a retry of the build after an infrastructure fault")
        ctx.event("job_retry", attempt=ctx.ledger.used["retries"])
    doc = report.to_json()
    return {"ok": report.ok, "result": doc, "artifacts": build_artifacts(report)}


BUILD = JobKind(
    "build",
    "build targets (as rsi build)",
    _prepare_build,
    _run_build,
    attach_done=False,
)


def job_kinds(only: str | None = None) -> dict[str, JobKind]:
    """The engine's `build` and every kind of the `rsi.job_kinds` entry point group (`only`:
    just that one, loading no other family)."""
    from importlib import metadata

    kinds = {"build": BUILD}
    if only == "build":
        return kinds
    for ep in metadata.entry_points(group=KINDS_GROUP):
        if ep.name in kinds or (only is not None and ep.name != only):
            continue
        try:
            kind = ep.load()
        except Exception as exc:  # noqa: BLE001 - NB: a family's import error: that kind only
            raise UsageError(
                f"job kind {ep.name!r} ({ep.value}) cannot be loaded: {type(exc).__name__}: {exc}",
                hint="reinstall the package that registers it (pip install -e .)",
            ) from None
        kinds[ep.name] = kind
    return kinds


def kind_names() -> list[str]:
    from importlib import metadata

    return ["build", *sorted({ep.name for ep in metadata.entry_points(group=KINDS_GROUP)})]
