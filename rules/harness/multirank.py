"""The referee of a multi-rank task: `multirank.py check ...` and `multirank.py measure ...`. It
must never let a rank reach another rank, nor import rsi or rules.

A binding with `ranks = {world_size, backend, topology}` judges its candidates here instead of
check.py / measure.py, with the same documents (`rsi.check/1`, `rsi.measure/1`, plus per-rank
detail) and the same referee/worker split (rules/harness/SPEC.md, "Multi-rank"):

- One sandbox (mr_sandbox.py) holds a zygote (mr_worker.py) that forks `world_size` fresh
  workers per arm-run, one per rank, on channels made fresh for that arm-run and held by that
  rank alone; each rank is confined and joins the process group before any candidate code,
  then imports the candidate. Two sandboxes per measurement, swapped every pair.
- The referee draws every input (secret seed), computes the oracle on the whole layer
  (`workloads.make_inputs`), hands rank r only its shard (`workloads.shard_inputs(inputs, r,
  world_size)`) when the call starts, and judges every rank's output against
  `oracle.rank_output(reference, r, world_size)` (default: the whole reference).
- A call is lockstep: every rank is armed (the barrier), then the clock starts, every rank's
  input is written and the call published to all; each rank's time is read when the referee
  sees it finish; the sample is the slowest rank's. Any rank's crash, hang (past
  call_timeout_s) or wrong output is the candidate's failure, with the rank in the reason.
  How long the referee and each rank waited for a CPU is read around every timed call
  (contention, as measure.py).

Stdlib + numpy + torch. Exits 2 only for a harness fault before any candidate code ran: from
the candidate's first import on, whatever goes wrong on the referee's side is the candidate's
failure (`referee_error`), with the evidence written; a sandbox an implementation left
unusable is that implementation's failure (`sandbox_damaged`).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import math
import os
import platform
import select
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


K = _load("_rsi_harness_check", "check")
M = _load("_rsi_harness_measure", "measure")
C, R = M.C, M.R
np = C.np

BACKENDS = {"gloo": "cpu", "nccl": "cuda"}
TOPOLOGIES = ("single-host",)
MAX_WORLD = 8
POLL_S = 0.0001  # NB: after a short spin, wait on the ranks' pipes: 3 processes share 2 cores
SPIN_NS = 0
CPU_FACTOR, CPU_SLACK_NS = 1.1, 50_000_000


def ranks_of(spec: dict) -> dict:
    """The spec's `ranks`, checked: world_size 2..8, a backend for the device, one host."""
    ranks = spec.get("ranks")
    if not isinstance(ranks, dict):
        raise C.HarnessError("a multi-rank spec needs ranks = {world_size, backend, topology}")
    world = ranks.get("world_size")
    if isinstance(world, bool) or not isinstance(world, int) or not 2 <= world <= MAX_WORLD:
        raise C.HarnessError(f"ranks.world_size must be an integer from 2 to {MAX_WORLD}")
    if BACKENDS.get(ranks.get("backend")) != spec["device"]:
        raise C.HarnessError(
            f"ranks.backend {ranks.get('backend')!r} does not serve device {spec['device']!r} "
            "(gloo: cpu, nccl: cuda)"
        )
    if ranks.get("topology") not in TOPOLOGIES:
        raise C.HarnessError(f"ranks.topology must be one of {TOPOLOGIES}")
    if spec["framework"] != "torch" or not spec["entry"].get("function"):
        raise C.HarnessError("a multi-rank task is a torch task whose entry is a function")
    return ranks


# ------------------------------------------------------------------------------- sandbox

# NB: the sandbox, its zygote and the ranks' channels: mr_sandbox.py
S = _load("_rsi_harness_mr_sandbox", "mr_sandbox")
RankFault, RankSandbox, start_sandboxes = S.RankFault, S.RankSandbox, S.start_sandboxes


# ------------------------------------------------------------------------------ one call


class Lockstep:
    """One call on every rank: per-rank `calls` (referee.Call), `done_ns` (each rank's time,
    read by the referee when it saw that rank finish), `sample_ns` (the slowest rank's) and
    `busy_ns` (from the first arm request to the last output copied)."""

    def __init__(self, world: int) -> None:
        self.calls = [R.Call() for _ in range(world)]
        self.done_ns: list[int | None] = [None] * world
        self.sample_ns = None
        self.busy_ns = 0
        self.slowest = None


