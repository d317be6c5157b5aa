"""The multi-rank referee's sandbox: one rank zygote (mr_worker.py) and, per arm-run, fresh
channels for its ranks, handed over once and never kept by anyone but the rank they belong to.

Owns the referee's side of rules/harness/SPEC.md "Multi-rank", "Ranks": it must never let a
rank reach another rank's channel, the zygote, or anything of an earlier arm-run (pipes,
buffers, temp folder); a sandbox that cannot be reset after an implementation ran in it is
that implementation's failure (`SandboxDamaged`), never a harness fault.
Stdlib + the harness modules multirank.py has loaded (referee.py, _common.py).
"""

from __future__ import annotations

import importlib.util
import json
import mmap
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def _loaded(name: str, stem: str):
    """The harness module multirank.py loaded (so exception classes are the same objects)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().with_name(stem))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


C = _loaded("_rsi_harness_common", "_common.py")
R = _loaded("_rsi_harness_referee", "referee.py")
confine = _loaded("_rsi_harness_confine", "confine.py")

FDS_PER_RANK = 5  # req_r, resp_w, in, out, ctl: a rank's whole channel
# NB: tests only: a comma list naming defences to leave out, so a test can show a hostile
# candidate wins without them ("dump": zygote and ranks stay dumpable, "seccomp", "caps",
# "tmp_reset": the zygote neither repairs nor renews the temp folder). Read from the referee's
# environment (no rank writes it); every use is in the evidence (`referee.unconfined`).
UNCONFINED_ENV = "_RSI_TEST_UNCONFINED"


def unconfined() -> list[str]:
    raw = os.environ.get(UNCONFINED_ENV, "")
    return sorted({p.strip() for p in raw.split(",") if p.strip()})


class RankFault(R.WorkerFault):
    """A rank (or several) failed a call: `ranks` names them."""

    def __init__(self, code: str, ranks: list[int], detail: str):
        super().__init__(code, detail)
        self.ranks = ranks


class SandboxDamaged(R.WorkerStartError):
    """The zygote could not reset the sandbox for the next arm-run (its temp folder): what ran
    in it last did that (`RankSandbox.last_arm`)."""


class Pipe:
    """One request/reply channel to a process of the sandbox (worker.py's framing)."""

    send = R.WorkerProcess.send
    recv = R.WorkerProcess.recv
    request = R.WorkerProcess.request

    def __init__(self, who: str) -> None:
        self.who = who
        self.req_r, self.req_w = os.pipe()
        self.resp_r, self.resp_w = os.pipe()

    def _read(self, size: int, deadline: float) -> bytes:
        chunks, left = [], size
        while left:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise R.WorkerFault("timeout", f"{self.who}: no reply in time")
            ready, _, _ = select.select([self.resp_r], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(self.resp_r, left)
            if not chunk:
                raise R.WorkerFault("crash", f"{self.who} ended without a reply")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def child_ends(self) -> list[int]:
        return [self.req_r, self.resp_w]

    def close_child_ends(self) -> None:
        """Once the sandbox holds them (each end closed once: a number is reused at once)."""
        for fd in (self.req_r, self.resp_w):
            if fd >= 0:
                os.close(fd)
        self.req_r = self.resp_w = -1

    def close(self) -> None:
        for fd in (self.req_r, self.req_w, self.resp_r, self.resp_w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.req_r = self.req_w = self.resp_r = self.resp_w = -1


class RankChannel(Pipe):
    """Rank r's channel for ONE arm-run: pipes and sealed input, output and control buffers.

    Made fresh for every arm-run and handed to the zygote once (SCM_RIGHTS); the zygote closes
    its copies as soon as the ranks are forked, so the rank is the only other holder: its death
    is an end-of-file here, and nothing it left in a pipe or buffer reaches a later arm-run."""

    layout = R.WorkerProcess.layout

    def __init__(self, rank: int, in_size: int, out_size: int, box=None) -> None:
        super().__init__(f"rank {rank}")
        self.rank, self.box = rank, box
        self.in_size, self.out_size = max(in_size, 1), max(out_size, 1)
        seal = "seal" not in unconfined()
        self.in_fd = R._memfd(f"rsi-in-{rank}", self.in_size, seal)
        self.out_fd = R._memfd(f"rsi-out-{rank}", self.out_size, seal)
        self.ctl_fd = R._memfd(f"rsi-ctl-{rank}", R.CTL_SIZE, seal)
        self.in_buf = mmap.mmap(self.in_fd, self.in_size)
        self.out_buf = mmap.mmap(self.out_fd, self.out_size)
        self.ctl = mmap.mmap(self.ctl_fd, R.CTL_SIZE)
        R._SEQ.pack_into(self.ctl, R.REQ_AT, R.NO_CALL)
        R._SEQ.pack_into(self.ctl, R.DONE_AT, R.NO_CALL)
        self.child_pid = None
        self.header = None

    def child_ends(self) -> list[int]:
        return [self.req_r, self.resp_w, self.in_fd, self.out_fd, self.ctl_fd]

    def _read(self, size: int, deadline: float) -> bytes:
        chunks, left = [], size
        zfd = self.box.zygote.resp_r if self.box is not None else -1
        while left:
            if self.box is not None:
                self.box.check_ended()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise R.WorkerFault("timeout", f"{self.who}: no reply in time")
            fds = [self.resp_r] + ([zfd] if zfd >= 0 else [])
            ready, _, _ = select.select(fds, [], [], remaining)
            if zfd in ready and self.resp_r not in ready:
                self.box.watch()
                continue
            if not ready:
                continue
            chunk = os.read(self.resp_r, left)
            if not chunk:
                if self.box is not None:
                    self.box.await_end(self.rank)
                raise R.WorkerFault("crash", f"{self.who} ended without a reply")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def set_layout(self, header: dict, timeout_s: float) -> None:
        if header != self.header:
            self.layout(header, timeout_s)
            self.header = header

    def close(self) -> None:
        super().close()
        for fd in (self.in_fd, self.out_fd, self.ctl_fd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.in_fd = self.out_fd = self.ctl_fd = -1
        for buf in (self.in_buf, self.out_buf, self.ctl):
            try:
                buf.close()
            except (BufferError, ValueError):
                pass


def confinement_missing(report, skipped=()) -> str | None:
    """What a rank's report says does not hold (None: all of it holds)."""
    if not isinstance(report, dict):
        return "no confinement report"
    problems = []
    if "caps" not in skipped and report.get("cap_eff") != 0:
        problems.append(f"capabilities {report.get('cap_eff')} {report.get('cap_error') or ''}")
    if "dump" not in skipped and report.get("dumpable") is not False:
        problems.append(f"dumpable {report.get('dump_error') or ''}")
    if "seccomp" not in skipped and report.get("seccomp") != 2:
        problems.append(f"no seccomp filter {report.get('seccomp_error') or ''}")
    elif not {"seccomp", "own_only"} & set(skipped) and report.get("signals") != "own":
        # NB: a rank shares its pid namespace with its peers in every mode: it may name no pid
        # but its own (confine.py own_only), or it could stop or kill the peer rank
        problems.append("its filter lets it signal pids other than its own")
    return "; ".join(p.strip() for p in problems) or None


SANDBOXES: set[int] = set()  # every rank zygote this referee started (protected from ranks)


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
        self._home = None
        self.alive = False
        self.last_arm: str | None = None  # whose code ran in this sandbox last (see fork)
        self.runs = 0
        self.zygote = Pipe("the rank zygote")
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
        argv = [sys.executable, "-I", "-B", str(script), json.dumps(args)]
        home, cwd, preexec = "/tmp", "/", None
        if mode == "namespaces":
            base = R.WorkerProcess._bwrap_argv(self, work_dir, script)
            for name in ("worker.py", "confine.py"):
                base += ["--ro-bind", str(here / name), str(here / name)]
            argv = base + argv
        elif mode == "uid":
            home_dir = Path(os.environ.get("TMPDIR") or "/tmp") / (
                f"rsi-ranks-{os.getpid()}-{time.monotonic_ns()}"
            )
            home_dir.mkdir(mode=0o700)
            os.chown(home_dir, R.WORKER_UID, R.WORKER_UID)
            self._home = home_dir
            home = cwd = str(home_dir)

            def preexec():
                os.setgroups([])
                os.setgid(R.WORKER_UID)
                os.setuid(R.WORKER_UID)
        else:
            home_dir = work_dir / f"ranks-home-{index}-{time.monotonic_ns()}"
            home_dir.mkdir()
            self._home = home_dir
            home = cwd = str(home_dir)
        self.env = R._env(int(spec["threads"]), home)
        ends = self.zygote.child_ends() + [child_sock.fileno()]
        self._released = False
        log = open(self.log, "ab")  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=ends,
                start_new_session=True,
                preexec_fn=preexec,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            self._release()
            raise R.WorkerStartError(f"cannot start the rank sandbox ({mode}): {exc}") from exc
        finally:
            log.close()
            self.zygote.close_child_ends()
            child_sock.close()
        self.pid = self.proc.pid
        SANDBOXES.add(self.pid)

    def wait_ready(self) -> None:
        """The zygote has imported torch (sandboxes start in parallel, then wait here)."""
        try:
            ready = self.zygote.recv(self.startup)
        except R.WorkerFault as exc:
            self.kill()
            raise R.WorkerStartError(
                f"rank sandbox ({self.mode}) did not get ready: {exc.detail}; "
                f"log: {R.tail(self.log)}"
            ) from exc
        if ready.get("op") != "zygote":
            self.kill()
            raise R.WorkerStartError(f"rank sandbox ({self.mode}) answered {str(ready)[:200]}")

    def fork_request(self) -> dict:
        """What every rank re-applies and protects before any candidate code runs."""
        protect = []
        if self.mode != "namespaces":
            protect = sorted({os.getpid(), os.getppid(), *SANDBOXES})
        return {
            "op": "fork",
            "store": os.urandom(8).hex(),  # NB: the arm-run's temp folder and rendezvous name
            "env": self.env,
            "cpus": R.allowed_cpus() or None,
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
                raise R.WorkerFault("crash", f"the zygote took no channels ({exc})") from exc
            self.runs += 1
            for ch in self.channels:
                ch.close_child_ends()
            self.alive = True
            for ch in self.channels:
                reply = ch.recv(self.startup)
                if reply.get("op") != "ready":
                    raise R.WorkerStartError(
                        f"rank {ch.rank} did not join the process group: {str(reply)[:400]}"
                    )
                missing = confinement_missing(reply.get("confined"), self.unconfined)
                if missing:
                    raise R.WorkerStartError(f"rank {ch.rank} is not confined: {missing}")
                ch.child_pid = R._outside_pid(self.pid, reply.get("pid"))
                if ch.child_pid is None:
                    raise R.WorkerStartError(f"rank {ch.rank}'s worker is not in /proc")
        except SandboxDamaged:
            raise
        except R.WorkerFault as exc:
            raise R.WorkerStartError(
                f"rank workers failed to start: {exc.detail}; log: {R.tail(self.log)}"
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
        except R.WorkerFault as exc:
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
                except R.WorkerFault:
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
            except R.WorkerFault:
                pass
        reply = self.zygote.recv(self.timeout)
        while reply.get("op") == "rank_ended":
            reply = self.zygote.recv(self.timeout)
        if reply.get("op") != "ended":
            raise R.WorkerFault("crash", f"protocol: exit answered {str(reply)[:200]}")
        self.close_channels()
        keep = 2 if self.mode == "namespaces" else 0
        deadline = time.monotonic() + 2.0
        while len(R.descendants(self.pid)) > keep:
            if time.monotonic() > deadline:
                raise R.WorkerFault("crash", "processes of the ranks outlived them")
            time.sleep(0.005)
        if self.proc.poll() is not None:
            raise R.WorkerFault("crash", "the ranks took their sandbox down")

    def close_channels(self) -> None:
        for ch in self.channels:
            ch.close()

    def rank_pids(self) -> list[int]:
        return [ch.child_pid for ch in self.channels if ch.child_pid]

    def cpu_ns(self) -> int:
        return R.tree_cpu_ns(self.pid)

    def kill(self) -> None:
        SANDBOXES.discard(getattr(self, "pid", None))
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, AttributeError):
            pass
        for pid in R.descendants(getattr(self, "pid", -1)):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        proc = getattr(self, "proc", None)
        if proc is not None:
            try:
                proc.kill()
                proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._release()

    def _release(self) -> None:
        if getattr(self, "_released", False):
            return
        self._released = True
        self.zygote.close()
        self.fd_sock.close()
        self.close_channels()
        if self._home is not None:
            shutil.rmtree(self._home, ignore_errors=True)


def start_sandboxes(count: int, attempts: int = 3, **kw) -> list[RankSandbox]:
    """`count` sandboxes in the strongest isolation that works here, started in parallel (each
    imports torch once); a failed start is retried (nothing of the candidate ran)."""
    errors = []
    for attempt in range(attempts):
        for mode in R.isolation_modes():
            boxes: list[RankSandbox] = []
            try:
                for index in range(count):
                    boxes.append(RankSandbox(index=index, mode=mode, **kw))
                for box in boxes:
                    box.wait_ready()
                return boxes
            except R.WorkerStartError as exc:
                errors.append(str(exc))
                for box in boxes:
                    box.kill()
        if attempt + 1 < attempts:
            time.sleep(0.2)
    raise R.WorkerStartError("; ".join(errors[-3:]))


class RankDelay:
    """How long the referee's thread and each rank's threads (as they are when made) waited
    for a CPU while runnable (schedstat, read from outside): referee.DelayProbe, per rank."""

    def __init__(self, box: RankSandbox) -> None:
        self.referee = R.DelayProbe.__new__(R.DelayProbe)
        self.referee.paths = ["/proc/thread-self/schedstat"]
        self.ranks = []
        for pid in box.rank_pids():
            probe = R.DelayProbe.__new__(R.DelayProbe)
            probe.paths = [
                f"/proc/{p}/task/{tid}/schedstat"
                for p in [pid, *R.descendants(pid)]
                for tid in R._threads(p)
            ]
            self.ranks.append(probe)

    def read(self) -> list[int]:
        """[referee, rank 0, rank 1, ...] in ns."""
        return [self.referee.read()] + [p.read() for p in self.ranks]
