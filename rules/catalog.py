"""The task catalog: every task under `tasks/` pinned by a descriptor in `tasks/catalog.lock`. It
must never run a candidate.

A descriptor is what a verdict against the task depends on: the contract (framework, device,
entry, signature, editable files), the correctness policy (tolerances, cases, hidden-case
ranges), the digest of every runtime file, baseline file and document (the license among them),
and each binding with its measurement policy. Candidates are not part of it: they come and go.
Its `digest` is the SHA-256 of the rest, canonical JSON.

`rsi catalog ls` lists the tasks; `rsi catalog check` verifies every committed declaration
against the lock, analyses each task package and runs each host binding's baseline check (a
baseline that fails its own oracle is a catalog error), exiting 1 with the task and field named;
`rsi catalog update` shows what changed and writes the lock only with `--yes`, regenerating
the block of each TASK.md that says what is editable, what is measured and the tolerance
policy (check fails when that block and the declaration disagree). A folder under
`tasks/` that declares no task is reported and left alone.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from rsi.analysis import _jsonable
from rsi.digest import digest_file, digest_value
from rsi.errors import EXIT_USAGE, DeclarationError, RsiError

LOCK_SCHEMA = "rsi.catalog.lock/1"
CHECK_SCHEMA = "rsi.catalog.check/1"
LS_SCHEMA = "rsi.catalog.ls/1"
TASKS_DIR = "tasks"
LOCK_FILE = "tasks/catalog.lock"
EXIT_CATALOG = 1
_SKIP = {"__pycache__", ".pytest_cache"}

# NB: binding attributes newer than the lock format (left out of an entry while unset)
LATER_ATTRS = ("ranks", "executor")


class CatalogError(DeclarationError):
    """A catalog problem: the lock and the declarations disagree, or a task does not work."""

    exit_code = EXIT_CATALOG


def _sha256(path: Path) -> str:
    return digest_file(path, "sha256").hash


def _files_under(folder: Path) -> list[Path]:
    found = []
    for path in sorted(folder.rglob("*")):
        if any(part in _SKIP for part in path.relative_to(folder).parts) or path.suffix == ".pyc":
            continue
        if path.is_file() or path.is_symlink():
            found.append(path)
    return found


@dataclass
class TaskEntry:
    """One task folder as found on disk: its package, task target and bindings."""

    name: str
    package: str
    build_file: str
    task: Any = None
    bindings: list[Any] = field(default_factory=list)


def _loader(ws):
    from rsi.build_analysis import make_loader

    return make_loader(ws)


def discover(ws, loader=None) -> tuple[list[TaskEntry], list[dict]]:
    """(tasks, unexpected): every `tasks/<name>/` whose BUILD.toml declares a task target, and
    every other folder there with why it is not a task. Declaration errors propagate (they name
    file, target and field)."""
    loader = loader or _loader(ws)
    root = Path(ws.root) / TASKS_DIR
    tasks, unexpected = [], []
    if not root.is_dir():
        return tasks, unexpected
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and p.name not in _SKIP):
        package = f"{TASKS_DIR}/{folder.name}"
        if not (folder / "BUILD.toml").is_file():
            unexpected.append({"folder": package, "why": "no BUILD.toml"})
            continue
        targets = loader.package(package)
        found = [t for t in targets.values() if t.rule.name == "task"]
        if not found:
            unexpected.append({"folder": package, "why": "its BUILD.toml declares no task target"})
            continue
        for task in sorted(found, key=lambda t: t.label.name):
            name = folder.name if task.label.name == "task" else f"{folder.name}:{task.label.name}"
            entry = TaskEntry(name, package, f"{package}/BUILD.toml", task)
            entry.bindings = sorted(
                (
                    t
                    for t in targets.values()
                    if t.rule.name == "binding" and str(t.attrs.get("task")) == str(task.label)
                ),
                key=lambda t: t.label.name,
            )
            tasks.append(entry)
    return tasks, unexpected


def descriptor(ws, entry: TaskEntry) -> dict:
    """The pinned facts of one task (see the module doc); `digest` covers all the rest."""
    a = entry.task.attrs
    pkg_dir = Path(ws.root) / entry.package
    files: dict[str, str] = {}

    def add(rel: str, what: str) -> None:
        path = pkg_dir / rel
        if path.is_dir():
            for f in _files_under(path):
                files[f.relative_to(pkg_dir).as_posix()] = _sha256(f)
        elif path.is_file():
            files[rel] = _sha256(path)
        else:
            raise CatalogError(
                f"{what} {rel!r} does not exist",
                file=entry.build_file,
                target=str(entry.task.label),
                field=what,
            )

    for rel in a["runtime"]:
        add(rel, "runtime")
    add(a["baseline"].rstrip("/"), "baseline")
    for rel in a["docs"]:
        add(rel, "docs")
    licenses = [d for d in a["docs"] if Path(d).name.upper().startswith(("LICENSE", "COPYING"))]
    bindings = {}
    for b in entry.bindings:
        # NB: attributes added since entries were first locked are left out while unset (a
        # single-process binding's `ranks`, the workspace's executor), so entries stay as
        # they were
        ba = _jsonable(
            {
                k: v
                for k, v in b.attrs.items()
                if k not in ("task", "doc", "tags") and not (k in LATER_ATTRS and not v)
            }
        )
        bindings[b.label.name] = dict(ba, digest=digest_value(ba, "sha256").hash)
    doc = {
        "task": str(entry.task.label),
        "contract": _jsonable(
            {k: a[k] for k in ("framework", "device", "entry", "signature", "editable")}
        ),
        "tolerances": _jsonable(a["tolerances"]),
        "cases": _jsonable(a["cases"]),
        "hidden_cases": _jsonable(a["hidden_cases"]),
        "license": licenses[0] if licenses else None,
        "files": dict(sorted(files.items())),
        "bindings": bindings,
    }
    return dict(doc, digest=digest_value(doc, "sha256").hash)


BLOCK_BEGIN = "<!-- rsi catalog: generated from BUILD.toml by `rsi catalog update`; do not edit -->"
BLOCK_END = "<!-- rsi catalog: end -->"


def _dim(d: Any) -> str:
    if isinstance(d, list) and len(d) == 2:
        return f"{d[0]}-{d[1]}"
    if isinstance(d, list) and len(d) == 3:
        return f"{d[0]}-{d[1]} (step {d[2]})"
    return json.dumps(d)


def _shape(shape: Any) -> str:
    return "x".join(str(d) for d in shape) if isinstance(shape, list) else str(shape)


def render_block(entry: TaskEntry) -> str:
    """The part of a task's TASK.md that is generated from its declaration: what is editable,
    what is measured, and the tolerance policy (so the page and the declaration never drift)."""
    a = entry.task.attrs
    lines = [
        BLOCK_BEGIN,
        "## Contract, measurement and tolerances",
        "",
        f"- Framework `{a['framework']}`, device `{a['device']}`; entry "
        f"`{a['entry'].get('module')}.{a['entry'].get('function') or a['entry'].get('class')}`"
        + (f": `{a['signature']}`" if a.get("signature") else ""),
        "- Editable (a candidate is exactly these files): "
        + ", ".join(f"`{e}`" for e in a["editable"]),
        f"- Correctness: {len(a['cases'])} public cases"
        + (
            f" and {a['hidden_cases'].get('count', 0)} hidden ones per check, drawn with the "
            "run's secret seed from "
            + "; ".join(
                f"{r.get('dtype')} {r.get('kind')} shapes "
                + " x ".join(_dim(d) for d in r.get("shape", []))
                for r in a["hidden_cases"].get("ranges", [])
            )
            if a["hidden_cases"]
            else ""
        )
        + "; every timed output is checked too.",
        "",
        "| dtype | atol | rtol |",
        "|---|---|---|",
    ]
    for dtype, tol in sorted(a["tolerances"].items()):
        lines.append(f"| {dtype} | {tol.get('atol')} | {tol.get('rtol')} |")
    lines += [
        "",
        "| binding | device | threads | workload | pairs x samples | metric | PASS needs |",
    ]
    lines.append("|---|---|---|---|---|---|---|")
    for b in entry.bindings:
        ba = b.attrs
        m, asp = ba["measure"], ba["assess"]
        w = m.get("workload", {})
        lines.append(
            f"| `{b.label.name}` | {ba.get('device') or a['device']} | {ba['threads']} | "
            f"{w.get('dtype')} {_shape(w.get('shape'))} {w.get('kind', '')} | "
            f"{m.get('pairs')} x {m.get('samples')} | {m.get('metric', 'latency')} "
            f"({m.get('direction', 'minimize')}) | "
            f">= {1 + float(asp.get('min_improvement', 0)):.2f}x at "
            f"{float(asp.get('confidence', 0.95)) * 100:g} % |"
        )
    lines.append(BLOCK_END)
    return "\n".join(lines) + "\n"


def task_md(ws, entry: TaskEntry) -> Path | None:
    docs = [d for d in entry.task.attrs["docs"] if Path(d).name == "TASK.md"]
    return Path(ws.root) / entry.package / docs[0] if docs else None


def block_drift(ws, entry: TaskEntry) -> str | None:
    """Why the TASK.md block differs from the declaration, or None when it matches."""
    path = task_md(ws, entry)
    if path is None:
        return "the task lists no TASK.md in `docs`"
    if not path.is_file():
        return f"{path.name} does not exist"
    text = path.read_text()
    if BLOCK_BEGIN not in text or BLOCK_END not in text:
        return f"{path.name} has no generated block"
    start = text.index(BLOCK_BEGIN)
    end = text.index(BLOCK_END, start) + len(BLOCK_END) + 1
    if text[start:end].rstrip("\n") != render_block(entry).rstrip("\n"):
        return f"{path.name}'s generated block no longer matches the declaration"
    return None


def write_block(ws, entry: TaskEntry) -> bool:
    """Put the generated block into TASK.md (appended, or replacing the old one); True if the
    file changed."""
    path = task_md(ws, entry)
    if path is None or not path.is_file():
        return False
    text = path.read_text()
    block = render_block(entry)
    if BLOCK_BEGIN in text and BLOCK_END in text:
        start = text.index(BLOCK_BEGIN)
        end = text.index(BLOCK_END, start) + len(BLOCK_END)
        if end < len(text) and text[end] == "\n":
            end += 1
        new = text[:start] + block + text[end:]
    else:
        new = text.rstrip("\n") + "\n\n" + block
    if new == text:
        return False
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(new)
    tmp.replace(path)
    return True


def differences(old: Any, new: Any, path: str = "") -> list[dict]:
    """Where two descriptors differ, as field paths (`cases[3].shape`, `files.oracle.py`)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new)):
            if key == "digest" and not path:
                continue
            sub = f"{path}.{key}" if path else str(key)
            if key not in old:
                out.append({"field": sub, "old": None, "new": new[key], "change": "added"})
            elif key not in new:
                out.append({"field": sub, "old": old[key], "new": None, "change": "removed"})
            else:
                out.extend(differences(old[key], new[key], sub))
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        out = []
        for i, (o, n) in enumerate(zip(old, new, strict=True)):
            out.extend(differences(o, n, f"{path}[{i}]"))
        return out
    if old != new:
        return [{"field": path, "old": old, "new": new, "change": "changed"}]
    return []


