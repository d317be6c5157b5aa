"""Start and stop a local BuildGrid 0.4.4 (and, for remote execution, its PostgreSQL) on free
loopback ports. Used by tests/remote/conftest.py and bench/remote.py; runnable by hand:

    python scripts/buildgrid/servers.py cache        # prints the grpc:// address, Ctrl-C stops
    python scripts/buildgrid/servers.py execution

BuildGrid lives in its own venv (scripts/buildgrid/setup.sh; $RSI_BUILDGRID_HOME, default
/opt/rsi-buildgrid) so its pinned grpc/protobuf never meet rsi's.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

HERE = Path(__file__).resolve().parent
HOME = Path(os.environ.get("RSI_BUILDGRID_HOME", "/opt/rsi-buildgrid"))
BGD = HOME / "venv" / "bin" / "bgd"


def _pg_bin() -> Path:
    if "RSI_PG_BIN" in os.environ:
        return Path(os.environ["RSI_PG_BIN"])
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))
    return found[-1].parent if found else Path("/usr/lib/postgresql/15/bin")


PG_BIN = _pg_bin()


class Unavailable(RuntimeError):
    """BuildGrid or PostgreSQL is not installed here (run scripts/buildgrid/setup.sh)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{_tail(log)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"server did not listen on {port} within {timeout_s}s:\n{_tail(log)}")


def _tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-2000:]}")


def _pg_user() -> list[str]:
    """PostgreSQL refuses to run as root: as root, run its tools as `postgres`."""
    if os.geteuid() != 0:
        return []
    runuser = shutil.which("runuser")
    if runuser is None:
        raise Unavailable("running as root without runuser: cannot start PostgreSQL")
    return [runuser, "-u", "postgres", "--"]


@dataclass
class Postgres:
    root: Path
    port: int = 0
    _started: bool = False

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://bgd@127.0.0.1:{self.port}/bgd"

    def start(self) -> Postgres:
        if not (PG_BIN / "postgres").exists():
            raise Unavailable(f"PostgreSQL not found in {PG_BIN} (apt-get install postgresql)")
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            # NB: mkdtemp folders are 0700; the postgres user must reach its data folder.
            for parent in [self.root.parent, *self.root.parent.parents]:
                if parent.stat().st_mode & 0o001 == 0 and parent.owner() == "root":
                    os.chmod(parent, parent.stat().st_mode | 0o711)
            shutil.chown(self.root, "postgres")
        data = self.root / "data"
        run = _pg_user()
        _run(
            [
                *run,
                str(PG_BIN / "initdb"),
                "-D",
                str(data),
                "-A",
                "trust",
                "-U",
                "bgd",
                "--no-sync",
                "-E",
                "UTF8",
            ],
        )
        self.port = free_port()
        opts = f"-h 127.0.0.1 -p {self.port} -k {self.root} -F -c fsync=off"
        _run(
            [
                *run,
                str(PG_BIN / "pg_ctl"),
                "-D",
                str(data),
                "-o",
                opts,
                "-l",
                str(self.root / "postgres.log"),
                "-w",
                "-t",
                "30",
                "start",
            ],
        )
        self._started = True
        _run(
            [
                *run,
                str(PG_BIN / "createdb"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                "bgd",
                "bgd",
            ],
        )
        _run([str(BGD), "migrate", "apply", self.url])
        return self

    def stop(self) -> None:
        if self._started:
            subprocess.run(
                [
                    *_pg_user(),
                    str(PG_BIN / "pg_ctl"),
                    "-D",
                    str(self.root / "data"),
                    "-m",
                    "immediate",
                    "-w",
                    "stop",
                ],
                capture_output=True,
                check=False,
            )
            self._started = False


@dataclass
class BuildGridServer:
    """One `bgd server start` process. kind: 'cache' (CAS+AC in memory) or 'execution'."""

    kind: str = "cache"
    workdir: Path | None = None
    port: int = 0
    proc: subprocess.Popen | None = None
    postgres: Postgres | None = None
    _own_dir: bool = field(default=False, repr=False)

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        assert self.workdir is not None
        return self.workdir / f"bgd-{self.kind}.log"

    def start(self, timeout_s: float = 60.0) -> BuildGridServer:
        if not BGD.exists():
            raise Unavailable(f"BuildGrid not installed at {BGD} (run scripts/buildgrid/setup.sh)")
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix=f"rsi-bgd-{self.kind}-"))
            self._own_dir = True
        env = dict(os.environ)
        if self.kind == "execution":
            self.postgres = Postgres(self.workdir / "pg").start()
            env["RSI_BGD_DB"] = self.postgres.url
        self.port = free_port()
        env["RSI_BGD_ADDRESS"] = f"127.0.0.1:{self.port}"
        config = HERE / ("execution.yml" if self.kind == "execution" else "cache.yml")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [str(BGD), "server", "start", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.workdir,
                start_new_session=True,
            )
        try:
            _wait_port(self.port, self.proc, timeout_s, self.log)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait()
        self.proc = None
        if self.postgres is not None:
            self.postgres.stop()
            self.postgres = None
        if self._own_dir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    kind = sys.argv[1] if len(sys.argv) > 1 else "cache"
    with BuildGridServer(kind) as server:
        print(server.url, flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
