"""Paired timing of baseline vs candidate (A/A calibration when both are the same tree). It must
never let candidate code run in its own process, nor import rsi or rules.

This process is the referee. It draws a secret seed from the OS, generates every input itself
(warm-up and timed draws differ; both arms of a pair get the identical sequence), hands each
input to the arm's worker only when that call starts, reads its own clock around handing the
input over and taking the output back, and checks every timed output against the oracle
outside the timed region. Pair i runs AB when i is even and BA when odd, in two sandboxes the
arms swap every pair; on a CPU the two arms' timed calls alternate (A B B A ...) with the idle
arm's sandbox stopped (run_pair). Raw per-call nanoseconds are the evidence. Exits 2 only for
a harness fault before any candidate code ran: from the first import on, anything that goes
wrong on the referee's side is the candidate arm's failure `referee_error`, with the evidence
written; a call whose CPU figures could not be read (`cpu_unread`) fails its arm.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _load(name: str, stem: str):
    path = Path(__file__).resolve().parent / f"{stem}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


C = _load("_rsi_harness_common", "_common")
R = _load("_rsi_harness_referee", "referee")
IMP = _load("_rsi_harness_imports", "imports")
S = _load("_rsi_harness_stats", "stats")
Q = _load("_rsi_harness_sequential", "sequential")
np = C.np

SCHEMA = "rsi.measure/1"
ARMS = ("baseline", "candidate")
IPC_PROBES = 7
# NB: CPU time is read from the worker's process tree at clock-tick resolution for reaped
# children; the slack covers that, start-up and the worker's own bookkeeping between calls.
# The worker may use `threads` CPUs from the moment it is asked to arm for a call until the
# call ends (an armed worker spins waiting for the input; a referee kept off its CPU by other
# work makes that wait long: counting only the timed part failed an A/A run as cpu_overuse)
CPU_FACTOR, CPU_SLACK_NS = 1.1, 20_000_000
# NB: and, to the ns, the CPU clocks of the worker's processes read just outside each call
# against the wall time between the two reads: all their threads together can use at most
# `threads` times that (the allowance only covers the two clocks' rounding). A fixed per-arm
# allowance let a candidate split its short calls over two threads unseen (two_threads)
CALL_CPU_FACTOR, CALL_CPU_SLACK_NS = 1.02, 20_000
# NB: and the CPU of everything in the worker but its calling thread (other threads, helper
# processes, reaped ones too) during its calls: at most `threads - 1` times the calls' wall,
# so on a threads = 1 binding none, independent of wall time: on a host busy enough that
# helpers get less than a CPU, the share of the wall above could not tell them apart
# (extra_threads). Reaped helpers count in clock ticks: two ticks of allowance per arm.
HELPER_TICKS = 2
EARLY_STOP_PAIRS, EARLY_STOP_FACTOR = 8, 1.5
REF_CACHE_BYTES = 512 << 20
DEFER_BYTES = 256 << 20
# NB: a timed call during which the referee or the worker waited for a CPU (another process had
# it) for more than this share of the call's wall time is contended; an arm's `contention` is
# the share of its timed calls that were (assess.py: host_busy when most pairs have an arm
# over half contended)
CALL_WAIT_MAX = 0.5


class Oracle:
    """Expected outputs for the pair being measured (kept within a memory budget)."""

    def __init__(self, oracle) -> None:
        self.oracle, self.cache, self.bytes = oracle, {}, 0

    def reference(self, key, inputs: dict) -> np.ndarray:
        if key in self.cache:
            return self.cache[key]
        try:
            ref = self.oracle.reference(**inputs)
        except Exception as exc:  # noqa: BLE001  a broken oracle is the harness's fault
            raise C.HarnessError(f"oracle.reference failed: {exc!r}") from exc
        if type(ref) is not np.ndarray or ref.dtype != np.float64 or not np.all(np.isfinite(ref)):
            raise C.HarnessError("oracle.reference must return a finite float64 numpy array")
        if self.bytes + ref.nbytes <= REF_CACHE_BYTES:
            self.cache[key] = ref
            self.bytes += ref.nbytes
        return ref

    def clear(self) -> None:
        self.cache, self.bytes = {}, 0


def make_inputs(workloads, case: dict, seed: int) -> dict:
    try:
        return workloads.make_inputs(dict(case), seed)
    except Exception as exc:  # noqa: BLE001  a broken workload is the harness's fault
        raise C.HarnessError(f"workloads.make_inputs failed: {exc!r}") from exc


def new_arm(impl: str) -> dict:
    return {
        "impl": impl,
        "valid": False,
        "reasons": [],
        "samples_ns": [],
        "input_digests": [],
        "warmup_ns": [],
        "output_digests": [],
        "wall_s": None,
        "log_tail": None,
        "cpu_ns": None,
        "calls_wall_ns": None,
        "run_delay_ns": None,
        "contention": None,
    }


def claim_problem(reply: dict, expected: dict) -> tuple[str, str] | None:
    """What the worker's own reply says is wrong (a reply is a claim; bytes are judged later)."""
    op = reply.get("op")
    if op == "raised":
        err = reply.get("error") if isinstance(reply.get("error"), dict) else {}
        return "exception", f"{err.get('type')}: {err.get('message')}"
    if op != "done" or not isinstance(reply.get("out"), dict):
        return "crash", f"protocol: unexpected reply {str(reply)[:200]}"
    meta = reply["out"]
    if (
        meta.get("problem") in ("wrong_type", "wrong_device")
        or meta.get("device") != expected["device"]
    ):
        return "wrong_type", f"returned {meta.get('type')} on {meta.get('device')}"
    if meta.get("shape") != expected["shape"]:
        return "wrong_shape", f"shape {meta.get('shape')}, expected {expected['shape']}"
    if meta.get("problem") == "wrong_dtype" or meta.get("dtype") != expected["dtype"]:
        return "wrong_dtype", f"dtype {meta.get('dtype')}, expected {expected['dtype']}"
    return None


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
                for k in range(IPC_PROBES)
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


