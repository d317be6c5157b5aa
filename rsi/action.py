"""Actions and their results: the immutable values the scheduler, executors and stores share.

An `Action` is everything that can change a result; its key is the digest of its canonical
description. Fields that only describe (label, mnemonic, tags, sources) are left out of its
equality (`_compare`) and never reach the key, so renaming a target or tagging it `exclusive`
reuses its evidence.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from rsi.digest import (
    DEFAULT_FUNCTION,
    Digest,
    FileNode,
    SymlinkNode,
    digest_value,
    merkle_directories,
)
from rsi.errors import RsiError
from rsi.record import Frozen

ACTION_SCHEMA = "rsi.action/1"
RESULT_SCHEMA = "rsi.action_result/1"


class Action(Frozen):
    _fields = (
        "argv",
        "inputs",
        "outputs",
        "env",
        "platform",
        "timeout_s",
        "salt",
        "digest_function",
        "label",
        "mnemonic",
        "tags",
        "sources",
    )
    # NB: label, mnemonic, tags and sources only describe: not in equality, nor in the key
    _compare = _fields[:8]
    argv: tuple[str, ...]
    inputs: tuple[tuple[str, FileNode], ...]
    outputs: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    platform: tuple[tuple[str, str], ...]
    timeout_s: float
    salt: str
    digest_function: str
    label: str
    mnemonic: str
    tags: tuple[str, ...]
    # where a source input can be copied from on this host (path -> workspace file); its
    # content is verified against the input's digest when it is materialised
    sources: tuple[tuple[str, str], ...]

    def __init__(
        self,
        argv: Iterable[str],
        inputs: Iterable[tuple[str, FileNode]] | Mapping[str, FileNode] = (),
        outputs: Iterable[str] = (),
        env: Iterable[tuple[str, str]] | Mapping[str, str] = (),
        platform: Iterable[tuple[str, str]] | Mapping[str, str] = (),
        timeout_s: float = 600.0,
        salt: str = "",
        digest_function: str = DEFAULT_FUNCTION,
        label: str = "",
        mnemonic: str = "Action",
        tags: Iterable[str] = (),
        sources: tuple[tuple[str, str], ...] = (),
    ) -> None:
        d = self.__dict__
        d["argv"] = tuple(argv)
        d["inputs"] = tuple(sorted(dict(inputs).items()))
        d["outputs"] = tuple(sorted(set(outputs)))
        d["env"] = tuple(sorted(dict(env).items()))
        d["platform"] = tuple(sorted(dict(platform).items()))
        d["timeout_s"] = timeout_s
        d["salt"] = salt
        d["digest_function"] = digest_function
        d["label"] = label
        d["mnemonic"] = mnemonic
        d["tags"] = tuple(sorted(set(tags)))
        d["sources"] = sources
        self._check()

    def _check(self) -> None:
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


class OutputFile(Frozen):
    _fields = ("path", "digest", "executable")
    path: str
    digest: Digest
    executable: bool

    def __init__(self, path: str, digest: Digest, executable: bool = False) -> None:
        d = self.__dict__
        d["path"] = path
        d["digest"] = digest
        d["executable"] = executable


class ActionResult(Frozen):
    """What an execution produced. Timing, executor and host describe; they are evidence too."""

    _fields = (
        "exit_code",
        "outputs",
        "stdout",
        "stderr",
        "timed_out",
        "failure",
        "executor",
        "host",
        "timing",
        "cacheable",
    )
    exit_code: int
    outputs: tuple[OutputFile, ...]
    stdout: Digest | None
    stderr: Digest | None
    timed_out: bool
    failure: str | None
    executor: str
    host: Mapping[str, Any]
    timing: Mapping[str, Any]
    # NB: False for a run whose outputs serve this build but must never be served again (the
    # action said so: `UNCACHED_EXIT_ENV`); such a result is never written to a cache
    cacheable: bool

    def __init__(
        self,
        exit_code: int,
        outputs: tuple[OutputFile, ...] = (),
        stdout: Digest | None = None,
        stderr: Digest | None = None,
        timed_out: bool = False,
        failure: str | None = None,
        executor: str = "",
        host: Mapping[str, Any] | None = None,
        timing: Mapping[str, Any] | None = None,
        cacheable: bool = True,
    ) -> None:
        d = self.__dict__
        d["exit_code"] = exit_code
        d["outputs"] = outputs
        d["stdout"] = stdout
        d["stderr"] = stderr
        d["timed_out"] = timed_out
        d["failure"] = failure
        d["executor"] = executor
        d["host"] = {} if host is None else host
        d["timing"] = {} if timing is None else timing
        d["cacheable"] = cacheable

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
