"""Prepared input trees (rsi.executors.staged): an action with many inputs runs over a tree kept
in the store and brought to its inputs by their difference, with hard links to the blobs. A
hostile action must not reach the store or the next action's inputs through them."""

from __future__ import annotations

import os
import time
import threading

import pytest

from rsi.action import Action
from rsi.digest import FileNode, SymlinkNode
from rsi.errors import CorruptEntry
from rsi.executors import base as executor_base
from rsi.executors import staged
from rsi.executors.local import LocalExecutor
from rsi.store import LocalStore

PATH = ("PATH", "/usr/bin:/bin")
N = 40


@pytest.fixture
def store(tmp_path) -> LocalStore:
    return LocalStore(tmp_path / "store")


@pytest.fixture
def ex(bwrap, monkeypatch) -> LocalExecutor:
    from rsi.executors.pool import pool_supported

    if not pool_supported():
        pytest.skip("prepared trees need root (actions run as uid 65534)")
    monkeypatch.setattr(staged, "TREE_MIN_INPUTS", N)
    return LocalExecutor(pool=True)


def inputs(store: LocalStore, n: int = N, changed: dict | None = None) -> list:
    found = []
    for i in range(n):
        rel = f"d{i % 3}/f{i}" if i % 2 else f"f{i}"
        data = (changed or {}).get(rel, f"input {i}\n".encode())
        found.append((rel, FileNode(store.put_bytes(data), False)))
    return found


def act(script: str, ins: list, outputs=("o",)) -> Action:
    return Action(
        argv=("/bin/sh", "-c", script),
        inputs=tuple(ins),
        outputs=tuple(outputs),
        env=(PATH,),
        timeout_s=60,
        label="//test:fanin",
    )


def out(store: LocalStore, result, path: str = "o") -> bytes:
    assert result.ok, (result.failure, result.exit_code, store.read_bytes(result.stderr))
    return store.read_bytes(result.output_map[path].digest)


def tree_of(store: LocalStore):
    (home,) = list((store.root / "stage").iterdir())
    return home / "exec"


def listing(exec_dir) -> dict[str, bytes]:
    found = {}
    for dp, _, names in os.walk(exec_dir):
        for n in names:
            p = os.path.join(dp, n)
            found[os.path.relpath(p, exec_dir)] = open(p, "rb").read()
    return found


# NB: the shell creates ./o while find walks the tree: leave it out, or cat may read its own output
LIST = "find . -type f ! -path ./o | sort | xargs cat > o"


@pytest.mark.e2e
@pytest.mark.parametrize(
    "attack",
    [
        "echo evil > f0",
        "echo evil >> d1/f1",
        "chmod 666 f0 && echo evil > f0",
        "chmod 777 d1 && echo evil > d1/f1",
        "rm -f f0 && echo evil > f0",
        "mv f0 moved && echo evil > f0",
        "ln f0 linked && chmod 666 linked && echo evil > linked",
        "cp f0 copy && mv -f copy f0",
        "truncate -s 0 d1/f1",
        "mkdir -p d0 && echo evil > d0/new",
        "ln -s /etc/passwd d2/f5",
    ],
)
def test_a_hostile_action_changes_neither_the_store_nor_the_next_actions_inputs(store, ex, attack):
    ins = inputs(store)
    first = ex.run(act(f"({attack}) 2>/dev/null; id -u > o", ins), store)
    assert out(store, first) == b"65534\n"
    assert first.host.get("sandbox_inputs") == "prepared tree"
    for rel, node in ins:
        assert store.has_verified(node.digest), rel
        assert store.read_bytes(node.digest) == f"input {rel.rpartition('f')[2]}\n".encode()
    want = b"".join(sorted(store.read_bytes(n.digest) for _, n in ins))
    second = ex.run(act("find . -type f ! -path ./o | sort | xargs cat | sort > o", ins), store)
    assert out(store, second) == want  # NB: exactly the inputs: nothing the attack left


@pytest.mark.e2e
def test_the_tree_follows_the_inputs_and_restages_only_what_changed(store, ex):
    ins = inputs(store)
    ex.run(act(LIST, ins), store)
    exec_dir = tree_of(store)
    inodes = {rel: os.lstat(exec_dir / rel).st_ino for rel, _ in ins}
    blob = {rel: os.lstat(store.blob_path(n.digest)).st_ino for rel, n in ins}
    assert inodes == blob  # NB: hard links to the blobs: no copy
    changed = inputs(store, changed={"f4": b"changed\n"})
    # NB: one input gone, one new in a new folder, one symlink, one executable
    changed = [x for x in changed if x[0] != "d2/f5"] + [
        ("new/deep/g", FileNode(store.put_bytes(b"g\n"), False)),
        ("link", SymlinkNode("f0")),
        ("tool", FileNode(store.put_bytes(b"#!/bin/sh\necho tool\n"), True)),
    ]
    r = ex.run(act("./tool > o; cat link >> o; ls d2 new/deep >> o", changed), store)
    text = out(store, r).decode()
    assert text.startswith("tool\ninput 0\n") and "f5" not in text and "g" in text
    held = listing(exec_dir)
    assert set(held) == {rel for rel, _ in changed}
    assert held["f4"] == b"changed\n"
    for rel, _ in changed:
        if rel not in ("f4", "new/deep/g", "link", "tool"):
            assert os.lstat(exec_dir / rel).st_ino == inodes[rel], rel  # NB: untouched
    assert not os.path.exists(exec_dir / "d2" / "f5")


