"""The build server (rsi/server.py, opt-in with RSI_SERVER=1): a plain `rsi build TARGET...`
is served by a long-lived rsi with the same output and exit code as an in-process build; a
missing, busy, dying or outdated server only means the client builds by itself; Ctrl-C stops
the served build and not the server; another user cannot use it; an idle one exits.

Every test runs the real console script against a real server process, each under an
environment of its own (so a server of its own), and kills what it started."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

RSI = str(Path(sys.executable).with_name("rsi"))


def _server_pids(tag: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            if b"rsi.server" not in cmd:
                continue
            if f"RSI_TEST_SERVER={tag}".encode() in Path(f"/proc/{entry}/environ").read_bytes():
                found.append(int(entry))
        except OSError:
            continue
    return found


@pytest.fixture
def served(tmp_path):
    """(environment, tag) of a server of this test's own; it is killed afterwards."""
    tag = uuid.uuid4().hex
    env = {
        **os.environ,
        "RSI_SERVER": "1",
        "RSI_SERVER_IDLE_S": "120",
        "RSI_TEST_SERVER": tag,
        "RSI_HOST_LOCK": str(tmp_path / "host.lock"),
    }
    yield env, tag
    for pid in _server_pids(tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _rsi(ws: Path, env: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [RSI, *args], cwd=ws, env=env, capture_output=True, text=True, timeout=timeout
    )


def _start(ws: Path, env: dict, target: str) -> subprocess.Popen:
    """A build left running (its output piped), to be signalled or waited for."""
    return subprocess.Popen(
        [RSI, "build", target], cwd=ws, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def _builder_pid(ws: Path) -> int:
    """The pid that ran the newest build (its log's build_started)."""
    logs = sorted((ws / "cache" / "events").glob("*.jsonl"), key=lambda p: p.stat().st_mtime_ns)
    first = json.loads(logs[-1].read_text().splitlines()[0])
    assert first["kind"] == "build_started"
    return first["pid"]


def _until_served(ws: Path, env: dict, tag: str, target: str) -> subprocess.CompletedProcess:
    """Build until a server (started on demand by the first build) serves the build."""
    deadline = time.monotonic() + 60
    while True:
        run = _rsi(ws, env, "build", target)
        if _builder_pid(ws) in _server_pids(tag):
            return run
        assert time.monotonic() < deadline, f"no server served a build:\n{run.stderr}"
        time.sleep(0.3)


def _same(text: str) -> str:
    return re.sub(r"\(\d+\.\d+s\)", "(Ts)", text)


WORKSPACE = {
    "in/a.txt": "alpha\n",
    "BUILD.toml": (
        '[up]\nrule = "command"\nsrcs = ["in/a.txt"]\nouts = ["a.out"]\n'
        'cmd = "tr a-z A-Z < $(SRCS) > $(OUT)"\n\n'
        '[bad]\nrule = "command"\nouts = ["b.out"]\ncmd = "echo broken >&2; exit 3"\n\n'
        '[slow]\nrule = "command"\nouts = ["s.out"]\ncmd = "sleep 6; echo done > $(OUT)"\n'
    ),
}


@pytest.fixture
def ws(make_workspace, tmp_path):
    return make_workspace(tmp_path, WORKSPACE)


def test_a_served_build_prints_and_exits_as_an_in_process_one(ws, served):
    env, tag = served
    alone = {**env, "RSI_SERVER": "0"}
    first = _rsi(ws, env, "build", "//:up")  # NB: no server yet: builds here, starts one
    assert first.returncode == 0, first.stderr
    assert _builder_pid(ws) not in _server_pids(tag)
    run = _until_served(ws, env, tag, "//:up")
    here = _rsi(ws, alone, "build", "//:up")
    assert (run.returncode, _same(run.stdout), run.stderr) == (0, _same(here.stdout), "")
    assert "//:up: ok (hit)" in run.stdout and (ws / "out" / "a.out").read_text() == "ALPHA\n"
    # a change is rebuilt by the server, and a failure is the same failure
    (ws / "in" / "a.txt").write_text("bravo\n")
    changed = _rsi(ws, env, "build", "//:up")
    assert changed.returncode == 0 and _builder_pid(ws) in _server_pids(tag)
    assert (ws / "out" / "a.out").read_text() == "BRAVO\n"
    bad = _rsi(ws, env, "build", "//:bad")
    bad_here = _rsi(ws, alone, "build", "//:bad")
    assert bad.returncode == bad_here.returncode == 1
    assert _same(bad.stdout) == _same(bad_here.stdout) and "exited with code 3" in bad.stdout
    # an error before any build (no such target) too, on stderr with its exit code
    missing = _rsi(ws, env, "build", "//:nope")
    missing_here = _rsi(ws, alone, "build", "//:nope")
    assert (missing.returncode, missing.stderr) == (missing_here.returncode, missing_here.stderr)
    assert missing.returncode != 0 and "nope" in missing.stderr


def test_ctrl_c_stops_the_served_build_and_not_the_server(ws, served):
    env, tag = served
    _until_served(ws, env, tag, "//:up")
    (server,) = _server_pids(tag)
    proc = _start(ws, env, "//:slow")
    time.sleep(2.0)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted (SIGINT)" in err.decode()
    assert _builder_pid(ws) == server and not (ws / "out" / "s.out").exists()
    assert _server_pids(tag) == [server]
    again = _rsi(ws, env, "build", "//:up")
    assert again.returncode == 0 and _builder_pid(ws) == server


def test_a_busy_server_or_one_that_dies_means_building_here(ws, served):
    env, tag = served
    _until_served(ws, env, tag, "//:up")
    (server,) = _server_pids(tag)
    slow = _start(ws, env, "//:slow")
    time.sleep(1.5)
    # NB: the server is busy with the slow build: this client builds by itself, at once
    meanwhile = _rsi(ws, env, "build", "//:up")
    assert meanwhile.returncode == 0 and _builder_pid(ws) != server
    os.kill(server, signal.SIGKILL)  # NB: dies mid-build: the client finishes it itself
    out, err = slow.communicate(timeout=120)
    assert slow.returncode == 0, err.decode()
    assert "build server ended during this build" in err.decode()
    assert (ws / "out" / "s.out").read_text() == "done\n"


def test_a_server_never_builds_with_code_that_changed_since_it_loaded_it(ws, served, tmp_path):
    """rsi run from a copy of its code (PYTHONPATH, as bench/peers does): once a file the
    server imported changes, the server answers "restart" and exits, and the build runs in
    the client with the new code."""
    import shutil

    env, tag = served
    root = Path(__file__).resolve().parents[1]
    copy = tmp_path / "code"
    for package in ("rsi", "rules"):
        shutil.copytree(
            root / package, copy / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(copy), env.get("PYTHONPATH")]))}
    run = _until_served(ws, env, tag, "//:up")
    (server,) = _server_pids(tag)
    assert " cached, " in run.stdout
    report = copy / "rsi" / "buildcmd.py"
    report.write_text(report.read_text().replace(" cached, ", " served from the cache, "))
    again = _rsi(ws, env, "build", "//:up")
    assert again.returncode == 0, again.stderr
    assert " served from the cache, " in again.stdout  # NB: the new code, not the loaded
    assert _builder_pid(ws) != server
    deadline = time.monotonic() + 20
    while server in _server_pids(tag):  # NB: it said "restart" and exits
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_another_user_cannot_use_a_server_and_an_idle_one_exits(ws, served):
    env, tag = served
    env = {**env, "RSI_SERVER_IDLE_S": "4"}
    _until_served(ws, env, tag, "//:up")
    (server,) = _server_pids(tag)
    inodes = set()
    for fd in os.listdir(f"/proc/{server}/fd"):
        try:
            inodes.add(os.readlink(f"/proc/{server}/fd/{fd}"))
        except OSError:
            pass
    ours = [
        line.split()[-1]
        for line in Path("/proc/net/unix").read_text().splitlines()
        if "@rsi-server-" in line and f"socket:[{line.split()[6]}]" in inodes
    ]
    assert len(set(ours)) == 1, ours
    builds = len(list((ws / "cache" / "events").glob("*.jsonl")))
    probe = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "s.connect('\\0' + sys.argv[1][1:])\n"
        "head = '\\0'.join(sys.argv[2:]).encode()\n"
        "try:\n"
        "    s.sendall(b'h' + len(head).to_bytes(4, 'big') + head)\n"
        "    print(repr(s.recv(100)))\n"
        "except (BrokenPipeError, ConnectionResetError):\n"
        "    print(repr(b''))  # NB: closed before or while we spoke: no word either\n"
    )
    for name in set(ours):
        got = subprocess.run(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                sys.executable,
                "-c",
                probe,
                name,
                str(ws),
                "//:up",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert got.returncode == 0, got.stderr
        assert got.stdout.strip() == "b''"  # NB: closed without a word
    assert len(list((ws / "cache" / "events").glob("*.jsonl"))) == builds  # nothing built
    deadline = time.monotonic() + 30
    while _server_pids(tag):
        assert time.monotonic() < deadline, "an idle server did not exit"
        time.sleep(0.5)


def test_the_state_the_server_keeps_gives_way_to_what_another_rsi_wrote(ws, served):
    """The server keeps its last build state in memory; a build by another rsi (in process)
    writes a new state file, so the server reads that one, and every change is seen whoever
    built last, including a same-size rewrite."""
    env, tag = served
    alone = {**env, "RSI_SERVER": "0"}
    _until_served(ws, env, tag, "//:up")
    (server,) = _server_pids(tag)
    for i, word in enumerate(["carol", "dave!", "erin.", "frank"]):
        (ws / "in" / "a.txt").write_text(word + "\n")
        who = env if i % 2 else alone
        run = _rsi(ws, who, "build", "//:up")
        assert run.returncode == 0, run.stderr
        assert (_builder_pid(ws) == server) == (who is env)
        assert (ws / "out" / "a.out").read_text() == word.upper() + "\n"
        again = _rsi(ws, env, "build", "//:up")  # NB: served, nothing changed since
        assert again.returncode == 0 and "0 executed" in again.stdout
        assert _builder_pid(ws) == server


def test_a_kept_state_is_used_only_while_its_files_are_unchanged(ws, monkeypatch, tmp_path):
    """In process, as the server runs builds: with `keeping` on, a build after a saved or
    unchanged one reads no state file; a state file another writer replaced is read again."""
    from rsi import analysis_cache, incremental
    from rsi.build import build
    from rsi.workspace import Workspace

    monkeypatch.setenv("RSI_HOST_LOCK", str(tmp_path / "host.lock"))
    monkeypatch.setattr(analysis_cache, "keeping", True)
    monkeypatch.setattr(incremental, "_KEEP", {})
    monkeypatch.chdir(ws)
    reads: list[str] = []
    real = incremental.read_sealed_head

    def counting(store, path):
        reads.append(path.name.split("-")[0])
        return real(store, path)

    monkeypatch.setattr(incremental, "read_sealed_head", counting)
    workspace = Workspace.discover()
    assert build(workspace, ["//:up"]).ok  # NB: analyses and records the state: kept
    reads.clear()
    for _ in range(2):
        report = build(workspace, ["//:up"])
        assert report.ok and report.counts["cached"] == 1
    assert reads == []  # NB: both served from memory
    (ws / "in" / "a.txt").write_text("zulu\n")
    assert build(workspace, ["//:up"]).counts["executed"] == 1
    assert reads == [] and (ws / "out" / "a.out").read_text() == "ZULU\n"
    # another writer rewrote the state file (new times): it is read from disk again
    (state,) = [p for p in (ws / "cache" / "analysis").iterdir() if p.name.startswith("state-")]
    state.write_bytes(state.read_bytes())
    assert build(workspace, ["//:up"]).counts["cached"] == 1
    assert "state" in reads


def test_a_watching_server_sees_a_same_size_rewrite_with_its_mtime_put_back(ws, served):
    """RSI_SERVER_WATCH=1, through the real server: a source rewritten in place with the same
    size and its mtime put back (a stat signature barely differs) is rebuilt."""
    env, tag = served
    env = {**env, "RSI_SERVER_WATCH": "1"}
    _until_served(ws, env, tag, "//:up")
    for _ in range(2):  # NB: the first served build checks everything and starts the watch
        assert _rsi(ws, env, "build", "//:up").returncode == 0
    source = ws / "in" / "a.txt"
    st = source.stat()
    source.write_text("omega\n")
    os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns))
    run = _rsi(ws, env, "build", "//:up")
    assert run.returncode == 0 and "1 executed" in run.stdout, run.stdout
    assert _builder_pid(ws) in _server_pids(tag)
    assert (ws / "out" / "a.out").read_text() == "OMEGA\n"


