"""A candidate's pre-flight: the cheap checks a round would fail on before any measurement —
every file parses, the entry module imports, the entry point exists and takes the task's
inputs the way the baseline's does. Runs in the sandbox like every step; never calls the entry
and never sees an input, a seed or a case, so it can tell nothing about the hidden cases.

Advisory only: it is never a verdict. The import runs in a child process; the parent reads
its answer from a pipe and writes the result, so a candidate that exits or crashes at import
is reported as such (one that forges the pipe fools only its own pre-flight: the round judges
it again). Stdlib only; never imports `rsi` or `rules`.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import os
import select
import sys
import time
import traceback
import types
from pathlib import Path

IMPORT_TIMEOUT_S = 20.0
MAX_ANSWER = 1 << 16


def _check(name: str, ok: bool, detail: str = "", file: str | None = None, line=None) -> dict:
    return {"name": name, "ok": ok, "detail": detail, "file": file, "line": line}


def static_checks(impl: Path, entry: dict) -> list[dict]:
    """Decode and compile every Python file, parse every JSON file; compiling runs nothing."""
    checks = []
    for path in sorted(p for p in impl.rglob("*") if p.is_file()):
        rel = path.relative_to(impl).as_posix()
        if not rel.endswith((".py", ".json")):
            continue
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            checks.append(_check("utf8", False, f"not UTF-8 at byte {exc.start}", rel))
            continue
        if rel.endswith(".py"):
            try:
                compile(text, rel, "exec", dont_inherit=True)
                checks.append(_check("syntax", True, "compiles", rel))
            except SyntaxError as exc:
                checks.append(_check("syntax", False, f"SyntaxError: {exc.msg}", rel, exc.lineno))
            except ValueError as exc:  # NB: a NUL byte in the source
                checks.append(_check("syntax", False, f"ValueError: {exc}", rel))
        elif rel.endswith(".json"):
            try:
                json.loads(text)
                checks.append(_check("json", True, "parses", rel))
            except ValueError as exc:
                checks.append(_check("json", False, f"invalid JSON: {exc}", rel))
    module = entry.get("module")
    if module and not (impl / f"{module}.py").is_file():
        checks.append(_check("entry_module", False, f"{module}.py is missing", f"{module}.py"))
    return checks


def _required(fn: ast.FunctionDef | ast.AsyncFunctionDef, drop_self: bool) -> list[str]:
    a = fn.args
    positional = [*a.posonlyargs, *a.args][1 if drop_self else 0 :]
    required = positional[: len(positional) - len(a.defaults)]
    kw_required = [k for k, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is None]
    return [p.arg for p in required] + [k.arg for k in kw_required]


def baseline_params(baseline: Path, entry: dict) -> dict | None:
    """The baseline entry's required parameter names, read from its source (AST): for a
    function the names the referee passes the inputs by; for a class those of `__init__` and
    `forward` (or `__call__`). None when it cannot be read."""
    try:
        tree = ast.parse((baseline / f"{entry['module']}.py").read_text("utf-8"))
    except (OSError, SyntaxError, ValueError, KeyError):
        return None
    defs = (ast.FunctionDef, ast.AsyncFunctionDef)
    for node in tree.body:
        if entry.get("function") and isinstance(node, defs) and node.name == entry["function"]:
            return {"function": _required(node, False)}
        if entry.get("class") and isinstance(node, ast.ClassDef) and node.name == entry["class"]:
            methods = {m.name: m for m in node.body if isinstance(m, defs)}
            call = methods.get("forward") or methods.get("__call__")
            init = methods.get("__init__")
            return {
                "init": _required(init, True) if init else [],
                "call": _required(call, True) if call else None,
            }
    return None


def _child(impl: str, entry: dict, params: dict | None, fd: int) -> None:
    """Import the entry module as a private package and check the entry; answer on `fd`."""
    import importlib.util

    answer: dict = {"import": None, "entry": None, "signature": None}
    try:
        package = types.ModuleType("_rsi_preflight")
        package.__path__ = [impl]
        sys.modules["_rsi_preflight"] = package
        name = f"_rsi_preflight.{entry['module']}"
        spec = importlib.util.spec_from_file_location(name, Path(impl) / f"{entry['module']}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        t0 = time.perf_counter()
        spec.loader.exec_module(module)
        answer["import"] = {"ok": True, "seconds": round(time.perf_counter() - t0, 3)}
    except BaseException as exc:  # noqa: BLE001 - whatever the import raises is the answer
        tb = traceback.extract_tb(exc.__traceback__)
        where = next((f for f in reversed(tb) if f.filename.startswith(impl)), None)
        answer["import"] = {
            "ok": False,
            "detail": f"{type(exc).__name__}: {str(exc)[:500]}",
            "file": os.path.relpath(where.filename, impl) if where else None,
            "line": where.lineno if where else None,
        }
        _answer(fd, answer)
        return
    target_name = entry.get("class") or entry.get("function")
    target = getattr(module, target_name, None)
    if entry.get("class"):
        ok = isinstance(target, type)
        what = "class"
    else:
        ok = callable(target)
        what = "callable"
    answer["entry"] = {
        "ok": ok,
        "detail": f"{entry['module']}.py defines {what} {target_name}"
        if ok
        else f"{entry['module']}.py defines no {what} {target_name!r}",
    }
    if ok:
        answer["signature"] = _signature(target, entry, params)
    _answer(fd, answer)


def _signature(target, entry: dict, params: dict | None) -> dict:
    """Whether the entry takes what the referee passes, the way the baseline's does."""
    if params is None:
        return {"ok": True, "detail": "no baseline signature to compare with"}
    try:
        if entry.get("class"):
            inspect.signature(target).bind(*[None] * len(params["init"]))
            if params.get("call") is not None:
                call = getattr(target, "forward", None) or target.__call__
                inspect.signature(call).bind(None, *[None] * len(params["call"]))
            return {
                "ok": True,
                "detail": f"{target.__name__} takes the baseline's {len(params['init'])} init "
                f"and {len(params.get('call') or [])} call argument(s)",
            }
        names = params["function"]
        inspect.signature(target).bind(**{p: None for p in names})
        return {"ok": True, "detail": f"accepts the inputs by name ({', '.join(names)})"}
    except TypeError as exc:
        want = ", ".join(params.get("function") or params.get("call") or [])
        return {"ok": False, "detail": f"does not take the baseline's arguments ({want}): {exc}"}
    except ValueError as exc:  # NB: no signature (a builtin): cannot be checked, not passed
        return {"ok": False, "detail": f"its signature cannot be read: {exc}"}


