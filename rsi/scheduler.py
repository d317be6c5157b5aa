"""The scheduler: runs exactly the actions whose key is not cached, in dependency order, in
parallel within resource classes, and says for every miss why it missed.

Early cutoff falls out of the keys: a consumer's key is computed from its producers' output
digests, so a rebuilt producer with identical outputs leaves its consumers cached. Exclusive
actions (timing) run with nothing else running, here and (through the host lock) in any other
rsi process. An action whose platform asks for something the executor lacks (an accelerator
the host does not have) is not run: it is `incompatible`, and so is everything downstream.
The scheduler never executes anything itself.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Protocol

from rsi.action import Action, ActionResult
from rsi.analysis import BuildGraph
from rsi.canonical import canonical_bytes
from rsi.digest import Digest, FileNode, SymlinkNode
from rsi.errors import CorruptEntry, ExecutionError, RsiError, StoreError
from rsi.events import EventLog
from rsi.executors.base import TRASH, Executor
from rsi.executors.hoststep import HOST_STEPS, host_step_kind
from rsi.executors.hoststep import present as host_step_present
from rsi.record import Value
from rsi.host import (
    Capabilities,
    Holder,
    HostLock,
    describe_holders,
    short_label,
    unmet_requirement,
)
from rsi.rule import ActionSpec
from rsi.store import LocalStore
from rsi.store_index import LazyIndex

# NB: descriptions per "why" pack blob: bounded, so reading one action's costs the same at any N
PACK_ACTIONS = 64


class RemoteCache(Protocol):
    def get(self, action: Action, store: LocalStore) -> ActionResult | None: ...
    def put(self, action: Action, result: ActionResult, store: LocalStore) -> None: ...


class Outcome(Value):
    _fields = ("id", "status", "key", "result", "why", "message", "retryable", "needs")

    def __init__(
        self,
        id: str,  # noqa: A002 - NB: the action's id
        # hit | remote_hit | executed | failed | skipped | error | not_started | incompatible
        status: str,
        key: Digest | None = None,
        result: ActionResult | None = None,
        why: list[str] | None = None,
        message: str | None = None,
        retryable: bool = False,
        needs: str | None = None,
    ) -> None:
        self.id = id
        self.status = status
        self.key = key
        self.result = result
        self.why: list[str] = [] if why is None else why
        self.message = message
        self.retryable = retryable
        self.needs = needs  # NB: what the executor lacks, for incompatible and its dependents

    @property
    def ok(self) -> bool:
        return self.status in ("hit", "remote_hit", "executed")


class Scheduler:
    def __init__(
        self,
        store: LocalStore,
        executor: Executor,
        events: EventLog,
        *,
        jobs: int = 1,
        keep_going: bool = False,
        salt: str = "",
        remote: RemoteCache | None = None,
        remote_fallback: bool = False,
        host_lock: HostLock | None = None,
        capabilities: Callable[[], Capabilities] | None = None,
        required: set[str] | None = None,
    ) -> None:
        """`capabilities` says what the executor can provide (None: it checks for itself, as a
        remote engine does); an action it cannot run is `incompatible`, a failure when it is
        in `required` (default: every action), otherwise skipped and the build goes on."""
        self.store = store
        self.executor = executor
        self.events = events
        self.jobs = max(1, jobs)
        self.keep_going = keep_going
        self.salt = salt
        self.remote = remote
        self.remote_fallback = remote_fallback
        # NB: read shard by shard as actions are recorded or explained, never all of it
        self.index = LazyIndex(store.target_index)
        self.index_updates: dict[str, dict] = {}
        self._pack: dict[str, dict] = {}
        self._targets_by_name: dict | None = None
        self.cancel = threading.Event()
        self.host_lock = host_lock if host_lock is not None else HostLock()
        self._capabilities = capabilities
        self._known_capabilities: Capabilities | None = None
        self.required = required
        # NB: source path -> (stat signature or None, hash, size) as keyed (rsi.incremental)
        self.sources_seen: dict[str, tuple] = {}

    # ------------------------------------------------------------------------ resolution
    def resolve(self, spec: ActionSpec, outcomes: dict[str, Outcome]) -> Action:
        inputs: dict[str, FileNode | SymlinkNode] = {}
        sources: list[tuple[str, str]] = []
        memo = self.store.file_memo
        settled = outcomes.output if isinstance(outcomes, _Settled) else None
        for art in spec.inputs:
            if art.producer is not None:
                producer = self._graph.producer(art.producer)
                # NB: an output of an action the state vouched for is read from the state, not
                # through an outcome object made for it (a root of 10,000 inputs: ~150 ms)
                got = settled(producer, art.path) if settled is not None else None
                if got is None:
                    produced = outcomes[producer].result
                    out = produced.output_map.get(art.path) if produced else None
                    if out is None:
                        raise ExecutionError(
                            f"{spec.label}: input {art.path} was not produced by {art.producer}"
                        )
                    got = (out.digest, out.executable)
                inputs[art.path] = FileNode(got[0], got[1])
            elif art.digest is not None:
                inputs[art.path] = FileNode(art.digest, art.executable)
            elif art.symlink is not None:
                inputs[art.path] = SymlinkNode(art.symlink)
            else:
                try:
                    src = str(art.source)
                    digest, sig = memo.observe(src)
                    inputs[art.path] = FileNode(digest, art.executable)
                    sources.append((art.path, src))
                    self._observe(src, sig, digest)
                except OSError as exc:
                    raise ExecutionError(
                        f"{spec.label}: cannot read input {art.source}: {exc}"
                    ) from exc
        return Action(
            argv=spec.argv,
            inputs=tuple(inputs.items()),
            outputs=spec.outputs,
            env=spec.env,
            platform=spec.platform,
            timeout_s=spec.timeout_s,
            salt=self.salt,
            digest_function=self.store.function,
            label=spec.label,
            mnemonic=spec.mnemonic,
            tags=spec.tags,
            sources=tuple(sources),
        )

    def _observe(self, src: str, sig: tuple | None, digest: Digest) -> None:
        """Remember what each source was keyed with, for the incremental state: its stat
        signature (None when racy) and digest, or nothing usable when two reads disagree."""
        seen = (sig, digest.hash, digest.size)
        prev = self.sources_seen.get(src)
        if prev is None or prev == seen:
            self.sources_seen[src] = seen
        elif prev[1:] == seen[1:]:
            self.sources_seen[src] = (None, *seen[1:])
        else:
            self.sources_seen[src] = (None, None, None)

    def _upload_sources(self, spec: ActionSpec, action: Action) -> None:
        nodes = action.input_map
        for art in spec.inputs:
            if art.source is None or art.producer is not None:
                continue
            want = nodes[art.path].digest
            if not self.store.has(want):
                got = self.store.put_file(art.source)
                if got != want:
                    self.store.file_memo.forget(art.source)
                    raise ExecutionError(
                        f"{art.source} changed while the build was running",
                        hint="run the build again",
                    )

    # ------------------------------------------------------------------------------- why
    def why(self, spec: ActionSpec, action: Action) -> list[str]:
        last = self.index.get(spec.id)
        if last is None:
            return ["no earlier build of this action is recorded"]
        if last.get("key") == str(action.key()):
            return ["its cached result is missing or failed verification"]
        before, before_attrs = self.store.target_index.details(spec.id, last)
        if before is None:
            return ["the action changed (its earlier description is no longer in the store)"]
        reasons = diff_descriptions(before, action.describe())
        if last.get("attrs") and last["attrs"] != spec.attrs_digest:
            now = self._attrs_of(spec)
            if before_attrs is None or now is None:
                reasons[:0] = ["target attributes changed"]
            else:
                reasons[:0] = [
                    f"attribute {k} changed"
                    for k in sorted(set(before_attrs) | set(now))
                    if before_attrs.get(k) != now.get(k)
                ]
        return reasons or ["the action changed"]

    def _attrs_of(self, spec: ActionSpec) -> dict | None:
        from rsi.analysis import _jsonable
        from rsi.label import Label

        known = getattr(self._graph, "attrs_json", {}).get(spec.label)
        if known is not None:
            return known
        try:
            # NB: by its own label, not by listing every target: a graph from the analysis
            # cache unpickles a target only when it is looked at
            target = self._graph.targets.get(Label.parse(spec.label))
        except RsiError:
            target = None
        if target is None:
            if self._targets_by_name is None:
                self._targets_by_name = {str(k): t for k, t in self._graph.targets.items()}
            target = self._targets_by_name.get(spec.label)
        return _jsonable(target.attrs) if target is not None else None

    def _record(self, spec: ActionSpec, action: Action) -> None:
        key = str(action.key())
        last = self.index.get(spec.id)
        if last is not None and last.get("key") == key:
            return
        # NB: descriptions and attributes go into one pack blob written when the run ends,
        # not one small file per action (file creation dominates on small VMs)
        attrs = None
        if last is not None and last.get("attrs") == spec.attrs_digest and spec.attrs_digest:
            # NB: the same attributes as last time, as recorded then ("why" read that pack
            # already): the target is not unpickled, nor its rule's code imported
            attrs = self.store.target_index.details(spec.id, last)[1]
        if attrs is None:
            attrs = self._attrs_of(spec)
        self._pack[spec.id] = {"description": action.describe(), "attrs": attrs}
        entry = {
            "key": key,
            "pack": None,
            "attrs": spec.attrs_digest,
            "label": spec.label,
            "time": time.time(),
        }
        self.index[spec.id] = entry
        self.index_updates[spec.id] = entry

    def _write_pack(self) -> None:
        """The run's descriptions, in packs of at most `PACK_ACTIONS`: "why" for one action
        then parses one small pack, not every description a cold build of 100,000 wrote."""
        if not self._pack:
            return
        items = list(self._pack.items())
        self._pack = {}
        for start in range(0, len(items), PACK_ACTIONS):
            chunk = dict(items[start : start + PACK_ACTIONS])
            try:
                digest = str(self.store.put_bytes(canonical_bytes(chunk), fsync=False))
            except RsiError:
                for action_id in chunk:  # NB: "why" then says the description is gone
                    self.index_updates.pop(action_id, None)
                continue
            for action_id in chunk:
                if action_id in self.index_updates:
                    self.index_updates[action_id]["pack"] = digest

    # ---------------------------------------------------------------------------- lookup
    def lookup(self, graph: BuildGraph, wanted: set[str]) -> dict[str, Outcome]:
        """What a build of `wanted` would serve from the local cache, running nothing: a `hit`
        outcome for every action whose key resolves (its producers were hits) and is cached."""
        self._graph = graph
        preds = graph.preds
        waiting = {a: sum(1 for p in preds.get(a, ()) if p in wanted) for a in wanted}
        ready = deque(sorted(a for a, n in waiting.items() if n == 0))
        outcomes: dict[str, Outcome] = {}
        while ready:
            action_id = ready.popleft()
            try:
                action = self.resolve(graph.actions[action_id], outcomes)
            except RsiError:
                continue
            cached = self.store.get_action_result(action.key())
            if cached is None or not cached.ok or not self._still_there(action):
                continue
            outcomes[action_id] = Outcome(action_id, "hit", action.key(), cached)
            for nxt in graph.succs.get(action_id, ()):
                if nxt in waiting:
                    waiting[nxt] -= 1
                    if waiting[nxt] == 0:
                        ready.append(nxt)
        return outcomes

    # ------------------------------------------------------------------------------- run
    def run(
        self,
        graph: BuildGraph,
        wanted: set[str],
        build_event: int,
        known: Mapping[str, Outcome] | None = None,
    ) -> dict[str, Outcome]:
        """Build `wanted`. `known` are outcomes settled before the run (cache hits the
        incremental state vouched for, whose events the caller emits): they feed their
        consumers, are looked up only when a consumer needs them, and are never run."""
        self._graph = graph
        preds, succs = graph.preds, graph.succs
        waiting = {a: sum(1 for p in preds.get(a, ()) if p in wanted) for a in wanted}
        ready = deque(sorted(a for a, n in waiting.items() if n == 0))
        outcomes: dict[str, Outcome] = _Settled(known) if known else {}
        counts = self.events.counts
        to_execute: deque[tuple[ActionSpec, Action, list[str], int]] = deque()
        running: dict[Future, tuple[ActionSpec, Action, list[str], int]] = {}
        exclusive_running = False
        stopped = False
        counts["total"] = len(wanted) + (len(known) if known else 0)

        def finish(action_id: str, outcome: Outcome) -> None:
            outcomes[action_id] = outcome
            counts["done"] += 1
            if outcome.ok:
                for nxt in succs.get(action_id, ()):
                    if nxt not in waiting:
                        continue
                    waiting[nxt] -= 1
                    if waiting[nxt] == 0:
                        ready.append(nxt)
            else:
                needs = outcome.needs
                for nxt in sorted(graph.descendants(action_id, wanted)):
                    if nxt not in outcomes:
                        outcomes[nxt] = Outcome(
                            nxt,
                            "skipped",
                            message=f"not built: depends on {action_id}"
                            + (f", which needs {needs}" if needs else ""),
                            needs=needs,
                        )
                        counts["done"] += 1
                        extra = {"needs": needs} if needs else {}
                        self.events.emit(
                            "action_skipped",
                            build_event,
                            action=nxt,
                            label=graph.actions[nxt].label,
                            because=action_id,
                            **extra,
                        )

        pool = ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="rsi-exec")
        self._committer = GroupCommitter(self.store)
        self._commits: list[tuple[str, Future]] = []
        self._commit_of: dict[str, Future] = {}
        # NB: an executed action is reported finished only once its action-cache entry is
        # durable, so "finished" in the event stream always means "will not run again", even
        # if rsi is SIGKILLed the next moment
        committing: dict[Future, tuple] = {}
        self.store.sync_each = False
        try:
            while ready or to_execute or running or committing:
                while ready and not stopped:
                    action_id = ready.popleft()
                    spec = graph.actions[action_id]
                    try:
                        action = self.resolve(spec, outcomes)
                    except RsiError as exc:
                        self._fail(action_id, spec, None, exc, build_event, finish)
                        stopped = stopped or not self.keep_going
                        continue
                    served = self.store.get_action_result(action.key())
                    status = "hit"
                    if served is None or not served.ok:
                        served, status = self._remote_get(action, build_event), "remote_hit"
                    gone = served is not None and not self._still_there(action)
                    if gone:
                        served = None
                    if served is not None:
                        if status == "remote_hit":
                            # NB: keep it locally too, so the next build needs no round trip
                            self._commits.append(
                                (
                                    action_id,
                                    self._committer.submit(
                                        self.store.put_action_result, action.key(), served
                                    ),
                                )
                            )
                        counts["hit"] += 1
                        self._record(spec, action)
                        if status == "hit":
                            # NB: summarised (`actions_cached`), listed only when asked for
                            self.events.hit(
                                build_event, action_id, spec.label, spec.mnemonic, str(action.key())
                            )
                        else:
                            self.events.emit(
                                "action_finished",
                                build_event,
                                action=action_id,
                                label=spec.label,
                                mnemonic=spec.mnemonic,
                                key=str(action.key()),
                                cache=status,
                                status="ok",
                            )
                        finish(action_id, Outcome(action_id, status, action.key(), served))
                        continue
                    unmet = self._unmet(action)
                    if unmet is not None:
                        required = self.required is None or action_id in self.required
                        self._incompatible(action_id, spec, action, unmet, build_event, finish)
                        stopped = stopped or (required and not self.keep_going)
                        continue
                    why = self.why(spec, action)
                    if gone:
                        why = ["what this host step built is no longer in the store"]
                    to_execute.append((spec, action, why, 0))
                # dispatch within resource classes
                while to_execute and not stopped and not exclusive_running:
                    spec, action, why, _ = to_execute[0]
                    if action.exclusive and running:
                        break
                    if len(running) >= self.jobs:
                        break
                    to_execute.popleft()
                    ev = self.events.emit(
                        "action_started",
                        build_event,
                        action=spec.id,
                        label=spec.label,
                        mnemonic=spec.mnemonic,
                        key=str(action.key()),
                        cache="miss",
                        why=why,
                        exclusive=action.exclusive,
                    )
                    fut = pool.submit(self._execute, spec, action, ev)
                    running[fut] = (spec, action, why, ev)
                    counts["running"] = len(running)
                    if action.exclusive:
                        exclusive_running = True
                    self.events.draw(spec.label)
                if stopped and not running and not committing:
                    break
                if not running and not committing:
                    if not ready and to_execute and stopped:
                        break
                    continue
                if not running and not ready and not to_execute:
                    # NB: only commits are left: nothing more will join their batch
                    self._committer.hurry()
                done, _ = wait([*running, *committing], timeout=0.5, return_when=FIRST_COMPLETED)
                # NB: in dispatch order, so a producer's "ok" precedes its dependents' when
                # both land in one commit batch
                for fut in sorted(done, key=lambda f: (committing.get(f) or running[f])[3]):
                    if fut in committing:
                        spec, action, why, ev, result = committing.pop(fut)
                        exc = fut.exception()
                        if exc is not None:
                            msg = exc.message if isinstance(exc, RsiError) else str(exc)
                            self._unstored(
                                spec.id,
                                spec.label,
                                action.key(),
                                ev,
                                f"result not stored: {msg}",
                                outcomes,
                            )
                            stopped = stopped or not self.keep_going
                            continue
                        counts["executed"] += 1
                        self._record(spec, action)
                        self._missed_finished(
                            ev,
                            spec,
                            action,
                            "ok",
                            why=why,
                            wall_s=result.timing.get("wall_s"),
                            executor=result.executor,
                        )
                        self.events.draw(spec.label)
                        continue
                    spec, action, why, ev = running.pop(fut)
                    counts["running"] = len(running)
                    if action.exclusive:
                        exclusive_running = False
                    try:
                        result = fut.result()
                    except RsiError as exc:
                        self._fail(spec.id, spec, action, exc, ev, finish)
                        stopped = stopped or not self.keep_going
                        continue
                    except Exception as exc:  # NB: an executor's bug or a raw OS/SDK error
                        err = ExecutionError(f"{type(exc).__name__}: {exc}")
                        self._fail(spec.id, spec, action, err, ev, finish)
                        stopped = stopped or not self.keep_going
                        continue
                    if result.ok:
                        # NB: dependents go on at once with the result in memory; the event
                        # that reports it finished waits until its entry is durable
                        committing[self._commit_of.pop(spec.id)] = (spec, action, why, ev, result)
                        finish(spec.id, Outcome(spec.id, "executed", action.key(), result, why))
                        continue
                    else:
                        counts["failed"] += 1
                        message = result.failure or f"exited with code {result.exit_code}"
                        tail = self._stderr_tail(result)
                        if tail:
                            message += "\n" + tail
                        self._missed_finished(
                            ev,
                            spec,
                            action,
                            "failed",
                            message=message,
                            exit_code=result.exit_code,
                            timed_out=result.timed_out,
                            # NB: scratch_limit or memory_limit (rsi.limits), else null
                            reason=(result.host.get("limits") or {}).get("exceeded"),
                            stderr=str(result.stderr) if result.stderr else None,
                        )
                        finish(
                            spec.id,
                            Outcome(spec.id, "failed", action.key(), result, why, message=message),
                        )
                        stopped = stopped or not self.keep_going
                    self.events.draw(spec.label)
        except BaseException:
            self.cancel.set()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            self.host_lock.close()
            try:
                self._committer.shutdown()
            finally:
                self.store.sync_each = True
            TRASH.drain()
            try:
                self._write_pack()
                self.store.target_index.save(self.index_updates)
            finally:
                self.store.save_memos()
        for action_id, fut in self._commits:
            if not fut.done():  # NB: the build stopped before it could be awaited
                continue
            exc = fut.exception()
            if exc is not None:
                message = str(exc) if isinstance(exc, RsiError) else f"{type(exc).__name__}: {exc}"
                self._unstored(
                    action_id,
                    graph.actions[action_id].label,
                    outcomes[action_id].key,
                    build_event,
                    f"result not stored: {message}",
                    outcomes,
                )
        for action_id in wanted:
            if action_id not in outcomes:
                outcomes[action_id] = Outcome(
                    action_id, "not_started", message="not started: the build stopped at a failure"
                )
        return outcomes

    def _missed_finished(self, parent, spec, action, status: str, **fields) -> None:
        self.events.emit(
            "action_finished",
            parent,
            action=spec.id,
            label=spec.label,
            mnemonic=spec.mnemonic,
            key=str(action.key()),
            cache="miss",
            status=status,
            **fields,
        )

    def _unstored(self, action_id, label, key, parent, message: str, outcomes) -> None:
        """A result that could not be kept: an error (retryable), though dependents may already
        have used it in memory."""
        self.events.counts["failed"] += 1
        outcomes[action_id] = Outcome(action_id, "error", key, message=message, retryable=True)
        self.events.emit(
            "action_finished",
            parent,
            action=action_id,
            label=label,
            key=str(key) if key else None,
            status="error",
            message=message,
            retryable=True,
        )

    def _stderr_tail(self, result: ActionResult, lines: int = 15) -> str:
        if result.stderr is None or result.stderr.size == 0:
            return ""
        try:
            text = self.store.read_bytes(result.stderr).decode("utf-8", "replace")
        except RsiError:
            return ""
        return "\n".join("    | " + ln for ln in text.rstrip().splitlines()[-lines:])

    def _remote_get(self, action: Action, parent: int) -> ActionResult | None:
        if self.remote is None:
            return None
        try:
            return self.remote.get(action, self.store)
        except RsiError as exc:
            if not self.remote_fallback:
                raise
            self.events.emit(
                "warning",
                parent,
                message=f"remote cache unavailable, building locally: {exc.message}",
            )
            self.remote = None
            return None

    def _still_there(self, action: Action) -> bool:
        """A host step's cached result stands only while what it built (a toolchain's tree,
        beside the CAS) is in the store; every other result is self-contained."""
        return host_step_kind(action) is None or host_step_present(action, self.store)

    def _unmet(self, action: Action) -> tuple[str, str] | None:
        if self._capabilities is None:
            return None
        if self._known_capabilities is None:
            self._known_capabilities = self._capabilities()
        return unmet_requirement(dict(action.platform), self._known_capabilities)

    def _incompatible(self, action_id, spec, action, unmet, parent, finish) -> None:
        """Not run: the executor lacks what the action's platform asks for."""
        prop, value = unmet
        have = sorted((self._known_capabilities or {}).get(prop, ()))
        executor = getattr(self.executor, "name", "local")
        message = (
            f"needs {value}: the {executor} executor on this host has no {prop}={value} "
            f"({prop}: {', '.join(have) or 'none'})"
        )
        if self.required is None or action_id in self.required:
            self.events.counts["failed"] += 1
        self.events.emit(
            "action_skipped",
            parent,
            action=action_id,
            label=spec.label,
            because=None,
            needs=value,
            message=message,
        )
        finish(
            action_id,
            Outcome(action_id, "incompatible", action.key(), message=message, needs=value),
        )

    def _execute(self, spec: ActionSpec, action: Action, parent: int | None = None) -> ActionResult:
        # NB: a host step (a toolchain build: network, root) runs here whatever the executor
        runner = HOST_STEPS if host_step_kind(action) else self.executor
        if self.remote is not None or not getattr(runner, "copies_sources", False):
            # NB: a local executor copies sources from the workspace itself (verified against
            # their digests); only a remote cache or executor needs them in the store first
            self._upload_sources(spec, action)
        if getattr(runner, "name", "") == "remote":
            result = runner.run(action, self.store, self.cancel)
        else:
            # NB: `exclusive` must hold across every rsi process on this host (two agents, two
            # CI jobs), not only inside this scheduler: timing actions take the host lock alone
            waiter = _LockWaiter(self.events, self.host_lock, spec, action.exclusive, parent)
            with self.host_lock.slot(
                action.exclusive, spec.label, cancel=self.cancel, on_wait=waiter
            ):
                waiter.acquired()
                result = runner.run(action, self.store, self.cancel)
        if result.ok and not result.cacheable:
            # NB: the action said its outputs must not be served again: nothing is written to
            # the action cache (nor uploaded); the "finished" event needs no commit to wait for
            done: Future = Future()
            done.set_result(None)
            self._commit_of[spec.id] = done
        elif result.ok:
            # NB: the action-cache entry (temp, fsync, rename) is written by one committer
            # thread, off the critical path; dependents use the in-memory result meanwhile.
            self._commit_of[spec.id] = self._committer.submit(self._commit, action, result)
        return result

    def _commit(self, action: Action, result: ActionResult) -> None:
        self.store.put_action_result(action.key(), result)
        if self.remote is not None:
            try:
                self.remote.put(action, result, self.store)
            except RsiError as exc:
                if not self.remote_fallback:
                    raise
                self.events.emit("warning", None, message=f"remote upload failed: {exc.message}")

    def _fail(self, action_id, spec, action, exc: RsiError, parent, finish) -> None:
        self.events.counts["failed"] += 1
        retryable = isinstance(exc, (ExecutionError, StoreError, CorruptEntry))
        self.events.emit(
            "action_finished",
            parent,
            action=action_id,
            label=spec.label,
            mnemonic=spec.mnemonic,
            key=str(action.key()) if action else None,
            status="error",
            message=str(exc),
            retryable=retryable,
        )
        finish(
            action_id,
            Outcome(
                action_id,
                "error",
                action.key() if action else None,
                message=str(exc),
                retryable=retryable,
            ),
        )


