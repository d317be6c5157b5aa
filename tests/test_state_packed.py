"""The build state keeps its actions packed (256 pickled shards inside the state's, each
unpickled on first use) so a no-op never reads an action's entry; what a no-op exports comes
from the state's `exports`, which must follow every change of a producer's outputs
(rsi/incremental.py). No timing is asserted."""

from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bwrap")]


@pytest.fixture
def ws(command, make_workspace, tmp_path):
    """leaf -> top; top's output is what the build exports."""
    return make_workspace(
        tmp_path,
        {
            "in/a.txt": "alpha\n",
            "BUILD.toml": command(
                "leaf", cmd="cat $(SRCS) > $(OUT)", srcs=["in/a.txt"], outs=["a.out"]
            )
            + command(
                "top",
                cmd="tr a-z A-Z < $(location :leaf) > $(OUT)",
                deps=[":leaf"],
                outs=["top.out"],
            ),
        },
    )


def _build(workspace, monkeypatch, tmp_path):
    from rsi.build import build

    monkeypatch.setenv("RSI_HOST_LOCK", str(tmp_path / "host.lock"))
    return build(workspace, ["//:top"])


def test_a_no_op_leaves_the_actions_packed_and_exports_what_changed_last(ws, monkeypatch, tmp_path):
    from rsi import incremental
    from rsi.sharded import ShardedDict
    from rsi.workspace import Workspace

    monkeypatch.chdir(ws)
    workspace = Workspace.discover()
    seen: list[dict] = []
    real = incremental._plan

    def watching(*args, **kw):
        p = real(*args, **kw)
        if p is not None:
            seen.append(p.state)
        return p

    monkeypatch.setattr(incremental, "_plan", watching)
    assert _build(workspace, monkeypatch, tmp_path).counts["executed"] == 2
    time.sleep(1.1)  # NB: past the racy window: the next builds trust the signatures
    out = ws / "out" / "top.out"
    for n, text in enumerate(["bravo\n", "charlie\n"]):
        (ws / "in" / "a.txt").write_text(text)
        assert _build(workspace, monkeypatch, tmp_path).counts["executed"] == 2
        time.sleep(1.1)
        _build(workspace, monkeypatch, tmp_path)  # NB: settles the entries this change wrote
        out.unlink()  # NB: the no-op puts it back, from the state alone
        seen.clear()
        report = _build(workspace, monkeypatch, tmp_path)
        assert report.counts["executed"] == 0 and report.counts["cached"] == 2
        assert out.read_text() == text.upper(), n
        # NB: served without reading any action's entry: every shard still packed
        assert seen and isinstance(seen[-1]["actions"], ShardedDict)
        assert seen[-1]["actions"].loaded() == 0
    # NB: the change went to a delta; the packed actions plus the delta's entries are the
    # actions as they are now
    (state,) = [p for p in (ws / "cache" / "analysis").iterdir() if p.name.startswith("state-")]
    assert any(p.name.startswith("delta-") for p in state.parent.iterdir())
    from rsi.analysis_cache import read_sealed_head
    from rsi.runtime import open_store

    _, on_disk = read_sealed_head(open_store(workspace), state)
    assert isinstance(on_disk["actions"], ShardedDict) and on_disk["actions"].loaded() == 0

    plan = incremental.Plan(seen[-1]["request"], seen[-1])
    top = plan.output(open_store(workspace), "//:top#Command", "top.out")
    actions = plan.actions
    # NB: an exported output is read from `exports`: no entry's shard unpacked for it
    assert actions.loaded() == 0
    outputs = actions["//:top#Command"][incremental.OUTPUTS]
    # NB: reading one entry unpacked its shard alone, the delta's entries applied to it
    assert actions.loaded() == 1
    assert top is not None and (top[0].hash, top[0].size) == (outputs[0][1], outputs[0][2])
    assert outputs[0][2] == len("CHARLIE\n")
