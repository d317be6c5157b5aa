"""A REAPI v2 client: Capabilities, CAS (+ ByteStream above the batch limit), ActionCache and
Execution, every call under a deadline, every failure turned into a `RemoteError` that says
which server, which call and what to do.

It moves bytes and protos only; it never decides what to cache or run, and it never writes into
the local store except through `LocalStore`'s atomic writes.
"""

from __future__ import annotations

import collections
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Self
from urllib.parse import urlparse

import grpc

from rsi.digest import Digest, digest_bytes
from rsi.errors import EXIT_USAGE, RemoteError, UsageError
from rsi.remote._proto.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as re_pb2,
)
from rsi.remote._proto.build.bazel.remote.execution.v2 import (
    remote_execution_pb2_grpc as re_grpc,
)
from rsi.remote._proto.google.bytestream import bytestream_pb2, bytestream_pb2_grpc
from rsi.remote._proto.google.longrunning import operations_pb2, operations_pb2_grpc
from rsi.remote._proto.google.rpc import status_pb2

# rsi's names for REAPI digest functions, best first.
_FUNCTIONS = {"blake3": re_pb2.DigestFunction.BLAKE3, "sha256": re_pb2.DigestFunction.SHA256}
PREFERRED_FUNCTIONS = ("blake3", "sha256")
_BYTESTREAM_CHUNK = 1 << 20
# Room left in a batch for the request's own framing.
_BATCH_OVERHEAD = 64 * 1024
_MAX_MESSAGE = 64 * 1024 * 1024
# A batch entry's digest, status and field tags, counted against the server's limit.
_PER_BLOB_OVERHEAD = 160

STAGE_NAMES = {
    re_pb2.ExecutionStage.UNKNOWN: "UNKNOWN",
    re_pb2.ExecutionStage.CACHE_CHECK: "CACHE_CHECK",
    re_pb2.ExecutionStage.QUEUED: "QUEUED",
    re_pb2.ExecutionStage.EXECUTING: "EXECUTING",
    re_pb2.ExecutionStage.COMPLETED: "COMPLETED",
}


class BlobMismatch(RemoteError):
    """A blob the server sent does not hash to its digest; it was not stored."""


class DigestFunctionMismatch(UsageError):
    """The workspace hashes with a function the remote does not offer; never mixed."""


class RemoteAddressError(RemoteError):
    """A remote address that is not grpc[s]://HOST:PORT: the caller's mistake (exit 2), not a
    server that failed."""

    exit_code = EXIT_USAGE


class QueueTimeout(RemoteError):
    """No worker took an execution job before its queue deadline."""


def to_proto_digest(digest: Digest) -> re_pb2.Digest:
    return re_pb2.Digest(hash=digest.hash, size_bytes=digest.size)


def from_proto_digest(digest: re_pb2.Digest) -> Digest:
    return Digest(digest.hash, digest.size_bytes)


@dataclass(frozen=True)
class RemoteEndpoint:
    """Where the server is: `grpc://HOST:PORT[/INSTANCE]` or `grpcs://…` for TLS."""

    url: str
    target: str
    instance_name: str
    tls: bool

    @classmethod
    def parse(cls, url: str) -> RemoteEndpoint:
        parsed = urlparse(url)
        if parsed.scheme not in ("grpc", "grpcs") or not parsed.hostname or not parsed.port:
            raise RemoteAddressError(
                f"remote address {url!r} is not grpc://HOST:PORT",
                hint="write e.g. --remote grpc://127.0.0.1:50051 (grpcs:// for TLS, "
                "an optional /INSTANCE path for the REAPI instance name)",
            )
        host = parsed.hostname if ":" not in parsed.hostname else f"[{parsed.hostname}]"
        return cls(
            url=url,
            target=f"{host}:{parsed.port}",
            instance_name=parsed.path.strip("/"),
            tls=parsed.scheme == "grpcs",
        )


@dataclass(frozen=True)
class ServerCapabilities:
    digest_functions: tuple[str, ...]
    max_batch_total_size_bytes: int
    update_enabled: bool
    exec_enabled: bool
    exec_digest_functions: tuple[str, ...]
    api: str

    def choose_digest_function(self) -> str:
        """BLAKE3 where the server offers it, otherwise SHA-256; an error if neither."""
        for name in PREFERRED_FUNCTIONS:
            if name in self.digest_functions:
                return name
        raise RemoteError(
            "the remote offers digest functions "
            f"{', '.join(self.digest_functions) or '(none)'}; rsi speaks only BLAKE3 and SHA-256",
            hint="point --remote at a server that offers SHA256 or BLAKE3",
        )


