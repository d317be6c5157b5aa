"""`rsi mcp` (issue 21, item 1): the campaign API over the Model Context Protocol, driven by the
SDK's own client over stdio — three rounds and a final on a small numpy task, malformed calls
that are clear tool errors and leave the campaign's log byte for byte as it was, and the
TASK.md and evidence resources. Round 2 is a fast candidate that reads the caller's frames:
the referee judges it on its numbers, the review fails it, and it is never selected."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOFTMAX = REPO / "tasks" / "softmax"
sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_campaign import CANDIDATES, NAIVE, TASK_BUILD  # noqa: E402

mcp = pytest.importorskip("mcp")

FRAMES = (
    CANDIDATES["inplace"]
    .replace(
        "import numpy as np\n",
        "import sys\nimport numpy as np\n",
    )
    .replace(
        "    e = x - x.max",
        "    caller = sys._getframe(1)\n    _ = caller.f_locals.get('expected')\n    e = x - x.max",
    )
)
CAMPAIGN = """
[campaign]
rule = "campaign"
binding = ":small"
rounds = {up_to = 3}
knowledge = {budget_chars = 400}
"""
TASK_MD = """# sm

Row-wise softmax over the last axis.

## Hints

Vectorise over rows: a per-row Python loop is slow. Subtract the row max for stability.

## Tolerances