def read_lock(ws) -> dict:
    path = Path(ws.root) / LOCK_FILE
    if not path.exists():
        return {"schema": LOCK_SCHEMA, "tasks": {}}
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CatalogError(f"cannot read the catalog lock: {exc}", file=LOCK_FILE) from None
    if not isinstance(doc, dict) or doc.get("schema") != LOCK_SCHEMA:
        raise CatalogError(
            f"not a catalog lock (schema {LOCK_SCHEMA} expected)", file=LOCK_FILE, field="schema"
        )
    if not isinstance(doc.get("tasks"), dict):
        raise CatalogError("`tasks` must be a table of task descriptors", file=LOCK_FILE)
    return doc


def write_lock(ws, tasks: dict[str, dict]) -> Path:
    path = Path(ws.root) / LOCK_FILE
    body = json.dumps({"schema": LOCK_SCHEMA, "tasks": tasks}, indent=1, sort_keys=True) + "\n"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(body)
    tmp.replace(path)
    return path


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Catalog:
    """The catalog as a service: `ls`, `check`, `plan_update`/`update`. `builder` builds
    labels (rsi.build.build by default), so the checks can run in process."""

    def __init__(self, ws, builder=None) -> None:
        self.ws, self.builder = ws, builder

    def current(self) -> tuple[list[TaskEntry], dict[str, dict], list[dict]]:
        tasks, unexpected = discover(self.ws)
        return tasks, {t.name: descriptor(self.ws, t) for t in tasks}, unexpected

    def ls(self) -> dict:
        tasks, descs, unexpected = self.current()
        lock = read_lock(self.ws)["tasks"]
        rows = []
        for t in tasks:
            d = descs[t.name]
            locked = lock.get(t.name)
            status = (
                "new (not in the lock)"
                if locked is None
                else "locked"
                if locked.get("digest") == d["digest"]
                else "changed since the lock"
            )
            hidden = d["hidden_cases"] or {}
            rows.append(
                {
                    "task": t.name,
                    "label": d["task"],
                    "framework": d["contract"]["framework"],
                    "device": d["contract"]["device"],
                    "cases": len(d["cases"]),
                    "hidden_cases": hidden.get("count", 0),
                    "bindings": sorted(d["bindings"]),
                    "status": status,
                    "digest": d["digest"],
                }
            )
        gone = sorted(set(lock) - set(descs))
        return {"schema": LS_SCHEMA, "tasks": rows, "missing": gone, "unexpected": unexpected}

    def plan_update(self) -> dict:
        tasks, descs, unexpected = self.current()
        lock = read_lock(self.ws)["tasks"]
        changes = {}
        pages = {t.name: why for t in tasks if (why := block_drift(self.ws, t))}
        for name in sorted(set(lock) | set(descs)):
            if name not in lock:
                changes[name] = {"change": "added", "fields": []}
            elif name not in descs:
                changes[name] = {"change": "removed", "fields": []}
            elif lock[name].get("digest") != descs[name]["digest"]:
                changes[name] = {
                    "change": "changed",
                    "fields": differences(lock[name], descs[name]),
                }
        for name, why in pages.items():
            changes.setdefault(name, {"change": "changed", "fields": []})["task_md"] = why
        return {"changes": changes, "descriptors": descs, "unexpected": unexpected}

    def update(self, plan: dict) -> Path:
        """Regenerate each TASK.md block, then pin the descriptors (which hash TASK.md)."""
        tasks, _ = discover(self.ws)
        if any([write_block(self.ws, t) for t in tasks]):  # NB: a list: write every one
            plan = dict(plan, descriptors={t.name: descriptor(self.ws, t) for t in tasks})
        return write_lock(self.ws, plan["descriptors"])

    def check(self, *, run: bool = True, all_bindings: bool = False, events=None) -> dict:
        """Every problem found (never only the first): lock mismatches, analysis errors and
        baseline checks that fail, each naming its task and field."""
        problems: list[dict] = []
        try:
            tasks, descs, unexpected = self.current()
        except RsiError as exc:
            problems.append(_problem(None, exc))
            return _check_doc(problems, [], [], [])
        lock = read_lock(self.ws)["tasks"]
        for name in sorted(set(lock) - set(descs)):
            problems.append(
                {
                    "task": name,
                    "file": LOCK_FILE,
                    "field": None,
                    "error": "in the catalog lock but no longer declared under tasks/",
                    "hint": "run `rsi catalog update` to review and remove it",
                }
            )
        for t in tasks:
            locked = lock.get(t.name)
            if locked is None:
                problems.append(
                    {
                        "task": t.name,
                        "file": t.build_file,
                        "field": None,
                        "error": "not in the catalog lock",
                        "hint": "run `rsi catalog update` to review it, then `--yes` to add it",
                    }
                )
                continue
            for d in differences(locked, descs[t.name]):
                problems.append(
                    {
                        "task": t.name,
                        "file": t.build_file,
                        "field": d["field"],
                        "error": f"{d['change']} since the lock was written: "
                        f"{_short(d['old'])} -> {_short(d['new'])}",
                        "hint": "a task that candidates were judged against must not change "
                        "silently: `rsi catalog update` shows the change; `--yes` accepts it",
                    }
                )
        for t in tasks:
            why = block_drift(self.ws, t)
            if why:
                path = task_md(self.ws, t)
                problems.append(
                    {
                        "task": t.name,
                        "file": f"{t.package}/{path.name if path else 'TASK.md'}",
                        "field": "docs",
                        "error": why,
                        "hint": "`rsi catalog update --yes` regenerates it from BUILD.toml",
                    }
                )
        analysed, runnable = [], []
        for t in tasks:
            try:
                self._analyse(t)
                analysed.append(t.name)
            except RsiError as exc:
                problems.append(_problem(t.name, exc))
                continue
            runnable.append(t)
        baselines = self._baseline_checks(runnable, all_bindings, problems, events) if run else []
        return _check_doc(problems, analysed, baselines, unexpected)

    def _analyse(self, t: TaskEntry) -> None:
        from rsi.build_analysis import load_graph
        from rsi.runtime import open_store

        load_graph(self.ws, [f"//{t.package}:all"], open_store(self.ws))

    def _baseline_checks(self, tasks: list[TaskEntry], all_bindings: bool, problems, events):
        """Build every runnable binding in one build (keep going past failures: one broken
        task must not hide the others), then read each baseline check."""
        from rsi.build import build

        rows, wanted = [], []
        for t in tasks:
            for b in t.bindings:
                toolchain = b.attrs.get("toolchain")
                row = {"task": t.name, "binding": str(b.label), "status": None}
                rows.append(row)
                device = b.attrs.get("device") or t.task.attrs.get("device")
                if device == "cuda" and not _host_has_cuda():
                    row["status"] = "skipped (needs a CUDA device; this host has none)"
                elif toolchain and not all_bindings:
                    row["status"] = f"skipped (runs in {toolchain}; --all-bindings builds it)"
                else:
                    wanted.append((t, b, row))
        if not wanted:
            return rows
        ws = self.ws.with_overrides(keep_going=True)
        try:
            report = (self.builder or build)(
                ws, [str(b.label) for _, b, _ in wanted], events_to=events
            )
        except RsiError as exc:
            problems.append(_problem(None, exc))
            for _, _, row in wanted:
                row["status"] = "error"
            return rows
        for t, b, row in wanted:
            built = report.targets.get(str(b.label), {})
            path = Path(self.ws.out_dir) / t.package / b.label.name / "baseline_check.json"
            doc = None
            if built.get("ok"):  # NB: never a document an earlier build left in out/
                try:
                    doc = json.loads(path.read_text())
                except (OSError, ValueError):
                    doc = None
            if doc is None:
                why = "; ".join(
                    f"{f['action']}: {f['status']} {f.get('message') or ''}".strip()
                    for f in built.get("failed", [])
                )
                problems.append(
                    {
                        "task": t.name,
                        "file": t.build_file,
                        "field": b.label.name,
                        "error": f"building {b.label} failed" + (f" ({why})" if why else ""),
                        "hint": f"`rsi why {b.label}` says which action failed and why",
                    }
                )
                row["status"] = "build failed"
                row["reason"] = why or None  # NB: the row says why, not only the problems list
                continue
            row["status"] = doc.get("status")
            if doc.get("status") != "ok":
                first = (doc.get("reasons") or [{}])[0]
                problems.append(
                    {
                        "task": t.name,
                        "file": t.build_file,
                        "field": f"{b.label.name}: baseline",
                        "error": f"the baseline fails its own check ({doc.get('failure_kind')}): "
                        f"case {first.get('case')}: {first.get('detail')}",
                        "hint": "fix the baseline or the oracle; a task whose baseline fails is "
                        "not a task",
                    }
                )
        return rows


