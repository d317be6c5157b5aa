"""The value classes on the build path (rsi/record.py) behave as the dataclasses they replace:
equality by the compared fields only, hashing and immutability when frozen, ordering where
declared, `replace` through `__init__`, and pickling to equal values."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from rsi.action import Action, ActionResult, OutputFile
from rsi.digest import Digest, FileNode, SymlinkNode
from rsi.label import Label, Pattern
from rsi.record import FrozenError
from rsi.rule import Artifact
from rsi.scheduler import Outcome
from rsi.workspace import Workspace

D1, D2 = Digest("ab" * 32, 3), Digest("cd" * 32, 4)


@pytest.mark.fast
@pytest.mark.parametrize(
    "make",
    [
        lambda: Digest("ab" * 32, 3),
        lambda: FileNode(D1, True),
        lambda: SymlinkNode("a/b"),
        lambda: Label("pkg/x", "t"),
        lambda: Pattern("pkg", None, True),
        lambda: Artifact("a.txt", producer="//:t#A", digest=D1),
        lambda: OutputFile("o", D1),
        lambda: Action(("true",), inputs={"in": FileNode(D1)}, outputs=["o"]),
    ],
)
def test_frozen_values_are_equal_hashable_immutable_and_pickle_to_equals(make):
    a, b = make(), make()
    assert a == b and hash(a) == hash(b) and a is not b
    assert a != object() and not (a == 1)
    name = a._fields[0]
    with pytest.raises(FrozenError):
        setattr(a, name, getattr(a, name))
    with pytest.raises(AttributeError):
        delattr(a, name)
    back = pickle.loads(pickle.dumps(a, pickle.HIGHEST_PROTOCOL))
    assert back == a and hash(back) == hash(a) and type(back) is type(a)
    assert repr(a).startswith(type(a).__qualname__ + "(") and f"{name}=" in repr(a)


@pytest.mark.fast
def test_values_of_different_classes_or_fields_differ():
    assert Digest("ab" * 32, 3) != Digest("ab" * 32, 4)
    assert FileNode(D1) != FileNode(D1, True) != FileNode(D2, True)
    assert Label("a", "b") != Pattern("a", "b", False)
    assert len({Label("a", "b"), Label("a", "b"), Label("a", "c")}) == 2


@pytest.mark.fast
def test_ordered_values_sort_by_their_fields_and_refuse_other_classes():
    assert sorted([Label("b", "a"), Label("a", "z"), Label("a", "b")]) == [
        Label("a", "b"),
        Label("a", "z"),
        Label("b", "a"),
    ]
    assert Digest("aa", 9) < Digest("ab", 1) <= Digest("ab", 1) < Digest("ab", 2)
    assert Digest("ab", 2) > Digest("ab", 1) >= Digest("ab", 1)
    with pytest.raises(TypeError):
        _ = Label("a", "b") < Digest("aa", 1)


@pytest.mark.fast
def test_descriptive_fields_stay_out_of_equality():
    """An action's label, mnemonic, tags and sources never reach its key or its equality, nor
    do the workspace's bookkeeping fields."""
    a = Action(("true",), outputs=["o"], label="//:a", mnemonic="A", tags=["x"])
    b = Action(("true",), outputs=["o"], label="//:b", mnemonic="B", sources=(("p", "/q"),))
    assert a == b and hash(a) == hash(b) and a.key() == b.key()
    assert Action(("true",), outputs=["o"], salt="s") != a
    w = Workspace(Path("/w"))
    assert w == w.replace(store_from="--store", digest_function_explicit=True)
    assert w != w.replace(jobs=w.jobs + 1)


@pytest.mark.fast
def test_replace_goes_through_init_and_refuses_unknown_fields():
    a = Action(("true",), outputs=["o"])
    moved = a.replace(outputs=["z", "y", "z"])
    assert moved.outputs == ("y", "z")  # NB: normalised, as construction does
    assert moved.argv == a.argv and moved != a
    r = ActionResult(0, (OutputFile("o", D1),)).replace(cacheable=False)
    assert r.cacheable is False and r.outputs == (OutputFile("o", D1),)
    with pytest.raises(TypeError):
        a.replace(nope=1)
    with pytest.raises(Exception, match="empty argv"):
        a.replace(argv=())


@pytest.mark.fast
def test_mutable_values_compare_by_fields_but_do_not_hash():
    o = Outcome("a", "hit", D1)
    assert o == Outcome("a", "hit", D1) and o != Outcome("a", "executed", D1)
    o.status = "executed"
    assert o.status == "executed" and o.why == [] and o.why is not Outcome("b", "x").why
    with pytest.raises(TypeError):
        hash(o)


@pytest.mark.fast
def test_defaults_are_fresh_per_instance():
    a, b = ActionResult(0), ActionResult(0)
    assert a.host == {} and a.host is not b.host and a.timing is not b.timing
