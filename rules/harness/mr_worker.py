"""The multi-rank referee's callees: a zygote that forks one worker per rank, in one sandbox.

Started by mr_sandbox.py (the referee) in a sandbox of its own, like worker.py's zygote, with a
channel of its own (two pipes, and a socket on which each `fork` brings that arm-run's fresh
rank channels: two pipes and three sealed buffers per rank). It never keeps a rank's channel:
on `fork` it resets the sandbox's temp folder (permissions repaired, emptied, a fresh folder
per arm-run), forks `world_size` workers at once and closes every channel it was handed. Rank
r keeps only its own channel, re-applies what it inherits (environment, CPUs, malloc,
threads, umask, folder), is confined (no capabilities, non-dumpable, a seccomp filter that
protects the zygote and the referee: confine.py) and joins the process group, all before any
candidate code; then it serves worker.py's protocol, its entry called as
`entry(**rank_local_inputs, group=process_group)`. No candidate code ever runs in the zygote,
which is non-dumpable: no rank can ptrace it, read or write its memory, or take its
descriptors. It says `rank_ended` as each rank ends and, once all have, kills what they left
and says `ended`.

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
FDS_PER_RANK = len(CHANNEL_FDS)


class RankWorker(W.Worker):
    """worker.py's Worker for one rank: every call also gets the process group."""

    group = None

    def fresh_inputs(self) -> dict:
        inputs = super().fresh_inputs()
        inputs["group"] = self.group
        return inputs


def _join(args: dict, rank: int, run_dir: str) -> object:
    """Join the process group (before any candidate code runs): a FileStore in this arm-run's
    own fresh temp folder, gloo over the loopback of the sandbox's own network namespace."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    world = int(args["world_size"])
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if args["backend"] == "nccl":
        torch.cuda.set_device(rank % max(1, torch.cuda.device_count()))
    name = "rsi-rendezvous-" + os.path.basename(run_dir).removeprefix("rsi-run-")
    store = dist.FileStore(os.path.join(run_dir, name), world)
    dist.init_process_group(
        args["backend"],
        store=store,
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=float(args["join_timeout_s"])),
    )
    return dist.group.WORLD


def _reapply(msg: dict, args: dict, run_dir: str) -> None:
    """What a rank inherits from the zygote, set again from the referee's request: nothing an
    earlier arm-run could have changed in the zygote reaches this one through it."""
    os.setsid()  # its own session and process group: signals to others' groups are refused
    env = msg.get("env")
    if isinstance(env, dict):
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in env.items()})
    os.environ.update(TMPDIR=run_dir, GLOO_SOCKET_IFNAME="lo")
    os.umask(0o077)
    os.chdir(run_dir)
    cpus = msg.get("cpus")
    if isinstance(cpus, list) and cpus:
        try:
            os.sched_setaffinity(0, cpus)
        except OSError:
            pass
    W._pin_malloc()
    import torch

    torch.set_num_threads(int(args["threads"]))


def _confine(msg: dict, zygote_pid: int) -> dict:
    """No capabilities, non-dumpable, the seccomp filter (confine.confine_worker); what holds
    is reported, the referee checks it. NB: own_only in every mode: the peer ranks share the
    rank's pid namespace, so a rank may name no pid but its own (zygote and referee included)."""
    protect = [zygote_pid, *(p for p in msg.get("protect") or () if isinstance(p, int))]
    try:
        protect.append(os.getpgid(zygote_pid))
    except OSError:
        pass
    zparent = msg.get("zygote_parent")
    if isinstance(zparent, int) and zparent > 1:
        protect.append(zparent)
    skip = msg.get("unconfined") or ()
    return W.confine.confine_worker(protect, os.getpid(), skip, own_only=True)


def _rank_main(args: dict, msg: dict, rank: int, mine: list[int], keep: set[int]) -> None:
    # NB: first of all: every descriptor but its own channel and the zygote's standard ones
    for fd in sorted(W._open_fds() - keep - set(mine)):
        try:
            os.close(fd)
        except OSError:
            pass
    zygote_pid = os.getppid()
    run_dir = msg["run_dir"]
    _reapply(msg, args, run_dir)
    confined = _confine(msg, zygote_pid)
    in_size, out_size = msg["sizes"][rank]
    channel = dict(
        zip(CHANNEL_FDS, mine, strict=True), in_size=int(in_size), out_size=int(out_size)
    )
    worker = RankWorker(dict(args, **channel))
    try:
        worker.group = _join(args, rank, run_dir)
    except BaseException as exc:  # noqa: BLE001  nothing of the candidate ran: the referee's fault
        W.write_message(worker.resp, {"op": "join_failed", "rank": rank, "error": W._error(exc)})
        raise
    worker.serve(confined)