def _host_has_cuda() -> bool:
    return os.path.exists("/dev/nvidiactl")


def _problem(task: str | None, exc: RsiError) -> dict:
    return {
        "task": task,
        "file": getattr(exc, "file", None),
        "field": getattr(exc, "field", None),
        "error": getattr(exc, "detail", None) or getattr(exc, "message", None) or str(exc),
        "hint": getattr(exc, "hint", None),
    }


def _check_doc(problems, analysed, baselines, unexpected) -> dict:
    return {
        "schema": CHECK_SCHEMA,
        "ok": not problems,
        "problems": problems,
        "analysed": analysed,
        "baseline_checks": baselines,
        "unexpected": unexpected,
    }


# ------------------------------------------------------------------------------------- CLI


def _ws(ctx: click.Context):
    """The workspace the `rsi` group was given (--workspace, --store), else the cwd's."""
    from rsi.workspace import Workspace

    obj = ctx.find_root().obj or {}
    root = obj.get("workspace")
    ws = Workspace.load(Path(root).resolve()) if root else Workspace.discover()
    return ws.with_overrides(store=obj["store"]) if obj.get("store") else ws


def _fail(exc: RsiError, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"ok": False, "error": _problem(None, exc)}, indent=1))
    else:
        click.echo(f"error: {exc}", err=True)
    sys.exit(getattr(exc, "exit_code", EXIT_USAGE))


