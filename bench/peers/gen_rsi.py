"""rsi adapter for ../shared/peers (the peer build-tool benchmark): the same fan-in graph, timed
by the peers' own harness so rsi's numbers sit beside Nix, Bazel, Snakemake, redun and DVC.
Run through bench/peers/run.sh, which copies the harness and adds this file to it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from common import Tool, mids_of, rm

# NB: the console script people run (`rsi`), beside this interpreter when installed there
_SCRIPT = os.path.join(os.path.dirname(sys.executable), "rsi")
RSI = [_SCRIPT] if os.access(_SCRIPT, os.X_OK) else [sys.executable, "-m", "rsi.cli"]


class Rsi(Tool):
    name = "rsi"

    def setup(self):
        self.fresh_ws()
        (self.ws / "rsi.toml").write_text("[workspace]\njobs = %d\n" % (os.cpu_count() or 1))
        parts = []
        for i in range(self.n):
            parts.append(
                f'[leaf_{i}]\nrule = "command"\nsrcs = ["in/leaf_{i}.txt"]\n'
                f'outs = ["leaf_{i}.out"]\n'
                f'cmd = "cat $(SRCS) > $(OUT) && echo leaf {i} >> $(OUT)"\n'
            )
        for j, leaves in mids_of(self.n):
            deps = json.dumps([f":leaf_{i}" for i in leaves])
            parts.append(
                f'[mid_{j}]\nrule = "command"\ndeps = {deps}\nouts = ["mid_{j}.out"]\n'
                f'cmd = "cat {" ".join(f"leaf_{i}.out" for i in leaves)} > $(OUT)"\n'
            )
        mids = [f":mid_{j}" for j, _ in mids_of(self.n)]
        files = " ".join(f"mid_{j}.out" for j, _ in mids_of(self.n))
        parts.append(
            f'[root]\nrule = "command"\ndeps = {json.dumps(mids)}\nouts = ["root.out"]\n'
            f'cmd = "cat {files} > $(OUT)"\n'
        )
        (self.ws / "BUILD.toml").write_text("\n".join(parts))

    def clean(self):
        rm(self.ws / "out")
        rm(self.ws / "cache")

    def build_cmd(self):
        return [*RSI, "build", "//:root"]

    def executed(self, log):
        m = re.search(r"(\d+) actions: (\d+) cached, (\d+) executed", log)
        return int(m.group(3)) if m else None

    def root_text(self):
        return (self.ws / "out" / "root.out").read_text()

    def version(self):
        return subprocess.run([*RSI, "--version"], capture_output=True, text=True).stdout.strip()

    def startup_cmd(self):
        return [*RSI, "--version"]

    def help_cmd(self):
        return [*RSI, "build", "--help"]


class RsiServer(Rsi):
    """rsi with its build server (RSI_SERVER=1, rsi/server.py): the first build starts one in
    the background; the timed ones after the warm-up are served by it. Its memory is not in the
    peak RSS column (the server is not a child of the run, as Bazel's is not)."""

    name = "rsi-server"

    def env(self):
        return {
            **super().env(),
            "RSI_SERVER": "1",
            "RSI_SERVER_IDLE_S": "900",
            # NB: a server of this workspace's own, found again by shutdown()
            "RSI_BENCH_SERVER": str(self.ws),
        }

    def shutdown(self):
        mark = f"RSI_BENCH_SERVER={self.ws}".encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if b"rsi.server" not in f.read():
                        continue
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if mark in f.read().split(b"\0"):
                        os.kill(int(entry), 15)
            except OSError:
                continue


class RsiWatch(RsiServer):
    """The build server watching the sources' folders (RSI_SERVER_WATCH=1, rsi/watch.py):
    a source no inotify event named is not stat'ed."""

    name = "rsi-watch"

    def env(self):
        return {**super().env(), "RSI_SERVER_WATCH": "1"}


TOOLS = {"rsi": Rsi, "rsi-server": RsiServer, "rsi-watch": RsiWatch}
