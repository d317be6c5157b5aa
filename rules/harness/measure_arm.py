"""One arm of one pair, call by call: its worker sandbox (two per measurement, swapped every
pair), the fork and import, warm-ups, timed calls through the referee's clock, and the checks
every arm is held to (deferred outputs, CPU in and around its calls, contention).

It must never let an arm take a step after it failed, nor judge an output inside a clock;
a failure after candidate code ran is the arm's, never the harness's.
"""

from __future__ import annotations

import time
import runpy
from pathlib import Path


# NB: the harness's one sibling loader (siblings.py), itself run by path: no sys.path here
load_siblings = runpy.run_path(str(Path(__file__).resolve().parent / "siblings.py"))["load"]
C, R, J, D = load_siblings("_common", "referee", "measure_judge", "measure_doc")


class Role:
    """An arm: one implementation, whichever sandbox runs it in a given pair."""

    def __init__(self, name: str, impl: Path) -> None:
        self.name, self.impl = name, impl
        self.dead: dict | None = None


class Sandbox:
    """One worker sandbox for the whole measurement; a fresh worker forked per arm-run.

    NB: two sandboxes, and the arms swap them every pair: whatever makes one sandbox slower
    than the other (where its buffers and heap landed, which CPU it keeps) then falls on both
    arms equally instead of biasing one (an A/A run of a torch task was 2.4x off with a
    sandbox per arm). Both implementation folders are visible, read-only, in both; nothing one
    worker leaves behind reaches the next (its zygote empties its temp folder and kills what
    it left)."""

    def __init__(
        self,
        index: int,
        impls: dict[str, Path],
        spec: dict,
        sizes: tuple[int, int],
        work_dir: Path,
        header: dict,
        packed: bytes,
        entry: dict,
    ) -> None:
        self.index, self.spec = index, spec
        self.log = work_dir / f"sandbox{index}.log"
        self.timeout = float(spec["call_timeout_s"])
        try:
            self.worker = R.start_worker(
                framework=spec["framework"],
                device=spec["device"],
                threads=spec["threads"],
                impl_dir=impls["baseline"],
                also_visible=(impls["candidate"],),
                entry=entry,
                in_size=sizes[0],
                out_size=sizes[1],
                work_dir=work_dir,
                log_path=self.log,
                startup_timeout_s=float(spec["startup_timeout_s"]),
            )
            # NB: the cost of handing over an input and taking an output back, with no call:
            # measured before any implementation code is imported
            self.worker.fork()
            self.header = None
            self.set_layout(header)
            self.ipc_ns = sorted(
                R.timed_call(self.worker, -1 - k, packed, 0, self.timeout, echo=True).elapsed_ns
                for k in range(J.IPC_PROBES)
            )
            self.worker.end_child(self.timeout)
        except (R.WorkerStartError, R.WorkerFault) as exc:
            if hasattr(self, "worker"):
                self.worker.kill()
            raise C.HarnessError(
                f"worker sandbox {index} failed before any implementation code ran: {exc}"
            ) from exc

    def set_layout(self, header: dict) -> None:
        if header != self.header:
            self.worker.layout(header, self.timeout)
            self.header = header

    def begin(self, role: Role) -> dict | None:
        """Fork a pristine worker and import the role's implementation; the reason when that
        failed (the role's failure: its code ran)."""
        try:
            self.worker.fork()
        except R.WorkerStartError as exc:
            raise C.HarnessError(
                f"worker sandbox {self.index} could not fork before any "
                f"implementation code ran in the worker: {exc}"
            ) from exc
        self.header = None
        try:
            reply = self.worker.import_impl(self.timeout, role.impl)
        except R.WorkerFault as exc:
            role.dead = {
                "code": "timeout" if exc.code == "timeout" else "crash",
                "detail": f"while importing: {exc.detail}",
            }
            return role.dead
        if reply.get("op") == "import_failed":
            kind = reply.get("kind")
            err = reply.get("error") if isinstance(reply.get("error"), dict) else {}
            return {
                "code": "syntax_error" if kind == "syntax_error" else "import_error",
                "detail": f"{err.get('type')}: {err.get('message')}",
            }
        if reply.get("op") != "imported":
            role.dead = {"code": "crash", "detail": f"protocol: import answered {str(reply)[:200]}"}
            return role.dead
        return None