def _answer(fd: int, answer: dict) -> None:
    data = json.dumps(answer).encode()[:MAX_ANSWER]
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.close(fd)


def import_checks(impl: Path, entry: dict, params: dict | None) -> list[dict]:
    """Run the import in a child; its exit, crash or silence is reported, never trusted."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        code = 0
        try:
            _child(str(impl.resolve()), entry, params, write_fd)
        except BaseException:  # noqa: BLE001
            code = 70
        os._exit(code)
    os.close(write_fd)
    chunks, deadline = [], time.monotonic() + IMPORT_TIMEOUT_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([read_fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(read_fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_fd)
    timed_out = time.monotonic() >= deadline
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass
    _, status = os.waitpid(pid, 0)
    try:
        answer = json.loads(b"".join(chunks)[:MAX_ANSWER] or b"null")
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or not isinstance(answer.get("import"), dict):
        why = (
            f"the import did not finish within {IMPORT_TIMEOUT_S:g} s"
            if timed_out
            else f"the import ended the process ({_status(status)}) before it answered"
        )
        return [_check("import", False, why, f"{entry['module']}.py")]
    imp = answer["import"]
    checks = [
        _check(
            "import",
            bool(imp.get("ok")),
            f"imported in {imp.get('seconds')} s" if imp.get("ok") else str(imp.get("detail")),
            imp.get("file") or f"{entry['module']}.py",
            imp.get("line"),
        )
    ]
    for name in ("entry", "signature"):
        part = answer.get(name)
        if isinstance(part, dict):
            checks.append(
                _check(name, bool(part.get("ok")), str(part.get("detail")), f"{entry['module']}.py")
            )
    return checks


def _status(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit {os.WEXITSTATUS(status)}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--impl", required=True, type=Path)
    ap.add_argument("--baseline", type=Path)
    ap.add_argument("--entry", required=True, help="the task's entry as JSON")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    entry = json.loads(args.entry)
    t0 = time.perf_counter()
    checks = static_checks(args.impl, entry) if args.impl.is_dir() else []
    if entry.get("module") and all(c["ok"] for c in checks):
        params = baseline_params(args.baseline, entry) if args.baseline else None
        checks += import_checks(args.impl, entry, params)
    doc = {
        "ok": bool(checks) and all(c["ok"] for c in checks),
        "checks": checks,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    args.out.write_text(json.dumps(doc, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