class _Settled(dict):
    """The run's outcomes, falling back to outcomes settled before it (made on first use)."""

    def __init__(self, known: Mapping[str, Outcome]) -> None:
        super().__init__()
        self._known = known

    def __missing__(self, action_id: str) -> Outcome:
        outcome = self._known[action_id]
        self[action_id] = outcome
        return outcome

    def output(self, producer: str, path: str) -> tuple[Digest, bool] | None:
        """(digest, executable) of `producer`'s output `path` when the settled outcomes can say
        without making an outcome (rsi.incremental.StateOutcomes.output); None otherwise."""
        if dict.__contains__(self, producer):
            return None
        fast = getattr(self._known, "output", None)
        return fast(producer, path) if fast is not None else None


_HURRY = object()  # NB: a GroupCommitter queue item: stop lingering, write the batch now


class GroupCommitter:
    """Writes action-cache entries on one thread, in batches, each batch after one `sync()` of
    the store: the blobs an entry names are durable before the entry is, at the price of one
    sync per batch instead of one fsync per file. A batch is whatever queued meanwhile, so it
    grows by itself when actions finish faster than entries are written."""

    def __init__(self, store: LocalStore) -> None:
        self.store = store
        self.used = False
        self.linger_s = 0.02
        self._hurried = False
        self._queue: "queue.Queue" = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="rsi-commit", daemon=True)
        self._thread.start()

    def submit(self, fn, *args) -> Future:
        self.used = True
        fut: Future = Future()
        self._hurried = False
        self._queue.put((fut, fn, args))
        return fut

    def hurry(self) -> None:
        """Write what is queued now, without waiting for more to join the batch (the
        scheduler has nothing left running)."""
        if not self._hurried:
            self._hurried = True
            self._queue.put(_HURRY)

    def _run(self) -> None:
        stop = False
        while not stop:
            item = self._queue.get()
            if item is None:
                break
            if item is _HURRY:
                continue
            batch = [item]
            # NB: a short linger lets a batch form (one sync for many entries instead of one
            # each). It delays only the "finished" events: dependents use results in memory.
            deadline = time.monotonic() + self.linger_s
            while True:
                try:
                    nxt = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                if nxt is _HURRY:
                    break
                batch.append(nxt)
            try:
                self.store.sync()
            except OSError as exc:
                for fut, _, _ in batch:
                    fut.set_exception(StoreError(f"cannot sync the store: {exc}"))
                continue
            done: list[tuple[Future, object, BaseException | None]] = []
            for fut, fn, args in batch:
                try:
                    done.append((fut, fn(*args), None))
                except BaseException as exc:  # NB: reported per action by the scheduler
                    done.append((fut, None, exc))
            try:
                self.store.sync()  # NB: the entries themselves, before anyone is told "ok"
            except OSError as exc:
                done = [
                    (f, None, e or StoreError(f"cannot sync the store: {exc}")) for f, _, e in done
                ]
            for fut, value, exc in done:
                if exc is None:
                    fut.set_result(value)
                else:
                    fut.set_exception(exc)

    def shutdown(self) -> None:
        self._queue.put(None)
        self._thread.join()
        if self.used:  # NB: a no-op build wrote nothing that needs a sync
            try:
                self.store.sync()
            except OSError:
                pass


