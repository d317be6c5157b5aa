"""The event log does not grow with what did not happen: local cache hits are one
`actions_cached` summary (count + digest of the set) unless listing them is asked for, while
every miss, failure and remote hit keeps its `action_finished` line (docs/events.md)."""

from __future__ import annotations

import hashlib
import io
import json
import time
import uuid
from pathlib import Path

import pytest

from rsi.digest import hit_term, hits_digest
from rsi.events import EventLog

ROWS = [("//:a#C", "//:a", "C", "k/1"), ("//:b#C", "//:b", "C", "k/2")]


def hit_digest(pairs) -> str:
    """The digest docs/events.md defines, from (action, key) pairs, computed here on its own."""
    total = 0
    for action, key in pairs:
        line = f"{action} {key}\n".encode()
        total += int.from_bytes(hashlib.sha256(line).digest(), "big")
    return f"sha256-sum:{total % (1 << 256):064x}"


def _lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line]


@pytest.mark.fast
def test_hits_are_one_summary_with_the_digest_of_the_set():
    out = io.StringIO()
    log = EventLog(None, also=out, progress=False, list_hits=False)
    root = log.emit("build_started")
    log.emit_hits(root, ROWS[:1])
    log.hit(root, "//:b#C", "//:b", "C", "k/2")
    log.emit("action_finished", root, action="//:c#C", cache="miss", status="ok")
    log.summarise_hits(root)
    log.summarise_hits(root)  # NB: nothing since: no second line
    docs = _lines(out.getvalue())
    assert [d["kind"] for d in docs] == ["build_started", "action_finished", "actions_cached"]
    assert docs[1]["action"] == "//:c#C"  # NB: a miss keeps its line
    summary = docs[2]
    assert summary["count"] == 2 and summary["listed"] is False and summary["parent"] == root
    # NB: the digest is of the set: the order hits came in does not change it
    assert summary["digest"] == hit_digest([("//:b#C", "k/2"), ("//:a#C", "k/1")])
    assert summary["digest"] != hit_digest([("//:a#C", "k/1")])


@pytest.mark.fast
def test_listing_hits_writes_each_line_and_marks_the_summary_listed():
    out = io.StringIO()
    log = EventLog(None, also=out, progress=False, list_hits=True)
    root = log.emit("build_started")
    log.emit_hits(root, ROWS[:1])
    log.hit(root, "//:b#C", "//:b", "C", "k/2")
    log.summarise_hits(root)
    docs = _lines(out.getvalue())
    hits = [d for d in docs if d["kind"] == "action_finished"]
    assert [(d["action"], d["cache"], d["key"]) for d in hits] == [
        ("//:a#C", "hit", "k/1"),
        ("//:b#C", "hit", "k/2"),
    ]
    summary = docs[-1]
    assert summary["kind"] == "actions_cached" and summary["listed"] is True
    assert summary["count"] == 2 and summary["digest"] == hit_digest(
        [("//:a#C", "k/1"), ("//:b#C", "k/2")]
    )


@pytest.mark.fast
def test_the_environment_opts_in(monkeypatch):
    monkeypatch.setenv("RSI_EVENTS_HITS", "1")
    assert EventLog(None, progress=False).list_hits is True
    monkeypatch.delenv("RSI_EVENTS_HITS")
    assert EventLog(None, progress=False).list_hits is False


@pytest.mark.fast
def test_a_summary_the_caller_knows_is_taken_as_it_is():
    """The state's kept sum stands for its rows (they are not read); rsi.digest's terms are
    those the docs define."""
    out = io.StringIO()
    log = EventLog(None, also=out, progress=False, list_hits=False)
    root = log.emit("build_started")
    total = sum(hit_term(r[0], r[3]) for r in ROWS)
    log.emit_hits(root, iter(()), summary=(2, total))
    log.summarise_hits(root)
    doc = _lines(out.getvalue())[-1]
    assert doc["count"] == 2 and doc["digest"] == hits_digest(total)
    assert doc["digest"] == hit_digest([(r[0], r[3]) for r in ROWS])


# ============================================================================ the real CLI


