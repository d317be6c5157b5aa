"""Digests of bytes, streamed files and Merkle trees, and the stat memo that skips re-reading."""

from __future__ import annotations

import hashlib
import os

import blake3
import pytest

import rsi.digest as digest_mod
from rsi.digest import (
    Digest,
    FileDigestMemo,
    FileNode,
    SymlinkNode,
    TreeError,
    digest_bytes,
    digest_file,
    merkle_directories,
    scan_tree,
    tree_digest,
)
from rsi.errors import RsiError

pytestmark = pytest.mark.fast

# -------------------------------------------------------------------------------- bytes, files


def test_bytes_digest_is_blake3_hex_and_size():
    d = digest_bytes(b"hello")
    assert d == Digest(blake3.blake3(b"hello").hexdigest(), 5)
    assert str(d) == f"{d.hash}/5"


def test_sha256_digest_function_is_plain_sha256():
    assert digest_bytes(b"hello", "sha256").hash == hashlib.sha256(b"hello").hexdigest()


def test_unknown_digest_function_is_an_rsi_error():
    with pytest.raises(RsiError, match="unknown digest function"):
        digest_bytes(b"x", "md5")


def test_digest_parse_round_trips_and_rejects_junk():
    d = digest_bytes(b"abc")
    assert Digest.parse(str(d)) == d
    for junk in ("nothex/3", "abc", "ab/cd", "ab/3/4"):
        with pytest.raises(RsiError):
            Digest.parse(junk)


@pytest.mark.parametrize("size", [0, 1, 4095, (1 << 20) - 1, (1 << 20) + 7, 3 * (1 << 20) + 1])
@pytest.mark.parametrize("function", ["blake3", "sha256"])
def test_streamed_file_digest_equals_digest_of_its_bytes(tmp_path, size, function):
    data = os.urandom(size)
    path = tmp_path / "f"
    path.write_bytes(data)
    assert digest_file(path, function) == digest_bytes(data, function)


# ------------------------------------------------------------------------------------- trees


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "tree"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("a")
    (root / "sub" / "b.txt").write_text("b")
    tool = root / "tool.sh"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    return root


def _root(path) -> Digest:
    return tree_digest(scan_tree(path))


def test_tree_snapshot_lists_files_with_content_and_executable_bit(tree):
    entries = scan_tree(tree)
    assert set(entries) == {"a.txt", "sub/b.txt", "tool.sh"}
    assert entries["a.txt"] == FileNode(digest_bytes(b"a"), False)
    assert entries["tool.sh"].executable is True


