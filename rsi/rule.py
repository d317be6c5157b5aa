"""The interface between the engine and rule families.

A rule is a name, an attribute schema and an implementation `impl(ctx) -> Provider`. The
implementation declares actions through `RuleContext` and may read only its validated attributes,
its package's files (as artifacts) and its dependencies' providers — never the clock, the network
or the caller's cwd. Rule families live in `rules/` and register through the `rsi.rules` entry
point.
"""

from __future__ import annotations

import math
import os
import posixpath
import re
import shlex
import stat
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from rsi.attrs import Attr, Schema
from rsi.digest import Digest, SymlinkNode, TreeError, scan_tree
from rsi.errors import DeclarationError
from rsi.fsutil import file_kind, read_regular
from rsi.label import Label
from rsi.record import Frozen

_set = object.__setattr__


# NB: past a month an action's limit is a mistake, and past ~9e9 s the timers that enforce it
# overflow; a rule-computed limit (a multiple of a declared one) is checked against this too
MAX_TIMEOUT_S = 30 * 24 * 3600.0
_NAME_MAX = 255  # bytes in one path component (Linux NAME_MAX)


class Artifact(Frozen):
    """A file an action reads: a workspace source, a generated blob, or another action's output."""

    __slots__ = ("path", "source", "producer", "digest", "executable", "symlink")
    _fields = __slots__
    path: str  # exec-root relative, e.g. "tasks/softmax/oracle.py"
    source: str | None  # absolute path of a workspace file
    producer: str | None  # action id that declares it as an output
    digest: Digest | None  # content known at analysis time (written by the rule)
    executable: bool
    symlink: str | None  # kept as a link inside its tree

    def __init__(
        self,
        path: str,
        source: str | None = None,
        producer: str | None = None,
        digest: Digest | None = None,
        executable: bool = False,
        symlink: str | None = None,
    ) -> None:
        _set(self, "path", path)
        _set(self, "source", source)
        _set(self, "producer", producer)
        _set(self, "digest", digest)
        _set(self, "executable", executable)
        _set(self, "symlink", symlink)

    def __reduce__(self) -> tuple:
        return (
            Artifact,
            (self.path, self.source, self.producer, self.digest, self.executable, self.symlink),
        )


class Provider(Frozen):
    """What a target gives its dependents: default files and structured info (JSON-able)."""

    _fields = ("files", "info", "runfiles")
    files: tuple[Artifact, ...]
    info: Mapping[str, Any]
    runfiles: tuple[Artifact, ...]

    def __init__(
        self,
        files: tuple[Artifact, ...] = (),
        info: Mapping[str, Any] | None = None,
        runfiles: tuple[Artifact, ...] = (),
    ) -> None:
        d = self.__dict__
        d["files"] = files
        d["info"] = {} if info is None else info
        d["runfiles"] = runfiles

    @property
    def all_files(self) -> tuple[Artifact, ...]:
        return self.files + self.runfiles


class ActionSpec(Frozen):
    """An action before its inputs' digests are known (they may still be built)."""

    _fields = (
        "id",
        "label",
        "mnemonic",
        "argv",
        "inputs",
        "outputs",
        "env",
        "platform",
        "timeout_s",
        "tags",
        "attrs_digest",
    )
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
    attrs_digest: str  # digest of the target's attributes, for "why"

    def __init__(
        self,
        id: str,  # noqa: A002 - NB: the action's id
        label: str,
        mnemonic: str,
        argv: tuple[str, ...],
        inputs: tuple[Artifact, ...],
        outputs: tuple[str, ...],
        env: tuple[tuple[str, str], ...],
        platform: tuple[tuple[str, str], ...],
        timeout_s: float,
        tags: tuple[str, ...],
        attrs_digest: str = "",
    ) -> None:
        d = self.__dict__
        d["id"] = id
        d["label"] = label
        d["mnemonic"] = mnemonic
        d["argv"] = argv
        d["inputs"] = inputs
        d["outputs"] = outputs
        d["env"] = env
        d["platform"] = platform
        d["timeout_s"] = timeout_s
        d["tags"] = tags
        d["attrs_digest"] = attrs_digest


class GeneratedTarget(Frozen):
    """A target a rule's `generate` hook adds to its package (like a Bazel macro's output)."""

    _fields = ("name", "rule", "attrs")
    name: str
    rule: str
    attrs: Mapping[str, Any]

    def __init__(self, name: str, rule: str, attrs: Mapping[str, Any]) -> None:
        d = self.__dict__
        d["name"] = name
        d["rule"] = rule
        d["attrs"] = attrs