def lockstep_call(
    box: RankSandbox,
    index: int,
    packed: list[bytes],
    out_nbytes: list[int],
    timeout_s: float,
    echo: bool = False,
) -> Lockstep:
    """Arm every rank (the barrier: each answers, then spins), start the clock, write each
    rank's input and publish the call to all; take each rank's output and time as it finishes.

    A rank that has not finished within `timeout_s` is a `timeout` naming it; a rank that ends
    is a `crash` naming it; a finished rank whose call raised while others still wait (in a
    collective it never joined) ends the call at once: the others are named as left waiting."""
    chans = box.channels
    world = len(chans)
    res = Lockstep(world)
    for ch, n, o in zip(chans, packed, out_nbytes, strict=True):
        if len(n) > ch.in_size or o > ch.out_size:
            raise R.WorkerFault("protocol", "buffers too small for this call")
    a0 = time.perf_counter_ns()
    for ch in chans:
        ch.send({"op": "arm", "i": index, "echo": echo})
    for ch in chans:
        armed = ch.recv(timeout_s)
        if armed.get("op") != "armed" or armed.get("i") != index:
            raise RankFault("crash", [ch.rank], f"rank {ch.rank}: arm answered {str(armed)[:200]}")
    clock, unpack, pause = time.perf_counter_ns, R._SEQ.unpack_from, os.sched_yield
    outputs: list[bytes | None] = [None] * world
    t0 = clock()
    for ch, data in zip(chans, packed, strict=True):
        ch.in_buf[: len(data)] = data
    for ch in chans:
        R._SEQ.pack_into(ch.ctl, R.REQ_AT, index)
    deadline = t0 + int(timeout_s * 1e9)
    spin_until = t0 + SPIN_NS
    waiting = set(range(world))
    replies: dict[int, dict] = {}
    while waiting:
        for r in list(waiting):
            ch = chans[r]
            if unpack(ch.ctl, R.DONE_AT)[0] == index:
                outputs[r] = ch.out_buf[: out_nbytes[r]] if out_nbytes[r] else b""
                res.done_ns[r] = clock() - t0
                waiting.discard(r)
        if not waiting:
            break
        now = clock()
        if now > deadline:
            done = [r for r in range(world) if r not in waiting]
            raise RankFault(
                "timeout",
                sorted(waiting),
                f"rank(s) {', '.join(map(str, sorted(waiting)))} did not finish call {index} "
                f"within call_timeout_s = {timeout_s} s"
                + (f" (rank(s) {', '.join(map(str, done))} did)" if done else "")
                + "; the ranks were killed",
            )
        if now < spin_until:
            pause()
            continue
        # NB: a long call: wait on the pipes (a rank that wrote without publishing, or died)
        fds = {chans[r].resp_r: r for r in range(world) if r not in replies}
        ready, _, _ = select.select([*fds, box.zygote.resp_r], [], [], POLL_S)
        if box.zygote.resp_r in ready:
            box.watch()  # NB: raises, naming the rank that ended
            ready.remove(box.zygote.resp_r)
        # NB: a rank that ended is named before a rank that raised (a peer's death makes the
        # collective raise in the others)
        for fd in sorted(ready, key=lambda fd: fds[fd] not in waiting):
            r = fds[fd]
            if r in waiting and unpack(chans[r].ctl, R.DONE_AT)[0] == index:
                # NB: it finished and replied since the check above
                outputs[r] = chans[r].out_buf[: out_nbytes[r]] if out_nbytes[r] else b""
                res.done_ns[r] = clock() - t0
                waiting.discard(r)
            if r in waiting:
                try:
                    reply = chans[r].recv(1.0)
                except R.WorkerFault as exc:
                    raise RankFault("crash", [r], f"rank {r}: {exc.detail}") from exc
                raise RankFault(
                    "crash", [r], f"rank {r}: replied {str(reply)[:200]} before its call ended"
                )
            replies[r] = chans[r].recv(1.0)
            if replies[r].get("op") == "raised":
                err = replies[r].get("error") if isinstance(replies[r].get("error"), dict) else {}
                raise RankFault(
                    "exception",
                    [r],
                    f"rank {r} raised {err.get('type')}: {err.get('message')} while rank(s) "
                    f"{', '.join(map(str, sorted(waiting)))} still ran (left waiting, killed)",
                )
    t1 = clock()
    res.sample_ns = max(res.done_ns)
    res.slowest = res.done_ns.index(res.sample_ns)
    res.busy_ns = t1 - a0
    for r, ch in enumerate(chans):
        call = res.calls[r]
        call.elapsed_ns = res.done_ns[r]
        call.armed_ns = t0 - a0
        try:
            reply = replies.get(r) or ch.recv(max(1.0, timeout_s - (t1 - t0) / 1e9))
        except R.WorkerFault as exc:
            raise RankFault("crash", [r], f"rank {r}: {exc.detail}") from exc
        if unpack(ch.ctl, R.DONE_AT)[0] != index:
            raise RankFault("crash", [r], f"rank {r}: a reply before call {index} ended")
        call.reply = reply
        meta = reply.get("out") if reply.get("op") == "done" and reply.get("i") == index else None
        ok = (
            isinstance(meta, dict)
            and meta.get("problem") is None
            and meta.get("nbytes") == out_nbytes[r]
        )
        call.output = outputs[r] if ok or echo else None
        call.inputs_intact = ch.in_buf[: len(packed[r])] == packed[r]
        if isinstance(reply.get("event_ns"), int):
            call.event_ns = reply["event_ns"]
    return res


