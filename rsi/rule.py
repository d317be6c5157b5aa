"""The interface between the engine and rule families.

A rule is a name, an attribute schema and an implementation `impl(ctx) -> Provider`. The
implementation declares actions through `RuleContext` and may read only its validated attributes,
its package's files (as artifacts) and its dependencies' providers — never the clock, the network
or the caller's cwd. Rule families live in `rules/` and register through the `rsi.rules` entry
point.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from rsi.attrs import Attr, Schema
from rsi.digest import Digest, SymlinkNode, TreeError, scan_tree
from rsi.errors import DeclarationError
from rsi.label import Label


@dataclass(frozen=True, slots=True)
class Artifact:
    """A file an action reads: a workspace source, a generated blob, or another action's output."""

    path: str  # exec-root relative, e.g. "tasks/softmax/oracle.py"
    source: str | None = None  # absolute path of a workspace file
    producer: str | None = None  # action id that declares it as an output
    digest: Digest | None = None  # content known at analysis time (written by the rule)
    executable: bool = False
    symlink: str | None = None  # kept as a link inside its tree


@dataclass(frozen=True)
class Provider:
    """What a target gives its dependents: default files and structured info (JSON-able)."""

    files: tuple[Artifact, ...] = ()
    info: Mapping[str, Any] = field(default_factory=dict)
    runfiles: tuple[Artifact, ...] = ()

    @property
    def all_files(self) -> tuple[Artifact, ...]:
        return self.files + self.runfiles


@dataclass(frozen=True)
class ActionSpec:
    """An action before its inputs' digests are known (they may still be built)."""

    id: str
    label: str
    mnemonic: str
    argv: tuple[str, ...]
    inputs: tuple[Artifact, ...]
    outputs: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    platform: tuple[tuple[str, str], ...]
    timeout_s: float
    tags: tuple[str, ...]
    attrs_digest: str = ""  # digest of the target's attributes, for "why"


@dataclass(frozen=True)
class GeneratedTarget:
    """A target a rule's `generate` hook adds to its package (like a Bazel macro's output)."""

    name: str
    rule: str
    attrs: Mapping[str, Any]


@dataclass(frozen=True)
class Rule:
    name: str
    attrs: Mapping[str, Attr]
    impl: Callable[["RuleContext"], Provider]
    doc: str = ""
    # NB: `generate(label, attrs, settings)` may read mutable state the rule owns (a campaign's
    # append-only log) and returns more targets; it runs while the package loads.
    generate: Callable[[Label, dict, Mapping[str, Any]], list[GeneratedTarget]] | None = None

    @property
    def schema(self) -> Schema:
        return Schema(dict(self.attrs))


