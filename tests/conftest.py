"""Shared test fixtures: tiny workspaces in `tmp_path` and the real `rsi` CLI as a subprocess.

Fixtures (each returns the helper of the same name): `make_workspace` writes `rsi.toml` and any
files (BUILD.toml included) under a fresh folder; `run_rsi` runs `python -m rsi.cli` there;
`build` adds `--json --events` and parses both; `command` writes one `command` target as TOML.
`bwrap` skips a test unless the local sandbox is bubblewrap; `torch` is torch, or skips the test
where it is not installed. Every test is marked `fast` or `e2e` (see TEST_KINDS below).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from eventlog import read_events

RSI = [sys.executable, "-m", "rsi.cli"]


def _private_host_lock() -> None:
    """Give this test run its own host lock (RSI_HOST_LOCK), set in the environment so every
    test and every `rsi` subprocess uses it: the suite never waits on an unrelated build on
    this machine, nor holds one up. Worker processes a run starts inherit the run's lock."""
    if os.environ.get("RSI_TEST_HOST_LOCK_RUN"):
        return
    folder = tempfile.mkdtemp(prefix="rsi-test-hostlock-")
    os.environ["RSI_TEST_HOST_LOCK_RUN"] = str(os.getpid())
    os.environ["RSI_HOST_LOCK"] = os.path.join(folder, "host.lock")
    atexit.register(shutil.rmtree, folder, True)


_private_host_lock()


def _signals_as_a_terminal_gives_them() -> None:
    """A suite started in the background by a shell without job control (`cmd &` in a
    script, `nohup`) inherits SIGINT and SIGQUIT ignored, and so would every `rsi` it starts
    (an ignored signal stays ignored across exec): the tests that press Ctrl-C on a build
    would then fail for the way the suite was started. They are given their defaults back
    here, in this process; children then start with them."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGQUIT) is signal.SIG_IGN:
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)


_signals_as_a_terminal_gives_them()

# Every test is exactly one of these (markers in pyproject.toml). `fast`: a unit test with no
# sandbox (bwrap), docker, network or server, torch, or subprocess-heavy harness run; the whole
# fast set runs in under a minute (`./scripts/test.sh -m fast`). `e2e`: everything else.
TEST_KINDS = ("fast", "e2e")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Refuse to run a suite in which some test is not exactly one of fast/e2e: checked before
    `-m` deselects anything, so an unmarked test fails `-m fast` runs too."""
    wrong = []
    for item in items:
        kinds = sorted({m.name for m in item.iter_markers() if m.name in TEST_KINDS})
        if len(kinds) != 1:
            wrong.append(f"  {item.nodeid}: {' and '.join(kinds) or 'neither'}")
    if wrong:
        shown = "\n".join(wrong[:30]) + (
            f"\n  ... and {len(wrong) - 30} more" if len(wrong) > 30 else ""
        )
        raise pytest.UsageError(
            f"{len(wrong)} test(s) must carry exactly one of the markers {', '.join(TEST_KINDS)}"
            " (`pytestmark = pytest.mark.fast` for a whole module, `@pytest.mark.e2e` for one"
            f" test; see tests/conftest.py):\n{shown}"
        )


def write_files(root: Path, files: Mapping[str, str | bytes]) -> None:
    """Write `{relative path: content}` under `root`; text is dedented."""
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(textwrap.dedent(content))


def make_workspace(
    tmp_path: Path,
    files: Mapping[str, str | bytes] | None = None,
    *,
    config: str = "",
    name: str = "ws",
) -> Path:
    """A workspace folder `tmp_path/name` holding `rsi.toml` (`config`) and `files`."""
    root = tmp_path / name
    root.mkdir(parents=True, exist_ok=True)
    (root / "rsi.toml").write_text(textwrap.dedent(config))
    write_files(root, files or {})
    return root


@dataclass
class RsiRun:
    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    events: list[dict] = field(default_factory=list)

    def json(self):
        try:
            return json.loads(self.stdout)
        except ValueError:
            raise AssertionError(f"rsi {' '.join(self.args)} printed no JSON:\n{self}") from None

    def __str__(self) -> str:
        return (
            f"$ rsi {' '.join(self.args)}\nexit {self.returncode}\n--- stdout\n{self.stdout}"
            f"\n--- stderr\n{self.stderr}"
        )

    # -------------------------------------------------------------- event stream views
    def finished(self) -> list[dict]:
        return [e for e in self.events if e["kind"] == "action_finished"]

    @property
    def executed(self) -> set[str]:
        """Labels whose action ran in this build and succeeded."""
        return {
            e["label"]
            for e in self.finished()
            if e.get("cache") == "miss" and e.get("status") == "ok"
        }

    @property
    def cached(self) -> set[str]:
        return {e["label"] for e in self.finished() if e.get("cache") in ("hit", "remote_hit")}

    def why(self, label: str) -> list[str]:
        for e in self.events:
            if e["kind"] == "action_started" and e.get("label") == label:
                return e.get("why") or []
        raise AssertionError(f"{label} did not start in this build:\n{self}")