# ---------------------------------------------------------------------------- the task


def task_modules(task_dir: Path):
    workloads = C.load_task_module(task_dir, "workloads")
    oracle = C.load_task_module(task_dir, "oracle")
    if not callable(getattr(workloads, "shard_inputs", None)):
        raise C.HarnessError("a multi-rank task's workloads.py needs shard_inputs(inputs, rank, n)")
    return workloads, oracle


def rank_expected(oracle, ref: np.ndarray, rank: int, world: int) -> np.ndarray:
    split = getattr(oracle, "rank_output", None)
    if split is None:
        return ref
    try:
        out = split(ref, rank, world)
    except Exception as exc:  # noqa: BLE001  a broken oracle is the harness's fault
        raise C.HarnessError(f"oracle.rank_output failed for rank {rank}: {exc!r}") from exc
    if type(out) is not np.ndarray or out.dtype != np.float64 or not np.all(np.isfinite(out)):
        raise C.HarnessError("oracle.rank_output must return a finite float64 numpy array")
    return out


def shards(workloads, inputs: dict, world: int) -> list[dict]:
    digest = C.inputs_digest(inputs)
    try:
        out = [workloads.shard_inputs(inputs, r, world) for r in range(world)]
    except Exception as exc:  # noqa: BLE001  a broken workload is the harness's fault
        raise C.HarnessError(f"workloads.shard_inputs failed: {exc!r}") from exc
    if C.inputs_digest(inputs) != digest:
        raise C.HarnessError("workloads.shard_inputs modified the whole inputs")
    return out


# ----------------------------------------------------------------------------- check


def prepare_case(case: dict, seed: int, workloads, oracle, world: int) -> dict:
    inputs = M.make_inputs(workloads, case, seed)
    digest = C.inputs_digest(inputs)
    try:
        ref = oracle.reference(**inputs)
    except Exception as exc:  # noqa: BLE001
        raise C.HarnessError(f"oracle.reference failed on case {case['name']!r}: {exc!r}") from exc
    if type(ref) is not np.ndarray or ref.dtype != np.float64 or not np.all(np.isfinite(ref)):
        raise C.HarnessError(f"oracle output must be finite float64 ({case['name']})")
    out_dtype = case.get("out_dtype", case["dtype"])
    ranks = []
    for r, local in enumerate(shards(workloads, inputs, world)):
        header, packed = R.pack_inputs(C, local)
        expected = rank_expected(oracle, ref, r, world)
        ranks.append(
            {
                "ref": expected,
                "header": header,
                "packed": packed,
                "out_dtype": out_dtype,
                "nbytes": int(expected.size) * C.dtype_itemsize(out_dtype),
                "digest": C.inputs_digest(local),
            }
        )
    return {"seed": seed, "digest": digest, "ref": ref, "out_dtype": out_dtype, "ranks": ranks}


def _rank_record(rank: int, prep: dict) -> dict:
    return {
        "rank": rank,
        "input_digest": prep["digest"],
        "passed": False,
        "reason": None,
        "detail": None,
        "max_abs_err": None,
        "max_rel_err": None,
        "mismatched": None,
        "expected_shape": list(prep["ref"].shape),
        "output": None,
        "wall_s": None,
    }


