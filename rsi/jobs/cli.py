"""`rsi job …`: durable evaluation jobs (docs/jobs.md). Registered through the `rsi.commands` entry
point; each command parses its options, calls rsi.jobs.service and prints its document (`--json`) or
a line for people. It must never hold job logic of its own."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from rsi.errors import EXIT_BUILD_FAILED

EPILOG = """\b
Exit codes:
  0  success (submit: the job was recorded; wait: it succeeded)
  1  the job failed, was stopped by a budget, cancelled or interrupted (wait)
  2  usage or declaration error (bad label, bad profile, no such job)
"""


def _ws(ctx: click.Context, **overrides: Any):
    from rsi.workspace import Workspace

    obj = ctx.find_root().obj or {}
    root = obj.get("workspace")
    ws = Workspace.load(Path(root).resolve()) if root else Workspace.discover()
    if obj.get("store"):
        overrides["store"] = obj["store"]
    return ws.with_overrides(**overrides)


def _package(ws) -> str:
    try:
        rel = Path.cwd().resolve().relative_to(ws.root)
    except ValueError:
        return ""
    return "" if str(rel) == "." else rel.as_posix()


def _echo_json(doc: Any) -> None:
    click.echo(json.dumps(doc, indent=2, sort_keys=True, default=str))


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def _line(doc: dict) -> str:
    spec = doc["spec"] or {}
    what = " ".join(spec.get("patterns") or []) or spec.get("campaign") or ""
    if spec.get("rounds"):
        what += " round " + ",".join(str(r["round"]) for r in spec["rounds"])
    state = doc["state"] + (f" ({doc['stop_reason']})" if doc.get("stop_reason") else "")
    return f"{doc['id']}  {state:28} {doc['kind']:6} {what}  {_when(doc['submitted_at'])}"


@click.group("job", epilog=EPILOG)
def job_group() -> None:
    """Durable jobs: a build, a campaign round or a final that runs detached, survives the
    shell that asked for it, runs under a budgeted profile, and can be watched, cancelled,
    resumed and read back by digest (docs/jobs.md)."""


@job_group.command("submit", epilog=EPILOG)
@click.argument("args", nargs=-1, required=True)
@click.option("--profile", help="Budget profile: a name (profiles/NAME.toml) or a .toml path.")
@click.option(
    "--from",
    "srcs",
    multiple=True,
    type=click.Path(),
    help="round: a candidate folder "
    "(repeat for several rounds); snapshotted into the campaign's log now.",
)
@click.option("--round", "number", type=click.IntRange(1), help="round: an existing round.")
@click.option("--hypothesis", help="round: why the candidate should be faster.")
@click.option("--usage", "usage_file", help="round: JSON usage record of the candidate.")
@click.option("--jobs", "-j", type=click.IntRange(1), help="Parallel actions.")
@click.option("--keep-going", "-k", is_flag=True, default=None)
@click.option("--salt", help="Mix this string into every action key.")
@click.option(
    "--executor",
    type=click.Choice(["local", "bwrap", "docker", "remote", "slurm"]),
    help="Where the job's actions run (as rsi build).",
)
@click.option("--remote", help="REAPI endpoint grpc://HOST:PORT (docs/remote.md).")
@click.option("--remote-mode", type=click.Choice(["cache", "execute"]))
@click.option("--remote-fallback/--no-remote-fallback", default=None)
@click.option("--lock-timeout", type=float, metavar="SECONDS", help="As rsi build.")
@click.option("--new", is_flag=True, help="A new job even when the same one exists.")
@click.option("--wait", "wait_", is_flag=True, help="Wait for the job to end (exit as wait).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def submit_cmd(
    ctx: click.Context,
    args: tuple[str, ...],
    profile: str | None,
    srcs: tuple[str, ...],
    number: int | None,
    hypothesis: str | None,
    usage_file: str | None,
    jobs: int | None,
    keep_going: bool | None,
    salt: str | None,
    executor: str | None,
    remote: str | None,
    remote_mode: str | None,
    remote_fallback: bool | None,
    lock_timeout: float | None,
    new: bool,
    wait_: bool,
    as_json: bool,
) -> None:
    """Submit a job and print its id at once: `TARGET...` (a build), `round CAMPAIGN
    --from DIR` (a new candidate's round; or --round N) or `final CAMPAIGN`.

    The same job submitted again (same kind, inputs, profile and executor settings) while it
    is queued or running (or, for a round or final, once it succeeded) attaches to it:
    `attached: true` and the same id."""
    from rsi.jobs import service
    from rsi.jobs.kinds import kind_names

    if remote_mode == "execute" and executor is None:
        executor = "remote"
    overrides = {
        "jobs": jobs,
        "keep_going": keep_going,
        "salt": salt,
        "executor": executor,
        "remote": remote,
        "remote_mode": remote_mode,
        "remote_fallback": remote_fallback,
    }
    ws = _ws(ctx, **overrides)
    names = kind_names()
    kind, rest = ("build", list(args))
    if args[0] in names:
        kind, rest = args[0], list(args[1:])
    request: dict[str, Any] = {
        "targets": rest,
        "srcs": list(srcs),
        "number": number,
        "hypothesis": hypothesis,
        "usage_file": usage_file,
    }
    t0 = time.perf_counter()
    doc = service.submit(
        ws,
        kind,
        request,
        profile=profile,
        package=_package(ws),
        overrides=overrides,
        lock_timeout=lock_timeout,
        new=new,
    )
    doc["submit_s"] = round(time.perf_counter() - t0, 4)
    if wait_:
        doc = dict(service.wait(ws, doc["id"]), attached=doc["attached"])
    if as_json:
        _echo_json(doc)
    else:
        if doc["attached"]:
            click.echo(f"rsi: note: the same job exists ({doc['state']}); attached", err=True)
        click.echo(doc["id"] if not wait_ else _line(doc))
    if wait_:
        sys.exit(0 if doc["state"] == "succeeded" else EXIT_BUILD_FAILED)


@job_group.command("ls", epilog=EPILOG)
@click.option("--state", help="Only jobs in this state (running, interrupted, stopped, ...).")
@click.option("--limit", "-n", type=click.IntRange(1), help="At most this many (newest first).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def ls_cmd(ctx: click.Context, state: str | None, limit: int | None, as_json: bool) -> None:
    """List jobs, newest first."""
    from rsi.jobs import service

    docs = service.list_jobs(_ws(ctx), state=state, limit=limit)
    if as_json:
        _echo_json(docs)
    else:
        for doc in docs:
            click.echo(_line(doc))


@job_group.command("status", epilog=EPILOG)
@click.argument("job")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def status_cmd(ctx: click.Context, job: str, as_json: bool) -> None:
    """A job's state (`interrupted` when its runner is gone without a final state), profile
    and budgets, usage, containment, cancel record and result."""
    from rsi.jobs import service

    doc = service.status(_ws(ctx), job)
    if as_json:
        _echo_json(doc)
        return
    click.echo(_line(doc))
    if doc.get("detail"):
        click.echo(f"  detail: {doc['detail']}")
    p = doc["profile"]
    click.echo(f"  profile: {p['name']} {p['digest']}  budget {json.dumps(p['budget'])}")
    click.echo(f"  usage: {json.dumps(doc['usage'])}")
    click.echo(
        f"  runner: pid {doc['runner']['pid']} ({doc['starts']} start(s)); containment "
        f"{doc['containment']}"
    )
    if doc["cancel"]["by"]:
        click.echo(f"  cancelled by {doc['cancel']['by']} at {_when(doc['cancel']['at'])}")
    click.echo(f"  events: {doc['events']}")
    if doc.get("hint"):
        click.echo(f"  hint: {doc['hint']}")


def _event_line(e: dict) -> str:
    kind = e.get("kind")
    t = time.strftime("%H:%M:%S", time.localtime(e.get("time", 0)))
    bits = [f"{e.get('id'):>5} {t} {kind}"]
    for k in ("label", "action", "cache", "status", "state", "stop_reason", "message"):
        if e.get(k) not in (None, ""):
            bits.append(f"{k}={e[k]}")
    return " ".join(bits)


@job_group.command("logs", epilog=EPILOG)
@click.argument("job")
@click.option("--follow", "-f", is_flag=True, help="Wait for more until the job ends.")
@click.option(
    "--cursor",
    type=click.IntRange(0),
    default=0,
    help="Only events after this id (the last id a reader saw): resumes a read.",
)
@click.option("--json", "as_json", is_flag=True, help="The events as JSON lines.")
@click.pass_context
def logs_cmd(ctx: click.Context, job: str, follow: bool, cursor: int, as_json: bool) -> None:
    """The job's event stream (rsi.events/1, as `rsi build --events`)."""
    from rsi.jobs import service

    for e in service.logs(_ws(ctx), job, after=cursor, follow=follow):
        click.echo(json.dumps(e, sort_keys=True) if as_json else _event_line(e))


@job_group.command("wait", epilog=EPILOG)
@click.argument("job")
@click.option("--timeout", type=float, metavar="SECONDS")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def wait_cmd(ctx: click.Context, job: str, timeout: float | None, as_json: bool) -> None:
    """Wait until the job ends (or its runner is gone); exit 0 when it succeeded."""
    from rsi.jobs import service

    doc = service.wait(_ws(ctx), job, timeout)
    _echo_json(doc) if as_json else click.echo(_line(doc))
    sys.exit(0 if doc["state"] == "succeeded" else EXIT_BUILD_FAILED)


@job_group.command("cancel", epilog=EPILOG)
@click.argument("job")
@click.option(
    "--grace",
    type=float,
    default=5.0,
    show_default=True,
    metavar="SECONDS",
    help="How long the runner gets to stop its build before the job's cgroup is killed.",
)
@click.option("--reason", help="Kept with who cancelled and when.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def cancel_cmd(
    ctx: click.Context, job: str, grace: float, reason: str | None, as_json: bool
) -> None:
    """Stop the job's process tree (and only it), verify nothing of it is left, remove its
    scratch; records who cancelled and when. Exit 1 when something could not be removed."""
    from rsi.jobs import service

    doc = service.cancel(_ws(ctx), job, grace_s=grace, reason=reason)
    if as_json:
        _echo_json(doc)
    else:
        rep = doc.get("report") or {}
        click.echo(
            f"{doc['job']}: {doc['state']}"
            + (f" ({doc.get('detail')})" if doc.get("detail") else "")
        )
        if rep:
            click.echo(
                f"  killed {len(rep.get('killed', []))} process(es); left {rep.get('left')}; "
                f"containment {rep.get('containment')}; verified {rep.get('verified')}"
            )
    rep = doc.get("report") or {}
    sys.exit(0 if not rep or rep.get("verified") else EXIT_BUILD_FAILED)


@job_group.command("resume", epilog=EPILOG)
@click.argument("job")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def resume_cmd(ctx: click.Context, job: str, as_json: bool) -> None:
    """Continue an interrupted job (its runner was killed, or the machine rebooted) with a new
    runner; what finished before is served from the cache."""
    from rsi.jobs import service

    doc = service.resume(_ws(ctx), job)
    _echo_json(doc) if as_json else click.echo(f"{doc['id']}: resumed ({doc['state']})")


@job_group.command("artifact", epilog=EPILOG)
@click.argument("job")
@click.argument("path", required=False)
@click.option("--out", "-o", type=click.Path(dir_okay=False), help="Write the file here.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def artifact_cmd(
    ctx: click.Context, job: str, path: str | None, out: str | None, as_json: bool
) -> None:
    """Without PATH: the job's evidence (profile digest, events, result) and every file it
    produced, by digest. With PATH (a listed path, or a digest; `profile` for the profile):
    that file's bytes, verified against its digest, to stdout or --out."""
    from rsi.jobs import service

    ws = _ws(ctx)
    if path is None:
        doc = service.artifacts(ws, job)
        if as_json:
            _echo_json(doc)
        else:
            click.echo(f"{doc['job']}: {doc['state']}; profile {doc['profile']['digest']}")
            for f in doc["files"]:
                click.echo(f"  {f['digest']}  {f['path']}")
        return
    entry, data = service.artifact_bytes(ws, job, path)
    if out:
        Path(out).write_bytes(data)
        if as_json:
            _echo_json(dict(entry, written=out))
    elif as_json:
        _echo_json(dict(entry, text=data.decode("utf-8", "replace")))
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()


@job_group.command("profiles", epilog=EPILOG)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def profiles_cmd(ctx: click.Context, as_json: bool) -> None:
    """Every profile version jobs ran under (name, path, digest, first seen)."""
    from rsi.jobs import service

    rows = service.profiles(_ws(ctx))
    if as_json:
        _echo_json(rows)
    else:
        for r in rows:
            click.echo(f"{r['digest']}  {r['name']}  {r['path'] or '-'}  {_when(r['first_seen'])}")
