"""Agents as users of a campaign (issue 21, items 2 and 3): the session handoff (a brief in a
fresh folder, one dispatch, one bind, usage and transcript recorded, rounds per session) and
knowledge capture (retrieval within a budget, recorded with what the budget cut, referenced by
the next round). All in process: nothing here builds a round."""

from __future__ import annotations

import hashlib
import json
import sys
from importlib import util
from pathlib import Path

import pytest

from rsi.errors import DeclarationError, UsageError
from rules.campaign import CampaignClosed, Campaigns, _generate, state_of

REPO = Path(__file__).resolve().parents[1]
SOFTMAX = REPO / "tasks" / "softmax"
sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_campaign import CANDIDATES, NAIVE, TASK_BUILD  # noqa: E402

pytestmark = pytest.mark.fast
C = "//tasks/sm:campaign"
TASK_MD = "# sm\n\nRow-wise softmax.\n\n" + "\n\n".join(
    f"## Note {i}\n\nThe row loop is slow; vectorise the max and the sum. Paragraph {i} "
    + "padding words " * 12
    for i in range(8)
)


def workspace(tmp_path: Path, make_workspace, knowledge: str = "") -> Path:
    build = TASK_BUILD.replace(
        'baseline = "baseline"\n', 'baseline = "baseline"\ndocs = ["TASK.md"]\n'
    )
    campaign = (
        f'\n[campaign]\nrule = "campaign"\nbinding = ":small"\nrounds = {{up_to = 4}}\n{knowledge}'
    )
    files = {
        "tasks/sm/BUILD.toml": build + campaign,
        "tasks/sm/TASK.md": TASK_MD,
        "tasks/sm/notes/team.md": "# Team notes\n\nnp.exp with out= avoids a temporary.\n",
        "tasks/sm/oracle.py": (SOFTMAX / "oracle.py").read_bytes(),
        "tasks/sm/workloads.py": (SOFTMAX / "workloads.py").read_bytes(),
        "tasks/sm/baseline/kernel.py": NAIVE,
    }
    for name, text in CANDIDATES.items():
        files[f"cands/{name}/kernel.py"] = text
    return make_workspace(tmp_path, files)


def service(ws: Path) -> Campaigns:
    from rsi.workspace import Workspace

    return Campaigns(Workspace.load(ws), clock=lambda: 1000.0)


def entries(svc: Campaigns) -> list[dict]:
    return svc.open(C).log.read()


def test_a_second_bind_of_a_dispatch_is_refused_and_rounds_name_their_session(
    tmp_path, make_workspace
):
    from rules.campaign import agents

    ws = workspace(tmp_path, make_workspace)
    svc = service(ws)
    work = tmp_path / "agent1"
    doc = agents.prepare(svc.open(C), work, note="first try")
    brief = (work / "BRIEF.md").read_text()
    assert doc["dispatch"] in brief and "kernel.py" in brief and "rsi round" in brief
    assert "Row-wise softmax" in brief and "--session " + doc["dispatch"] in brief
    assert (work / "candidate" / "kernel.py").read_text() == NAIVE
    assert json.loads((work / "brief.json").read_text())["brief_sha256"] == doc["brief_sha256"]
    with pytest.raises(UsageError, match="fresh"):
        agents.prepare(svc.open(C), work)  # NB: a used folder is never overwritten
    d = doc["dispatch"]

    # NB: a round may only name a dispatch that a session took
    with pytest.raises(UsageError, match="not bound"):
        svc.add(C, ws / "cands" / "vectorised", session=d)
    bound = agents.bind(svc.open(C), d, "sess-A", model="model-x", host="host-h")
    assert bound["bound"]["session"] == "sess-A" and bound["bound"]["model"] == "model-x"
    log = svc.open(C).log.path
    before = log.read_bytes()
    with pytest.raises(CampaignClosed) as refused:
        agents.bind(svc.open(C), d, "sess-B", model="model-y")
    assert refused.value.code == "dispatch_bound" and "sess-A" in refused.value.message
    assert log.read_bytes() == before  # NB: the refusal appended nothing
    with pytest.raises(UsageError, match="no dispatch"):
        agents.bind(svc.open(C), "d-nope", "sess-C")

    added = svc.add(C, ws / "cands" / "vectorised", session=d)
    svc.add(C, ws / "cands" / "wrong")  # NB: a round that names no session
    svc.add(C, ws / "cands" / "inplace", session=d)
    cands = [e for e in entries(svc) if e["kind"] == "candidate"]
    assert [c.get("session") for c in cands] == [d, None, d] and added["round"] == 1
    rec = agents.record(
        svc.open(C), d, usage={"calls": 3, "tokens": {"input": 10}}, transcript=b"transcript"
    )
    assert rec["records"][0]["rounds"] == [1, 3]
    digest = "sha256:" + hashlib.sha256(b"transcript").hexdigest()
    assert rec["records"][0]["transcript"] == digest
    sessions = agents.sessions_document(svc.open(C))
    assert sessions["sessions"][0]["rounds"] == [1, 3]
    assert sessions["rounds_without_session"] == [2]

    # NB: the round targets carry the session into their document (and the report)
    camp = svc.open(C)
    targets = {
        t.name: t
        for t in _generate(camp.label, dict(camp.target.attrs), {"store": str(camp.log.store_root)})
    }
    assert targets["campaign.round-1"].attrs["session"] == {
        "dispatch": d,
        "session": "sess-A",
        "model": "model-x",
    }
    assert targets["campaign.round-2"].attrs["session"] == {}
    report = _harness("report")
    rows = [
        {"round": 1, "verdict": "PASS", "session": targets["campaign.round-1"].attrs["session"]},
        {"round": 2, "verdict": "FAIL", "session": None},
        {"round": 3, "verdict": "FAIL", "session": targets["campaign.round-3"].attrs["session"]},
    ]
    per = report.sessions_of(rows, [])
    assert [(s["session"], s["rounds"]) for s in per] == [("sess-A", [1, 3]), (None, [2])]


