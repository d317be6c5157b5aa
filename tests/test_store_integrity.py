"""Store integrity (issue 12): a store folder rsi did not create is never written into, gc keeps
what every workspace sharing the store uses, a killed copy leaves nothing readers trip on, an
action-cache entry verifies against its own key, and gc on a full disk explains itself."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rsi.action import ActionResult, OutputFile
from rsi.digest import Digest, digest_bytes, digest_file
from rsi.errors import EXIT_USAGE
from rsi.store import AC_SCHEMA, LocalStore
from rsi.store_folder import StoreRefused, claim_store


def _tree(root: Path) -> dict[str, tuple[bytes, float]]:
    """Every file under `root`: content and mtime (what "nothing was lost" compares)."""
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _no_traceback(run) -> None:
    assert "Traceback" not in run.stderr, str(run)


def _key_of(run, label: str) -> str:
    return next(e["key"] for e in run.finished() if e["label"] == label).split("/")[0]


@pytest.fixture
def two_targets(command):
    return command("a", cmd="echo alpha > $(OUT)", outs=["a.txt"]) + command(
        "b", cmd="echo beta > $(OUT)", outs=["b.txt"]
    )


# ---------------------------------------------------------------- 2: store folder validation


def _user_files(folder: Path) -> None:
    """Files a person keeps in a folder, shaped like what a build's scratch clean-up removes:
    under tmp/, one named like a dead process's scratch, one old and without a pid."""
    (folder / "tmp").mkdir(parents=True, exist_ok=True)
    (folder / "tmp" / "scratch-999999-notes.txt").write_text("my notes\n")
    old = folder / "tmp" / "draft.txt"
    old.write_text("an old draft\n")
    os.utime(old, (time.time() - 3 * 86400,) * 2)
    (folder / "thesis.tex").write_text("\\documentclass{article}\n")


@pytest.mark.e2e
def test_store_set_to_the_workspace_root_is_refused_exit_2_and_nothing_is_lost(
    build, make_workspace, tmp_path, two_targets
):
    ws = make_workspace(tmp_path, {"BUILD.toml": two_targets}, config='[workspace]\nstore = "."\n')
    _user_files(ws)
    before = _tree(ws)
    run = build(ws, "//:a", expect=EXIT_USAGE)
    _no_traceback(run)
    assert "rsi.toml" in run.stderr and "field 'store'" in run.stderr
    assert "workspace root" in run.stderr
    assert _tree(ws) == before  # nothing deleted, nothing written (no STORE.json, no out/)


@pytest.mark.e2e
def test_store_above_the_workspace_is_refused(build, make_workspace, tmp_path, two_targets):
    ws = make_workspace(tmp_path, {"BUILD.toml": two_targets}, config='[workspace]\nstore = ".."\n')
    before = _tree(tmp_path)
    run = build(ws, "//:a", expect=EXIT_USAGE)
    _no_traceback(run)
    assert "field 'store'" in run.stderr and "above the workspace" in run.stderr
    assert {k: v for k, v in _tree(tmp_path).items() if not k.startswith("events-")} == before


@pytest.mark.e2e
def test_store_folder_holding_other_files_is_refused_by_every_command_and_nothing_is_lost(
    build, make_workspace, run_rsi, tmp_path, two_targets
):
    ws = make_workspace(
        tmp_path, {"BUILD.toml": two_targets}, config='[workspace]\nstore = "papers"\n'
    )
    _user_files(ws / "papers")
    before = _tree(ws)
    run = build(ws, "//:a", expect=EXIT_USAGE)
    _no_traceback(run)
    assert "rsi.toml" in run.stderr and "field 'store'" in run.stderr
    assert "not an rsi store" in run.stderr and "thesis.tex" in run.stderr
    for args in (["cache", "gc"], ["cache", "verify"], ["cache", "stats"], ["cache", "ls"]):
        refused = run_rsi(ws, *args)
        assert refused.returncode == EXIT_USAGE, str(refused)
        _no_traceback(refused)
        assert "field 'store'" in refused.stderr
    assert _tree(ws) == before


