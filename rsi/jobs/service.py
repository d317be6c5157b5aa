"""Jobs in process: what `rsi job submit|ls|status|logs|cancel|resume|artifact` do, each returning a
JSON document (or raising its RsiError). The CLI (rsi/jobs/cli.py) only parses options and prints.
It must never print."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from rsi.digest import digest_value
from rsi.errors import RsiError, UsageError
from rsi.jobs import contain
from rsi.jobs.db import ATTACHABLE, LIVE, TERMINAL, JobDB, job_dir, who
from rsi.jobs.profile import load_profile

JOB_SCHEMA = "rsi.job/1"
SUBMIT_SCHEMA = "rsi.job.submit/1"
CANCEL_SCHEMA = "rsi.job.cancel/1"
# NB: a queued job whose runner never recorded itself (the submitter died between the record
# and the spawn) reads as interrupted after this long
QUEUE_GRACE_S = 60.0
# NB: what of a workspace's settings reaches a job's key and its runner (as `rsi build` takes
# them: rsi.toml, then the command line)
SETTINGS = ("executor", "remote", "remote_mode", "remote_fallback", "salt", "jobs", "keep_going")


class JobNotFound(UsageError):
    pass


def _open_store(ws: Any) -> Any:
    from rsi.runtime import open_store

    return open_store(ws)


def find_job(db: JobDB, ref: str) -> dict:
    found = db.find(ref)
    if not found:
        raise JobNotFound(f"no job {ref!r} in {db.path}", hint="list jobs with `rsi job ls`")
    if len(found) > 1:
        raise UsageError(
            f"job {ref!r} is ambiguous: {', '.join(j['id'] for j in found[:5])}",
            hint="give more of the id",
        )
    return found[0]


def effective_state(job: dict) -> str:
    """The recorded state, except that a queued or running job whose runner is gone (killed,
    the machine rebooted) is `interrupted`."""
    state = job["state"]
    if state not in LIVE:
        return state
    if job["runner_pid"] is None:
        since = job["started_at"] or job["submitted_at"] or 0
        return "interrupted" if time.time() - since > QUEUE_GRACE_S else state
    if job["host"] and job["host"] != _hostname():
        return state  # NB: another machine's runner: its record is all there is
    alive = contain.same_process(job["runner_pid"], job["runner_start"], job["boot_id"])
    return state if alive else "interrupted"


def _hostname() -> str:
    import socket

    return socket.gethostname()


def job_doc(job: dict, store_root: Path) -> dict:
    state = effective_state(job)
    d = job_dir(store_root, job["id"])
    doc = {
        "schema": JOB_SCHEMA,
        "id": job["id"],
        "kind": job["kind"],
        "state": state,
        "recorded_state": job["state"],
        "stop_reason": job["stop_reason"],
        "detail": job["detail"],
        "spec": job["spec"],
        "workspace": job["workspace"],
        "settings": job["settings"],
        "key": job["key"],
        "profile": {
            "name": job["profile_name"],
            "path": job["profile_path"],
            "digest": job["profile_digest"],
            "budget": (job["profile"] or {}).get("budget"),
        },
        "submitted_at": job["submitted_at"],
        "submitted_by": job["submitted_by"],
        "started_at": job["started_at"],
        "first_started_at": job["first_started_at"],
        "finished_at": job["finished_at"],
        "heartbeat_at": job["heartbeat_at"],
        "starts": job["starts"],
        "runner": {
            "pid": job["runner_pid"],
            "pids": job["runner_pids"] or [],
            "host": job["host"],
            "alive": state in LIVE,
        },
        "containment": job["containment"],
        "cgroups": job["cgroups"] or [],
        "cancel": {
            "requested_at": job["cancel_requested_at"],
            "by": job["cancelled_by"],
            "at": job["cancelled_at"],
            "report": job["cancel_report"],
        },
        "usage": job["usage"],
        "result": job["result"],
        "artifacts": job["artifacts"] or [],
        "events": str(d / "events.jsonl"),
        "runner_log": str(d / "runner.log"),
        "exit_code": job["exit_code"],
    }
    if state == "interrupted":
        doc["hint"] = f"its runner is gone; continue it with `rsi job resume {job['id']}`"
    return doc


# ----------------------------------------------------------------------------- submit


def spawn_runner(store_root: Path, job_id: str, join: list[str], cwd: Path) -> tuple[int, bool]:
    """Start `python -m rsi.jobs.runner` detached (double fork: own session, parent init),
    stdio to the job's runner.log, in the job's cgroups before it runs; (its pid, whether it
    joined every cgroup)."""
    d = job_dir(store_root, job_id)
    d.mkdir(parents=True, exist_ok=True)
    log = str(d / "runner.log")
    argv = [sys.executable, "-m", "rsi.jobs.runner", str(store_root), job_id]
    env = dict(os.environ, RSI_JOB_ID=job_id)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - NB: the child only execs
        try:
            os.close(r)
            os.setsid()
            if os.fork():
                os._exit(0)
            failed = contain.join(join)
            msg = f"{os.getpid()} {len(failed)}".encode()
            os.write(w, msg)
            os.close(w)
            null = os.open(os.devnull, os.O_RDONLY)
            out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(null, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.closerange(3, 65536)
            os.chdir(cwd)
            os.execve(sys.executable, argv, env)
        finally:
            os._exit(127)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 64)
        if not chunk:
            break
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    try:
        runner, failed = (int(x) for x in data.split())
    except ValueError:
        raise RsiError(f"could not start the runner of job {job_id}") from None
    return runner, failed == 0


def _key(kind: str, key: dict, profile_digest: str, ws: Any, store: Any) -> str:
    return digest_value(
        {
            "kind": kind,
            "inputs": key,
            "profile": profile_digest,
            "workspace": str(ws.root),
            "store": str(store.root),
            "settings": {k: getattr(ws, k) for k in SETTINGS if k not in ("jobs", "keep_going")},
        },
        store.function,
    ).hash


def submit(
    ws: Any,
    kind_name: str,
    args: dict,
    *,
    profile: str | None = None,
    package: str = "",
    overrides: dict | None = None,
    lock_timeout: float | None = None,
    new: bool = False,
) -> dict:
    """Record a job and start its runner; returns rsi.job.submit/1 at once. The same inputs
    (kind, what prepare froze, profile digest, executor settings) as a job that is queued or
    running (or succeeded, for kinds whose inputs are snapshots) attach to it instead."""
    from rsi.jobs.kinds import job_kinds

    kinds = job_kinds(kind_name)
    if kind_name not in kinds:
        raise UsageError(f"unknown job kind {kind_name!r}", hint=f"kinds: {', '.join(kinds)}")
    kind = kinds[kind_name]
    store = _open_store(ws)
    prof = load_profile(ws.root, profile, store.function)
    if prof.executor and not (overrides or {}).get("executor"):
        # NB: the profile says where its jobs run; `--executor` on the submit still wins
        overrides = dict(overrides or {}, executor=prof.executor)
        ws = ws.with_overrides(executor=prof.executor)
    if prof.text:
        store.put_bytes(prof.text)  # NB: the version a job ran under stays readable by digest
    spec, key_parts = kind.prepare(ws, args, package)
    key = _key(kind_name, key_parts, prof.digest, ws, store)
    attachable = ATTACHABLE if kind.attach_done else LIVE
    settings = {
        "overrides": {k: v for k, v in (overrides or {}).items() if v is not None},
        "effective": {k: getattr(ws, k) for k in SETTINGS},
        "lock_timeout": lock_timeout,
    }
    if ws.store_dir.resolve() != store.root or "store" in (overrides or {}):
        settings["overrides"]["store"] = str(store.root)
    with JobDB(store.root) as db:
        with db.tx() as conn:
            same = [] if new else db.by_key(conn, key)
            for job in same:
                # NB: an interrupted one too (its record is live): resume it, never run twice
                if job["state"] in attachable:
                    doc = job_doc(job, store.root)
                    return dict(doc, schema=SUBMIT_SCHEMA, attached=True, job=doc["id"])
            job_id = "j-" + secrets.token_hex(5)
            plan = contain.plan_cgroups(job_id)
            db.remember_profile(conn, prof)
            db.insert(
                conn,
                {
                    "id": job_id,
                    "key": key,
                    "kind": kind_name,
                    "spec": spec,
                    "workspace": str(ws.root),
                    "settings": settings,
                    "state": "queued",
                    "profile_name": prof.name,
                    "profile_path": prof.path,
                    "profile_digest": prof.digest,
                    "profile": dict(prof.to_json(), text=prof.text.decode()),
                    "submitted_at": time.time(),  # NB: when it was decided, under the lock
                    "submitted_by": who(),
                    "host": _hostname(),
                    "containment": plan["containment"],
                    "cgroups": plan["cgroups"],
                    "runner_pids": [],
                    "starts": 0,
                },
            )
        _start_runner(db, store.root, job_id, plan, ws.root)
        doc = job_doc(db.get(job_id), store.root)
    if plan.get("why"):
        doc["containment_note"] = plan["why"]
    return dict(doc, schema=SUBMIT_SCHEMA, attached=False, job=job_id)


def _start_runner(db: JobDB, store_root: Path, job_id: str, plan: dict, cwd: Path) -> None:
    pid, joined = spawn_runner(store_root, job_id, plan["join"], cwd)
    fields: dict[str, Any] = {}
    if not joined and plan["containment"] == "cgroup":
        # NB: the cgroups exist but could not be joined: the session is what holds the job
        contain.remove_cgroups(plan["cgroups"])
        fields.update(containment="session", cgroups=[])
    with db.tx() as conn:
        row = db.decode(conn.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone())
        if row is not None and row["runner_pid"] in (None, pid):
            fields.update(
                runner_pid=pid,
                runner_start=contain.proc_start_ticks(pid),
                boot_id=contain.boot_id(),
            )
        if fields:
            db.update_in(conn, job_id, **fields)


# ------------------------------------------------------------------------- read commands


def open_db(ws: Any) -> tuple[JobDB, Path]:
    store = _open_store(ws)
    return JobDB(store.root), store.root


def status(ws: Any, ref: str) -> dict:
    db, root = open_db(ws)
    with db:
        return job_doc(find_job(db, ref), root)


def list_jobs(ws: Any, *, state: str | None = None, limit: int | None = None) -> list[dict]:
    db, root = open_db(ws)
    with db:
        docs = [job_doc(j, root) for j in db.all()]
    if state:
        docs = [d for d in docs if d["state"] == state]
    return docs[:limit] if limit else docs


def logs(ws: Any, ref: str, *, after: int = 0, follow: bool = False) -> Iterator[dict]:
    """The job's events after id `after`; with `follow`, waiting for more until the job ends
    (or its runner is gone) and every event is read."""
    from rsi.jobs.events import follow as follow_events
    from rsi.jobs.events import read_events

    db, root = open_db(ws)
    job = find_job(db, ref)
    path = job_dir(root, job["id"]) / "events.jsonl"
    if not follow:
        db.close()
        yield from read_events(path, after)[0]
        return

    def done() -> bool:
        return effective_state(db.get(job["id"])) not in LIVE

    try:
        yield from follow_events(path, after, done)
    finally:
        db.close()


def wait(ws: Any, ref: str, timeout: float | None = None, poll_s: float = 0.2) -> dict:
    db, root = open_db(ws)
    with db:
        job = find_job(db, ref)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = db.get(job["id"])
            if effective_state(job) not in LIVE:
                return job_doc(job, root)
            if deadline is not None and time.monotonic() >= deadline:
                return job_doc(job, root)
            time.sleep(poll_s)


# ----------------------------------------------------------------------- cancel & resume


def _remove_scratch(store_root: Path, pids: list[int]) -> list[str]:
    """The store's temporaries and scratch folders named after the job's runners (their pid
    is the second field of the name), the executors' slot folders of them, and nothing
    else."""
    removed = []
    wanted = {str(p) for p in pids}
    folders = [store_root / "tmp"]
    try:
        from rsi.executors.pool import scratch_root

        folders.append(scratch_root())
    except Exception:  # noqa: BLE001
        pass
    for folder in folders:
        try:
            entries = list(folder.iterdir())
        except OSError:
            continue
        for entry in entries:
            parts = entry.name.split("-")
            if len(parts) > 1 and parts[1] in wanted:
                if entry.is_dir() and not entry.is_symlink():
                    from rsi.fsutil import remove_tree

                    remove_tree(entry)
                else:
                    entry.unlink(missing_ok=True)
                removed.append(str(entry))
    return removed


def _remove_action_cgroups(parents: list[str], pids: list[int]) -> list[str]:
    """The memory cgroups the executors of the job's runners made (`rsi-<pid>-N`) where they
    are not under the job's own cgroups."""
    removed = []
    for parent in parents:
        try:
            entries = list(Path(parent).iterdir())
        except OSError:
            continue
        for entry in entries:
            parts = entry.name.split("-")
            if len(parts) == 3 and parts[0] == "rsi" and parts[1] in {str(p) for p in pids}:
                contain.kill_cgroups([str(entry)], wait_s=5)
                if not entry.exists():
                    removed.append(str(entry))
    return removed


