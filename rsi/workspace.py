"""The workspace: its root (the folder holding `rsi.toml`), its settings, and where its store is.

Settings come from `rsi.toml` and may be overridden on the command line; unknown settings are
errors naming the file and key, never ignored.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

from rsi.digest import DIGEST_FUNCTIONS
from rsi.errors import DeclarationError, UsageError

CONFIG_FILE = "rsi.toml"
BUILD_FILE = "BUILD.toml"

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
    digest_function_explicit: bool = field(default=False, compare=False)

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
        ws = replace(self, **clean)
        ws._check()
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
        extra = set(data) - {"workspace"}
        if extra or not isinstance(section, dict):
            raise DeclarationError(
                f"unknown section(s) {', '.join(sorted(extra)) or 'workspace'}",
                file=str(path),
                hint="settings go under [workspace]",
            )
        kw: dict = {}
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
        ws = cls(root=root, digest_function_explicit="digest_function" in kw, **kw)
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
