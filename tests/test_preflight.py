"""A candidate's pre-flight (issue 32, item 3): `rsi candidate check` runs the cheap checks a
round would fail on — syntax, import, entry point, signature — in the sandbox, appends nothing
to the campaign's log, spends no round, never calls the entry, and is rate-limited."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_campaign import CANDIDATES, NAIVE, TASK_BUILD  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SOFTMAX = REPO / "tasks" / "softmax"
CAMPAIGN = '[campaign]\nrule = "campaign"\nbinding = ":small"\nrounds = {up_to = 3}\n'

BAD = {
    "syntax": ("def softmax(x):\n    return (x\n", "syntax", 2),
    "import_error": ("import numpy as np\nimport no_such_module_here\n", "import", 2),
    "raises_at_import": ("x = 1\nraise RuntimeError('boom')\n", "import", 2),
    "no_entry": ("import numpy as np\n\ndef soft_max(x):\n    return x\n", "entry", None),
    "wrong_signature": ("def softmax(logits):\n    return logits\n", "signature", None),
    "exits_at_import": ("import os\nos._exit(0)\n", "import", None),
    "not_utf8": (b"x = '\xff'\n", "utf8", None),
}


@pytest.fixture
def ws(tmp_path, make_workspace):
    files = {
        "tasks/sm/BUILD.toml": TASK_BUILD + "\n" + CAMPAIGN,
        "tasks/sm/oracle.py": (SOFTMAX / "oracle.py").read_bytes(),
        "tasks/sm/workloads.py": (SOFTMAX / "workloads.py").read_bytes(),
        "tasks/sm/baseline/kernel.py": NAIVE,
        "good/kernel.py": CANDIDATES["vectorised"],
        # NB: calling the entry would end the process before it answered: a failed check
        "calls/kernel.py": "import os\n\ndef softmax(x):\n    os._exit(0)\n",
    }
    for name, (text, _, _) in BAD.items():
        files[f"bad/{name}/kernel.py"] = text
    return make_workspace(tmp_path, files)


def _log_state(ws: Path) -> list[bytes]:
    return sorted(p.read_bytes() for p in (ws / "cache" / "campaigns").glob("*/log.jsonl"))


@pytest.mark.e2e
def test_a_good_candidate_passes_every_check_and_spends_no_round(ws, run_rsi):
    run = run_rsi(ws, "candidate", "check", "//tasks/sm:campaign", "--from", "good", "--json")
    assert run.returncode == 0, run
    doc = json.loads(run.stdout)
    assert doc["schema"] == "rsi.candidate.check/1" and doc["ok"] is True
    assert doc["counted"] is False and doc["state"] == "checked"
    assert [c["name"] for c in doc["checks"]] == ["syntax", "import", "entry", "signature"]
    assert all(c["ok"] for c in doc["checks"])
    assert doc["rate"]["used"] == 1
    assert _log_state(ws) == []  # NB: nothing appended: no start, no candidate
    status = run_rsi(ws, "campaign", "status", "//tasks/sm:campaign", "--json")
    assert json.loads(status.stdout)["budget"]["rounds_used"] == 0


@pytest.mark.e2e
@pytest.mark.parametrize("name", sorted(BAD))
def test_each_cheap_failure_is_named_with_its_file_and_line(ws, run_rsi, name):
    _, check, line = BAD[name]
    run = run_rsi(
        ws, "candidate", "check", "//tasks/sm:campaign", "--from", f"bad/{name}", "--json"
    )
    assert run.returncode == 1, run
    doc = json.loads(run.stdout)
    assert doc["ok"] is False and doc["state"] == "checked", doc
    failed = [c for c in doc["checks"] if not c["ok"]]
    assert failed and failed[0]["name"] == check, doc["checks"]
    assert failed[0]["file"] == "kernel.py"
    if line is not None:
        assert failed[0]["line"] == line, failed[0]
    assert _log_state(ws) == []


@pytest.mark.e2e
def test_the_entry_is_never_called(ws, run_rsi):
    run = run_rsi(ws, "candidate", "check", "//tasks/sm:campaign", "--from", "calls", "--json")
    assert run.returncode == 0, run
    assert json.loads(run.stdout)["ok"] is True


@pytest.mark.e2e
def test_past_the_rate_limit_a_check_is_refused_and_nothing_runs(ws, monkeypatch):
    from rsi.workspace import Workspace
    from rules.campaign import preflight as pf
    from rules.campaign.model import CampaignClosed
    from rules.campaign.service import Campaigns

    monkeypatch.setattr(pf, "RATE_LIMIT", 2)
    svc = Campaigns(Workspace.load(ws))
    for _ in range(2):
        assert svc.check("//tasks/sm:campaign", ws / "good")["ok"] is True
    with pytest.raises(CampaignClosed) as info:
        svc.check("//tasks/sm:campaign", ws / "good")
    assert info.value.code == "preflight_rate_limited"
    assert "next is allowed in" in info.value.hint


@pytest.mark.fast
def test_a_file_outside_the_scope_is_a_usage_error_and_writes_nothing(ws, run_rsi):
    (ws / "extra").mkdir()
    (ws / "extra" / "oracle.py").write_text("x = 1\n")
    run = run_rsi(ws, "candidate", "check", "//tasks/sm:campaign", "--from", "extra", "--json")
    assert run.returncode == 2, run
    doc = json.loads(run.stdout)
    assert doc["state"] == "error" and "outside the editable scope" in doc["error"]["message"]
    assert not (ws / "cache" / "campaigns").exists()
