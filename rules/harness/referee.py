"""The referee's worker: one sandbox (isolation.py) holding worker.py's zygote, a fresh worker
forked from it per arm, asked to import, called (referee_timing.py) and ended; and the secret
seeds. The one module check.py and measure.py load for all of it.

The referee (check.py, measure.py) owns everything that decides a verdict. Candidate code runs
only in a worker (worker.py) started here, in the strongest isolation this host allows:

- `namespaces`: a nested bubblewrap with its own user, pid, ipc, net and mount namespaces; the
  exec root, the referee's work dir and /tmp are replaced by empty tmpfs, /proc by an empty one;
  it sees its own implementation folder read-only and nothing else of the action.
- `uid`: the referee is root and no namespace can be made: the worker runs as another uid
  (65533) in its own session; the referee's files are 0700.
- `process`: neither: its own session, the same uid. Recorded in the evidence.
In `uid` and `process` the worker shares a pid namespace with the other arm's worker and the
host, so its seccomp filter lets it name no pid but its own (signals, pidfd_open, scheduling,
limits: confine.py own_only); a worker whose report does not say so is not started.

The referee, the zygote and every worker are non-dumpable, and every worker runs with no
capabilities under a seccomp filter (confine.py): no worker can ptrace, read or write the
memory of, or signal, its zygote, the other arm or the referee. Inputs reach the worker only
when its call starts (referee_timing.py); what the worker says is data, parsed field by field
(referee_protocol.py); anything else is a protocol fault, the candidate's. This module must
never run candidate code itself, nor start a worker whose confinement report it has not checked.
"""

from __future__ import annotations

import runpy
import json
import os
import subprocess
import sys
from pathlib import Path


# NB: the harness's one sibling loader (siblings.py), itself run by path: no sys.path here
load_siblings = runpy.run_path(str(Path(__file__).resolve().parent / "siblings.py"))["load"]
P, T, I, TIMING = load_siblings("referee_protocol", "proctree", "isolation", "referee_timing")  # noqa: E741

# NB: what check.py, measure.py and multirank.py use of the referee, by one name each
confine = I.confine
WorkerFault, WorkerStartError, parse_reply = P.WorkerFault, P.WorkerStartError, P.parse_reply
ALIGN, SHIFT_MAX, pack_inputs, packed_size = P.ALIGN, P.SHIFT_MAX, P.pack_inputs, P.packed_size
TICK_NS, DelayProbe, Freezer, FreezeError = T.TICK_NS, T.DelayProbe, T.Freezer, T.FreezeError
descendants, tree_cpu_ns = T.descendants, T.tree_cpu_ns
unconfined, harden_self, tail, WORKER_UID = I.unconfined, I.harden_self, I.tail, I.WORKER_UID
isolation_modes, confinement_missing = I.isolation_modes, I.confinement_missing
allowed_cpus, worker_cpus, pin_referee = I.allowed_cpus, I.worker_cpus, I.pin_referee
Call, timed_call = TIMING.Call, TIMING.timed_call


def secret_seed() -> int:
    """A 63-bit seed from the OS, never derived from anything public; revealed after the run."""
    return int.from_bytes(os.urandom(8), "big") >> 1