@pytest.mark.e2e
def test_store_option_naming_a_folder_with_files_is_refused_naming_the_option(
    build, make_workspace, tmp_path, two_targets
):
    ws = make_workspace(tmp_path, {"BUILD.toml": two_targets})
    other = tmp_path / "photos"
    _user_files(other)
    before = _tree(other)
    run = build(ws, "//:a", store=other, expect=EXIT_USAGE)
    _no_traceback(run)
    assert "--store" in run.stderr and "not an rsi store" in run.stderr
    assert _tree(other) == before


@pytest.mark.e2e
def test_store_of_another_rsi_version_is_refused(build, make_workspace, tmp_path, two_targets):
    ws = make_workspace(tmp_path, {"BUILD.toml": two_targets})
    (ws / "cache").mkdir()
    (ws / "cache" / "STORE.json").write_text('{"schema": "rsi.store/9"}')
    run = build(ws, "//:a", expect=EXIT_USAGE)
    assert "rsi.store/9" in run.stderr and "field 'store'" in run.stderr


@pytest.mark.e2e
def test_empty_folder_a_placeholder_folder_and_an_existing_store_are_all_used(
    build, make_workspace, tmp_path, two_targets
):
    ws = make_workspace(
        tmp_path,
        {"BUILD.toml": two_targets, "cache/.gitkeep": ""},
        config='[workspace]\nstore = "cache"\n',
    )
    first = build(ws, "//:a")
    assert first.executed == {"//:a"}
    assert (ws / "cache" / "STORE.json").is_file() and (ws / "cache" / ".gitkeep").is_file()
    assert build(ws, "//:a").cached == {"//:a"}  # the store it created is reused
    empty = tmp_path / "empty"
    empty.mkdir()
    assert build(ws, "//:b", store=empty).executed == {"//:b"}


@pytest.mark.fast
def test_local_store_itself_refuses_a_folder_with_files_exit_2(tmp_path):
    """Every way in (a worker, a script) gets the same refusal, not only the CLI."""
    _user_files(tmp_path / "x")
    before = _tree(tmp_path / "x")
    with pytest.raises(StoreRefused, match="not an rsi store") as err:
        LocalStore(tmp_path / "x")
    assert err.value.exit_code == EXIT_USAGE
    assert _tree(tmp_path / "x") == before


@pytest.mark.fast
def test_a_folder_claimed_by_another_writer_is_a_store_the_first_local_store_adopts(tmp_path):
    """Toolchain builds write `<store>/toolchains/` without a LocalStore: they claim the
    folder first, so the store they leave is recognised (and a folder with files refused)."""
    _user_files(tmp_path / "x")
    with pytest.raises(StoreRefused):
        claim_store(tmp_path / "x")
    store_dir = tmp_path / "s"
    claim_store(store_dir)
    (store_dir / "toolchains").mkdir()
    store = LocalStore(store_dir, "sha256")
    assert json.loads((store_dir / "STORE.json").read_text())["digest_function"] == "sha256"
    assert store.has(store.put_bytes(b"kept"))


@pytest.mark.fast
def test_a_campaign_log_written_before_any_build_leaves_a_store_rsi_accepts(tmp_path):
    """`rsi campaign stop` may be the first command in a workspace: its log must not leave a
    store folder that every later command refuses; nor may it write into a user's folder."""
    from rules.campaign import CampaignLog

    with CampaignLog(tmp_path / "cache", "//t:campaign").locked():
        pass
    assert LocalStore(tmp_path / "cache").has(LocalStore(tmp_path / "cache").put_bytes(b"x"))
    _user_files(tmp_path / "mine")
    before = _tree(tmp_path / "mine")
    with pytest.raises(StoreRefused):
        with CampaignLog(tmp_path / "mine", "//t:campaign").locked():
            pass
    assert _tree(tmp_path / "mine") == before


# --------------------------------------------------------------- 3: gc roots per workspace


def _shared(make_workspace, tmp_path, name: str, build_toml: str, files=None) -> Path:
    store = tmp_path / "shared-store"
    return make_workspace(
        tmp_path,
        {"BUILD.toml": build_toml, **(files or {})},
        config=f'[workspace]\nstore = "{store}"\n',
        name=name,
    )


