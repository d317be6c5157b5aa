"""A multi-rank task as the referee splits it over its ranks: the spec's `ranks` (world size,
backend, topology) checked, the task's workloads and oracle, each rank's shard of the inputs
(`workloads.shard_inputs`) and its expected part of the output (`oracle.rank_output`).

It must never hand a rank more than its shard, and a shard or oracle that fails or changes the
whole inputs is the harness's fault, never the candidate's.
"""

from __future__ import annotations

import runpy
from pathlib import Path

import numpy as np


# NB: the harness's one sibling loader (siblings.py), itself run by path: no sys.path here
load_siblings = runpy.run_path(str(Path(__file__).resolve().parent / "siblings.py"))["load"]
(C,) = load_siblings("_common")


BACKENDS = {"gloo": "cpu", "nccl": "cuda"}
TOPOLOGIES = ("single-host",)
MAX_WORLD = 8


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
