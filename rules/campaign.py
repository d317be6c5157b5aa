"""Campaigns: a binding (or an external project) plus a budget, and the targets derived from the
campaign's append-only log — `<c>.round-N`, `<c>.best`, `<c>.final`, `<c>.report`.

The log (`<store>/campaigns/<sha256 of the label>/log.jsonl`) is the only source of truth (the
CLI's `attempts.json` next to it is derived, disposable state). The `campaign` rule's `generate`
hook reads it while the package loads; everything else is an action with a key. This module
never reads the clock or runs a measurement; the CLI (campaign_cli.py) enforces budget and
deadline against the log.
"""

from __future__ import annotations

import fcntl
import fnmatch
import hashlib
import json
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from rsi.attrs import attr
from rsi.digest import Digest, digest_value
from rsi.errors import DeclarationError, RsiError, UsageError
from rsi.label import Label
from rsi.rule import Artifact, GeneratedTarget, Provider, Rule, RuleContext
from rules.domain import (
    ENV,
    HARNESS_DIR,
    HARNESS_EXEC,
    PY,
    harness_files,
    toolchain_platform,
    render_action,
    verdict_actions,
)

LOG_SCHEMA = "rsi.campaign.log/1"
STOP_REASONS = ("rounds", "deadline", "agent")
DEFAULT_EXCLUDE = (
    ".git",
    ".hg",
    ".svn",
    "__pycache__",
    ".venv",
    "venv",
    "node_modules",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".tox",
    ".rsi",
)

# NB: the scripts that decide a verdict, the selection and the final: a campaign records their
# digests at its start and refuses to go on when one changes (rendering and reporting scripts
# are presentation and may change freely)
JUDGE_STEPS = ("check", "measure", "assess")
JUDGE_CAMPAIGN_SCRIPTS = {
    "task": ("select.py", "final.py"),
    "project": ("project.py", "assess.py", "stats.py", "_common.py", "select.py", "final.py"),
}

CAMPAIGN_SCRIPTS = {
    "round": ("round.py",),
    "select": ("select.py",),
    "snapshot": ("snapshot.py",),
    "report": ("report.py",),
    "final": ("final.py",),
    "project": ("project.py",),
    "project_assess": ("project.py", "assess.py", "stats.py", "_common.py"),
}


def scripts(step: str) -> tuple[Artifact, ...]:
    return tuple(
        Artifact(f"{HARNESS_EXEC}/{name}", source=str(HARNESS_DIR / name))
        for name in CAMPAIGN_SCRIPTS[step]
    )


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


# ===================================================================================== the log


def campaign_dir(store_root: str | os.PathLike, label: Label | str) -> Path:
    return Path(store_root) / "campaigns" / hashlib.sha256(str(label).encode()).hexdigest()


_DIGEST_TEXT = re.compile(r"^([0-9a-f]{64})/\d+$")


