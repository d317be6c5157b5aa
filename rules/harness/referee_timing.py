"""The referee's clock around one judged call (timed_call): arm the worker, write the input,
publish the call, spin until it ends, copy the output, then read its CPU from outside.

Owns what a call's figures are (wall, armed time, CPU of the whole sandbox, helpers' CPU); it
must never write an input before its clock starts nor stop the clock before the output is
copied out, and never report a CPU figure it could not read (`cpu_unread`).
"""

from __future__ import annotations

import runpy
import os
import select
import time
from pathlib import Path


# NB: the harness's one sibling loader (siblings.py), itself run by path: no sys.path here
load_siblings = runpy.run_path(str(Path(__file__).resolve().parent / "siblings.py"))["load"]
P, T = load_siblings("referee_protocol", "proctree")

SPIN_S = 0.02  # spin this long for a call to end, then poll every 50 us


class Call:
    """One judged call: the referee's clock around handing over the input and taking the output.

    `result`: ("ok", raw output bytes, meta), ("raised", error), ("problem", code, detail).
    """

    __slots__ = (
        "elapsed_ns",
        "armed_ns",
        "cpu_ns",
        "cpu_window_ns",
        "helper_cpu_ns",
        "reply",
        "output",
        "inputs_intact",
        "event_ns",
        "cpu_unread",
    )

    def __init__(self):
        self.elapsed_ns = None
        self.armed_ns = 0
        self.cpu_ns = self.cpu_window_ns = self.helper_cpu_ns = None
        self.reply = None
        self.output = None
        self.inputs_intact = None
        self.event_ns = None
        self.cpu_unread = None  # why the call's CPU figures could not be read (None: read)

    def take_reply(
        self, reply: dict, index: int, output: bytes, out_nbytes: int, echo: bool, intact: bool
    ) -> None:
        """The worker's reply to call `index` after the clock stopped: the output copied counts
        only where the reply says an array of `out_nbytes` came back (or in an echo call)."""
        self.reply = reply
        meta = reply.get("out") if reply.get("op") == "done" and reply.get("i") == index else None
        ok = (
            isinstance(meta, dict)
            and meta.get("problem") is None
            and meta.get("nbytes") == out_nbytes
        )
        self.output = output if ok or echo else None
        self.inputs_intact = intact
        if isinstance(reply.get("event_ns"), int):
            self.event_ns = reply["event_ns"]


def timed_call(
    worker,
    index: int,
    packed: bytes,
    out_nbytes: int,
    timeout_s: float,
    echo: bool = False,
) -> Call:
    """Hand `packed` to the worker, call, take `out_nbytes` of output: all inside our clock.

    Untimed: the worker is armed for call `index` (it answers, then spins on the control
    buffer). Timed: the input is written, the call published, and we spin until the worker
    publishes the end, then copy the output. Untimed again: its reply (what it returned).
    """
    call = Call()
    n = len(packed)
    if n > worker.in_size or out_nbytes > worker.out_size:
        raise P.WorkerFault("protocol", "buffers too small for this call")
    # NB: the CPU clocks of the worker's processes (all threads) read where the worker is
    # blocked, before it is armed and after it has answered: another process's clock leaves
    # out the slice its threads are running now (the kernel adds it at the next tick or
    # switch), so a reading taken while the worker spins would miss up to a tick of it
    # NB: of every process below the sandbox's zygote, not only below the worker: a helper it
    # double-forked is re-parented to the zygote (a subreaper) and was missed. The zygote
    # itself sleeps through a call (bwrap's processes above it can get no orphan).
    cpu_pid = getattr(worker, "child_pid", None) if worker.child_alive else None
    zygote = getattr(worker, "zygote_pid", None)
    w0 = time.perf_counter_ns()
    c0 = T.sandbox_cpu(zygote, cpu_pid) if cpu_pid else None
    # NB: and what is not the calling thread's: helper processes reaped within the call (their
    # parents' cutime) and every other thread or process; on a threads = 1 binding that must
    # be nothing, however slow a busy host makes the call's wall time
    r0 = T.reaped_cpu_ns(c0) if c0 else None
    m0 = T.thread_cpu_ns(cpu_pid, cpu_pid) if c0 else None
    arm_sent = time.perf_counter_ns()
    armed = worker.request({"op": "arm", "i": index, "echo": echo}, timeout_s)
    if armed.get("op") != "armed" or armed.get("i") != index:
        raise P.WorkerFault("crash", f"protocol: arm answered {str(armed)[:200]}")
    in_buf, out_buf, ctl = worker.in_buf, worker.out_buf, worker.ctl
    unpack, clock, pause = P.SEQ.unpack_from, time.perf_counter_ns, os.sched_yield
    t0 = clock()
    # NB: the armed worker spins from its reply until t0; on a busy host that can be long (the
    # referee waits for a CPU), and it is CPU time the worker may use: see measure_arm.ArmRun
    call.armed_ns = t0 - arm_sent
    in_buf[:n] = packed
    P.SEQ.pack_into(ctl, P.REQ_AT, index)
    spin_until = t0 + int(SPIN_S * 1e9)
    deadline = t0 + int(timeout_s * 1e9)
    spins = 0
    while unpack(ctl, P.DONE_AT)[0] != index:
        pause()  # NB: a worker on this CPU gets it back at once (both spin; neither sleeps)
        spins += 1
        if spins & 0x3FF == 0:
            now = clock()
            if now > deadline:
                raise P.WorkerFault("timeout", "no reply in time; the worker was killed")
            if now > spin_until:
                # NB: a long call: poll, so the referee does not take a core from the worker
                ready, _, _ = select.select([worker.resp_r], [], [], 0.00005)
                if ready:
                    break  # the worker wrote (or died) without publishing: judged below
    output = out_buf[:out_nbytes] if out_nbytes else b""
    t1 = clock()
    call.elapsed_ns = t1 - t0
    reply = worker.recv(max(1.0, timeout_s - (t1 - t0) / 1e9))
    # NB: a figure that cannot be read makes the call's CPU unknown (cpu_unread), never a
    # skipped check: a worker whose main thread exited (pthread_exit) while another thread
    # served the calls never went back to sleep, and its calls went unchecked
    if c0 is not None:
        why = T.wait_blocked(cpu_pid)
        c1 = T.sandbox_cpu(zygote, cpu_pid) if why is None else None
        if why is None and (cpu_pid not in c1 or cpu_pid not in c0):
            why = "the worker's CPU clock could not be read"
        m1 = T.thread_cpu_ns(cpu_pid, cpu_pid) if why is None else None
        if why is None and (m0 is None or m1 is None):
            why = "the worker's calling thread's CPU could not be read"
        if why is None:
            r1 = T.reaped_cpu_ns(c1)
            # NB: totals, not per-process differences: a process that ended in the call
            # leaves its clock and shows in its parent's reaped time instead
            call.cpu_ns = max(
                0, sum(c1.values()) - sum(c0.values()) + sum(r1.values()) - sum(r0.values())
            )
            call.cpu_window_ns = clock() - w0
            call.helper_cpu_ns = max(0, call.cpu_ns - (m1 - m0))
        else:
            call.cpu_unread = f"the CPU of call {index} could not be read: {why}"
    if unpack(ctl, P.DONE_AT)[0] != index:
        raise P.WorkerFault(
            "crash", f"protocol: reply {str(reply)[:200]} before call {index} ended"
        )
    call.take_reply(reply, index, output, out_nbytes, echo, in_buf[:n] == packed)
    return call
