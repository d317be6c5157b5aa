"""The build server's watch and mount points (rsi/watch.py `mounts_moved`, rsi.incremental
`_watched_unchanged`): a source that is a bind mount (as `docker -v file:file` makes) is
written through the mount's other path, which inotify reports to that path's folder only, so
such a source is stat'ed every build, and a mount made since the last check makes every source
stat'ed. Builds run in this process with the state kept and a real watcher, as the server runs
them; bind mounts need root (the test skips where `mount` is not permitted)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rsi import analysis_cache, incremental
from rsi.build import build
from rsi.watch import Watcher
from rsi.workspace import Workspace

pytestmark = pytest.mark.e2e


def _bind(source: Path, target: Path) -> None:
    try:
        done = subprocess.run(
            ["mount", "--bind", str(source), str(target)], capture_output=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"mount is not usable here: {exc}")
    if done.returncode != 0:
        pytest.skip(f"mount --bind is not permitted here: {done.stderr.decode().strip()}")


def _unbind(target: Path) -> None:
    subprocess.run(["umount", str(target)], capture_output=True, timeout=30)


@pytest.fixture
def served(command, make_workspace, tmp_path, monkeypatch):
    ws = make_workspace(
        tmp_path,
        {
            "in/a.txt": "alpha\n",
            "in/b.txt": "bravo\n",
            "BUILD.toml": command(
                "leaf_a", cmd="cat $(SRCS) > $(OUT)", srcs=["in/a.txt"], outs=["a.out"]
            )
            + command("leaf_b", cmd="cat $(SRCS) > $(OUT)", srcs=["in/b.txt"], outs=["b.out"]),
        },
    )
    host = tmp_path / "host"
    host.mkdir()
    monkeypatch.setenv("RSI_HOST_LOCK", str(tmp_path / "host.lock"))
    monkeypatch.setattr(analysis_cache, "keeping", True)
    monkeypatch.setattr(incremental, "_KEEP", {})
    mounted: list[Path] = []
    watcher = Watcher()
    monkeypatch.setattr(incremental, "watcher", watcher)
    monkeypatch.chdir(ws)
    workspace = Workspace.discover()

    def run() -> dict:
        report = build(workspace, ["//:leaf_a", "//:leaf_b"])
        assert report.ok
        return report.counts

    def bind(source: Path, target: Path) -> None:
        _bind(source, target)
        mounted.append(target)

    try:
        yield ws, host, run, bind
    finally:
        watcher.close()
        for target in reversed(mounted):
            _unbind(target)


def test_a_bind_mounted_source_edited_through_its_other_path_is_seen(served):
    ws, host, run, bind = served
    (host / "a.txt").write_text("alpha\n")
    bind(host / "a.txt", ws / "in" / "a.txt")
    run()
    assert run()["executed"] == 0  # NB: the watch is in place: the next check may use it
    # NB: written through the host's path: the event goes to `host/`, which nobody watches
    (host / "a.txt").write_text("ALPHA\n")
    assert run()["executed"] == 1
    assert (ws / "out" / "a.out").read_text() == "ALPHA\n"
    assert run()["executed"] == 0


def test_a_mount_made_over_a_source_after_the_last_check_is_seen(served):
    ws, host, run, bind = served
    run()
    assert run()["executed"] == 0
    (host / "b.txt").write_text("other\n")
    # NB: a mount raises no inotify event in the source's folder
    bind(host / "b.txt", ws / "in" / "b.txt")
    assert run()["executed"] == 1
    assert (ws / "out" / "b.out").read_text() == "other\n"