@pytest.mark.e2e
def test_a_tampered_tree_entry_is_replaced_not_served(store, ex):
    ins = inputs(store)
    ex.run(act(LIST, ins), store)
    exec_dir = tree_of(store)
    victim = exec_dir / "f2"
    os.unlink(victim)  # NB: root on the host changes the tree behind rsi's back
    victim.write_text("forged\n")
    os.chmod(victim, 0o444)
    r = ex.run(act("cat f2 > o", ins), store)
    assert out(store, r) == b"input 2\n"
    manifest = exec_dir.parent / "manifest"
    manifest.write_bytes(b"garbage")  # NB: an unreadable manifest: rebuilt whole
    r = ex.run(act("cat f2 d1/f1 > o", ins), store)
    assert out(store, r) == b"input 2\ninput 1\n"


@pytest.mark.e2e
def test_a_tree_another_build_holds_is_not_shared(store, ex):
    ins = inputs(store)
    ex.run(act(LIST, ins), store)
    home = tree_of(store).parent
    import fcntl

    fd = os.open(home / "lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        r = ex.run(act("cat f2 > o", ins), store)
        assert out(store, r) == b"input 2\n"
        assert r.host.get("sandbox_inputs") is None  # NB: staged the ordinary way
    finally:
        os.close(fd)
    executor_base.TRASH.drain()


@pytest.mark.e2e
def test_concurrent_actions_of_one_role_each_see_their_own_inputs(store, ex):
    sets = [inputs(store, changed={"f0": f"run {k}\n".encode()}) for k in range(4)]
    results: list = [None] * 4

    def go(k: int) -> None:
        results[k] = ex.run(act("sleep 0.2; cat f0 > o", sets[k]), store)

    threads = [threading.Thread(target=go, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [out(store, r) for r in results] == [f"run {k}\n".encode() for k in range(4)]


@pytest.mark.fast
def test_few_inputs_never_take_a_tree():
    few = Action(argv=("true",), inputs=(), outputs=("o",))
    assert not staged.usable(few)


@pytest.mark.e2e
def test_cache_gc_removes_the_trees_so_no_removed_blob_stays_on_disk_through_them(store, ex):
    """A tree's hard links would keep every blob gc removes on disk: gc (which no build runs
    beside: it holds the store lock exclusive) removes the trees, and the next action builds
    its tree again."""
    from rsi.cacheops import cache_gc

    ins = inputs(store)
    assert out(store, ex.run(act(LIST, ins), store))
    blob = store.blob_path(ins[0][1].digest)
    assert os.stat(blob).st_nlink == 2  # NB: the store's name and the tree's
    doc = cache_gc(store, None, dry_run=False)
    assert doc["removed_input_trees"] == 1
    assert not (store.root / "stage").exists()
    assert ins[0][1].digest.hash in doc["removed_blobs"]  # NB: nothing references it
    assert not blob.exists()
    again = inputs(store)
    lines = out(store, ex.run(act(LIST, again), store)).splitlines()
    assert sorted(lines) == sorted(f"input {i}".encode() for i in range(N))


@pytest.mark.e2e
@pytest.mark.parametrize("tamper", ["replace", "in_place", "chmod"])
def test_a_tampered_entry_of_a_trusted_tree_is_replaced_not_served(store, ex, tamper):
    """Once a tree's entries are trusted (checked past the racy window), a run keeps each one
    still at its signature without hashing it (in one batch, rsi.native) and looks again at
    any other: one replaced or made writable is replaced, never served. One rewritten in place
    (its size and mtime put back) was written through the tree's hard link into the store's
    blob itself: the run refuses with the blob named, and serves nothing."""
    ins = inputs(store)
    ex.run(act(LIST, ins), store)
    time.sleep(1.1)  # NB: past the racy window: the next run trusts what it verifies
    ex.run(act(LIST, ins), store)
    exec_dir = tree_of(store)
    inodes = {rel: os.lstat(exec_dir / rel).st_ino for rel, _ in ins}
    victim = exec_dir / "f2"
    st = os.lstat(victim)
    if tamper == "replace":
        os.unlink(victim)
        victim.write_text("forged\n")
        os.chmod(victim, 0o444)
    elif tamper == "in_place":
        os.chmod(victim, 0o644)
        victim.write_text("forged\n")  # NB: the same size as "input 2\n"
        os.chmod(victim, 0o444)
        os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    else:
        os.chmod(victim, 0o666)
    if tamper == "in_place":
        with pytest.raises(CorruptEntry, match="missing or corrupt"):
            ex.run(act("cat f2 > o", ins), store)
        return
    r = ex.run(act("cat f2 > o; ls -l f2 >> o", ins), store)
    text = out(store, r).decode()
    assert text.startswith("input 2\n") and "-r--r--r--" in text, text
    for rel, _ in ins:
        if rel != "f2":
            assert os.lstat(exec_dir / rel).st_ino == inodes[rel], rel  # NB: kept as they were
