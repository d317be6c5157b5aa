"""The build server's watcher (rsi/watch.py, rsi.incremental `_watched_unchanged`): a source
no inotify event named since its last check is not stat'ed again, and every way a source can
change is still seen: a same-size rewrite that puts its mtime back, a swap by rename, a chmod,
a new symlink, its folder replaced, a hard link made before the check, lost events. The same
for the store's output blobs: a blob no event named is not stat'ed, and one rewritten in place,
removed, or with a second link is. Builds run in this process with the state kept and a real
watcher, as the server runs them."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from rsi import analysis_cache, incremental
from rsi.build import build
from rsi.watch import Watcher
from rsi.workspace import Workspace

pytestmark = pytest.mark.e2e


def _rewrite_same_size_same_mtime(path: Path, text: str) -> None:
    st = os.stat(path)
    assert len(text.encode()) == st.st_size
    path.write_text(text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _as_the_server_does(ws: Path, tmp_path: Path, monkeypatch) -> Watcher:
    """Builds in this process from `ws`, the state kept in memory and a real watcher on."""
    monkeypatch.setenv("RSI_HOST_LOCK", str(tmp_path / "host.lock"))
    monkeypatch.setattr(analysis_cache, "keeping", True)
    monkeypatch.setattr(incremental, "_KEEP", {})
    watcher = Watcher()
    monkeypatch.setattr(incremental, "watcher", watcher)
    monkeypatch.chdir(ws)
    return watcher


def _record_calls(monkeypatch, name: str) -> list[str]:
    """The paths every later call of `os.<name>` (`lstat`, `stat`) is given, in order."""
    looked: list[str] = []
    real = getattr(os, name)

    def recorded(path, *a, **kw):
        looked.append(os.fspath(path))
        return real(path, *a, **kw)

    monkeypatch.setattr(incremental.os, name, recorded)
    return looked


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
    watcher = _as_the_server_does(ws, tmp_path, monkeypatch)
    looked = _record_calls(monkeypatch, "lstat")
    workspace = Workspace.discover()

    def run(*labels: str) -> dict:
        looked.clear()
        report = build(workspace, list(labels or ["//:leaf_a", "//:leaf_b"]))
        assert report.ok
        return report.counts

    run()
    run()  # NB: the first check with the watch in place
    yield ws, run, looked, watcher
    watcher.close()


def _sources(looked: list[str]) -> set[str]:
    return {Path(p).name for p in looked if "/in/" in p}


def test_unchanged_sources_are_not_stated_and_a_same_size_rewrite_is_seen(served):
    ws, run, looked, _ = served
    counts = run()
    assert counts["executed"] == 0 and _sources(looked) == set()  # NB: the watcher vouched
    _rewrite_same_size_same_mtime(ws / "in" / "a.txt", "ALPHA\n")
    counts = run()
    assert counts["executed"] == 1 and _sources(looked) == {"a.txt"}  # NB: only the one named
    assert (ws / "out" / "a.out").read_text() == "ALPHA\n"
    assert run()["executed"] == 0


def test_a_swap_by_rename_a_chmod_and_a_symlink_are_seen(served):
    ws, run, looked, _ = served
    (ws / "in" / "b.new").write_text("BRAVO\n")
    os.rename(ws / "in" / "b.new", ws / "in" / "b.txt")
    assert run()["executed"] == 1 and (ws / "out" / "b.out").read_text() == "BRAVO\n"
    os.chmod(ws / "in" / "a.txt", 0o755)  # NB: an executable source is another input
    assert run()["executed"] == 1
    (ws / "elsewhere.txt").write_text("charlie\n")
    (ws / "in" / "a.txt").unlink()
    os.symlink(ws / "elsewhere.txt", ws / "in" / "a.txt")
    run()
    assert (ws / "out" / "a.out").read_text() == "charlie\n"
    # NB: a symlinked source is stat'ed every time (its target may change anywhere)
    run()
    assert "a.txt" in _sources(looked)
    (ws / "elsewhere.txt").write_text("delta!!\n")
    assert run()["executed"] == 1 and (ws / "out" / "a.out").read_text() == "delta!!\n"


def test_a_replaced_folder_and_lost_events_mean_looking_again(served):
    ws, run, looked, watcher = served
    shutil.copytree(ws / "in", ws / "in2")
    (ws / "in2" / "a.txt").write_text("echo!!\n")
    shutil.rmtree(ws / "in")
    os.rename(ws / "in2", ws / "in")  # NB: another folder at the same path
    assert run()["executed"] == 1 and (ws / "out" / "a.out").read_text() == "echo!!\n"
    run()
    assert _sources(looked) == set()
    watcher.overflow_at = watcher.mark() + 1  # NB: as if the kernel dropped events now
    run()
    assert _sources(looked) == {"a.txt", "b.txt"}


def test_a_source_with_another_hard_link_is_always_stated(
    command, make_workspace, tmp_path, monkeypatch
):
    """A source that had two links when last looked at is stat'ed every time: a change
    through the other name sends no event to the source's folder. (A link made after that
    look is not seen: docs/architecture.md says so; RSI_SERVER_WATCH is off by default.)"""
    ws = make_workspace(
        tmp_path,
        {
            "in/b.txt": "bravo\n",
            "BUILD.toml": command(
                "leaf_b", cmd="cat $(SRCS) > $(OUT)", srcs=["in/b.txt"], outs=["b.out"]
            ),
        },
    )
    other = tmp_path / "outside.txt"
    os.link(ws / "in" / "b.txt", other)
    watcher = _as_the_server_does(ws, tmp_path, monkeypatch)
    workspace = Workspace.discover()
    for _ in range(3):
        assert build(workspace, ["//:leaf_b"]).ok
    with open(other, "a") as f:  # NB: changed through the other name: no event in in/
        f.write("x\n")
    report = build(workspace, ["//:leaf_b"])
    assert report.counts["executed"] == 1
    assert (ws / "out" / "b.out").read_text() == "bravo\nx\n"
    watcher.close()


def _blob_of(ws: Path, content: bytes) -> Path:
    """The store's blob holding exactly `content` (the output of one leaf)."""
    found = [
        p
        for p in (ws / "cache" / "cas").glob("*/*")
        if p.is_file() and p.stat().st_size == len(content) and p.read_bytes() == content
    ]
    assert len(found) == 1, found
    return found[0]


