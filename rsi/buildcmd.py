"""What `rsi build` prints, free of click: `cli.py`'s build command uses it, and so does the console
script (`entry.py`) when it runs a plain `rsi build TARGET...` without loading click. It must never
hold engine logic of its own."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rsi.errors import EXIT_BUILD_FAILED, EXIT_USAGE, RsiError, not_writable


def report_lines(report: Any) -> list[str]:
    """The human report of a build: each target, its failures and outputs, then the counts."""
    lines: list[str] = []
    c = report.counts
    for label, t in report.targets.items():
        if t.get("skipped"):
            lines.append(f"{label}: skipped: {t['skipped']}")
            continue
        state = "ok" if t["ok"] else "FAILED"
        lines.append(f"{label}: {state} ({t['cache']})")
        for f in t["failed"]:
            lines.append(f"  {f['action']}: {f['status']}: {f['message']}")
        for path in t["outputs"]:
            lines.append(f"  {path}")
        if t.get("show"):
            lines.append("")
            lines.append(Path(t["show"]).read_text().rstrip())
            lines.append("")
    lines.append(
        f"{c['actions']} actions: {c['cached']} cached, {c['executed']} executed, "
        f"{c['failed']} failed, {c['skipped']} not built  ({report.wall_s:.2f}s)"
    )
    return lines


def exit_code(report: Any) -> int:
    return 0 if report.ok else EXIT_BUILD_FAILED


def plain_build(targets: list[str], echo: Callable[[str], None] | None = None) -> int:
    """`rsi build TARGETS` with no option, as `cli.py` runs it (same output, same exit codes,
    same error lines), for the console script's click-free path."""
    out = echo or (lambda line: sys.stdout.write(line + "\n"))
    try:
        from rsi.build import build as run_build
        from rsi.workspace import Workspace

        ws = Workspace.discover().with_overrides()
        report = run_build(ws, list(targets))
        for line in report_lines(report):
            out(line)
        return exit_code(report)
    except (RsiError, OSError) as exc:
        clean = exc if isinstance(exc, RsiError) else not_writable(exc)
        if clean is None:
            raise
        sys.stdout.flush()
        sys.stderr.write(f"rsi: error: {clean}\n")
        return clean.exit_code if clean.exit_code else EXIT_USAGE
    except KeyboardInterrupt as exc:
        # NB: a build stopped by SIGTERM exits 143, by Ctrl-C (SIGINT) 130
        sys.stdout.flush()
        sys.stderr.write(f"rsi: interrupted ({getattr(exc, 'signal', 'SIGINT')})\n")
        return getattr(exc, "exit_code", 130)
