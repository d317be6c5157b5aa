"""Actions and their results: the immutable values the scheduler, executors and stores share.

An `Action` is everything that can change a result; its key is the digest of its canonical
description. Fields that only describe (label, mnemonic, tags) are marked `key=False` and never
reach the key, so renaming a target or tagging it `exclusive` reuses its evidence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from rsi.digest import (
    DEFAULT_FUNCTION,
    Digest,
    FileNode,
    SymlinkNode,
    digest_value,
    merkle_directories,
)
from rsi.errors import RsiError

ACTION_SCHEMA = "rsi.action/1"
RESULT_SCHEMA = "rsi.action_result/1"


def _not_key(default: Any = None, **kw: Any) -> Any:
    return field(default=default, compare=False, metadata={"key": False}, **kw)


@dataclass(frozen=True)
class Action:
    argv: tuple[str, ...]
    inputs: tuple[tuple[str, FileNode], ...] = ()
    outputs: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    platform: tuple[tuple[str, str], ...] = ()
    timeout_s: float = 600.0
    salt: str = ""
    digest_function: str = DEFAULT_FUNCTION
    # descriptive only: excluded from equality and from the key
    label: str = _not_key("")
    mnemonic: str = _not_key("Action")
    tags: tuple[str, ...] = _not_key(())
    # where a source input can be copied from on this host (path -> workspace file); its
    # content is verified against the input's digest when it is materialised
    sources: tuple[tuple[str, str], ...] = _not_key(())

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "argv", tuple(self.argv))
        set_(self, "inputs", tuple(sorted(dict(self.inputs).items())))
        set_(self, "outputs", tuple(sorted(set(self.outputs))))
        set_(self, "env", tuple(sorted(dict(self.env).items())))
        set_(self, "platform", tuple(sorted(dict(self.platform).items())))
        set_(self, "tags", tuple(sorted(set(self.tags))))
        if not self.argv:
            raise RsiError(f"{self.label or 'action'}: empty argv")
        input_paths = {p for p, _ in self.inputs}
        links = {p for p, n in self.inputs if isinstance(n, SymlinkNode)}
        for kind, path in [
            *(("input", p) for p in input_paths),
            *(("output", o) for o in self.outputs),
        ]:
            parts = path.split("/")
            if path.startswith("/") or any(q in ("", ".", "..") for q in parts):
                raise RsiError(f"{self.label}: {kind} path {path!r} is not normalised and relative")
            # NB: a file under a symlink input would be written (or an output read) through the
            # link, outside the scratch folder; an action from a remote client is not trusted
            for i in range(1, len(parts)):
                if "/".join(parts[:i]) in links:
                    raise RsiError(f"{self.label}: {kind} {path!r} lies under a symlink input")
        for out in self.outputs:
            if out in input_paths or any(out.startswith(p + "/") for p in input_paths):
                raise RsiError(f"{self.label}: output {out!r} collides with an input path")
        if self.timeout_s <= 0:
            raise RsiError(f"{self.label}: timeout must be positive")

    @property
    def input_map(self) -> dict[str, FileNode]:
        return dict(self.inputs)

    def input_root(self) -> tuple[Digest, dict[Digest, bytes]]:
        return merkle_directories(dict(self.inputs), self.digest_function)

    def describe(self) -> dict:
        """The canonical description: every field that feeds the key, inputs listed by path."""
        return {
            "schema": ACTION_SCHEMA,
            "argv": list(self.argv),
            "env": dict(self.env),
            "inputs": {p: n.encode() for p, n in self.inputs},
            "outputs": list(self.outputs),
            "platform": dict(self.platform),
            "timeout_s": self.timeout_s,
            "salt": self.salt,
            "digest_function": self.digest_function,
        }

    def key(self) -> Digest:
        cached = self.__dict__.get("_key")
        if cached is None:
            cached = digest_value(self.describe(), self.digest_function)
            object.__setattr__(self, "_key", cached)
        return cached

    @property
    def exclusive(self) -> bool:
        return "exclusive" in self.tags


# NB: an action whose env sets this to an exit code N says: "exiting N means my outputs are
# good for this build, but were made under a transient condition (a busy host) and must not be
# cached": the build goes on with them, nothing is written to the action cache, and the next
# build runs the action again. Opt-in per action (part of its key), so a command's ordinary
# exit codes keep their meaning.
UNCACHED_EXIT_ENV = "RSI_UNCACHED_EXIT"


@dataclass(frozen=True)
class OutputFile:
    path: str
    digest: Digest
    executable: bool = False


@dataclass(frozen=True)
class ActionResult:
    """What an execution produced. Timing, executor and host describe; they are evidence too."""

    exit_code: int
    outputs: tuple[OutputFile, ...] = ()
    stdout: Digest | None = None
    stderr: Digest | None = None
    timed_out: bool = False
    failure: str | None = None
    executor: str = ""
    host: Mapping[str, Any] = field(default_factory=dict)
    timing: Mapping[str, Any] = field(default_factory=dict)
    # NB: False for a run whose outputs serve this build but must never be served again (the
    # action said so: `UNCACHED_EXIT_ENV`); such a result is never written to a cache
    cacheable: bool = True

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and self.failure is None

    @property
    def output_map(self) -> dict[str, OutputFile]:
        return {o.path: o for o in self.outputs}

    def blobs(self) -> list[Digest]:
        found = [o.digest for o in self.outputs]
        found += [d for d in (self.stdout, self.stderr) if d is not None]
        return found

    def to_json(self) -> dict:
        return {
            "schema": RESULT_SCHEMA,
            "exit_code": self.exit_code,
            "outputs": [[o.path, str(o.digest), o.executable] for o in self.outputs],
            "stdout": str(self.stdout) if self.stdout else None,
            "stderr": str(self.stderr) if self.stderr else None,
            "timed_out": self.timed_out,
            "failure": self.failure,
            "executor": self.executor,
            "host": dict(self.host),
            "timing": dict(self.timing),
        }

    @classmethod
    def from_json(cls, doc: dict) -> "ActionResult":
        if doc.get("schema") != RESULT_SCHEMA:
            raise ValueError(f"unknown action result schema {doc.get('schema')!r}")
        return cls(
            exit_code=int(doc["exit_code"]),
            outputs=tuple(OutputFile(p, Digest.parse(d), bool(x)) for p, d, x in doc["outputs"]),
            stdout=Digest.parse(doc["stdout"]) if doc.get("stdout") else None,
            stderr=Digest.parse(doc["stderr"]) if doc.get("stderr") else None,
            timed_out=bool(doc.get("timed_out")),
            failure=doc.get("failure"),
            executor=doc.get("executor", ""),
            host=doc.get("host") or {},
            timing=doc.get("timing") or {},
        )
