"""The Slurm executor: each action is a Slurm batch job.

The store is the channel. Before submitting, every input is made a blob of the store (workspace
sources are copied in and checked against the digest the key was computed from), and the action
is written, without its host paths, to `<store>/slurm/<id>/action.json`. The job runs
`python -m rsi.executors.slurm_node` on the node with the same interpreter (the store and the
environment rsi runs from must be on a path every node mounts at the same place:
docs/slurm.md); the node runs the action in its own sandbox (the local executor, as on any
host), puts the outputs into the store and writes `result.json`. Back here, nothing is taken on
the node's word: every output and log blob is re-hashed from the store before the result is
returned (and so before it is cached).

What Slurm says decides the kind of failure. A job that ran and wrote a result is the action's
own result (a candidate's crash stays the candidate's). Slurm's time limit is the action's
timeout. NODE_FAIL, PREEMPTED, BOOT_FAIL, a job cancelled by someone else, a job pending past
`pending_timeout_s` (a drained or down node: the reason is in the message) and a job that
ended without a result are infrastructure failures, which the scheduler retries. Cancelling a
build (Ctrl-C, a job cancel, a deadline) runs `scancel` and waits until Slurm reports the job
ended.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from rsi.action import Action, ActionResult
from rsi.digest import Digest, FileNode
from rsi.errors import ExecutionError, RsiError
from rsi.fsutil import atomic_write_bytes
from rsi.limits import Limits
from rsi.store import LocalStore

SETTINGS = {
    "partition": str,
    "account": str,
    "qos": str,
    "gres": str,  # NB: for actions that ask for an accelerator (`gpu:1`); others ask for none
    "time_limit_min": int,  # NB: a ceiling; each job asks for its action's timeout, rounded up
    "pending_timeout_s": float,
    "poll_s": float,
    "extra_args": list,
    "bin_dir": str,  # NB: where sbatch, squeue, scontrol, scancel are (default: PATH)
}
JOB_SCHEMA = "rsi.slurm.action/1"
# NB: Slurm states in which the job has ended
ENDED = {
    "COMPLETED",
    "FAILED",
    "TIMEOUT",
    "CANCELLED",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "OUT_OF_MEMORY",
    "DEADLINE",
    "SPECIAL_EXIT",
    "REVOKED",
}
INFRASTRUCTURE = {"NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"}


def check_settings(section: object, file: str) -> dict:
    """The [slurm] table of rsi.toml, checked (errors name the file and the key)."""
    from rsi.errors import DeclarationError

    if not isinstance(section, dict):
        raise DeclarationError("[slurm] must be a table", file=file, field="slurm")
    for key, value in section.items():
        want = SETTINGS.get(key)
        if want is None:
            raise DeclarationError(
                "unknown setting in [slurm]",
                file=file,
                field=key,
                hint=f"known settings: {', '.join(sorted(SETTINGS))}",
            )
        ok = isinstance(value, want) and not isinstance(value, bool)
        if want is float:
            ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
        if not ok or (want is int and value < 1):
            raise DeclarationError(
                f"expected {'a positive number' if want is float else want.__name__}, "
                f"got {value!r}",
                file=file,
                field=key,
            )
        if want is list and not all(isinstance(v, str) for v in value):
            raise DeclarationError("expected a list of strings", file=file, field=key)
    return dict(section)


def encode_action(action: Action) -> dict:
    """The action as the node reads it: everything but where sources lie on this host."""
    return {
        "schema": JOB_SCHEMA,
        "argv": list(action.argv),
        "inputs": [[p, n.encode()] for p, n in action.inputs],
        "outputs": list(action.outputs),
        "env": [list(e) for e in action.env],
        "platform": [list(p) for p in action.platform],
        "timeout_s": action.timeout_s,
        "salt": action.salt,
        "digest_function": action.digest_function,
        "label": action.label,
        "mnemonic": action.mnemonic,
        "tags": list(action.tags),
    }


def decode_action(doc: dict) -> Action:
    from rsi.digest import SymlinkNode

    if doc.get("schema") != JOB_SCHEMA:
        raise ValueError(f"unknown action schema {doc.get('schema')!r}")

    def node(encoded: list) -> Any:
        if encoded[0] == "symlink":
            return SymlinkNode(encoded[1])
        return FileNode(Digest(encoded[0], int(encoded[1])), bool(encoded[2]))

    return Action(
        argv=tuple(doc["argv"]),
        inputs=tuple((p, node(n)) for p, n in doc["inputs"]),
        outputs=tuple(doc["outputs"]),
        env=tuple(tuple(e) for e in doc["env"]),
        platform=tuple(tuple(p) for p in doc["platform"]),
        timeout_s=float(doc["timeout_s"]),
        salt=doc["salt"],
        digest_function=doc["digest_function"],
        label=doc.get("label", ""),
        mnemonic=doc.get("mnemonic", "Action"),
        tags=tuple(doc.get("tags", ())),
    )


class SlurmExecutor:
    name = "slurm"
    copies_sources = True

    def __init__(self, settings: dict | None = None, limits: Limits | None = None) -> None:
        self.settings = dict(settings or {})
        self.limits = limits or Limits.default()
        self.poll_s = float(self.settings.get("poll_s", 0.25))
        self.pending_timeout_s = float(self.settings.get("pending_timeout_s", 3600.0))
        bin_dir = self.settings.get("bin_dir")
        self._bin = (lambda n: os.path.join(bin_dir, n)) if bin_dir else (lambda n: n)

    def capabilities(self) -> dict:
        """What the cluster's nodes offer, not this submit host: an accelerator where `gres`
        is set (`[slurm] gres = "gpu:1"`), none otherwise."""
        gres = str(self.settings.get("gres") or "")
        return {"accelerator": frozenset({"cuda", "nvidia"} if gres.startswith("gpu") else ())}

    # ------------------------------------------------------------------------ slurm commands

    def _cmd(self, name: str, *args: str, check: bool = True) -> str:
        try:
            proc = subprocess.run(
                [self._bin(name), *args],
                capture_output=True,
                text=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ExecutionError(
                f"{name} could not be run: {exc}",
                hint="is Slurm installed here and SLURM_CONF set? ([slurm] bin_dir)",
            ) from exc
        if check and proc.returncode != 0:
            raise ExecutionError(f"{name} {' '.join(args)}: {proc.stderr.strip()[:500]}")
        return proc.stdout

    def job_state(self, job: str) -> tuple[str, dict]:
        """(state, the job's fields) from `scontrol show job` (no accounting needed)."""
        out = self._cmd("scontrol", "show", "job", "-o", job, check=False)
        fields: dict[str, str] = {}
        for part in out.split():
            key, sep, value = part.partition("=")
            if sep:
                fields.setdefault(key, value)
        state = fields.get("JobState", "")
        if not state:
            # NB: the record is gone (MinJobAge passed): ask squeue, then assume it ended
            queued = self._cmd("squeue", "-h", "-j", job, "-o", "%T", check=False).strip()
            state = queued or "UNKNOWN_ENDED"
        return state, fields

    def _sbatch_args(self, action: Action, job_dir: Path) -> list[str]:
        s = self.settings
        minutes = max(1, math.ceil(action.timeout_s / 60) + 1)
        if s.get("time_limit_min"):
            minutes = min(minutes, int(s["time_limit_min"]))
        args = [
            "--parsable",
            f"--job-name=rsi-{action.mnemonic}",
            f"--output={job_dir}/slurm.out",
            f"--chdir={job_dir}",
            f"--time={minutes}",
            "--nodes=1",
            "--ntasks=1",
            # NB: nothing of this shell's environment (the action's env is explicit) and no
            # login environment either (NONE has slurmd build one with `su -`: seconds a job)
            "--export=NIL",
        ]
        for key in ("partition", "account", "qos"):
            if s.get(key):
                args.append(f"--{key}={s[key]}")
        platform = dict(action.platform)
        if platform.get("accelerator") and s.get("gres"):
            args.append(f"--gres={s['gres']}")
        threads = platform.get("threads")
        if threads and threads.isdigit():
            args.append(f"--cpus-per-task={threads}")
        if action.exclusive:
            args.append("--exclusive")  # NB: a timed action has the node to itself
        args += list(s.get("extra_args") or [])
        node = [sys.executable, "-m", "rsi.executors.slurm_node", str(job_dir)]
        args += ["--wrap", "exec " + " ".join(_sh_quote(a) for a in node)]
        return args

    # ------------------------------------------------------------------------------- run

    def run(
        self, action: Action, store: LocalStore, cancel: threading.Event | None = None
    ) -> ActionResult:
        _stage_sources(action, store)
        job_dir = store.root / "slurm" / uuid.uuid4().hex
        job_dir.mkdir(parents=True)
        try:
            doc = dict(
                encode_action(action),
                limits={
                    "scratch_bytes": self.limits.scratch_bytes,
                    "memory_bytes": self.limits.memory_bytes,
                },
                store=str(store.root),
            )
            atomic_write_bytes(job_dir / "action.json", json.dumps(doc).encode())
            t0 = time.time()
            job = self._cmd("sbatch", *self._sbatch_args(action, job_dir)).strip().split(";")[0]
            if not job.isdigit():
                raise ExecutionError(f"sbatch printed no job id: {job!r}")
            state, fields = self._wait(job, cancel)
            return self._result(action, store, job, job_dir, state, fields, time.time() - t0)
        finally:
            shutil.rmtree(job_dir, ignore_errors=True)

    def _wait(self, job: str, cancel: threading.Event | None) -> tuple[str, dict]:
        pending_since = time.monotonic()
        try:
            while True:
                state, fields = self.job_state(job)
                base = state.split()[0] if state else state
                if base in ENDED or base == "UNKNOWN_ENDED":
                    return base, fields
                if base == "PENDING":
                    if time.monotonic() - pending_since > self.pending_timeout_s:
                        self._scancel(job)
                        raise ExecutionError(
                            f"Slurm job {job} stayed pending for more than "
                            f"{self.pending_timeout_s:g} s (reason: {fields.get('Reason')})",
                            hint="the partition has no node that can run it now (drained, "
                            "down or busy); the build can be run again",
                        )
                else:
                    pending_since = time.monotonic()
                if cancel is not None and cancel.wait(self.poll_s):
                    self._scancel(job)
                    raise ExecutionError("cancelled")
                if cancel is None:
                    time.sleep(self.poll_s)
        except BaseException:
            # NB: Ctrl-C, a deadline, a crash here: the job must not outlive the build
            if self.job_state(job)[0].split()[0] not in ENDED | {"UNKNOWN_ENDED"}:
                self._scancel(job)
            raise

    def _scancel(self, job: str, wait_s: float = 60.0) -> None:
        """scancel, then wait until Slurm reports the job ended."""
        self._cmd("scancel", job, check=False)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            state = self.job_state(job)[0].split()[0]
            if state in ENDED or state == "UNKNOWN_ENDED":
                return
            time.sleep(0.1)
        raise ExecutionError(f"Slurm job {job} did not end within {wait_s:g} s of scancel")

    def _result(
        self,
        action: Action,
        store: LocalStore,
        job: str,
        job_dir: Path,
        state: str,
        fields: dict,
        wall_s: float,
    ) -> ActionResult:
        where = {"job_id": job, "state": state, "node": fields.get("NodeList")}
        path = job_dir / "result.json"
        if state == "TIMEOUT":
            return ActionResult(
                exit_code=-signal.SIGKILL,
                timed_out=True,
                failure=f"timed out: Slurm's time limit ({fields.get('TimeLimit', '?')}) "
                f"ended job {job} (the action's timeout is {action.timeout_s:g}s)",
                executor=self.name,
                host={"slurm": where},
                timing={"wall_s": wall_s},
            )
        if state in INFRASTRUCTURE:
            raise ExecutionError(
                f"Slurm job {job} ended {state} on {fields.get('NodeList') or 'its node'}",
                hint="an infrastructure failure (node failure, preemption): the build can be "
                "run again",
            )
        if not path.exists():
            tail = _tail(job_dir / "slurm.out")
            raise ExecutionError(
                f"Slurm job {job} ended {state} without a result"
                + (f" (ExitCode {fields.get('ExitCode')})" if fields.get("ExitCode") else "")
                + (f":\n{tail}" if tail else ""),
                hint="the node could not run rsi's runner: the store and rsi's environment "
                "must be on a path the node mounts at the same place (docs/slurm.md)",
            )
        try:
            doc = json.loads(path.read_text())
            result = ActionResult.from_json(doc["result"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ExecutionError(f"Slurm job {job}: unreadable result: {exc}") from exc
        # NB: the node's word is not taken: every blob it names is re-hashed here
        for digest in result.blobs():
            if not store.has_verified(digest):
                raise ExecutionError(
                    f"Slurm job {job}: output blob {digest} is missing or does not match "
                    "its digest in the store",
                    hint="the node and this host must see the same store",
                )
        host = dict(result.host, slurm=dict(where, node_host=doc.get("node_host")))
        timing = dict(result.timing, slurm_wall_s=wall_s)
        return ActionResult(
            exit_code=result.exit_code,
            outputs=result.outputs,
            stdout=result.stdout,
            stderr=result.stderr,
            timed_out=result.timed_out,
            failure=result.failure,
            executor=self.name,
            host=host,
            timing=timing,
        )


def _stage_sources(action: Action, store: LocalStore) -> None:
    """Every workspace source becomes a blob of the store (the only thing the node reads),
    checked against the digest the action's key was computed from."""
    nodes = action.input_map
    for rel, src in action.sources:
        node = nodes.get(rel)
        if not isinstance(node, FileNode) or store.has(node.digest):
            continue
        try:
            got = store.put_file(src)
        except (OSError, RsiError) as exc:
            raise ExecutionError(f"cannot read input {src}: {exc}") from exc
        if got != node.digest:
            store.file_memo.forget(src)
            raise ExecutionError(
                f"{src} changed while the build was running", hint="run the build again"
            )


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").strip().splitlines()[-n:])
    except OSError:
        return ""


def _sh_quote(s: str) -> str:
    import shlex

    return shlex.quote(s)