float32 within 1e-6 absolute.
"""


def workspace(tmp_path: Path, make_workspace) -> Path:
    build = TASK_BUILD.replace(
        'baseline = "baseline"\n', 'baseline = "baseline"\ndocs = ["TASK.md"]\n'
    )
    return make_workspace(
        tmp_path,
        {
            "tasks/sm/BUILD.toml": build + CAMPAIGN,
            "tasks/sm/TASK.md": TASK_MD,
            "tasks/sm/oracle.py": (SOFTMAX / "oracle.py").read_bytes(),
            "tasks/sm/workloads.py": (SOFTMAX / "workloads.py").read_bytes(),
            "tasks/sm/baseline/kernel.py": NAIVE,
        },
    )


def log_bytes(ws: Path) -> bytes:
    logs = list((ws / "cache" / "campaigns").glob("*/log.jsonl"))
    return logs[0].read_bytes() if logs else b""


@pytest.mark.e2e
def test_an_mcp_client_runs_three_rounds_and_a_final(tmp_path, make_workspace, rsi_argv):
    import anyio
    from mcp import ClientSession, StdioServerParameters, stdio_client

    ws = workspace(tmp_path, make_workspace)
    c = "//tasks/sm:campaign"
    env = dict(os.environ, RSI_HOST_LOCK=str(tmp_path / "host.lock"))
    params = StdioServerParameters(
        command=rsi_argv[0], args=[*rsi_argv[1:], "mcp"], env=env, cwd=str(ws)
    )
    seen: dict = {}

    async def call(session, name, args, *, error=False):
        res = await session.call_tool(name, args, read_timeout_seconds=300)
        text = " ".join(getattr(b, "text", "") for b in res.content)
        assert res.is_error is error, (name, text)
        if error:
            # NB: errors are data: the CLI's rsi.error/1 document, as structured content
            doc = res.structured_content
            assert doc["schema"] == "rsi.error/1" and doc["tool"] == name, doc
            assert set(doc["error"]) == {"code", "message", "hint", "retryable"}, doc
            assert json.loads(text) == doc
        return text if error else res.structured_content

    async def main():
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                names = {t.name for t in (await session.list_tools()).tools}
                assert {"describe_task", "submit_round", "status", "best", "final"} <= names
                assert {"report", "knowledge"} <= names
                desc = await call(session, "describe_task", {"campaign": c})
                assert "Row-wise softmax" in desc["task_md"]
                assert desc["editable"] == ["kernel.py"] and desc["budget"]["rounds_left"] == 3
                # NB: a pre-flight spends no round and appends nothing
                pre = await call(
                    session,
                    "check_candidate",
                    {"campaign": c, "files": {"kernel.py": "def softmax(x:\n"}},
                )
                assert pre["ok"] is False and pre["counted"] is False
                assert pre["checks"][0]["name"] == "syntax" and pre["checks"][0]["line"] == 1
                assert log_bytes(ws) == b""

                r1 = await call(
                    session,
                    "submit_round",
                    {
                        "campaign": c,
                        "files": {"kernel.py": CANDIDATES["vectorised"]},
                        "hypothesis": "vectorise over rows",
                        "usage": {"calls": 1},
                    },
                )
                seen["r1"] = r1
                before = log_bytes(ws)
                # NB: malformed calls: clear tool errors, nothing appended
                bad = [
                    ("submit_round", {"campaign": "//tasks/sm:nope", "files": {"kernel.py": "x"}}),
                    ("submit_round", {"campaign": c, "files": {"oracle.py": "x = 1\n"}}),
                    ("submit_round", {"campaign": c, "files": {"../kernel.py": "x = 1\n"}}),
                    ("submit_round", {"campaign": c, "files": "kernel.py"}),
                    ("submit_round", {"campaign": c, "files": {}}),
                    ("submit_round", {"campaign": c, "files": {"kernel.py": "x"}, "usage": 3}),
                    ("submit_round", {"campaign": c}),
                    ("retry_round", {"campaign": c, "round": 9}),
                    ("final", {"campaign": c}),
                ]
                errors = [await call(session, n, a, error=True) for n, a in bad]
                assert log_bytes(ws) == before
                assert "nope" in errors[0]
                assert "outside_scope" in errors[1] and "kernel.py" in errors[1]
                assert "bad_path" in errors[2]
                assert "campaign_open" in errors[8]
                # NB: the hint names the MCP tool to call, not a CLI command
                assert "rsi campaign" not in json.loads(errors[8])["error"]["hint"]

                k = await call(
                    session, "knowledge", {"campaign": c, "query": "vectorise rows loop"}
                )
                assert k["returned"] and k["record"]
                seen["k"] = k
                r2 = await call(
                    session,
                    "submit_round",
                    {"campaign": c, "files": {"kernel.py": FRAMES}, "hypothesis": "in place"},
                )
                seen["r2"] = r2
                r3 = await call(
                    session,
                    "submit_round",
                    {"campaign": c, "files": {"kernel.py": CANDIDATES["wrong"]}},
                )
                seen["r3"] = r3
                seen["status"] = await call(session, "status", {"campaign": c})
                seen["best"] = await call(session, "best", {"campaign": c})
                seen["final"] = await call(session, "final", {"campaign": c})
                seen["report"] = await call(session, "report", {"campaign": c})
                task = await session.read_resource("rsi://task/tasks/sm:campaign")
                seen["task_md"] = task.contents[0].text
                digest = r1["evidence"]["verdict"]["digest"]
                blob = await session.read_resource(f"rsi://evidence/{digest}")
                seen["verdict_blob"] = blob.contents[0]

    anyio.run(main)
    r1, r2, r3 = seen["r1"], seen["r2"], seen["r3"]
    assert r1["schema"] == "rsi.round/1" and [r1["round"], r2["round"], r3["round"]] == [1, 2, 3]
    # NB: a loaded host makes a measurement INCONCLUSIVE (host_busy), never a PASS; the review
    # and the selection rule hold whatever the numbers say
    busy = any(x["code"] == "host_busy" for d in (r1, r2) for x in d["reasons"])
    if not busy:
        assert r1["verdict"] == "PASS", (r1["reasons"], r1["speedup"])
        assert r2["verdict"] == "PASS", (r2["reasons"], r2["speedup"])
    assert r1["review"]["verdict"] == "pass"
    assert r1["accepted"] is (r1["verdict"] == "PASS")
    # NB: the referee judges round 2 on its numbers; the review sees the frame introspection
    assert r2["verdict"] in ("PASS", "INCONCLUSIVE"), r2["reasons"]
    assert r2["review"]["verdict"] == "fail" and r2["accepted"] is False
    assert {f["rule"] for f in r2["review"]["findings"]} == {"frame_introspection"}
    assert r2["evidence"]["review"]["digest"]
    # NB: the knowledge retrieved before round 2 is referenced by it (and by no other round)
    assert r2["knowledge"] == [seen["k"]["record"]] and r1["knowledge"] == r3["knowledge"] == []
    assert r3["verdict"] == "FAIL" and r3["accepted"] is False
    best, fin = seen["best"], seen["final"]
    assert fin["state"] == "done"
    if r1["verdict"] == "PASS":
        assert best["state"] == "selected" and best["round"] == 1
        assert fin["final"]["selected"]["round"] == 1
        assert fin["final"]["selected"]["review"] == "pass"
    else:
        # NB: a host_busy measurement is never cached, so after it `best` may have no evidence
        # to select from (unavailable) rather than a selection of none
        assert best["state"] == "none" or (busy and best["state"] == "unavailable"), best
        if busy and fin["final"]["state"] != "no_candidate":
            # NB: round 1's host_busy measurement was not kept; the final measured it again and
            # may select it then, but only round 1 (round 2's review failed, round 3 is a FAIL)
            assert fin["final"]["selected"]["round"] == 1, fin["final"]
            assert fin["final"]["selected"]["review"] == "pass"
        else:
            assert fin["final"]["state"] == "no_candidate"
    rounds = seen["status"]["rounds"]
    assert [r["review"] for r in rounds] == ["pass", "fail", "pass"]
    report = seen["report"]["report"]
    assert [r["review"] for r in report["rounds"]] == ["pass", "fail", "pass"]
    assert "Row-wise softmax" in seen["task_md"]
    blob = seen["verdict_blob"]
    text = getattr(blob, "text", None)
    if text is None:
        import base64

        text = base64.b64decode(blob.blob).decode()
    assert json.loads(text)["verdict"] == r1["verdict"]
