"""Loading declarations: `BUILD.toml` files become validated targets. No project code runs. It must
never execute anything from the workspace.

Each top-level table of a `BUILD.toml` is one target; its `rule` key names the rule and every
other key is an attribute checked against that rule's schema. Errors name file, target and field.
"""

from __future__ import annotations

import ast
import difflib
import os
import re
import tomllib
from pathlib import Path
from typing import Iterable, Mapping

from rsi.attrs import Where
from rsi.errors import DeclarationError, LabelError
from rsi.fsutil import read_regular
from rsi.label import Label, Pattern
from rsi.record import Frozen
from rsi.rule import Rule
from rsi.workspace import BUILD_FILE, SKIP_DIRS, packages_under  # noqa: F401


class Target(Frozen):
    _fields = ("label", "rule", "attrs", "file")
    label: Label
    rule: Rule
    attrs: dict
    file: str

    def __init__(self, label: Label, rule: Rule, attrs: dict, file: str) -> None:
        d = self.__dict__
        d["label"] = label
        d["rule"] = rule
        d["attrs"] = attrs
        d["file"] = file

    def deps(self) -> list[Label]:
        found: list[Label] = []
        for name, a in self.rule.attrs.items():
            if a.kind == "label" and self.attrs.get(name) is not None:
                found.append(self.attrs[name])
            elif a.kind == "label_list":
                found.extend(self.attrs.get(name) or ())
        return found


_DUPLICATE = re.compile(r"Cannot declare (\(.*\)) twice \(at line (\d+)")


def _toml_error(exc: tomllib.TOMLDecodeError, package: str, file: str) -> DeclarationError:
    """TOML's "Cannot declare ('a',) twice" said as what it means here: a duplicate target."""
    m = _DUPLICATE.match(str(exc))
    try:
        key = ast.literal_eval(m.group(1)) if m else None
    except (ValueError, SyntaxError):
        key = None
    if not isinstance(key, tuple) or not key or not all(isinstance(k, str) for k in key):
        return DeclarationError(f"not valid TOML: {exc}", file=file)
    name, line = key[0], m.group(2)
    if len(key) == 1:
        return DeclarationError(
            f"target '{name}' is declared twice (again at line {line})",
            file=file,
            target=f"//{package}:{name}",
            hint="target names are unique in a package: rename or merge one of the tables",
        )
    return DeclarationError(
        f"table [{'.'.join(key)}] is declared twice (again at line {line})",
        file=file,
        target=f"//{package}:{name}",
        field=key[1],
    )


