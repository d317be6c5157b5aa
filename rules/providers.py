"""Typed provider payloads: what the domain and campaign rules pass between targets.

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