@pytest.mark.e2e
def test_gc_in_one_workspace_keeps_what_another_workspace_sharing_the_store_uses(
    build, command, make_workspace, run_rsi, tmp_path
):
    one = _shared(
        make_workspace, tmp_path, "one", command("x", cmd="echo x > $(OUT)", outs=["x.txt"])
    )
    two = _shared(
        make_workspace,
        tmp_path,
        "two",
        command("y", cmd="echo y > $(OUT)", outs=["y.txt"])
        + command("z", cmd="cat $(location :y) > $(OUT)", deps=[":y"], outs=["z.txt"]),
    )
    build(one, "//...")
    built = build(two, "//...")
    stats = run_rsi(one, "cache", "stats", "--json").json()
    assert stats["workspaces"] == sorted([str(one), str(two)])
    gc = run_rsi(one, "cache", "gc", "--json")
    assert gc.returncode == 0, str(gc)
    doc = gc.json()
    assert doc["removed_actions"] == []
    assert doc["workspaces"] == [str(two)]
    for label in ("//:y", "//:z"):
        key = _key_of(built, label)
        assert (tmp_path / "shared-store" / "ac" / key[:2] / key).is_file()
    again = build(two, "//...")
    assert again.executed == set() and again.cached == {"//:y", "//:z"}


@pytest.mark.e2e
def test_gc_keeps_another_clone_s_results_for_the_same_labels(
    build, command, make_workspace, run_rsi, tmp_path
):
    """Two clones of one project: same labels, different sources, so different keys; the
    store's target index holds only the last one built, the registrations hold both."""
    rule = command("up", cmd="tr a-z A-Z < $(SRCS) > $(OUT)", srcs=["in.txt"], outs=["up.txt"])
    one = _shared(make_workspace, tmp_path, "one", rule, {"in.txt": "first\n"})
    two = _shared(make_workspace, tmp_path, "two", rule, {"in.txt": "second\n"})
    build(one, "//:up")
    build(two, "//:up")
    assert run_rsi(two, "cache", "gc").returncode == 0
    assert run_rsi(one, "cache", "gc").returncode == 0
    for ws, text in ((one, "FIRST\n"), (two, "SECOND\n")):
        again = build(ws, "//:up")
        assert again.cached == {"//:up"}, str(again)
        assert (ws / "out" / "up.txt").read_text() == text


@pytest.mark.e2e
def test_gc_drops_the_roots_of_a_workspace_whose_folder_is_gone_and_says_so(
    build, command, make_workspace, run_rsi, tmp_path
):
    one = _shared(
        make_workspace, tmp_path, "one", command("x", cmd="echo x > $(OUT)", outs=["x.txt"])
    )
    two = _shared(
        make_workspace, tmp_path, "two", command("y", cmd="echo y > $(OUT)", outs=["y.txt"])
    )
    build(one, "//...")
    gone_key = _key_of(build(two, "//..."), "//:y")
    shutil.rmtree(two)
    store = tmp_path / "shared-store"
    dry = run_rsi(one, "cache", "gc", "--dry-run")
    assert dry.returncode == 0, str(dry)
    assert f"would drop the gc roots of workspace {two}: its folder is gone" in dry.stdout
    assert len(list((store / "roots").glob("*.json"))) == 2  # --dry-run drops nothing
    done = run_rsi(one, "cache", "gc")
    assert done.returncode == 0, str(done)
    assert f"dropped the gc roots of workspace {two}: its folder is gone" in done.stdout
    assert "removed 1 action results" in done.stdout
    assert not (store / "ac" / gone_key[:2] / gone_key).exists()
    assert len(list((store / "roots").glob("*.json"))) == 1
    assert build(one, "//...").cached == {"//:x"}


# ------------------------------------------------- 4: kill -9 during a large copy into the CAS

