"""Sealed files in sections (rsi.sections): the payload checked when the file is opened, each
section when first read. A file not whole or not as sealed is not read at all; a section
damaged in place after the file was opened raises `CacheDamaged` when read, and a build that
meets one forgets the file and goes again, ending as a build without it would."""

from __future__ import annotations

import json
import os
import pickle

import pytest
import test_event_hits

from rsi import sections
from rsi.analysis_cache import read_sealed_head, write_sealed
from rsi.sharded import ShardedDict, UnorderedShardedDict

fanin = test_event_hits.fanin


class _Store:
    function = "blake3"


VALUES = {f"action-{i}": ["x" * 200, i] for i in range(4000)}


def _write(tmp_path, obj, name="f"):
    path = tmp_path / name
    assert write_sealed(_Store(), path, obj) is not None
    return path


def _sections_of(path) -> list[tuple[int, int]]:
    """(offset, size) of each section of a sectioned file."""
    with open(path, "rb") as f:
        f.readline()
        header = f.readline()
        meta = json.loads(header[len(sections.MAGIC) :])
        at = f.tell() + meta["payload"]
    out = []
    for size, _ in meta["sections"]:
        out.append((at, size))
        at += size
    return out


def _flip(path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))


@pytest.fixture
def small_sections(monkeypatch):
    monkeypatch.setattr(sections, "SECTION_MIN", 64)


@pytest.mark.fast
def test_shards_are_read_when_first_used(tmp_path, small_sections):
    path = _write(tmp_path, {"a": ShardedDict.pack(VALUES), "b": UnorderedShardedDict.pack(VALUES)})
    assert len(_sections_of(path)) > 256  # NB: the shards and the order
    _, got = read_sealed_head(_Store(), path)
    assert got["a"].loaded() == 0 and got["b"].loaded() == 0
    assert all(type(p) is sections.Section for p in got["a"]._shards)
    assert got["a"]["action-7"] == ["x" * 200, 7]
    assert got["a"].loaded() == 1
    assert list(got["a"]) == list(VALUES) and dict(got["b"]) == VALUES


@pytest.mark.fast
@pytest.mark.parametrize("where", ["seal", "header", "payload", "truncated", "longer"])
def test_a_file_not_whole_or_not_as_sealed_is_not_read(tmp_path, small_sections, where):
    path = _write(tmp_path, {"a": ShardedDict.pack(VALUES)})
    first = _sections_of(path)[0][0]
    if where == "seal":
        _flip(path, 0)
    elif where == "header":
        _flip(path, 70)
    elif where == "payload":
        _flip(path, first - 2)
    elif where == "truncated":
        os.truncate(path, path.stat().st_size - 1)
    else:
        with open(path, "ab") as f:
            f.write(b"\0")
    assert read_sealed_head(_Store(), path) == (None, None)


@pytest.mark.fast
def test_a_section_damaged_after_opening_raises_when_read(tmp_path, small_sections):
    path = _write(tmp_path, {"a": ShardedDict.pack(VALUES)})
    _, got = read_sealed_head(_Store(), path)
    for at, size in _sections_of(path):
        _flip(path, at + size // 2)
    with pytest.raises(sections.CacheDamaged) as caught:
        got["a"]["action-1"]
    assert str(path) in str(caught.value)
    # NB: and writing it again raises too, rather than seal the damage into a new file
    with pytest.raises(sections.CacheDamaged):
        write_sealed(_Store(), tmp_path / "again", got)


@pytest.mark.fast
def test_a_file_replaced_after_opening_is_read_as_opened(tmp_path, small_sections):
    path = _write(tmp_path, {"a": ShardedDict.pack(VALUES)})
    _, got = read_sealed_head(_Store(), path)
    other = _write(tmp_path, {"a": ShardedDict.pack({k: "other" for k in VALUES})}, "g")
    os.replace(other, path)
    assert got["a"]["action-3"] == ["x" * 200, 3]


@pytest.mark.fast
def test_unread_sections_pickle_as_their_bytes_and_write_again(tmp_path, small_sections):
    path = _write(tmp_path, {"a": ShardedDict.pack(VALUES)})
    _, got = read_sealed_head(_Store(), path)
    plain = pickle.loads(pickle.dumps(got))
    assert all(type(p) is bytes for p in plain["a"]._shards) and dict(plain["a"]) == VALUES
    again = _write(tmp_path, got, "again")
    _, back = read_sealed_head(_Store(), again)
    assert dict(back["a"]) == VALUES


@pytest.mark.fast
def test_the_file_is_closed_with_its_last_section(tmp_path, small_sections):
    path = _write(tmp_path, {"a": ShardedDict.pack(VALUES)})

    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = fds()
    _, got = read_sealed_head(_Store(), path)
    assert fds() == before + 1
    del got
    assert fds() == before


@pytest.mark.e2e
@pytest.mark.usefixtures("bwrap")
@pytest.mark.parametrize("which", ["state", "analysis"])
def test_a_build_meeting_a_damaged_section_forgets_the_file_and_goes_again(
    fanin, small_sections, which, tmp_path
):
    from rsi import build as build_mod
    from rsi.workspace import Workspace

    ws = Workspace.load(fanin)
    assert build_mod.build(ws, ["//:top"], progress=False).ok
    files = [
        p
        for p in (fanin / "cache" / "analysis").iterdir()
        if (p.name.startswith("state-") if which == "state" else "-" not in p.name)
    ]
    assert files
    for path in files:
        spots = _sections_of(path)
        assert spots, path
        for at, size in spots:
            _flip(path, at + size // 2)
    (fanin / "in" / "a.txt").write_text("alpha 2\n")
    events = tmp_path / "events.jsonl"
    with open(events, "w") as f:
        report = build_mod.build(ws, ["//:top"], progress=False, events_to=f)
    assert report.ok
    assert (fanin / "out" / "top.out").read_text() == "alpha 2\nbravo\n"
    docs = [json.loads(line) for line in events.read_text().splitlines()]
    warned = [d for d in docs if d["kind"] == "warning" and "damaged" in d["message"]]
    assert warned and str(files[0].parent) in warned[0]["message"]
    # NB: the damaged file is gone, and the next build is a no-op again
    assert build_mod.build(ws, ["//:top"], progress=False).counts["executed"] == 0
