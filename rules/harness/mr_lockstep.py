"""One lockstep call over every rank (lockstep_call): all armed (the barrier), the clock
started, every rank's input written and the call published to all, each rank's time read when
the referee sees it finish; the sample is the slowest rank's.

It must never start the clock before every rank is armed nor stop a rank's before its output is
copied out; a rank that crashes, hangs or raises while others wait is named in the fault.
"""

from __future__ import annotations

import runpy
import os
import select
import time
from pathlib import Path


# NB: the harness's one sibling loader (siblings.py), itself run by path: no sys.path here
load_siblings = runpy.run_path(str(Path(__file__).resolve().parent / "siblings.py"))["load"]
P, TIMING, S = load_siblings("referee_protocol", "referee_timing", "mr_sandbox")


POLL_S = 0.0001  # NB: after a short spin, wait on the ranks' pipes: 3 processes share 2 cores
SPIN_NS = 0


class Lockstep:
    """One call on every rank: per-rank `calls` (referee_timing.Call), `done_ns` (each rank's time,
    read by the referee when it saw that rank finish), `sample_ns` (the slowest rank's) and
    `busy_ns` (from the first arm request to the last output copied)."""

    def __init__(self, world: int) -> None:
        self.calls = [TIMING.Call() for _ in range(world)]
        self.done_ns: list[int | None] = [None] * world
        self.sample_ns = None
        self.busy_ns = 0
        self.slowest = None


def lockstep_call(
    box: S.RankSandbox,
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
            raise P.WorkerFault("protocol", "buffers too small for this call")
    a0 = time.perf_counter_ns()
    for ch in chans:
        ch.send({"op": "arm", "i": index, "echo": echo})
    for ch in chans:
        armed = ch.recv(timeout_s)
        if armed.get("op") != "armed" or armed.get("i") != index:
            raise S.RankFault(
                "crash", [ch.rank], f"rank {ch.rank}: arm answered {str(armed)[:200]}"
            )
    clock, unpack, pause = time.perf_counter_ns, P.SEQ.unpack_from, os.sched_yield
    outputs: list[bytes | None] = [None] * world
    t0 = clock()
    for ch, data in zip(chans, packed, strict=True):
        ch.in_buf[: len(data)] = data
    for ch in chans:
        P.SEQ.pack_into(ch.ctl, P.REQ_AT, index)
    deadline = t0 + int(timeout_s * 1e9)
    spin_until = t0 + SPIN_NS
    waiting = set(range(world))
    replies: dict[int, dict] = {}
    while waiting:
        for r in list(waiting):
            ch = chans[r]
            if unpack(ch.ctl, P.DONE_AT)[0] == index:
                outputs[r] = ch.out_buf[: out_nbytes[r]] if out_nbytes[r] else b""
                res.done_ns[r] = clock() - t0
                waiting.discard(r)
        if not waiting:
            break
        now = clock()
        if now > deadline:
            done = [r for r in range(world) if r not in waiting]
            raise S.RankFault(
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
            if r in waiting and unpack(chans[r].ctl, P.DONE_AT)[0] == index:
                # NB: it finished and replied since the check above
                outputs[r] = chans[r].out_buf[: out_nbytes[r]] if out_nbytes[r] else b""
                res.done_ns[r] = clock() - t0
                waiting.discard(r)
            if r in waiting:
                try:
                    reply = chans[r].recv(1.0)
                except P.WorkerFault as exc:
                    raise S.RankFault("crash", [r], f"rank {r}: {exc.detail}") from exc
                raise S.RankFault(
                    "crash", [r], f"rank {r}: replied {str(reply)[:200]} before its call ended"
                )
            replies[r] = chans[r].recv(1.0)
            if replies[r].get("op") == "raised":
                err = replies[r].get("error") if isinstance(replies[r].get("error"), dict) else {}
                raise S.RankFault(
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
        except P.WorkerFault as exc:
            raise S.RankFault("crash", [r], f"rank {r}: {exc.detail}") from exc
        if unpack(ch.ctl, P.DONE_AT)[0] != index:
            raise S.RankFault("crash", [r], f"rank {r}: a reply before call {index} ended")
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