# NB: the real CLI, with one fault injected: a large file's copy into the store stops halfway
# and waits to be killed
_SLOW_COPY_CLI = textwrap.dedent(
    """
    import os, runpy, shutil, sys, time
    real_copyfile = shutil.copyfile
    def stalled_copyfile(src, dst, *args, **kw):
        if os.path.basename(dst).startswith(".tmp-") and os.path.getsize(src) > (1 << 20):
            with open(src, "rb") as f, open(dst, "wb") as g:
                g.write(f.read(1 << 19))
            with open(os.environ["RSI_TEST_MARKER"], "w") as m:
                m.write(dst)
            time.sleep(120)
        return real_copyfile(src, dst, *args, **kw)
    shutil.copyfile = stalled_copyfile
    sys.argv = ["rsi", *sys.argv[1:]]
    runpy.run_module("rsi.cli", run_name="__main__")
    """
)


def kill_9_during_large_copy(ws: Path, target: str, marker: Path) -> str:
    """Start `rsi build TARGET` in `ws`, kill -9 it while a large file is being copied into
    the store; returns the path of the temporary it was writing."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_COPY_CLI, "build", target],
        cwd=ws,
        env={**os.environ, "RSI_TEST_MARKER": str(marker)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the copy never started"
            time.sleep(0.02)
        time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        proc.stderr.close()
    return marker.read_text()


@pytest.fixture
def big_output_ws(command, make_workspace, tmp_path):
    return make_workspace(
        tmp_path,
        {
            "BUILD.toml": command("big", cmd="head -c 1500000 /dev/zero > $(OUT)", outs=["big.bin"])
            + command("small", cmd="echo small > $(OUT)", outs=["small.txt"]),
        },
    )


@pytest.mark.e2e
def test_kill_9_during_a_large_copy_leaves_nothing_readers_trip_on_and_gc_removes_it(
    big_output_ws, build, run_rsi, tmp_path, bwrap
):
    ws = big_output_ws
    build(ws, "//:small")
    temporary = Path(kill_9_during_large_copy(ws, "//:big", tmp_path / "copying"))
    assert temporary.exists()  # the killed copy's temporary is there ...
    for args in (["cache", "stats", "--json"], ["cache", "ls", "--json"]):
        run = run_rsi(ws, *args)
        assert run.returncode == 0, str(run)  # ... and no reader sees it
        _no_traceback(run)
    assert run_rsi(ws, "cache", "stats", "--json").json()["blobs"] == len(
        list((ws / "cache" / "cas").rglob("*/*"))
    )
    gc = run_rsi(ws, "cache", "gc", "--json")
    assert gc.returncode == 0, str(gc)
    assert gc.json()["removed_temporaries"] == [str(temporary)]
    assert not temporary.exists()
    verify = run_rsi(ws, "cache", "verify", "--json")
    assert verify.returncode == 0 and verify.json()["clean"] is True, str(verify)
    assert build(ws, "//:small").cached == {"//:small"}
    rebuilt = build(ws, "//:big")
    assert rebuilt.executed == {"//:big"}
    assert (ws / "out" / "big.bin").read_bytes() == b"\0" * 1500000


@pytest.mark.e2e
def test_kill_9_during_a_large_copy_is_cleaned_by_the_next_build(
    big_output_ws, build, run_rsi, tmp_path, bwrap
):
    ws = big_output_ws
    temporary = Path(kill_9_during_large_copy(ws, "//:big", tmp_path / "copying"))
    assert temporary.exists()
    build(ws, "//:small")
    assert not temporary.exists()
    assert run_rsi(ws, "cache", "verify").returncode == 0


@pytest.mark.e2e
def test_temporaries_an_older_rsi_left_in_cas_and_ac_are_invisible_and_gc_removes_them(
    build, make_workspace, run_rsi, tmp_path, two_targets
):
    ws = make_workspace(tmp_path, {"BUILD.toml": two_targets})
    build(ws, "//...")
    store = ws / "cache"
    shard = next(p for p in (store / "cas").iterdir() if p.is_dir())
    leftovers = [
        store / "cas" / ".tmp-k2j4h5g6",  # what put_file's mkstemp left at the top of cas/
        shard / ".tmp-999999-1-0",  # an atomic write beside its entry, by a dead pid
        next(p for p in (store / "ac").iterdir() if p.is_dir()) / ".tmp-x8y7z6w5",
    ]
    for path in leftovers:
        path.write_bytes(b"half a blob")
        os.utime(path, (time.time() - 7200,) * 2)
    young = store / "cas" / ".tmp-a1b2c3d4"  # no pid and recent: may be a live writer's
    young.write_bytes(b"being written")
    for args in (["cache", "stats"], ["cache", "ls"]):
        run = run_rsi(ws, *args)
        assert run.returncode == 0, str(run)
    gc = run_rsi(ws, "cache", "gc", "--json")
    assert gc.returncode == 0, str(gc)
    assert sorted(gc.json()["removed_temporaries"]) == sorted(map(str, leftovers))
    assert young.exists() and not any(p.exists() for p in leftovers)
    assert run_rsi(ws, "cache", "verify").returncode == 0
    assert build(ws, "//...").cached == {"//:a", "//:b"}


@pytest.mark.fast
def test_a_killed_writer_never_leaves_a_temporary_where_readers_list(tmp_path, monkeypatch):
    """put_file's copy and every atomic write land under tmp/, never in cas/ or ac/."""
    store = LocalStore(tmp_path / "s")
    renamed: set[str] = set()
    real_replace = os.replace

    def spy(src, dst):
        renamed.add(os.fspath(src))
        return real_replace(src, dst)

    big = tmp_path / "big"
    big.write_bytes(b"y" * ((1 << 20) + 1))
    monkeypatch.setattr(os, "replace", spy)
    store.put_file(big)
    store.put_bytes(b"small")
    store.put_action_result(digest_bytes(b"k"), ActionResult(exit_code=0))
    assert len(renamed) == 3
    assert all(Path(p).parent == store.tmp for p in renamed), renamed