def judge_output(
    doc: dict,
    pair: dict,
    oracle: Oracle,
    expected: dict,
    j: int,
    output: bytes,
    seen: dict,
    atol: float,
    rtol: float,
) -> bool:
    """Judge timed output j whole against the oracle; True (a reason added) when it fails."""
    out_digest = hashlib.sha256(output).hexdigest()
    doc["output_digests"].append(out_digest)
    if seen.setdefault(out_digest, pair["digests"][j]) != pair["digests"][j]:
        doc["reasons"].append(
            {
                "code": "stale_output",
                "sample": j,
                "detail": "the same output bytes came back for different inputs",
            }
        )
        return True
    ref = oracle.reference(("timed", pair["index"], j), pair["timed_inputs"][j])
    raw = np.frombuffer(
        output, dtype=np.uint16 if expected["dtype"] == "bfloat16" else np.dtype(expected["dtype"])
    ).reshape(expected["shape"])
    cmp = C.compare(C.as_float64(raw, expected["dtype"]), ref, atol, rtol)
    if not cmp["passed"]:
        doc["reasons"].append(
            {
                "code": "wrong_output",
                "sample": j,
                "detail": f"timed call {j}: {cmp['mismatched']} of {ref.size} values "
                "disagree with the oracle",
            }
        )
        return True
    return False


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
        oracle: Oracle,
        expected: dict,
        deadline: float,
    ) -> None:
        self.role, self.box, self.pair, self.spec = role, box, pair, spec
        self.oracle, self.expected, self.deadline = oracle, expected, deadline
        self.doc = new_arm(role.name)
        self.doc["sandbox"] = box.index
        self.timeout = float(spec["call_timeout_s"])
        self.atol, self.rtol = C.tolerance_for(spec, expected["dtype"])
        self.cuda = spec["device"] != "cpu"
        self.seen: dict[str, str] = {}
        self.pending: list[tuple[int, object]] = []
        # NB: the outputs are judged after the last timed call (within a memory budget), so
        # the oracle's work between calls does not leave every call on a cold cache
        self.deferred = expected["nbytes"] * 2 * len(pair["timed_packed"]) <= DEFER_BYTES
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
        problem = claim_problem(call.reply, self.expected)
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
        self.n_contended += waited > CALL_WAIT_MAX * call.elapsed_ns
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
        problem = claim_problem(call.reply, self.expected)
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
        failed = judge_output(
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
        in_calls = threads * self.call_window * CALL_CPU_FACTOR + (
            self.n_cpu_calls * CALL_CPU_SLACK_NS
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
            (threads - 1) * self.call_window * CALL_CPU_FACTOR
            + self.n_helper_calls * CALL_CPU_SLACK_NS
            + HELPER_TICKS * R.TICK_NS
        )
        if not self.cuda and self.n_helper_calls and self.helper_cpu > helpers_allowed:
            return self._fail(
                "cpu_overuse",
                None,
                f"during its calls the worker's other threads and processes (besides the "
                f"calling thread) used {self.helper_cpu / 1e6:.2f} ms of CPU: threads = "
                f"{threads} allows {helpers_allowed / 1e6:.2f} ms",
            )
        allowed = threads * self.busy_wall * CPU_FACTOR + CPU_SLACK_NS
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


def _timing(spec: dict, flush: dict | None) -> dict:
    base = {
        "referee_clock": "time.perf_counter_ns in the referee, from before the input is "
        "handed over until the output has been copied out of the worker's buffer"
    }
    if spec["device"] == "cpu":
        return dict(
            base,
            clock="perf_counter_ns",
            sync=None,
            l2_flush=None,
            samples="the referee's clock around each call",
        )
    return dict(
        base,
        clock="cuda_event",
        sync="torch.cuda.synchronize() before the end event",
        l2_flush=flush,
        wall_ns="the referee's clock around each call (bounds the event)",
        samples="elapsed time between CUDA events recorded in the worker around the "
        "call and a device-wide synchronise, in ns; refused when above the referee's",
    )


def _bandwidth(m: dict, tensor_bytes: int, pairs: list[dict], fprint: dict) -> dict:
    bytes_per_call = m.get("bytes_per_call") or tensor_bytes
    peak = fprint.get("gpu_peak_gb_s")
    doc = {
        "bytes_per_call": bytes_per_call,
        "bytes_source": "measure.bytes_per_call"
        if m.get("bytes_per_call")
        else "input and output tensor bytes",
        "peak_gb_s": peak,
        "peak_source": fprint.get("gpu_peak_source"),
    }
    for arm in ARMS:
        samples = [
            ns for p in pairs for ns in p["arms"][arm]["samples_ns"] if p["arms"][arm]["valid"]
        ]
        median = float(statistics.median(samples)) if samples else None
        doc[arm] = C.bandwidth(bytes_per_call, median, peak)
    return doc


def _early_stop(pairs: list[dict]) -> bool:
    """Stop a clearly slower candidate early: EARLY_STOP_PAIRS complete pairs, each with the
    candidate at least EARLY_STOP_FACTOR x slower (the interval then lies wholly below 1)."""
    done = [p for p in pairs if p["complete"]]
    if len(done) < EARLY_STOP_PAIRS:
        return False
    for p in done:
        b = statistics.median(p["arms"]["baseline"]["samples_ns"])
        c = statistics.median(p["arms"]["candidate"]["samples_ns"])
        if c < EARLY_STOP_FACTOR * b:
            return False
    return True


def _pair_ratio(m: dict, pair: dict) -> float:
    values = [
        S.arm_value(pair["arms"][arm]["samples_ns"], m["metric"], m.get("units_per_call"))
        for arm in ARMS
    ]
    return S.log_ratio(values[0], values[1], m["direction"])


def _look(m: dict, plan: dict, pairs: list[dict], since: int) -> dict | None:
    """The look the plan takes after these pairs (None: not a look): its interval and whether
    it stops the run. NB: a look is not valid, and stops nothing, when the measurement so far
    is host_busy or a pair since the previous look was contended: a busy host delays a
    decision, never makes one (the whole run is still judged host_busy by assess.py)."""
    done = [p for p in pairs if p["complete"]]
    look = next((lk for lk in plan["looks"] if lk["n"] == len(done)), None)
    if look is None or len(done) != len(pairs):
        return None
    out = {"n": look["n"], "c": look["c"], "spent_alpha": look["spent_alpha"]}
    interval = Q.interval_at([_pair_ratio(m, p) for p in done], look)
    out["lo"], out["hi"] = (
        (math.exp(interval[0]), math.exp(interval[1])) if interval else (None, None)
    )
    busy = C.busy_reason({"pairs": done})
    recent = [p for p in done[since:] if C.contended(p)]
    out["valid"] = not busy and not recent
    out["why_invalid"] = (
        ("host_busy so far" if busy else f"{len(recent)} contended pair(s) since the last look")
        if not out["valid"]
        else None
    )
    out["stop"] = (
        Q.decide(interval[0], interval[1], m["stop_improvement"])
        if interval and out["valid"] and look["n"] < plan["looks"][-1]["n"]
        else None
    )
    return out


def _sequential_doc(m: dict, plan: dict, taken: list[dict], pairs: list[dict]) -> dict:
    """What the evidence records of the design: the plan, the looks taken, why it stopped."""
    stop = next((lk["stop"] for lk in taken if lk["stop"]), None)
    n = sum(p["complete"] for p in pairs)
    if stop is None:
        stop = "max_pairs" if n == plan["looks"][-1]["n"] else "ended"
    return {
        "design": m["sequential"],
        "first_look": m["first_look"],
        "look_every": m["look_every"],
        "stop_confidence": m["stop_confidence"],
        "stop_improvement": m["stop_improvement"],
        "plan": [{k: lk[k] for k in ("n", "c", "spent_alpha")} for lk in plan["looks"]],
        "looks": taken,
        "stopped_at": n,
        "stop": stop,
        "method": plan["method"],
    }


def run_measure(
    task_dir: Path, baseline: Path, candidate: Path, spec: dict, work_dir: Path, secret: int
) -> dict:
    started = time.monotonic()
    m = spec["measure"]
    if "workload" not in m:
        raise C.HarnessError("spec measure section lacks 'workload'")
    case = m["workload"]
    workloads = C.load_task_module(task_dir, "workloads")
    oracle = Oracle(C.load_task_module(task_dir, "oracle"))
    impls = {"baseline": baseline, "candidate": candidate}
    digests = {arm: C.tree_digest(path) for arm, path in impls.items()}
    n_pairs, n_samples, n_warm = int(m["pairs"]), int(m["samples"]), int(m["warmups"])
    if n_pairs < 1 or n_samples < 1 or n_warm < 0:
        raise C.HarnessError("measure needs pairs >= 1, samples >= 1, warmups >= 0")
    out_dtype = case.get("out_dtype", case["dtype"])
    C.tolerance_for(spec, out_dtype)
    inputs0 = make_inputs(workloads, case, C.derive_seed(secret, "probe"))
    ref0 = oracle.reference(("probe",), inputs0)
    header0, packed0 = R.pack_inputs(C, inputs0)
    expected = {
        "shape": list(ref0.shape),
        "dtype": out_dtype,
        "device": spec["device"],
        "nbytes": int(ref0.size) * C.dtype_itemsize(out_dtype),
    }
    sizes = (len(packed0) + R.SHIFT_MAX + R.ALIGN, expected["nbytes"])
    call_bytes = C.tensor_bytes(inputs0, ref0.shape, out_dtype)
    oracle.clear()
    # NB: the measurement's own deadline, inside the action's: past it the arm running is cut
    # (a `timeout` of that arm) rather than the whole action (an infrastructure fault)
    action_s = float(spec.get("action_timeout_s") or 0) or math.inf
    deadline = started + max(30.0, 0.85 * action_s - float(spec["startup_timeout_s"]))
    roles = {name: Role(name, impls[name]) for name in ARMS}
    boxes: list[Sandbox] = []
    try:
        for index in range(2):
            boxes.append(
                Sandbox(
                    index,
                    impls,
                    spec,
                    sizes,
                    work_dir,
                    header0,
                    packed0,
                    C.worker_entry(spec, workloads),
                )
            )
        out_pairs, invalid, sequential = _run_pairs(
            spec,
            m,
            workloads,
            oracle,
            roles,
            boxes,
            expected,
            secret,
            n_pairs,
            n_samples,
            n_warm,
            deadline,
        )
    finally:
        for box in boxes:
            box.worker.kill()
    logs = [R.tail(box.log) for box in boxes]
    for p in out_pairs:
        for name in ARMS:
            arm = p["arms"][name]
            if (
                arm["reasons"]
                and arm["reasons"][0]["code"] != "not_run"
                and arm.get("sandbox") is not None
            ):
                arm["log_tail"] = logs[arm["sandbox"]]
    facts = C.device_facts(spec)
    fprint = C.fingerprint(spec, facts, C.nvidia_smi() if spec["device"] != "cpu" else None)
    calibration = baseline == candidate or digests["baseline"][0] == digests["candidate"][0]
    status = "ok"
    if invalid["candidate"]:
        status = "candidate_invalid"
    elif invalid["baseline"]:
        status = "baseline_invalid"
    early = any(p.get("stopped_early") for p in out_pairs)
    return {
        "schema": SCHEMA,
        "status": status,
        "calibration": calibration,
        "invalid": invalid,
        "baseline": {"digest": digests["baseline"][0], "files": digests["baseline"][1]},
        "candidate": {"digest": digests["candidate"][0], "files": digests["candidate"][1]},
        "measure": m,
        "threads": spec["threads"],
        "framework": spec["framework"],
        "expected_output": {k: expected[k] for k in ("shape", "dtype", "device")},
        "probe_indices": [],
        "n_pairs": n_pairs,
        "n_complete_pairs": sum(p["complete"] for p in out_pairs),
        "stopped_early": early,
        "sequential": sequential,
        "pairs": [{k: v for k, v in p.items() if k != "stopped_early"} for p in out_pairs],
        "timing": _timing(spec, None),
        "referee": {
            "isolation": {name: boxes[k].worker.mode for k, name in enumerate(ARMS)},
            "sandboxes": "two; pair i runs the baseline in sandbox i % 2 and the candidate in "
            "the other",
            "calls": "interleaved: A B B A ... within a pair, the idle arm's sandbox stopped"
            if spec["device"] == "cpu"
            else "sequential: one arm's calls, then the other's",
            "secret_seed": str(secret),
            "seed_source": "--seed (replay)" if spec.get("_seed_given") else "os.urandom",
            "ipc_overhead_ns": {
                name: int(statistics.median(boxes[k].ipc_ns)) for k, name in enumerate(ARMS)
            },
            "ipc_probes_ns": {f"sandbox{box.index}": box.ipc_ns for box in boxes},
            "cpu_limit": {
                "threads": spec["threads"],
                "factor": CPU_FACTOR,
                "slack_ns": CPU_SLACK_NS,
            },
            "call_timeout_s": float(spec["call_timeout_s"]),
            "confinement": {f"sandbox{box.index}": box.worker.confinement for box in boxes},
            "unconfined": R.unconfined() or None,
        },
        "device": facts,
        "fingerprint": fprint,
        "bandwidth": _bandwidth(m, call_bytes, out_pairs, fprint),
        "host": {
            "node": platform.node(),
            "machine": platform.machine(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "cpu_count": os.cpu_count(),
            "affinity": R.allowed_cpus() or None,
            "worker_cpus": R.worker_cpus(spec["threads"]),
            "referee_cpus": sorted(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else None,
            "loadavg_start": None,
        },
        "wall_s": round(time.monotonic() - started, 3),
        "phases_s": {"timer": round(time.monotonic() - started, 3), "judge": 0.0},
    }


def run_pair(
    runs: dict[str, ArmRun], order: list[str], n_warm: int, n_samples: int, interleave: bool
) -> list[str]:
    """Run one pair; the names of the arms that failed (at most one: the pair stops there).

    Interleaved (CPU): both workers are forked and imported, their warm-ups alternate, then
    their timed calls alternate in the order A B B A A B B A ... (A = order[0]), so both arms'
    calls of a pair sit microseconds apart and a host whose speed drifts over seconds (another
    tenant's load on a shared cache) moves both alike. While one arm's timed calls run the
    other arm's sandbox is stopped (SIGSTOP, referee.Freezer): it can take neither CPU, nor
    cache, nor memory bandwidth from them. Sequential (GPU: an idle arm's device work could
    not be stopped this way): one arm whole, then the other.
    """
    arms = [runs[name] for name in order]
    if not interleave:
        for arm in arms:
            if not (
                arm.begin()
                and all(arm.warm(k) for k in range(n_warm))
                and all(arm.timed(j) for j in range(n_samples))
                and arm.finish()
            ):
                return [arm.role.name]
        return []
    for arm in arms:
        if not arm.begin():
            return [arm.role.name]
    for k in range(n_warm):
        for arm in arms:
            if not arm.warm(k):
                return [arm.role.name]
    frozen: ArmRun | None = None
    try:
        for j in range(n_samples):
            for arm in arms if j % 2 == 0 else arms[::-1]:
                other = arms[1] if arm is arms[0] else arms[0]
                if frozen is not other:
                    if frozen is not None:
                        frozen.freezer.thaw()
                        frozen = None
                    try:
                        other.freezer.freeze()
                    except R.FreezeError as exc:
                        other.freezer.thaw()
                        other._fail(
                            "interference",
                            None,
                            f"while the other arm's calls ran: {exc}",
                            dead=True,
                        )
                        return [other.role.name]
                    frozen = other
                if not arm.timed(j):
                    return [arm.role.name]
    finally:
        if frozen is not None:
            frozen.freezer.thaw()
    for arm in arms:
        if not arm.finish():
            return [arm.role.name]
    return []


def failure_document(doc: dict, exc: BaseException) -> dict:
    """`doc` made writable (JSON-safe) with the candidate invalid as `referee_error`: what to
    write when the measured document itself could not be written."""
    safe = C.json_safe(doc)
    reason = {"code": "referee_error", "sample": None, "detail": C.error_summary(exc)}
    safe["status"] = "candidate_invalid"
    safe.setdefault("invalid", {"baseline": [], "candidate": []})
    safe["invalid"]["candidate"] = [reason, *(safe["invalid"].get("candidate") or [])]
    return safe


def _run_pairs(
    spec, m, workloads, oracle, roles, boxes, expected, secret, n_pairs, n_samples, n_warm, deadline
):
    out_pairs, invalid = [], {"baseline": [], "candidate": []}
    stopped = False
    # NB: the design is fixed before the first pair (pre-registered); "fixed" keeps the one
    # look at `pairs` and the old stop of a clearly slower candidate (_early_stop)
    plan = Q.plan(n_pairs, m["first_look"], m["look_every"], m["sequential"], m["stop_confidence"])
    sequential, taken = m["sequential"] != "fixed", []
    for i in range(n_pairs):
        if taken and taken[-1]["stop"]:
            break
        order = list(ARMS) if i % 2 == 0 else list(reversed(ARMS))
        record = {
            "index": i,
            "order": order,
            "complete": False,
            "inputs_identical": True,
            "timed_seeds": [],
            "warmup_seeds": [],
            "arms": {},
        }
        if stopped or invalid["baseline"] or invalid["candidate"]:
            why = (
                "stopped early: the candidate was at least "
                f"{EARLY_STOP_FACTOR}x slower in {EARLY_STOP_PAIRS} pairs"
                if stopped
                else "an earlier arm ended the measurement"
            )
            for name in ARMS:
                record["arms"][name] = new_arm(name)
                record["arms"][name]["reasons"].append({"code": "not_run", "detail": why})
            record["stopped_early"] = stopped
            out_pairs.append(record)
            continue
        timed_seeds = [C.derive_seed(secret, "timed", i, j) for j in range(n_samples)]
        warm_seeds = [C.derive_seed(secret, "warmup", i, k) for k in range(n_warm)]
        record["timed_seeds"], record["warmup_seeds"] = timed_seeds, warm_seeds
        timed_inputs = [make_inputs(workloads, m["workload"], s) for s in timed_seeds]

        def shifted(role: str, k: int, inputs: dict, i: int = i) -> tuple[dict, bytes]:
            shift = C.derive_seed(secret, "shift", role, i, k) % (R.SHIFT_MAX // R.ALIGN)
            return R.pack_inputs(C, inputs, shift * R.ALIGN)

        packed = [shifted("timed", j, inp) for j, inp in enumerate(timed_inputs)]
        warm = [
            shifted("warmup", k, make_inputs(workloads, m["workload"], s))
            for k, s in enumerate(warm_seeds)
        ]
        geometry = {
            n: {k: v for k, v in meta.items() if k != "at"} for n, meta in packed[0][0].items()
        }
        for h, _ in packed + warm:
            if {
                n: {k: v for k, v in meta.items() if k != "at"} for n, meta in h.items()
            } != geometry:
                raise C.HarnessError("workloads.make_inputs gave one workload different layouts")
        pair = {
            "index": i,
            "timed_inputs": timed_inputs,
            "timed_headers": [h for h, _ in packed],
            "timed_packed": [p for _, p in packed],
            "warm_headers": [h for h, _ in warm],
            "warm_packed": [p for _, p in warm],
            "digests": [C.inputs_digest(inp) for inp in timed_inputs],
        }
        runs = {
            name: ArmRun(
                roles[name],
                boxes[i % 2] if name == "baseline" else boxes[(i + 1) % 2],
                pair,
                spec,
                oracle,
                expected,
                deadline,
            )
            for name in ARMS
        }
        try:
            failed = run_pair(runs, order, n_warm, n_samples, interleave=spec["device"] == "cpu")
        except C.HarnessError:
            raise
        except Exception as exc:  # noqa: BLE001  after candidate code ran: its failure, with evidence
            runs["candidate"]._fail("referee_error", None, C.error_summary(exc), dead=True)
            failed = ["candidate"]
        for name in order:
            # NB: an arm stopped half-way because the other failed is not evidence: not_run
            if name in failed or runs[name].doc["valid"]:
                record["arms"][name] = runs[name].doc
        for name in record["arms"]:
            real = [r for r in record["arms"][name]["reasons"] if r["code"] != "not_run"]
            invalid[name].extend(dict(r, pair=i) for r in real)
        for name in ARMS:
            if name not in record["arms"]:
                record["arms"][name] = new_arm(name)
                record["arms"][name]["reasons"].append(
                    {"code": "not_run", "detail": "the other arm of this pair was invalid"}
                )
        record["complete"] = all(record["arms"][a]["valid"] for a in ARMS)
        oracle.clear()
        out_pairs.append(record)
        look = _look(m, plan, out_pairs, taken[-1]["n"] if taken else 0)
        if look is not None:
            taken.append(look)
        if not sequential and _early_stop(out_pairs):
            stopped = True
    return out_pairs, invalid, _sequential_doc(m, plan, taken, out_pairs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--task", required=True, type=Path)
    parser.add_argument("--baseline", required=True, type=Path)
    parser.add_argument("--candidate", required=True, type=Path)
    parser.add_argument("--spec", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument(
        "--seed", type=int, default=None, help="replay a run: the secret seed its evidence revealed"
    )
    args = parser.parse_args()
    out_path = args.out.resolve()
    R.harden_self()
    C.become_subreaper()
    load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    outside: dict = {}
    work_dir = Path(tempfile.mkdtemp(prefix="rsi-measure-"))
    try:
        spec = C.load_spec(args.spec)
        C.require_device(spec)
        secret = R.secret_seed() if args.seed is None else int(args.seed)
        spec["_seed_given"] = args.seed is not None
        # NB: what the judged code imports beyond the judge's identity (rules/harness/imports.py)
        # is not in the action key: judged, recorded, never cached
        outside = IMP.outside_identity(
            [args.task.resolve(), args.baseline.resolve(), args.candidate.resolve()]
        )
        R.pin_referee(int(spec["threads"]))
        doc = run_measure(
            args.task.resolve(),
            args.baseline.resolve(),
            args.candidate.resolve(),
            spec,
            work_dir,
            secret,
        )
        doc["host"]["loadavg_start"] = load_start
        doc["imports_outside_identity"] = outside
        C.kill_descendants()
        try:
            C.write_json(out_path, doc)
        except (ValueError, TypeError, RecursionError) as exc:
            doc = failure_document(doc, exc)
            C.write_json(out_path, doc)
        busy = C.busy_reason(doc)
    except C.HarnessError as exc:
        print(f"rsi harness fault (measure): {exc}", file=sys.stderr)
        return C.INFRA_EXIT
    finally:
        C.kill_descendants()
        shutil.rmtree(work_dir, ignore_errors=True)
    if busy:
        print(f"rsi measure: the host was busy, not to be cached: {busy}", file=sys.stderr)
        return C.BUSY_EXIT
    if outside:
        print(
            f"rsi measure: imports outside the judge's identity, not to be cached: {outside}",
            file=sys.stderr,
        )
        return C.BUSY_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