class WorkerProcess(P.CallChannel):
    """One worker: started, asked to import, called, killed. Every wait has a deadline."""

    def __init__(
        self,
        *,
        framework: str,
        device: str,
        threads: int,
        impl_dir: Path,
        entry: dict,
        in_size: int,
        out_size: int,
        work_dir: Path,
        log_path: Path,
        mode: str,
        startup_timeout_s: float,
        also_visible: tuple[Path, ...] = (),
    ) -> None:
        self.unconfined = I.unconfined()
        super().__init__("the worker", in_size, out_size, "seal" not in self.unconfined)
        self.mode, self.impl_dir, self.entry = mode, impl_dir.resolve(), entry
        self.visible = (self.impl_dir, *(p.resolve() for p in also_visible))
        self.framework, self.device, self.threads = framework, device, int(threads)
        self.log_path = log_path
        self.sandbox = None
        worker_script = Path(__file__).resolve().parent / "worker.py"
        args = {
            "framework": framework,
            "device": device,
            "threads": self.threads,
            "req_fd": self.req_r,
            "resp_fd": self.resp_w,
            "in_fd": self.in_fd,
            "out_fd": self.out_fd,
            "ctl_fd": self.ctl_fd,
            "in_size": self.in_size,
            "out_size": self.out_size,
            "own_pid_namespace": mode == "namespaces",
            "unconfined": self.unconfined,
        }
        self.worker_cpus = I.worker_cpus(threads)
        try:
            self.sandbox = I.launch(
                [sys.executable, "-I", "-B", str(worker_script), json.dumps(args)],
                mode=mode,
                what="worker",
                device=device,
                visible=self.visible,
                scripts=(worker_script,),
                work_dir=work_dir,
                home_name="worker",
                threads=threads,
                log_path=log_path,
                pass_fds=self.child_ends(),
                cpus=self.worker_cpus,
            )
        except P.WorkerStartError:
            self.close()
            raise
        finally:
            self.close_child_ends()
        self.proc, self.pid, self.worker_env = self.sandbox.proc, self.sandbox.pid, self.sandbox.env
        self.startup_timeout_s = startup_timeout_s
        self.child_alive = False
        self.confinement: dict | None = None
        try:
            ready = self.recv(startup_timeout_s)
        except P.WorkerFault as exc:
            self.kill()
            raise P.WorkerStartError(
                f"worker ({mode}) did not get ready: {exc.detail}; log: {I.tail(log_path)}"
            ) from exc
        if ready.get("op") != "zygote":
            self.kill()
            raise P.WorkerStartError(f"worker ({mode}) answered {ready!r} instead of ready")

    def late(self) -> str:
        return "no reply in time; the worker was killed"

    def ended(self) -> P.WorkerFault:
        code = self.proc.poll()
        if code is None:
            try:
                code = self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                code = None
        how = f"signal {-code}" if code is not None and code < 0 else f"exit {code}"
        return P.WorkerFault("crash", f"the worker ended ({how}) without a reply")

    def fork_request(self) -> dict:
        """What a forked worker re-applies and protects before any candidate code runs: the
        environment and CPUs it was started with, and (outside a pid namespace, where pids
        are the referee's) the referee, its parent and every sandbox's zygote."""
        protect = []
        if self.mode != "namespaces":
            protect = sorted({os.getpid(), os.getppid(), *I.SANDBOXES})
        return {"op": "fork", "env": self.worker_env, "cpus": self.worker_cpus, "protect": protect}

    def fork(self) -> None:
        """A fresh worker forked from the sandbox's pristine zygote (no candidate code yet)."""
        try:
            reply = self.request(self.fork_request(), self.startup_timeout_s)
        except P.WorkerFault as exc:
            raise P.WorkerStartError(f"worker fork failed: {exc.detail}") from exc
        if reply.get("op") != "ready":
            raise P.WorkerStartError(f"worker fork answered {str(reply)[:200]}")
        self.child_alive = True
        self.confinement = reply.get("confined")
        missing = I.confinement_missing(
            self.confinement, self.unconfined, own_only=self.mode != "namespaces"
        )
        if missing:
            raise P.WorkerStartError(f"the forked worker is not confined: {missing}")
        # NB: its pid as seen from here (it reports the one in its own pid namespace), found
        # before any candidate code runs: the referee reads its CPU clock around every call
        self.child_pid = T.outside_pid(self.pid, reply.get("pid"))
        if self.child_pid is None:
            raise P.WorkerStartError(f"the forked worker (pid {reply.get('pid')}) is not in /proc")
        # NB: the zygote, as seen from here: every process of the sandbox that is not bwrap's
        # is below it (a subreaper: orphans of the worker's tree are re-parented to it)
        self.zygote_pid = T.parent_of(self.child_pid)
        if self.zygote_pid is None:
            raise P.WorkerStartError("the forked worker's zygote is not in /proc")

    def end_child(self, timeout_s: float) -> None:
        """Ask the worker to exit, wait for the zygote to say so, and check from outside that
        nothing of it is left (a worker that will not end is the candidate's failure)."""
        if not self.child_alive:
            return
        self.child_alive = False
        reply = self.request({"op": "exit"}, timeout_s)
        if reply.get("op") != "ended":
            raise P.WorkerFault("crash", f"protocol: exit answered {str(reply)[:200]}")
        self.sandbox.await_leftovers(self.mode, "processes of the worker outlived it")
        keep = 2 if self.mode == "namespaces" else 0
        if len(T.descendants(self.pid)) != keep or self.proc.poll() is not None:
            raise P.WorkerFault("crash", "the worker took its sandbox down (its zygote is gone)")

    def import_impl(self, timeout_s: float, impl_dir: Path | None = None) -> dict:
        impl = self.impl_dir if impl_dir is None else impl_dir.resolve()
        if impl not in self.visible:
            raise P.WorkerFault("protocol", f"{impl} is not visible in this sandbox")
        return self.request({"op": "import", "impl_dir": str(impl), "entry": self.entry}, timeout_s)

    def cpu_ns(self) -> int:
        return T.tree_cpu_ns(self.pid)

    def kill(self) -> None:
        """Kill the sandbox and everything below it; close our ends and buffers, remove the
        worker's home folder (nothing the referee made outlives it)."""
        if self.sandbox is not None:
            self.sandbox.kill()
        self.close()


def start_worker(*, attempts: int = 3, **kw) -> WorkerProcess:
    """Start a worker in the strongest isolation that works here; a start that fails (nothing
    of the candidate has run) is retried at most twice more, then is the harness's fault."""
    return I.in_strongest_mode(lambda mode: WorkerProcess(mode=mode, **kw), attempts)