# ---------------------------------------------------------- 5: ac integrity covers its key


def _result(store: LocalStore, data: bytes) -> ActionResult:
    return ActionResult(exit_code=0, outputs=(OutputFile("out", store.put_bytes(data)),))


@pytest.mark.fast
def test_swapped_action_cache_entries_are_neither_served(tmp_path):
    store = LocalStore(tmp_path / "s")
    k1, k2 = digest_bytes(b"one"), digest_bytes(b"two")
    store.put_action_result(k1, _result(store, b"first"))
    store.put_action_result(k2, _result(store, b"second"))
    p1, p2 = store._ac_path(k1), store._ac_path(k2)
    a, b = p1.read_bytes(), p2.read_bytes()
    p1.write_bytes(b)
    p2.write_bytes(a)
    assert store.get_action_result(k1) is None and store.get_action_result(k2) is None
    assert {str(k1), str(k2)} <= set(store.corrupt_seen)


@pytest.mark.e2e
def test_swapped_action_cache_entries_are_reported_by_verify_and_rebuilt_correctly(
    build, make_workspace, run_rsi, tmp_path, two_targets
):
    ws = make_workspace(tmp_path, {"BUILD.toml": two_targets})
    first = build(ws, "//...")
    ka, kb = _key_of(first, "//:a"), _key_of(first, "//:b")
    pa = ws / "cache" / "ac" / ka[:2] / ka
    pb = ws / "cache" / "ac" / kb[:2] / kb
    a, b = pa.read_bytes(), pb.read_bytes()
    pa.write_bytes(b)
    pb.write_bytes(a)
    shutil.rmtree(ws / "out")
    verify = run_rsi(ws, "cache", "verify", "--json")
    assert verify.returncode == 1, str(verify)
    assert sorted(verify.json()["corrupt_actions"]) == sorted([ka, kb])
    pa.write_bytes(b)  # swapped again, for the build to meet
    pb.write_bytes(a)
    again = build(ws, "//...")
    assert again.executed == {"//:a", "//:b"}
    assert (ws / "out" / "a.txt").read_text() == "alpha\n"
    assert (ws / "out" / "b.txt").read_text() == "beta\n"