def _settle_case(rec: dict) -> None:
    """The case's verdict from its ranks': the first failing rank's reason, naming it."""
    bad = [r for r in rec["ranks"] if not r["passed"]]
    errs = [r["max_abs_err"] for r in rec["ranks"] if r["max_abs_err"] is not None]
    rels = [r["max_rel_err"] for r in rec["ranks"] if r["max_rel_err"] is not None]
    rec["max_abs_err"] = max(errs) if errs else None
    rec["max_rel_err"] = max(rels) if rels else None
    rec["mismatched"] = sum(r["mismatched"] or 0 for r in rec["ranks"])
    walls = [r["wall_s"] for r in rec["ranks"] if r["wall_s"] is not None]
    rec["wall_s"] = max(walls) if walls else None
    rec["output"] = rec["ranks"][0]["output"]
    if not bad:
        rec.update(passed=True, reason="ok", detail=None)
        return
    first = bad[0]
    others = [r["rank"] for r in bad[1:]]
    rec.update(
        passed=False,
        reason=first["reason"],
        detail=f"rank {first['rank']}: {first['detail']}"
        + (f" (also rank(s) {', '.join(map(str, others))})" if others else ""),
        rank=first["rank"],
        failed_ranks=[r["rank"] for r in bad],
    )


def run_check(task_dir: Path, impl_dir: Path, spec: dict, work_dir: Path, secret: int) -> dict:
    started = time.monotonic()
    ranks = ranks_of(spec)
    world = int(ranks["world_size"])
    workloads, oracle = task_modules(task_dir)
    impl_digest, impl_files = C.tree_digest(impl_dir)
    drawn = K.hidden_cases(spec, secret)
    cases = list(spec["cases"]) + drawn
    for case in drawn:
        if case.get("out_dtype", case.get("dtype")) not in spec["tolerances"]:
            raise C.HarnessError(f"no tolerance for the output dtype of hidden range {case!r}")
    preps = [
        prepare_case(case, C.derive_seed(secret, "check", case["name"]), workloads, oracle, world)
        for case in cases
    ]
    records = []
    for case, prep in zip(cases, preps, strict=True):
        rec = K._record(case, dict(prep, ref=prep["ref"]))
        rec["ranks"] = [_rank_record(r, p) for r, p in enumerate(prep["ranks"])]
        records.append(rec)
    timeout = float(spec["call_timeout_s"])
    sizes = [
        (
            max(len(p["ranks"][r]["packed"]) for p in preps) + R.ALIGN,
            max(p["ranks"][r]["nbytes"] for p in preps),
        )
        for r in range(world)
    ]
    try:
        (box,) = start_sandboxes(1, spec=spec, impls=(impl_dir,), sizes=sizes, work_dir=work_dir)
    except R.WorkerStartError as exc:
        raise C.HarnessError(f"rank sandbox failed before any candidate code ran: {exc}") from exc
    try:
        try:
            box.fork()
        except R.WorkerStartError as exc:
            raise C.HarnessError(f"ranks failed before any candidate code ran: {exc}") from exc
        try:
            if _judge_cases(box, impl_dir, preps, records, spec, timeout):
                try:
                    box.end_ranks()
                except R.WorkerFault as exc:
                    records[-1].update(
                        passed=False, reason="crash", detail=f"after its last call: {exc.detail}"
                    )
        except Exception as exc:  # noqa: BLE001  the candidate was asked to import: its failure
            K.referee_error(records, exc)
    finally:
        box.kill()
    log = R.tail(box.log)
    for rec in records:
        if rec["reason"] not in (None, "ok", "not_run"):
            rec["log_tail"] = log
            break
    reasons = [
        {"code": c["reason"], "case": c["name"], "detail": c["detail"], "rank": c.get("rank")}
        for c in records
        if not c["passed"] and c["reason"] != "not_run"
    ]
    failure_kind = K.FAILURE_KIND[reasons[0]["code"]] if reasons else None
    if failure_kind is None and not all(c["passed"] for c in records):
        raise C.HarnessError("cases were left unjudged without a failure")
    return {
        "schema": K.SCHEMA,
        "status": "ok" if failure_kind is None else "candidate_failure",
        "failure_kind": failure_kind,
        "reasons": reasons,
        "impl": {
            "digest": impl_digest,
            "files": impl_files,
            "extra_files": sorted(set(impl_files) - set(spec["editable"])),
            "missing_files": sorted(set(spec["editable"]) - set(impl_files)),
        },
        "entry": spec["entry"],
        "framework": spec["framework"],
        "ranks": ranks,
        "cases": records,
        "input_digests": {c["name"]: c["input_digest"] for c in records},
        "n_cases": len(records),
        "n_passed": sum(c["passed"] for c in records),
        "n_hidden": len(drawn),
        "hidden_cases": drawn,
        "device": spec["device"],
        "fingerprint": C.fingerprint(
            spec, C.device_facts(spec), C.nvidia_smi() if spec["device"] != "cpu" else None
        ),
        "referee": {
            "isolation": box.mode,
            "ranks": f"{world} rank workers forked per check in one sandbox, lockstep calls",
            "secret_seed": str(secret),
            "seed_source": "os.urandom" if spec.get("_seed_given") is None else "--seed (replay)",
            "unconfined": S.unconfined() or None,
        },
        "wall_s": round(time.monotonic() - started, 3),
    }


