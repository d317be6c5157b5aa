"""What a measurement judges of one arm's calls, for measure.py and multirank.py alike: the
oracle's expected outputs (cached within a budget), the inputs drawn, a reply's claims, an
output against the oracle, and the limits on CPU and contention a call is held to.

It must never time anything nor run candidate code; every figure it judges was read by the
referee (referee_timing.py), every output copied out of the worker's buffer.
"""

from __future__ import annotations

import hashlib
import math
import runpy
from pathlib import Path

import numpy as np


# NB: the harness's one sibling loader (siblings.py), itself run by path: no sys.path here
load_siblings = runpy.run_path(str(Path(__file__).resolve().parent / "siblings.py"))["load"]
C, P = load_siblings("_common", "referee_protocol")


IPC_PROBES = 7  # hand-overs with no call per sandbox: the IPC floor
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
    # NB: the count alone (the same pass rule as check's compare, without its error figures,
    # which a measurement does not record): a fifth of the time, for every timed output
    bad = C.mismatched(C.as_float64(raw, expected["dtype"]), ref, atol, rtol)
    if bad:
        doc["reasons"].append(
            {
                "code": "wrong_output",
                "sample": j,
                "detail": f"timed call {j}: {bad} of {ref.size} values disagree with the oracle",
            }
        )
        return True
    return False


def pair_inputs(i: int, timed_inputs: list[dict], timed: list, warm: list) -> dict:
    """Pair i's inputs, drawn once for both arms: the timed inputs (for the oracle, after the
    calls) and every call's (layout header, packed bytes), timed and warm-up."""
    return {
        "index": i,
        "timed_inputs": timed_inputs,
        "timed_headers": [h for h, _ in timed],
        "timed_packed": [p for _, p in timed],
        "warm_headers": [h for h, _ in warm],
        "warm_packed": [p for _, p in warm],
        "digests": [C.inputs_digest(inp) for inp in timed_inputs],
    }


def draw_pair(
    record: dict, workloads, case: dict, secret: int, n_warm: int, n_samples: int
) -> tuple[list[dict], list[dict]]:
    """Pair `record`'s (timed, warm-up) inputs, drawn from seeds derived from the secret one
    (recorded in `record`, revealed after the run), identical for both arms."""
    i = record["index"]
    timed_seeds = [C.derive_seed(secret, "timed", i, j) for j in range(n_samples)]
    warm_seeds = [C.derive_seed(secret, "warmup", i, k) for k in range(n_warm)]
    record["timed_seeds"], record["warmup_seeds"] = timed_seeds, warm_seeds
    return (
        [make_inputs(workloads, case, s) for s in timed_seeds],
        [make_inputs(workloads, case, s) for s in warm_seeds],
    )


def workload_of(spec: dict) -> tuple[dict, str, int, int, int]:
    """The spec's measured workload checked: (workload, output dtype with a tolerance, pairs,
    samples, warm-ups); a section that cannot be measured is the harness's fault."""
    m = spec["measure"]
    if "workload" not in m:
        raise C.HarnessError("spec measure section lacks 'workload'")
    n_pairs, n_samples, n_warm = int(m["pairs"]), int(m["samples"]), int(m["warmups"])
    if n_pairs < 1 or n_samples < 1 or n_warm < 0:
        raise C.HarnessError("measure needs pairs >= 1, samples >= 1, warmups >= 0")
    case = m["workload"]
    out_dtype = case.get("out_dtype", case["dtype"])
    C.tolerance_for(spec, out_dtype)
    return case, out_dtype, n_pairs, n_samples, n_warm


def expected_of(ref: np.ndarray, out_dtype: str, device: str) -> dict:
    """What a call must return, from the oracle's output for the probe draw."""
    return {
        "shape": list(ref.shape),
        "dtype": out_dtype,
        "device": device,
        "nbytes": int(ref.size) * C.dtype_itemsize(out_dtype),
    }


def deadline_of(spec: dict, started: float) -> float:
    """The measurement's own deadline, inside the action's: past it the arm running is cut (a
    `timeout` of that arm) rather than the whole action (an infrastructure fault)."""
    action_s = float(spec.get("action_timeout_s") or 0) or math.inf
    return started + max(30.0, 0.85 * action_s - float(spec["startup_timeout_s"]))


def input_shift(secret: int, role: str, pair: int, call: int, *rank: int) -> int:
    """Where call `call`'s packed input starts in the buffer (a multiple of ALIGN below
    SHIFT_MAX, referee_protocol.pack_inputs): drawn per call from the secret seed, the same
    for both arms of a pair, so an address-dependent effect averages out instead of biasing
    one sandbox."""
    return (
        C.derive_seed(secret, "shift", role, pair, call, *rank) % (P.SHIFT_MAX // P.ALIGN) * P.ALIGN
    )
