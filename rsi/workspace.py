"""The workspace: its root (the folder holding `rsi.toml`), its settings, and where its store is.

Settings come from `rsi.toml` and may be overridden on the command line; unknown settings are
errors naming the file and key, never ignored.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable

from rsi.digest import DIGEST_FUNCTIONS
from rsi.errors import DeclarationError, UsageError

CONFIG_FILE = "rsi.toml"
BUILD_FILE = "BUILD.toml"
EXECUTORS = ("local", "bwrap", "docker", "remote", "slurm")
_RULE_REF = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(:[A-Za-z_]\w*)?$")

_SETTINGS = {
    "salt": str,
    "store": str,
    "jobs": int,
    "digest_function": str,
    "keep_going": bool,
    "remote": str,
    "remote_mode": str,
    "remote_fallback": bool,
    "executor": str,
    "rules": list,
}


_LIMITS = ("scratch_mb", "memory_mb")


def _limits(section: object, file: str) -> dict:
    """The [limits] table: whole MiB, at least 1 (see rsi.limits)."""
    if not isinstance(section, dict):
        raise DeclarationError("[limits] must be a table", file=file, field="limits")
    for key, value in section.items():
        if key not in _LIMITS:
            raise DeclarationError(
                "unknown setting in [limits]",
                file=file,
                field=key,
                hint=f"known settings: {', '.join(_LIMITS)}",
            )
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise DeclarationError(
                f"expected a whole number of MiB, at least 1, got {value!r}", file=file, field=key
            )
    return dict(section)


@dataclass(frozen=True)
class Workspace:
    root: Path
    salt: str = ""
    store: Path = Path("cache")
    jobs: int = field(default_factory=lambda: os.cpu_count() or 1)
    digest_function: str = "blake3"
    keep_going: bool = False
    remote: str = ""
    remote_mode: str = "cache"  # "cache" or "execute"
    remote_fallback: bool = False
    executor: str = "local"
    rules: tuple[str, ...] = ()
    # NB: [limits]: every action's scratch and memory in MiB (None: rsi.limits' defaults)
    scratch_mb: int | None = None
    memory_mb: int | None = None
    # NB: [slurm]: the cluster the slurm executor submits to (rsi/executors/slurm.py)
    slurm: tuple[tuple[str, object], ...] = ()
    digest_function_explicit: bool = field(default=False, compare=False)
    # NB: where `store` came from ("rsi.toml", "--store" or "" for the default), for errors
    store_from: str = field(default="", compare=False)

    @property
    def store_dir(self) -> Path:
        return self.store if self.store.is_absolute() else self.root / self.store

    @property
    def out_dir(self) -> Path:
        return self.root / "out"

    def with_overrides(self, **kw: object) -> "Workspace":
        clean = {k: v for k, v in kw.items() if v is not None}
        if "digest_function" in clean:
            clean["digest_function_explicit"] = True
        if "store" in clean:
            clean["store"] = Path(str(clean["store"])).absolute()
            clean["store_from"] = "--store"
        ws = replace(self, **clean)
        ws._check()
        if ws.executor == "remote" and not ws.remote:
            # NB: checked once the command line is applied: it may give the remote
            raise DeclarationError(
                "the remote executor needs a remote",
                file=CONFIG_FILE,
                field="executor",
                hint='set remote = "grpc://HOST:PORT" (or --remote), or use another executor',
            )
        return ws

    def _check(self, file: str = CONFIG_FILE) -> None:
        if self.digest_function not in DIGEST_FUNCTIONS:
            raise DeclarationError(
                f"unknown digest function {self.digest_function!r}",
                file=file,
                field="digest_function",
                hint=f"use one of {', '.join(DIGEST_FUNCTIONS)}",
            )
        if self.jobs < 1:
            raise DeclarationError("jobs must be at least 1", file=file, field="jobs")
        if self.remote_mode not in ("cache", "execute"):
            raise DeclarationError(
                "remote_mode must be 'cache' or 'execute'", file=file, field="remote_mode"
            )
        if self.executor not in EXECUTORS:
            raise DeclarationError(
                f"unknown executor {self.executor!r}",
                file=file,
                field="executor",
                hint=f"use one of {', '.join(EXECUTORS)}",
            )
        for ref in self.rules:
            if not isinstance(ref, str) or not _RULE_REF.match(ref):
                raise DeclarationError(
                    f"{ref!r} is not a rule module",
                    file=file,
                    field="rules",
                    hint='list "package.module" or "package.module:function" strings',
                )

    def check_store(self) -> None:
        """Refuse a store folder rsi must not write into: the workspace root or a folder above
        it, `out/`, or a folder that holds files and is not an rsi store (rsi deletes files in
        its store). Exit 2, naming where the setting came from."""
        from rsi.store import store_folder_problem

        store = self.store_dir.resolve()
        root = self.root.resolve()
        problem = None
        if store == root or store in root.parents:
            where = "the workspace root" if store == root else "a folder above the workspace"
            problem = f"it is {where} ({root}); rsi deletes files in its store"
        elif store == self.out_dir.resolve() or self.out_dir.resolve() in store.parents:
            problem = "it is under out/, which rsi replaces"
        else:
            problem = store_folder_problem(store)
        if problem is None:
            return
        message = f"the store {store} cannot be used: {problem}"
        hint = "use a new or empty folder, or an existing rsi store; nothing was written"
        if self.store_from == "--store":
            raise UsageError(f"--store: {message}", hint=hint)
        raise DeclarationError(
            message + ("" if self.store_from else " (the default store folder)"),
            file=str(self.root / CONFIG_FILE),
            field="store",
            hint=hint + ("" if self.store_from else "; set `store` under [workspace]"),
        )

    @classmethod
    def load(cls, root: Path) -> "Workspace":
        path = root / CONFIG_FILE
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise DeclarationError(f"not valid TOML: {exc}", file=str(path)) from None
        except RecursionError:  # NB: tomllib recurses per nested array/inline table
            raise DeclarationError(
                "not valid TOML: values are nested too deeply", file=str(path)
            ) from None
        section = data.get("workspace", {})
        extra = set(data) - {"workspace", "limits", "slurm"}
        if extra or not isinstance(section, dict):
            raise DeclarationError(
                f"unknown section(s) {', '.join(sorted(extra)) or 'workspace'}",
                file=str(path),
                hint="settings go under [workspace] (and [limits], [slurm])",
            )
        kw: dict = _limits(data.get("limits", {}), str(path))
        if "slurm" in data:
            from rsi.executors.slurm import check_settings

            kw["slurm"] = tuple(
                (k, tuple(v) if isinstance(v, list) else v)
                for k, v in sorted(check_settings(data["slurm"], str(path)).items())
            )
        for key, value in section.items():
            want = _SETTINGS.get(key)
            if want is None:
                raise DeclarationError(
                    "unknown setting",
                    file=str(path),
                    field=key,
                    hint=f"known settings: {', '.join(sorted(_SETTINGS))}",
                )
            if not isinstance(value, want) or (want is int and isinstance(value, bool)):
                raise DeclarationError(
                    f"expected {want.__name__}, got {value!r}", file=str(path), field=key
                )
            kw[key] = value
        if "store" in kw:
            kw["store"] = Path(kw["store"])
        if "rules" in kw:
            kw["rules"] = tuple(kw["rules"])
        ws = cls(
            root=root,
            digest_function_explicit="digest_function" in kw,
            store_from=CONFIG_FILE if "store" in kw else "",
            **kw,
        )
        ws._check(str(path))
        return ws

    @classmethod
    def discover(cls, start: Path | None = None) -> "Workspace":
        here = (start or Path.cwd()).resolve()
        for candidate in (here, *here.parents):
            if (candidate / CONFIG_FILE).is_file():
                return cls.load(candidate)
        raise UsageError(
            f"{here} is not inside an rsi workspace (no {CONFIG_FILE} here or above)",
            hint=f"create an empty {CONFIG_FILE} at the root of your project, or pass --workspace",
        )


# NB: folders never searched for packages (outputs, caches, vendored trees)
SKIP_DIRS = {"cache", "out", "node_modules", "__pycache__", "build", "dist"}


def packages_under(root: Path, package: str) -> Iterable[str]:
    """Every package at or below `package` (folders holding a BUILD.toml), in walk order."""
    base = root / package if package else root
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in SKIP_DIRS)
        if BUILD_FILE in filenames:
            rel = os.path.relpath(dirpath, root)
            yield "" if rel == "." else rel.replace(os.sep, "/")
