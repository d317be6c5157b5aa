"""The multi-rank referee's callees: a zygote that forks one worker per rank, in one sandbox.

Started by multirank.py (the referee) in a sandbox of its own, like worker.py's zygote, with one
channel per rank (two pipes and three shared buffers each) and one of its own. On `fork` it
forks `world_size` workers at once; rank r closes every descriptor but its own channel's
before anything else (no rank can reach another rank's buffers or the zygote's pipes), joins
the process group over a rendezvous file in the sandbox's own temp folder (the referee names
it per arm-run), and only then serves its channel with worker.py's protocol. The candidate's
entry is called as `entry(**rank_local_inputs, group=process_group)`. No candidate code ever
runs in the zygote: it says `rank_ended` as each rank ends (the referee names a rank that died while
the others wait), and after all have ended it kills what they left, empties the temp folder and
says `ended`.

Stdlib + torch (torch.distributed). Never imports rsi, rules or _common.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import traceback
from pathlib import Path


def _load(name: str, stem: str):
    path = Path(__file__).resolve().parent / f"{stem}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


W = _load("_rsi_mr_worker_base", "worker")
CHANNEL_FDS = ("req_fd", "resp_fd", "in_fd", "out_fd", "ctl_fd")


class RankWorker(W.Worker):
    """worker.py's Worker for one rank: every call also gets the process group."""

    group = None

    def fresh_inputs(self) -> dict:
        inputs = super().fresh_inputs()
        inputs["group"] = self.group
        return inputs


def _join(args: dict, rank: int) -> object:
    """Join the process group (before any candidate code runs): a FileStore in the sandbox's own
    temp folder, gloo over the loopback of the sandbox's own network namespace."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    world = int(args["world_size"])
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if args["backend"] == "nccl":
        torch.cuda.set_device(rank % max(1, torch.cuda.device_count()))
    tmp = os.environ.get("TMPDIR") or "/tmp"
    store = dist.FileStore(os.path.join(tmp, f"rsi-rendezvous-{args['store']}"), world)
    dist.init_process_group(
        args["backend"],
        store=store,
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=float(args["join_timeout_s"])),
    )
    return dist.group.WORLD


def _rank_main(args: dict, rank: int) -> None:
    mine = args["ranks"][rank]
    keep = {mine[k] for k in CHANNEL_FDS}
    for other in [args["zreq_fd"], args["zresp_fd"]] + [
        ch[k] for ch in args["ranks"] for k in CHANNEL_FDS
    ]:
        if other not in keep:
            try:
                os.close(other)
            except OSError:
                pass
    os.setpgid(0, 0)
    worker = RankWorker(dict(args, **mine))
    try:
        worker.group = _join(args, rank)
    except BaseException as exc:  # noqa: BLE001  nothing of the candidate ran: the referee's fault
        W.write_message(worker.resp, {"op": "join_failed", "rank": rank, "error": W._error(exc)})
        raise
    worker.serve()


def zygote(args: dict) -> None:
    """Import the framework once; per `fork`, one fresh worker per rank; after they all ended,
    kill what they left (its own pid namespace: everything), empty the temp folder, report."""
    import gc
    import signal

    W._pin_malloc()
    import torch

    torch.set_num_threads(int(args["threads"]))
    torch.ones(4).mul(2).sum()
    import torch.distributed  # noqa: F401
    import numpy  # noqa: F401

    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass
    gc.collect()
    gc.freeze()
    req, resp = args["zreq_fd"], args["zresp_fd"]
    W.write_message(resp, {"op": "zygote"})
    world = int(args["world_size"])
    while True:
        msg = W.read_message(req)
        if msg is None or msg.get("op") != "fork":
            return
        run = dict(args, store=str(msg["store"]))
        sys.stdout.flush()
        sys.stderr.flush()
        pids = []
        for rank in range(world):
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    _rank_main(run, rank)
                except BaseException:  # noqa: BLE001  never fall back into the zygote's loop
                    code = 70
                    try:
                        traceback.print_exc()
                    except BaseException:  # noqa: BLE001, S110
                        pass
                finally:
                    try:
                        sys.stdout.flush()
                        sys.stderr.flush()
                    except BaseException:  # noqa: BLE001, S110
                        pass
                    os._exit(code)
            pids.append(pid)
        statuses = {}
        while len(statuses) < world:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            if pid in pids:
                rank = pids.index(pid)
                statuses[rank] = status
                # NB: said at once: the referee cannot see a rank die on its own pipe (this
                # zygote keeps every rank's write end, for the next arm-run)
                W.write_message(resp, dict(_how(status), op="rank_ended", rank=rank))
        for pid in pids:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        W._reap_strays(bool(args.get("own_pid_namespace")))
        W._empty(os.environ.get("TMPDIR"))
        W.write_message(
            resp,
            {
                "op": "ended",
                "ranks": [_how(s) for _, s in sorted(statuses.items())],
            },
        )


def _how(status: int) -> dict:
    return {
        "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
    }


def main() -> int:
    sys.dont_write_bytecode = True
    zygote(json.loads(sys.argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