def gc_roots(store) -> Iterator[str]:
    """The `rsi.gc_roots` entry point of the campaign family: every blob named by a campaign
    log under `<store>/campaigns/` (candidate snapshots, frozen project trees). They are gc
    roots because a logged candidate may not have been built yet, so no cached result names
    its files. Yields `hash/size` digest texts; a torn last line of a crashed writer is
    skipped, an unreadable log too (gc keeps what the others name)."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, str):
            m = _DIGEST_TEXT.match(value)
            if m:
                found.add(value)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    for log in sorted((Path(store.root) / "campaigns").glob("*/*.jsonl")):
        try:
            lines = log.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                walk(json.loads(line))
            except ValueError:
                continue  # NB: a torn last line of a crashed writer
    yield from sorted(found)


class CampaignLog:
    """Append-only JSON lines. An entry counts once its line and newline are on disk (fsync'd
    before anything is acknowledged); a reader ignores a torn last line, and the next writer
    cuts it off before appending, so a `kill -9` leaves the entry absent or whole."""

    def __init__(self, store_root: str | os.PathLike, label: Label | str) -> None:
        self.label = str(label)
        self.store_root = Path(store_root)
        self.dir = campaign_dir(store_root, label)
        self.path = self.dir / "log.jsonl"

    def read(self) -> list[dict]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise RsiError(f"cannot read the campaign log {self.path}: {exc}") from exc
        entries = []
        for number, raw in enumerate(data.split(b"\n")[:-1], 1):
            if not raw.strip():
                continue
            try:
                entry = json.loads(raw)
                if not isinstance(entry, dict) or entry.get("schema") != LOG_SCHEMA:
                    raise ValueError(f"not an {LOG_SCHEMA} entry")
            except ValueError as exc:
                raise DeclarationError(
                    f"line {number} of the campaign log of {self.label} is corrupt ({exc})",
                    file=str(self.path),
                    hint="the log is append-only and written whole-line; restore it from a "
                    "backup, or move it away to start the campaign afresh",
                ) from None
            entries.append(entry)
        return entries

    @contextmanager
    def locked(self) -> Iterator["CampaignLog"]:
        """One writer at a time: budget checks and the append happen under this lock."""
        from rsi.store import claim_store

        claim_store(self.store_root)  # NB: the log may be the first thing written in the store
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            meta = self.dir / "campaign.json"
            if not meta.exists():
                meta.write_text(json.dumps({"label": self.label}) + "\n")
            fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise RsiError(f"cannot open the campaign folder {self.dir}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield self
        finally:
            os.close(fd)

    def append(self, entry: dict) -> dict:
        """Append one entry (the caller holds `locked()`); returns it once it is durable."""
        entry = {"schema": LOG_SCHEMA, **entry}
        line = (
            json.dumps(entry, sort_keys=True, separators=(",", ":"), allow_nan=False) + "\n"
        ).encode()
        created = not self.path.exists()
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = os.pread(fd, size, 0)
                os.ftruncate(fd, data.rfind(b"\n") + 1)  # NB: a torn entry was never acknowledged
            view = memoryview(line)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            dfd = os.open(self.dir, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        return entry


@dataclass(frozen=True)
class State:
    """What the log says: the start entry, the candidates in order, the stop entry if any, and
    the rounds given up on (`abandon` entries, by round number)."""

    start: dict | None
    candidates: tuple[dict, ...]
    stop: dict | None
    abandoned: Mapping[int, dict] = field(default_factory=dict)
    # NB: `regrade` entries, in order: the last one's `assess` is the assessment policy every
    # round is judged under from then on (its measurements stay)
    regrades: tuple[dict, ...] = ()

    @property
    def assess_override(self) -> dict:
        return dict((self.regrades[-1].get("assess") or {}) if self.regrades else {})

    @property
    def started_at(self) -> float | None:
        return (
            self.start["time"]
            if self.start
            else (self.candidates[0]["time"] if self.candidates else None)
        )


def state_of(entries: list[dict]) -> State:
    start = next((e for e in entries if e.get("kind") == "start"), None)
    cands = tuple(e for e in entries if e.get("kind") == "candidate")
    stop = next((e for e in entries if e.get("kind") == "stop"), None)
    abandoned: dict[int, dict] = {}
    for e in entries:
        if e.get("kind") == "abandon" and isinstance(e.get("round"), int):
            abandoned.setdefault(e["round"], e)
    regrades = tuple(e for e in entries if e.get("kind") == "regrade")
    return State(start, cands, stop, abandoned, regrades)


# ================================================================================== the policy


@dataclass(frozen=True)
class Policy:
    mode: str  # "exact" | "up_to"
    max_rounds: int
    deadline_s: float | None
    final_reserve_s: float
    stop_on: tuple[str, ...]
    final_seed: int

    def to_json(self) -> dict:
        return {
            "rounds": {self.mode: self.max_rounds},
            "deadline_s": self.deadline_s,
            "final_reserve_s": self.final_reserve_s,
            "stop_on": list(self.stop_on),
            "final_seed": self.final_seed,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], file: str, target: str) -> "Policy":
        return policy_of(
            {
                "rounds": doc["rounds"],
                "deadline_s": doc["deadline_s"],
                "final_reserve_s": doc["final_reserve_s"],
                "stop_on": doc["stop_on"],
                "final_seed": doc["final_seed"],
            },
            file,
            target,
        )


def policy_of(attrs: Mapping[str, Any], file: str, target: str) -> Policy:
    def bad(field_name: str, message: str, hint: str | None = None) -> DeclarationError:
        return DeclarationError(message, file=file, target=target, field=field_name, hint=hint)

    rounds = attrs["rounds"]
    if (
        not isinstance(rounds, dict)
        or len(rounds) != 1
        or next(iter(rounds)) not in ("exact", "up_to")
    ):
        raise bad(
            "rounds",
            f"expected {{exact = N}} or {{up_to = N}}, got {rounds!r}",
            "exact: the campaign is complete after exactly N rounds; up_to: at most N",
        )
    mode, n = next(iter(rounds.items()))
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise bad("rounds", f"{mode} must be a positive integer, got {n!r}")
    deadline = attrs["deadline_s"]
    reserve = attrs["final_reserve_s"]
    if deadline is not None and deadline <= 0:
        raise bad("deadline_s", "must be positive (seconds from the campaign's start)")
    if reserve < 0:
        raise bad("final_reserve_s", "must not be negative")
    if deadline is not None and reserve >= deadline:
        raise bad(
            "final_reserve_s",
            f"the final's reserve ({reserve:g} s) leaves no time for "
            f"rounds within deadline_s ({deadline:g} s)",
        )
    stop_on = attrs["stop_on"]
    if stop_on is None:
        stop_on = (
            ("rounds",)
            + (("deadline",) if deadline is not None else ())
            + (("agent",) if mode == "up_to" else ())
        )
    stop_on = tuple(stop_on)
    for reason in stop_on:
        if reason not in STOP_REASONS:
            raise bad(
                "stop_on",
                f"unknown stop reason {reason!r}",
                f"known reasons: {', '.join(STOP_REASONS)}",
            )
    if "rounds" not in stop_on:
        raise bad("stop_on", "must include 'rounds': a campaign whose budget is used is complete")
    if mode == "exact" and "agent" in stop_on:
        raise bad(
            "stop_on",
            "an exact-rounds campaign cannot accept an early stop by the agent",
            "use rounds = {up_to = N}, or drop 'agent' from stop_on",
        )
    if "deadline" in stop_on and deadline is None:
        raise bad("stop_on", "'deadline' is accepted but no deadline_s is declared")
    return Policy(mode, n, deadline, float(reserve), stop_on, int(attrs["final_seed"]))


def ended_reason(policy: Policy, state: State, now: float | None = None) -> str | None:
    """Why the campaign's rounds are over (None while open); `now=None` judges by the log only."""
    if state.stop is not None:
        return state.stop["reason"]
    if len(state.candidates) >= policy.max_rounds:
        return "rounds"
    if (
        now is not None
        and policy.deadline_s is not None
        and state.started_at is not None
        and now >= state.started_at + policy.deadline_s - policy.final_reserve_s
    ):
        return "deadline"
    return None


