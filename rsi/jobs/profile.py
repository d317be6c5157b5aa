"""Job profiles: budgets a job runs under, as a content-addressed TOML file.

A profile is `profiles/<name>.toml` in the workspace (or any path given to `--profile`). Its
digest is the digest of its bytes (the store's digest function), recorded with every job that
ran under it (the job record, its `job_started`/`job_finished` events, its evidence), and its
bytes are kept in the store by that digest: changing a profile makes a new profile, and the
version a job ran under stays readable. No profile (and no `profiles/default.toml`) is the
empty profile: no budget but the job's own work.

    doc = "nightly round budget"
    executor = "slurm"         # where its actions run unless `submit --executor` says
    [budget]
    rounds = 4                 # rounds the job may judge
    calls = 200                # agent calls (candidate usage records)
    tokens = 2_000_000         # agent tokens: input + output (cached are part of input)
    money_usd = 30.0           # tokens priced with [prices]
    wall_s = 3600              # wall clock from the job's first start, resumes included
    action_timeout_s = 900     # longest any one action may run
    retries = 2                # re-runs of a build that failed for an infrastructure fault
    disk_bytes = "20g"         # the job's folder, scratch and the outputs its actions wrote
    memory_bytes = "16g"       # the job's actions together (and each one at most)
    [prices]                   # USD per million tokens (money_usd needs them)
    input_per_mtok = 3.0
    output_per_mtok = 15.0
    cached_per_mtok = 0.3

Unknown usage is never counted as zero: a budget over usage the job cannot know (tokens of a
candidate whose usage was not reported, money without prices, calls of a plain build) stops
the job before it runs anything under that budget, naming the budget (`budget:tokens`) and
saying the usage is unknown.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rsi.digest import DEFAULT_FUNCTION, digest_bytes
from rsi.errors import DeclarationError, UsageError

PROFILE_SCHEMA = "rsi.profile/1"
PROFILE_DIR = "profiles"
DEFAULT_PROFILE = "default"

# NB: field -> (kind, meaning); kinds: int (whole >= 0), float (>= 0), size (bytes or "4g")
BUDGETS: dict[str, tuple[str, str]] = {
    "rounds": ("int", "campaign rounds the job may judge"),
    "calls": ("int", "agent calls, from the candidates' usage records"),
    "tokens": ("int", "agent tokens (input + output), from the candidates' usage records"),
    "money_usd": ("float", "agent tokens priced with [prices], in USD"),
    "wall_s": ("float", "wall-clock seconds from the job's first start (resumes included)"),
    "action_timeout_s": ("float", "seconds any one action of the job may run"),
    "retries": ("int", "re-runs of a build that failed for an infrastructure fault"),
    "disk_bytes": ("size", "bytes of the job's folder, scratch and outputs it wrote"),
    "memory_bytes": ("size", "bytes of memory of the job's actions together (and each one)"),
}
PRICES = ("input_per_mtok", "output_per_mtok", "cached_per_mtok")


@dataclass(frozen=True)
class Profile:
    name: str
    path: str | None
    digest: str  # "hash/size" of the file's bytes ("" for the empty profile's b"")
    budget: dict[str, float | int] = field(default_factory=dict)
    prices: dict[str, float] = field(default_factory=dict)
    doc: str = ""
    text: bytes = b""
    executor: str | None = None  # NB: rsi.toml's executors (slurm, remote, ...); None: as set

    def limit(self, name: str) -> float | int | None:
        return self.budget.get(name)

    def to_json(self) -> dict:
        return {
            "schema": PROFILE_SCHEMA,
            "name": self.name,
            "path": self.path,
            "digest": self.digest,
            "budget": dict(self.budget),
            "prices": dict(self.prices),
            "doc": self.doc,
            "executor": self.executor,
        }


def _number(value: Any, kind: str, file: str, name: str) -> float | int:
    if kind == "size" and isinstance(value, str):
        from rsi.limits import parse_size

        try:
            return parse_size(value, name)
        except DeclarationError as exc:
            raise DeclarationError(exc.detail, file=file, field=name, hint=exc.hint) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        what = "a whole number" if kind in ("int", "size") else "a number"
        extra = ' or a size such as "4g"' if kind == "size" else ""
        raise DeclarationError(f"expected {what}{extra}, got {value!r}", file=file, field=name)
    if kind in ("int", "size") and not isinstance(value, int):
        raise DeclarationError(f"expected a whole number, got {value!r}", file=file, field=name)
    if not math.isfinite(value) or value < 0:
        raise DeclarationError(f"expected a number >= 0, got {value!r}", file=file, field=name)
    return value


def parse_profile(
    text: bytes, *, name: str, path: str | None, function: str = DEFAULT_FUNCTION
) -> Profile:
    """The profile in `text`; every error names the file and the field."""
    file = path or f"profile {name}"
    try:
        data = tomllib.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise DeclarationError(f"not valid TOML: {exc}", file=file) from None
    unknown = sorted(set(data) - {"doc", "budget", "prices", "schema", "executor"})
    if unknown:
        raise DeclarationError(
            f"unknown key(s) {', '.join(unknown)}",
            file=file,
            field=unknown[0],
            hint="a profile has `doc`, `executor`, [budget] and [prices]",
        )
    schema = data.get("schema", PROFILE_SCHEMA)
    if schema != PROFILE_SCHEMA:
        raise DeclarationError(
            f"unknown profile schema {schema!r}", file=file, field="schema", hint=PROFILE_SCHEMA
        )
    doc = data.get("doc", "")
    if not isinstance(doc, str):
        raise DeclarationError("expected a string", file=file, field="doc")
    section = data.get("budget", {})
    if not isinstance(section, dict):
        raise DeclarationError("[budget] must be a table", file=file, field="budget")
    budget: dict[str, float | int] = {}
    for key, value in section.items():
        if key not in BUDGETS:
            raise DeclarationError(
                "unknown budget",
                file=file,
                field=f"budget.{key}",
                hint=f"known budgets: {', '.join(BUDGETS)}",
            )
        budget[key] = _number(value, BUDGETS[key][0], file, f"budget.{key}")
    for key in ("wall_s", "action_timeout_s"):
        if budget.get(key) == 0:
            raise DeclarationError("must be more than 0 seconds", file=file, field=f"budget.{key}")
    prices_in = data.get("prices", {})
    if not isinstance(prices_in, dict):
        raise DeclarationError("[prices] must be a table", file=file, field="prices")
    prices: dict[str, float] = {}
    for key, value in prices_in.items():
        if key not in PRICES:
            raise DeclarationError(
                "unknown price", file=file, field=f"prices.{key}", hint=", ".join(PRICES)
            )
        prices[key] = float(_number(value, "float", file, f"prices.{key}"))
    executor = data.get("executor")
    if executor is not None:
        from rsi.workspace import EXECUTORS

        if executor not in EXECUTORS:
            raise DeclarationError(
                f"unknown executor {executor!r}",
                file=file,
                field="executor",
                hint=f"use one of {', '.join(EXECUTORS)}",
            )
    return Profile(
        name=name,
        path=path,
        digest=str(digest_bytes(text, function)),
        budget=budget,
        prices=prices,
        doc=doc,
        text=text,
        executor=executor,
    )


def load_profile(ws_root: Path, spec: str | None, function: str = DEFAULT_FUNCTION) -> Profile:
    """`--profile SPEC`: a name (`profiles/<name>.toml` in the workspace) or a path to a
    `.toml` file; None: `profiles/default.toml` when it exists, else the empty profile."""
    if spec is None:
        default = ws_root / PROFILE_DIR / f"{DEFAULT_PROFILE}.toml"
        if not default.is_file():
            return parse_profile(b"", name="none", path=None, function=function)
        spec = DEFAULT_PROFILE
    if "/" in spec or spec.endswith(".toml"):
        path = Path(spec).expanduser()
        if not path.is_absolute():
            path = Path.cwd() / path
        name = path.stem
    else:
        path = ws_root / PROFILE_DIR / f"{spec}.toml"
        name = spec
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        known = sorted(p.stem for p in (ws_root / PROFILE_DIR).glob("*.toml"))
        raise UsageError(
            f"--profile {spec}: no such profile ({path})",
            hint=f"profiles here: {', '.join(known)}" if known else "create profiles/NAME.toml",
        ) from None
    except OSError as exc:
        raise UsageError(f"--profile {spec}: cannot read {path}: {exc.strerror}") from None
    return parse_profile(text, name=name, path=str(path.resolve()), function=function)


# ---------------------------------------------------------------------------- accounting


class BudgetStop(Exception):
    """A budget was reached: the job stops, naming it (`budget:<name>`)."""

    def __init__(self, name: str, message: str, *, used: Any = None, limit: Any = None) -> None:
        super().__init__(message)
        self.name = name
        self.reason = f"budget:{name}"
        self.message = message
        self.used = used
        self.limit = limit

    def to_json(self) -> dict:
        return {
            "budget": self.name,
            "reason": self.reason,
            "message": self.message,
            "used": self.used,
            "limit": self.limit,
        }


def _tokens(usage: dict) -> int | None:
    t = (usage or {}).get("tokens") or {}
    if t.get("input") is None or t.get("output") is None:
        return None
    return int(t["input"]) + int(t["output"])


def money_of(usage: dict, prices: dict) -> float | None:
    """USD of one usage record under `prices` (None when anything needed is unknown). Cached
    tokens are part of the input: they are priced at the cached rate, the rest at input's."""
    t = (usage or {}).get("tokens") or {}
    if t.get("input") is None or t.get("output") is None:
        return None
    if "input_per_mtok" not in prices or "output_per_mtok" not in prices:
        return None
    cached = t.get("cached")
    if cached is None and "cached_per_mtok" in prices:
        return None  # NB: the split between cached and fresh input is unknown
    cached = cached or 0
    rate_cached = prices.get("cached_per_mtok", prices["input_per_mtok"])
    fresh = t["input"] - cached
    return (
        fresh * prices["input_per_mtok"]
        + cached * rate_cached
        + t["output"] * prices["output_per_mtok"]
    ) / 1e6


