"""The job runner: `python -m rsi.jobs.runner STORE JOB`, started detached by `rsi job submit` or
`resume` (own session, stdio to `<store>/jobs/<job>/runner.log`, in the job's cgroup before it runs
a line of Python). It runs the job's kind in process, writes the job's event stream, heartbeats into
the jobs database and enforces the profile's budgets: those counted per unit of work (rounds, calls,
tokens, money, retries) before each unit, and wall time, disk, memory and each action's run time
from a watchdog thread, which stops the build in progress (as SIGTERM does: running actions are
killed, finished results kept) and names the budget as the stop reason. It must never judge anything
a plain `rsi build` would not.

A runner killed with SIGKILL (or a reboot) leaves its record `running`: `rsi job status`
reads it as `interrupted` (the recorded pid, start time and boot id no longer name a live
process) and `rsi job resume` starts a new runner, which first kills what the old one left
in the job's cgroup, then runs the job again: every action that finished is a cache hit.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from rsi.errors import RsiError
from rsi.jobs import contain
from rsi.jobs.db import TERMINAL, JobDB, job_dir
from rsi.jobs.events import JobEvents
from rsi.jobs.profile import BudgetStop, Ledger, parse_profile

HEARTBEAT_S = 2.0
WATCH_S = 0.25
DISK_EVERY_S = 1.0


class JobSignal(KeyboardInterrupt):
    def __init__(self, signum: int) -> None:
        self.signal = signal.Signals(signum).name
        self.exit_code = 128 + signum
        super().__init__(self.signal)


def dir_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path, onerror=lambda e: None):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total


class Runner:
    def __init__(self, store_root: Path, job_id: str) -> None:
        self.store_root = Path(store_root)
        self.job_id = job_id
        self.db = JobDB(self.store_root)
        job = self.db.get(job_id)
        if job is None:
            raise SystemExit(f"rsi job runner: no job {job_id} in {self.db.path}")
        self.job = job
        self.dir = job_dir(self.store_root, job_id)
        self.tmp = self.dir / "tmp"
        p = job["profile"]
        self.profile = parse_profile(
            (p.get("text") or "").encode(), name=p["name"], path=p.get("path")
        )
        self.ledger = Ledger(self.profile)
        self.stop: BudgetStop | None = None
        self.running: dict[str, float] = {}  # NB: action id -> when it started (misses)
        self.executed_keys: list[str] = []
        self.counts = {"hit": 0, "miss_ok": 0, "failed": 0, "retryable": 0}
        self.retryable_in_build = False
        self.output_bytes = 0
        self.memory_hit = False
        self.partial: dict | None = None
        self.action_parents: list[str] = []
        self._sized: set[str] = set()
        self.done = threading.Event()
        self.main_thread = threading.main_thread()
        self.lock_timeout = job["settings"].get("lock_timeout")
        self.store = None

    # ------------------------------------------------------------------ events & accounting
    def observe(self, doc: dict) -> None:
        kind = doc.get("kind")
        if kind == "action_started":
            self.running[doc.get("action", "")] = time.monotonic()
        elif kind == "action_finished":
            self.running.pop(doc.get("action", ""), None)
            cache, status = doc.get("cache"), doc.get("status")
            if cache in ("hit", "remote_hit"):
                self.counts["hit"] += 1
            elif status == "ok":
                self.counts["miss_ok"] += 1
                if doc.get("key"):
                    self.executed_keys.append(doc["key"])
            if status in ("failed", "error"):
                self.counts["failed"] += 1
            if doc.get("reason") == "memory_limit" and self.profile.limit("memory_bytes"):
                # NB: an action's memory limit is the job's memory budget (at most)
                self.memory_hit = True
            if status == "error" and doc.get("retryable"):
                self.counts["retryable"] += 1
                self.retryable_in_build = True
        elif kind == "actions_cached" and not doc.get("listed"):
            self.counts["hit"] += int(doc.get("count") or 0)  # NB: hits not listed one by one
        elif kind == "build_started":
            self.running.clear()

    def event(self, kind: str, **fields: Any) -> int:
        return self.events.emit(kind, self.root_event, job=self.job_id, **fields)

    def last_build_retryable(self) -> bool:
        return self.retryable_in_build

    def _outputs_bytes(self) -> int:
        """Bytes of the outputs the job's executed actions wrote (each result read once)."""
        from rsi.digest import Digest

        for key in self.executed_keys[len(self._sized) :]:
            self._sized.add(key)
            try:
                result = self.store.get_action_result(Digest.parse(key), check_blobs=False)
            except Exception:  # noqa: BLE001 - NB: a result gone or unreadable counts nothing
                result = None
            if result is not None:
                self.output_bytes += sum(o.digest.size for o in result.outputs)
        return self.output_bytes

    def disk_bytes(self) -> int:
        total = dir_bytes(self.dir) + self._outputs_bytes()
        pids = {str(p) for p in self.job_pids()}
        if self.store is not None and self.store.tmp.exists():
            for entry in self.store.tmp.iterdir():
                parts = entry.name.split("-")
                if len(parts) > 1 and parts[1] in pids:
                    total += dir_bytes(entry) if entry.is_dir() else entry.stat().st_size
        return total

    def job_pids(self) -> set[int]:
        if self.job["containment"] == "cgroup":
            return contain.cgroup_pids(self.job["cgroups"] or [])
        return contain.session_pids([os.getpid()])

    def memory_bytes(self) -> tuple[int | None, bool]:
        used, hit = contain.memory_usage(self.action_parents, [os.getpid()])
        if used is not None:
            return used, hit
        total = 0
        for pid in self.job_pids():
            try:
                with open(f"/proc/{pid}/statm") as f:
                    total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            except (OSError, ValueError, IndexError):
                pass
        return total, False

    def check_measured(self, *, final: bool = False) -> None:
        """Wall, disk, memory and the running actions' times against the profile (raises
        BudgetStop). `final`: once more after the work, so a budget passed in its last
        moments is not missed."""
        first = self.job["first_started_at"] or time.time()
        self.ledger.check_wall(time.time() - first)
        if self.profile.limit("action_timeout_s") is not None and self.running:
            now = time.monotonic()
            action, since = max(self.running.items(), key=lambda kv: now - kv[1])
            self.ledger.check_amount(
                "action_timeout_s", round(now - since, 3), f"action {action} has run (s)"
            )
        if self.profile.limit("memory_bytes") is not None:
            used, hit = self.memory_bytes()
            if hit or self.memory_hit:
                used = max(used or 0, int(self.profile.limit("memory_bytes")))
            self.ledger.check_amount("memory_bytes", used, "the job's processes use (bytes)")
        if self.profile.limit("disk_bytes") is not None and (
            final or time.monotonic() - self._disk_at >= DISK_EVERY_S
        ):
            self._disk_at = time.monotonic()
            self.ledger.check_amount("disk_bytes", self.disk_bytes(), "the job wrote (bytes)")

    def watchdog(self) -> None:
        beat = 0.0
        self._disk_at = 0.0
        while not self.done.wait(WATCH_S):
            now = time.monotonic()
            if now - beat >= HEARTBEAT_S:
                beat = now
                try:
                    with JobDB(self.store_root) as db:
                        db.update(self.job_id, heartbeat_at=time.time())
                        cancel = db.get(self.job_id)["cancel_requested_at"]
                except Exception:  # noqa: BLE001 - NB: a busy database: next beat
                    cancel = None
                if cancel and self.stop is None:
                    os.kill(os.getpid(), signal.SIGTERM)
            if self.stop is not None:
                continue
            try:
                self.check_measured()
            except BudgetStop as stop:
                self.stop = stop
                self.event("job_budget", **stop.to_json())
                os.kill(os.getpid(), signal.SIGTERM)

    def check(self) -> None:
        """Between units of work: a budget the watchdog found reached stops the job here."""
        if self.stop is not None:
            raise self.stop
        self.check_measured()

    # --------------------------------------------------------------------------- building
    def build(self, patterns: list[str], *, package: str = "", **_: Any) -> Any:
        """rsi.build.build of `patterns` with the job's settings, into the job's stream."""
        from rsi.build import build

        self.check()
        os.chdir(self.ws.root / package if (self.ws.root / package).is_dir() else self.ws.root)
        self.retryable_in_build = False
        self.events.parent_for_builds = self.root_event
        try:
            return build(
                self.ws,
                list(patterns),
                events_to=self.events,
                progress=False,
                lock_timeout=self.lock_timeout,
            )
        finally:
            self.running.clear()

    def builder(self, ws: Any, patterns: list[str], events_to: Any = None, lock_timeout=None):
        """The `builder` the campaign service calls (its workspace carries keep_going)."""
        from rsi.build import build

        self.check()
        self.retryable_in_build = False
        self.events.parent_for_builds = self.root_event
        ws = ws.with_overrides(
            **{k: v for k, v in self.job["settings"]["overrides"].items() if k != "keep_going"}
        )
        return build(
            ws,
            list(patterns),
            events_to=self.events,
            progress=False,
            lock_timeout=self.lock_timeout if lock_timeout is None else lock_timeout,
        )

    # ------------------------------------------------------------------------------ main
    def _workspace(self) -> Any:
        from rsi.workspace import Workspace

        ws = Workspace.load(Path(self.job["workspace"]))
        ws = ws.with_overrides(**self.job["settings"]["overrides"])
        budget = self.profile.limit("memory_bytes")
        if budget:
            # NB: no action may use more than the whole job (limits are not in action keys)
            mib = max(1, int(budget) >> 20)
            if ws.memory_mb is None or ws.memory_mb > mib:
                ws = ws.with_overrides(memory_mb=mib)
        return ws

    def _start(self) -> bool:
        """Claim the job (False: nothing to do: it ended, was cancelled, or another runner
        has it)."""
        me, ticks, boot = os.getpid(), contain.proc_start_ticks(os.getpid()), contain.boot_id()
        with self.db.tx() as conn:
            row = conn.execute("SELECT * FROM jobs WHERE id = ?", (self.job_id,)).fetchone()
            job = self.db.decode(row)
            if job is None or job["state"] in TERMINAL or job["cancel_requested_at"]:
                return False
            if job["runner_pid"] not in (None, me) and contain.same_process(
                job["runner_pid"], job["runner_start"], job["boot_id"]
            ):
                return False
            now = time.time()
            pids = list(job["runner_pids"] or [])
            if me not in pids:
                pids.append(me)
            self.db.update_in(
                conn,
                self.job_id,
                state="running",
                runner_pid=me,
                runner_start=ticks,
                boot_id=boot,
                runner_pids=pids,
                started_at=now,
                first_started_at=job["first_started_at"] or now,
                heartbeat_at=now,
                starts=(job["starts"] or 0) + 1,
            )
        self.job = self.db.get(self.job_id)
        return True

    def run(self) -> int:
        if not self._start():
            return 0
        job = self.job
        strays = set()
        if job["containment"] == "cgroup":
            # NB: what a runner killed before this one left (a resume after kill -9)
            strays = contain.cgroup_pids(job["cgroups"] or []) - {os.getpid()}
            for pid in strays:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        self.tmp.mkdir(parents=True, exist_ok=True)
        os.environ["TMPDIR"] = str(self.tmp)
        os.environ["RSI_JOB_ID"] = self.job_id
        from rsi.limits import cgroup_support

        support = cgroup_support()
        self.action_parents = [str(support.parent)] if support.parent else []
        self.db.update(
            self.job_id,
            action_cgroups=[str(support.parent)] if support.parent else [],
        )
        self.events = JobEvents(self.dir / "events.jsonl", observe=self.observe)
        self.root_event = self.events.emit(
            "job_started",
            None,
            job=self.job_id,
            job_kind=job["kind"],
            spec=job["spec"],
            profile=job["profile_name"],
            profile_digest=job["profile_digest"],
            budget=self.profile.budget,
            start=job["starts"],
            resumed=job["starts"] > 1,
            pid=os.getpid(),
            containment=job["containment"],
            cgroups=job["cgroups"],
            killed_strays=sorted(strays),
        )

        def on_signal(signum: int, frame: object) -> None:
            raise JobSignal(signum)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        watch = threading.Thread(target=self.watchdog, name="rsi-job-watchdog", daemon=True)
        state, reason, detail, outcome, exit_code = "failed", None, None, None, 1
        try:
            from rsi.jobs.kinds import job_kinds
            from rsi.runtime import open_store

            self.ws = self._workspace()
            self.store = open_store(self.ws)
            watch.start()
            kind = job_kinds(job["kind"])[job["kind"]]
            outcome = kind.run(self, job["spec"])
            self.done.set()
            if self.stop is not None:
                raise self.stop
            self.check_measured(final=True)
            state = "succeeded" if outcome["ok"] else "failed"
            exit_code = 0 if outcome["ok"] else 1
        except BudgetStop as stop:
            state, reason, detail, exit_code = "stopped", stop.reason, stop.message, 1
            if self.stop is None:
                self.event("job_budget", **stop.to_json())
            self.stop = stop
        except KeyboardInterrupt as exc:
            if self.stop is not None:
                state, reason, detail = "stopped", self.stop.reason, self.stop.message
                exit_code = 1
            elif self._cancel_requested():
                state, reason, detail = "cancelled", "cancelled", "cancel requested"
                exit_code = 1
            else:
                # NB: stopped from outside (shutdown, kill): the record stays `running`, which
                # reads as interrupted once this process is gone; resume continues it
                name = getattr(exc, "signal", "SIGINT")
                self.done.set()
                self.event("job_interrupted", signal=name, pid=os.getpid())
                self._cleanup()
                self.events.finish()
                return getattr(exc, "exit_code", 130)
        except RsiError as exc:
            state, reason, detail, exit_code = "failed", "error", str(exc), exc.exit_code
        except Exception as exc:  # noqa: BLE001 - NB: a bug: the job says so, with the trace
            traceback.print_exc()
            state, reason, detail = "failed", "crashed", f"{type(exc).__name__}: {exc}"
        finally:
            self.done.set()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if detail is None and outcome is not None and not outcome["ok"]:
            detail = "the work failed (see result)"
        # NB: a job stopped part-way keeps what its finished units produced (a kind leaves
        # it in `partial`)
        outcome = outcome or self.partial
        result = outcome["result"] if outcome else None
        artifacts = outcome.get("artifacts", []) if outcome else []
        cleanup = self._cleanup()
        now = time.time()
        self.event(
            "job_finished",
            state=state,
            stop_reason=reason,
            detail=detail,
            ok=state == "succeeded",
            profile_digest=job["profile_digest"],
            usage=self.ledger.used,
            counts=self.counts,
            cleanup=cleanup,
            wall_s=round(now - (job["started_at"] or now), 4),
        )
        self.events.finish()
        fields: dict[str, Any] = dict(
            state=state,
            stop_reason=reason,
            detail=detail,
            finished_at=now,
            usage=self.ledger.used,
            result=result,
            artifacts=artifacts,
            exit_code=exit_code,
        )
        if state == "cancelled":
            fields.update(cancelled_at=now, cancel_report={"runner": cleanup})
        self.db.update(self.job_id, **fields)
        return exit_code

    def _cancel_requested(self) -> bool:
        try:
            return bool(self.db.get(self.job_id)["cancel_requested_at"])
        except Exception:  # noqa: BLE001
            return False

    def _cleanup(self) -> dict:
        """Leave the job's cgroups and kill whatever is still in them (nothing, normally: the
        build killed its actions), remove them and the job's scratch."""
        report: dict[str, Any] = {}
        if self.job["containment"] == "cgroup":
            paths = self.job["cgroups"] or []
            contain.leave_cgroups(paths)
            report = contain.kill_cgroups(paths, wait_s=10)
        if getattr(getattr(self, "ws", None), "executor", "") == "docker":
            report["containers_removed"] = contain.remove_containers([os.getpid()])
        shutil.rmtree(self.tmp, ignore_errors=True)
        report["scratch_removed"] = not self.tmp.exists()
        return report


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        sys.stderr.write("usage: python -m rsi.jobs.runner STORE JOB\n")
        return 2
    sys.stderr.write(f"rsi job runner {args[1]}: pid {os.getpid()} at {time.ctime()}\n")
    return Runner(Path(args[0]), args[1]).run()


if __name__ == "__main__":
    sys.exit(main())
