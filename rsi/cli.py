"""The `rsi` command line: a thin layer over the engine. Every command a program reads has `--json`.
Exit codes: 0 success, 1 build failure (or a corrupt store found), 2 usage or declaration error. It
must never hold engine logic of its own."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from rsi import __version__
from rsi.errors import EXIT_BUILD_FAILED, EXIT_USAGE, RsiError, not_writable

EPILOG = """\b
Exit codes:
  0  success
  1  build failure (an action failed, a corrupt store entry was found)
  2  usage or declaration error (bad label, bad BUILD.toml, unknown option)
"""


def _emit(obj: Any, as_json: bool, human: str | None = None) -> None:
    if as_json:
        click.echo(json.dumps(obj, indent=2, sort_keys=True, default=str))
    elif human is not None:
        click.echo(human)


def _workspace(ctx: click.Context, **overrides: Any):
    from rsi.workspace import Workspace

    root = ctx.obj.get("workspace")
    ws = Workspace.load(Path(root).resolve()) if root else Workspace.discover()
    if ctx.obj.get("store"):
        overrides["store"] = ctx.obj["store"]
    return ws.with_overrides(**overrides)


def _current_package(ws) -> str:
    """The package of the current folder; relative labels resolve against it (as in build)."""
    from rsi.build_analysis import current_package

    return current_package(ws)


def _error_doc(ctx: click.Context, code: str, message: str, exit_code: int, **where: Any) -> dict:
    """The JSON an engine command prints under --json when it refuses or fails: an agent reads
    the same fields a person reads on stderr, never has to parse text."""
    names = []
    while ctx.parent is not None:  # NB: not the program's name: `rsi`, `python -m rsi.cli`
        names.append(ctx.info_name)
        ctx = ctx.parent
    return {
        "schema": "rsi.error/1",
        "command": " ".join(reversed(names)),
        "state": "error",
        "exit_code": exit_code,
        "error": {"code": code, "message": message, **where},
    }


class RsiCommand(click.Command):
    """An engine command: under --json, a refusal (a bad option, an unknown label, a wrong
    declaration) or a failure before the report is also an `rsi.error/1` document on stdout,
    with the same exit code; stderr keeps the line a person reads."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        wants_json = "--json" in args
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            if not wants_json or ctx.resilient_parsing:
                raise
            _emit(
                _error_doc(
                    ctx,
                    "UsageError",
                    exc.format_message(),
                    EXIT_USAGE,
                    hint=f"see {ctx.command_path} --help",
                ),
                True,
            )
            click.echo(f"rsi: error: {exc.format_message()}", err=True)
            ctx.exit(EXIT_USAGE)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            try:
                return super().invoke(ctx)
            except OSError as exc:
                clean = not_writable(exc)
                if clean is None:
                    raise
                raise clean from None
        except RsiError as exc:
            if not ctx.params.get("as_json"):
                raise
            where = {
                k: getattr(exc, k)
                for k in ("file", "target", "field")
                if getattr(exc, k, None) is not None
            }
            _emit(
                _error_doc(
                    ctx,
                    getattr(exc, "code", None) or type(exc).__name__,
                    getattr(exc, "detail", None) or exc.message,
                    exc.exit_code,
                    hint=exc.hint,
                    **where,
                ),
                True,
            )
            click.echo(f"rsi: error: {exc}", err=True)
            sys.exit(exc.exit_code)