# ====================================================================== snapshots and scopes


def in_scope(rel: str, patterns: tuple[str, ...] | list[str]) -> bool:
    """Shell-style patterns on posix paths (`*` also crosses `/`); `dir/` names a whole folder."""
    for pat in patterns:
        if pat.endswith("/"):
            if rel.startswith(pat):
                return True
        elif fnmatch.fnmatchcase(rel, pat):
            return True
    return False


def walk_files(
    root: Path, exclude: tuple[str, ...] = DEFAULT_EXCLUDE, skip: tuple[Path, ...] = ()
) -> dict[str, Path]:
    """Regular files under `root` by posix relative path; symlinks are refused, not followed."""
    found: dict[str, Path] = {}
    skip_real = {os.path.realpath(p) for p in skip}
    for dirpath, dirnames, filenames in os.walk(root):
        keep = []
        for d in sorted(dirnames):
            full = Path(dirpath) / d
            if d in exclude or os.path.realpath(full) in skip_real:
                continue
            if full.is_symlink():
                raise UsageError(
                    f"{full} is a symlink; snapshots hold plain files only",
                    hint="replace the link by the file, or exclude it",
                )
            keep.append(d)
        dirnames[:] = keep
        for name in sorted(filenames):
            full = Path(dirpath) / name
            if name in exclude or name.endswith((".pyc", ".pyo")):
                continue
            if full.is_symlink():
                raise UsageError(
                    f"{full} is a symlink; snapshots hold plain files only",
                    hint="replace the link by the file, or exclude it",
                )
            if full.is_file():
                found[full.relative_to(root).as_posix()] = full
    return found