class RuleContext:
    def __init__(
        self,
        *,
        label: Label,
        rule: Rule,
        attrs: dict,
        workspace_root: Path,
        build_file: str,
        deps: Mapping[Label, Provider],
        store_put: Callable[[bytes], Digest],
        settings: Mapping[str, Any],
        tracker: Any = None,
    ) -> None:
        self.tracker = tracker
        self.label = label
        self.rule = rule
        self.attrs = attrs
        self.workspace_root = workspace_root
        self.package_dir = workspace_root / label.package if label.package else workspace_root
        self.build_file = build_file
        self._deps = deps
        self._store_put = store_put
        self.settings = settings
        self.actions: list[ActionSpec] = []
        self._declared_outputs: dict[str, str] = {}

    # ---------------------------------------------------------------------------- errors
    def error(
        self, message: str, field_name: str | None = None, hint: str | None = None
    ) -> DeclarationError:
        return DeclarationError(
            message, file=self.build_file, target=str(self.label), field=field_name, hint=hint
        )

    # --------------------------------------------------------------------------- inputs
    def exec_path(self, rel: str) -> str:
        return f"{self.label.package}/{rel}" if self.label.package else rel

    def dep(self, label: Label) -> Provider:
        return self._deps[label]

    def source(self, rel: str, field_name: str = "srcs") -> Artifact:
        """A file of this package, by package-relative path."""
        norm = os.path.normpath(rel)
        if rel.startswith("/") or norm.startswith(".."):
            raise self.error(f"{rel!r} is outside the package", field_name)
        full = self.package_dir / norm
        if self.tracker is not None:
            # NB: existence and the executable bit feed the action key via this artifact
            self.tracker.stat(full)
            if full.is_symlink():
                self.tracker.stat(os.path.realpath(full))
        try:
            is_file = full.is_file()
        except OSError as exc:  # NB: e.g. a name too long; is_file only swallows ENOENT & co
            raise self.error(
                f"source file {rel!r} cannot be read: {exc.strerror or exc}", field_name
            ) from None
        if not is_file:
            hint = None
            if full.is_dir():
                hint = "name files, not folders (use a tree attribute for folders)"
            raise self.error(f"source file {rel!r} does not exist ({full})", field_name, hint)
        if full.is_symlink():
            real = os.path.realpath(full)
            if not real.startswith(str(self.workspace_root.resolve()) + os.sep):
                raise self.error(f"{rel!r} is a symlink out of the workspace", field_name)
        return Artifact(
            self.exec_path(norm.replace(os.sep, "/")),
            source=str(full),
            executable=os.access(full, os.X_OK),
        )

    def source_tree(
        self,
        rel: str,
        field_name: str,
        *,
        exclude: Iterable[str] = ("__pycache__",),
        prefix: str | None = None,
    ) -> tuple[Artifact, ...]:
        """Every file under a package folder; the file set itself is part of the digest."""
        full = self.package_dir / rel
        exclude = tuple(exclude)
        if self.tracker is not None:
            self.tracker.stat(full)
            if full.is_dir():
                self.tracker.tree(full, exclude)
        if not full.is_dir():
            raise self.error(f"folder {rel!r} does not exist ({full})", field_name)
        try:
            entries = scan_tree(full, None, exclude=exclude)
        except TreeError as exc:
            raise self.error(exc.message, field_name, exc.hint) from None
        base = prefix if prefix is not None else self.exec_path(rel.rstrip("/"))
        arts = []
        for sub, entry in sorted(entries.items()):
            path = f"{base}/{sub}" if base else sub
            if isinstance(entry, SymlinkNode):
                arts.append(Artifact(path, symlink=entry.target))
            else:
                arts.append(Artifact(path, source=str(full / sub), executable=entry.executable))
        return tuple(arts)

    def write(self, rel: str, content: bytes | str) -> Artifact:
        """A file whose content the rule computes at analysis time (e.g. a spec JSON)."""
        data = content.encode() if isinstance(content, str) else content
        digest = self._store_put(data)
        if self.tracker is not None:
            self.tracker.blob(digest)
        return Artifact(self.exec_path(rel), digest=digest)

    def read_file(self, path: str | os.PathLike) -> bytes:
        """Read a file during analysis; tracked, so the analysis cache sees a change to it."""
        if self.tracker is not None:
            self.tracker.file(path)
        return Path(path).read_bytes()

    # -------------------------------------------------------------------------- actions
    def action(
        self,
        *,
        argv: Iterable[str],
        inputs: Iterable[Artifact],
        outputs: Iterable[str],
        mnemonic: str,
        env: Mapping[str, str] | None = None,
        platform: Mapping[str, str] | None = None,
        timeout_s: float = 600.0,
        tags: Iterable[str] = (),
    ) -> tuple[Artifact, ...]:
        """Declare an action; `outputs` are package-relative; returns them as artifacts."""
        action_id = f"{self.label}#{mnemonic}"
        if any(a.id == action_id for a in self.actions):
            action_id = f"{action_id}.{len(self.actions)}"
        out_paths = []
        for rel in outputs:
            norm = os.path.normpath(rel)
            if rel.startswith("/") or norm.startswith("..") or norm == "." or not rel:
                raise self.error(f"output {rel!r} must name a file inside the package", "outs")
            path = self.exec_path(norm)
            if path in self._declared_outputs:
                raise self.error(f"output {rel!r} is declared twice", "outs")
            self._declared_outputs[path] = action_id
            out_paths.append(path)
        for p in out_paths:
            for q in out_paths:
                if q.startswith(p + "/"):
                    raise self.error(
                        f"output {q!r} lies inside output {p!r}",
                        "outs",
                        hint="outputs are files; a file cannot hold another",
                    )
        input_list = tuple(inputs)
        in_paths = {a.path for a in input_list}
        for p in out_paths:
            if p in in_paths:
                raise self.error(f"output {p!r} has the same path as an input", "outs")
        spec = ActionSpec(
            id=action_id,
            label=str(self.label),
            mnemonic=mnemonic,
            argv=tuple(argv),
            inputs=input_list,
            outputs=tuple(out_paths),
            env=tuple(sorted((env or {}).items())),
            platform=tuple(sorted((platform or {}).items())),
            timeout_s=float(timeout_s),
            tags=tuple(tags),
        )
        self.actions.append(spec)
        return tuple(Artifact(p, producer=action_id) for p in out_paths)


_MAKE_VAR = re.compile(r"\$\$|\$\((\w+)(?:\s+([^)]*))?\)")


def expand_make_vars(
    cmd: str, variables: Mapping[str, list[str]], locate: Callable[[str], list[str]]
) -> str:
    """Expand `$(SRCS)`, `$(OUTS)`, `$(OUT)`, `$(location x)` like a Bazel genrule; `$$` is a
    literal `$` (so `$$(date)` reaches the shell as `$(date)`)."""

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name, arg = m.group(1), m.group(2)
        if name in ("location", "locations"):
            return " ".join(shlex.quote(p) for p in locate((arg or "").strip()))
        if name not in variables:
            raise KeyError(name)
        return " ".join(shlex.quote(p) for p in variables[name])

    return _MAKE_VAR.sub(sub, cmd)