@pytest.fixture(params=["python", "c"])
def blobs_looked(served, monkeypatch, request):
    """The store's blobs each build `stat`s in its check (rsi.incremental `_check_entries`):
    one by one, and (`c`) every batch of the blobs to look at in rsi.native's stat loop."""
    from rsi import native

    ws, run, _, watcher = served
    looked = _record_calls(monkeypatch, "stat")
    if request.param == "c":
        assert native.available()
        monkeypatch.setattr(incremental, "NATIVE_LINKED_MIN", 0)
        real = native.stale

        def stale(parts, **kw):
            if kw.get("prefix") is not None:
                looked.extend(f"{kw['prefix']}/{h[:2]}/{h}" for part in parts for h in part)
            return real(parts, **kw)

        monkeypatch.setattr(native, "stale", stale)

    def blobs() -> set[str]:
        cas = str(ws / "cache" / "cas") + "/"
        return {
            p[len(cas) :] for p in looked if p.startswith(cas) and p.count("/") > cas.count("/")
        }

    def build_and_look() -> tuple[dict, set[str]]:
        looked.clear()
        counts = run()
        return counts, blobs()

    return ws, build_and_look, watcher


def test_unchanged_blobs_are_not_stated_and_one_rewritten_in_the_store_is_seen(blobs_looked):
    """A served no-op leaves the store's blobs alone (no event named them since the last
    check); a blob rewritten in place through its own path, with its size and mtime put back,
    is named by an event, fails verification, and its action runs again."""
    ws, build_and_look, _ = blobs_looked
    counts, looked = build_and_look()
    assert counts["executed"] == 0 and looked == set(), looked
    blob = _blob_of(ws, b"alpha\n")
    st = blob.stat()
    os.chmod(blob, 0o644)
    blob.write_bytes(b"ALPHA\n")
    os.chmod(blob, st.st_mode)
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))
    counts, looked = build_and_look()
    assert f"{blob.parent.name}/{blob.name}" in looked
    assert counts["executed"] == 1
    assert (ws / "out" / "a.out").read_text() == "alpha\n"
    assert _blob_of(ws, b"alpha\n").read_bytes() == b"alpha\n"
    # NB: the blob written again is named by its event once, then vouched for again
    counts, looked = build_and_look()
    assert counts["executed"] == 0 and f"{blob.parent.name}/{blob.name}" in looked
    counts, looked = build_and_look()
    assert counts["executed"] == 0 and looked == set(), looked