def manifest_digest(files: Mapping[str, str], executable: list[str]) -> str:
    return str(
        digest_value({"files": dict(sorted(files.items())), "executable": sorted(executable)})
    )


# ===================================================================================== rules


def _where(ctx: RuleContext) -> tuple[str, str]:
    return ctx.build_file, str(ctx.label)


def _binding_kind(info: Mapping[str, Any]) -> str | None:
    if info.get("kind") == "project_decl":
        return "project"
    if "spec_file" in info and "calibration" in info:
        return "task"
    return None


# ---------------------------------------------------------------------------------- campaign


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
        info={"policy": policy.to_json(), "kind": kind, "binding": str(a["binding"])},
    )


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
    return out


CAMPAIGN = Rule(
    name="campaign",
    doc="A budgeted series of rounds under one binding (or external project). Candidates arrive "
    "through `rsi candidate add` / `rsi round` into an append-only log; the targets "
    "<name>.round-N, <name>.best, <name>.final and <name>.report are derived from it.",
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
        "doc": attr("string", "free text", default=""),
        "tags": attr("string_list", "", default=[]),
    },
    impl=_campaign,
    generate=_generate,
)


# ------------------------------------------------------------------------- external project


def project_spec(a: Mapping[str, Any], error) -> dict:
    """The judge of an external project as data (rsi.project.spec/1); `error(message, field,
    hint=None)` builds the exception to raise."""
    if a["direction"] not in ("minimize", "maximize"):
        raise error("direction must be minimize or maximize", "direction")
    for field_name in ("editable", "protocol"):
        for pat in a[field_name]:
            # NB: patterns match paths inside the frozen tree; one that leaves it matches
            # nothing, and would only be refused later, at the campaign's start
            if pat.startswith("/") or ".." in pat.split("/") or "\x00" in pat:
                raise error(
                    f"{field_name} pattern {pat!r} leaves the project root "
                    f"({'an absolute path' if pat.startswith('/') else 'a path with ..'})",
                    field_name,
                    "name files relative to the project root, without '..'",
                )
    for pat in a["protocol"]:
        if in_scope(pat, a["editable"]):
            raise error(
                f"protocol file {pat!r} is inside the editable scope",
                "protocol",
                "a candidate must never be able to change its own judge",
            )
    m = dict(a["measure"])
    unknown = set(m) - {"pairs"}
    if unknown:
        raise error(
            f"unknown measure key(s) {sorted(unknown)}",
            "measure",
            "measure takes pairs (the benchmark command does its own warm-up)",
        )
    pairs = m.get("pairs", 8)
    if isinstance(pairs, bool) or not isinstance(pairs, int) or pairs < 1:
        raise error("measure.pairs must be a positive integer", "measure")
    assess = {
        "min_improvement": 0.05,
        "confidence": 0.95,
        "bootstrap_resamples": 2000,
        "min_pairs": 5,
        **a["assess"],
    }
    unknown = set(assess) - {"min_improvement", "confidence", "bootstrap_resamples", "min_pairs"}
    if unknown:
        raise error(f"unknown assess key(s) {sorted(unknown)}", "assess")
    if pairs < assess["min_pairs"]:
        raise error(
            f"measure.pairs ({pairs}) is below assess.min_pairs "
            f"({assess['min_pairs']}): no verdict could ever PASS",
            "measure",
        )
    return {
        "schema": "rsi.project.spec/1",
        "editable": list(a["editable"]),
        "protocol": list(a["protocol"]),
        "quality": {
            "cmd": a["quality_cmd"],
            "field": a["quality_field"],
            "timeout_s": a["command_timeout_s"],
        },
        "benchmark": {"cmd": a["benchmark_cmd"], "timeout_s": a["command_timeout_s"]},
        "measure": {"pairs": pairs, "metric": a["metric"], "direction": a["direction"]},
        "assess": assess,
        "env": dict(a["env"]),
        "seed": a["seed"],
        "threads": None,
    }