def _fail_case(records: list[dict], k: int, code: str, detail: str, rank=None) -> None:
    rec = records[k]
    rec.update(passed=False, reason=code, detail=detail, rank=rank)
    for later in records[k + 1 :]:
        later.update(reason="not_run", detail="an earlier case ended the check")


def _judge_cases(box: RankSandbox, impl_dir: Path, preps, records, spec, timeout) -> bool:
    failed = box.import_impl(impl_dir)
    if failed:
        _fail_case(records, 0, failed[0], failed[1])
        return False
    for k, (prep, rec) in enumerate(zip(preps, records, strict=True)):
        try:
            for ch, rp in zip(box.channels, prep["ranks"], strict=True):
                ch.set_layout(rp["header"], timeout)
            res = lockstep_call(
                box,
                k,
                [rp["packed"] for rp in prep["ranks"]],
                [rp["nbytes"] for rp in prep["ranks"]],
                timeout,
            )
        except R.WorkerFault as exc:
            code = exc.code if exc.code in ("timeout", "exception") else "crash"
            rank = getattr(exc, "ranks", [None])[0]
            _fail_case(records, k, code, exc.detail, rank)
            return False
        for rrec, rp, call in zip(rec["ranks"], prep["ranks"], res.calls, strict=True):
            K.judge_reply(spec, rrec, rp, call)
        _settle_case(rec)
    return True


# ---------------------------------------------------------------------------- measure


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
        self.doc = M.new_arm(name)
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

    def _problem(self, res: Lockstep, j, timed: bool) -> bool:
        """True (a reason added) when some rank's reply or output is wrong in form."""
        for r, call in enumerate(res.calls):
            exp = self.expected[r]
            problem = M.claim_problem(call.reply, exp)
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

    def _call(self, index: int, headers: list[dict], packed: list[bytes]) -> Lockstep:
        for ch, header in zip(self.box.channels, headers, strict=True):
            ch.set_layout(header, self.timeout)
        res = lockstep_call(
            self.box, index, packed, [e["nbytes"] for e in self.expected], self.timeout
        )
        self.busy += res.busy_ns
        self.calls += res.sample_ns
        return res

    def _contention(self, res: Lockstep, waited: list[int]) -> None:
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
        self.n_contended += max(waited[1:]) > M.CALL_WAIT_MAX * res.sample_ns
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
                want = rank_expected(self.oracle.oracle, ref, r, self.world)
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


