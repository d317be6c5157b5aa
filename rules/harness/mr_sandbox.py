"""The multi-rank referee's sandbox: one rank zygote (mr_worker.py) and, per arm-run, fresh
channels for its ranks, handed over once and never kept by anyone but the rank they belong to.

Owns the referee's side of rules/harness/SPEC.md "Multi-rank", "Ranks": it must never let a
rank reach another rank's channel, the zygote, or anything of an earlier arm-run (pipes,
buffers, temp folder); a sandbox that cannot be reset after an implementation ran in it is
that implementation's failure (`SandboxDamaged`), never a harness fault.
Starting, killing and the confinement check are isolation.py's, shared with referee.py;
the framing and call buffers are referee_protocol.py's. Stdlib + those and _common.py.
"""

from __future__ import annotations

import runpy
import json
import os
import select
import socket
import sys
import time
from pathlib import Path


# NB: the harness's one sibling loader (siblings.py), itself run by path: no sys.path here
load_siblings = runpy.run_path(str(Path(__file__).resolve().parent / "siblings.py"))["load"]
C, P, T, I = load_siblings("_common", "referee_protocol", "proctree", "isolation")  # noqa: E741

FDS_PER_RANK = 5  # req_r, resp_w, in, out, ctl: a rank's whole channel
# NB: tests only: isolation.py's private switch, plus "tmp_reset": the zygote neither repairs
# nor renews the temp folder. Every use is in the evidence (`referee.unconfined`).
unconfined = I.unconfined


class RankFault(P.WorkerFault):
    """A rank (or several) failed a call: `ranks` names them."""

    def __init__(self, code: str, ranks: list[int], detail: str):
        super().__init__(code, detail)
        self.ranks = ranks


class SandboxDamaged(P.WorkerStartError):
    """The zygote could not reset the sandbox for the next arm-run (its temp folder): what ran
    in it last did that (`RankSandbox.last_arm`)."""


class RankChannel(P.CallChannel):
    """Rank r's channel for ONE arm-run: pipes and sealed input, output and control buffers.

    Made fresh for every arm-run and handed to the zygote once (SCM_RIGHTS); the zygote closes
    its copies as soon as the ranks are forked, so the rank is the only other holder: its death
    is an end-of-file here, and nothing it left in a pipe or buffer reaches a later arm-run."""

    def __init__(self, rank: int, in_size: int, out_size: int, box=None) -> None:
        super().__init__(f"rank {rank}", in_size, out_size, "seal" not in unconfined(), f"-{rank}")
        self.rank, self.box = rank, box
        self.child_pid = None
        self.header = None

    def readable(self, deadline: float) -> bool:
        """As a channel's, but a rank's end is the zygote's to tell (rank_ended): its
        messages are read while waiting, and a rank that ended is raised at once."""
        if self.box is None:
            return super().readable(deadline)
        self.box.check_ended()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise P.WorkerFault("timeout", self.late())
        zfd = self.box.zygote.resp_r
        fds = [self.resp_r] + ([zfd] if zfd >= 0 else [])
        ready, _, _ = select.select(fds, [], [], remaining)
        if zfd in ready and self.resp_r not in ready:
            self.box.watch()
            return False
        return bool(ready)

    def ended(self) -> P.WorkerFault:
        if self.box is not None:
            self.box.await_end(self.rank)
        return super().ended()

    def set_layout(self, header: dict, timeout_s: float) -> None:
        if header != self.header:
            self.layout(header, timeout_s)
            self.header = header


def confinement_missing(report, skipped=()) -> str | None:
    """What a rank's report says does not hold (None: all of it holds): no pid but its own in
    every mode (it shares its pid namespace with its peers, which it could stop or kill)."""
    return I.confinement_missing(report, skipped, own_only=True, zygote=False)


