"""The `rsi` console script: answers `rsi --version`, `rsi COMMAND --help` and runs a plain
`rsi build TARGET...` without loading the command line library (click); everything else goes
to `rsi.cli`.

A command's help is what click printed for the same arguments last time, kept beside this
package's bytecode and keyed by everything that shapes it (this rsi's version, `cli.py`'s stat,
the installed packages, the terminal width); off a terminal only, and anything unexpected just
means click prints it. Nothing else is answered here.
"""

from __future__ import annotations

import os
import sys

from rsi import __version__

# NB: the engine's own commands; a plugin's may change with what is installed
_CORE = ("build", "query", "graph", "why", "info", "rules", "worker", "toolchain", "cache")


def _help_key(argv: list[str]) -> tuple[str, str] | None:
    """(cache file, key) for `rsi COMMAND --help`, or None when it is not cacheable here."""
    if len(argv) != 2 or argv[0] not in _CORE or argv[1] not in ("--help", "-h"):
        return None
    try:
        if os.isatty(1):
            return None  # NB: click may style for a terminal; the cache holds plain text
        here = os.path.dirname(os.path.abspath(__file__))
        st = os.stat(os.path.join(here, "cli.py"))
        parts = [
            __version__,
            sys.version,
            st.st_mtime_ns,
            st.st_size,
            st.st_ino,
            st.st_ctime_ns,  # NB: a same-size edit with its mtime put back moves it
            os.environ.get("COLUMNS", ""),
        ]
        for entry in sys.path:
            if entry.endswith(("site-packages", "dist-packages")):
                parts.append(os.stat(entry).st_mtime_ns)
    except (OSError, ValueError):
        return None
    key = "\x1f".join(map(str, [*parts, *argv]))
    import zlib

    name = f"help-{zlib.crc32(key.encode()):08x}.txt"
    return os.path.join(here, "__pycache__", name), key


def _cached_help(path: str, key: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            head, _, text = f.read().partition("\n")
    except (OSError, ValueError):
        return None
    return text if head == key else None


def _render_and_keep(argv: list[str], path: str, key: str) -> None:
    import io

    from rsi.cli import main

    buffer = io.StringIO()
    real, sys.stdout = sys.stdout, buffer
    try:
        code = main.main(args=argv, prog_name="rsi", standalone_mode=False)
    finally:
        sys.stdout = real
    text = buffer.getvalue()
    sys.stdout.write(text)
    if code not in (None, 0) or not text:
        sys.exit(code or 0)
    try:
        from pathlib import Path

        from rsi.fsutil import atomic_write_bytes

        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write_bytes(Path(path), (key + "\n" + text).encode("utf-8"), fsync=False)
    except Exception:  # noqa: BLE001 - NB: a read-only install just never has the cache
        pass


def _leave(code: int) -> None:
    """End a finished plain build: its files are written and closed, so what is left is the
    exit handlers (the sandbox slots, their cgroups) and the interpreter's own teardown, which
    frees every object the build loaded one by one (~10 ms at 1,000 actions, growing with the
    graph). The handlers run, the streams are flushed, and the process ends without it."""
    import atexit
    import threading

    if sys.gettrace() is not None or sys.getprofile() is not None:
        sys.exit(code)  # NB: a profiler or a coverage tool writes its findings at exit
    if threading.active_count() > 1 and any(
        not t.daemon for t in threading.enumerate() if t is not threading.current_thread()
    ):
        sys.exit(code)  # NB: a thread still working is joined, as a normal exit joins it
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = 120  # NB: what the interpreter exits with when its last flush fails
    os._exit(code)


def run() -> None:
    argv = sys.argv[1:]
    if argv == ["--version"]:
        sys.stdout.write(f"rsi, version {__version__}\n")
        return
    found = _help_key(argv)
    if found is not None:
        text = _cached_help(*found)
        if text is not None:
            sys.stdout.write(text)
            return
        _render_and_keep(argv, *found)
        return
    if len(argv) >= 2 and argv[0] == "build" and not any(a.startswith("-") for a in argv[1:]):
        # NB: the incremental build's own path: `rsi build TARGET...` with no option needs no
        # option parser, and a no-op build should not pay for loading one
        if os.environ.get("RSI_SERVER") == "1":
            # NB: opt-in: a long-lived rsi serves the build (rsi/server.py); None means no
            # server answered (one is started for next time) and this process builds
            from rsi.server import via_server

            code = via_server(argv[1:])
            if code is not None:
                sys.exit(code)
        from rsi.buildcmd import plain_build

        _leave(plain_build(argv[1:]))
    from rsi.cli import run as cli_run

    cli_run()


if __name__ == "__main__":
    run()