def run_rsi(
    ws: Path,
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 120,
    user: list[str] | None = None,
) -> RsiRun:
    """Run the real CLI in `ws` (or `cwd`). `user` prefixes the command (e.g. setpriv ...)."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(
        [*(user or []), *RSI, *args],
        cwd=cwd or ws,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    return RsiRun(tuple(args), proc.returncode, proc.stdout, proc.stderr)


def build(ws: Path, *args: str, expect: int | None = 0, store: Path | None = None, **kw) -> RsiRun:
    """`rsi [--store S] build --json --events FILE --events-hits ARGS`; checks the exit code
    (unless `expect` is None) and parses the event stream into `.events` (every hit listed, so
    `.cached` names them)."""
    events_path = ws.parent / f"events-{uuid.uuid4().hex[:12]}.jsonl"
    pre = ("--store", str(store)) if store is not None else ()
    run = run_rsi(
        ws, *pre, "build", "--json", "--events", str(events_path), "--events-hits", *args, **kw
    )
    run.events = read_events(events_path)
    if expect is not None:
        assert run.returncode == expect, str(run)
    return run


# NB: helpers reach tests as fixtures, never as `from conftest import ...`: another folder's
# conftest.py may own the module name `conftest` by the time a test module is imported.
@pytest.fixture(name="make_workspace", scope="session")
def make_workspace_fixture():
    return make_workspace


@pytest.fixture(name="run_rsi", scope="session")
def run_rsi_fixture():
    return run_rsi


@pytest.fixture(name="build", scope="session")
def build_fixture():
    return build


@pytest.fixture(name="command", scope="session")
def command_fixture():
    return command


@pytest.fixture
def mount_tmpfs(tmp_path):
    """`mount_tmpfs(mib)`: a tmpfs of that size under tmp_path (root and CAP_SYS_ADMIN; skips
    the test otherwise), unmounted afterwards."""
    mounted: list[Path] = []

    def mount(mib: int) -> Path:
        point = tmp_path / f"tmpfs-{mib}m-{len(mounted)}"
        point.mkdir()
        got = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(point)],
            capture_output=True,
            text=True,
            check=False,
        )
        if got.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {got.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=False)


@pytest.fixture(name="read_events", scope="session")
def read_events_fixture():
    return read_events


@pytest.fixture(name="rsi_argv", scope="session")
def rsi_argv_fixture() -> list[str]:
    """The argv prefix that runs the real CLI (for tests that start it themselves)."""
    return list(RSI)


def require_bwrap() -> None:
    """Skip (fail under RSI_REQUIRE_SANDBOXES=1) unless the local executor's sandbox is bwrap."""
    from rsi.executors.local import sandbox_mode

    mode = sandbox_mode()
    if mode != "bwrap":
        reason = f"bubblewrap is not usable here (local sandbox is {mode!r})"
        if os.environ.get("RSI_REQUIRE_SANDBOXES") == "1":
            pytest.fail(f"RSI_REQUIRE_SANDBOXES=1 but {reason}")
        pytest.skip(reason)


@pytest.fixture
def bwrap() -> None:
    require_bwrap()


@pytest.fixture(name="torch", scope="session")
def torch_fixture():
    """torch, imported only when a test asks for it (collecting never needs it); without torch
    installed the test skips, saying so."""
    return pytest.importorskip(
        "torch", reason="torch is not installed (the `torch` or `test` extra of pyproject.toml)"
    )


def command(
    name: str, *, cmd: str, outs: list[str], srcs: list[str] = (), deps: list[str] = (), **extra
) -> str:
    """One `command` target as TOML text."""
    lines = [
        f"[{name}]",
        'rule = "command"',
        f"outs = {json.dumps(list(outs))}",
        f"cmd = {json.dumps(cmd)}",
    ]
    if srcs:
        lines.append(f"srcs = {json.dumps(list(srcs))}")
    if deps:
        lines.append(f"deps = {json.dumps(list(deps))}")
    for key, value in extra.items():
        if isinstance(value, dict):
            inner = ", ".join(f"{k} = {json.dumps(v)}" for k, v in value.items())
            lines.append(f"{key} = {{ {inner} }}")
        else:
            lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n\n"