def _harness(stem: str):
    spec = util.spec_from_file_location(f"rsi_test_{stem}", REPO / "rules/harness" / f"{stem}.py")
    module = util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_knowledge_is_retrieved_within_its_budget_and_what_was_cut_is_recorded(
    tmp_path, make_workspace
):
    from rsi.digest import Digest
    from rules.campaign.consult import query_knowledge

    ws = workspace(
        tmp_path,
        make_workspace,
        'knowledge = {sources = ["docs", "evidence", "notes/"], budget_chars = 2000}\n',
    )
    svc = service(ws)
    doc = query_knowledge(svc.open(C), "vectorise the row loop max sum", budget_chars=300)
    assert doc["budget_chars"] == 300 and doc["used_chars"] <= 300
    assert doc["returned"] and doc["cut"], doc  # NB: eight matching notes do not fit in 300
    for item in doc["returned"]:
        assert hashlib.sha256(item["text"].encode()).hexdigest() == item["sha256"]
    for item in doc["cut"]:
        assert "text" not in item and item["sha256"] and "budget" in item["why"]
    sources = {s["source"]: s for s in doc["sources"]}
    assert sources["docs:TASK.md"]["sha256"] == hashlib.sha256(TASK_MD.encode()).hexdigest()
    assert "file:tasks/sm/notes/team.md" in sources
    assert "never claims the agent used it" in doc["note"]
    # NB: the record is a blob of the store, named by a log entry
    from rsi.runtime import open_store

    camp = svc.open(C)
    stored = json.loads(open_store(camp.ws).read_bytes(Digest.parse(doc["record"])))
    assert stored["cut"] == doc["cut"] and stored["query"] == doc["query"]
    logged = [e for e in entries(svc) if e["kind"] == "knowledge"]
    assert logged[0]["record"] == doc["record"] and logged[0]["cut"] == len(doc["cut"])
    # NB: a caller may ask for less than the declared budget, never more
    assert query_knowledge(camp, "vectorise", budget_chars=10**6)["budget_chars"] == 2000
    with pytest.raises(UsageError):
        query_knowledge(camp, "   ")

    svc.add(C, ws / "cands" / "vectorised")
    svc.add(C, ws / "cands" / "wrong")
    cands = [e for e in entries(svc) if e["kind"] == "candidate"]
    records = [e["record"] for e in entries(svc) if e["kind"] == "knowledge"]
    assert cands[0]["knowledge"] == records and "knowledge" not in cands[1]
    targets = {
        t.name: t
        for t in _generate(camp.label, dict(camp.target.attrs), {"store": str(camp.log.store_root)})
    }
    assert targets["campaign.round-1"].attrs["knowledge"] == records
    assert targets["campaign.round-2"].attrs["knowledge"] == []


def test_knowledge_switched_off_is_refused_and_switching_it_is_a_new_campaign(
    tmp_path, make_workspace
):
    from rules.campaign.consult import query_knowledge

    ws = workspace(tmp_path, make_workspace, "knowledge = {enabled = false}\n")
    svc = service(ws)
    svc.add(C, ws / "cands" / "vectorised")
    before = svc.open(C).log.path.read_bytes()
    with pytest.raises(CampaignClosed) as off:
        query_knowledge(svc.open(C), "vectorise")
    assert off.value.code == "knowledge_disabled"
    assert svc.open(C).log.path.read_bytes() == before
    start = state_of(entries(svc)).start
    assert start["knowledge"]["enabled"] is False
    build = ws / "tasks/sm/BUILD.toml"
    build.write_text(build.read_text().replace("enabled = false", "enabled = true"))
    with pytest.raises(DeclarationError, match="knowledge"):
        query_knowledge(service(ws).open(C), "vectorise")
    with pytest.raises(DeclarationError, match="knowledge"):
        service(ws).add(C, ws / "cands" / "wrong")