def test_a_removed_blob_lost_events_and_a_linked_blob_mean_stating(blobs_looked, tmp_path):
    ws, build_and_look, watcher = blobs_looked
    blob = _blob_of(ws, b"bravo\n")
    blob.unlink()  # NB: as a gc of another workspace would
    counts, looked = build_and_look()
    assert counts["executed"] == 1 and _blob_of(ws, b"bravo\n").exists()
    build_and_look()
    watcher.overflow_at = watcher.mark() + 1  # NB: as if the kernel dropped events now
    counts, looked = build_and_look()
    assert counts["executed"] == 0 and len(looked) >= 2  # NB: every blob looked at again
    # NB: a blob with a second link when last stat'ed is stat'ed every time: a write through
    # the other name sends no event to the store's folder. (A link made after that look is
    # not seen until the blob is stat'ed again: docs/architecture.md says so.)
    blob = _blob_of(ws, b"alpha\n")
    other = tmp_path / "other-name"
    os.link(blob, other)
    watcher.overflow_at = watcher.mark() + 1
    build_and_look()
    build_and_look()
    counts, looked = build_and_look()
    assert counts["executed"] == 0 and looked == {f"{blob.parent.name}/{blob.name}"}, looked
    st = blob.stat()
    os.chmod(other, 0o644)
    other.write_bytes(b"ALPHA\n")
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    counts, looked = build_and_look()
    assert counts["executed"] == 1
    assert (ws / "out" / "a.out").read_text() == "alpha\n"


def test_a_linked_blob_at_its_signature_stays_looked_at_until_its_link_goes(blobs_looked, tmp_path):
    """A blob with a second link is stat'ed at every build while the link is there, also
    once its recorded signature is trusted again (at its signature, it is found clean: the
    batch must still note it linked), and a write through the other link is caught; once the
    link is gone, it is looked at no more."""
    ws, build_and_look, watcher = blobs_looked
    blob = _blob_of(ws, b"alpha\n")
    other = tmp_path / "other-name"
    os.link(blob, other)
    watcher.overflow_at = watcher.mark() + 1  # NB: every blob looked at: the link is noted
    build_and_look()
    time.sleep(1.1)  # NB: the link moved the blob's ctime: past the racy window it is trusted
    name = f"{blob.parent.name}/{blob.name}"
    for _ in range(4):
        counts, looked = build_and_look()
        assert counts["executed"] == 0 and looked == {name}, looked
    st = blob.stat()
    os.chmod(other, 0o644)
    other.write_bytes(b"ALPHA\n")
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    counts, looked = build_and_look()
    assert counts["executed"] == 1 and (ws / "out" / "a.out").read_text() == "alpha\n"
    other.unlink()
    for _ in range(3):
        build_and_look()
    counts, looked = build_and_look()
    assert counts["executed"] == 0 and looked == set(), looked
