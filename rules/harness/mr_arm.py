"""One arm of one multi-rank pair (ArmRun): the arm-run's ranks forked in its sandbox, the
implementation imported, warm-ups and timed lockstep calls, every rank's output judged outside
the clock, the ranks' CPU held to world_size x (threads + 1) of the armed wall time.

It must never let a sandbox an implementation left unusable be a harness fault (Damaged names
that arm), nor judge an output inside a clock.
"""

from __future__ import annotations

import hashlib
import runpy
import time
from pathlib import Path

import numpy as np


# NB: the harness's one sibling loader (siblings.py), itself run by path: no sys.path here
load_siblings = runpy.run_path(str(Path(__file__).resolve().parent / "siblings.py"))["load"]
C, R, J, D, S, TASK, LS = load_siblings(
    "_common", "referee", "measure_judge", "measure_doc", "mr_sandbox", "mr_task", "mr_lockstep"
)


CPU_FACTOR, CPU_SLACK_NS = 1.1, 50_000_000


class Damaged(Exception):
    """The sandbox could not be made ready for an arm-run after `arm`'s code ran in it."""

    def __init__(self, arm: str, detail: str) -> None:
        super().__init__(detail)
        self.arm, self.detail = arm, detail


class ArmRun:
    """One arm of one pair in one sandbox, start to end (the arms of a pair run one after the
    other: a stopped sandbox would stall a collective, see SPEC.md)."""

    def __init__(self, name, impl, box, pair, spec, oracle, expected, deadline, world):
        self.name, self.impl, self.box, self.pair, self.spec = name, impl, box, pair, spec
        self.oracle, self.expected, self.deadline, self.world = oracle, expected, deadline, world
        self.timeout = float(spec["call_timeout_s"])
        self.cuda = spec["device"] != "cpu"
        self.doc = D.new_arm(name)
        self.doc.update(
            sandbox=box.index,
            rank_samples_ns=[],
            slowest_rank=[],
            run_delay_ns=0,
            rank_run_delay_ns=[0] * world,
            referee_run_delay_ns=0,
        )
        self.busy = self.calls = self.n_contended = 0
        self.imported = False

    def fail(self, code: str, sample, detail: str, rank=None) -> bool:
        self.doc["reasons"].append({"code": code, "sample": sample, "detail": detail, "rank": rank})
        return False

    def fault(self, exc: R.WorkerFault, sample) -> bool:
        code = exc.code if exc.code in ("timeout", "exception") else "crash"
        return self.fail(code, sample, exc.detail, getattr(exc, "ranks", [None])[0])

    def _problem(self, res: LS.Lockstep, j, timed: bool) -> bool:
        """True (a reason added) when some rank's reply or output is wrong in form."""
        for r, call in enumerate(res.calls):
            exp = self.expected[r]
            problem = J.claim_problem(call.reply, exp)
            if problem is None and timed and call.output is None:
                problem = ("wrong_shape", f"{call.reply['out'].get('nbytes')} output bytes")
            if problem is None and timed and not call.inputs_intact:
                problem = ("input_modified", "an input changed during the call")
            if problem:
                where = f"timed call {j}" if timed else f"warmup {j}"
                return not self.fail(
                    problem[0], j if timed else None, f"rank {r}, {where}: {problem[1]}", r
                )
        return False

    def run(self, n_warm: int, n_samples: int) -> bool:
        started = time.monotonic()
        before = self.box.last_arm
        try:
            self.box.fork(self.name)
        except R.WorkerStartError as exc:
            # NB: the sandbox forked ranks before (the IPC probe); when an implementation ran in
            # it since, that implementation left it unusable: its failure, not a harness fault
            if before is not None:
                raise Damaged(before, f"after the {before}'s arm-run in it: {exc}") from exc
            raise C.HarnessError(
                f"rank sandbox {self.box.index} could not fork before any implementation code "
                f"ran: {exc}"
            ) from exc
        ok = self._run(n_warm, n_samples)
        self.doc["wall_s"] = round(time.monotonic() - started, 6)
        return ok

    def _call(self, index: int, headers: list[dict], packed: list[bytes]) -> LS.Lockstep:
        for ch, header in zip(self.box.channels, headers, strict=True):
            ch.set_layout(header, self.timeout)
        res = LS.lockstep_call(
            self.box, index, packed, [e["nbytes"] for e in self.expected], self.timeout
        )
        self.busy += res.busy_ns
        self.calls += res.sample_ns
        return res

    def _contention(self, res: LS.Lockstep, waited: list[int]) -> None:
        """A call during which any rank waited for a CPU (another process had it) for more
        than CALL_WAIT_MAX of its wall time is contended (measure.py's rule)."""
        doc = self.doc
        doc["referee_run_delay_ns"] += waited[0]
        for r, ns in enumerate(waited[1:]):
            doc["rank_run_delay_ns"][r] += ns
        doc["run_delay_ns"] += sum(waited)
        # NB: the ranks decide: an outside process taking a core keeps a rank off it. The
        # referee sleeps between polls and needs a CPU to see a rank finish; with as many
        # ranks as cores it waits behind its own ranks, which is no outsider (recorded apart)
        self.n_contended += max(waited[1:]) > J.CALL_WAIT_MAX * res.sample_ns
        doc["contention"] = round(self.n_contended / (len(doc["samples_ns"]) + 1), 6)

    def _run(self, n_warm: int, n_samples: int) -> bool:
        doc, pair = self.doc, self.pair
        self.imported = True
        failed = self.box.import_impl(self.impl)
        if failed:
            return self.fail(failed[0], None, failed[1])
        cpu0 = self.box.cpu_ns()
        outputs = []
        try:
            for k in range(n_warm):
                res = self._call(k, pair["warm_headers"][k], pair["warm_packed"][k])
                doc["warmup_ns"].append(res.sample_ns)
                if self._problem(res, k, timed=False):
                    return False
            for j in range(n_samples):
                # NB: per call, outside the clock: the ranks' threads as they are now
                probe = S.RankDelay(self.box)
                delay0 = probe.read()
                res = self._call(1000 + j, pair["timed_headers"][j], pair["timed_packed"][j])
                self._contention(res, [b - a for a, b in zip(delay0, probe.read(), strict=True)])
                sample = res.sample_ns
                if self.cuda:
                    events = [c.event_ns for c in res.calls]
                    if any(
                        e is None or not 0 < e <= c.elapsed_ns
                        for e, c in zip(events, res.calls, strict=True)
                    ):
                        return self.fail("forged_timing", j, "a device time above the referee's")
                    sample = max(events)
                    doc.setdefault("wall_ns", []).append(res.sample_ns)
                doc["samples_ns"].append(sample)
                doc["rank_samples_ns"].append(list(res.done_ns))
                doc["slowest_rank"].append(res.slowest)
                doc["input_digests"].append(pair["digests"][j])
                if self._problem(res, j, timed=True):
                    return False
                outputs.append([c.output for c in res.calls])
                if time.monotonic() > self.deadline:
                    return self.fail("timeout", j, "the measurement ran past its deadline")
        except R.WorkerFault as exc:
            return self.fault(exc, len(doc["samples_ns"]))
        # NB: outside every clock: judge every timed output of every rank
        seen: dict[str, str] = {}
        for j, outs in enumerate(outputs):
            digest = hashlib.sha256(b"".join(outs)).hexdigest()
            doc["output_digests"].append(digest)
            if seen.setdefault(digest, pair["digests"][j]) != pair["digests"][j]:
                return self.fail(
                    "stale_output", j, "the same output bytes came back for different inputs"
                )
            ref = self.oracle.reference(("timed", pair["index"], j), pair["timed_inputs"][j])
            for r, out in enumerate(outs):
                exp = self.expected[r]
                raw = np.frombuffer(
                    out, dtype=np.uint16 if exp["dtype"] == "bfloat16" else np.dtype(exp["dtype"])
                ).reshape(exp["shape"])
                want = TASK.rank_expected(self.oracle.oracle, ref, r, self.world)
                atol, rtol = C.tolerance_for(self.spec, exp["dtype"])
                cmp = C.compare(C.as_float64(raw, exp["dtype"]), want, atol, rtol)
                if not cmp["passed"]:
                    return self.fail(
                        "wrong_output",
                        j,
                        f"rank {r}, timed call {j}: {cmp['mismatched']} of {want.size} values "
                        "disagree with the oracle",
                        r,
                    )
        cpu = self.box.cpu_ns() - cpu0
        try:
            self.box.end_ranks()
        except R.WorkerFault as exc:
            return self.fail("crash", None, f"after its last call: {exc.detail}")
        threads = int(self.spec["threads"])
        # NB: per rank its threads and one more for the backend's own (gloo's I/O thread)
        allowed = self.world * (threads + 1) * self.busy * CPU_FACTOR + CPU_SLACK_NS
        doc.update(cpu_ns=cpu, calls_wall_ns=self.calls, armed_wall_ns=self.busy)
        if not self.cuda and cpu > allowed:
            return self.fail(
                "cpu_overuse",
                None,
                f"the ranks used {cpu / 1e6:.1f} ms of CPU in {self.busy / 1e6:.1f} ms armed or "
                f"calling; {self.world} ranks x (threads = {threads} + 1) allow "
                f"{allowed / 1e6:.1f} ms",
            )
        doc["valid"] = True
        return True