@click.group("catalog")
def catalog_group() -> None:
    """The task catalog: every task under tasks/ pinned in tasks/catalog.lock.

    \b
      rsi catalog ls                 tasks, framework, device, cases, status
      rsi catalog check              lock vs declarations, analysis, baseline checks
      rsi catalog check --no-run     the same without building anything (fast; CI's first step)
      rsi catalog update             what changed since the lock (writes nothing)
      rsi catalog update --yes       accept it: rewrite tasks/catalog.lock

    Exit codes: 0 all good, 1 a catalog problem (each named with its task and field),
    2 a usage or declaration error.
    """


@catalog_group.command("ls")
@click.option("--json", "as_json", is_flag=True, help="rsi.catalog.ls/1 on stdout")
@click.pass_context
def ls_cmd(ctx: click.Context, as_json: bool) -> None:
    """List the catalog's tasks and whether each matches its lock."""
    try:
        doc = Catalog(_ws(ctx)).ls()
    except RsiError as exc:
        _fail(exc, as_json)
    if as_json:
        click.echo(json.dumps(doc, indent=1))
        return
    click.echo(
        f"{'task':18s} {'framework':9s} {'device':6s} {'cases':>5s} {'hidden':>6s}  "
        f"{'bindings':28s} status"
    )
    for r in doc["tasks"]:
        click.echo(
            f"{r['task']:18s} {r['framework']:9s} {r['device']:6s} {r['cases']:5d} "
            f"{r['hidden_cases']:6d}  {', '.join(r['bindings'])[:28]:28s} {r['status']}"
        )
    for name in doc["missing"]:
        click.echo(f"{name:18s} (in the lock, no longer declared)")
    for u in doc["unexpected"]:
        click.echo(f"note: {u['folder']}: not a task ({u['why']}); left alone")


