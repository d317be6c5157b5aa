"""A real one-node Slurm cluster on loopback for the tests: munged, slurmctld and slurmd from
the Debian packages, each with its own key, socket, ports, state and logs under one folder,
started by `SlurmCluster.start()` and stopped (every daemon, then the folder) by `stop()`.

Nothing here touches a system Slurm or munge: the daemons read only the generated
`slurm.conf` (SLURM_CONF points the client commands at it) and the munge socket named in it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel")


def missing() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmCluster:
    def __init__(self, cpus: int | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="rsi-slurm-"))
        self.cpus = cpus or (os.cpu_count() or 1)
        self.conf = self.root / "slurm.conf"
        self.env = {"SLURM_CONF": str(self.conf)}
        self.pidfiles = [
            self.root / "slurmd.pid",
            self.root / "slurmctld.pid",
            self.root / "munge" / "munged.pid",
        ]

    def _write_conf(self) -> None:
        r = self.root
        for sub in ("state", "spool", "log", "munge"):
            (r / sub).mkdir(exist_ok=True)
        os.chmod(r / "munge", 0o700)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        ctld, slurmd = _free_port(), _free_port()
        self.conf.write_text(
            f"""\
ClusterName=rsitest
SlurmctldHost=localhost
SlurmctldPort={ctld}
SlurmdPort={slurmd}
AuthType=auth/munge
AuthInfo=socket={r}/munge/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
MpiDefault=none
ReturnToService=2
KillWait=2
OverTimeLimit=0
MinJobAge=600
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=localhost NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""
        )

    def start(self, timeout_s: float = 60.0) -> "SlurmCluster":
        self._write_conf()
        r = self.root
        env = {**os.environ, **self.env}
        subprocess.run(
            [
                "munged",
                f"--key-file={r}/munge/munge.key",
                f"--socket={r}/munge/munge.sock",
                f"--pid-file={r}/munge/munged.pid",
                f"--log-file={r}/log/munged.log",
                f"--seed-file={r}/munge/seed",
                "--force",
            ],
            check=True,
            env=env,
        )
        subprocess.run(["slurmctld", "-f", str(self.conf)], check=True, env=env)
        subprocess.run(["slurmd", "-f", str(self.conf), "-N", "localhost"], check=True, env=env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            out = self.cmd("sinfo", "-h", "-o", "%T", check=False)
            if out.strip() in ("idle", "mixed", "allocated"):
                return self
            time.sleep(0.2)
        logs = "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
            for p in (r / "log").glob("*.log")
        )
        self.stop()
        raise RuntimeError(f"the test Slurm cluster did not come up:\n{logs}")

    def cmd(self, *argv: str, check: bool = True) -> str:
        proc = subprocess.run(
            argv, capture_output=True, text=True, env={**os.environ, **self.env}, timeout=60
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {proc.stderr}")
        return proc.stdout

    def jobs(self) -> list[str]:
        """Job ids Slurm has queued or running (any state but ended)."""
        return self.cmd("squeue", "-h", "-o", "%i", check=False).split()

    def stop(self) -> None:
        for pidfile in self.pidfiles:
            try:
                pid = int(pidfile.read_text().strip())
            except (OSError, ValueError):
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            for _ in range(100):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.05)
            else:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        shutil.rmtree(self.root, ignore_errors=True)