class Rule(Frozen):
    _fields = ("name", "attrs", "impl", "doc", "generate")
    name: str
    attrs: Mapping[str, Attr]
    impl: Callable[["RuleContext"], Provider]
    doc: str
    # NB: `generate(label, attrs, settings)` may read mutable state the rule owns (a campaign's
    # append-only log) and returns more targets; it runs while the package loads.
    generate: Callable[[Label, dict, Mapping[str, Any]], list[GeneratedTarget]] | None

    def __init__(
        self,
        name: str,
        attrs: Mapping[str, Attr],
        impl: Callable[["RuleContext"], Provider],
        doc: str = "",
        generate: Callable[[Label, dict, Mapping[str, Any]], list[GeneratedTarget]] | None = None,
    ) -> None:
        d = self.__dict__
        d["name"] = name
        d["attrs"] = attrs
        d["impl"] = impl
        d["doc"] = doc
        d["generate"] = generate

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
        self._source_fields: dict[str, str] = {}  # exec path -> the attribute that named it
        self._subpackages: dict[str, bool] = {}  # folder of the package -> has a BUILD.toml
        self._workspace_real: str | None = None

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

    def _package_path(self, rel: str, field_name: str, what: str) -> str:
        """`rel` checked as a path inside this package; returned normalised ('a/./b' is 'a/b').
        Absolute paths and '..' are refused: a declaration names its own package's files."""
        if not isinstance(rel, str) or not rel or "\x00" in rel:
            raise self.error(f"{what} {rel!r} is not a path", field_name)
        parts = rel.split("/")
        if rel.startswith("/"):
            raise self.error(
                f"{what} {rel!r} is an absolute path, outside the package",
                field_name,
                hint="name it relative to the package folder",
            )
        if ".." in parts:
            norm = posixpath.normpath(rel)
            where = "outside the package" if norm.split("/")[0] == ".." else "a path with '..'"
            raise self.error(
                f"{what} {rel!r} is {where}",
                field_name,
                hint="name it relative to the package folder, without '..'",
            )
        for part in parts:
            if len(part.encode("utf-8", "surrogateescape")) > _NAME_MAX:
                raise self.error(
                    f"{what} {rel!r}: the name {part[:40]!r}... is too long", field_name
                )
        return posixpath.normpath(rel)

    def _real_root(self) -> str:
        if self._workspace_real is None:
            self._workspace_real = os.path.realpath(self.workspace_root)
        return self._workspace_real

    def _check_inside_workspace(self, full: Path, rel: str, field_name: str, what: str) -> None:
        """Refuse a path whose real location (every symlink on the way resolved: the file's,
        a folder's) leaves the workspace: a build reads the workspace, never the host."""
        real = os.path.realpath(full)
        root = self._real_root()
        if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
            raise self.error(
                f"{what} {rel!r} resolves to {real}, outside the workspace {root}",
                field_name,
                hint="a symlink may point only inside the workspace; copy the file in instead",
            )

    def source(self, rel: str, field_name: str = "srcs") -> Artifact:
        """A file of this package, by package-relative path."""
        norm = self._package_path(rel, field_name, "source file")
        full = self.package_dir / norm
        self._check_inside_workspace(full, rel, field_name, "source file")
        if self.tracker is not None:
            # NB: existence, the executable bit and the real path (analysis_cache._stat_sig)
            # feed the action key or this check via this artifact
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
            try:
                mode = full.stat().st_mode
            except OSError:
                raise self.error(
                    f"source file {rel!r} does not exist ({full})", field_name
                ) from None
            hint = None
            if stat.S_ISDIR(mode):
                hint = "name files, not folders (use a tree attribute for folders)"
            raise self.error(
                f"source file {rel!r} is not a regular file: it is {file_kind(mode)} ({full})",
                field_name,
                hint,
            )
        path = self.exec_path(norm)
        self._source_fields.setdefault(path, field_name)
        return Artifact(path, source=str(full), executable=os.access(full, os.X_OK))

    def source_tree(
        self,
        rel: str,
        field_name: str,
        *,
        exclude: Iterable[str] = ("__pycache__",),
        prefix: str | None = None,
    ) -> tuple[Artifact, ...]:
        """Every file under a package folder; the file set itself is part of the digest."""
        norm = self._package_path(rel, field_name, "folder")
        if norm != rel.rstrip("/"):
            raise self.error(
                f"folder {rel!r} is not written plainly", field_name, f"write {norm!r}"
            )
        full = self.package_dir / norm
        self._check_inside_workspace(full, rel, field_name, "folder")
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
        if prefix is not None:
            base = prefix
        else:
            base = self.exec_path(norm) if norm != "." else self.label.package
        arts = []
        for sub, entry in sorted(entries.items()):
            path = f"{base}/{sub}" if base else sub
            if isinstance(entry, SymlinkNode):
                # NB: kept as a link, it is read where the tree is materialised: its text,
                # not only its target on this host, must stay inside the tree
                lands = posixpath.normpath(posixpath.join(posixpath.dirname(sub), entry.target))
                if lands == ".." or lands.startswith("../") or posixpath.isabs(entry.target):
                    raise self.error(
                        f"{norm}/{sub} is a symlink to {entry.target!r}, which leaves {norm!r}",
                        field_name,
                        hint="a link in a folder may point only inside that folder",
                    )
                arts.append(Artifact(path, symlink=entry.target))
            else:
                arts.append(Artifact(path, source=str(full / sub), executable=entry.executable))
                self._source_fields.setdefault(path, field_name)
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
        return read_regular(path)

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
        fields: Mapping[str, str] | None = None,
    ) -> tuple[Artifact, ...]:
        """Declare an action; `outputs` are package-relative; returns them as artifacts.

        Everything that cannot run is refused here, at analysis, as a declaration error: a NUL
        in argv, env or platform, an environment name that is empty or holds '=', a timeout
        that is not a positive finite number up to MAX_TIMEOUT_S, two different files at one
        input path, a file where another path needs a folder. `fields` names the attribute
        behind argv, env, timeout_s and outputs, for those errors."""
        fields = dict(fields or {})
        action_id = f"{self.label}#{mnemonic}"
        if any(a.id == action_id for a in self.actions):
            action_id = f"{action_id}.{len(self.actions)}"
        argv = tuple(argv)
        self._check_argv(argv, mnemonic, fields.get("argv"))
        env_items = self._check_mapping(env, mnemonic, "environment", fields.get("env"))
        platform_items = self._check_mapping(platform, mnemonic, "platform", None)
        timeout = self._check_timeout(timeout_s, mnemonic, fields.get("timeout_s"))
        out_field = fields.get("outputs", "outs")
        out_paths = []
        for rel in outputs:
            inside = isinstance(rel, str) and not rel.startswith("/") and ".." not in rel.split("/")
            norm = self._package_path(rel, out_field, "output") if inside else ""
            if norm in ("", "."):
                raise self.error(f"output {rel!r} must name a file inside the package", out_field)
            if rel.endswith("/"):
                raise self.error(
                    f"output {rel!r} ends with '/'",
                    out_field,
                    hint="an output is a file: name it without the trailing '/'",
                )
            self._check_no_subpackage(rel, norm, out_field)
            path = self.exec_path(norm)
            if path in self._declared_outputs:
                raise self.error(f"output {rel!r} is declared twice", out_field)
            self._declared_outputs[path] = action_id
            out_paths.append(path)
        for p in out_paths:
            for q in out_paths:
                if q.startswith(p + "/"):
                    raise self.error(
                        f"output {q!r} lies inside output {p!r}",
                        out_field,
                        hint="outputs are files; a file cannot hold another",
                    )
        input_list = tuple(inputs)
        by_path = self._check_inputs(input_list)
        for p in out_paths:
            if p in by_path:
                raise self.error(f"output {p!r} has the same path as an input", out_field)
        files = set(by_path) | set(out_paths)
        for p in sorted(files):
            parent = p.rpartition("/")[0]
            while parent:
                if parent in files:
                    what = (
                        "an output of this action"
                        if parent in out_paths
                        else self._describe(by_path[parent])
                    )
                    raise self.error(
                        f"{p!r} lies under {parent!r}, which is {what}",
                        self._source_fields.get(parent, out_field),
                        hint="a path is a file or a folder, not both",
                    )
                parent = parent.rpartition("/")[0]
        spec = ActionSpec(
            id=action_id,
            label=str(self.label),
            mnemonic=mnemonic,
            argv=argv,
            inputs=input_list,
            outputs=tuple(out_paths),
            env=env_items,
            platform=platform_items,
            timeout_s=timeout,
            tags=tuple(tags),
        )
        self.actions.append(spec)
        return tuple(Artifact(p, producer=action_id) for p in out_paths)

    def _check_no_subpackage(self, rel: str, norm: str, field_name: str) -> None:
        """An output in a folder of the package that has a BUILD.toml of its own would be that
        package's path too (`out/sub/x` from `//:` and from `//sub:`): refused, as Bazel
        refuses an output crossing a package boundary. Each folder asked is a read of the
        analysis (a BUILD.toml made there later invalidates it)."""
        parts = norm.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            folder = "/".join(parts[:i])
            found = self._subpackages.get(folder)
            if found is None:
                # NB: a declaration file's name, as this package's own
                build = self.package_dir / folder / os.path.basename(self.build_file)
                if self.tracker is not None:
                    self.tracker.file(build)
                found = self._subpackages[folder] = build.is_file()
            if found:
                sub = self.exec_path(folder)
                raise self.error(
                    f"output {rel!r} lies in package //{sub}, which has a BUILD.toml of its own",
                    field_name,
                    hint=f"declare it in //{sub}, or rename the folder",
                )

    def _check_argv(self, argv: tuple, mnemonic: str, field_name: str | None) -> None:
        if not argv:
            raise self.error(f"action {mnemonic} has an empty command line", field_name)
        for arg in argv:
            if not isinstance(arg, str):
                raise self.error(
                    f"action {mnemonic}: argument {arg!r:.60} is not a string", field_name
                )
            if "\x00" in arg:
                raise self.error(
                    f"action {mnemonic}: argument {arg!r:.60} contains a NUL character",
                    field_name,
                )

    def _check_mapping(
        self, mapping: Mapping[str, str] | None, mnemonic: str, what: str, field_name: str | None
    ) -> tuple[tuple[str, str], ...]:
        items = dict(mapping or {}).items()
        for name, value in items:
            if not isinstance(name, str) or not name or "=" in name or "\x00" in name:
                raise self.error(
                    f"action {mnemonic}: {name!r:.60} is not a valid {what} name",
                    field_name,
                    hint="a name is a non-empty string without '=' or NUL",
                )
            if not isinstance(value, str) or "\x00" in value:
                raise self.error(
                    f"action {mnemonic}: {what} value of {name} ({value!r:.60}) is not a string "
                    "without NUL",
                    field_name,
                )
        return tuple(sorted(items))

    def _check_timeout(self, timeout_s: Any, mnemonic: str, field_name: str | None) -> float:
        try:
            timeout = float(timeout_s)
        except (TypeError, ValueError, OverflowError):
            timeout = math.nan
        if not (0 < timeout <= MAX_TIMEOUT_S):  # NB: false for nan too
            if field_name is None:
                # NB: only to name the field: the float attribute of this target holding it
                held = [
                    name
                    for name, a in self.rule.attrs.items()
                    if a.kind == "float" and self.attrs.get(name) == timeout_s
                ]
                named = [n for n in held if "timeout" in n] or held
                field_name = named[0] if len(named) == 1 else None
            raise self.error(
                f"action {mnemonic}: timeout {timeout_s!r} is not a number of seconds above 0 "
                f"and at most {MAX_TIMEOUT_S:.0f}",
                field_name,
            )
        return timeout

    def _check_inputs(self, inputs: tuple[Artifact, ...]) -> dict[str, Artifact]:
        """Inputs by path. The same artifact twice is one input; two different files at one
        path (a source and a dependency's output, say) are refused, naming both."""
        by_path: dict[str, Artifact] = {}
        for art in inputs:
            if not isinstance(art, Artifact):
                raise self.error(f"input {art!r:.60} is not an Artifact")
            other = by_path.setdefault(art.path, art)
            if other is art or other == art or (other.producer and art.producer):
                continue  # NB: two producers at one path are one shared action (analysis.py)
            raise self.error(
                f"input path {art.path!r} is both {self._describe(other)} and "
                f"{self._describe(art)}",
                self._source_fields.get(art.path),
                hint="every input path holds one file: rename the source or the output",
            )
        return by_path

    def _describe(self, art: Artifact) -> str:
        if art.producer:
            return f"an output of {art.producer.split('#', 1)[0]}"
        if art.symlink is not None:
            return f"a symlink to {art.symlink!r}"
        if art.digest is not None:
            return "a file the rule writes"
        source = art.source or ""
        try:
            shown = os.path.relpath(source, self.workspace_root)
        except ValueError:
            shown = source
        if shown.startswith(".."):
            shown = source
        return f"the source file {shown}"


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
