"""The scheduler: runs exactly the actions whose key is not cached, in dependency order, in
parallel within resource classes, and says for every miss why it missed.

Early cutoff falls out of the keys: a consumer's key is computed from its producers' output
digests, so a rebuilt producer with identical outputs leaves its consumers cached. Exclusive
actions (timing) run with nothing else running, here and (through the host lock) in any other
rsi process. An action whose platform asks for something the executor lacks (an accelerator
the host does not have) is not run: it is `incompatible`, and so is everything downstream.
The scheduler never executes anything itself. Beside it: `action_history.py` (the target index
it records and reads for "why"), `group_commit.py` (durable action-cache entries in batches),
`lock_wait.py` (telling who holds the host lock an action waits for).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
import queue
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from rsi.action import Action, ActionResult
from rsi.action_history import ActionHistory
from rsi.analysis import BuildGraph
from rsi.digest import Digest, FileNode, SymlinkNode
from rsi.sections import CacheDamaged
from rsi.errors import CorruptEntry, ExecutionError, RsiError, StoreError
from rsi.events import EventLog
from rsi.executors.base import TRASH, Executor
from rsi.executors.hoststep import HOST_STEPS, host_step_kind
from rsi.executors.hoststep import present as host_step_present
from rsi.gc_policy import few_full_collections
from rsi.group_commit import GroupCommitter
from rsi.host import Capabilities, HostLock, unmet_requirement
from rsi.lock_wait import LockWaiter
from rsi.record import Value
from rsi.rule import ActionSpec
from rsi.store import LocalStore


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
        # NB: what each action was built as, and why a miss missed (the target index)
        self.history = ActionHistory(store)
        self.cancel = threading.Event()
        self.host_lock = host_lock if host_lock is not None else HostLock()
        self._capabilities = capabilities
        self._known_capabilities: Capabilities | None = None
        self.required = required
        # NB: source path -> (stat signature or None, hash, size) as keyed (rsi.incremental)
        self.sources_seen: dict[str, tuple] = {}
        # NB: action id -> {input path: (producer, hash, size, executable)} of every action
        # resolved with `WIDE_INPUTS` produced inputs or more: the incremental state keeps it,
        # so the next build that re-runs it reads its settled producers' outputs from one table
        # (rsi.incremental `Plan.inputs_of`), not from 10,000 producers' entries
        self.wide_inputs: dict[str, dict[str, tuple]] = {}

    # ------------------------------------------------------------------------ resolution
    def _prefetch(
        self, spec: ActionSpec, outcomes: Any, run: set[str], found: dict[str, tuple]
    ) -> Iterator[None]:
        """Fill `found` ({input path: (digest, executable)}) with `spec`'s inputs that producers
        settled before the run give (never one of `run`: the run may make it anew), a chunk of
        `PREFETCH_CHUNK` inputs per step, so the caller sees a finished action in between."""
        settled = outcomes.output if isinstance(outcomes, _Settled) else None
        if settled is None or outcomes.inputs_of(spec.id) is not None:
            return  # NB: with a table, its resolve reads them from it
        producer_of = self._graph.producer
        for n, art in enumerate(spec.inputs, 1):
            if art.producer is not None:
                producer = producer_of(art.producer)
                if producer not in run:
                    got = settled(producer, art.path)
                    if got is not None:
                        found[art.path] = got
            if n % PREFETCH_CHUNK == 0:
                yield

    def resolve(self, spec: ActionSpec, outcomes: dict[str, Outcome]) -> Action:
        inputs: dict[str, FileNode | SymlinkNode] = {}
        sources: list[tuple[str, str]] = []
        memo = self.store.file_memo
        settled = outcomes.output if isinstance(outcomes, _Settled) else None
        early = getattr(self, "_prefetched", {}).pop(spec.id, None) or {}
        # NB: the table of this action's inputs as the state recorded them (its settled
        # producers' outputs are still those: any producer that ran since re-ran it too)
        table = outcomes.inputs_of(spec.id) if settled is not None else None
        settled_ids = outcomes.settled_ids() if table is not None else None
        wide: dict[str, tuple] | None = {} if len(spec.inputs) >= WIDE_INPUTS else None
        for art in spec.inputs:
            if art.producer is not None:
                producer = self._graph.producer(art.producer)
                # NB: an output of an action the state vouched for is read from the state, not
                # through an outcome object made for it (a root of 10,000 inputs: ~150 ms)
                got = early.get(art.path)
                if got is None and table is not None:
                    row = table.get(art.path)
                    if (
                        row is not None
                        and row[0] == producer
                        and producer in settled_ids  # type: ignore[operator]
                        and not dict.__contains__(outcomes, producer)
                    ):
                        got = (Digest(row[1], row[2]), row[3])
                if got is None and settled is not None:
                    got = settled(producer, art.path)
                if got is None:
                    produced = outcomes[producer].result
                    out = produced.output_map.get(art.path) if produced else None
                    if out is None:
                        raise ExecutionError(
                            f"{spec.label}: input {art.path} was not produced by {art.producer}"
                        )
                    got = (out.digest, out.executable)
                inputs[art.path] = FileNode(got[0], got[1])
                if wide is not None:
                    wide[art.path] = (producer, got[0].hash, got[0].size, got[1])
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
        if wide is not None and len(wide) >= WIDE_INPUTS:
            self.wide_inputs[spec.id] = wide
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

    # ---------------------------------------------------------------------------- lookup
    def lookup(self, graph: BuildGraph, wanted: set[str]) -> dict[str, Outcome]:
        """What a build of `wanted` would serve from the local cache, running nothing: a `hit`
        outcome for every action whose key resolves (its producers were hits) and is cached."""
        self._graph = self.history.graph = graph
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
        with few_full_collections():
            return self._run(graph, wanted, build_event, known)

    def _run(
        self,
        graph: BuildGraph,
        wanted: set[str],
        build_event: int,
        known: Mapping[str, Outcome] | None,
    ) -> dict[str, Outcome]:
        self._graph = self.history.graph = graph
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
        # NB: with outcomes settled before the run (the incremental state's), the actions
        # waiting on others have the inputs those settled producers give looked up while the
        # main thread would only wait: a root of 10,000 inputs waiting on one re-run producer
        # is resolved from what was looked up meanwhile (~70 ms at 100,000 actions)
        self._prefetched: dict[str, dict[str, tuple]] = {}
        early = sorted((a for a, n in waiting.items() if n > 0), reverse=True) if known else []
        steps: Iterator[None] | None = None
        steps_for = ""

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
        # NB: every run and commit future, as it completes (its done callback): the loop
        # sleeps on this one queue, not on a waiter installed on each pending future per turn
        finished: queue.SimpleQueue[Future] = queue.SimpleQueue()
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
                        self.history.record(spec, action)
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
                    why = self.history.why(spec, action)
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
                    fut.add_done_callback(finished.put)
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
                if (early or steps is not None) and running:
                    try:
                        if steps is not None and waiting.get(steps_for, 0) == 0:
                            steps = None  # NB: ready now: its resolve looks up the rest
                        if steps is None and early:
                            steps_for = early.pop()
                            if waiting.get(steps_for, 0) > 0 and steps_for not in outcomes:
                                found = self._prefetched[steps_for] = {}
                                steps = self._prefetch(
                                    graph.actions[steps_for], outcomes, wanted, found
                                )
                        if steps is not None and next(steps, StopIteration) is StopIteration:
                            steps = None
                    except CacheDamaged:
                        raise
                    except Exception:  # noqa: BLE001 - NB: its resolve says what is wrong
                        steps = None
                    # NB: a moment for the running actions' threads between steps: a step
                    # holds the interpreter, and they need it to hand a result over
                    time.sleep(0)
                    done = _next_done(finished, running, committing, wait_s=0.0)
                else:
                    done = _next_done(finished, running, committing)
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
                        self.history.record(spec, action)
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
                    except CacheDamaged:
                        raise  # NB: the build's to handle (it goes again), no action's failure
                    except Exception as exc:  # NB: an executor's bug or a raw OS/SDK error
                        err = ExecutionError(f"{type(exc).__name__}: {exc}")
                        self._fail(spec.id, spec, action, err, ev, finish)
                        stopped = stopped or not self.keep_going
                        continue
                    if result.ok:
                        # NB: dependents go on at once with the result in memory; the event
                        # that reports it finished waits until its entry is durable
                        commit = self._commit_of.pop(spec.id)
                        committing[commit] = (spec, action, why, ev, result)
                        commit.add_done_callback(finished.put)
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
                self.history.flush()
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
            waiter = LockWaiter(self.events, self.host_lock, spec, action.exclusive, parent)
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


def _next_done(
    finished: queue.SimpleQueue, running: dict, committing: dict, wait_s: float = 0.5
) -> set[Future]:
    """The run and commit futures completed since the last call (waiting up to `wait_s` for
    the first): those still pending in `running` or `committing`."""
    try:
        done = {finished.get(timeout=wait_s) if wait_s > 0 else finished.get_nowait()}
    except queue.Empty:
        return set()
    while True:
        try:
            done.add(finished.get_nowait())
        except queue.Empty:
            break
    return {f for f in done if f in running or f in committing}


# NB: inputs looked up per step of `_prefetch` between looks at whether an action finished (the
# first steps load the state's shards: ~0.25 ms each at 100,000 actions)
PREFETCH_CHUNK = 32
# NB: an action with this many produced inputs or more has their table kept (`wide_inputs`)
WIDE_INPUTS = 512


class _Settled(dict):
    """The run's outcomes, falling back to outcomes settled before it (made on first use)."""

    def __init__(self, known: Mapping[str, Outcome]) -> None:
        super().__init__()
        self._known = known

    def __missing__(self, action_id: str) -> Outcome:
        outcome = self._known[action_id]
        self[action_id] = outcome
        return outcome

    def inputs_of(self, consumer: str) -> dict[str, tuple] | None:
        """The table of `consumer`'s produced inputs the settled outcomes keep, or None
        (rsi.incremental.StateOutcomes.inputs_of)."""
        fast = getattr(self._known, "inputs_of", None)
        return fast(consumer) if fast is not None else None

    def settled_ids(self) -> Any:
        """What `in` asks of the settled outcomes (their ids), without making one."""
        fast = getattr(self._known, "settled_ids", None)
        return fast() if fast is not None else self._known

    def output(self, producer: str, path: str) -> tuple[Digest, bool] | None:
        """(digest, executable) of `producer`'s output `path` when the settled outcomes can say
        without making an outcome (rsi.incremental.StateOutcomes.output); None otherwise."""
        if dict.__contains__(self, producer):
            return None
        fast = getattr(self._known, "output", None)
        return fast(producer, path) if fast is not None else None
