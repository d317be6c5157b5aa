"""rsi actions and results <-> REAPI v2 messages (Command, Action, Directory tree, ActionResult). It
must never lose a field a key depends on.

The mapping is total and deterministic: every field that feeds an rsi action key lands in the
REAPI Action or Command, so equal REAPI action digests mean equal rsi actions, and a worker can
rebuild the exact rsi `Action` from what it is sent. No I/O happens here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import any_pb2, duration_pb2, timestamp_pb2, wrappers_pb2

from rsi.action import Action, ActionResult, OutputFile
from rsi.digest import Digest, FileNode, SymlinkNode, digest_bytes
from rsi.errors import RemoteError
from rsi.remote._proto.build.bazel.remote.execution.v2 import remote_execution_pb2 as re_pb2
from rsi.remote.client import from_proto_digest, to_proto_digest

# Platform keys rsi sends (docs/remote.md). `container-image` is derived from a container
# toolchain for servers and workers that follow the REAPI convention.
CONTAINER_IMAGE = "container-image"
TOOLCHAIN = "toolchain"
ACCELERATOR = "accelerator"
RESULT_META_SCHEMA = "rsi.remote_result_meta/1"


def _serialize(message: Any) -> bytes:
    return message.SerializeToString(deterministic=True)


def container_image_of(toolchain: str) -> str | None:
    """`docker://…` for a toolchain that names a container image by ID, else None."""
    if toolchain.startswith("docker://"):
        return toolchain
    if toolchain.startswith("sha256:") or "@sha256:" in toolchain:
        return "docker://" + toolchain
    return None


def remote_platform(platform: tuple[tuple[str, str], ...]) -> re_pb2.Platform:
    """rsi platform pairs plus the derived `container-image`, sorted as REAPI requires."""
    pairs = dict(platform)
    image = container_image_of(pairs.get(TOOLCHAIN, ""))
    if image is not None and CONTAINER_IMAGE not in pairs:
        pairs[CONTAINER_IMAGE] = image
    return re_pb2.Platform(
        properties=[re_pb2.Platform.Property(name=k, value=v) for k, v in sorted(pairs.items())]
    )


def local_platform(platform: re_pb2.Platform) -> tuple[tuple[str, str], ...]:
    pairs: dict[str, str] = {}
    for prop in platform.properties:
        if prop.name in pairs:
            raise RemoteError(f"platform property {prop.name!r} is set twice")
        pairs[prop.name] = prop.value
    image = container_image_of(pairs.get(TOOLCHAIN, ""))
    if image is not None and pairs.get(CONTAINER_IMAGE) == image:
        del pairs[CONTAINER_IMAGE]
    return tuple(sorted(pairs.items()))


def _duration(seconds: float) -> duration_pb2.Duration:
    frac, whole = math.modf(seconds)
    return duration_pb2.Duration(seconds=int(whole), nanos=round(frac * 1e9))


@dataclass(frozen=True)
class RemoteAction:
    """An rsi action as REAPI sees it: the Action digest (its remote cache key) and every blob
    the server may need: Action, Command, each Directory, and each input file (by digest)."""

    action: Action
    digest: Digest
    action_proto: re_pb2.Action
    command: re_pb2.Command
    blobs: dict[Digest, bytes] = field(default_factory=dict)
    input_files: dict[Digest, FileNode] = field(default_factory=dict)
    platform: tuple[tuple[str, str], ...] = ()


def input_directories(
    inputs: Mapping[str, FileNode | SymlinkNode], function: str
) -> tuple[Digest, dict[Digest, bytes]]:
    """The REAPI Directory tree of an input set: root digest and every Directory blob."""
    tree: dict = {}
    for path, node in inputs.items():
        *dirs, leaf = path.split("/")
        here = tree
        for d in dirs:
            here = here.setdefault(d, {})
        here[leaf] = node
    blobs: dict[Digest, bytes] = {}

    def encode(node: dict) -> Digest:
        directory = re_pb2.Directory()
        for name in sorted(node):
            child = node[name]
            if isinstance(child, dict):
                sub = encode(child)
                directory.directories.add(name=name, digest=to_proto_digest(sub))
            elif isinstance(child, SymlinkNode):
                directory.symlinks.add(name=name, target=child.target)
            else:
                directory.files.add(
                    name=name,
                    digest=to_proto_digest(child.digest),
                    is_executable=child.executable,
                )
        data = _serialize(directory)
        digest = digest_bytes(data, function)
        blobs[digest] = data
        return digest

    return encode(tree), blobs


def to_remote_action(action: Action) -> RemoteAction:
    function = action.digest_function
    platform = remote_platform(action.platform)
    command = re_pb2.Command(
        arguments=list(action.argv),
        environment_variables=[
            re_pb2.Command.EnvironmentVariable(name=k, value=v) for k, v in action.env
        ],
        output_paths=list(action.outputs),
        output_files=list(action.outputs),
        platform=platform,
    )
    command_bytes = _serialize(command)
    command_digest = digest_bytes(command_bytes, function)
    root, blobs = input_directories(action.input_map, function)
    action_proto = re_pb2.Action(
        command_digest=to_proto_digest(command_digest),
        input_root_digest=to_proto_digest(root),
        timeout=_duration(action.timeout_s),
        salt=action.salt.encode("utf-8"),
        platform=platform,
    )
    action_bytes = _serialize(action_proto)
    action_digest = digest_bytes(action_bytes, function)
    blobs[command_digest] = command_bytes
    blobs[action_digest] = action_bytes
    files = {n.digest: n for _, n in action.inputs if isinstance(n, FileNode)}
    return RemoteAction(
        action=action,
        digest=action_digest,
        action_proto=action_proto,
        command=command,
        blobs=blobs,
        input_files=files,
        platform=tuple((p.name, p.value) for p in platform.properties),
    )


def from_remote_action(
    action_proto: re_pb2.Action,
    command: re_pb2.Command,
    read_directory: Callable[[Digest], re_pb2.Directory],
    function: str,
) -> Action:
    """Rebuild the rsi `Action` a client sent (the worker's side of `to_remote_action`)."""
    inputs: dict[str, FileNode | SymlinkNode] = {}

    def walk(digest: Digest, prefix: str) -> None:
        directory = read_directory(digest)
        for f in directory.files:
            inputs[prefix + f.name] = FileNode(from_proto_digest(f.digest), f.is_executable)
        for s in directory.symlinks:
            inputs[prefix + s.name] = SymlinkNode(s.target)
        for d in directory.directories:
            walk(from_proto_digest(d.digest), prefix + d.name + "/")

    walk(from_proto_digest(action_proto.input_root_digest), "")
    platform = action_proto.platform if action_proto.platform.properties else command.platform
    timeout = action_proto.timeout.seconds + action_proto.timeout.nanos / 1e9
    return Action(
        argv=tuple(command.arguments),
        inputs=tuple(inputs.items()),
        outputs=tuple(command.output_paths or command.output_files),
        env=tuple((e.name, e.value) for e in command.environment_variables),
        platform=local_platform(platform),
        timeout_s=timeout or 600.0,
        salt=action_proto.salt.decode("utf-8"),
        digest_function=function,
        mnemonic="RemoteAction",
    )


def _timestamp(seconds: float | None) -> timestamp_pb2.Timestamp | None:
    if seconds is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def to_remote_result(result: ActionResult, worker: str | None = None) -> re_pb2.ActionResult:
    """An rsi result as a REAPI ActionResult; executor, host facts and timing ride along in
    auxiliary_metadata (a JSON StringValue: exact, unlike a Struct's doubles), so a workspace
    that reads it back keeps the evidence."""
    meta = {
        "schema": RESULT_META_SCHEMA,
        "executor": result.executor,
        "host": _jsonable(dict(result.host)),
        "timing": _jsonable(dict(result.timing)),
        "timed_out": result.timed_out,
        "failure": result.failure or "",
    }
    packed = any_pb2.Any()
    packed.Pack(wrappers_pb2.StringValue(value=json.dumps(meta, sort_keys=True)))
    timing = dict(result.timing)
    started = timing.get("started")
    wall = timing.get("wall_s")
    execution = re_pb2.ExecutedActionMetadata(
        worker=worker or str(result.host.get("hostname", "")),
        auxiliary_metadata=[packed],
    )
    if isinstance(started, (int, float)):
        execution.execution_start_timestamp.CopyFrom(_timestamp(started))
        if isinstance(wall, (int, float)):
            execution.execution_completed_timestamp.CopyFrom(_timestamp(started + wall))
    proto = re_pb2.ActionResult(
        output_files=[
            re_pb2.OutputFile(
                path=o.path, digest=to_proto_digest(o.digest), is_executable=o.executable
            )
            for o in result.outputs
        ],
        exit_code=_wire_exit_code(result),
        execution_metadata=execution,
    )
    if result.stdout is not None:
        proto.stdout_digest.CopyFrom(to_proto_digest(result.stdout))
    if result.stderr is not None:
        proto.stderr_digest.CopyFrom(to_proto_digest(result.stderr))
    return proto


def _wire_exit_code(result: ActionResult) -> int:
    """The exit code a server sees. A result its action declared not to be cached (it exited
    with its `RSI_UNCACHED_EXIT` code, which the local executor turned into a success marked
    `cacheable = False`) goes back with that code, not 0: a server caches only successes (as
    BuildGrid with `cache-failed-actions: false`), and the client maps the code back."""
    if not result.cacheable:
        code = dict(result.host or {}).get("uncached_exit")
        if isinstance(code, int) and not isinstance(code, bool) and code != 0:
            return code
    return result.exit_code


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    return str(value)


@dataclass(frozen=True)
class RemoteResultView:
    """A REAPI ActionResult as rsi reads it: output digests plus inline logs to store."""

    result: ActionResult
    inline: dict[str, bytes]  # 'stdout' / 'stderr' -> bytes sent inline (digest to be stored)


def from_remote_result(proto: re_pb2.ActionResult, function: str, source: str) -> RemoteResultView:
    meta: dict[str, Any] = {}
    for packed in proto.execution_metadata.auxiliary_metadata:
        text = wrappers_pb2.StringValue()
        if packed.Unpack(text):
            try:
                candidate = json.loads(text.value)
            except ValueError:
                continue
            if isinstance(candidate, dict) and candidate.get("schema") == RESULT_META_SCHEMA:
                meta = candidate
    inline: dict[str, bytes] = {}
    logs: dict[str, Digest | None] = {}
    for name in ("stdout", "stderr"):
        raw = getattr(proto, f"{name}_raw")
        if raw:
            inline[name] = raw
            logs[name] = digest_bytes(raw, function)
        elif proto.HasField(f"{name}_digest"):
            logs[name] = from_proto_digest(getattr(proto, f"{name}_digest"))
        else:
            logs[name] = digest_bytes(b"", function)
            inline[name] = b""
    timing = dict(meta.get("timing") or {})
    timing["remote"] = source
    host = dict(meta.get("host") or {})
    worker = proto.execution_metadata.worker
    if worker and "hostname" not in host:
        host["hostname"] = worker
    result = ActionResult(
        exit_code=proto.exit_code,
        outputs=tuple(
            OutputFile(o.path, from_proto_digest(o.digest), o.is_executable)
            for o in proto.output_files
        ),
        stdout=logs["stdout"],
        stderr=logs["stderr"],
        timed_out=bool(meta.get("timed_out", False)),
        failure=meta.get("failure") or None,
        executor=meta.get("executor") or "remote",
        host=host,
        timing=timing,
    )
    return RemoteResultView(result=result, inline=inline)