def _external_project(ctx: RuleContext) -> Provider:
    a = ctx.attrs
    spec = project_spec(a, lambda msg, field_name, hint=None: ctx.error(msg, field_name, hint))
    return Provider(
        info={
            "kind": "project_decl",
            "spec": spec,
            "root": a["root"],
            "editable": list(a["editable"]),
            "protocol": list(a["protocol"]),
            "exclude": list(a["exclude"]),
            "platform": toolchain_platform(ctx, a["toolchain"]),
            "timeout_s": a["timeout_s"],
        }
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
            "shell command; prints samples (one number per line, "
            'a JSON list, or {"samples": [...]})',
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


# ------------------------------------------------------------------- frozen project baseline


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
        argv=[*PY, f"{HARNESS_EXEC}/snapshot.py", "--from", src_dir, "--to", ctx.exec_path(dest)],
        inputs=[*scripts("snapshot"), *files],
        outputs=[f"{dest}/{r}" for r in rels],
        mnemonic="Snapshot",
        env=ENV,
        platform=platform,
        timeout_s=120,
    )


def _campaign_baseline(ctx: RuleContext) -> Provider:
    a = ctx.attrs
    decl = ctx.dep(a["project"]).info
    name = ctx.label.name
    platform = decl["platform"]
    base_dir = ctx.exec_path(f"{name}/base")
    base = _digest_artifacts(ctx, f"{name}/base", a["files"], a["executable"])
    spec = dict(a["spec"] or decl["spec"], frozen_manifest=a["manifest"])
    spec_file = ctx.write(f"{name}/project_spec.json", json.dumps(spec, sort_keys=True, indent=1))
    timeout = decl["timeout_s"]
    baseline_check = ctx.action(
        argv=[
            *PY,
            f"{HARNESS_EXEC}/project.py",
            "quality",
            "--spec",
            spec_file.path,
            "--base",
            base_dir,
            "--out",
            ctx.exec_path(f"{name}/baseline_check.json"),
        ],
        inputs=[*scripts("project"), *base, spec_file],
        outputs=[f"{name}/baseline_check.json"],
        mnemonic="BaselineQuality",
        env=ENV,
        platform=platform,
        timeout_s=timeout,
    )[0]
    calibration = ctx.action(
        argv=[
            *PY,
            f"{HARNESS_EXEC}/project.py",
            "bench",
            "--spec",
            spec_file.path,
            "--base",
            base_dir,
            "--out",
            ctx.exec_path(f"{name}/calibration.json"),
        ],
        inputs=[*scripts("project"), *base, spec_file],
        outputs=[f"{name}/calibration.json"],
        mnemonic="Calibrate",
        env=ENV,
        platform=platform,
        timeout_s=timeout,
        tags=["exclusive"],
    )[0]
    snap = _snapshot_action(ctx, base_dir, base, f"{name}/frozen", tool_platform(platform))
    return Provider(
        files=(baseline_check, calibration, *snap),
        info={
            "kind": "project",
            "spec_file": spec_file,
            "base": base,
            "base_dir": base_dir,
            "baseline_check": baseline_check,
            "calibration": calibration,
            "platform": platform,
            "timeout_s": timeout,
            "editable": spec["editable"],
            "manifest": a["manifest"],
        },
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
    info = base.info
    spec, platform, timeout = info["spec_file"], info["platform"], info["timeout_s"]
    out: dict[str, Artifact] = {}
    out["check"] = ctx.action(
        argv=[
            *PY,
            f"{HARNESS_EXEC}/project.py",
            "quality",
            "--spec",
            spec.path,
            "--base",
            info["base_dir"],
            "--overlay",
            cand_dir,
            "--out",
            ctx.exec_path(f"{prefix}check.json"),
        ],
        inputs=[*scripts("project"), *info["base"], *cand_files, spec],
        outputs=[f"{prefix}check.json"],
        mnemonic="Quality",
        env=ENV,
        platform=platform,
        timeout_s=timeout,
    )[0]
    out["samples"] = ctx.action(
        argv=[
            *PY,
            f"{HARNESS_EXEC}/project.py",
            "bench",
            "--spec",
            spec.path,
            "--base",
            info["base_dir"],
            "--overlay",
            cand_dir,
            "--out",
            ctx.exec_path(f"{prefix}samples.json"),
        ],
        inputs=[*scripts("project"), *info["base"], *cand_files, spec],
        outputs=[f"{prefix}samples.json"],
        mnemonic="Bench",
        env=ENV,
        platform=platform,
        timeout_s=timeout,
        tags=["exclusive"],
    )[0]
    out["verdict"] = ctx.action(
        argv=[
            *PY,
            f"{HARNESS_EXEC}/project.py",
            "assess",
            "--spec",
            spec.path,
            "--samples",
            out["samples"].path,
            "--check",
            out["check"].path,
            "--baseline-check",
            info["baseline_check"].path,
            "--calibration",
            info["calibration"].path,
            "--out",
            ctx.exec_path(f"{prefix}verdict.json"),
        ],
        inputs=[
            *scripts("project_assess"),
            spec,
            out["samples"],
            out["check"],
            info["baseline_check"],
            info["calibration"],
        ],
        outputs=[f"{prefix}verdict.json"],
        mnemonic="Assess",
        env=ENV,
        platform=platform,
        timeout_s=120,
    )[0]
    out["table"] = render_action(ctx, out["verdict"], out["check"], prefix, platform)
    return out


# ------------------------------------------------------------------------------------- round


def evidence_dir(ctx: RuleContext, binding: Label | str) -> str:
    """Where a round's judge evidence lives for `binding`: package-relative, named by the
    binding (its package too when that is another one)."""
    label = Label.parse(str(binding))
    if label.package == ctx.label.package:
        return f"_evidence/{label.name}"
    return f"_evidence/{label.package.replace('/', '.')}.{label.name}"


def _round(ctx: RuleContext) -> Provider:
    a = ctx.attrs
    binding = ctx.dep(a["binding"])
    name = ctx.label.name
    kind = "project" if binding.info.get("kind") == "project" else "task"
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
        editable = set(binding.info["editable"])
        outside = sorted(set(a["files"]) - editable)
        if outside:
            raise ctx.error(
                f"{', '.join(outside)} lie outside the editable scope "
                f"({', '.join(sorted(editable))})",
                "files",
            )
        assess_spec, verdict_dir = None, evidence
        full = binding.info["full_spec"]
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
    else:
        outside = sorted(f for f in a["files"] if not in_scope(f, binding.info["editable"]))
        if outside:
            raise ctx.error(f"{', '.join(outside)} lie outside the editable scope", "files")
        out = project_actions(ctx, binding, files, cand_dir, prefix=evidence)
    platform = binding.info["platform"]
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
            },
            sort_keys=True,
            indent=1,
        ),
    )
    doc = ctx.action(
        argv=[
            *PY,
            f"{HARNESS_EXEC}/round.py",
            "--meta",
            meta.path,
            "--verdict",
            out["verdict"].path,
            "--check",
            out["check"].path,
            "--out",
            ctx.exec_path(f"{name}/round.json"),
        ],
        inputs=[*scripts("round"), meta, out["verdict"], out["check"]],
        outputs=[f"{name}/round.json"],
        mnemonic="RoundDoc",
        env=ENV,
        platform=tools,
        timeout_s=60,
    )[0]
    snap = _snapshot_action(ctx, cand_dir, files, f"{name}/files", tools)
    return Provider(
        files=(doc, out["verdict"], out["table"], out["check"], out["samples"], *snap),
        info={
            "show": out["table"].path,
            "round": a["round"],
            "doc": doc,
            "verdict": out["verdict"],
            "check": out["check"],
            "samples": out["samples"],
            "table": out["table"],
            "cand_files": files,
            "cand_dir": cand_dir,
            "kind": kind,
            "platform": platform,
        },
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
    },
    impl=_round,
)


