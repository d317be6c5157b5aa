"""Labels (`//pkg:name`, `:name`) and target patterns (`//pkg/...`, `//pkg:all`).

A package is a folder, relative to the workspace root, that holds a declaration file. Labels are
plain values; resolving a pattern against the packages on disk is the loader's job.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rsi.errors import LabelError

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+=,@~-]*$")
_PKG_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+=,@~-]*$")


def _check_package(pkg: str, text: str) -> None:
    if pkg and not all(_PKG_PART.match(p) for p in pkg.split("/")):
        raise LabelError(
            f"bad package in label {text!r}", hint="packages are folder paths like tasks/softmax"
        )


@dataclass(frozen=True, slots=True, order=True)
class Label:
    package: str
    name: str

    def __str__(self) -> str:
        return f"//{self.package}:{self.name}"

    def __reduce__(self) -> tuple:
        # NB: a plain constructor call: the graph of a large build holds one per target, and
        # a slotted frozen dataclass otherwise unpickles through its generic __setstate__
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


@dataclass(frozen=True, slots=True)
class Pattern:
    """`//pkg:name`, `//pkg:all` (every target of pkg) or `//pkg/...` (pkg and below)."""

    package: str
    name: str | None  # None: all targets
    recursive: bool

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