class Loader:
    def __init__(
        self, root: Path, rules: Mapping[str, Rule], settings: Mapping[str, object] | None = None
    ) -> None:
        self.root = root
        self.rules = dict(rules)
        self.settings = dict(settings or {})
        self.tracker = None
        self._packages: dict[str, dict[str, Target]] = {}

    def build_file(self, package: str) -> Path:
        return (self.root / package / BUILD_FILE) if package else self.root / BUILD_FILE

    def package(self, package: str) -> dict[str, Target]:
        cached = self._packages.get(package)
        if cached is not None:
            return cached
        path = self.build_file(package)
        if self.tracker is not None:
            self.tracker.file(path)
        rel = os.path.relpath(path, Path.cwd()) if path.is_absolute() else str(path)
        real, real_root = os.path.realpath(path), os.path.realpath(self.root)
        if not real.startswith(real_root.rstrip(os.sep) + os.sep):
            # NB: a package folder that is a symlink out of the workspace would make its
            # sources (and its declarations) the host's
            raise DeclarationError(
                f"package //{package} resolves to {os.path.dirname(real)}, outside the "
                f"workspace {real_root}",
                file=rel,
                hint="a package is a folder of the workspace; copy it in instead of linking it",
            )
        try:
            text = read_regular(path).decode("utf-8")
        except FileNotFoundError:
            raise LabelError(f"no package //{package}: {path} does not exist") from None
        except UnicodeDecodeError as exc:
            line = exc.object[: exc.start].count(b"\n") + 1
            raise DeclarationError(
                f"not UTF-8 text (byte {exc.object[exc.start]:#04x} on line {line})",
                file=rel,
                hint="TOML files are UTF-8; re-save it as UTF-8",
            ) from None
        except OSError as exc:
            raise DeclarationError(f"cannot read: {exc.strerror or exc}", file=rel) from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise _toml_error(exc, package, rel) from None
        except RecursionError:  # NB: tomllib recurses per nested array/inline table
            raise DeclarationError(
                "not valid TOML: values are nested too deeply", file=rel
            ) from None
        targets: dict[str, Target] = {}
        for name, raw in data.items():
            label_text = f"//{package}:{name}"
            if not isinstance(raw, dict):
                raise DeclarationError(
                    f"top-level key {name!r} is not a target table",
                    file=rel,
                    hint=f'declare targets as [{name}] tables with a rule = "..." key',
                )
            try:
                label = Label.parse(label_text)
            except LabelError:
                raise DeclarationError(
                    f"{name!r} is not a valid target name", file=rel, target=name
                ) from None
            targets[name] = self._target(label, dict(raw), rel)
        for target in list(targets.values()):
            if target.rule.generate is None:
                continue
            for gen in target.rule.generate(target.label, target.attrs, self.settings):
                where = f"{rel} (generated by {target.label})"
                if gen.name in targets:
                    raise DeclarationError(
                        f"generated target {gen.name!r} clashes with a declared one",
                        file=rel,
                        target=str(target.label),
                    )
                label = Label(package, gen.name)
                targets[gen.name] = self._target(label, {"rule": gen.rule, **gen.attrs}, where)
        self._packages[package] = targets
        return targets

    def _target(self, label: Label, raw: dict, file: str) -> Target:
        where = Where(file=file, target=str(label), package=label.package)
        rule_name = raw.pop("rule", None)
        if rule_name is None:
            raise DeclarationError(
                "missing 'rule'",
                file=file,
                target=str(label),
                field="rule",
                hint=f"known rules: {', '.join(sorted(self.rules))}",
            )
        if not isinstance(rule_name, str) or rule_name not in self.rules:
            close = difflib.get_close_matches(str(rule_name), list(self.rules), n=1)
            raise DeclarationError(
                f"unknown rule {rule_name!r}",
                file=file,
                target=str(label),
                field="rule",
                hint=f"did you mean '{close[0]}'?"
                if close
                else f"known rules: {', '.join(sorted(self.rules))}",
            )
        rule = self.rules[rule_name]
        attrs = rule.schema.validate(raw, where)
        return Target(label, rule, attrs, file)

    def target(
        self, label: Label, *, wanted_by: Target | None = None, field: str | None = None
    ) -> Target:
        try:
            targets = self.package(label.package)
        except LabelError as exc:
            if wanted_by is None:
                raise
            raise DeclarationError(
                f"dependency {label} cannot be found: {exc.message}",
                file=wanted_by.file,
                target=str(wanted_by.label),
                field=field,
                hint=self._package_hint(label.package),
            ) from None
        found = targets.get(label.name)
        if found is None:
            close = difflib.get_close_matches(label.name, list(targets), n=3)
            hint = (
                ("did you mean " + ", ".join(f"//{label.package}:{c}" for c in close) + "?")
                if close
                else None
            )
            if wanted_by is None:
                raise LabelError(
                    f"no target {label} in {self.build_file(label.package)}", hint=hint
                )
            raise DeclarationError(
                f"dependency {label} does not exist",
                file=wanted_by.file,
                target=str(wanted_by.label),
                field=field,
                hint=hint,
            )
        return found

    def _package_hint(self, package: str) -> str | None:
        parent = package.rsplit("/", 1)[0] if "/" in package else ""
        names = [p for p in self.packages_under(parent)]
        close = difflib.get_close_matches(package, names, n=3)
        return ("did you mean " + ", ".join(f"//{c}" for c in close) + "?") if close else None

    def packages_under(self, package: str) -> Iterable[str]:
        return packages_under(self.root, package)

    def expand(self, patterns: Iterable[str], current_package: str = "") -> list[Label]:
        labels: list[Label] = []
        seen: set[Label] = set()
        for text in patterns:
            pattern = Pattern.parse(text, current_package)
            if pattern.name is not None:
                found = [self.target(Label(pattern.package, pattern.name)).label]
            elif pattern.recursive:
                pkgs = list(self.packages_under(pattern.package))
                if self.tracker is not None:
                    self.tracker.walk(pattern.package, pkgs)
                found = [t.label for pkg in pkgs for t in self.package(pkg).values()]
                if not found:
                    raise LabelError(f"pattern {text!r} matches no targets")
            else:
                found = [t.label for t in self.package(pattern.package).values()]
            for label in found:
                if label not in seen:
                    seen.add(label)
                    labels.append(label)
        return labels