# -------------------------------------------------------------------------------------- best


def _best(ctx: RuleContext) -> Provider:
    rounds = [ctx.dep(r) for r in ctx.attrs["rounds"]]
    docs = [r.info["doc"] for r in rounds]
    platform = tool_platform(ctx.dep(ctx.attrs["binding"]).info["platform"])
    argv = [*PY, f"{HARNESS_EXEC}/select.py"]
    for d in docs:
        argv += ["--round", d.path]
    best = ctx.action(
        argv=[*argv, "--out", ctx.exec_path(f"{ctx.label.name}/best.json")],
        inputs=[*scripts("select"), *docs],
        outputs=[f"{ctx.label.name}/best.json"],
        mnemonic="Select",
        env=ENV,
        platform=platform,
        timeout_s=60,
    )[0]
    return Provider(files=(best,), info={"best": best})


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


# ------------------------------------------------------------------------------------- final

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


def _task_plan(info: Mapping[str, Any]) -> dict:
    h = HARNESS_EXEC
    task, base = info["task_dir"], info["baseline_dir"]
    py = ["{python}", "-I", "-B"]
    return {
        "specs": {"spec": info["spec_file"].path, "check_spec": info["check_spec_file"].path},
        "outputs": list(FINAL_TASK_OUTPUTS),
        "steps": [
            {
                "name": "baseline_check",
                "argv": [
                    *py,
                    f"{h}/check.py",
                    "--task",
                    task,
                    "--impl",
                    base,
                    "--spec",
                    "{check_spec}",
                    "--out",
                    "{out}/baseline_check.json",
                ],
            },
            {
                "name": "check",
                "argv": [
                    *py,
                    f"{h}/check.py",
                    "--task",
                    task,
                    "--impl",
                    "{candidate}",
                    "--spec",
                    "{check_spec}",
                    "--out",
                    "{out}/check.json",
                ],
            },
            {
                "name": "calibration",
                "argv": [
                    *py,
                    f"{h}/measure.py",
                    "--task",
                    task,
                    "--baseline",
                    base,
                    "--candidate",
                    base,
                    "--spec",
                    "{spec}",
                    "--out",
                    "{out}/calibration.json",
                ],
            },
            {
                "name": "samples",
                "argv": [
                    *py,
                    f"{h}/measure.py",
                    "--task",
                    task,
                    "--baseline",
                    base,
                    "--candidate",
                    "{candidate}",
                    "--spec",
                    "{spec}",
                    "--out",
                    "{out}/samples.json",
                ],
            },
            *_assess_render_steps(f"{h}/assess.py", py),
        ],
    }