@pytest.mark.e2e
def test_action_cache_entry_in_the_older_format_is_a_miss_never_served(
    build, make_workspace, run_rsi, tmp_path, two_targets
):
    """Entries written before the key was hashed cannot show which key they belong to: a miss
    (rebuilt), and verify removes them as outdated, not corrupt."""
    from rsi.canonical import canonical_bytes

    ws = make_workspace(tmp_path, {"BUILD.toml": two_targets})
    first = build(ws, "//...")
    ka, kb = _key_of(first, "//:a"), _key_of(first, "//:b")
    store = LocalStore(ws / "cache")
    for key in (ka, kb):
        path = store._ac_path(Digest(key, 0))
        doc = json.loads(path.read_bytes())
        assert doc["schema"] == AC_SCHEMA and doc["key"] == key
        body = canonical_bytes(doc["result"])
        old = {"integrity": digest_bytes(body).hash, "result": doc["result"]}
        path.write_text(json.dumps(old, sort_keys=True))
    verify = run_rsi(ws, "cache", "verify", "--json")
    assert verify.returncode == 0, str(verify)
    assert sorted(verify.json()["outdated_actions"]) == sorted([ka, kb])
    again = build(ws, "//...")
    assert again.executed == {"//:a", "//:b"}


# ------------------------------------------------------------------ 9: gc on a full disk

_NO_SPACE_CLI = textwrap.dedent(
    """
    import errno, os, runpy, sys
    def no_space(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    os.fsync = no_space
    sys.argv = ["rsi", *sys.argv[1:]]
    runpy.run_module("rsi.cli", run_name="__main__")
    """
)


@pytest.mark.e2e
def test_gc_that_cannot_write_for_a_full_disk_is_a_clear_error_and_deletes_nothing_half(
    build, make_workspace, run_rsi, tmp_path, two_targets
):
    ws = make_workspace(tmp_path, {"BUILD.toml": two_targets})
    first = build(ws, "//...")
    (ws / "BUILD.toml").write_text(two_targets[: two_targets.index("[b]")])  # //:b is gone
    proc = subprocess.run(
        [sys.executable, "-c", _NO_SPACE_CLI, "cache", "gc"],
        cwd=ws,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "No space left on device" in proc.stderr
    assert "Nothing half-deleted" in proc.stderr and "rsi cache gc" in proc.stderr
    ka, kb = _key_of(first, "//:a"), _key_of(first, "//:b")
    assert (ws / "cache" / "ac" / ka[:2] / ka).is_file()
    assert not (ws / "cache" / "ac" / kb[:2] / kb).exists()
    verify = run_rsi(ws, "cache", "verify")
    assert verify.returncode == 0, str(verify)  # every kept result still has its blobs
    assert build(ws, "//:a").cached == {"//:a"}
    finish = run_rsi(ws, "cache", "gc", "--json")  # with space again, gc finishes
    assert finish.returncode == 0 and finish.json()["removed_actions"] == []


@pytest.fixture
def small_tmpfs(mount_tmpfs):
    """A 2 MiB tmpfs, unmounted afterwards."""
    return mount_tmpfs(2)


def fill(folder: Path) -> Path:
    """Fill the file system holding `folder` to the last byte."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f:
        for size in (1 << 16, 4096, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                pass
    return filler


@pytest.mark.e2e
def test_gc_on_a_really_full_disk_runs_without_a_traceback_and_keeps_the_store_whole(
    build, make_workspace, run_rsi, small_tmpfs, tmp_path, two_targets
):
    store = small_tmpfs / "store"
    ws = make_workspace(
        tmp_path, {"BUILD.toml": two_targets}, config=f'[workspace]\nstore = "{store}"\n'
    )
    build(ws, "//...")
    fill(small_tmpfs)
    nothing = run_rsi(ws, "cache", "gc")  # nothing to remove: must not need a byte
    assert nothing.returncode == 0, str(nothing)
    _no_traceback(nothing)
    (ws / "BUILD.toml").write_text(two_targets[: two_targets.index("[b]")])
    some = run_rsi(ws, "cache", "gc", "--json")
    _no_traceback(some)
    assert some.returncode in (0, 1), str(some)
    if some.returncode == 1:
        assert "No space left on device" in some.stderr
    for blob in (store / "cas").rglob("*"):
        if blob.is_file() and not blob.name.startswith("."):
            assert digest_file(blob).hash == blob.name
    assert run_rsi(ws, "cache", "verify").returncode == 0
    (small_tmpfs / "filler").unlink()
    assert build(ws, "//:a").cached == {"//:a"}
