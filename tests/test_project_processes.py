"""An external project's command may not leave anything running (rules/harness/project.py): the
harness is the subreaper of every run, so a helper that calls setsid and outlives its process
group is still found, ended, and makes that run invalid (`escaped_process`) instead of living on
into the next run's folder. A fast test: a real subprocess of the harness, no sandbox."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ROOT / "rules" / "harness" / "project.py"

BENCH = """\
import json, os, subprocess, sys
if sys.argv[1:] == ["escape"]:
    # NB: a new session, then the shell that started it exits: the helper is orphaned
    subprocess.Popen(["setsid", "sh", "-c", "echo $$ > {pids}/$RSI_PAIR-$$; exec sleep 300"],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)
if sys.argv[1:] == ["orphan"]:
    # NB: a grandchild that stays in the run's group and session, outliving its parent: the
    # group's SIGKILL ends it, and it waits, a zombie re-parented to the harness, to be reaped
    if os.fork() == 0:
        if os.fork() == 0:
            import time
            time.sleep(30)
            os._exit(0)
        os._exit(0)
    os.wait()
print(json.dumps({{"samples": [2.0]}}))
"""


def _bench(tmp_path: Path, argv: str) -> tuple[dict, list[int]]:
    pids = tmp_path / "pids"
    pids.mkdir(exist_ok=True)
    base = tmp_path / "base"
    base.mkdir(exist_ok=True)
    (base / "bench.py").write_text(BENCH.format(pids=pids))
    spec = {
        "schema": "rsi.project.spec/1",
        "seed": 1,
        "benchmark": {"cmd": f"python3 bench.py {argv}", "timeout_s": 60},
        "measure": {"pairs": 1},
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    out = tmp_path / f"out-{argv or 'plain'}.json"
    run = subprocess.run(
        [sys.executable, str(PROJECT), "bench", "--spec", str(tmp_path / "spec.json")]
        + ["--base", str(base), "--out", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    time.sleep(0.2)  # NB: the helper writes its pid file as it starts
    return json.loads(out.read_text()), [int(p.name.split("-")[1]) for p in pids.iterdir()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.fast
def test_a_helper_that_leaves_the_group_is_ended_and_the_run_is_invalid(tmp_path):
    doc, pids = _bench(tmp_path, "escape")
    try:
        assert pids, "the helper never started"
        assert not [p for p in pids if _alive(p)], "a setsid helper outlived the harness"
        for arm in ("baseline", "candidate"):
            codes = [r["code"] for r in doc["invalid"][arm]]
            assert "escaped_process" in codes, doc["invalid"]
    finally:
        for pid in pids:
            try:
                os.kill(pid, 9)
            except OSError:
                pass


@pytest.mark.fast
def test_a_command_that_leaves_nothing_behind_is_valid(tmp_path):
    doc, pids = _bench(tmp_path, "")
    assert pids == [] and doc["status"] == "ok", doc["invalid"]


@pytest.mark.fast
def test_a_member_of_the_run_left_to_be_reaped_is_not_an_escape(tmp_path):
    """A zombie of the run's own session never left it: counting it as escaped_process made a
    correct serving arm invalid (2 of 4 arms under load)."""
    for _ in range(3):
        doc, pids = _bench(tmp_path, "orphan")
        assert pids == [] and doc["status"] == "ok", doc["invalid"]