def _reset_tmp(base: str, store: str, repair: bool = True) -> str:
    """The arm-run's temp folder: the sandbox's temp folder repaired (made ours and writable
    again: a rank may have made it or anything in it read-only), emptied of what can go, and a
    fresh folder under it with a name nobody knew, written to. Raises OSError with what could
    not be done."""
    import stat

    if repair:
        st = os.lstat(base)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise OSError(f"the temp folder {base} is no longer a folder of ours")
        os.chmod(base, 0o700)
        for here, dirs, _ in os.walk(base):
            for name in dirs:
                path = os.path.join(here, name)
                if not os.path.islink(path):
                    try:
                        os.chmod(path, 0o700)
                    except OSError:
                        pass
        # NB: what cannot go (mount points of visible folders under /tmp) may stay: the ranks
        # get a folder nobody knew, and the rendezvous lives in it
        W._empty(base)
    run_dir = os.path.join(base, f"rsi-run-{store}")
    os.mkdir(run_dir, 0o700)
    with open(os.path.join(run_dir, ".probe"), "wb") as f:  # NB: writable, not only made
        f.write(b"0")
    os.unlink(os.path.join(run_dir, ".probe"))
    return run_dir


def zygote(args: dict) -> None:
    """Import the framework once; per `fork`, reset the temp folder and fork one fresh worker
    per rank on the channels the request brought (closed here at once); after they all ended,
    kill what they left (its own pid namespace: everything) and report."""
    import gc
    import signal
    import socket

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
    unconfined = set(args.get("unconfined") or ())  # NB: tests only (the referee's switch)
    if "dump" not in unconfined:
        # NB: every later arm-run is forked from here: no rank may ptrace this process, read
        # or write its memory or take its descriptors (the ranks' seccomp filter refuses it too)
        W.confine.no_dump()
    gc.collect()
    gc.freeze()
    req, resp = args["zreq_fd"], args["zresp_fd"]
    sock = socket.socket(fileno=args["zsock_fd"])
    keep = W._open_fds() - {req, resp, sock.fileno()}
    W.write_message(resp, {"op": "zygote"})
    world = int(args["world_size"])
    base = os.environ.get("TMPDIR") or "/tmp"
    while True:
        msg = W.read_message(req)
        if msg is None or msg.get("op") != "fork":
            return
        try:
            _, fds, _, _ = socket.recv_fds(sock, 16, FDS_PER_RANK * world)
        except OSError as exc:
            W.write_message(resp, {"op": "fork_failed", "message": f"no channels: {exc}"})
            return
        if len(fds) != FDS_PER_RANK * world:
            W.write_message(resp, {"op": "fork_failed", "message": f"{len(fds)} descriptors"})
            return
        try:
            run_dir = _reset_tmp(base, str(msg["store"]), "tmp_reset" not in unconfined)
        except OSError as exc:
            for fd in fds:
                os.close(fd)
            W.write_message(resp, {"op": "fork_failed", "message": str(exc)[:1000]})
            continue
        run = dict(msg, run_dir=run_dir, unconfined=sorted(unconfined), zygote_parent=os.getppid())
        sys.stdout.flush()
        sys.stderr.flush()
        pids = []
        for rank in range(world):
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    mine = fds[FDS_PER_RANK * rank : FDS_PER_RANK * (rank + 1)]
                    _rank_main(args, run, rank, mine, keep)
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
        # NB: the ranks' channels are theirs alone from here: a rank's death is an end-of-file
        # for the referee, and no later arm-run (or rank) can find them in this process
        for fd in fds:
            os.close(fd)
        statuses = {}
        while len(statuses) < world:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            if pid in pids:
                rank = pids.index(pid)
                statuses[rank] = status
                W.write_message(resp, dict(_how(status), op="rank_ended", rank=rank))
        for pid in pids:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        W._reap_strays(bool(args.get("own_pid_namespace")))
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