def test_identical_trees_have_identical_digests(tree, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(tree, copy)
    assert _root(copy) == _root(tree)


def test_file_content_is_part_of_the_tree_digest(tree):
    before = _root(tree)
    (tree / "sub" / "b.txt").write_text("B")
    assert _root(tree) != before


def test_file_name_is_part_of_the_tree_digest(tree):
    before = _root(tree)
    (tree / "a.txt").rename(tree / "renamed.txt")
    assert _root(tree) != before


def test_moving_a_file_between_folders_changes_the_tree_digest(tree):
    before = _root(tree)
    (tree / "a.txt").rename(tree / "sub" / "a.txt")
    assert _root(tree) != before


def test_executable_bit_is_part_of_the_tree_digest(tree):
    before = _root(tree)
    (tree / "a.txt").chmod(0o755)
    assert _root(tree) != before


def test_file_set_is_part_of_the_tree_digest(tree):
    before = _root(tree)
    (tree / "empty").write_bytes(b"")
    with_empty = _root(tree)
    assert with_empty != before
    (tree / "empty").unlink()
    assert _root(tree) == before


def test_merkle_blobs_describe_every_folder(tree):
    root, blobs = merkle_directories(scan_tree(tree))
    assert root in blobs
    assert len(blobs) == 2  # the root and sub/
    for digest, data in blobs.items():
        assert digest_bytes(data) == digest


def test_symlink_inside_the_tree_is_kept_as_a_link(tree):
    os.symlink("sub/b.txt", tree / "link")
    entries = scan_tree(tree)
    assert entries["link"] == SymlinkNode("sub/b.txt")
    before = tree_digest(entries)
    os.unlink(tree / "link")
    os.symlink("a.txt", tree / "link")
    assert _root(tree) != before  # the link's target is part of the digest


def test_symlinked_folder_inside_the_tree_is_not_descended(tree):
    os.symlink("sub", tree / "alias")
    entries = scan_tree(tree)
    assert entries["alias"] == SymlinkNode("sub")
    assert not any(p.startswith("alias/") for p in entries)


def test_symlink_out_of_the_tree_is_rejected_naming_it(tree, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("outside")
    os.symlink("../secret.txt", tree / "escape")
    with pytest.raises(TreeError, match="escape"):
        scan_tree(tree)


def test_absolute_symlink_is_rejected_even_when_it_points_inside(tree):
    os.symlink(str(tree / "a.txt"), tree / "abs")
    with pytest.raises(TreeError, match="abs"):
        scan_tree(tree)


def test_dangling_symlink_is_rejected(tree):
    os.symlink("nowhere", tree / "dangling")
    with pytest.raises(TreeError, match="dangling"):
        scan_tree(tree)


def test_symlink_out_of_the_tree_is_never_read(tree, tmp_path, monkeypatch):
    secret = tmp_path / "secret.txt"
    secret.write_text("outside")
    os.symlink(str(secret), tree / "escape")
    read: list[str] = []
    real = digest_mod.digest_file
    monkeypatch.setattr(
        digest_mod, "digest_file", lambda p, f="blake3": read.append(os.fspath(p)) or real(p, f)
    )
    with pytest.raises(TreeError):
        scan_tree(tree)
    assert not any(p.endswith("escape") or p == str(secret) for p in read)


@pytest.mark.parametrize("bad", ["/abs", "a/../b", "./a", "a//b", ""])
def test_merkle_rejects_unnormalised_paths(bad):
    with pytest.raises(TreeError):
        merkle_directories({bad: FileNode(digest_bytes(b""))})


def test_merkle_rejects_a_path_that_is_both_file_and_folder():
    node = FileNode(digest_bytes(b""))
    with pytest.raises(TreeError):
        merkle_directories({"a": node, "a/b": node})


# -------------------------------------------------------------------------------------- memo


class Counter:
    def __init__(self, monkeypatch):
        self.paths: list[str] = []
        real = digest_mod.digest_file

        def counting(path, function="blake3"):
            self.paths.append(os.fspath(path))
            return real(path, function)

        monkeypatch.setattr(digest_mod, "digest_file", counting)

    def __len__(self) -> int:
        return len(self.paths)


@pytest.fixture
def later_clock(monkeypatch):
    """As if the files the test writes were old: no racy window to wait out."""
    monkeypatch.setattr(FileDigestMemo, "RACY_NS", -(10**18))


def test_memo_does_not_reread_an_unchanged_file(tmp_path, monkeypatch, later_clock):
    path = tmp_path / "f"
    path.write_text("content")
    reads = Counter(monkeypatch)
    memo = FileDigestMemo(None)
    first = memo.digest(path)
    assert memo.digest(path) == first == digest_bytes(b"content")
    assert len(reads) == 1


def test_memo_survives_a_restart_without_rereading(tmp_path, monkeypatch, later_clock):
    path = tmp_path / "f"
    path.write_text("content")
    memo = FileDigestMemo(tmp_path / "memo.json")
    first = memo.digest(path)
    memo.save()
    reads = Counter(monkeypatch)
    assert FileDigestMemo(tmp_path / "memo.json").digest(path) == first
    assert len(reads) == 0


def test_memo_rereads_a_file_whose_content_changed_behind_a_restored_mtime(
    tmp_path, monkeypatch, later_clock
):
    path = tmp_path / "f"
    path.write_text("aaaa")
    memo = FileDigestMemo(None)
    memo.digest(path)
    st = os.stat(path)
    path.write_text("bbbb")  # same size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime; ctime still moves
    reads = Counter(monkeypatch)
    assert memo.digest(path) == digest_bytes(b"bbbb")
    assert len(reads) == 1


def test_memo_rereads_a_replaced_file_with_the_same_size_and_mtime(
    tmp_path, monkeypatch, later_clock
):
    path = tmp_path / "f"
    path.write_text("aaaa")
    memo = FileDigestMemo(None)
    memo.digest(path)
    st = os.stat(path)
    other = tmp_path / "g"
    other.write_text("cccc")
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(other, path)  # new inode
    reads = Counter(monkeypatch)
    assert memo.digest(path) == digest_bytes(b"cccc")
    assert len(reads) == 1


def test_memo_never_remembers_a_file_written_within_the_racy_window(tmp_path, monkeypatch):
    path = tmp_path / "f"
    path.write_text("fresh")
    reads = Counter(monkeypatch)
    memo = FileDigestMemo(None)
    memo.digest(path)
    memo.digest(path)
    assert len(reads) == 2


def test_memo_for_another_digest_function_is_ignored(tmp_path, monkeypatch, later_clock):
    path = tmp_path / "f"
    path.write_text("content")
    memo = FileDigestMemo(tmp_path / "memo.json", "blake3")
    memo.digest(path)
    memo.save()
    reads = Counter(monkeypatch)
    assert FileDigestMemo(tmp_path / "memo.json", "sha256").digest(path) == digest_bytes(
        b"content", "sha256"
    )
    assert len(reads) == 1


def test_unreadable_memo_file_is_ignored(tmp_path):
    (tmp_path / "memo.json").write_text("{not json")
    path = tmp_path / "f"
    path.write_text("x")
    assert FileDigestMemo(tmp_path / "memo.json").digest(path) == digest_bytes(b"x")


def test_tree_scan_with_memo_reads_each_unchanged_file_once(tree, monkeypatch, later_clock):
    memo = FileDigestMemo(None)
    first = scan_tree(tree, memo)
    reads = Counter(monkeypatch)
    assert scan_tree(tree, memo) == first
    assert len(reads) == 0
    (tree / "a.txt").write_text("changed")
    scan_tree(tree, memo)
    assert reads.paths == [str(tree / "a.txt")]


def test_the_memo_survives_threads_that_race_on_one_changing_file(tmp_path):
    """Executor threads verify the same blob while hard links to it come and go (each link
    changes its ctime): concurrent memo updates must never raise."""
    import threading

    from rsi.digest import FileDigestMemo

    blob = tmp_path / "blob"
    blob.write_bytes(b"x" * 100)
    old = blob.stat().st_mtime_ns - 5_000_000_000
    os.utime(blob, ns=(old, old))
    memo = FileDigestMemo(None)
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(300):
                link = tmp_path / f"l{n}-{i}"
                os.link(blob, link)
                memo._entries[str(blob)] = [0, 0, 0, 0, "stale"]  # a stale entry, as after a link
                memo.digest(blob)
                link.unlink()
        except BaseException as exc:  # noqa: BLE001 - the test collects whatever a thread raises
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
