"""Labels (`//pkg:name`, `:name`) and target patterns (`//pkg/...`, `//pkg:all`). It must never
touch the disk.

A package is a folder, relative to the workspace root, that holds a declaration file. Labels are
plain values; resolving a pattern against the packages on disk is the loader's job.
"""

from __future__ import annotations

import re

from rsi.errors import LabelError
from rsi.record import Frozen, Ordered

_set = object.__setattr__

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+=,@~-]*$")
_PKG_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+=,@~-]*$")


def _check_package(pkg: str, text: str) -> None:
    if pkg and not all(_PKG_PART.match(p) for p in pkg.split("/")):
        raise LabelError(
            f"bad package in label {text!r}", hint="packages are folder paths like tasks/softmax"
        )


class Label(Ordered):
    __slots__ = ("package", "name")
    _fields = ("package", "name")
    package: str
    name: str

    def __init__(self, package: str, name: str) -> None:
        _set(self, "package", package)
        _set(self, "name", name)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is Label:
            return self.package == other.package and self.name == other.name  # type: ignore[attr-defined]
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.package, self.name))

    def __lt__(self, other: object) -> bool:
        if other.__class__ is Label:
            return (self.package, self.name) < (other.package, other.name)  # type: ignore[attr-defined]
        return NotImplemented

    def __str__(self) -> str:
        return f"//{self.package}:{self.name}"

    def __reduce__(self) -> tuple:
        # NB: a plain constructor call: the graph of a large build holds one per target
        return (Label, (self.package, self.name))

    @classmethod
    def parse(cls, text: str, current_package: str | None = None) -> "Label":
        if not isinstance(text, str) or not text:
            raise LabelError(f"not a label: {text!r}")
        if text.startswith(":"):
            if current_package is None:
                raise LabelError(
                    f"relative label {text!r} needs a package", hint="write //pkg:name"
                )
            pkg, name = current_package, text[1:]
        elif text.startswith("//"):
            body = text[2:]
            if ":" in body:
                pkg, name = body.split(":", 1)
            else:
                pkg = body.rstrip("/")
                name = pkg.rsplit("/", 1)[-1] if pkg else ""
        else:
            raise LabelError(f"not a label: {text!r}", hint="labels look like //pkg:name or :name")
        pkg = pkg.strip("/")
        _check_package(pkg, text)
        if not _NAME.match(name or ""):
            raise LabelError(f"bad target name in label {text!r}")
        return cls(pkg, name)


class Pattern(Frozen):
    """`//pkg:name`, `//pkg:all` (every target of pkg) or `//pkg/...` (pkg and below)."""

    __slots__ = ("package", "name", "recursive")
    _fields = ("package", "name", "recursive")
    package: str
    name: str | None  # None: all targets
    recursive: bool

    def __init__(self, package: str, name: str | None, recursive: bool) -> None:
        _set(self, "package", package)
        _set(self, "name", name)
        _set(self, "recursive", recursive)

    def __reduce__(self) -> tuple:
        return (Pattern, (self.package, self.name, self.recursive))

    @classmethod
    def parse(cls, text: str, current_package: str = "") -> "Pattern":
        if text.startswith("//") and (text.endswith("/...") or text == "//..."):
            pkg = text[2:-3].rstrip("/")
            _check_package(pkg, text)
            return cls(pkg, None, True)
        if text.endswith(":all") or text.endswith(":*"):
            base = text.rsplit(":", 1)[0]
            pkg = (
                current_package if base == "" else Label.parse(base + ":x", current_package).package
            )
            return cls(pkg, None, False)
        label = Label.parse(text, current_package)
        return cls(label.package, label.name, False)

    def matches_package(self, pkg: str) -> bool:
        if self.recursive:
            return self.package == "" or pkg == self.package or pkg.startswith(self.package + "/")
        return pkg == self.package