def _function_names(values: Iterable[int]) -> tuple[str, ...]:
    names = []
    for value in values:
        for name, enum in _FUNCTIONS.items():
            if value == enum and name not in names:
                names.append(name)
        if value not in _FUNCTIONS.values():
            names.append(re_pb2.DigestFunction.Value.Name(value).lower())
    return tuple(names)


HEADERS_ENV = "RSI_REMOTE_HEADERS"


def remote_headers(text: str | None = None) -> tuple[tuple[str, str], ...]:
    """Extra gRPC metadata for every call, e.g. BuildBuddy's API key:
    `RSI_REMOTE_HEADERS="x-buildbuddy-api-key=KEY"` (comma-separated KEY=VALUE pairs).
    Read from the environment, never from rsi.toml, so a secret is never committed."""
    text = os.environ.get(HEADERS_ENV, "") if text is None else text
    headers = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(
                f"{HEADERS_ENV}: {item!r} is not KEY=VALUE",
                hint=f'e.g. {HEADERS_ENV}="x-buildbuddy-api-key=KEY,x-other=VALUE"',
            )
        headers.append((key.strip().lower(), value.strip()))  # NB: gRPC keys are lower-case
    return tuple(headers)


class _CallDetails(
    collections.namedtuple(
        "_CallDetails",
        ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"),
    ),
    grpc.ClientCallDetails,
):
    pass