def cleanup_job(store_root: Path, job: dict, wait_s: float = 15.0) -> dict:
    """Kill every process of the job, verify none is left, remove its cgroups, scratch and
    containers: the cancel report."""
    pids = list(job["runner_pids"] or [])
    if job["containment"] == "cgroup":
        report = contain.kill_cgroups(job["cgroups"] or [], wait_s=wait_s)
    else:
        leaders = [
            p
            for p in pids
            if p == job["runner_pid"]
            and contain.same_process(p, job["runner_start"], job["boot_id"])
        ]
        report = contain.kill_session(leaders, wait_s=wait_s)
    runner = job["runner_pid"]
    if runner and contain.same_process(runner, job["runner_start"], job["boot_id"]):
        # NB: a runner that already left its cgroup (finishing up) past the grace
        try:
            os.kill(runner, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and contain.same_process(
            runner, job["runner_start"], job["boot_id"]
        ):
            time.sleep(0.02)
        if contain.same_process(runner, job["runner_start"], job["boot_id"]):
            report.setdefault("left", []).append(runner)
        else:
            report.setdefault("killed", []).append(runner)
    report["containers_removed"] = contain.remove_containers(pids)
    report["scratch_removed"] = _remove_scratch(store_root, pids)
    report["action_cgroups_removed"] = _remove_action_cgroups(job["action_cgroups"] or [], pids)
    d = job_dir(store_root, job["id"]) / "tmp"
    shutil.rmtree(d, ignore_errors=True)
    report["job_tmp_removed"] = not d.exists()
    report["containment"] = job["containment"]
    report["verified"] = (
        not report["left"]
        and not report.get("not_removed")
        and report["job_tmp_removed"]
        and all(not Path(c).exists() for c in job["cgroups"] or [])
    )
    return report


def cancel(ws: Any, ref: str, *, grace_s: float = 5.0, reason: str | None = None) -> dict:
    """Stop the job: ask its runner (SIGTERM: the build ends, running actions killed, its
    stream closed), then after `grace_s` kill whatever of the job is left (its whole cgroup),
    check that nothing is, and remove its cgroups and scratch. rsi.job.cancel/1."""
    from rsi.jobs.events import JobEvents

    db, root = open_db(ws)
    with db:
        job = find_job(db, ref)
        job_id = job["id"]
        if job["state"] in TERMINAL and job["state"] != "cancelled":
            doc = job_doc(job, root)
            return {
                "schema": CANCEL_SCHEMA,
                "job": job_id,
                "cancelled_now": False,
                "state": doc["state"],
                "detail": f"the job had ended ({doc['state']}); nothing to cancel",
                "report": None,
            }
        if job["state"] == "cancelled" and job["cancel_report"]:
            return {
                "schema": CANCEL_SCHEMA,
                "job": job_id,
                "cancelled_now": False,
                "state": "cancelled",
                "detail": "already cancelled",
                "report": job["cancel_report"],
                "cancelled_by": job["cancelled_by"],
                "cancelled_at": job["cancelled_at"],
            }
        by = who() + (f": {reason}" if reason else "")
        requested = time.time()
        db.update(job_id, cancel_requested_at=requested, cancelled_by=by)
        alive = contain.same_process(job["runner_pid"], job["runner_start"], job["boot_id"])
        if alive and grace_s > 0:
            try:
                os.kill(job["runner_pid"], signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and contain.same_process(
                job["runner_pid"], job["runner_start"], job["boot_id"]
            ):
                time.sleep(0.05)
        job = db.get(job_id)
        report = cleanup_job(root, job)
        by_runner = (job["cancel_report"] or {}).get("runner")
        if by_runner:
            # NB: the runner stopped its build and killed what was left itself
            report["runner"] = by_runner
            report["killed"] = sorted(set(report["killed"]) | set(by_runner.get("killed", [])))
        now = time.time()
        fields: dict[str, Any] = dict(cancel_report=report, cancelled_by=by)
        if job["state"] != "cancelled":
            # NB: the runner did not record it (killed, or it was gone): the stream ends here
            events = JobEvents(job_dir(root, job_id) / "events.jsonl")
            events.emit(
                "job_finished",
                None,
                job=job_id,
                state="cancelled",
                stop_reason="cancelled",
                ok=False,
                profile_digest=job["profile_digest"],
                cancelled_by=by,
            )
            events.finish()
            fields.update(
                state="cancelled",
                stop_reason="cancelled",
                detail=f"cancelled by {by}",
                finished_at=now,
                cancelled_at=now,
                exit_code=1,
            )
        db.update(job_id, **fields)
        job = db.get(job_id)
    return {
        "schema": CANCEL_SCHEMA,
        "job": job_id,
        "cancelled_now": True,
        "state": job["state"],
        "cancelled_by": job["cancelled_by"],
        "cancelled_at": job["cancelled_at"],
        "report": report,
    }


def resume(ws: Any, ref: str) -> dict:
    """Start a new runner for an interrupted job (its runner killed, the machine rebooted):
    it runs the job again, and everything that finished before is served from the cache."""
    db, root = open_db(ws)
    with db:
        job = find_job(db, ref)
        state = effective_state(job)
        if state != "interrupted":
            raise UsageError(
                f"job {job['id']} is {state}; only an interrupted job is resumed",
                hint="submit it again for a new job" if state in TERMINAL else None,
            )
        if job["containment"] == "cgroup":
            # NB: what the killed runner left (its actions' processes) goes first
            contain.kill_cgroups(job["cgroups"] or [], wait_s=10)
        plan = contain.plan_cgroups(job["id"])
        with db.tx() as conn:
            db.update_in(
                conn,
                job["id"],
                state="queued",
                runner_pid=None,
                runner_start=None,
                containment=plan["containment"],
                cgroups=plan["cgroups"],
                started_at=time.time(),
            )
        _start_runner(db, root, job["id"], plan, Path(job["workspace"]))
        doc = job_doc(db.get(job["id"]), root)
    return dict(doc, resumed=True)


# ----------------------------------------------------------------------------- artifacts


def artifacts(ws: Any, ref: str) -> dict:
    """The job's evidence: its profile (by digest), its events, its result, and every output
    and evidence file it produced, by digest."""
    db, root = open_db(ws)
    with db:
        job = find_job(db, ref)
        doc = job_doc(job, root)
    files = list(job["artifacts"] or [])
    return {
        "schema": "rsi.job.artifacts/1",
        "job": job["id"],
        "state": doc["state"],
        "profile": doc["profile"],
        "events": doc["events"],
        "files": files,
        "result": job["result"],
    }


def artifact_bytes(ws: Any, ref: str, path: str) -> tuple[dict, bytes]:
    """One file of the job, by its path (as `artifacts` lists it) or digest, read from the
    store and verified against its digest."""
    from rsi.digest import Digest

    doc = artifacts(ws, ref)
    match = [
        f
        for f in doc["files"]
        if path in (f["path"], f["digest"], f["digest"].split("/")[0])
        or f["path"].endswith("/" + path)
    ]
    if path == "profile" and doc["profile"]["digest"]:
        match = [{"path": "profile", "digest": doc["profile"]["digest"]}]
    if not match:
        known = ", ".join(f["path"] for f in doc["files"][:10]) or "none"
        raise UsageError(f"job {doc['job']} has no artifact {path!r}", hint=f"it has: {known}")
    if len({m["digest"] for m in match}) > 1:
        raise UsageError(f"{path!r} names several artifacts; give the whole path or a digest")
    store = _open_store(ws)
    if match[0]["digest"].endswith("/0"):
        return match[0], b""
    return match[0], store.read_bytes(Digest.parse(match[0]["digest"]))


def profiles(ws: Any) -> list[dict]:
    db, _ = open_db(ws)
    with db:
        return db.profiles()


def dumps(doc: Any) -> str:
    return json.dumps(doc, indent=2, sort_keys=True, default=str)