@catalog_group.command("check")
@click.option("--no-run", is_flag=True, help="check the lock and analyse; build nothing")
@click.option(
    "--all-bindings", is_flag=True, help="also build bindings that run in a toolchain rootfs"
)
@click.option("--json", "as_json", is_flag=True, help="rsi.catalog.check/1 on stdout")
@click.pass_context
def check_cmd(ctx: click.Context, no_run: bool, all_bindings: bool, as_json: bool) -> None:
    """Verify every task against tasks/catalog.lock, analyse it, and run each host binding's
    baseline check (its calibration too: the binding builds both; cached after the first run).
    Every problem is listed with its task, file and field; exit 1 if there is any."""
    try:
        doc = Catalog(_ws(ctx)).check(run=not no_run, all_bindings=all_bindings)
    except RsiError as exc:
        _fail(exc, as_json)
    if as_json:
        click.echo(json.dumps(doc, indent=1))
    else:
        for b in doc["baseline_checks"]:
            click.echo(f"baseline check {b['binding']}: {b['status']}")
        for u in doc["unexpected"]:
            click.echo(f"note: {u['folder']}: not a task ({u['why']}); left alone")
        for p in doc["problems"]:
            where = ":".join(x for x in (p["file"], p["field"]) if x)
            click.echo(f"error: {p['task'] or '-'}: {where}: {p['error']}", err=True)
            if p.get("hint"):
                click.echo(f"  hint: {p['hint']}", err=True)
        click.echo(
            f"catalog: {len(doc['analysed'])} task(s) analysed, "
            f"{len(doc['baseline_checks'])} binding(s), {len(doc['problems'])} problem(s)"
        )
    sys.exit(0 if doc["ok"] else EXIT_CATALOG)


