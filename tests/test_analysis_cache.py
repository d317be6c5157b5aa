"""The analysis cache: its pickled graph keeps each target, provider and action pickled on its
own, read only when looked at and equal to what analysis made; its check of the sources'
existence, kind, executable bit and real path sees every change the full check sees."""

from __future__ import annotations

import os
import pickle

import pytest

from rsi.analysis import PickledValues, analyze
from rsi.analysis_cache import _stat_sig, _stats_unchanged
from rsi.label import Label
from rsi.loader import Loader
from rsi.registry import load_rules
from rsi.store import LocalStore

pytestmark = pytest.mark.fast


def _graph(tmp_path, make_workspace, command):
    ws = make_workspace(
        tmp_path,
        {
            "in/a.txt": "a\n",
            "BUILD.toml": command("leaf", cmd="cat $(SRCS) > $(OUT)", srcs=["in/a.txt"], outs=["l"])
            + command("top", cmd="cat $(location :leaf) > $(OUT)", deps=[":leaf"], outs=["t"]),
        },
    )
    store = LocalStore(tmp_path / "store")
    labels = [Label("", "top")]
    return labels, analyze(Loader(ws, load_rules()), labels, store_put=store.put_bytes, settings={})


def test_a_label_pickles_to_an_equal_label():
    label = Label("tasks/softmax", "verdict")
    again = pickle.loads(pickle.dumps(label, pickle.HIGHEST_PROTOCOL))
    assert again == label and hash(again) == hash(label) and str(again) == str(label)


def test_a_pickled_graph_reads_each_value_on_first_use_and_equals_the_analysed_one(
    tmp_path, make_workspace, command
):
    labels, graph = _graph(tmp_path, make_workspace, command)
    again = pickle.loads(pickle.dumps(graph, pickle.HIGHEST_PROTOCOL))
    for name in ("targets", "providers", "actions"):
        lazy = getattr(again, name)
        assert isinstance(lazy, PickledValues)
        assert set(lazy) == set(getattr(graph, name)) and len(lazy) == len(getattr(graph, name))
        assert not lazy._made  # NB: nothing unpickled yet
    action_id = next(iter(graph.actions))
    assert again.actions[action_id] == graph.actions[action_id]
    assert again.actions[action_id] is again.actions[action_id]  # NB: unpickled once
    assert set(again.actions._made) == {action_id}
    assert again.actions_for(labels) == graph.actions_for(labels)
    assert again.providers[labels[0]] == graph.providers[labels[0]]
    assert again.targets[labels[0]].rule.name == "command"
    assert "missing" not in again.actions and again.actions.get("missing") is None
    with pytest.raises(KeyError):
        again.actions["missing"]
    # NB: pickled again (the analysis cache saved anew), the values not read stay as they were
    twice = pickle.loads(pickle.dumps(again, pickle.HIGHEST_PROTOCOL))
    assert {k: twice.actions[k] for k in twice.actions} == dict(graph.actions)


def test_the_quick_check_of_sources_agrees_with_the_full_one(tmp_path):
    """Recorded, then changed one way each: every change is seen, with or without the
    caller's lstat, and an unchanged tree passes."""
    base = tmp_path / "ws"
    (base / "pkg").mkdir(parents=True)
    (base / "elsewhere").mkdir()
    names = ["plain", "to_exec", "gone", "to_link", "to_dir", "kept"]
    for name in names:
        (base / "pkg" / name).write_text(name)
    (base / "elsewhere" / "plain").write_text("plain")
    # NB: not the folder itself: swapping it for a link must be seen through its files
    paths = [str(base / "pkg" / n) for n in names] + [str(base / "elsewhere"), "/", "relative"]

    def record() -> dict:
        return {p: _stat_sig(p) for p in paths}

    def lstats() -> dict:
        found = {}
        for p in paths:
            try:
                found[p] = os.lstat(p).st_mode  # NB: the modes, as the state's check keeps
            except OSError:
                pass
        return found

    recorded = record()
    assert _stats_unchanged(recorded, lstats()) and _stats_unchanged(recorded, {})
    changes = [
        lambda: os.chmod(base / "pkg" / "to_exec", 0o755),
        lambda: (base / "pkg" / "gone").unlink(),
        lambda: (
            (base / "pkg" / "to_link").unlink(),
            (base / "pkg" / "to_link").symlink_to(base / "elsewhere" / "plain"),
        ),
        lambda: ((base / "pkg" / "to_dir").unlink(), (base / "pkg" / "to_dir").mkdir()),
        # NB: the folder itself swapped for a link to a copy: same names, another real path
        lambda: (
            (base / "pkg").rename(base / "pkg.old"),
            (base / "pkg").symlink_to(base / "pkg.old"),
        ),
    ]
    for change in changes:
        change()
        now = record()
        assert now != recorded
        for seen in (lstats(), {}):
            assert _stats_unchanged(recorded, seen) is False
            assert _stats_unchanged(now, seen) is True
        recorded = now