class RankSandbox:
    """One sandbox holding the rank zygote (mr_worker.py); per arm-run, fresh rank channels."""

    def __init__(
        self,
        *,
        index: int,
        spec: dict,
        impls: tuple[Path, ...],
        sizes: list[tuple[int, int]],
        work_dir: Path,
        mode: str,
    ) -> None:
        ranks = spec["ranks"]
        self.index, self.mode, self.spec, self.sizes = index, mode, spec, sizes
        self.world = int(ranks["world_size"])
        self.device = spec["device"]
        self.visible = tuple(p.resolve() for p in impls)
        self.timeout = float(spec["call_timeout_s"])
        self.startup = float(spec["startup_timeout_s"])
        self.log = work_dir / f"ranks{index}.log"
        self.unconfined = unconfined()
        self.alive = False
        self.last_arm: str | None = None  # whose code ran in this sandbox last (see fork)
        self.runs = 0
        self.zygote = P.Channel("the rank zygote")  # NB: worker.py's framing
        self.fd_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.channels: list[RankChannel] = []
        self.ended: dict[int, str] = {}
        self.last_zygote: dict | None = None
        here = Path(__file__).resolve().parent
        script = here / "mr_worker.py"
        args = {
            "framework": "torch",
            "device": self.device,
            "threads": int(spec["threads"]),
            "world_size": self.world,
            "backend": ranks["backend"],
            "join_timeout_s": self.startup,
            "own_pid_namespace": mode == "namespaces",
            "zreq_fd": self.zygote.req_r,
            "zresp_fd": self.zygote.resp_w,
            "zsock_fd": child_sock.fileno(),
            "unconfined": self.unconfined,
        }
        self._released = False
        self.sandbox = None
        try:
            self.sandbox = I.launch(
                [sys.executable, "-I", "-B", str(script), json.dumps(args)],
                mode=mode,
                what="rank sandbox",
                device=self.device,
                visible=self.visible,
                scripts=(script, here / "worker.py"),
                work_dir=work_dir,
                home_name=f"ranks{index}",
                threads=int(spec["threads"]),
                log_path=self.log,
                pass_fds=self.zygote.child_ends() + [child_sock.fileno()],
            )
        except P.WorkerStartError:
            self._release()
            raise
        finally:
            self.zygote.close_child_ends()
            child_sock.close()
        self.proc, self.pid, self.env = self.sandbox.proc, self.sandbox.pid, self.sandbox.env

    def wait_ready(self) -> None:
        """The zygote has imported torch (sandboxes start in parallel, then wait here)."""
        try:
            ready = self.zygote.recv(self.startup)
        except P.WorkerFault as exc:
            self.kill()
            raise P.WorkerStartError(
                f"rank sandbox ({self.mode}) did not get ready: {exc.detail}; "
                f"log: {I.tail(self.log)}"
            ) from exc
        if ready.get("op") != "zygote":
            self.kill()
            raise P.WorkerStartError(f"rank sandbox ({self.mode}) answered {str(ready)[:200]}")

    def fork_request(self) -> dict:
        """What every rank re-applies and protects before any candidate code runs."""
        protect = []
        if self.mode != "namespaces":
            protect = sorted({os.getpid(), os.getppid(), *I.SANDBOXES})
        return {
            "op": "fork",
            "store": os.urandom(8).hex(),  # NB: the arm-run's temp folder and rendezvous name
            "env": self.env,
            "cpus": I.allowed_cpus() or None,
            "protect": protect,
            "sizes": [[ch.in_size, ch.out_size] for ch in self.channels],
        }

    def fork(self, arm: str | None = None) -> None:
        """Fresh rank workers (no candidate code yet) on fresh channels, joined in a process
        group; `arm` is whose code will run in them (for SandboxDamaged on the next fork)."""
        self.close_channels()
        self.channels = [RankChannel(r, *self.sizes[r], box=self) for r in range(self.world)]
        self.ended, self.last_zygote = {}, None
        msg = self.fork_request()
        fds = [fd for ch in self.channels for fd in ch.child_ends()]
        try:
            self.zygote.send(msg)
            try:
                socket.send_fds(self.fd_sock, [b"F"], fds)
            except OSError as exc:
                raise P.WorkerFault("crash", f"the zygote took no channels ({exc})") from exc
            self.runs += 1
            for ch in self.channels:
                ch.close_child_ends()
            self.alive = True
            for ch in self.channels:
                reply = ch.recv(self.startup)
                if reply.get("op") != "ready":
                    raise P.WorkerStartError(
                        f"rank {ch.rank} did not join the process group: {str(reply)[:400]}"
                    )
                missing = confinement_missing(reply.get("confined"), self.unconfined)
                if missing:
                    raise P.WorkerStartError(f"rank {ch.rank} is not confined: {missing}")
                ch.child_pid = T.outside_pid(self.pid, reply.get("pid"))
                if ch.child_pid is None:
                    raise P.WorkerStartError(f"rank {ch.rank}'s worker is not in /proc")
        except SandboxDamaged:
            raise
        except P.WorkerFault as exc:
            raise P.WorkerStartError(
                f"rank workers failed to start: {exc.detail}; log: {I.tail(self.log)}"
            ) from exc
        self.last_arm = arm

    def import_impl(self, impl: Path) -> tuple[str, str] | None:
        """Import the implementation in every rank; (reason code, detail) when one failed."""
        impl = impl.resolve()
        if impl not in self.visible:
            raise C.HarnessError(f"{impl} is not visible in rank sandbox {self.index}")
        entry = dict(self.spec["entry"])
        try:
            for ch in self.channels:
                ch.send({"op": "import", "impl_dir": str(impl), "entry": entry})
            replies = [ch.recv(self.timeout) for ch in self.channels]
        except P.WorkerFault as exc:
            code = "timeout" if exc.code == "timeout" else "crash"
            return code, f"while importing: {exc.detail}"
        for ch, reply in zip(self.channels, replies, strict=True):
            if reply.get("op") == "import_failed":
                kind = reply.get("kind")
                err = reply.get("error") if isinstance(reply.get("error"), dict) else {}
                code = kind if kind in ("syntax_error", "missing_entry") else "import_error"
                return code, f"rank {ch.rank}: {err.get('type')}: {err.get('message')}"
            if reply.get("op") != "imported":
                return "crash", f"rank {ch.rank}: protocol: import answered {str(reply)[:200]}"
        return None

    def watch(self) -> None:
        """Read what the zygote said (a rank ended; it could not reset the sandbox) and raise
        for a rank that ended during a call; `ended` (after exit requests) is kept."""
        msg = self.zygote.recv(1.0)
        if msg.get("op") == "rank_ended":
            how = f"signal {msg.get('signal')}" if msg.get("signal") else f"exit {msg.get('exit')}"
            self.ended[int(msg.get("rank", -1))] = how
            self.check_ended()
        elif msg.get("op") == "fork_failed":
            raise SandboxDamaged(
                f"rank sandbox {self.index} could not be reset for the next arm-run: "
                f"{str(msg.get('message'))[:400]}"
            )
        else:
            self.last_zygote = msg

    def await_end(self, rank: int, limit_s: float = 1.0) -> None:
        """A rank's pipe ended: wait briefly for the zygote to say how, and raise naming it."""
        deadline = time.monotonic() + limit_s
        while self.alive and rank not in self.ended and time.monotonic() < deadline:
            ready, _, _ = select.select([self.zygote.resp_r], [], [], deadline - time.monotonic())
            if ready:
                try:
                    self.watch()
                except RankFault:
                    raise
                except P.WorkerFault:
                    break
        self.check_ended()

    def check_ended(self) -> None:
        if self.alive and self.ended:
            rank = min(self.ended)
            raise RankFault("crash", [rank], f"rank {rank} ended ({self.ended[rank]}) mid-run")

    def end_ranks(self) -> None:
        """Ask every rank to exit, wait for the zygote to say they ended, and check from
        outside that nothing of them is left; the arm-run's channels are closed."""
        if not self.alive:
            return
        self.alive = False
        for ch in self.channels:
            try:
                ch.send({"op": "exit"})
            except P.WorkerFault:
                pass
        reply = self.zygote.recv(self.timeout)
        while reply.get("op") == "rank_ended":
            reply = self.zygote.recv(self.timeout)
        if reply.get("op") != "ended":
            raise P.WorkerFault("crash", f"protocol: exit answered {str(reply)[:200]}")
        self.close_channels()
        self.sandbox.await_leftovers(self.mode, "processes of the ranks outlived them")
        if self.proc.poll() is not None:
            raise P.WorkerFault("crash", "the ranks took their sandbox down")

    def close_channels(self) -> None:
        for ch in self.channels:
            ch.close()

    def rank_pids(self) -> list[int]:
        return [ch.child_pid for ch in self.channels if ch.child_pid]

    def cpu_ns(self) -> int:
        return T.tree_cpu_ns(self.pid)

    def kill(self) -> None:
        if self.sandbox is not None:
            self.sandbox.kill()
        self._release()

    def _release(self) -> None:
        if self._released:
            return
        self._released = True
        self.zygote.close()
        self.fd_sock.close()
        self.close_channels()


def start_sandboxes(count: int, attempts: int = 3, **kw) -> list[RankSandbox]:
    """`count` sandboxes in the strongest isolation that works here, started in parallel (each
    imports torch once); a failed start is retried (nothing of the candidate ran)."""

    def start(mode: str) -> list[RankSandbox]:
        boxes: list[RankSandbox] = []
        try:
            for index in range(count):
                boxes.append(RankSandbox(index=index, mode=mode, **kw))
            for box in boxes:
                box.wait_ready()
        except P.WorkerStartError:
            for box in boxes:
                box.kill()
            raise
        return boxes

    return I.in_strongest_mode(start, attempts)


class RankDelay:
    """How long the referee's thread and each rank's threads (as they are when made) waited
    for a CPU while runnable (schedstat, read from outside): proctree.DelayProbe, per rank."""

    def __init__(self, box: RankSandbox) -> None:
        self.referee = T.DelayProbe(None)
        self.ranks = [T.DelayProbe(pid, referee=False) for pid in box.rank_pids()]

    def read(self) -> list[int]:
        """[referee, rank 0, rank 1, ...] in ns."""
        return [self.referee.read()] + [p.read() for p in self.ranks]