class ArmRun:
    """One arm of one pair, run step by step so that the two arms' calls can interleave:
    `begin` (fork a pristine worker, import), `warm(k)`, `timed(j)`, `finish` (judge deferred
    outputs, CPU check, end the worker). Each step returns False once the arm has failed (the
    reason is in `doc`); a failed arm takes no further step."""

    def __init__(
        self,
        role: Role,
        box: Sandbox,
        pair: dict,
        spec: dict,
        oracle: J.Oracle,
        expected: dict,
        deadline: float,
    ) -> None:
        self.role, self.box, self.pair, self.spec = role, box, pair, spec
        self.oracle, self.expected, self.deadline = oracle, expected, deadline
        self.doc = D.new_arm(role.name)
        self.doc["sandbox"] = box.index
        self.timeout = float(spec["call_timeout_s"])
        self.atol, self.rtol = C.tolerance_for(spec, expected["dtype"])
        self.cuda = spec["device"] != "cpu"
        self.seen: dict[str, str] = {}
        self.pending: list[tuple[int, object]] = []
        # NB: the outputs are judged after the last timed call (within a memory budget), so
        # the oracle's work between calls does not leave every call on a cold cache
        self.deferred = expected["nbytes"] * 2 * len(pair["timed_packed"]) <= J.DEFER_BYTES
        self.calls_wall = 0
        self.busy_wall = 0
        self.call_cpu = self.call_window = self.n_cpu_calls = 0
        self.helper_cpu, self.n_helper_calls = 0, 0
        self.ok = False
        self.started = self.cpu0 = self.probe = None
        self.delay_before = self.delay_total = self.n_contended = 0
        self.freezer: R.Freezer | None = None

    def _fail(self, code: str, sample, detail: str, dead: bool = False) -> bool:
        self.doc["reasons"].append({"code": code, "sample": sample, "detail": detail})
        if dead:
            self.role.dead = {"code": code, "detail": detail}
        self.ok = False
        self._close_wall()
        return False

    def _close_wall(self) -> None:
        if self.started is not None and self.doc["wall_s"] is None:
            self.doc["wall_s"] = round(time.monotonic() - self.started, 6)

    def _fault(self, exc: R.WorkerFault) -> bool:
        code = {"timeout": "timeout"}.get(exc.code, "crash")
        detail = (
            f"a call took longer than call_timeout_s = {self.timeout} s; the worker was killed"
            if code == "timeout"
            else exc.detail
        )
        return self._fail(code, len(self.doc["samples_ns"]), detail, dead=True)

    def _account(self, call, sample) -> bool:
        """Add the call's wall and CPU; False (the arm failed) when its CPU could not be read:
        a check that cannot be made fails (on a CPU binding; a GPU's is not checked)."""
        if call.cpu_unread and not self.cuda:
            return self._fail("cpu_unread", sample, call.cpu_unread)
        self.calls_wall += call.elapsed_ns
        self.busy_wall += call.elapsed_ns + call.armed_ns
        if call.cpu_ns is not None:
            self.call_cpu += call.cpu_ns
            self.call_window += call.cpu_window_ns
            self.n_cpu_calls += 1
        if call.helper_cpu_ns is not None:
            self.helper_cpu += call.helper_cpu_ns
            self.n_helper_calls += 1
        return True

    def begin(self) -> bool:
        failed = self.role.dead or self.box.begin(self.role)
        if failed:
            self.doc["reasons"].append(dict(failed, sample=None))
            return False
        self.started = time.monotonic()
        self.cpu0 = self.box.worker.cpu_ns()
        self.freezer = R.Freezer(self.box.worker.pid)
        self.ok = True
        return True

    def warm(self, k: int) -> bool:
        try:
            self.box.set_layout(self.pair["warm_headers"][k])
            call = R.timed_call(
                self.box.worker,
                k,
                self.pair["warm_packed"][k],
                self.expected["nbytes"],
                self.timeout,
            )
        except R.WorkerFault as exc:
            return self._fault(exc)
        if not self._account(call, None):
            return False
        self.doc["warmup_ns"].append(
            call.event_ns if self.cuda and call.event_ns is not None else call.elapsed_ns
        )
        problem = J.claim_problem(call.reply, self.expected)
        if problem:
            self.role.dead = {"code": problem[0], "detail": "an earlier call failed"}
            return self._fail(problem[0], None, f"warmup {k}: {problem[1]}")
        return True

    def timed(self, j: int) -> bool:
        doc, pair, worker = self.doc, self.pair, self.box.worker
        if self.probe is None:
            self.probe = R.DelayProbe(getattr(worker, "child_pid", None) or worker.pid)
        try:
            self.box.set_layout(pair["timed_headers"][j])
            # NB: read just before the call: between this arm's calls the other arm ran
            self.delay_before = self.probe.read()
            call = R.timed_call(
                worker, 1000 + j, pair["timed_packed"][j], self.expected["nbytes"], self.timeout
            )
        except R.WorkerFault as exc:
            return self._fault(exc)
        if not self._account(call, j):
            return False
        # NB: outside the clock; the interval also holds the call's untimed hand-shake
        waited = self.probe.read() - self.delay_before
        self.delay_total += waited
        self.n_contended += waited > J.CALL_WAIT_MAX * call.elapsed_ns
        if call.reply.get("op") == "done" and call.reply.get("i") != 1000 + j:
            return self._fail("crash", j, "protocol: a reply for another call")
        sample = call.elapsed_ns
        if self.cuda:
            if call.event_ns is None or not 0 < call.event_ns <= call.elapsed_ns:
                return self._fail(
                    "forged_timing",
                    j,
                    f"device time {call.event_ns} ns is not within the referee's "
                    f"{call.elapsed_ns} ns",
                )
            sample = call.event_ns
            doc.setdefault("wall_ns", []).append(call.elapsed_ns)
        doc["samples_ns"].append(sample)
        doc["input_digests"].append(pair["digests"][j])
        problem = J.claim_problem(call.reply, self.expected)
        if problem is None and call.output is None:
            problem = (
                "wrong_shape",
                f"{call.reply['out'].get('nbytes')} output bytes, "
                f"expected {self.expected['nbytes']}",
            )
        if problem is None and not call.inputs_intact:
            problem = ("input_modified", "an input changed during the call")
        if problem:
            return self._fail(problem[0], j, problem[1])
        self.pending.append((j, call.output))
        if not self.deferred:
            if self._judge(j, call.output):
                return False
            self.pending.clear()
        if time.monotonic() > self.deadline:
            return self._fail("timeout", j, "the measurement ran past its deadline")
        return True

    def _judge(self, j: int, output) -> bool:
        failed = J.judge_output(
            self.doc,
            self.pair,
            self.oracle,
            self.expected,
            j,
            output,
            self.seen,
            self.atol,
            self.rtol,
        )
        if failed:
            self.ok = False
            self._close_wall()
        return failed

    def finish(self) -> bool:
        """After the last timed call of both arms: contention, deferred judging (the referee's
        work, untimed), the CPU check, and the worker's end."""
        doc = self.doc
        doc["run_delay_ns"] = self.delay_total
        doc["contention"] = (
            round(self.n_contended / len(doc["samples_ns"]), 6) if doc["samples_ns"] else None
        )
        for j, output in self.pending:
            if self._judge(j, output):
                return False
        self.pending.clear()
        self._close_wall()
        worker = self.box.worker
        cpu = worker.cpu_ns() - self.cpu0
        try:
            worker.end_child(self.timeout)
        except R.WorkerFault as exc:
            return self._fail("crash", None, f"after its last call: {exc.detail}", dead=True)
        doc["cpu_ns"], doc["calls_wall_ns"] = cpu, self.calls_wall
        doc["armed_wall_ns"] = self.busy_wall
        doc["call_cpu_ns"], doc["call_cpu_window_ns"] = self.call_cpu, self.call_window
        threads = int(self.spec["threads"])
        in_calls = threads * self.call_window * J.CALL_CPU_FACTOR + (
            self.n_cpu_calls * J.CALL_CPU_SLACK_NS
        )
        if not self.cuda and self.call_cpu > in_calls:
            return self._fail(
                "cpu_overuse",
                None,
                f"during its calls the worker used {self.call_cpu / 1e6:.2f} ms of CPU in "
                f"{self.call_window / 1e6:.2f} ms: threads = {threads} allows "
                f"{in_calls / 1e6:.2f} ms",
            )
        doc["helper_cpu_ns"] = self.helper_cpu if self.n_helper_calls else None
        helpers_allowed = (
            (threads - 1) * self.call_window * J.CALL_CPU_FACTOR
            + self.n_helper_calls * J.CALL_CPU_SLACK_NS
            + J.HELPER_TICKS * R.TICK_NS
        )
        if not self.cuda and self.n_helper_calls and self.helper_cpu > helpers_allowed:
            return self._fail(
                "cpu_overuse",
                None,
                f"during its calls the worker's other threads and processes (besides the "
                f"calling thread) used {self.helper_cpu / 1e6:.2f} ms of CPU: threads = "
                f"{threads} allows {helpers_allowed / 1e6:.2f} ms",
            )
        allowed = threads * self.busy_wall * J.CPU_FACTOR + J.CPU_SLACK_NS
        if not self.cuda and cpu > allowed:
            return self._fail(
                "cpu_overuse",
                None,
                f"the worker used {cpu / 1e6:.1f} ms of CPU in {self.calls_wall / 1e6:.1f} ms "
                f"of calls ({self.busy_wall / 1e6:.1f} ms armed or calling); threads = "
                f"{self.spec['threads']} allows {allowed / 1e6:.1f} ms",
            )
        doc["valid"] = True
        return True
