"""A multi-rank measurement (`multirank.py measure`): two rank sandboxes swapped every pair,
each arm-run's ranks fresh, the arms of a pair one after the other (a stopped sandbox would
stall a collective), the document assembled as measure.py's (measure_doc.py).

It must never let anything that goes wrong after candidate code ran be a harness fault, and
never judge a pair whose inputs were not identical for both arms.
"""

from __future__ import annotations

import runpy
import statistics
import time
from pathlib import Path


# NB: the harness's one sibling loader (siblings.py), itself run by path: no sys.path here
load_siblings = runpy.run_path(str(Path(__file__).resolve().parent / "siblings.py"))["load"]
C, R, J, D, S, TASK, LS, ARM = load_siblings(
    "_common",
    "referee",
    "measure_judge",
    "measure_doc",
    "mr_sandbox",
    "mr_task",
    "mr_lockstep",
    "mr_arm",
)


def run_measure(
    task_dir: Path, baseline: Path, candidate: Path, spec: dict, work_dir: Path, secret: int
) -> dict:
    started = time.monotonic()
    ranks = TASK.ranks_of(spec)
    world = int(ranks["world_size"])
    m = spec["measure"]
    case, out_dtype = J.workload_of(spec)[:2]
    workloads, oracle_mod = TASK.task_modules(task_dir)
    oracle = J.Oracle(oracle_mod)
    impls = {"baseline": baseline, "candidate": candidate}
    digests = {arm: C.tree_digest(path) for arm, path in impls.items()}
    inputs0 = J.make_inputs(workloads, case, C.derive_seed(secret, "probe"))
    ref0 = oracle.reference(("probe",), inputs0)
    locals0 = TASK.shards(workloads, inputs0, world)
    expected, sizes, call_bytes = [], [], 0
    for r, local in enumerate(locals0):
        want = TASK.rank_expected(oracle_mod, ref0, r, world)
        exp = J.expected_of(want, out_dtype, spec["device"])
        expected.append(exp)
        packed = R.pack_inputs(C, local)[1]
        sizes.append((len(packed) + R.SHIFT_MAX + R.ALIGN, exp["nbytes"]))
        call_bytes += C.tensor_bytes(local, want.shape, out_dtype)
    oracle.clear()
    deadline = J.deadline_of(spec, started)
    boxes: list[S.RankSandbox] = []
    ipc: dict[str, list[int]] = {}
    try:
        try:
            boxes = S.start_sandboxes(
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
    D.add_log_tails(out_pairs, [R.tail(box.log) for box in boxes])
    return {
        **D.measure_document(spec, invalid, digests, baseline == candidate, out_pairs, call_bytes),
        "ranks": ranks,
        "expected_output": {k: expected[0][k] for k in ("shape", "dtype", "device")},
        "expected_rank_outputs": [
            {k: e[k] for k in ("shape", "dtype", "device")} for e in expected
        ],
        "timing": dict(
            D.timing_doc(spec, None),
            samples="the slowest rank's time per call: the referee's clock from publishing the "
            "call to every rank until it saw that rank's output (rank_samples_ns: every rank's)",
        ),
        "referee": {
            "isolation": {name: boxes[k].mode for k, name in enumerate(D.ARMS)} if boxes else {},
            "sandboxes": "two; pair i runs the baseline in sandbox i % 2 and the candidate in "
            "the other; world_size rank workers forked per arm-run in its sandbox",
            "calls": "lockstep over the ranks (all armed, then published at once); the arms "
            "of a pair one after the other",
            "secret_seed": str(secret),
            "seed_source": "--seed (replay)" if spec.get("_seed_given") else "os.urandom",
            "ipc_overhead_ns": {
                name: int(statistics.median(ipc[f"sandbox{k}"])) for k, name in enumerate(D.ARMS)
            },
            "ipc_probes_ns": ipc,
            "cpu_limit": {
                "threads": spec["threads"],
                "per_rank_extra_threads": 1,
                "factor": ARM.CPU_FACTOR,
                "slack_ns": ARM.CPU_SLACK_NS,
            },
            "call_timeout_s": float(spec["call_timeout_s"]),
            "contention": "per timed call, how long the referee's thread and each rank's "
            f"threads waited for a CPU (schedstat); over {J.CALL_WAIT_MAX:.0%} of the call's "
            "wall for any rank: contended (run_delay_ns, rank_run_delay_ns; the referee's "
            "own wait is recorded, never deciding)",
            "unconfined": S.unconfined() or None,
        },
        "host": D.host_doc(R.allowed_cpus() or None, None, None),
        "wall_s": round(time.monotonic() - started, 3),
        "phases_s": {"timer": round(time.monotonic() - started, 3), "judge": 0.0},
    }


def _ipc_probe(box: S.RankSandbox, locals0: list[dict], expected: list[dict]) -> list[int]:
    """Lockstep hand-overs with no call, before any implementation code is imported."""
    try:
        box.fork()
        packs = [R.pack_inputs(C, local) for local in locals0]
        for ch, (header, _) in zip(box.channels, packs, strict=True):
            ch.set_layout(header, box.timeout)
        probes = sorted(
            LS.lockstep_call(
                box, -1 - k, [p for _, p in packs], [0] * len(packs), box.timeout, echo=True
            ).sample_ns
            for k in range(J.IPC_PROBES)
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
        record = D.next_pair(out_pairs, stopped, invalid)
        if record is None:
            continue
        timed_inputs, warm_inputs = J.draw_pair(
            record, workloads, m["workload"], secret, n_warm, n_samples
        )

        def packs(role: str, k: int, inputs: dict, i: int = i) -> tuple[list, list]:
            headers, datas = [], []
            for r, local in enumerate(TASK.shards(workloads, inputs, world)):
                header, data = R.pack_inputs(C, local, J.input_shift(secret, role, i, k, r))
                headers.append(header)
                datas.append(data)
            return headers, datas

        timed = [packs("timed", j, inp) for j, inp in enumerate(timed_inputs)]
        warm = [packs("warmup", k, inp) for k, inp in enumerate(warm_inputs)]
        pair = J.pair_inputs(i, timed_inputs, timed, warm)
        for name in record["order"]:
            box = boxes[i % 2] if name == "baseline" else boxes[(i + 1) % 2]
            arm = ARM.ArmRun(name, impls[name], box, pair, spec, oracle, expected, deadline, world)
            try:
                ok = arm.run(n_warm, n_samples)
            except ARM.Damaged as exc:
                culprit = record["arms"].get(exc.arm) or D.new_arm(exc.arm)
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
                cand = cand or D.new_arm("candidate")
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
        D.settle_pair(record, invalid)
        oracle.clear()
        out_pairs.append(record)
        if D.early_stop(out_pairs):
            stopped = True
    return out_pairs, invalid
