"""Typed provider payloads: what the domain and campaign rules pass between targets. Payloads must
never be mutated after analysis.

Each is a frozen dataclass and also a read-only mapping of its fields, so the engine's
`provider.info.get("show")` and older `info["spec_file"]` look-ups keep working while rules
read attributes (`binding.info.spec_file`), which a typo cannot silently miss.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Iterator, TypeVar

from rsi.rule import Artifact

T = TypeVar("T", bound="Info")


class Info(Mapping):
    """A read-only mapping over a frozen dataclass's fields (the base of every payload)."""

    def __getitem__(self, key: str) -> Any:
        if key in self._names():
            return getattr(self, key)
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def _names(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self))  # type: ignore[arg-type]

    @classmethod
    def of(cls: type[T], provider: Any) -> T:
        """`provider.info` as this payload (TypeError: the provider gives another)."""
        info = provider.info
        if not isinstance(info, cls):
            raise TypeError(f"expected a {cls.__name__} provider, got {type(info).__name__}")
        return info


# ------------------------------------------------------------------------------- domain


@dataclass(frozen=True)
class TaskInfo(Info):
    """A `task`: its spec (contract, cases, tolerances), runtime and baseline files."""

    spec: Mapping[str, Any]
    task_dir: str
    baseline_dir: str
    runtime: tuple[Artifact, ...]
    baseline: tuple[Artifact, ...]
    editable: tuple[str, ...]
    # NB: the declared review rules (rules/review.py) and the external reviewer's files: never
    # in the spec, so no check or measurement key depends on them
    review: Mapping[str, Any] = field(default_factory=dict)
    review_files: tuple[Artifact, ...] = ()


@dataclass(frozen=True)
class BindingInfo(Info):
    """A `binding`: the task under a toolchain and measurement policy, its spec files (spec:
    everything; check_spec: what a check reads; measure_spec: all but the assessment policy),
    and the baseline check and A/A calibration every candidate of it shares."""

    task: TaskInfo
    spec_file: Artifact
    full_spec: Mapping[str, Any]
    measure_spec_file: Artifact
    check_spec_file: Artifact
    platform: Mapping[str, str]
    host_platform: Mapping[str, str]
    device: str
    baseline_check: Artifact
    calibration: Artifact
    timeout_s: float

    # NB: the task's fields, read through the binding
    @property
    def task_dir(self) -> str:
        return self.task.task_dir

    @property
    def baseline_dir(self) -> str:
        return self.task.baseline_dir

    @property
    def runtime(self) -> tuple[Artifact, ...]:
        return self.task.runtime

    @property
    def baseline(self) -> tuple[Artifact, ...]:
        return self.task.baseline

    @property
    def editable(self) -> tuple[str, ...]:
        return self.task.editable

    def _names(self) -> tuple[str, ...]:
        return (*super()._names(), "task_dir", "baseline_dir", "runtime", "baseline", "editable")


@dataclass(frozen=True)
class CandidateInfo(Info):
    """A `candidate`: its files and the folder they lie in."""

    dir: str
    files: tuple[Artifact, ...]
    task: str


@dataclass(frozen=True)
class VerdictInfo(Info):
    """A `verdict`: the table people read and the verdict document."""

    show: str
    verdict: str


# ----------------------------------------------------------------------------- campaign


@dataclass(frozen=True)
class CampaignInfo(Info):
    """A `campaign`: its policy, the kind of work (`task` | `project`) and its binding."""

    policy: Mapping[str, Any]
    kind: str
    binding: str


@dataclass(frozen=True)
class ProjectDecl(Info):
    """An `external_project` as declared (the judge as data; nothing frozen yet)."""

    spec: Mapping[str, Any]
    root: str
    editable: tuple[str, ...]
    protocol: tuple[str, ...]
    exclude: tuple[str, ...]
    platform: Mapping[str, str]
    timeout_s: float


@dataclass(frozen=True)
class ProjectBaseline(Info):
    """A campaign's frozen external project: its tree, spec, quality run and calibration."""

    spec_file: Artifact
    base: tuple[Artifact, ...]
    base_dir: str
    baseline_check: Artifact
    calibration: Artifact
    platform: Mapping[str, str]
    timeout_s: float
    editable: tuple[str, ...]
    manifest: str


@dataclass(frozen=True)
class RoundInfo(Info):
    """A campaign round: its document, verdict, check, samples and table, and the candidate."""

    round: int
    doc: Artifact
    verdict: Artifact
    check: Artifact
    samples: Artifact
    table: Artifact
    cand_files: tuple[Artifact, ...]
    cand_dir: str
    kind: str
    platform: Mapping[str, str]
    show: str | None = None
    review: Artifact | None = None  # NB: review.json (a catalog task's rounds)


@dataclass(frozen=True)
class BestInfo(Info):
    """A campaign's selection (best.json)."""

    best: Artifact


@dataclass(frozen=True)
class FinalInfo(Info):
    """A campaign's final: `pending` (final.json says why) or `ended` (the re-measure)."""

    final: Artifact
    state: str
    show: str | None = None


@dataclass(frozen=True)
class ReportInfo(Info):
    """A campaign's report (report.json, report.md)."""

    json: Artifact
    markdown: Artifact
    show: str | None = field(default=None)


@dataclass(frozen=True)
class DashboardInfo(Info):
    """A campaign's HTML report (index.html), its view model (dashboard.json) and text."""

    html: Artifact
    json: Artifact
    text: Artifact
    show: str | None = field(default=None)


# ------------------------------------------------------------------------- label kinds

# NB: what each payload is, in the words of the rule that gives it (for refusals)
KIND_NAMES = {
    TaskInfo: "task",
    BindingInfo: "binding",
    CandidateInfo: "candidate",
    VerdictInfo: "verdict",
    CampaignInfo: "campaign",
    ProjectDecl: "external_project",
    ProjectBaseline: "campaign_baseline",
    RoundInfo: "campaign_round",
    BestInfo: "campaign_best",
    FinalInfo: "campaign_final",
    ReportInfo: "campaign_report",
    DashboardInfo: "campaign_dashboard",
}


def _a(noun: str) -> str:
    return f"{'an' if noun.lstrip('`')[:1] in 'aeiou' else 'a'} {noun}"


def kind_of(info: Any) -> str:
    """`a task target`, ... or what a target of no payload of ours is."""
    name = KIND_NAMES.get(type(info))
    if name is not None:
        return _a(f"`{name}` target")
    if isinstance(info, Mapping) and info.get("toolchain"):
        return "a `toolchain` target"
    return "a target of another kind (a command, check, measure or calibration gives files only)"


def dep_info(ctx: Any, field_name: str, *kinds: type[T], label: Any = None) -> Any:
    """The payload of the dependency the label attribute `field_name` names (or `label`, one
    entry of a label list) when it is one of `kinds`; a target of any other kind is refused
    at analysis naming the file, target and field, never a TypeError."""
    label = ctx.attrs[field_name] if label is None else label
    info = ctx.dep(label).info
    if isinstance(info, kinds):
        return info
    wanted = " or ".join(_a(f"`{KIND_NAMES[k]}`") for k in kinds)
    raise ctx.error(
        f"{label} is {kind_of(info)}, not {wanted} target",
        field_name,
        hint=f"point {field_name} at {wanted} target",
    )


def dep_infos(ctx: Any, field_name: str, *kinds: type[T]) -> list[Any]:
    """`dep_info` of every label of the label-list attribute `field_name`."""
    return [dep_info(ctx, field_name, *kinds, label=lb) for lb in ctx.attrs[field_name]]