class _Headers(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds the configured metadata to every call on a channel."""

    def __init__(self, headers: tuple[tuple[str, str], ...]) -> None:
        self.headers = headers

    def _details(self, d):
        metadata = [*(d.metadata or ()), *self.headers]
        return _CallDetails(
            d.method,
            d.timeout,
            metadata,
            d.credentials,
            getattr(d, "wait_for_ready", None),
            getattr(d, "compression", None),
        )

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._details(details), requests)


class RemoteClient:
    """One channel to one REAPI server. Thread-safe: gRPC stubs are, and state is read-only
    after `capabilities()` has run once."""

    def __init__(
        self,
        url: str,
        *,
        rpc_timeout_s: float = 30.0,
        connect_timeout_s: float = 5.0,
        digest_function: str | None = None,
    ) -> None:
        self.endpoint = RemoteEndpoint.parse(url)
        self.url = url
        self.rpc_timeout_s = rpc_timeout_s
        self.connect_timeout_s = connect_timeout_s
        options = [
            ("grpc.max_receive_message_length", _MAX_MESSAGE),
            ("grpc.max_send_message_length", _MAX_MESSAGE),
            ("grpc.enable_retries", 0),
        ]
        if self.endpoint.tls:
            self.channel = grpc.secure_channel(
                self.endpoint.target, grpc.ssl_channel_credentials(), options=options
            )
        else:
            self.channel = grpc.insecure_channel(self.endpoint.target, options=options)
        headers = remote_headers()
        if headers:
            self.channel = grpc.intercept_channel(self.channel, _Headers(headers))
        self._cas = re_grpc.ContentAddressableStorageStub(self.channel)
        self._ac = re_grpc.ActionCacheStub(self.channel)
        self._caps = re_grpc.CapabilitiesStub(self.channel)
        self._exec = re_grpc.ExecutionStub(self.channel)
        self._ops = operations_pb2_grpc.OperationsStub(self.channel)
        self._bytestream = bytestream_pb2_grpc.ByteStreamStub(self.channel)
        self._capabilities: ServerCapabilities | None = None
        self._requested_function = digest_function
        self._lock = threading.Lock()

    # ---------------------------------------------------------------------------- plumbing
    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def instance_name(self) -> str:
        return self.endpoint.instance_name

    def _error(self, call: str, exc: grpc.RpcError, timeout: float | None = None) -> RemoteError:
        code = exc.code() if hasattr(exc, "code") else None
        details = exc.details() if hasattr(exc, "details") else str(exc)
        where = f"remote {self.url}"
        if code == grpc.StatusCode.UNAVAILABLE:
            return RemoteError(
                f"{where} is unreachable ({call}): {details}",
                hint="start the server or fix --remote; set remote fallback = local in the "
                "workspace config to build locally when it is down",
            )
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return RemoteError(
                f"{where} did not answer {call} within {timeout or self.rpc_timeout_s:g}s",
                hint="the server is overloaded or hung; retry, or raise the remote timeout",
            )
        name = code.name if code is not None else "ERROR"
        return RemoteError(f"{where} failed {call}: {name}: {details}")

    def _call(self, call: str, fn: Callable, request: object, timeout: float | None = None):
        timeout = timeout or self.rpc_timeout_s
        try:
            return fn(request, timeout=timeout)
        except grpc.RpcError as exc:
            raise self._error(call, exc, timeout) from None

    def wait_ready(self, timeout_s: float | None = None) -> None:
        try:
            grpc.channel_ready_future(self.channel).result(
                timeout=timeout_s or self.connect_timeout_s
            )
        except grpc.FutureTimeoutError:
            raise RemoteError(
                f"remote {self.url} is unreachable: no connection within "
                f"{timeout_s or self.connect_timeout_s:g}s",
                hint="start the server or fix --remote; set remote fallback = local in the "
                "workspace config to build locally when it is down",
            ) from None

    # ------------------------------------------------------------------------ capabilities
    def capabilities(self) -> ServerCapabilities:
        with self._lock:
            if self._capabilities is None:
                self.wait_ready()
                reply = self._call(
                    "GetCapabilities",
                    self._caps.GetCapabilities,
                    re_pb2.GetCapabilitiesRequest(instance_name=self.instance_name),
                )
                cache = reply.cache_capabilities
                execution = reply.execution_capabilities
                exec_functions = list(execution.digest_functions) or (
                    [execution.digest_function] if execution.exec_enabled else []
                )
                self._capabilities = ServerCapabilities(
                    digest_functions=_function_names(cache.digest_functions),
                    max_batch_total_size_bytes=cache.max_batch_total_size_bytes or (4 << 20),
                    update_enabled=cache.action_cache_update_capabilities.update_enabled,
                    exec_enabled=execution.exec_enabled,
                    exec_digest_functions=_function_names(exec_functions),
                    api=f"{reply.high_api_version.major}.{reply.high_api_version.minor}",
                )
            return self._capabilities

    @property
    def digest_function(self) -> str:
        """The function this client hashes with: the server's choice, or the one asked for
        when the server offers it (an error naming both otherwise)."""
        caps = self.capabilities()
        if self._requested_function is None:
            return caps.choose_digest_function()
        if self._requested_function not in caps.digest_functions:
            raise DigestFunctionMismatch(
                f"this workspace hashes with {self._requested_function} but remote {self.url} "
                f"offers only {', '.join(caps.digest_functions) or '(none)'}; rsi never mixes "
                "digest functions",
                hint=f"set digest_function = {caps.choose_digest_function()} in the workspace "
                "config (it gets its own local store), or use a remote that offers "
                f"{self._requested_function}",
            )
        return self._requested_function

    def _function_enum(self) -> int:
        return _FUNCTIONS[self.digest_function]

    def _check_blob(self, digest: Digest, data: bytes) -> None:
        got = digest_bytes(data, self.digest_function)
        if got != digest:
            raise BlobMismatch(
                f"remote {self.url} sent {got.size} bytes hashing to {got.hash[:16]}… for blob "
                f"{digest}; the blob was rejected",
                hint="the remote CAS is corrupt; the action will be rebuilt",
            )

    # --------------------------------------------------------------------------------- CAS
    def find_missing(self, digests: Iterable[Digest]) -> set[Digest]:
        unique = list(dict.fromkeys(d for d in digests if d.size > 0))
        missing: set[Digest] = set()
        for start in range(0, len(unique), 5000):
            chunk = unique[start : start + 5000]
            reply = self._call(
                "FindMissingBlobs",
                self._cas.FindMissingBlobs,
                re_pb2.FindMissingBlobsRequest(
                    instance_name=self.instance_name,
                    blob_digests=[to_proto_digest(d) for d in chunk],
                    digest_function=self._function_enum(),
                ),
            )
            missing.update(from_proto_digest(d) for d in reply.missing_blob_digests)
        return missing

    def _batch_limit(self) -> int:
        return max(1024, self.capabilities().max_batch_total_size_bytes - _BATCH_OVERHEAD)

    def upload(self, blobs: Mapping[Digest, bytes | Path | Callable[[], bytes]]) -> int:
        """Upload blobs (bytes, a file path, or a reader): batches below the server's limit,
        ByteStream above it. Returns the bytes sent."""
        limit = self._batch_limit()
        sent = 0
        batch: list[re_pb2.BatchUpdateBlobsRequest.Request] = []
        batch_size = 0

        def flush() -> None:
            nonlocal batch, batch_size
            if not batch:
                return
            reply = self._call(
                "BatchUpdateBlobs",
                self._cas.BatchUpdateBlobs,
                re_pb2.BatchUpdateBlobsRequest(
                    instance_name=self.instance_name,
                    requests=batch,
                    digest_function=self._function_enum(),
                ),
            )
            for response in reply.responses:
                if response.status.code != 0:
                    raise RemoteError(
                        f"remote {self.url} refused blob {from_proto_digest(response.digest)}: "
                        f"{response.status.message}"
                    )
            batch, batch_size = [], 0

        for digest, source in blobs.items():
            if digest.size == 0:
                continue
            if digest.size > limit:
                self._bytestream_write(digest, source)
                sent += digest.size
                continue
            data = _read_source(source)
            if batch_size + len(data) + _PER_BLOB_OVERHEAD > limit:
                flush()
            batch.append(
                re_pb2.BatchUpdateBlobsRequest.Request(digest=to_proto_digest(digest), data=data)
            )
            batch_size += len(data) + _PER_BLOB_OVERHEAD
            sent += len(data)
        flush()
        return sent

    def upload_missing(self, blobs: Mapping[Digest, bytes | Path | Callable[[], bytes]]) -> int:
        missing = self.find_missing(blobs)
        return self.upload({d: s for d, s in blobs.items() if d in missing})

    def _resource(self, digest: Digest, upload: bool) -> str:
        parts = [self.instance_name] if self.instance_name else []
        if upload:
            parts += ["uploads", str(uuid.uuid4())]
        parts.append("blobs")
        if self.digest_function != "sha256":
            parts.append(self.digest_function)
        parts += [digest.hash, str(digest.size)]
        return "/".join(parts)

    def _bytestream_write(self, digest: Digest, source: bytes | Path | Callable[[], bytes]) -> None:
        resource = self._resource(digest, upload=True)

        def chunks() -> Iterator[bytestream_pb2.WriteRequest]:
            offset = 0
            for piece in _iter_source(source):
                yield bytestream_pb2.WriteRequest(
                    resource_name=resource if offset == 0 else "",
                    write_offset=offset,
                    data=piece,
                    finish_write=offset + len(piece) >= digest.size,
                )
                offset += len(piece)

        timeout = self.rpc_timeout_s + digest.size / (20 << 20)
        reply = self._call("ByteStream.Write", self._bytestream.Write, chunks(), timeout)
        if reply.committed_size not in (digest.size, -1):
            raise RemoteError(
                f"remote {self.url} committed {reply.committed_size} of {digest.size} bytes "
                f"for blob {digest}"
            )

    def read_blobs(self, digests: Iterable[Digest]) -> dict[Digest, bytes]:
        """Read blobs into memory, each verified against its digest (BlobMismatch otherwise);
        a blob the server does not have is left out of the answer."""
        limit = self._batch_limit()
        found: dict[Digest, bytes] = {}
        batch: list[Digest] = []
        batch_size = 0

        def flush() -> None:
            nonlocal batch, batch_size
            if not batch:
                return
            reply = self._call(
                "BatchReadBlobs",
                self._cas.BatchReadBlobs,
                re_pb2.BatchReadBlobsRequest(
                    instance_name=self.instance_name,
                    digests=[to_proto_digest(d) for d in batch],
                    digest_function=self._function_enum(),
                ),
            )
            for response in reply.responses:
                digest = from_proto_digest(response.digest)
                if response.status.code == grpc.StatusCode.NOT_FOUND.value[0]:
                    continue
                if response.status.code != 0:
                    raise RemoteError(
                        f"remote {self.url} could not read blob {digest}: {response.status.message}"
                    )
                self._check_blob(digest, response.data)
                found[digest] = response.data
            batch, batch_size = [], 0

        for digest in dict.fromkeys(digests):
            if digest.size == 0:
                self._check_blob(digest, b"")
                found[digest] = b""
                continue
            if digest.size > limit:
                data = self._bytestream_read(digest)
                if data is not None:
                    found[digest] = data
                continue
            if batch_size + digest.size + _PER_BLOB_OVERHEAD > limit:
                flush()
            batch.append(digest)
            batch_size += digest.size + _PER_BLOB_OVERHEAD
        flush()
        return found

    def _bytestream_read(self, digest: Digest) -> bytes | None:
        with tempfile.TemporaryFile() as f:
            if not self._bytestream_read_into(digest, f):
                return None
            f.seek(0)
            data = f.read()
        self._check_blob(digest, data)
        return data

    def _bytestream_read_into(self, digest: Digest, f) -> bool:
        timeout = self.rpc_timeout_s + digest.size / (20 << 20)
        request = bytestream_pb2.ReadRequest(resource_name=self._resource(digest, upload=False))
        try:
            for reply in self._bytestream.Read(request, timeout=timeout):
                f.write(reply.data)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return False
            raise self._error("ByteStream.Read", exc, timeout) from None
        return True

    def download_to_store(self, digests: Iterable[Digest], store) -> set[Digest]:
        """Fetch blobs the local store lacks into it, verified; returns the ones the server
        lacked. Large blobs stream through a temp file and are hashed again on the way in, so
        the store never holds a partial or mismatching blob."""
        wanted = [d for d in dict.fromkeys(digests) if not store.has(d)]
        limit = self._batch_limit()
        small = [d for d in wanted if d.size <= limit]
        large = [d for d in wanted if d.size > limit]
        absent: set[Digest] = set()
        got = self.read_blobs(small)
        for digest in small:
            if digest not in got:
                absent.add(digest)
                continue
            stored = store.put_bytes(got[digest])
            if stored != digest:  # NB: only if the store hashes with another function
                raise BlobMismatch(f"blob {digest} stored as {stored}: digest functions differ")
        for digest in large:
            fd, tmp = tempfile.mkstemp(dir=store.tmp, prefix="remote-")
            try:
                with os.fdopen(fd, "wb") as f:
                    present = self._bytestream_read_into(digest, f)
                if not present:
                    absent.add(digest)
                    continue
                stored = store.put_file(tmp, move=True)
                if stored != digest:
                    store._quarantine(store.blob_path(stored))
                    raise BlobMismatch(
                        f"remote {self.url} sent content hashing to {stored} for blob {digest}; "
                        "the blob was rejected",
                        hint="the remote CAS is corrupt; the action will be rebuilt",
                    )
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        return absent

    # ------------------------------------------------------------------------ action cache
    def get_action_result(self, action_digest: Digest) -> re_pb2.ActionResult | None:
        request = re_pb2.GetActionResultRequest(
            instance_name=self.instance_name,
            action_digest=to_proto_digest(action_digest),
            inline_stdout=True,
            inline_stderr=True,
            digest_function=self._function_enum(),
        )
        try:
            return self._ac.GetActionResult(request, timeout=self.rpc_timeout_s)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise self._error("GetActionResult", exc) from None

    def update_action_result(self, action_digest: Digest, result: re_pb2.ActionResult) -> None:
        self._call(
            "UpdateActionResult",
            self._ac.UpdateActionResult,
            re_pb2.UpdateActionResultRequest(
                instance_name=self.instance_name,
                action_digest=to_proto_digest(action_digest),
                action_result=result,
                digest_function=self._function_enum(),
            ),
        )

    # --------------------------------------------------------------------------- execution
    def execute(
        self,
        action_digest: Digest,
        *,
        queue_timeout_s: float,
        execution_timeout_s: float,
        skip_cache_lookup: bool = False,
        cancel: threading.Event | None = None,
        on_stage: Callable[[str], None] | None = None,
        slice_s: float = 2.0,
    ) -> re_pb2.ExecuteResponse:
        """Run an action remotely and wait for it.

        Two deadlines: `queue_timeout_s` for a worker to take the job (QueueTimeout if none
        does) and `execution_timeout_s` from then on. The wait is cut into slices so that a
        cancel or a deadline is noticed within `slice_s` even when the server says nothing.
        """
        started = time.monotonic()
        queue_deadline = started + queue_timeout_s
        exec_deadline: float | None = None
        stage = "UNKNOWN"
        name: str | None = None
        while True:
            now = time.monotonic()
            if cancel is not None and cancel.is_set():
                if name:
                    self.cancel_operation(name)
                raise RemoteError(f"remote execution of {action_digest} cancelled")
            if exec_deadline is None and stage not in ("EXECUTING", "COMPLETED"):
                if now >= queue_deadline:
                    if name:
                        self.cancel_operation(name)
                    raise QueueTimeout(
                        f"no worker of remote {self.url} took the job within "
                        f"{queue_timeout_s:g}s (still {stage})"
                    )
                remaining = queue_deadline - now
            else:
                if exec_deadline is None:
                    exec_deadline = now + execution_timeout_s
                if now >= exec_deadline:
                    if name:
                        self.cancel_operation(name)
                    raise RemoteError(
                        f"remote execution of {action_digest} did not finish within "
                        f"{execution_timeout_s:g}s of starting on a worker"
                    )
                remaining = exec_deadline - now
            timeout = max(0.05, min(slice_s, remaining))
            if name is None:
                call = self._exec.Execute(
                    re_pb2.ExecuteRequest(
                        instance_name=self.instance_name,
                        action_digest=to_proto_digest(action_digest),
                        skip_cache_lookup=skip_cache_lookup,
                        digest_function=self._function_enum(),
                    ),
                    timeout=timeout,
                )
                what = "Execute"
            else:
                call = self._exec.WaitExecution(
                    re_pb2.WaitExecutionRequest(name=name), timeout=timeout
                )
                what = "WaitExecution"
            try:
                for operation in call:
                    name = operation.name or name
                    meta = re_pb2.ExecuteOperationMetadata()
                    if operation.metadata.Unpack(meta):
                        new_stage = STAGE_NAMES.get(meta.stage, "UNKNOWN")
                        if new_stage != stage:
                            stage = new_stage
                            if on_stage is not None:
                                on_stage(stage)
                            if stage == "EXECUTING" and exec_deadline is None:
                                exec_deadline = time.monotonic() + execution_timeout_s
                    if operation.done:
                        return self._operation_response(operation, action_digest)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    continue
                raise self._error(what, exc) from None

    def _operation_response(self, operation, action_digest: Digest) -> re_pb2.ExecuteResponse:
        if operation.HasField("error") and operation.error.code != 0:
            raise RemoteError(
                f"remote execution of {action_digest} failed: {_status_text(operation.error)}"
            )
        response = re_pb2.ExecuteResponse()
        if not operation.response.Unpack(response):
            raise RemoteError(
                f"remote {self.url} answered Execute with {operation.response.type_url}, "
                "not an ExecuteResponse"
            )
        return response

    def cancel_operation(self, name: str) -> None:
        try:
            self._ops.CancelOperation(operations_pb2.CancelOperationRequest(name=name), timeout=5.0)
        except grpc.RpcError:
            pass  # NB: best effort; the job's own deadline still bounds it on the server


def _status_text(status: status_pb2.Status) -> str:
    try:
        code = grpc.StatusCode(
            next(c for c in grpc.StatusCode if c.value[0] == status.code).value
        ).name
    except StopIteration:
        code = str(status.code)
    return f"{code}: {status.message}"


def status_text(status: status_pb2.Status) -> str:
    return _status_text(status)


def _read_source(source: bytes | Path | Callable[[], bytes]) -> bytes:
    if isinstance(source, (bytes, bytearray)):
        return bytes(source)
    if callable(source):
        return source()
    return Path(source).read_bytes()


def _iter_source(source: bytes | Path | Callable[[], bytes]) -> Iterator[bytes]:
    if isinstance(source, (bytes, bytearray)) or callable(source):
        data = _read_source(source)
        for start in range(0, len(data), _BYTESTREAM_CHUNK):
            yield data[start : start + _BYTESTREAM_CHUNK]
        return
    with open(source, "rb") as f:
        while piece := f.read(_BYTESTREAM_CHUNK):
            yield piece