def _wait_text(seconds: float) -> str:
    seconds = int(seconds)
    return f"waited {seconds}s" if seconds < 60 else f"waited {seconds // 60}m{seconds % 60:02d}s"


class _LockWaiter:
    """Tells people and the event stream who holds the host lock an action waits for: a
    `host_lock_wait` event whenever the holders change, one short progress line (redrawn in
    place on a terminal; elsewhere a line when the wait starts, when the holder changes at most
    every `CHANGE_S`, and every `HEARTBEAT_S`), and `host_lock_acquired` once it is taken."""

    CHANGE_S = 5.0
    HEARTBEAT_S = 30.0

    def __init__(self, events: EventLog, lock: HostLock, spec: ActionSpec, exclusive, parent):
        self.events, self.lock, self.spec = events, lock, spec
        self.exclusive, self.parent = exclusive, parent
        self.started: float | None = None
        self._seen: tuple | None = None
        self._printed: float | None = None

    def __call__(self, holders: list[Holder], waited_s: float) -> None:
        now = time.monotonic()
        if self.started is None:
            self.started = now - waited_s
        seen = tuple((h.pid, h.label, h.exclusive, h.since) for h in holders)
        changed = seen != self._seen
        self._seen = seen
        mode = "exclusive" if self.exclusive else "shared"
        if changed:
            self.events.emit(
                "host_lock_wait",
                self.parent,
                action=self.spec.id,
                label=self.spec.label,
                lock=str(self.lock.path),
                mode=mode,
                holders=[h.to_json() for h in holders],
                timeout_s=self.lock.timeout_s,
            )
        first = self._printed is None
        since = None if first else now - self._printed
        new = first or (changed and since >= self.CHANGE_S) or since >= self.HEARTBEAT_S
        where = f" ({self.lock.path})" if first else ""
        if new:
            self._printed = now
        self.events.notice(
            f"{short_label(self.spec.label)} waits for the host lock{where} ({mode}, "
            f"{_wait_text(waited_s)}): held by {describe_holders(holders)}",
            new=new,
        )

    def acquired(self) -> None:
        if self.started is None:
            return
        self.events.emit(
            "host_lock_acquired",
            self.parent,
            action=self.spec.id,
            label=self.spec.label,
            waited_s=round(time.monotonic() - self.started, 3),
        )


