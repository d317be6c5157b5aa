"""`rsi worker`: a REAPI execution worker speaking the Remote Workers API (Bots v1test2), so
any machine, a GPU box included, can join a BuildGrid pool and run rsi actions through the
engine's own executors.

One lease at a time: fetch the Action, Command and input tree from the CAS into a local store
(verified), rebuild the rsi `Action`, run it on an executor, upload outputs and logs, report
the REAPI ActionResult. It advertises only what it has: an accelerator property only when a
GPU is present. It never caches results itself; the server does, for successes only.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from rsi.action import Action, ActionResult
from rsi.digest import Digest
from rsi.errors import RemoteError, RsiError
from rsi.remote._proto.build.bazel.remote.execution.v2 import remote_execution_pb2 as re_pb2
from rsi.remote._proto.google.devtools.remoteworkers.v1test2 import (
    bots_pb2,
    bots_pb2_grpc,
    worker_pb2,
)
from rsi.remote._proto.google.rpc import status_pb2
from rsi.remote.client import RemoteClient, from_proto_digest
from rsi.remote.mapping import from_remote_action, to_remote_result
from rsi.store import LocalStore

log = logging.getLogger("rsi.worker")

# google.rpc.Code values
_OK, _CANCELLED, _INVALID_ARGUMENT, _DEADLINE, _FAILED_PRECONDITION, _INTERNAL = 0, 1, 3, 4, 9, 13


def detect_accelerators() -> list[tuple[str, str]]:
    """('accelerator', …) properties for the GPUs this machine really has; none without one."""
    from rsi.host import gpu_model, gpu_names

    names = gpu_names()
    if not names:
        return []
    return [
        ("accelerator", "cuda"),
        ("accelerator", gpu_model(names[0])),
        ("accelerator-count", str(len(names))),
    ]


def default_properties(executor_name: str) -> list[tuple[str, str]]:
    props = [("OSFamily", "linux"), ("toolchain", "host")]
    if executor_name in ("local", "bwrap"):
        from rsi.executors.local import host_python_identity
        from rsi.registry import host_import_sets

        # NB: an action's identity names the modules it imports (host-python@…:numpy,torch);
        # the worker advertises one per set the installed rule families declare, so their
        # actions match it, and the bare interpreter's for actions that import nothing
        for modules in [(), *host_import_sets()]:
            identity = host_python_identity(modules)
            if ("toolchain", identity) not in props:
                props.append(("toolchain", identity))
    return props + detect_accelerators()


def make_executor(name: str) -> Any:
    """An engine executor by name; imported lazily so a worker needs only what it uses."""
    if name in ("local", "bwrap", "unshare", "none"):
        from rsi.executors.local import LocalExecutor

        return LocalExecutor(sandbox=None if name == "local" else name)
    if name == "docker":
        try:
            from rsi.executors.docker import DockerExecutor  # type: ignore[import-not-found]
        except ImportError as exc:
            raise RsiError(f"the docker executor is not available here: {exc}") from None
        return DockerExecutor()
    raise RsiError(f"unknown executor {name!r}", hint="use local, bwrap or docker")


@dataclass
class WorkerStats:
    leases: int = 0
    succeeded: int = 0
    failed: int = 0
    last_error: str | None = None
    history: list[dict] = field(default_factory=list)


class Worker:
    """A bot: create a session, then long-poll UpdateBotSession, running leases as they come."""

    def __init__(
        self,
        url: str,
        store_root: str | os.PathLike,
        *,
        executor: Any | None = None,
        executor_name: str = "local",
        properties: list[tuple[str, str]] | None = None,
        bot_id: str | None = None,
        poll_timeout_s: float = 10.0,
        rpc_timeout_s: float = 60.0,
        on_event: Callable[[dict], None] | None = None,
    ) -> None:
        self.client = RemoteClient(url, rpc_timeout_s=rpc_timeout_s)
        self.function = self.client.digest_function
        self.store = LocalStore(Path(store_root) / self.function, self.function)
        self.executor = executor or make_executor(executor_name)
        self.properties = (
            properties if properties is not None else default_properties(executor_name)
        )
        self.bot_id = bot_id or f"rsi-{socket.gethostname()}-{os.getpid()}"
        self.poll_timeout_s = poll_timeout_s
        self.bots = bots_pb2_grpc.BotsStub(self.client.channel)
        self.stats = WorkerStats()
        self.on_event = on_event or (lambda event: None)
        self.session: bots_pb2.BotSession | None = None

    # ----------------------------------------------------------------------------- session
    def _worker_proto(self) -> worker_pb2.Worker:
        device = worker_pb2.Device(
            handle=self.bot_id,
            properties=[worker_pb2.Device.Property(key=k, value=v) for k, v in self.properties],
        )
        return worker_pb2.Worker(devices=[device])

    def _create_session(self) -> bots_pb2.BotSession:
        request = bots_pb2.CreateBotSessionRequest(
            parent=self.client.instance_name,
            bot_session=bots_pb2.BotSession(
                bot_id=self.bot_id, status=bots_pb2.BotStatus.OK, worker=self._worker_proto()
            ),
        )
        try:
            return self.bots.CreateBotSession(request, timeout=self.poll_timeout_s + 5)
        except grpc.RpcError as exc:
            raise self.client._error("CreateBotSession", exc) from None

    def _update(self, session: bots_pb2.BotSession, timeout: float) -> bots_pb2.BotSession:
        request = bots_pb2.UpdateBotSessionRequest(name=session.name, bot_session=session)
        try:
            return self.bots.UpdateBotSession(request, timeout=timeout)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                return session
            raise self.client._error("UpdateBotSession", exc) from None

    def run(
        self, stop: threading.Event | None = None, max_leases: int | None = None
    ) -> WorkerStats:
        """Serve leases until `stop` is set or `max_leases` have completed."""
        stop = stop or threading.Event()
        self.client.capabilities()
        session = self._create_session()
        self.session = session
        self.on_event(
            {
                "event": "worker.started",
                "bot": self.bot_id,
                "session": session.name,
                "properties": [f"{k}={v}" for k, v in self.properties],
            }
        )
        backoff = 0.5
        served: set[str] = set()
        while not stop.is_set():
            if max_leases is not None and self.stats.leases >= max_leases:
                break
            # NB: a lease can arrive PENDING or, after a retried call, already ACTIVE; the
            # first reply (CreateBotSession's) may carry one too.
            todo = [
                lease
                for lease in session.leases
                if lease.id not in served
                and lease.state in (bots_pb2.LeaseState.PENDING, bots_pb2.LeaseState.ACTIVE)
            ]
            if todo:
                lease = todo[0]
                served.add(lease.id)
                lease.state = bots_pb2.LeaseState.ACTIVE
                session = self._serve(session, lease, stop)
                self.session = session
                continue
            try:
                session = self._update(session, self.poll_timeout_s)
                backoff = 0.5
            except RemoteError as exc:
                self.stats.last_error = str(exc)
                log.warning("%s; retrying in %.1fs", exc, backoff)
                stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
        self._close(session)
        return self.stats

    def _serve(
        self, session: bots_pb2.BotSession, lease: bots_pb2.Lease, stop: threading.Event
    ) -> bots_pb2.BotSession:
        """Run one lease in a thread while keeping the session alive; then report it."""
        cancel = threading.Event()
        outcome: dict[str, Any] = {}
        lease_id = lease.id
        payload = bots_pb2.Lease()
        payload.CopyFrom(lease)
        worker = threading.Thread(
            target=lambda: outcome.update(self._execute(payload, cancel)), daemon=True
        )
        worker.start()
        while worker.is_alive():
            session = self._update(session, min(self.poll_timeout_s, 5.0))
            current = next((x for x in session.leases if x.id == lease_id), None)
            if current is None or current.state == bots_pb2.LeaseState.CANCELLED or stop.is_set():
                cancel.set()
            worker.join(timeout=0.2)
        current = next((x for x in session.leases if x.id == lease_id), None)
        if current is None:
            return session
        current.state = bots_pb2.LeaseState.COMPLETED
        current.status.CopyFrom(outcome.get("status", status_pb2.Status(code=_INTERNAL)))
        if "result" in outcome:
            current.result.Pack(outcome["result"])
        self.stats.leases += 1
        return self._update(session, self.poll_timeout_s)

    def _close(self, session: bots_pb2.BotSession) -> None:
        if not session.name:
            return
        session.status = bots_pb2.BotStatus.BOT_TERMINATING
        try:
            self.bots.UpdateBotSession(
                bots_pb2.UpdateBotSessionRequest(name=session.name, bot_session=session),
                timeout=5.0,
            )
        except grpc.RpcError:
            pass

    # --------------------------------------------------------------------------- one lease
    def _read_message(self, digest: Digest, message: Any) -> Any:
        blobs = self.client.read_blobs([digest])
        if digest not in blobs:
            raise RemoteError(f"blob {digest} is not in the CAS of {self.client.url}")
        message.ParseFromString(blobs[digest])
        return message

    def _load_action(self, lease: bots_pb2.Lease) -> Action:
        action_proto = re_pb2.Action()
        if lease.payload.Is(re_pb2.Action.DESCRIPTOR):
            lease.payload.Unpack(action_proto)
        else:
            digest_proto = re_pb2.Digest()
            if not lease.payload.Unpack(digest_proto):
                raise RsiError(f"lease payload {lease.payload.type_url} is not an Action")
            self._read_message(from_proto_digest(digest_proto), action_proto)
        command = self._read_message(
            from_proto_digest(action_proto.command_digest), re_pb2.Command()
        )
        cache: dict[Digest, re_pb2.Directory] = {}

        def read_directory(digest: Digest) -> re_pb2.Directory:
            if digest not in cache:
                cache[digest] = self._read_message(digest, re_pb2.Directory())
            return cache[digest]

        return from_remote_action(action_proto, command, read_directory, self.function)

    def _execute(self, lease: bots_pb2.Lease, cancel: threading.Event) -> dict[str, Any]:
        started = time.time()
        label = lease.id
        try:
            action = self._load_action(lease)
            label = " ".join(action.argv)[:80]
            files = [n.digest for _, n in action.inputs if hasattr(n, "digest")]
            absent = self.client.download_to_store(files, self.store)
            if absent:
                raise RemoteError(
                    f"input blob(s) missing from the CAS: {', '.join(map(str, sorted(absent)))}"
                )
            result = self.executor.run(action, self.store, cancel)
            uploads = {d: self.store.blob_path(d) for d in result.blobs()}
            self.client.upload_missing(uploads)
            proto = to_remote_result(result, worker=self.bot_id)
            ok = result.ok
            self.stats.succeeded += ok
            self.stats.failed += not ok
            self._record(lease.id, label, started, result)
            return {"status": status_pb2.Status(code=_OK), "result": proto}
        except RsiError as exc:
            # NB: an infrastructure fault (toolchain missing, sandbox broken, CAS gone) goes
            # back as a status, so the client reports it instead of a fake exit code.
            self.stats.failed += 1
            self.stats.last_error = str(exc)
            self._record(lease.id, label, started, None, str(exc))
            code = _CANCELLED if cancel.is_set() else _FAILED_PRECONDITION
            return {
                "status": status_pb2.Status(code=code, message=f"rsi worker {self.bot_id}: {exc}")
            }
        except Exception as exc:  # noqa: BLE001 - a worker must report, never die, on one lease
            self.stats.failed += 1
            self.stats.last_error = repr(exc)
            self._record(lease.id, label, started, None, repr(exc))
            return {
                "status": status_pb2.Status(
                    code=_INTERNAL, message=f"rsi worker {self.bot_id}: {exc!r}"
                )
            }

    def _record(
        self,
        lease_id: str,
        label: str,
        started: float,
        result: ActionResult | None,
        error: str | None = None,
    ) -> None:
        entry = {
            "event": "worker.lease",
            "lease": lease_id,
            "action": label,
            "wall_s": round(time.time() - started, 3),
            "exit_code": result.exit_code if result else None,
            "error": error,
        }
        self.stats.history.append(entry)
        self.on_event(entry)


def parse_properties(values: list[str]) -> list[tuple[str, str]]:
    """`KEY=VALUE` strings from `--property` flags."""
    pairs = []
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise RsiError(f"--property {value!r} is not KEY=VALUE")
        pairs.append((key, val))
    return pairs


def main(
    url: str,
    store_root: str,
    executor_name: str = "local",
    properties: list[str] | None = None,
    no_default_properties: bool = False,
    max_leases: int | None = None,
) -> int:
    """Entry point for `rsi worker` (the CLI parses flags and calls this)."""
    import json
    import signal
    import sys

    extra = parse_properties(properties or [])
    props = [] if no_default_properties else default_properties(executor_name)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    worker = Worker(
        url,
        store_root,
        executor_name=executor_name,
        properties=props + extra,
        on_event=lambda e: print(json.dumps(e), file=sys.stderr, flush=True),
    )
    stats = worker.run(stop, max_leases=max_leases)
    return 0 if stats.last_error is None or stats.leases else 1
