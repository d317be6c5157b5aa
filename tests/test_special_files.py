"""Declarations, configuration and sources that are not regular files: a FIFO (whose open waits
for a writer, for ever), a device (an endless /dev/zero), a folder. Each is refused at once,
saying what it is, never waited on or read without end."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from rsi.analysis import analyze
from rsi.analysis_cache import Tracker
from rsi.digest import FileDigestMemo, FileNode, digest_bytes, digest_file
from rsi.errors import DeclarationError, ExecutionError
from rsi.label import Label
from rsi.loader import Loader
from rsi.registry import load_rules
from rsi.store import LocalStore
from rsi.workspace import Workspace

RULES = load_rules()


def within(seconds: float, fn, *args):
    """fn(*args) on a thread: its result or exception, or a failure if it is still waiting
    after `seconds` (the thread, blocked in an open, is left behind: a daemon)."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - NB: handed to the test
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{getattr(fn, '__name__', fn)} is still waiting after {seconds}s"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def analyse(ws: Path, *labels: str):
    loader = Loader(ws, RULES)
    tracker = Tracker(FileDigestMemo(None))
    loader.tracker = tracker
    return analyze(
        loader,
        [Label.parse(lb) for lb in labels],
        store_put=digest_bytes,
        settings={},
        tracker=tracker,
    )


@pytest.fixture
def ws(tmp_path, command) -> Path:
    root = tmp_path / "ws"
    (root / "sub").mkdir(parents=True)
    (root / "rsi.toml").write_text("[workspace]\n")
    (root / "BUILD.toml").write_text(command("a", cmd="echo a > $(OUT)", outs=["a.out"]))
    return root


@pytest.mark.fast
def test_a_build_file_that_is_a_fifo_is_refused_not_waited_on(ws):
    os.mkfifo(ws / "sub" / "BUILD.toml")
    with pytest.raises(DeclarationError) as info:
        within(10, analyse, ws, "//sub:x")
    assert info.value.file.endswith("sub/BUILD.toml") and "a FIFO" in str(info.value)