class RsiGroup(click.Group):
    command_class = RsiCommand
    group_class = type  # NB: subgroups (cache, toolchain) are RsiGroups with RsiCommands

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RsiError as exc:
            click.echo(f"rsi: error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except OSError as exc:
            clean = not_writable(exc)
            if clean is None:
                raise
            click.echo(f"rsi: error: {clean}", err=True)
            sys.exit(clean.exit_code)
        except KeyboardInterrupt as exc:
            # NB: a build stopped by SIGTERM exits 143, by Ctrl-C (SIGINT) 130
            name = getattr(exc, "signal", "SIGINT")
            click.echo(f"rsi: interrupted ({name})", err=True)
            sys.exit(getattr(exc, "exit_code", 130))


@click.group(cls=RsiGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rsi")
@click.option(
    "--workspace",
    "-C",
    type=click.Path(file_okay=False),
    help="Workspace root (default: the nearest folder with rsi.toml at or above the current one).",
)
@click.option(
    "--store",
    type=click.Path(file_okay=False),
    help="Store folder (default: <workspace>/cache or rsi.toml's `store`).",
)
@click.pass_context
def main(ctx: click.Context, workspace: str | None, store: str | None) -> None:
    """rsi: build LLM-inference optimisation campaigns as a hermetic, content-addressed graph.

    \b
    Start with:
      rsi build //tasks/softmax:verdict     build a target (and only what changed)
      rsi query 'deps(//tasks/...)'          explore the target graph
      rsi why //tasks/softmax:verdict        what ran in its last build, and why
      rsi cache verify                       re-hash the store, remove corrupt entries
    """
    ctx.ensure_object(dict)
    ctx.obj["workspace"] = workspace
    ctx.obj["store"] = store


@main.command(epilog=EPILOG)
@click.argument("targets", nargs=-1, required=True)
@click.option("--jobs", "-j", type=click.IntRange(1), help="Parallel actions (default: CPUs).")
@click.option(
    "--keep-going",
    "-k",
    is_flag=True,
    default=None,
    help="Build everything not downstream of a failure.",
)
@click.option("--salt", help="Mix this string into every action key (invalidates the cache).")
@click.option(
    "--executor",
    type=click.Choice(["local", "bwrap", "docker", "remote", "slurm"]),
    help="Where actions run (default: local sandbox; slurm: [slurm] in rsi.toml).",
)
@click.option("--remote", help="REAPI endpoint grpc://HOST:PORT (docs/remote.md).")
@click.option(
    "--remote-mode",
    type=click.Choice(["cache", "execute"]),
    help="Use the remote as a cache only, or also to execute actions.",
)
@click.option(
    "--remote-fallback/--no-remote-fallback",
    default=None,
    help="When the remote fails, build locally with a warning event.",
)
@click.option(
    "--events",
    type=click.File("w"),
    help="Also write the event stream (JSON lines) to this file ('-' for stdout).",
)
@click.option(
    "--events-hits",
    is_flag=True,
    default=None,
    help="List every cache hit in the event stream (an action_finished line each), not only "
    "their summary (actions_cached). Also RSI_EVENTS_HITS=1.",
)
@click.option(
    "--lock-timeout",
    type=float,
    metavar="SECONDS",
    help="Give up (exit 1) when the host lock (RSI_HOST_LOCK) is not free within SECONDS "
    "(default: wait, saying who holds it).",
)
@click.option("--json", "as_json", is_flag=True, help="Print a build report as JSON.")
@click.pass_context
def build(
    ctx: click.Context,
    targets: tuple[str, ...],
    jobs: int | None,
    keep_going: bool | None,
    salt: str | None,
    executor: str | None,
    remote: str | None,
    remote_mode: str | None,
    remote_fallback: bool | None,
    events,
    events_hits: bool | None,
    lock_timeout: float | None,
    as_json: bool,
) -> None:
    """Build TARGETS (labels or patterns: //pkg:name, :name, //pkg/..., //pkg:all).

    Only actions whose key is not in the cache run. Outputs of the named targets are copied
    under out/. Every build writes an event log under <store>/events/.

    A target a pattern matches is skipped ("skipped: needs cuda") when its actions need a
    device this host lacks (local executors); naming it explicitly fails the build (exit 1).
    """
    from rsi.build import build as run_build

    if remote_mode == "execute" and executor is None:
        executor = "remote"
    ws = _workspace(
        ctx,
        jobs=jobs,
        keep_going=keep_going,
        salt=salt,
        executor=executor,
        remote=remote,
        remote_mode=remote_mode,
        remote_fallback=remote_fallback,
    )
    report = run_build(
        ws,
        list(targets),
        events_to=events,
        lock_timeout=lock_timeout,
        list_hits=events_hits or None,
    )
    if as_json:
        _emit(report.to_json(), True)
    else:
        from rsi.buildcmd import report_lines

        for line in report_lines(report):
            click.echo(line)
    from rsi.buildcmd import exit_code

    sys.exit(exit_code(report))


@main.command(epilog=EPILOG)
@click.argument("expr")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def query(ctx: click.Context, expr: str, as_json: bool) -> None:
    """Evaluate a query over the target graph.

    \b
    EXPR := PATTERN | deps(EXPR) | rdeps(EXPR) | kind(RULE, EXPR)
    Examples:
      rsi query '//...'
      rsi query 'deps(//tasks/softmax:verdict)'
      rsi query 'kind(check, rdeps(//tasks/softmax:task))'
    """
    from rsi.build_analysis import make_loader
    from rsi.query import evaluate

    ws = _workspace(ctx)
    loader = make_loader(ws)
    labels = evaluate(loader, expr, _current_package(ws))
    rows = [{"label": str(lb), "rule": loader.target(lb).rule.name} for lb in labels]
    _emit(rows, as_json, "\n".join(str(lb) for lb in labels))


@main.command(epilog=EPILOG)
@click.argument("targets", nargs=-1, required=True)
@click.option("--format", "fmt", type=click.Choice(["dot", "json"]), default="dot")
@click.option("--actions", is_flag=True, help="Show the action graph instead of targets.")
@click.pass_context
def graph(ctx: click.Context, targets: tuple[str, ...], fmt: str, actions: bool) -> None:
    """Print the target (or action) graph of TARGETS as Graphviz dot or JSON."""
    from rsi.build_analysis import load_graph
    from rsi.runtime import open_store

    ws = _workspace(ctx)
    labels, bg = load_graph(ws, list(targets), open_store(ws))
    if actions:
        g = bg.nx_action_graph().subgraph(bg.actions_for(labels))
    else:
        from rsi.analysis import find_targets
        from rsi.build_analysis import make_loader

        g = find_targets(make_loader(ws), labels)[1].to_nx()
    nodes = sorted(str(n) for n in g.nodes)
    edges = sorted((str(a), str(b)) for a, b in g.edges)
    if fmt == "json":
        _emit({"nodes": nodes, "edges": [{"from": a, "to": b} for a, b in edges]}, True)
    else:
        lines = ["digraph rsi {", "  rankdir=LR;"]
        lines += [f'  "{n}";' for n in nodes]
        lines += [f'  "{a}" -> "{b}";' for a, b in edges]
        lines.append("}")
        click.echo("\n".join(lines))


@main.command(epilog=EPILOG)
@click.argument("target")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def why(ctx: click.Context, target: str, as_json: bool) -> None:
    """Explain TARGET's last build: which actions ran and the exact field that changed for
    each, or that it was fully cached."""
    from rsi.runtime import open_store
    from rsi.label import Label
    from rsi.why import explain

    ws = _workspace(ctx)
    label = Label.parse(target, _current_package(ws))
    doc = explain(open_store(ws), str(label), ws)
    if doc["build_id"] is None:
        from rsi.build_analysis import make_loader

        # NB: nothing recorded: a label that names no target is a mistake, said as a build
        # says it (a target since removed, whose builds the store still logs, is explained)
        make_loader(ws).target(label)
    if as_json:
        _emit(doc, True)
        return
    if doc["build_id"] is None:
        click.echo(f"{doc['label']}: no build of it is recorded in this store")
        return
    click.echo(f"{doc['label']}: last built in {doc['build_id']}")
    if not doc["ran"]:
        click.echo(f"  fully cached: {doc['cached']} action(s) served from the cache, none ran")
    for a in doc["ran"]:
        click.echo(f"  ran {a['action']} ({a['status']})")
        for reason in a["why"]:
            click.echo(f"    - {reason}")
    if doc["ran"] and doc["cached"]:
        click.echo(f"  {doc['cached']} other action(s) were cached")


@main.command(epilog=EPILOG)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def info(ctx: click.Context, as_json: bool) -> None:
    """This host as rsi sees it: the sandbox, and every action's scratch and memory limits
    with how each is enforced (or why it is not)."""
    from rsi.errors import UsageError
    from rsi.info import describe, render

    try:
        ws = _workspace(ctx)
    except UsageError:  # NB: outside a workspace: the defaults
        ws = None
    doc = describe(ws)
    _emit(doc, as_json, render(doc))


@main.command("rules", epilog=EPILOG)
@click.option("--json", "as_json", is_flag=True)
@click.option("--markdown", is_flag=True, help="Print the declaration reference as Markdown.")
@click.pass_context
def rules_cmd(ctx: click.Context, as_json: bool, markdown: bool) -> None:
    """List every rule and its attributes: kind, required or default, meaning (the declaration
    reference; --markdown prints it as docs/declarations.md has it)."""
    from rsi.registry import describe_rules, load_rules

    extra = ()
    try:
        extra = _workspace(ctx).rules
    except RsiError:
        pass
    doc = describe_rules(load_rules(extra))
    if markdown:
        from rsi.registry import rules_markdown

        click.echo(rules_markdown(doc), nl=False)
        return
    from rsi.registry import rules_text

    _emit(doc, as_json, rules_text(doc))


@main.command(epilog=EPILOG)
@click.option("--remote", required=True, help="The REAPI server (Bots API) grpc://HOST:PORT.")
@click.option(
    "--executor",
    type=click.Choice(["local", "bwrap", "docker"]),
    default="local",
    help="How this worker runs the actions it leases.",
)
@click.option(
    "--property",
    "properties",
    multiple=True,
    metavar="KEY=VALUE",
    help="Extra platform property to advertise (repeatable), e.g. accelerator=nvidia.",
)
@click.option(
    "--no-default-properties",
    is_flag=True,
    help="Advertise only --property values (not OSFamily/toolchain/accelerator).",
)
@click.option("--max-leases", type=click.IntRange(1), help="Exit after this many leases.")
@click.pass_context
def worker(
    ctx: click.Context,
    remote: str,
    executor: str,
    properties: tuple[str, ...],
    no_default_properties: bool,
    max_leases: int | None,
) -> None:
    """Join a remote-execution pool: lease actions from an REAPI server's Bots API and run them
    with this machine's executors (docs/remote.md)."""
    from rsi.worker import main as worker_main

    store = ctx.obj.get("store")
    if store is None:
        try:
            store = str(_workspace(ctx).store_dir)
        except RsiError:
            store = str(Path.home() / ".cache" / "rsi-worker")
    sys.exit(
        worker_main(
            remote,
            store,
            executor_name=executor,
            properties=list(properties),
            no_default_properties=no_default_properties,
            max_leases=max_leases,
        )
    )


@main.group(epilog=EPILOG)
def toolchain() -> None:
    """Pinned toolchains: list what is built; build one with `rsi build //toolchains:NAME`."""


@toolchain.command("ls")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def toolchain_ls(ctx: click.Context, as_json: bool) -> None:
    """List toolchains declared in the workspace and whether each is built in the store."""
    from rsi.build_analysis import make_loader
    from rsi.toolchain import load_recipe
    from rsi.toolchain.build import toolchains_root

    ws = _workspace(ctx)
    loader = make_loader(ws)
    root = toolchains_root(ws.store_dir)
    rows = []
    for label in loader.expand(["//..."]):
        target = loader.target(label)
        if target.rule.name != "toolchain":
            continue
        attrs = {
            k: (list(v) if isinstance(v, tuple) else v)
            for k, v in target.attrs.items()
            if k not in ("doc", "tags") and v is not None
        }
        recipe = load_recipe(attrs, label.name)
        digest = recipe.digest().hash
        info_path = root / digest / "info.json"
        info = json.loads(info_path.read_text()) if info_path.exists() else None
        rows.append(
            {
                "label": str(label),
                "recipe_digest": digest,
                "built": info is not None,
                "platform": f"{label.name}@recipe:{digest}",
                "toolchain": info["platform"] if info else None,
                "image_id": info["image_id"] if info else None,
                "packages": len(info["lock"]) if info else None,
            }
        )
    human = "\n".join(
        f"{r['label']:28} {'built ' + r['toolchain'][:40] if r['built'] else 'not built'}"
        for r in rows
    )
    _emit(rows, as_json, human or "(no toolchain targets)")


@main.group(epilog=EPILOG)
def cache() -> None:
    """Inspect and maintain the local store (ls, show, verify, gc, stats)."""


@cache.command("ls")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def cache_ls_cmd(ctx: click.Context, as_json: bool) -> None:
    """List cached action results."""
    from rsi.runtime import open_store
    from rsi.cacheops import cache_ls

    rows = cache_ls(open_store(_workspace(ctx)))
    human = "\n".join(
        f"{r['key'][:16]}  exit={r['exit_code']}  outputs={r['outputs']}  {r['action'] or '?'}"
        for r in rows
    )
    _emit(rows, as_json, human or "(empty)")


@cache.command("show")
@click.argument("what")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def cache_show_cmd(ctx: click.Context, what: str, as_json: bool) -> None:
    """Show one cached action: by key prefix, label or action id."""
    from rsi.runtime import open_store
    from rsi.cacheops import cache_show

    doc = cache_show(open_store(_workspace(ctx)), what)
    _emit(doc, True) if as_json else click.echo(json.dumps(doc, indent=2, default=str))


@cache.command("verify")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def cache_verify_cmd(ctx: click.Context, as_json: bool) -> None:
    """Re-hash every blob, check every action result; corrupt entries are removed (and will
    be rebuilt). Exit 1 when anything was corrupt."""
    from rsi.runtime import open_store
    from rsi.cacheops import cache_verify

    store = open_store(_workspace(ctx))
    with store.lock(exclusive=True):
        report = cache_verify(store)
    human = (
        f"{'clean' if report.clean else 'CORRUPT'}: {report.blobs} blobs, {report.actions} "
        f"action results checked; removed {len(report.corrupt_blobs)} blobs, "
        f"{len(report.corrupt_actions)} action results"
    )
    if report.outdated_actions:
        human += f"; removed {len(report.outdated_actions)} results of an older format (rebuilt)"
    _emit(report.to_json(), as_json, human)
    sys.exit(0 if report.clean else EXIT_BUILD_FAILED)


@cache.command("gc")
@click.argument("roots", nargs=-1)
@click.option("--dry-run", is_flag=True, help="List what would be removed; remove nothing.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def cache_gc_cmd(ctx: click.Context, roots: tuple[str, ...], dry_run: bool, as_json: bool) -> None:
    """Remove everything not reachable from the workspace's targets (or the ROOTS patterns)
    or from any other registered workspace sharing the store (one whose folder is gone is
    dropped)."""
    from rsi.build_analysis import make_loader
    from rsi.runtime import open_store
    from rsi.cacheops import cache_gc

    ws = _workspace(ctx)
    loader = make_loader(ws)
    from rsi.errors import LabelError

    try:
        keep = {str(lb) for lb in loader.expand(list(roots) or ["//..."])}
    except LabelError:
        if roots:
            raise
        keep = set()  # NB: a workspace with no targets keeps only what logs name
    store = open_store(ws)
    with store.lock(exclusive=True):
        doc = cache_gc(store, keep, dry_run, workspace=ws.root)
    verb = "would remove" if dry_run else "removed"
    human = (
        f"{verb} {len(doc['removed_actions'])} action results and {len(doc['removed_blobs'])} "
        f"blobs ({doc['freed_bytes']} bytes); kept {doc['kept_actions']} results"
    )
    if doc["workspaces"]:
        human += f" (also for {len(doc['workspaces'])} other workspace(s) sharing this store)"
    for gone in doc["dropped_workspaces"]:
        human += (
            f"\n{'would drop' if dry_run else 'dropped'} the gc roots of workspace "
            f"{gone['workspace']}: {gone['reason']}"
        )
    if dry_run and not as_json:
        human += "".join(f"\n  ac  {k}" for k in doc["removed_actions"])
        human += "".join(f"\n  cas {k}" for k in doc["removed_blobs"])
    _emit(doc, as_json, human)


@cache.command("stats")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def cache_stats_cmd(ctx: click.Context, as_json: bool) -> None:
    """Counts and sizes of the store."""
    from rsi.runtime import open_store
    from rsi.cacheops import cache_stats

    doc = cache_stats(open_store(_workspace(ctx)))
    _emit(doc, as_json, "\n".join(f"{k}: {v}" for k, v in doc.items()))


def _add_plugin_commands() -> None:
    """Rule families may add commands through the `rsi.commands` entry point group."""
    from importlib import metadata

    for ep in metadata.entry_points(group="rsi.commands"):
        if ep.name in main.commands:
            continue
        try:
            command = ep.load()
        except ImportError as exc:
            click.echo(f"rsi: warning: command {ep.name!r} unavailable: {exc}", err=True)
            continue
        main.add_command(command, ep.name)


def run() -> None:
    if len(sys.argv) > 1 and sys.argv[1] not in main.commands and sys.argv[1:] != ["--version"]:
        _add_plugin_commands()  # NB: only when needed; `rsi build` never pays for plugins
    try:
        main(standalone_mode=True)
    except RsiError as exc:
        click.echo(f"rsi: error: {exc}", err=True)
        sys.exit(exc.exit_code if exc.exit_code else EXIT_USAGE)


if __name__ == "__main__":
    run()
