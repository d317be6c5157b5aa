"""The outputs of every action are kept in a sidecar file beside the build state,
`outs-<request>`, sealed, and named by the state (its `outs_seal`); what changed since is in the
state's `outs` (rsi/incremental.py). A one-change build re-keys a fan-in root from it instead of
unpickling the actions' entries. It must never key an action with an output the state does not
hold now: a delta's outputs win over the sidecar's, and a sidecar that is not the one the state
names (rewritten, removed, replaced by another sealed file) is not read. No timing is asserted."""

from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bwrap")]

LEAVES = ("a", "b", "c")


@pytest.fixture
def keeping(monkeypatch):
    """As the build server runs builds: only a long-lived process reads the sidecar."""
    from rsi import analysis_cache, incremental

    monkeypatch.setattr(analysis_cache, "keeping", True)
    monkeypatch.setattr(incremental, "_KEEP", {})
    monkeypatch.setattr(incremental, "_OUTS", {})


@pytest.fixture
def ws(command, make_workspace, tmp_path):
    """in/<x>.txt -> mid_<x> (upper-cased) for x in a, b, c -> root (their concatenation)."""
    files = {f"in/{x}.txt": f"{x}0\n" for x in LEAVES}
    build = "".join(
        command(
            f"mid_{x}",
            cmd="tr a-z A-Z < $(SRCS) > $(OUT)",
            srcs=[f"in/{x}.txt"],
            outs=[f"mid_{x}.out"],
        )
        for x in LEAVES
    )
    build += command(
        "root",
        cmd="cat " + " ".join(f"$(location :mid_{x})" for x in LEAVES) + " > $(OUT)",
        deps=[f":mid_{x}" for x in LEAVES],
        outs=["root.out"],
    )
    files["BUILD.toml"] = build
    return make_workspace(tmp_path, files)


def _build(ws, monkeypatch, tmp_path):
    from rsi.build import build
    from rsi.workspace import Workspace

    monkeypatch.chdir(ws)
    monkeypatch.setenv("RSI_HOST_LOCK", str(tmp_path / "host.lock"))
    report = build(Workspace.discover(), ["//:root"])
    assert report.ok
    return report


def _settled(ws, monkeypatch, tmp_path):
    """A full build, then a no-op past the racy window that trusts every entry's signature
    and writes the state whole: every row is then the sidecar's (the state's `outs` empty),
    so the builds after read the sidecar for any action they do not re-run."""
    from rsi import incremental

    assert _build(ws, monkeypatch, tmp_path).counts["executed"] == 4
    time.sleep(1.1)
    with monkeypatch.context() as m:
        m.setattr(incremental, "DELTA_MIN", 0)  # NB: any change: the state written whole
        _build(ws, monkeypatch, tmp_path)
    state, _, _, _ = _loaded_state(ws)
    assert state.get("outs_seal") and not state.get("outs")
    return ws / "cache" / "analysis"


def _loaded_state(ws):
    from rsi import incremental
    from rsi.runtime import open_store
    from rsi.workspace import Workspace

    store = open_store(Workspace.discover())
    (path,) = (ws / "cache" / "analysis").glob("state-*")
    return incremental._load(store, path.name[len("state-") :])


def _edit(ws, name, text):
    (ws / "in" / f"{name}.txt").write_text(text)
    time.sleep(1.1)  # NB: past the racy window: the new content is what the check sees


def _count_sealed_reads(monkeypatch) -> list[str]:
    """The kind (state, delta, outs) of every sealed file rsi.incremental reads from now on."""
    from rsi import incremental

    reads: list[str] = []
    real = incremental.read_sealed_head

    def counting(store, path):
        reads.append(path.name.split("-")[0])
        return real(store, path)

    monkeypatch.setattr(incremental, "read_sealed_head", counting)
    return reads


def _expected(texts):
    return "".join(texts[x].upper() for x in LEAVES)


def _rows_follow_entries(ws):
    """Read as the next build would (no check run first): every action's row, from the
    state's `outs` or the sidecar, holds its entry's outputs, key and signature."""
    from rsi import incremental
    from rsi.runtime import open_store
    from rsi.workspace import Workspace

    store = open_store(Workspace.discover())
    state = _loaded_state(ws)[0]
    for action_id, a in state["actions"].items():
        assert incremental._sidecar_row(store, state, action_id) == incremental._row(a), action_id


def test_a_one_change_build_keys_the_root_from_the_sidecar(ws, monkeypatch, tmp_path, keeping):
    from rsi import incremental
    from rsi.sharded import shard_of

    folder = _settled(ws, monkeypatch, tmp_path)
    (sidecar,) = folder.glob("outs-*")
    before = sidecar.read_bytes()
    states: list[dict] = []
    real = incremental._plan

    def watching(*args, **kw):
        p = real(*args, **kw)
        if p is not None:
            states.append(p.state)
        return p

    monkeypatch.setattr(incremental, "_plan", watching)
    _edit(ws, "a", "a1\n")
    report = _build(ws, monkeypatch, tmp_path)
    assert report.counts["executed"] == 2  # mid_a and the root
    assert (ws / "out" / "root.out").read_text() == "A1\nB0\nC0\n"
    # NB: mid_b's and mid_c's outputs came from the sidecar: their entries' shards stayed
    # packed (unless one shares a shard with an action this build re-ran)
    ran = {shard_of(f"//:{n}#Command") for n in ("mid_a", "root")}
    actions = states[-1]["actions"]
    for x in ("b", "c"):
        at = shard_of(f"//:mid_{x}#Command")
        if at not in ran:
            assert isinstance(actions._shards[at], bytes), x
    # NB: the change went to the delta (its `outs` part), the sidecar is as it was
    assert sidecar.read_bytes() == before
    assert set(states[-1]["outs"]) >= {"//:mid_a#Command", "//:root#Command"}


