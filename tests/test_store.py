"""The local store: sharded blobs, atomic writes, verification on read, corrupt entries rebuilt."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from rsi.action import ActionResult, OutputFile
from rsi.digest import digest_bytes
from rsi.errors import CorruptEntry, StoreError
from rsi.store import LocalStore


@pytest.fixture
def store(tmp_path) -> LocalStore:
    return LocalStore(tmp_path / "store")


def _files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _tamper(path: Path, data: bytes | None = None, *, truncate: bool = False) -> None:
    os.chmod(path, 0o644)
    if truncate:
        with open(path, "r+b") as f:
            f.truncate(max(0, os.path.getsize(path) - 1))
    else:
        path.write_bytes(data)


# ------------------------------------------------------------------------------------ blobs


@pytest.mark.fast
def test_blobs_are_sharded_by_the_first_two_hex_digits(store):
    digest = store.put_bytes(b"hello")
    path = store.blob_path(digest)
    assert path == store.root / "cas" / digest.hash[:2] / digest.hash
    assert path.read_bytes() == b"hello"


@pytest.mark.fast
def test_put_is_idempotent_and_content_addressed(store):
    assert store.put_bytes(b"x") == store.put_bytes(b"x") == digest_bytes(b"x")
    assert len(list(store.iter_blobs())) == 1


@pytest.mark.fast
def test_put_file_stores_the_content_and_leaves_no_temp_files(store, tmp_path):
    src = tmp_path / "src"
    src.write_bytes(b"payload" * 1000)
    digest = store.put_file(src)
    assert digest == digest_bytes(b"payload" * 1000)
    assert store.read_bytes(digest) == b"payload" * 1000
    assert src.exists()
    assert not [p for p in store.root.rglob(".tmp-*")]


@pytest.mark.fast
def test_file_blobs_are_read_only(store):
    file_digest = store.put_file(_write(store.root.parent / "f", b"frozen2"))
    assert os.stat(store.blob_path(file_digest)).st_mode & 0o222 == 0


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.fast
def test_failed_write_leaves_no_entry_and_no_temp_file(store, monkeypatch):
    def no_space(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(StoreError, match="No space left on device"):
        store.put_bytes(b"never stored")
    assert not store.has(digest_bytes(b"never stored"))
    assert not [p for p in store.root.rglob(".tmp-*")]


@pytest.mark.fast
def test_failed_file_write_leaves_no_entry_and_no_temp_file(store, tmp_path, monkeypatch):
    src = _write(tmp_path / "src", b"never stored either")

    def no_space(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(StoreError, match="No space left on device"):
        store.put_file(src)
    assert not store.has(digest_bytes(b"never stored either"))
    assert not [p for p in store.root.rglob(".tmp-*")]
    assert src.read_bytes() == b"never stored either"


@pytest.mark.fast
def test_copy_cut_short_by_a_full_disk_leaves_no_temp_file(store, tmp_path, monkeypatch):
    src = _write(tmp_path / "src", b"a big file" * 200_000)  # NB: over 1 MiB: copied, not read

    def partial_copy(source, dest, **kw):
        Path(dest).write_bytes(b"a bi")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shutil, "copyfile", partial_copy)
    with pytest.raises(StoreError, match="No space left on device"):
        store.put_file(src)
    assert not [p for p in store.root.rglob(".tmp-*")]
    assert list(store.iter_blobs()) == []


@pytest.mark.fast
def test_truncated_blob_is_detected_on_read_and_removed(store):
    digest = store.put_bytes(b"some content")
    _tamper(store.blob_path(digest), truncate=True)
    with pytest.raises(CorruptEntry):
        store.read_bytes(digest)
    assert not store.blob_path(digest).exists()


@pytest.mark.fast
def test_altered_blob_of_the_same_size_is_never_served(store, tmp_path):
    digest = store.put_file(_write(tmp_path / "src", b"original"))
    assert store.has_verified(digest)
    _tamper(store.blob_path(digest), b"ORIGINAL")
    with pytest.raises(CorruptEntry):
        store.export_file(digest, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()
    assert not store.blob_path(digest).exists()


@pytest.mark.fast
def test_missing_blob_is_a_corrupt_entry_error(store):
    with pytest.raises(CorruptEntry, match="missing"):
        store.read_bytes(digest_bytes(b"never put"))


@pytest.mark.fast
def test_store_refuses_a_different_digest_function(tmp_path):
    LocalStore(tmp_path / "s", "blake3")
    with pytest.raises(StoreError, match="sha256"):
        LocalStore(tmp_path / "s", "sha256")


# ---------------------------------------------------------------------------- action cache


def _result(store: LocalStore, data: bytes = b"out") -> ActionResult:
    return ActionResult(
        exit_code=0,
        outputs=(OutputFile("out", store.put_bytes(data)),),
        stdout=store.put_bytes(b""),
        stderr=store.put_bytes(b""),
    )


@pytest.mark.fast
def test_action_result_round_trips(store):
    key = digest_bytes(b"key")
    result = _result(store)
    store.put_action_result(key, result)
    assert store._ac_path(key) == store.root / "ac" / key.hash[:2] / key.hash
    got = store.get_action_result(key)
    assert got is not None and got.to_json() == result.to_json()


@pytest.mark.fast
def test_unknown_action_key_is_a_miss(store):
    assert store.get_action_result(digest_bytes(b"nothing")) is None


@pytest.mark.fast
def test_altered_action_result_is_detected_removed_and_a_miss(store):
    key = digest_bytes(b"key")
    store.put_action_result(key, _result(store))
    path = store._ac_path(key)
    doc = json.loads(path.read_bytes())
    doc["result"]["outputs"][0][1] = str(store.put_bytes(b"forged"))  # present, so servable
    path.write_text(json.dumps(doc))
    assert store.get_action_result(key) is None
    assert not path.exists()
    assert str(key) in store.corrupt_seen


@pytest.mark.fast
def test_truncated_action_result_is_a_miss(store):
    key = digest_bytes(b"key")
    store.put_action_result(key, _result(store))
    _tamper(store._ac_path(key), truncate=True)
    assert store.get_action_result(key) is None


@pytest.mark.fast
def test_action_result_whose_output_blob_is_corrupt_is_a_miss(store):
    key = digest_bytes(b"key")
    result = _result(store, b"output bytes")
    store.put_action_result(key, result)
    _tamper(store.blob_path(result.outputs[0].digest), b"OUTPUT BYTES")
    assert store.get_action_result(key) is None
    assert not store.blob_path(result.outputs[0].digest).exists()


# --------------------------------------------------------------------------- through builds


@pytest.fixture
def chain_ws(command, make_workspace, tmp_path):
    """gen (upper-cases in.txt) -> use (gen twice)."""
    return make_workspace(
        tmp_path,
        {
            "in.txt": "input\n",
            "BUILD.toml": command(
                "gen", cmd="tr a-z A-Z < $(SRCS) > $(OUT)", srcs=["in.txt"], outs=["gen.txt"]
            )
            + command(
                "use",
                cmd="cat $(location :gen) $(location :gen) > $(OUT)",
                deps=[":gen"],
                outs=["use.txt"],
            ),
        },
    )


def _output_blob(store_root: Path, content: bytes) -> Path:
    digest = digest_bytes(content)
    return store_root / "cas" / digest.hash[:2] / digest.hash


@pytest.mark.e2e
@pytest.mark.parametrize("how", ["truncate", "alter"])
def test_corrupt_output_blob_is_never_served_and_is_rebuilt(
    build,
    chain_ws,
    run_rsi,
    bwrap,
    how,
):
    ws = chain_ws
    build(ws, "//:use")
    blob = _output_blob(ws / "cache", b"INPUT\n")
    assert blob.exists()
    _tamper(blob, truncate=True) if how == "truncate" else _tamper(blob, b"EVIL!\n")
    (ws / "out").joinpath("use.txt").unlink()
    again = build(ws, "//:use")
    assert "//:gen" in again.executed
    assert again.why("//:gen") == ["its cached result is missing or failed verification"]
    assert (ws / "out" / "use.txt").read_text() == "INPUT\nINPUT\n"
    assert blob.read_bytes() == b"INPUT\n"
    assert run_rsi(ws, "cache", "verify").returncode == 0


@pytest.mark.e2e
def test_altered_action_result_is_rebuilt(build, chain_ws, bwrap):
    ws = chain_ws
    first = build(ws, "//:use")
    key = next(e["key"] for e in first.finished() if e["label"] == "//:use").split("/")[0]
    path = ws / "cache" / "ac" / key[:2] / key
    doc = json.loads(path.read_text())
    # a forged result that would be servable: it names a blob that is really in the store
    doc["result"]["outputs"][0][1] = str(digest_bytes(b"INPUT\n"))
    os.chmod(path, 0o644)
    path.write_text(json.dumps(doc))
    again = build(ws, "//:use")
    assert again.executed == {"//:use"}
    assert again.cached == {"//:gen"}
    assert (ws / "out" / "use.txt").read_text() == "INPUT\nINPUT\n"


@pytest.mark.e2e
def test_cache_verify_reports_corruption_then_clean(build, chain_ws, run_rsi, bwrap):
    ws = chain_ws
    first = build(ws, "//:use")
    _tamper(_output_blob(ws / "cache", b"INPUT\n"), truncate=True)
    key = next(e["key"] for e in first.finished() if e["label"] == "//:use").split("/")[0]
    _tamper(ws / "cache" / "ac" / key[:2] / key, b'{"result": {}, "integrity": "0"}')
    verify = run_rsi(ws, "cache", "verify", "--json")
    assert verify.returncode == 1, verify
    doc = verify.json()
    assert doc["clean"] is False
    assert digest_bytes(b"INPUT\n").hash in doc["corrupt_blobs"]
    assert key in doc["corrupt_actions"]
    again = run_rsi(ws, "cache", "verify", "--json")
    assert again.returncode == 0, again
    assert again.json()["clean"] is True
    rebuilt = build(ws, "//:use")
    assert rebuilt.executed == {"//:gen", "//:use"}


@pytest.mark.e2e
def test_concurrent_builds_on_one_store_corrupt_nothing(
    build,
    command,
    make_workspace,
    rsi_argv,
    run_rsi,
    tmp_path,
    bwrap,
):
    files = {
        "BUILD.toml": "".join(
            command(f"t{i}", cmd=f"sleep 0.1; seq {i} 400 > $(OUT)", outs=[f"t{i}.txt"])
            for i in range(6)
        )
        + command(
            "all",
            cmd="cat $(SRCS) " + " ".join(f"$(location :t{i})" for i in range(6)) + " > $(OUT)",
            deps=[f":t{i}" for i in range(6)],
            outs=["all.txt"],
        )
    }
    ws = make_workspace(tmp_path, files)
    procs = [
        subprocess.Popen(
            [*rsi_argv, "build", "--jobs", "2", "//:all"],
            cwd=ws,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    verify = run_rsi(ws, "cache", "verify")
    assert verify.returncode == 0, verify
    again = build(ws, "//:all")
    assert again.executed == set()
    expected = "".join("".join(f"{n}\n" for n in range(i, 401)) for i in range(6))
    assert (ws / "out" / "all.txt").read_text() == expected


# ------------------------------------------------------------ workspace registration journal


@pytest.mark.fast
def test_registration_updates_go_to_a_journal_read_with_the_registration(store, tmp_path):
    ws = tmp_path / "ws"
    store.gc_roots.register(ws, {"a": {"key": "1" * 64 + "/1", "label": "//:a"}})
    path = store.gc_roots.path_for(ws)
    before = path.stat()
    store.gc_roots.update(ws, {"b": {"key": "2" * 64 + "/1", "label": "//:b"}})
    store.gc_roots.update(ws, {"a": {"key": "3" * 64 + "/1", "label": "//:a"}})
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    ((_, doc),) = store.gc_roots.all()
    assert doc["actions"] == {
        "a": {"key": "3" * 64 + "/1", "label": "//:a"},
        "b": {"key": "2" * 64 + "/1", "label": "//:b"},
    }
    # NB: a full registration folds the journal in; the journal is gone (or stale)
    store.gc_roots.register(ws, {"c": {"key": "4" * 64 + "/1", "label": "//:c"}})
    assert not path.with_suffix(".journal").exists()
    ((_, doc),) = store.gc_roots.all()
    assert set(doc["actions"]) == {"a", "b", "c"}
    assert doc["actions"]["a"]["key"].startswith("3")


@pytest.mark.fast
def test_a_journal_naming_an_older_registration_is_ignored(store, tmp_path):
    """A crash after the registration was rewritten (the journal folded in) but before the
    journal was removed: the journal names the file it extended, so it is not applied again
    over newer keys."""
    ws = tmp_path / "ws"
    store.gc_roots.register(ws, {"a": {"key": "1" * 64 + "/1", "label": "//:a"}})
    store.gc_roots.update(ws, {"a": {"key": "2" * 64 + "/1", "label": "//:a"}})
    journal = store.gc_roots.path_for(ws).with_suffix(".journal")
    stale = journal.read_bytes()
    store.gc_roots.register(ws, {"a": {"key": "5" * 64 + "/1", "label": "//:a"}})
    journal.write_bytes(stale)
    ((_, doc),) = store.gc_roots.all()
    assert doc["actions"]["a"]["key"].startswith("5")


@pytest.mark.fast
def test_a_long_journal_is_folded_into_the_registration(store, tmp_path, monkeypatch):
    import rsi.store_roots as roots_mod

    monkeypatch.setattr(roots_mod, "JOURNAL_BYTES", 200)
    ws = tmp_path / "ws"
    store.gc_roots.register(ws, {"a": {"key": "1" * 64 + "/1", "label": "//:a"}})
    for n in range(6):
        store.gc_roots.update(ws, {f"x{n}": {"key": f"{n}" * 64 + "/1", "label": "//:x"}})
    journal = store.gc_roots.path_for(ws).with_suffix(".journal")
    assert not journal.exists() or journal.stat().st_size <= 400
    ((_, doc),) = store.gc_roots.all()
    assert set(doc["actions"]) == {"a", *(f"x{n}" for n in range(6))}


# ------------------------------------------------------------------------------- group commit


def _record_syncs(monkeypatch) -> tuple[list[str], list[str]]:
    """(paths fsync'ed, store roots syncfs'ed) from here on."""
    from rsi import store as store_mod

    fsynced: list[str] = []
    whole: list[str] = []
    real_fsync = os.fsync

    def fsync(fd):
        fsynced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)

    def syncfs(fd):
        whole.append(os.readlink(f"/proc/self/fd/{fd}"))
        return 0

    monkeypatch.setattr(store_mod.os, "fsync", fsync)
    monkeypatch.setattr(store_mod, "_syncfs", lambda: syncfs)
    return fsynced, whole


@pytest.mark.fast
def test_group_commit_fsyncs_the_few_files_written_and_their_folders_not_the_file_system(
    store, tmp_path, monkeypatch
):
    """Under group commit (sync_each off) a sync makes durable exactly what was written since
    the last one: each blob and entry, and the folders their names went into. A sync of the
    whole file system would also wait for every other program's unwritten data."""
    fsynced, whole = _record_syncs(monkeypatch)
    store.sync_each = False
    small = store.put_bytes(b"small blob")
    src = tmp_path / "big"
    src.write_bytes(os.urandom(256 << 10))  # NB: past the in-memory copy: a file copy
    big = store.put_file(src)
    key = digest_bytes(b"an action")
    store.put_action_result(key, ActionResult(0, (OutputFile("o", small),)))
    assert fsynced == []  # NB: nothing is fsynced as it is written
    store.sync()
    written = {str(store.blob_path(small)), str(store.blob_path(big)), str(store._ac_path(key))}
    assert written <= set(fsynced)
    assert {os.path.dirname(p) for p in written} <= set(fsynced)
    assert whole == []
    fsynced.clear()
    store.sync()  # NB: nothing new: nothing to do
    assert fsynced == [] and whole == []


@pytest.mark.fast
def test_group_commit_of_many_files_syncs_the_file_system_once(store, monkeypatch):
    from rsi.store import SYNC_FILES_MAX

    fsynced, whole = _record_syncs(monkeypatch)
    store.sync_each = False
    for i in range(SYNC_FILES_MAX + 5):
        store.put_bytes(f"blob {i}".encode())
    store.sync()
    assert whole == [str(store.root)] and fsynced == []
    whole.clear()
    store.put_bytes(b"one more")
    store.sync()  # NB: the count starts again after each sync
    assert whole == [] and str(store.blob_path(digest_bytes(b"one more"))) in fsynced