def run_measure(
    task_dir: Path, baseline: Path, candidate: Path, spec: dict, work_dir: Path, secret: int
) -> dict:
    started = time.monotonic()
    ranks = ranks_of(spec)
    world = int(ranks["world_size"])
    m = spec["measure"]
    if "workload" not in m:
        raise C.HarnessError("spec measure section lacks 'workload'")
    case = m["workload"]
    workloads, oracle_mod = task_modules(task_dir)
    oracle = M.Oracle(oracle_mod)
    impls = {"baseline": baseline, "candidate": candidate}
    digests = {arm: C.tree_digest(path) for arm, path in impls.items()}
    n_pairs, n_samples, n_warm = int(m["pairs"]), int(m["samples"]), int(m["warmups"])
    if n_pairs < 1 or n_samples < 1 or n_warm < 0:
        raise C.HarnessError("measure needs pairs >= 1, samples >= 1, warmups >= 0")
    out_dtype = case.get("out_dtype", case["dtype"])
    C.tolerance_for(spec, out_dtype)
    inputs0 = M.make_inputs(workloads, case, C.derive_seed(secret, "probe"))
    ref0 = oracle.reference(("probe",), inputs0)
    locals0 = shards(workloads, inputs0, world)
    expected, sizes, call_bytes = [], [], 0
    for r, local in enumerate(locals0):
        want = rank_expected(oracle_mod, ref0, r, world)
        exp = {
            "shape": list(want.shape),
            "dtype": out_dtype,
            "device": spec["device"],
            "nbytes": int(want.size) * C.dtype_itemsize(out_dtype),
        }
        expected.append(exp)
        packed = R.pack_inputs(C, local)[1]
        sizes.append((len(packed) + R.SHIFT_MAX + R.ALIGN, exp["nbytes"]))
        call_bytes += C.tensor_bytes(local, want.shape, out_dtype)
    oracle.clear()
    action_s = float(spec.get("action_timeout_s") or 0) or math.inf
    deadline = started + max(30.0, 0.85 * action_s - float(spec["startup_timeout_s"]))
    boxes: list[RankSandbox] = []
    ipc: dict[str, list[int]] = {}
    try:
        try:
            boxes = start_sandboxes(
                2, spec=spec, impls=(baseline, candidate), sizes=sizes, work_dir=work_dir
            )
        except R.WorkerStartError as exc:
            raise C.HarnessError(f"rank sandboxes failed to start: {exc}") from exc
        for box in boxes:
            ipc[f"sandbox{box.index}"] = _ipc_probe(box, locals0, expected)
        out_pairs, invalid = _run_pairs(
            spec, m, workloads, oracle, impls, boxes, expected, secret, world, deadline
        )
    finally:
        for box in boxes:
            box.kill()
    logs = [R.tail(box.log) for box in boxes]
    for p in out_pairs:
        for name in M.ARMS:
            arm = p["arms"][name]
            if arm["reasons"] and arm["reasons"][0]["code"] != "not_run":
                arm["log_tail"] = logs[arm["sandbox"]] if arm.get("sandbox") is not None else None
    facts = C.device_facts(spec)
    fprint = C.fingerprint(spec, facts, C.nvidia_smi() if spec["device"] != "cpu" else None)
    calibration = baseline == candidate or digests["baseline"][0] == digests["candidate"][0]
    status = "ok"
    if invalid["candidate"]:
        status = "candidate_invalid"
    elif invalid["baseline"]:
        status = "baseline_invalid"
    return {
        "schema": M.SCHEMA,
        "status": status,
        "calibration": calibration,
        "invalid": invalid,
        "baseline": {"digest": digests["baseline"][0], "files": digests["baseline"][1]},
        "candidate": {"digest": digests["candidate"][0], "files": digests["candidate"][1]},
        "measure": m,
        "threads": spec["threads"],
        "framework": spec["framework"],
        "ranks": ranks,
        "expected_output": {k: expected[0][k] for k in ("shape", "dtype", "device")},
        "expected_rank_outputs": [
            {k: e[k] for k in ("shape", "dtype", "device")} for e in expected
        ],
        "probe_indices": [],
        "n_pairs": n_pairs,
        "n_complete_pairs": sum(p["complete"] for p in out_pairs),
        "stopped_early": any(p.get("stopped_early") for p in out_pairs),
        "pairs": [{k: v for k, v in p.items() if k != "stopped_early"} for p in out_pairs],
        "timing": dict(
            M._timing(spec, None),
            samples="the slowest rank's time per call: the referee's clock from publishing the "
            "call to every rank until it saw that rank's output (rank_samples_ns: every rank's)",
        ),
        "referee": {
            "isolation": {name: boxes[k].mode for k, name in enumerate(M.ARMS)} if boxes else {},
            "sandboxes": "two; pair i runs the baseline in sandbox i % 2 and the candidate in "
            "the other; world_size rank workers forked per arm-run in its sandbox",
            "calls": "lockstep over the ranks (all armed, then published at once); the arms "
            "of a pair one after the other",
            "secret_seed": str(secret),
            "seed_source": "--seed (replay)" if spec.get("_seed_given") else "os.urandom",
            "ipc_overhead_ns": {
                name: int(statistics.median(ipc[f"sandbox{k}"])) for k, name in enumerate(M.ARMS)
            },
            "ipc_probes_ns": ipc,
            "cpu_limit": {
                "threads": spec["threads"],
                "per_rank_extra_threads": 1,
                "factor": CPU_FACTOR,
                "slack_ns": CPU_SLACK_NS,
            },
            "call_timeout_s": float(spec["call_timeout_s"]),
            "contention": "per timed call, how long the referee's thread and each rank's "
            f"threads waited for a CPU (schedstat); over {M.CALL_WAIT_MAX:.0%} of the call's "
            "wall for any rank: contended (run_delay_ns, rank_run_delay_ns; the referee's "
            "own wait is recorded, never deciding)",
            "unconfined": S.unconfined() or None,
        },
        "device": facts,
        "fingerprint": fprint,
        "bandwidth": M._bandwidth(m, call_bytes, out_pairs, fprint),
        "host": {
            "node": platform.node(),
            "machine": platform.machine(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "cpu_count": os.cpu_count(),
            "affinity": R.allowed_cpus() or None,
            "worker_cpus": None,
            "referee_cpus": None,
            "loadavg_start": None,
        },
        "wall_s": round(time.monotonic() - started, 3),
        "phases_s": {"timer": round(time.monotonic() - started, 3), "judge": 0.0},
    }


def _ipc_probe(box: RankSandbox, locals0: list[dict], expected: list[dict]) -> list[int]:
    """Lockstep hand-overs with no call, before any implementation code is imported."""
    try:
        box.fork()
        packs = [R.pack_inputs(C, local) for local in locals0]
        for ch, (header, _) in zip(box.channels, packs, strict=True):
            ch.set_layout(header, box.timeout)
        probes = sorted(
            lockstep_call(
                box, -1 - k, [p for _, p in packs], [0] * len(packs), box.timeout, echo=True
            ).sample_ns
            for k in range(M.IPC_PROBES)
        )
        box.end_ranks()
    except (R.WorkerStartError, R.WorkerFault) as exc:
        raise C.HarnessError(
            f"rank sandbox {box.index} failed before any implementation code ran: {exc}"
        ) from exc
    return probes


def _run_pairs(spec, m, workloads, oracle, impls, boxes, expected, secret, world, deadline):
    n_pairs, n_samples, n_warm = int(m["pairs"]), int(m["samples"]), int(m["warmups"])
    out_pairs, invalid = [], {"baseline": [], "candidate": []}
    ran = {"baseline": False, "candidate": False}  # NB: whose code was imported so far
    stopped = False
    for i in range(n_pairs):
        order = list(M.ARMS) if i % 2 == 0 else list(reversed(M.ARMS))
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
                f"{M.EARLY_STOP_FACTOR}x slower in {M.EARLY_STOP_PAIRS} pairs"
                if stopped
                else "an earlier arm ended the measurement"
            )
            for name in M.ARMS:
                record["arms"][name] = M.new_arm(name)
                record["arms"][name]["reasons"].append({"code": "not_run", "detail": why})
            record["stopped_early"] = stopped
            out_pairs.append(record)
            continue
        timed_seeds = [C.derive_seed(secret, "timed", i, j) for j in range(n_samples)]
        warm_seeds = [C.derive_seed(secret, "warmup", i, k) for k in range(n_warm)]
        record["timed_seeds"], record["warmup_seeds"] = timed_seeds, warm_seeds
        timed_inputs = [M.make_inputs(workloads, m["workload"], s) for s in timed_seeds]

        def packs(role: str, k: int, inputs: dict, i: int = i) -> tuple[list, list]:
            headers, datas = [], []
            for r, local in enumerate(shards(workloads, inputs, world)):
                shift = C.derive_seed(secret, "shift", role, i, k, r) % (R.SHIFT_MAX // R.ALIGN)
                header, data = R.pack_inputs(C, local, shift * R.ALIGN)
                headers.append(header)
                datas.append(data)
            return headers, datas

        timed = [packs("timed", j, inp) for j, inp in enumerate(timed_inputs)]
        warm = [
            packs("warmup", k, M.make_inputs(workloads, m["workload"], s))
            for k, s in enumerate(warm_seeds)
        ]
        pair = {
            "index": i,
            "timed_inputs": timed_inputs,
            "timed_headers": [h for h, _ in timed],
            "timed_packed": [p for _, p in timed],
            "warm_headers": [h for h, _ in warm],
            "warm_packed": [p for _, p in warm],
            "digests": [C.inputs_digest(inp) for inp in timed_inputs],
        }
        for name in order:
            box = boxes[i % 2] if name == "baseline" else boxes[(i + 1) % 2]
            arm = ArmRun(name, impls[name], box, pair, spec, oracle, expected, deadline, world)
            try:
                ok = arm.run(n_warm, n_samples)
            except Damaged as exc:
                culprit = record["arms"].get(exc.arm) or M.new_arm(exc.arm)
                culprit["valid"] = False
                culprit["reasons"].append(
                    {"code": "sandbox_damaged", "sample": None, "detail": exc.detail}
                )
                record["arms"][exc.arm] = culprit
                break
            except Exception as exc:  # noqa: BLE001  after candidate code ran: its failure
                ran["candidate"] = ran["candidate"] or (name == "candidate" and arm.imported)
                if not ran["candidate"]:
                    raise
                cand = arm.doc if name == "candidate" else record["arms"].get("candidate")
                cand = cand or M.new_arm("candidate")
                cand["valid"] = False
                cand["reasons"].append(
                    {"code": "referee_error", "sample": None, "detail": C.error_summary(exc)}
                )
                record["arms"]["candidate"] = cand
                break
            ran[name] = ran[name] or arm.imported
            record["arms"][name] = arm.doc
            if not ok:
                break
        for name in record["arms"]:
            real = [r for r in record["arms"][name]["reasons"] if r["code"] != "not_run"]
            invalid[name].extend(dict(r, pair=i) for r in real)
        for name in M.ARMS:
            if name not in record["arms"]:
                record["arms"][name] = M.new_arm(name)
                record["arms"][name]["reasons"].append(
                    {"code": "not_run", "detail": "the other arm of this pair was invalid"}
                )
        record["complete"] = all(record["arms"][a]["valid"] for a in M.ARMS)
        oracle.clear()
        out_pairs.append(record)
        if M._early_stop(out_pairs):
            stopped = True
    return out_pairs, invalid


# ------------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="step", required=True)
    check = sub.add_parser("check")
    check.add_argument("--impl", required=True, type=Path)
    measure = sub.add_parser("measure")
    measure.add_argument("--baseline", required=True, type=Path)
    measure.add_argument("--candidate", required=True, type=Path)
    for p in (check, measure):
        p.add_argument("--task", required=True, type=Path)
        p.add_argument("--spec", required=True, type=Path)
        p.add_argument("--out", required=True, type=Path)
        p.add_argument("--seed", type=int, default=None, help="replay with a revealed seed")
    args = parser.parse_args()
    out_path = args.out.resolve()
    R.harden_self()
    C.become_subreaper()
    load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    outside: dict = {}
    work_dir = Path(tempfile.mkdtemp(prefix=f"rsi-mr-{args.step}-"))
    try:
        spec = C.load_spec(args.spec)
        C.require_device(spec)
        ranks_of(spec)
        secret = R.secret_seed() if args.seed is None else int(args.seed)
        # NB: what the judged code imports beyond the judge's identity (rules/harness/imports.py)
        # is not in the action key: judged, recorded, never cached
        judged = (
            [args.task, args.impl]
            if args.step == "check"
            else [args.task, args.baseline, args.candidate]
        )
        outside = K.IMP.outside_identity([p.resolve() for p in judged])
        if args.step == "check":
            if args.seed is not None:
                spec["_seed_given"] = True
            doc = run_check(args.task.resolve(), args.impl.resolve(), spec, work_dir, secret)
        else:
            spec["_seed_given"] = args.seed is not None
            doc = run_measure(
                args.task.resolve(),
                args.baseline.resolve(),
                args.candidate.resolve(),
                spec,
                work_dir,
                secret,
            )
            doc["host"]["loadavg_start"] = load_start
        C.kill_descendants()
        doc["imports_outside_identity"] = outside
        try:
            C.write_json(out_path, doc)
        except (ValueError, TypeError, RecursionError) as exc:
            doc = (K if args.step == "check" else M).failure_document(doc, exc)
            C.write_json(out_path, doc)
        busy = C.busy_reason(doc) if args.step == "measure" else None
    except C.HarnessError as exc:
        print(f"rsi harness fault (multirank {args.step}): {exc}", file=sys.stderr)
        return C.INFRA_EXIT
    finally:
        C.kill_descendants()
        shutil.rmtree(work_dir, ignore_errors=True)
    if busy:
        # NB: judged (assess: INCONCLUSIVE host_busy) but never cached, as measure.py
        print(
            f"rsi multirank measure: the host was busy, not to be cached: {busy}", file=sys.stderr
        )
        return C.BUSY_EXIT
    if outside:
        print(
            f"rsi multirank {args.step}: imports outside the judge's identity, not to be "
            f"cached: {outside}",
            file=sys.stderr,
        )
        return C.BUSY_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