def test_outputs_changed_since_the_sidecar_come_from_the_delta(ws, monkeypatch, tmp_path, keeping):
    """Two one-change builds in a row: the second re-keys the root with mid_a's output as the
    first left it (in the delta), not as the sidecar holds it. Keyed with the sidecar's, the
    root would be rebuilt from mid_a's old blob, still in the store."""
    folder = _settled(ws, monkeypatch, tmp_path)
    texts = {x: f"{x}0\n" for x in LEAVES}
    for x, text in (("a", "a1\n"), ("b", "b1\n"), ("a", "a2\n"), ("c", "c1\n")):
        texts[x] = text
        _edit(ws, x, text)
        assert _build(ws, monkeypatch, tmp_path).counts["executed"] == 2
        assert (ws / "out" / "root.out").read_text() == _expected(texts), (x, text)
        assert list(folder.glob("delta-*")), "the change went to a delta"
        _rows_follow_entries(ws)


@pytest.mark.parametrize("damage", ["removed", "resealed", "garbage", "other_state"])
def test_a_sidecar_the_state_does_not_name_is_not_read(ws, monkeypatch, tmp_path, damage, keeping):
    """The sidecar removed, replaced by a validly sealed table of wrong outputs, by bytes that
    are no sealed file at all, or by the sidecar of the state before: each build still keys
    the root with the outputs as they are, and loses nothing."""
    import pickle

    from rsi import incremental
    from rsi.analysis_cache import write_sealed
    from rsi.runtime import open_store
    from rsi.sharded import Sharded
    from rsi.workspace import Workspace

    folder = _settled(ws, monkeypatch, tmp_path)
    (sidecar,) = folder.glob("outs-*")
    old = sidecar.read_bytes()
    texts = {x: f"{x}0\n" for x in LEAVES}
    if damage == "other_state":
        # NB: two later whole writes of the state (a rule change would do; here, writing it
        # whole directly): mid_b changed, then every entry settled; then the sidecar of the
        # state before put back in place, its mid_b row from before the change
        with monkeypatch.context() as m:
            m.setattr(incremental, "DELTA_MIN", 0)
            texts["b"] = "b1\n"
            _edit(ws, "b", "b1\n")
            _build(ws, monkeypatch, tmp_path)
            time.sleep(1.1)
            _build(ws, monkeypatch, tmp_path)
        assert not _loaded_state(ws)[0].get("outs")
        assert sidecar.read_bytes() != old, "the state was written whole"
        sidecar.write_bytes(old)
    elif damage == "removed":
        sidecar.unlink()
    elif damage == "garbage":
        sidecar.write_bytes(b"not a sealed file\n" + pickle.dumps({"x": 1}))
    else:
        store = open_store(Workspace.discover())
        bogus = {f"//:mid_{x}#Command": (("mid_b.out", "0" * 64, 3, False),) for x in LEAVES}
        sidecar.unlink()
        assert write_sealed(store, sidecar, Sharded.pack(bogus))
    # NB: as a new process: no table read before, by seal, in memory
    monkeypatch.setattr(incremental, "_OUTS", {})
    reads = _count_sealed_reads(monkeypatch)
    texts["a"] = "a9\n"
    _edit(ws, "a", "a9\n")
    _build(ws, monkeypatch, tmp_path)
    assert (ws / "out" / "root.out").read_text() == _expected(texts)
    # NB: a sidecar that did not match is not read (and hashed) again per lookup
    assert reads.count("outs") == 1, reads
    # NB: and the next build, the sidecar still not the one named, the same
    texts["c"] = "c9\n"
    _edit(ws, "c", "c9\n")
    _build(ws, monkeypatch, tmp_path)
    assert (ws / "out" / "root.out").read_text() == _expected(texts)


def test_a_process_of_one_build_never_reads_the_sidecar(ws, monkeypatch, tmp_path):
    """Without `keeping` (a plain `rsi build`), the sidecar is written with the state but not
    read: reading and hashing it costs a fresh process more than the entries it saves."""
    from rsi import incremental

    _settled(ws, monkeypatch, tmp_path)
    monkeypatch.setattr(incremental, "_OUTS", {})
    reads = _count_sealed_reads(monkeypatch)
    texts = {x: f"{x}0\n" for x in LEAVES}
    for x, text in (("a", "a1\n"), ("b", "b1\n")):
        texts[x] = text
        _edit(ws, x, text)
        assert _build(ws, monkeypatch, tmp_path).counts["executed"] == 2
        assert (ws / "out" / "root.out").read_text() == _expected(texts)
    assert "outs" not in reads and "state" in reads, reads