class Ledger:
    """What a job has used, against its profile: `charge` before each unit of work (a round,
    a build) with what that unit costs; a budget it would pass, or one it cannot check because
    the usage is unknown, raises BudgetStop. Unknown is None, never 0."""

    def __init__(self, profile: Profile, used: dict | None = None) -> None:
        self.profile = profile
        # NB: a usage is absent until charged, None once any part of it was unknown
        self.used: dict[str, Any] = {"rounds": 0, "retries": 0}
        self.used.update(used or {})

    def _charge(self, name: str, amount: float | int | None, what: str) -> None:
        limit = self.profile.limit(name)
        if amount is None or (name in self.used and self.used[name] is None):
            self.used[name] = None
            if limit is None:
                return
            raise BudgetStop(
                name,
                f"budget {name} = {limit}: the {name} used by {what} are unknown (not reported),"
                " and unknown usage is never counted as zero",
                used=None,
                limit=limit,
            )
        current = self.used.get(name, 0)
        if limit is not None and current + amount > limit:
            raise BudgetStop(
                name,
                f"budget {name} = {limit} reached: {current} used, {what} needs {amount} more",
                used=current,
                limit=limit,
            )
        self.used[name] = current + amount

    def charge_round(self, usage: dict | None, what: str) -> None:
        """One round about to be judged, whose candidate cost `usage` (a usage record)."""
        usage = usage or {}
        self._charge("rounds", 1, what)
        self._charge("calls", usage.get("calls"), what)
        self._charge("tokens", _tokens(usage), what)
        self._charge("money_usd", money_of(usage, self.profile.prices), what)

    def charge_usage(self, usage: dict | None, what: str) -> None:
        """Agent usage the job is accountable for without judging a round (a final: the whole
        campaign's totals; a build: none known)."""
        usage = usage or {}
        self._charge("calls", usage.get("calls"), what)
        self._charge("tokens", _tokens(usage), what)
        self._charge("money_usd", money_of(usage, self.profile.prices), what)

    def charge_retry(self, what: str) -> None:
        self._charge("retries", 1, what)

    def check_wall(self, elapsed_s: float) -> None:
        limit = self.profile.limit("wall_s")
        if limit is not None and elapsed_s >= limit:
            raise BudgetStop(
                "wall_s",
                f"budget wall_s = {limit} reached: the job has run {elapsed_s:.1f}s",
                used=round(elapsed_s, 3),
                limit=limit,
            )

    def check_amount(self, name: str, amount: float | int | None, what: str) -> None:
        """A measured quantity (disk, memory, one action's run time) against its limit."""
        limit = self.profile.limit(name)
        if limit is None or amount is None:
            return
        self.used[name] = max(amount, self.used.get(name) or 0)
        if amount >= limit:
            raise BudgetStop(
                name,
                f"budget {name} = {limit} reached: {what} {amount}",
                used=amount,
                limit=limit,
            )
