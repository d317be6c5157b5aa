"""What a run records of an action it explains: the action is described once for "why" and the
record (a root of 10,000 inputs was described three times per one-change build), and the record
holds the same description "why" compared against."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rsi.action import Action
from rsi.action_history import ActionHistory
from rsi.digest import FileNode, digest_bytes
from rsi.rule import ActionSpec
from rsi.store import LocalStore

pytestmark = pytest.mark.fast


# NB: the target's attributes as analysis gives them (no target is unpickled for them)
_GRAPH = SimpleNamespace(attrs_json={"//:top": {"cmd": "cat"}})


def _spec() -> ActionSpec:
    return ActionSpec("//:top#Command", "//:top", "Command", ("cat",), (), ("t",), (), (), 60.0, ())


def _action(content: bytes) -> Action:
    inputs = {f"in/{i}.txt": FileNode(digest_bytes(b"%d" % i), False) for i in range(50)}
    inputs["in/changed.txt"] = FileNode(digest_bytes(content), False)
    return Action(["cat"], inputs, ["t"], label="//:top")


def test_an_explained_and_recorded_action_is_described_once(tmp_path, monkeypatch):
    store = LocalStore(tmp_path / "store")
    first = ActionHistory(store)
    first.graph = _GRAPH
    first.record(_spec(), _action(b"before"))
    first.flush()

    calls: list[str] = []
    describe = Action.describe

    def counted(self: Action) -> dict:
        calls.append(self.label)
        return describe(self)

    monkeypatch.setattr(Action, "describe", counted)
    again = ActionHistory(store)
    again.graph = _GRAPH
    action = _action(b"after")
    action.key()  # NB: as the scheduler does: keyed (one description) before it is explained
    assert calls == ["//:top"]
    why = again.why(_spec(), action)
    again.record(_spec(), action)
    assert calls == ["//:top", "//:top"], "explained and recorded from one description"
    assert why == [
        f"input in/changed.txt content changed ({digest_bytes(b'before').hash[:12]} -> "
        f"{digest_bytes(b'after').hash[:12]})"
    ]
    again.flush()

    monkeypatch.setattr(Action, "describe", describe)
    third = ActionHistory(store)
    entry = third.index.get("//:top#Command")
    assert entry["key"] == str(action.key())
    assert store.target_index.details("//:top#Command", entry)[0] == action.describe()