def _project_plan(info: Mapping[str, Any]) -> dict:
    h = HARNESS_EXEC
    base = info["base_dir"]
    py = ["{python}", "-I", "-B"]
    proj = [*py, f"{h}/project.py"]
    return {
        "specs": {"spec": info["spec_file"].path},
        "outputs": list(FINAL_PROJECT_OUTPUTS),
        "steps": [
            {
                "name": "baseline_check",
                "argv": [
                    *proj,
                    "quality",
                    "--spec",
                    "{spec}",
                    "--base",
                    base,
                    "--out",
                    "{out}/baseline_check.json",
                ],
            },
            {
                "name": "check",
                "argv": [
                    *proj,
                    "quality",
                    "--spec",
                    "{spec}",
                    "--base",
                    base,
                    "--overlay",
                    "{candidate}",
                    "--out",
                    "{out}/check.json",
                ],
            },
            {
                "name": "calibration",
                "argv": [
                    *proj,
                    "bench",
                    "--spec",
                    "{spec}",
                    "--base",
                    base,
                    "--out",
                    "{out}/calibration.json",
                ],
            },
            {
                "name": "samples",
                "argv": [
                    *proj,
                    "bench",
                    "--spec",
                    "{spec}",
                    "--base",
                    base,
                    "--overlay",
                    "{candidate}",
                    "--out",
                    "{out}/samples.json",
                ],
            },
            *_assess_render_steps(f"{h}/project.py", py, project=True),
        ],
    }