def diff_descriptions(before: dict, after: dict) -> list[str]:
    """Name each field that differs between two action descriptions."""
    reasons: list[str] = []
    b_in, a_in = before.get("inputs", {}), after.get("inputs", {})
    for path in sorted(set(b_in) | set(a_in)):
        if path not in b_in:
            reasons.append(f"input {path} added")
        elif path not in a_in:
            reasons.append(f"input {path} removed")
        elif b_in[path] != a_in[path]:
            old, new = b_in[path], a_in[path]
            if old[:2] != new[:2]:
                reasons.append(
                    f"input {path} content changed ({str(old[0])[:12]} -> {str(new[0])[:12]})"
                )
            else:
                reasons.append(f"input {path} executable bit changed")
    b_env, a_env = before.get("env", {}), after.get("env", {})
    for k in sorted(set(b_env) | set(a_env)):
        if b_env.get(k) != a_env.get(k):
            reasons.append(f"env {k} changed ({b_env.get(k)!r} -> {a_env.get(k)!r})")
    for name in ("argv", "outputs", "platform", "timeout_s", "salt", "digest_function"):
        if before.get(name) != after.get(name):
            if name == "salt":
                reasons.append("salt changed (every action key was invalidated)")
            else:
                reasons.append(f"{name} changed")
    return reasons