@pytest.fixture
def fanin(command, make_workspace, tmp_path):
    """leaf_a, leaf_b -> top."""
    return make_workspace(
        tmp_path,
        {
            "in/a.txt": "alpha\n",
            "in/b.txt": "bravo\n",
            "BUILD.toml": command(
                "leaf_a", cmd="cat $(SRCS) > $(OUT)", srcs=["in/a.txt"], outs=["a.out"]
            )
            + command("leaf_b", cmd="cat $(SRCS) > $(OUT)", srcs=["in/b.txt"], outs=["b.out"])
            + command(
                "top",
                cmd="cat $(location :leaf_a) $(location :leaf_b) > $(OUT)",
                deps=[":leaf_a", ":leaf_b"],
                outs=["top.out"],
            ),
        },
    )


def _plain(run_rsi, ws: Path, *args: str) -> list[dict]:
    """`rsi build --events FILE ARGS` as a user runs it (hits not listed): its events."""
    path = ws.parent / f"events-{uuid.uuid4().hex[:12]}.jsonl"
    run = run_rsi(ws, "build", "--events", str(path), *args)
    assert run.returncode == 0, str(run)
    return _lines(path.read_text())


def _hit_lines(docs: list[dict]) -> list[dict]:
    return [d for d in docs if d["kind"] == "action_finished" and d["cache"] == "hit"]


def _summary(docs: list[dict]) -> dict:
    found = [d for d in docs if d["kind"] == "actions_cached"]
    assert len(found) == 1, docs
    assert docs[-1]["kind"] == "build_finished" and docs[-2] is found[0]
    return found[0]


@pytest.mark.e2e
@pytest.mark.usefixtures("bwrap")
def test_a_no_op_build_writes_one_summary_for_its_hits(build, run_rsi, fanin):
    build(fanin, "//:top")
    listed = build(fanin, "//:top")  # NB: the test helper lists hits (--events-hits)
    assert listed.cached == {"//:leaf_a", "//:leaf_b", "//:top"}
    plain = _plain(run_rsi, fanin, "//:top")
    assert _hit_lines(plain) == []
    summary = _summary(plain)
    assert summary["count"] == 3 and summary["listed"] is False
    want = hit_digest([(d["action"], d["key"]) for d in _hit_lines(listed.events)])
    assert summary["digest"] == want
    assert _summary(listed.events)["listed"] is True
    assert plain[-1]["counts"]["cached"] == 3
    doc = run_rsi(fanin, "why", "//:top", "--json").json()
    assert doc["fully_cached"] is True and doc["cached"] == 3, doc


@pytest.mark.e2e
@pytest.mark.usefixtures("bwrap")
def test_what_ran_keeps_its_lines_and_the_hits_around_it_are_summarised(build, run_rsi, fanin):
    _plain(run_rsi, fanin, "//:leaf_b")
    # NB: no state for //:top yet: leaf_b is a hit the scheduler finds, the others run
    docs = _plain(run_rsi, fanin, "//:top")
    ran = {d["action"] for d in docs if d["kind"] == "action_finished"}
    assert ran == {"//:leaf_a#Command", "//:top#Command"}
    assert all(d["cache"] == "miss" for d in docs if d["kind"] == "action_finished")
    assert _summary(docs)["count"] == 1
    time.sleep(1.1)  # NB: past the racy window, so the change below is seen by its mtime
    (fanin / "in" / "a.txt").write_text("alpha two\n")
    # NB: served by the state: leaf_b is vouched for, leaf_a and top run again
    docs = _plain(run_rsi, fanin, "//:top")
    ran = {d["action"] for d in docs if d["kind"] == "action_finished"}
    assert ran == {"//:leaf_a#Command", "//:top#Command"}
    changed = _summary(docs)
    assert changed["count"] == 1
    doc = run_rsi(fanin, "why", "//:top", "--json").json()
    assert doc["cached"] == 1 and {a["action"] for a in doc["ran"]} == ran, doc
    # NB: the state's kept sum follows the keys that changed: the digests are those of the
    # hits as listed
    listed = _hit_lines(build(fanin, "//:top").events)
    keys = {d["action"]: d["key"] for d in listed}
    assert changed["digest"] == hit_digest([("//:leaf_b#Command", keys["//:leaf_b#Command"])])
    assert _summary(_plain(run_rsi, fanin, "//:top"))["digest"] == hit_digest(keys.items())