def _assess_render_steps(script: str, py: list[str], project: bool = False) -> list[dict]:
    head = [*py, script, "assess"] if project else [*py, script]
    return [
        {
            "name": "verdict",
            "argv": [
                *head,
                "--spec",
                "{spec}",
                "--samples",
                "{out}/samples.json",
                "--check",
                "{out}/check.json",
                "--baseline-check",
                "{out}/baseline_check.json",
                "--calibration",
                "{out}/calibration.json",
                "--out",
                "{out}/verdict.json",
            ],
        },
        {
            "name": "table",
            "argv": [
                *py,
                f"{HARNESS_EXEC}/render.py",
                "--verdict",
                "{out}/verdict.json",
                "--check",
                "{out}/check.json",
                "--out",
                "{out}/verdict.txt",
            ],
        },
    ]


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
    platform = tool_platform(ctx.dep(a["binding"]).info["platform"])
    if not a["ended"] or a["ended"] not in a["accepted"]:
        doc = ctx.action(
            argv=[
                *PY,
                f"{HARNESS_EXEC}/final.py",
                "--pending",
                _pending_message(a),
                "--out-dir",
                ctx.exec_path(name),
            ],
            inputs=scripts("final"),
            outputs=[f"{name}/final.json"],
            mnemonic="FinalPending",
            env=ENV,
            platform=platform,
            timeout_s=60,
        )[0]
        return Provider(files=(doc,), info={"final": doc, "state": "pending", "show": None})
    binding = ctx.dep(a["binding"])
    info = binding.info
    rounds = [ctx.dep(r) for r in a["rounds"]]
    best = ctx.dep(a["best"]).info["best"]
    if info.get("kind") == "project":
        plan = _project_plan(info)
        inputs = [
            *scripts("project_assess"),
            *harness_files("render"),
            *info["base"],
            info["spec_file"],
        ]
    else:
        plan = _task_plan(info)
        inputs = [
            *harness_files("check"),
            *harness_files("measure"),
            *harness_files("assess"),
            *harness_files("render"),
            *info["runtime"],
            *info["baseline"],
            info["spec_file"],
            info["check_spec_file"],
        ]
    plan["schema"] = "rsi.campaign.final_plan/1"
    plan["candidates"] = {str(r.info["round"]): r.info["cand_dir"] for r in rounds}
    plan_file = ctx.write(f"{name}/plan.json", json.dumps(plan, sort_keys=True, indent=1))
    cand_files = [f for r in rounds for f in r.info["cand_files"]]
    outs = ctx.action(
        argv=[
            *PY,
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
        inputs=_union(scripts("final"), tuple(inputs), (plan_file, best), tuple(cand_files)),
        outputs=[f"{name}/{o}" for o in plan["outputs"]],
        mnemonic="Final",
        env=ENV,
        platform=info["platform"],
        timeout_s=float(info["timeout_s"]) * 4,
        tags=["exclusive"],
    )
    by_name = {o.path.rsplit("/", 1)[-1]: o for o in outs}
    return Provider(
        files=outs,
        info={
            "final": by_name["final.json"],
            "state": "ended",
            "show": by_name["verdict.txt"].path,
        },
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


# ------------------------------------------------------------------------------------ report


def _report(ctx: RuleContext) -> Provider:
    a = ctx.attrs
    name = ctx.label.name
    docs = [ctx.dep(r).info["doc"] for r in a["rounds"]]
    best = ctx.dep(a["best"]).info["best"]
    final = ctx.dep(a["final"]).info["final"]
    argv = [*PY, f"{HARNESS_EXEC}/report.py", "--campaign", a["campaign"]]
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
        inputs=[*scripts("report"), *docs, best, final, *extra],
        outputs=[f"{name}/report.json", f"{name}/report.md"],
        mnemonic="Report",
        env=ENV,
        platform=tool_platform(ctx.dep(a["binding"]).info["platform"]),
        timeout_s=60,
    )
    return Provider(files=outs, info={"show": outs[1].path})


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


RULES = [
    CAMPAIGN,
    EXTERNAL_PROJECT,
    CAMPAIGN_BASELINE,
    CAMPAIGN_ROUND,
    CAMPAIGN_BEST,
    CAMPAIGN_FINAL,
    CAMPAIGN_REPORT,
]
