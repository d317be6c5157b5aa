"""A measurement's driving: two worker sandboxes, pair after pair under the sequential design
fixed before the first (sequential.py), each pair's arms interleaved with the idle one stopped
(run_pair), and the document assembled from what the arms recorded (measure_doc.py).

It must never look at a pair before it is complete, never let a look on a busy host stop the
run, and never let anything that goes wrong after candidate code ran be a harness fault.
"""

from __future__ import annotations

import runpy
import os
import statistics
import time
from pathlib import Path


# NB: the harness's one sibling loader (siblings.py), itself run by path: no sys.path here
load_siblings = runpy.run_path(str(Path(__file__).resolve().parent / "siblings.py"))["load"]
C, R, J, D, A, Q = load_siblings(
    "_common", "referee", "measure_judge", "measure_doc", "measure_arm", "sequential"
)


def run_measure(
    task_dir: Path, baseline: Path, candidate: Path, spec: dict, work_dir: Path, secret: int
) -> dict:
    started = time.monotonic()
    m = spec["measure"]
    case, out_dtype, n_pairs, n_samples, n_warm = J.workload_of(spec)
    workloads = C.load_task_module(task_dir, "workloads")
    oracle = J.Oracle(C.load_task_module(task_dir, "oracle"))
    impls = {"baseline": baseline, "candidate": candidate}
    digests = {arm: C.tree_digest(path) for arm, path in impls.items()}
    inputs0 = J.make_inputs(workloads, case, C.derive_seed(secret, "probe"))
    ref0 = oracle.reference(("probe",), inputs0)
    header0, packed0 = R.pack_inputs(C, inputs0)
    expected = J.expected_of(ref0, out_dtype, spec["device"])
    sizes = (len(packed0) + R.SHIFT_MAX + R.ALIGN, expected["nbytes"])
    call_bytes = C.tensor_bytes(inputs0, ref0.shape, out_dtype)
    oracle.clear()
    deadline = J.deadline_of(spec, started)
    roles = {name: A.Role(name, impls[name]) for name in D.ARMS}
    boxes: list[A.Sandbox] = []
    try:
        for index in range(2):
            boxes.append(
                A.Sandbox(
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
    D.add_log_tails(out_pairs, [R.tail(box.log) for box in boxes])
    return {
        **D.measure_document(spec, invalid, digests, baseline == candidate, out_pairs, call_bytes),
        "expected_output": {k: expected[k] for k in ("shape", "dtype", "device")},
        "sequential": sequential,
        "timing": D.timing_doc(spec, None),
        "referee": {
            "isolation": {name: boxes[k].worker.mode for k, name in enumerate(D.ARMS)},
            "sandboxes": "two; pair i runs the baseline in sandbox i % 2 and the candidate in "
            "the other",
            "calls": "interleaved: A B B A ... within a pair, the idle arm's sandbox stopped"
            if spec["device"] == "cpu"
            else "sequential: one arm's calls, then the other's",
            "secret_seed": str(secret),
            "seed_source": "--seed (replay)" if spec.get("_seed_given") else "os.urandom",
            "ipc_overhead_ns": {
                name: int(statistics.median(boxes[k].ipc_ns)) for k, name in enumerate(D.ARMS)
            },
            "ipc_probes_ns": {f"sandbox{box.index}": box.ipc_ns for box in boxes},
            "cpu_limit": {
                "threads": spec["threads"],
                "factor": J.CPU_FACTOR,
                "slack_ns": J.CPU_SLACK_NS,
            },
            "call_timeout_s": float(spec["call_timeout_s"]),
            "confinement": {f"sandbox{box.index}": box.worker.confinement for box in boxes},
            "unconfined": R.unconfined() or None,
        },
        "host": D.host_doc(
            R.allowed_cpus() or None,
            R.worker_cpus(spec["threads"]),
            sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        ),
        "wall_s": round(time.monotonic() - started, 3),
        "phases_s": {"timer": round(time.monotonic() - started, 3), "judge": 0.0},
    }


def run_pair(
    runs: dict[str, A.ArmRun], order: list[str], n_warm: int, n_samples: int, interleave: bool
) -> list[str]:
    """Run one pair; the names of the arms that failed (at most one: the pair stops there).

    Interleaved (CPU): both workers are forked and imported, their warm-ups alternate, then
    their timed calls alternate in the order A B B A A B B A ... (A = order[0]), so both arms'
    calls of a pair sit microseconds apart and a host whose speed drifts over seconds (another
    tenant's load on a shared cache) moves both alike. While one arm's timed calls run the
    other arm's sandbox is stopped (SIGSTOP, proctree.Freezer): it can take neither CPU, nor
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
    frozen: A.ArmRun | None = None
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


def _run_pairs(
    spec, m, workloads, oracle, roles, boxes, expected, secret, n_pairs, n_samples, n_warm, deadline
):
    out_pairs, invalid = [], {"baseline": [], "candidate": []}
    stopped = False
    # NB: the design is fixed before the first pair (pre-registered); "fixed" keeps the one
    # look at `pairs` and the old stop of a clearly slower candidate (measure_doc.early_stop)
    plan = Q.plan(n_pairs, m["first_look"], m["look_every"], m["sequential"], m["stop_confidence"])
    sequential, taken = m["sequential"] != "fixed", []
    for i in range(n_pairs):
        if taken and taken[-1]["stop"]:
            break
        record = D.next_pair(out_pairs, stopped, invalid)
        if record is None:
            continue
        timed_inputs, warm_inputs = J.draw_pair(
            record, workloads, m["workload"], secret, n_warm, n_samples
        )

        def shifted(role: str, k: int, inputs: dict, i: int = i) -> tuple[dict, bytes]:
            return R.pack_inputs(C, inputs, J.input_shift(secret, role, i, k))

        timed = [shifted("timed", j, inp) for j, inp in enumerate(timed_inputs)]
        warm = [shifted("warmup", k, inp) for k, inp in enumerate(warm_inputs)]
        geometry = {
            n: {k: v for k, v in meta.items() if k != "at"} for n, meta in timed[0][0].items()
        }
        for h, _ in timed + warm:
            if {
                n: {k: v for k, v in meta.items() if k != "at"} for n, meta in h.items()
            } != geometry:
                raise C.HarnessError("workloads.make_inputs gave one workload different layouts")
        pair = J.pair_inputs(i, timed_inputs, timed, warm)
        runs = {
            name: A.ArmRun(
                roles[name],
                boxes[i % 2] if name == "baseline" else boxes[(i + 1) % 2],
                pair,
                spec,
                oracle,
                expected,
                deadline,
            )
            for name in D.ARMS
        }
        try:
            failed = run_pair(
                runs, record["order"], n_warm, n_samples, interleave=spec["device"] == "cpu"
            )
        except C.HarnessError:
            raise
        except Exception as exc:  # noqa: BLE001  after candidate code ran: its failure, with evidence
            runs["candidate"]._fail("referee_error", None, C.error_summary(exc), dead=True)
            failed = ["candidate"]
        for name in record["order"]:
            # NB: an arm stopped half-way because the other failed is not evidence: not_run
            if name in failed or runs[name].doc["valid"]:
                record["arms"][name] = runs[name].doc
        D.settle_pair(record, invalid)
        oracle.clear()
        out_pairs.append(record)
        look = D.look(m, plan, out_pairs, taken[-1]["n"] if taken else 0)
        if look is not None:
            taken.append(look)
        if not sequential and D.early_stop(out_pairs):
            stopped = True
    return out_pairs, invalid, D.sequential_doc(m, plan, taken, out_pairs)