@pytest.mark.fast
def test_a_build_file_that_is_a_device_is_refused(ws):
    # NB: made inside the workspace (a link to /dev/zero is refused as leaving it). As
    # /dev/null (1:3), not /dev/zero: should the check ever go, the test fails on an empty
    # read instead of reading memory full
    try:
        os.mknod(ws / "sub" / "BUILD.toml", 0o644 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making a device node needs CAP_MKNOD")
    with pytest.raises(DeclarationError) as info:
        within(10, analyse, ws, "//sub:x")
    assert "a character device" in str(info.value)


@pytest.mark.fast
def test_an_rsi_toml_that_is_a_fifo_is_refused_naming_it(ws):
    (ws / "rsi.toml").unlink()
    os.mkfifo(ws / "rsi.toml")
    with pytest.raises(DeclarationError) as info:
        within(10, Workspace.load, ws)
    assert "rsi.toml" in str(info.value.file) and "a FIFO" in str(info.value)


@pytest.mark.fast
@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_source_that_is_not_a_regular_file_is_refused_saying_what_it_is(ws, command, kind):
    if kind == "fifo":
        os.mkfifo(ws / "in.txt")
    else:
        (ws / "in.txt").mkdir()
    (ws / "BUILD.toml").write_text(
        command("t", cmd="cat $(SRCS) > $(OUT)", srcs=["in.txt"], outs=["t.out"])
    )
    with pytest.raises(DeclarationError) as info:
        within(10, analyse, ws, "//:t")
    words = "a FIFO" if kind == "fifo" else "a folder"
    assert info.value.field == "srcs" and f"it is {words}" in str(info.value)


@pytest.mark.fast
def test_a_source_missing_still_says_it_does_not_exist(ws, command):
    (ws / "BUILD.toml").write_text(command("t", cmd="x", srcs=["gone.txt"], outs=["t.out"]))
    with pytest.raises(DeclarationError, match="'gone.txt' does not exist"):
        analyse(ws, "//:t")


@pytest.mark.fast
@pytest.mark.parametrize("size", [3, 4 << 20])  # NB: the read path, and the mapped one
def test_digest_file_reads_only_regular_files(tmp_path, size):
    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    assert digest_file(tmp_path / "f") == digest_bytes(data)
    os.mkfifo(tmp_path / "p")
    for special in (tmp_path / "p", Path(os.devnull), tmp_path):
        with pytest.raises(OSError, match="not a regular file"):
            within(10, digest_file, special)


@pytest.mark.fast
def test_a_source_swapped_for_a_fifo_after_analysis_fails_its_action(tmp_path):
    """The executor copies a source in by path: a FIFO there now is an error, not a wait."""
    from rsi.executors.base import copy_source

    store = LocalStore(tmp_path / "store")
    node = FileNode(digest_bytes(b"content\n"), False)
    os.mkfifo(tmp_path / "src")
    (tmp_path / "exec").mkdir()
    with pytest.raises(ExecutionError, match="not a regular file"):
        within(10, copy_source, str(tmp_path / "src"), tmp_path / "exec" / "src", node, store)
    assert not (tmp_path / "exec" / "src").exists()


@pytest.mark.e2e
def test_rsi_build_of_a_tree_holding_a_fifo_build_file_exits_2_at_once(ws, run_rsi):
    os.mkfifo(ws / "sub" / "BUILD.toml")
    run = run_rsi(ws, "build", "//...", timeout=60)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run
    assert "sub/BUILD.toml" in run.stderr and "a FIFO" in run.stderr
    assert not (ws / "out" / "a.out").exists()


@pytest.mark.fast
def test_a_blob_or_entry_swapped_for_a_fifo_is_corrupt_not_waited_on(tmp_path):
    """The store reads its files by path: one that a fault (or a hostile user) replaced by a
    FIFO is treated as corrupt (removed; the blob is missing, the entry a miss), never opened
    and waited on."""
    from rsi.action import ActionResult
    from rsi.errors import CorruptEntry

    store = LocalStore(tmp_path / "store")
    small, large = store.put_bytes(b"small\n"), store.put_bytes(os.urandom(300_000))
    for digest in (small, large):
        path = store.blob_path(digest)
        os.unlink(path)
        os.mkfifo(path)
        assert within(10, store.has_verified, digest) is False
        assert not path.exists()
        os.mkfifo(path)
        with pytest.raises(CorruptEntry):
            within(10, store.read_bytes, digest)
        assert not path.exists()
        os.mkfifo(path)
        with pytest.raises(CorruptEntry):
            within(10, store.export_file, digest, tmp_path / "exported")
        assert not path.exists() and not (tmp_path / "exported").exists()
    os.mkfifo(store.blob_path(small))
    assert within(10, store.read_small_verified, small) is None
    assert not store.blob_path(small).exists()
    key = digest_bytes(b"an action")
    store.put_action_result(key, ActionResult(0))
    entry = store._ac_path(key)
    assert entry.exists()
    os.unlink(entry)
    os.mkfifo(entry)
    assert within(10, store.get_action_result, key) is None
    assert not entry.exists()


@pytest.mark.e2e
def test_an_output_blob_swapped_for_a_fifo_is_rebuilt(ws, run_rsi):
    run = run_rsi(ws, "build", "//:a", timeout=60)
    assert run.returncode == 0, run
    data = (ws / "out" / "a.out").read_bytes()
    name = digest_bytes(data).hash  # NB: the blob, found by its content
    blob = ws / "cache" / "cas" / name[:2] / name
    assert blob.exists()
    os.unlink(blob)
    os.mkfifo(blob)
    (ws / "out" / "a.out").unlink()
    run = run_rsi(ws, "build", "//:a", timeout=60)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run
    assert (ws / "out" / "a.out").read_bytes() == data
    assert blob.is_file()


@pytest.mark.e2e
def test_state_files_swapped_for_fifos_are_rebuilt_not_waited_on(ws, run_rsi):
    """Fault injection on the engine's own files: the incremental state, the analysis, the
    memos and the gc-root registration, each replaced by a FIFO in turn. Every next build
    goes on (the file unusable, so rebuilt), exits 0 within its timeout, and exports the
    right output."""
    assert run_rsi(ws, "build", "//:a", timeout=60).returncode == 0
    assert run_rsi(ws, "build", "//:a", timeout=60).returncode == 0
    cache = ws / "cache"
    kinds = {
        "meta memo": lambda: [cache / "meta-memo.json"],
        "out memo": lambda: [cache / "out-memo.json"],
        "analysis and state": lambda: sorted(p for p in (cache / "analysis").iterdir()),
        "gc roots": lambda: sorted(p for p in (cache / "roots").iterdir() if p.is_file()),
    }
    for kind, paths in kinds.items():
        found = [p for p in paths() if p.is_file()]
        if "memo" in kind and not found:
            continue  # NB: a memo is written only once it holds something worth keeping
        assert found, kind
        for p in found:
            p.unlink()
            os.mkfifo(p)
        (ws / "out" / "a.out").unlink()
        run = run_rsi(ws, "build", "//:a", timeout=60)
        assert run.returncode == 0 and "Traceback" not in run.stderr, (kind, run)
        assert (ws / "out" / "a.out").read_text() == "a\n", kind
        run = run_rsi(ws, "why", "//:a", timeout=60)
        assert run.returncode == 0, (kind, run)
    os.mkfifo(cache / "events" / "zz-planted.jsonl")  # NB: the newest log, read first
    run = run_rsi(ws, "why", "//:a", timeout=60)
    assert run.returncode == 0 and "last built in" in run.stdout, run
