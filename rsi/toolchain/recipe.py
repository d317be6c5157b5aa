"""Toolchain recipes: the declared, pinned inputs of a root filesystem and their digest.

A recipe names a Debian suite and package list, pinned wheels (by sha256) and a
SOURCE_DATE_EPOCH. Its digest covers every field that can change the built tree, plus the
builder version; it never covers where the recipe was declared or which mirror served it.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rsi.digest import Digest, digest_value
from rsi.errors import DeclarationError

RECIPE_SCHEMA = "rsi.toolchain.recipe/1"
# NB: bump when the build steps change in a way that changes the tree for the same recipe
BUILDER_VERSION = "1"
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_WHEEL_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+!-]*\.whl$")
_WHEEL_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
_WHEEL_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+!_-]*$")
DEFAULT_ENV = (
    ("LANG", "C.UTF-8"),
    ("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
    ("PYTHONDONTWRITEBYTECODE", "1"),
)


@dataclass(frozen=True)
class Wheel:
    """One pinned wheel: exact file name and its sha256 (what pip --require-hashes checks)."""

    name: str
    version: str
    file: str
    sha256: str

    def encode(self) -> dict:
        return {
            "name": self.name,
            "version": self.version,
            "file": self.file,
            "sha256": self.sha256,
        }


@dataclass(frozen=True)
class Recipe:
    name: str
    suite: str
    packages: tuple[str, ...]
    wheels: tuple[Wheel, ...] = ()
    source_date_epoch: int = 1735689600
    components: tuple[str, ...] = ("main",)
    variant: str = "essential"
    architecture: str = "amd64"
    env: tuple[tuple[str, str], ...] = DEFAULT_ENV
    # descriptive only: never part of the digest
    description: str = field(default="", compare=False)
    declared_in: Path | None = field(default=None, compare=False)

    def describe(self) -> dict:
        return {
            "schema": RECIPE_SCHEMA,
            "builder": BUILDER_VERSION,
            "name": self.name,
            "suite": self.suite,
            "components": list(self.components),
            "variant": self.variant,
            "architecture": self.architecture,
            "packages": sorted(self.packages),
            "wheels": [w.encode() for w in sorted(self.wheels, key=lambda w: w.name)],
            "source_date_epoch": self.source_date_epoch,
            "env": dict(self.env),
        }

    def digest(self) -> Digest:
        return digest_value(self.describe())

    @property
    def lock_path(self) -> Path | None:
        """Where the package lock lives beside the declaration (`toolchains/<name>.lock`)."""
        return None if self.declared_in is None else self.declared_in.parent / f"{self.name}.lock"


def recipe_from_dict(
    doc: Mapping[str, Any], *, name: str | None = None, file: str | None = None
) -> Recipe:
    name = name or doc.get("name")
    where = {"file": file, "target": name}
    if not isinstance(name, str) or not _NAME.match(name):
        raise DeclarationError(
            f"toolchain name {name!r} is not a valid name",
            field="name",
            **where,
            hint="use lower-case letters, digits, '.', '_' or '-'",
        )
    known = {
        "name",
        "suite",
        "packages",
        "wheels",
        "source_date_epoch",
        "components",
        "variant",
        "architecture",
        "env",
        "description",
    }
    unknown = sorted(set(doc) - known)
    if unknown:
        raise DeclarationError(
            f"unknown field(s) {', '.join(unknown)}",
            **where,
            hint=f"known fields: {', '.join(sorted(known))}",
        )

    def strings(key: str, default: tuple[str, ...] = ()) -> tuple[str, ...]:
        value = doc.get(key, list(default))
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise DeclarationError("must be a list of non-empty strings", field=key, **where)
        return tuple(value)

    suite = doc.get("suite")
    if not isinstance(suite, str) or not suite:
        raise DeclarationError(
            'a Debian suite is required, e.g. "bookworm"', field="suite", **where
        )
    packages = strings("packages")
    if "python3" not in packages and doc.get("wheels"):
        raise DeclarationError("wheels need python3 in packages", field="packages", **where)
    wheels = []
    for i, w in enumerate(doc.get("wheels", [])):
        f = f"wheels[{i}]"
        if not isinstance(w, Mapping) or set(w) != {"name", "version", "file", "sha256"}:
            raise DeclarationError(
                "each wheel needs exactly name, version, file, sha256", field=f, **where
            )
        if not _SHA256.match(str(w["sha256"])):
            raise DeclarationError(
                f"sha256 {w['sha256']!r} is not 64 lower-case hex digits", field=f, **where
            )
        if not str(w["file"]).endswith(".whl"):
            raise DeclarationError("file must be a .whl file name", field=f, **where)
        if not _WHEEL_FILE.match(str(w["file"])):
            # NB: the file is looked up, written and (on a bad hash) deleted in the download
            # cache by this name: a folder, '..' or an absolute path would reach the host
            raise DeclarationError(
                f"file {w['file']!r} must be a plain file name (no folder, no '..', not absolute)",
                field=f,
                **where,
                hint="name the wheel as pip downloads it, e.g. numpy-2.4.6-cp311-...whl",
            )
        for key, pattern in (("name", _WHEEL_NAME), ("version", _WHEEL_VERSION)):
            if not pattern.match(str(w[key])):
                raise DeclarationError(f"{key} {w[key]!r} is not a wheel {key}", field=f, **where)
        wheels.append(Wheel(str(w["name"]), str(w["version"]), str(w["file"]), str(w["sha256"])))
    epoch = doc.get("source_date_epoch", 1735689600)
    if not isinstance(epoch, int) or epoch <= 0:
        raise DeclarationError(
            "must be a positive integer (seconds since 1970)", field="source_date_epoch", **where
        )
    env = doc.get("env", dict(DEFAULT_ENV))
    if not isinstance(env, Mapping) or not all(isinstance(v, str) for v in env.values()):
        raise DeclarationError("must be a table of strings", field="env", **where)
    return Recipe(
        name=name,
        suite=suite,
        packages=packages,
        wheels=tuple(wheels),
        source_date_epoch=epoch,
        components=strings("components", ("main",)),
        variant=str(doc.get("variant", "essential")),
        architecture=str(doc.get("architecture", "amd64")),
        env=tuple(sorted(env.items())),
        description=str(doc.get("description", "")),
        declared_in=Path(file).resolve() if file else None,
    )


def load_declarations(path: str | os.PathLike) -> dict[str, Recipe]:
    """Every `rule = "toolchain"` target of a declaration file, by name."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise DeclarationError(
            f"cannot read toolchain declarations: {exc}", file=str(path)
        ) from exc
    tables = {
        n: {k: v for k, v in t.items() if k not in ("rule", "doc", "tags")}
        for n, t in doc.items()
        if isinstance(t, Mapping) and t.get("rule") == "toolchain"
    }
    if not tables:
        raise DeclarationError(
            "no toolchain targets",
            file=str(path),
            hint='declare one, e.g. [numpy] with rule = "toolchain"',
        )
    return {n: recipe_from_dict(t, name=n, file=str(path)) for n, t in tables.items()}


def load_recipe(
    spec: str | os.PathLike | Mapping[str, Any] | Recipe, name: str | None = None
) -> Recipe:
    """A recipe from a Recipe, a dict, `path/BUILD.toml:name`, or a path plus `name`."""
    if isinstance(spec, Recipe):
        return spec
    if isinstance(spec, Mapping):
        return recipe_from_dict(spec, name=name)
    text = os.fspath(spec)
    if name is None and ":" in os.path.basename(text):
        text, name = text.rsplit(":", 1)
    recipes = load_declarations(text)
    if name is None:
        if len(recipes) != 1:
            raise DeclarationError(
                f"declares {len(recipes)} toolchains; name one",
                file=text,
                hint=f"use {text}:<name>, one of {sorted(recipes)}",
            )
        return next(iter(recipes.values()))
    if name not in recipes:
        raise DeclarationError(
            f"no toolchain {name!r}", file=text, hint=f"declared: {', '.join(sorted(recipes))}"
        )
    return recipes[name]