def test_hit_lines_from_the_kept_template_are_those_a_fresh_build_writes(ws, monkeypatch, tmp_path):
    """A served no-op writes its hit lines from a template rendered once; they must be the
    lines an in-process build writes (ids, keys, labels), with this build's own time; an
    action that ran again drops the template (its key changed)."""
    import json as _json

    from rsi import analysis_cache, incremental
    from rsi.build import build
    from rsi.workspace import Workspace

    monkeypatch.setenv("RSI_HOST_LOCK", str(tmp_path / "host.lock"))
    monkeypatch.setenv("RSI_EVENTS_HITS", "1")  # NB: the opt-in that lists hits
    monkeypatch.chdir(ws)
    workspace = Workspace.discover()

    def hits(report) -> list[dict]:
        lines = Path(report.events_path).read_text().splitlines()
        docs = [_json.loads(line) for line in lines]
        return [d for d in docs if d["kind"] == "action_finished"]

    targets = ["//:up"]
    build(workspace, targets)
    fresh = hits(build(workspace, targets))  # NB: keeping off: rendered the plain way
    monkeypatch.setattr(analysis_cache, "keeping", True)
    monkeypatch.setattr(incremental, "_KEEP", {})
    build(workspace, targets)
    for _ in range(2):
        report = build(workspace, targets)
        started = _json.loads(Path(report.events_path).read_text().splitlines()[0])
        got = hits(report)
        assert [{**d, "time": 0} for d in got] == [{**d, "time": 0} for d in fresh]
        assert all(d["time"] >= started["time"] for d in got)  # NB: this build's time
    (ws / "in" / "a.txt").write_text("kilo\n")
    assert build(workspace, targets).counts["executed"] == 1
    after = hits(build(workspace, targets))
    assert after[0]["key"] != fresh[0]["key"] and after[0]["cache"] == "hit"