@catalog_group.command("update")
@click.option("--yes", is_flag=True, help="write the new lock (without it nothing is written)")
@click.option("--json", "as_json", is_flag=True, help="the changes as JSON on stdout")
@click.pass_context
def update_cmd(ctx: click.Context, yes: bool, as_json: bool) -> None:
    """Show how the declared tasks differ from tasks/catalog.lock; with --yes, rewrite it."""
    cat = Catalog(_ws(ctx))
    try:
        plan = cat.plan_update()
    except RsiError as exc:
        _fail(exc, as_json)
    written = str(cat.update(plan)) if yes and plan["changes"] else None
    if as_json:
        doc = {k: plan[k] for k in ("changes", "unexpected")}
        click.echo(json.dumps(dict(doc, written=written), indent=1, default=str))
        return
    if not plan["changes"]:
        click.echo("the lock matches every declared task; nothing to do")
    for name, ch in plan["changes"].items():
        click.echo(f"{name}: {ch['change']}")
        if ch.get("task_md"):
            click.echo(f"  TASK.md: {ch['task_md']} (regenerated with --yes)")
        for d in ch["fields"]:
            click.echo(f"  {d['field']}: {_short(d['old'])} -> {_short(d['new'])}")
    for u in plan["unexpected"]:
        click.echo(f"note: {u['folder']}: not a task ({u['why']}); left alone")
    if plan["changes"]:
        click.echo(f"wrote {written}" if written else "nothing written: run again with --yes")
