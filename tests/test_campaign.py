"""Campaigns: the append-only log, budget and deadline, selection, the final, usage, and scripted
agent loops through a catalog task and through an external project (real sandboxed builds).

The loops keep their measurement policy small (few cases, 6-8 pairs) and their candidates far
apart (a naive row-loop baseline; wrong, broken, unchanged and two clearly faster candidates), so
verdicts are stable on a small shared machine.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from rsi.errors import DeclarationError, UsageError
from rules.campaign import CampaignLog, Policy, State, ended_reason, policy_of

REPO = Path(__file__).resolve().parents[1]
SOFTMAX = REPO / "tasks" / "softmax"
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "external_project"
# NB: conftest's helpers arrive as fixtures (another folder's conftest may own the module name);
# this autouse fixture hands them to the module-level helpers below.
RSI: list[str] = []
make_workspace = run_rsi = read_events = None


@pytest.fixture(autouse=True)
def _cli_helpers(make_workspace, run_rsi, read_events, rsi_argv):
    g = globals()
    g.update(make_workspace=make_workspace, run_rsi=run_rsi, read_events=read_events)
    RSI[:] = rsi_argv


def write_files(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


NAIVE = '''\
"""Softmax over the last axis, one row at a time (a deliberately naive baseline)."""
import numpy as np


def softmax(x):
    rows = x.reshape(-1, x.shape[-1])
    out = np.empty(rows.shape, dtype=x.dtype)
    for i in range(rows.shape[0]):
        r = rows[i].astype(np.float64)
        r = np.exp(r - r.max())
        out[i] = r / r.sum()
    return out.reshape(x.shape)
'''
CANDIDATES = {
    "vectorised": """\
import numpy as np


def softmax(x):
    xf = x.astype(np.float64)
    xf -= xf.max(axis=-1, keepdims=True)
    np.exp(xf, out=xf)
    xf /= xf.sum(axis=-1, keepdims=True)
    return xf.astype(x.dtype)
""",
    "wrong": """\
import numpy as np


def softmax(x):
    e = np.exp(x - x.max(axis=0, keepdims=True))
    return e / e.sum(axis=0, keepdims=True)
""",
    "syntax": "import numpy as np\n\ndef softmax(x:\n    return x\n",
    "unchanged": NAIVE,
    "inplace": """\
import numpy as np


def softmax(x):
    e = x - x.max(axis=-1, keepdims=True)
    np.exp(e, out=e)
    e /= e.sum(axis=-1, keepdims=True)
    return e
""",
}

TASK_BUILD = """\
[task]
rule = "task"
runtime = ["workloads.py", "oracle.py"]
baseline = "baseline"
framework = "numpy"
entry = {module = "kernel", function = "softmax"}
editable = ["kernel.py"]
tolerances = {float32 = {atol = 1e-06, rtol = 1e-05}, float64 = {atol = 1e-12, rtol = 1e-10}}
cases = [
  {name = "normal_f32", shape = [16, 128], dtype = "float32", kind = "normal"},
  {name = "large_f64", shape = [8, 64], dtype = "float64", kind = "large", scale = 10000.0},
  {name = "transposed_f32", shape = [24, 40], dtype = "float32", kind = "transposed"},
  {name = "single_column_f32", shape = [5, 1], dtype = "float32", kind = "normal"},
]

[small]
rule = "binding"
task = ":task"
measure.workload = {name = "bench", shape = [64, 1024], dtype = "float32", kind = "normal"}
measure.warmups = 1
measure.samples = 5
measure.pairs = 16
measure.probes = 16
measure.metric = "latency"
measure.direction = "minimize"
assess = {min_improvement = 0.05, confidence = 0.95, bootstrap_resamples = 500, min_pairs = 5}
"""


def task_workspace(tmp_path: Path, campaign: str) -> Path:
    files: dict[str, str | bytes] = {
        "tasks/sm/BUILD.toml": TASK_BUILD + "\n" + campaign,
        "tasks/sm/oracle.py": (SOFTMAX / "oracle.py").read_bytes(),
        "tasks/sm/workloads.py": (SOFTMAX / "workloads.py").read_bytes(),
        "tasks/sm/baseline/kernel.py": NAIVE,
    }
    for name, text in CANDIDATES.items():
        files[f"cands/{name}/kernel.py"] = text
    return make_workspace(tmp_path, files)


CAMPAIGN = """\
[campaign]
rule = "campaign"
binding = ":small"
rounds = {up_to = 6}
deadline_s = 3600.0
final_reserve_s = 600.0
"""
C = "//tasks/sm:campaign"


def rsi_json(ws: Path, *args: str, expect: int = 0, **kw) -> dict:
    run = run_rsi(ws, *args, "--json", timeout=kw.pop("timeout", 300), **kw)
    assert run.returncode == expect, str(run)
    return run.json()


def usage_file(ws: Path, name: str, doc: dict) -> str:
    path = ws.parent / f"usage-{name}.json"
    path.write_text(json.dumps(doc))
    return str(path)


STABLE = (
    "verdict",
    "reasons",
    "speedup",
    "noise_floor",
    "threshold",
    "correctness",
    "candidate",
    "usage",
    "evidence",
    "state",
    "round",
    "label",
)


# ===================================================================================== the log


@pytest.mark.fast
def test_reader_ignores_a_torn_last_line_and_the_next_append_cuts_it(tmp_path):
    log = CampaignLog(tmp_path, "//p:c")
    with log.locked():
        log.append({"kind": "start", "time": 1.0})
        log.append({"kind": "candidate", "time": 2.0, "digest": "d1"})
    with open(log.path, "ab") as f:
        f.write(b'{"schema":"rsi.campaign.log/1","kind":"candidate","dig')  # a kill mid-write
    assert [e["kind"] for e in log.read()] == ["start", "candidate"]
    with log.locked():
        log.append({"kind": "candidate", "time": 3.0, "digest": "d2"})
    raw = log.path.read_bytes()
    assert raw.endswith(b"\n") and b'"dig\n' not in raw and raw.count(b"\n") == 3
    assert [e.get("digest") for e in log.read()] == [None, "d1", "d2"]


@pytest.mark.fast
def test_a_corrupt_line_inside_the_log_is_an_error_naming_the_file_and_line(tmp_path):
    log = CampaignLog(tmp_path, "//p:c")
    with log.locked():
        log.append({"kind": "start", "time": 1.0})
    with open(log.path, "ab") as f:
        f.write(b"garbage\n")
    with pytest.raises(DeclarationError) as info:
        log.read()
    assert str(log.path) in str(info.value) and "line 2" in str(info.value)


@pytest.mark.e2e
def test_kill_9_during_candidate_add_leaves_each_entry_absent_or_whole(tmp_path):
    ws = task_workspace(tmp_path, CAMPAIGN.replace("up_to = 6", "up_to = 50"))
    rng = random.Random(7)
    for i in range(8):
        cand = ws / "kills" / str(i)
        write_files(cand, {"kernel.py": NAIVE + f"# variant {i}\n"})
        proc = subprocess.Popen(
            [*RSI, "candidate", "add", C, "--from", str(cand)],
            cwd=ws,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(0.2, 0.9))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        entries = CampaignLog(ws / "cache", C).read()  # never raises: no torn entry counts
        for e in entries:
            assert e["kind"] in ("start", "candidate")
            if e["kind"] == "candidate":
                assert set(e["files"]) == {"kernel.py"} and e["digest"]
    added = rsi_json(ws, "candidate", "add", C, "--from", str(ws / "cands" / "inplace"))
    assert added["added"] is True
    raw = (CampaignLog(ws / "cache", C).path).read_bytes()
    assert raw.endswith(b"\n") and all(json.loads(line) for line in raw.splitlines())


# ============================================================================ budget, policy


def _policy(**kw) -> Policy:
    attrs = {
        "rounds": {"up_to": 3},
        "deadline_s": None,
        "final_reserve_s": 0.0,
        "stop_on": None,
        "final_seed": 1,
        **kw,
    }
    return policy_of(attrs, "BUILD.toml", "//p:c")


@pytest.mark.fast
def test_policy_errors_name_the_field_and_what_to_do():
    for kw, field_name in (
        ({"rounds": {"exactly": 3}}, "rounds"),
        ({"rounds": {"exact": 3}, "stop_on": ["rounds", "agent"]}, "stop_on"),
        ({"deadline_s": 10.0, "final_reserve_s": 10.0}, "final_reserve_s"),
        ({"stop_on": ["agent"]}, "stop_on"),
        ({"stop_on": ["rounds", "deadline"]}, "stop_on"),
    ):
        with pytest.raises(DeclarationError) as info:
            _policy(**kw)
        assert info.value.field == field_name and "BUILD.toml" in str(info.value)
    assert _policy(rounds={"exact": 2}).stop_on == ("rounds",)
    assert _policy(deadline_s=5.0).stop_on == ("rounds", "deadline", "agent")


@pytest.mark.fast
def test_rounds_end_by_budget_stop_or_deadline():
    p = _policy(rounds={"up_to": 2}, deadline_s=100.0, final_reserve_s=30.0)
    cand = {"kind": "candidate", "time": 1000.0}
    open_ = State({"time": 1000.0}, (cand,), None)
    assert ended_reason(p, open_) is None and ended_reason(p, open_, now=1069.0) is None
    assert ended_reason(p, open_, now=1070.0) == "deadline"
    assert ended_reason(p, State(None, (cand, cand), None)) == "rounds"
    assert ended_reason(p, State(None, (cand,), {"reason": "agent"})) == "agent"


@pytest.mark.e2e
def test_budget_exhausted_and_deadline_refuse_rounds_with_a_clear_message(tmp_path):
    ws = task_workspace(
        tmp_path,
        CAMPAIGN.replace("up_to = 6", "up_to = 1")
        + CAMPAIGN.replace("[campaign]", "[timed]")
        # NB: 2 s for rounds, then 6 s for the final: room for two rsi calls on a loaded host
        .replace("deadline_s = 3600.0", "deadline_s = 8.0")
        .replace("final_reserve_s = 600.0", "final_reserve_s = 6.0"),
    )
    cands = ws / "cands"
    rsi_json(ws, "candidate", "add", C, "--from", str(cands / "inplace"))
    refused = rsi_json(ws, "candidate", "add", C, "--from", str(cands / "vectorised"), expect=3)
    assert refused["state"] == "refused" and refused["error"]["code"] == "budget_exhausted"
    assert "all 1 rounds" in refused["error"]["message"]
    assert "rsi campaign final" in refused["error"]["hint"]
    again = rsi_json(ws, "candidate", "add", C, "--from", str(cands / "inplace"))
    assert again["added"] is False and again["round"] == 1  # idempotent, costs nothing

    timed = "//tasks/sm:timed"
    first = rsi_json(ws, "candidate", "add", timed, "--from", str(cands / "inplace"))
    left = first["budget"]["seconds_left_for_rounds"]
    assert left <= 2.0
    time.sleep(left + 0.2)
    late = rsi_json(ws, "candidate", "add", timed, "--from", str(cands / "vectorised"), expect=3)
    assert late["error"]["code"] == "deadline_reached"
    assert "final_reserve_s" in late["error"]["message"] and "until" in late["error"]["hint"]
    status = rsi_json(ws, "campaign", "status", timed)
    assert status["budget"]["ended_by"] == "deadline" and status["budget"]["final_allowed"]
    assert status["final"]["state"] in ("not_built", "pending")
    time.sleep(status["budget"]["seconds_left_for_final"] + 0.2)
    past = rsi_json(ws, "campaign", "final", timed, expect=3)
    assert past["error"]["code"] == "deadline_passed"


@pytest.mark.e2e
def test_a_final_is_refused_while_the_campaign_is_open(tmp_path):
    ws = task_workspace(tmp_path, CAMPAIGN.replace("rounds = {up_to = 6}", "rounds = {exact = 3}"))
    rsi_json(ws, "candidate", "add", C, "--from", str(ws / "cands" / "inplace"))
    doc = rsi_json(ws, "campaign", "final", C, expect=3)
    assert doc["error"]["code"] == "campaign_open" and "2 remaining" in doc["error"]["hint"]
    stop = rsi_json(ws, "campaign", "stop", C, expect=3)
    assert stop["error"]["code"] == "stop_not_accepted"
    query = run_rsi(ws, "query", "//tasks/sm:all")
    assert "//tasks/sm:campaign.round-1" in query.stdout
    assert "//tasks/sm:campaign.final" in query.stdout


@pytest.mark.e2e
def test_changing_the_budget_after_the_start_is_refused(tmp_path):
    ws = task_workspace(tmp_path, CAMPAIGN)
    rsi_json(ws, "candidate", "add", C, "--from", str(ws / "cands" / "inplace"))
    build = ws / "tasks" / "sm" / "BUILD.toml"
    build.write_text(build.read_text().replace("up_to = 6", "up_to = 60"))
    doc = rsi_json(ws, "candidate", "add", C, "--from", str(ws / "cands" / "vectorised"), expect=2)
    assert "changed since it started (rounds)" in doc["error"]["message"]


@pytest.mark.e2e
def test_the_judge_is_fixed_at_the_start_and_a_change_refuses_rounds_and_the_final(tmp_path):
    ws = task_workspace(tmp_path, CAMPAIGN)
    cands, build = ws / "cands", ws / "tasks" / "sm" / "BUILD.toml"
    rsi_json(ws, "campaign", "start", C)
    judge = CampaignLog(ws / "cache", C).read()[0]["judge"]
    assert set(judge["spec"]) == {"spec.json", "check_spec.json"}
    assert set(judge["runtime"]) == {"tasks/sm/oracle.py", "tasks/sm/workloads.py"}
    assert set(judge["baseline"]) == {"tasks/sm/baseline/kernel.py"}
    assert {"check.py", "measure.py", "assess.py", "selection.py", "final.py"} <= set(
        judge["harness"]
    )

    declared = build.read_text()  # the binding's measurement policy changes after the start
    build.write_text(declared.replace("measure.pairs = 16", "measure.pairs = 17"))
    refused = rsi_json(ws, "candidate", "add", C, "--from", str(cands / "inplace"), expect=2)
    assert refused["error"]["code"] == "judge_changed"
    assert "spec spec.json changed (measure.pairs)" in refused["error"]["message"]
    assert "new campaign" in refused["error"]["hint"] and "restore" in refused["error"]["hint"]
    status = rsi_json(ws, "campaign", "status", C)
    assert status["judge"]["state"] == "changed"
    assert any("measure.pairs" in w for w in status["warnings"])
    assert not CampaignLog(ws / "cache", C).read()[1:]  # nothing was appended

    build.write_text(declared)  # restored: the campaign goes on
    assert rsi_json(ws, "candidate", "add", C, "--from", str(cands / "inplace"))["added"]
    oracle = ws / "tasks" / "sm" / "oracle.py"
    oracle.write_text(oracle.read_text() + "# an edit to the task\n")
    for args in (
        ("round", C, "--round", "1"),
        ("campaign", "final", C),
        ("campaign", "abandon", C, "--round", "1", "--reason", "x"),
    ):
        doc = rsi_json(ws, *args, expect=2)
        assert doc["error"]["code"] == "judge_changed", args
        assert "task runtime file tasks/sm/oracle.py changed" in doc["error"]["message"], args
    assert rsi_json(ws, "campaign", "status", C)["judge"]["changes"] == [
        "task runtime file tasks/sm/oracle.py changed"
    ]


@pytest.mark.fast
def test_judge_changes_name_the_part_and_the_file():
    from rules.campaign.judging import judge_changes

    was = {
        "binding": "//p:b",
        "spec": {"spec.json": "a/1"},
        "runtime": {"p/oracle.py": "b/1"},
        "baseline": {"p/baseline/k.py": "c/1"},
        "harness": {"check.py": "d/1"},
    }
    now = {
        "binding": "//p:b",
        "spec": {"spec.json": "a/1"},
        "runtime": {"p/oracle.py": "b/1"},
        "baseline": {"p/baseline/k.py": "c/1", "p/baseline/x.py": "e/1"},
        "harness": {"check.py": "f/1"},
    }
    assert judge_changes(was, was) == []
    changes = judge_changes(was, now)
    assert changes[0] == "baseline file p/baseline/x.py was added"
    assert changes[1].startswith("harness script ") and changes[1].endswith("check.py changed")


@pytest.mark.e2e
def test_a_faulting_round_ends_in_the_error_state_and_abandoning_unblocks_the_final(tmp_path):
    ws = task_workspace(tmp_path, CAMPAIGN.replace("up_to = 6", "up_to = 3"))
    (ws / "tasks" / "sm" / "workloads.py").write_text("raise RuntimeError('broken task')\n")
    inplace = str(ws / "cands" / "inplace")
    faulted = rsi_json(
        ws, "round", C, "--from", inplace, "--usage", usage_file(ws, "r1", {"calls": 2}), expect=1
    )  # a harness fault, three times: the round ends in the error state
    assert faulted["state"] == "error" and not faulted["retryable"]
    rsi_json(ws, "candidate", "add", C, "--from", str(ws / "cands" / "vectorised"))
    status = rsi_json(ws, "campaign", "status", C)
    first, second = status["rounds"]
    assert first["state"] == "error" and not first["retryable"]
    assert "broken task" in first["last_attempt"]["message"]
    assert first["abandoned"]["reason"].startswith("error: an infrastructure fault in 3 attempts")
    assert second["state"] == "not_built" and second["last_attempt"] is None

    again = rsi_json(ws, "campaign", "abandon", C, "--round", "1", "--reason", "twice")
    assert not again["abandoned_now"] and again["reason"].startswith("error:")
    assert CampaignLog(ws / "cache", C).read()[-1]["kind"] == "candidate"
    assert (
        rsi_json(ws, "campaign", "abandon", C, "--round", "9", "--reason", "x", expect=2)["error"][
            "code"
        ]
        == "UsageError"
    )
    closed = rsi_json(ws, "round", C, "--round", "1", expect=3)
    assert closed["error"]["code"] == "round_abandoned"
    back = rsi_json(ws, "candidate", "add", C, "--from", inplace)  # given up on: a new round
    assert back["added"] and back["round"] == 3
    status = rsi_json(ws, "campaign", "status", C)
    assert [r["state"] for r in status["rounds"]] == ["error", "not_built", "not_built"]
    assert status["budget"]["rounds_used"] == 3 and status["budget"]["ended_by"] == "rounds"
    assert status["counts"]["abandoned"] == 1 and status["usage"]["totals"]["calls"] == 2

    blocked = rsi_json(ws, "campaign", "final", C, expect=1)  # rounds 2 and 3 fault too
    assert blocked["state"] == "failed" and blocked["retryable"]
    assert rsi_json(ws, "campaign", "status", C)["final"]["state"] == "failed_retryable"
    for n in ("2", "3"):
        rsi_json(ws, "campaign", "abandon", C, "--round", n, "--reason", "same fault")
    final = rsi_json(ws, "campaign", "final", C)
    assert final["state"] == "done" and final["final"]["state"] == "no_candidate"
    report = json.loads(Path(final["report"]["report.json"]["path"]).read_text())
    assert [a["round"] for a in report["abandoned"]] == [1, 2, 3] and report["rounds"] == []
    assert report["counts"]["abandoned"] == 3 and report["usage"]["totals"]["calls"] == 2
    assert "| 1 | abandoned |" in Path(final["report"]["report.md"]["path"]).read_text()
    status = rsi_json(ws, "campaign", "status", C)
    assert status["final"]["state"] == "no_candidate" and status["best"]["state"] == "none"


@pytest.mark.fast
def test_an_abandoned_round_is_never_selected_but_counts_against_the_budget(tmp_path):
    from rsi.digest import digest_bytes
    from rsi.label import Label
    from rules.campaign import _generate

    log = CampaignLog(tmp_path, C)
    files = {"kernel.py": str(digest_bytes(b"k"))}
    with log.locked():
        for n in (1, 2):
            log.append({"kind": "candidate", "time": float(n), "digest": f"d{n}", "files": files})
        log.append({"kind": "abandon", "time": 3.0, "round": 1, "reason": "keeps faulting"})
    attrs = {
        "binding": Label.parse("//tasks/sm:small"),
        "rounds": {"up_to": 2},
        "deadline_s": None,
        "final_reserve_s": 0.0,
        "stop_on": None,
        "final_seed": 1,
    }
    targets = {t.name: t for t in _generate(Label.parse(C), attrs, {"store": str(tmp_path)})}
    assert {"campaign.round-1", "campaign.round-2"} <= set(targets)
    assert targets["campaign.best"].attrs["rounds"] == ["//tasks/sm:campaign.round-2"]
    assert targets["campaign.final"].attrs["rounds_used"] == 2  # it still used the budget
    assert targets["campaign.final"].attrs["ended"] == "rounds"
    assert [a["round"] for a in targets["campaign.report"].attrs["abandoned"]] == [1]


GPU_BUILD = TASK_BUILD.replace('framework = "numpy"', 'framework = "torch"') + TASK_BUILD.split(
    "[small]"
)[1].join(["\n[gpu]", ""]).replace(
    'task = ":task"', 'task = ":task"\ndevice = "cuda"\naccelerator = "nvidia-h200"'
)


@pytest.mark.e2e
@pytest.mark.usefixtures("torch")  # analysing a torch task needs torch
def test_campaign_bookkeeping_actions_never_ask_for_an_accelerator(tmp_path):
    from rsi.analysis import analyze
    from rsi.digest import digest_bytes
    from rsi.label import Label
    from rsi.loader import Loader
    from rsi.registry import load_rules

    campaigns = "".join(
        f'[{name}]\nrule = "campaign"\nbinding = ":gpu"\nrounds = {{up_to = {n}}}\n\n'
        for name, n in (("open", 2), ("done", 1))
    )
    ws = make_workspace(
        tmp_path,
        {
            "tasks/sm/BUILD.toml": GPU_BUILD + "\n" + campaigns,
            "tasks/sm/oracle.py": "",
            "tasks/sm/workloads.py": "",
            "tasks/sm/baseline/kernel.py": NAIVE,
        },
    )
    store = tmp_path / "store"
    for name in ("open", "done"):
        log = CampaignLog(store, f"//tasks/sm:{name}")
        with log.locked():
            log.append(
                {
                    "kind": "candidate",
                    "time": 1.0,
                    "digest": "d1",
                    "files": {"kernel.py": str(digest_bytes(b"k"))},
                }
            )
    labels = [
        Label.parse(f"//tasks/sm:{c}.{t}")
        for c in ("open", "done")
        for t in ("round-1", "best", "final", "report")
    ]
    graph = analyze(
        Loader(ws, load_rules(), {"store": str(store)}), labels, store_put=digest_bytes, settings={}
    )
    platforms: dict[str, list[dict]] = {}
    for spec in graph.actions.values():
        platforms.setdefault(spec.mnemonic, []).append(dict(spec.platform))
    for mnemonic in ("RoundDoc", "Snapshot", "Select", "Report", "FinalPending"):
        assert platforms[mnemonic], mnemonic
        assert all(set(p) == {"toolchain"} for p in platforms[mnemonic]), mnemonic
    for mnemonic in ("Check", "Measure", "BaselineCheck", "Calibrate", "Final"):
        assert all(p.get("accelerator") == "nvidia-h200" for p in platforms[mnemonic]), mnemonic


# ====================================================================================== usage


@pytest.mark.fast
def test_usage_keeps_unknown_values_null_and_a_real_zero(tmp_path):
    from rules.campaign.usage import parse_usage

    path = tmp_path / "u.json"
    path.write_text(json.dumps({"tokens": {"input": 100, "cached": 0}, "device_s": 0.0}))
    u = parse_usage(str(path))
    assert u["tokens"] == {"input": 100, "output": None, "cached": 0}
    assert u["device_s"] == 0.0 and u["calls"] is None and u["wall_s"] is None
    assert parse_usage(None)["tokens"]["input"] is None
    for bad in ({"tokens": {"input": 5, "cached": 9}}, {"calls": -1}, {"calls": 1.5}, {"wall": 3}):
        path.write_text(json.dumps(bad))
        with pytest.raises(UsageError):
            parse_usage(str(path))


def _harness(stem: str):
    from importlib import util

    spec = util.spec_from_file_location(
        f"rsi_test_{stem}", REPO / "rules" / "harness" / f"{stem}.py"
    )
    module = util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.fast
def test_usage_totals_never_double_count_and_stay_null_when_unknown():
    report = _harness("report")
    per_round = [
        {"tokens": {"input": 100, "output": 10, "cached": 40}, "calls": 0},
        {"tokens": {"input": 50, "output": None, "cached": None}, "calls": None},
        {},
    ]
    doc = report.usage_totals(per_round)
    assert doc["totals"]["tokens.input"] == 150  # cached is part of input, never added
    assert doc["totals"]["tokens.cached"] == 40 and doc["unknown_rounds"]["tokens.cached"] == 2
    assert doc["totals"]["calls"] == 0  # a real 0 stays 0
    assert doc["totals"]["device_s"] is None and doc["unknown_rounds"]["device_s"] == 3


# ================================================================================== selection


def _round_doc(n: int, verdict: str, point: float | None, lo: float | None = None) -> dict:
    sp = None if point is None else {"point": point, "lo": lo or point * 0.9, "hi": point * 1.1}
    return {
        "round": n,
        "label": f"//p:c.round-{n}",
        "verdict": verdict,
        "speedup": sp,
        "candidate": {"digest": f"d{n}", "files": {}, "hypothesis": None},
    }


@pytest.mark.fast
def test_best_is_the_highest_paired_improvement_among_pass_rounds_only():
    sel = _harness("selection")
    doc = sel.select(
        [
            _round_doc(1, "PASS", 1.3),
            _round_doc(2, "INCONCLUSIVE", 3.0),
            _round_doc(3, "FAIL", 9.0),
            _round_doc(4, "PASS", 1.6),
            _round_doc(5, "PASS", 1.6, lo=1.5),
        ]
    )
    assert doc["selected"]["round"] == 5  # tie on the point: the higher lower bound
    assert [r["eligible"] for r in doc["considered"]] == [True, False, False, True, True]
    assert (
        sel.select([_round_doc(1, "FAIL", None), _round_doc(2, "INCONCLUSIVE", 2.0)])["selected"]
        is None
    )


# =============================================================================== agent loops


@pytest.mark.e2e
def test_scripted_agent_loop_through_a_catalog_task(tmp_path):
    ws = task_workspace(tmp_path, CAMPAIGN)
    cands = ws / "cands"
    plan = [
        (
            "vectorised",
            "vectorise the row loop",
            {"tokens": {"input": 1200, "output": 300, "cached": 800}, "calls": 2},
        ),
        ("wrong", "normalise once over the batch", None),
        (
            "syntax",
            None,
            {
                "tokens": {"input": 0, "output": 0, "cached": 0},
                "calls": 0,
                "wall_s": 0.0,
                "device_s": 0.0,
            },
        ),
        ("unchanged", "maybe the baseline is fine", None),
        ("inplace", "float32 in place, no temporaries", {"wall_s": 12.5}),
    ]
    docs = {}
    for number, (name, hypothesis, usage) in enumerate(plan, 1):
        args = ["round", C, "--from", str(cands / name)]
        if hypothesis:
            args += ["--hypothesis", hypothesis]
        if usage:
            args += ["--usage", usage_file(ws, name, usage)]
        doc = rsi_json(ws, *args)
        assert doc["schema"] == "rsi.round/1" and doc["round"] == number and doc["added"]
        assert doc["state"] == "done" and doc["cache"] == "miss"
        assert doc["budget"]["rounds_used"] == number and doc["budget"]["rounds_left"] == 6 - number
        assert Path(doc["evidence"]["verdict"]["path"]).is_file()
        docs[name] = doc

    assert docs["vectorised"]["verdict"] == "PASS" and docs["inplace"]["verdict"] == "PASS"
    assert docs["wrong"]["verdict"] == "FAIL"
    assert docs["wrong"]["correctness"]["failure_kind"] == "wrong_output"
    assert docs["syntax"]["verdict"] == "FAIL"
    assert docs["syntax"]["correctness"]["failure_kind"] == "syntax_error"
    assert docs["unchanged"]["verdict"] == "INCONCLUSIVE"
    assert docs["vectorised"]["candidate"]["hypothesis"] == "vectorise the row loop"
    assert docs["syntax"]["usage"]["tokens"]["input"] == 0  # a real 0
    assert docs["wrong"]["usage"]["tokens"]["input"] is None  # unknown

    passed = {n: d["speedup"]["point"] for n, d in docs.items() if d["verdict"] == "PASS"}
    best_name = max(passed, key=passed.get)
    assert docs["inplace"]["best"]["state"] == "selected"
    assert docs["inplace"]["best"]["round"] == docs[best_name]["round"]

    again = rsi_json(ws, "round", C, "--round", "1")
    assert again["cache"] == "hit" and again["added"] is None
    assert again["best"]["n_rounds"] == 5  # the analysis cache saw every append to the log
    assert {k: again[k] for k in STABLE} == {k: docs["vectorised"][k] for k in STABLE}
    resubmitted = rsi_json(ws, "round", C, "--from", str(cands / "wrong"))
    assert resubmitted["added"] is False and resubmitted["round"] == 2
    assert resubmitted["cache"] == "hit"

    status = rsi_json(ws, "campaign", "status", C)
    assert [r["verdict"] for r in status["rounds"]] == [
        "PASS",
        "FAIL",
        "FAIL",
        "INCONCLUSIVE",
        "PASS",
    ]
    assert status["best"]["round"] == docs[best_name]["round"]
    assert status["final"]["state"] == "pending" and status["budget"]["state"] == "open"
    totals, unknown = status["usage"]["totals"], status["usage"]["unknown_rounds"]
    assert totals["tokens.input"] == 1200 and unknown["tokens.input"] == 3
    assert totals["calls"] == 2 and totals["wall_s"] == 12.5 and totals["device_s"] == 0.0

    assert rsi_json(ws, "campaign", "final", C, expect=3)["error"]["code"] == "campaign_open"
    stop = rsi_json(ws, "campaign", "stop", C)
    assert stop["stopped_now"] and stop["budget"]["ended_by"] == "agent"
    write_files(ws / "cands" / "late", {"kernel.py": CANDIDATES["inplace"] + "# again\n"})
    closed = rsi_json(ws, "round", C, "--from", str(ws / "cands" / "late"), expect=3)
    assert closed["error"]["code"] == "campaign_stopped"

    events = ws.parent / "final-events.jsonl"
    final = rsi_json(ws, "campaign", "final", C, "--events", str(events))
    assert final["state"] == "done" and final["cache"] == "miss"
    f = final["final"]
    assert f["state"] == "done" and f["selected"]["round"] == docs[best_name]["round"]
    assert f["verdict"] == "PASS" and f["confirms_selection"]
    assert f["reseeded"]["spec"]["seed"][0] != f["reseeded"]["spec"]["seed"][1]
    assert f["reseeded"]["spec"]["measure.seed"][0] != f["reseeded"]["spec"]["measure.seed"][1]
    ran = [
        e
        for e in read_events(events)
        if e["kind"] == "action_finished" and e.get("cache") == "miss"
    ]
    assert {"Final", "Report"} <= {e["mnemonic"] for e in ran}
    round_keys = {e.get("key") for e in read_events(events) if "round-" in e.get("label", "")}
    assert not round_keys & {e["key"] for e in ran if e["mnemonic"] == "Final"}
    samples = json.loads(Path(final["evidence"]["samples.json"]["path"]).read_text())
    round_samples = json.loads(Path(docs[best_name]["evidence"]["samples"]["path"]).read_text())
    assert samples["pairs"][0]["timed_seeds"] != round_samples["pairs"][0]["timed_seeds"]

    cached = rsi_json(ws, "campaign", "final", C)
    assert cached["cache"] == "hit" and cached["final"] == f
    report = json.loads(Path(cached["report"]["report.json"]["path"]).read_text())
    assert [r["verdict"] for r in report["rounds"]] == [r["verdict"] for r in status["rounds"]]
    assert report["final"]["verdict"] == "PASS"
    assert "## Final" in Path(cached["report"]["report.md"]["path"]).read_text()
    done = rsi_json(ws, "campaign", "status", C)
    assert done["final"]["state"] == "done" and done["final"]["verdict"] == "PASS"


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _wait_for_process(root: int, needle: str, timeout: float = 60) -> list[int]:
    """Pids of `root`'s descendants whose command line contains `needle`, once there are any."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [p for p in _descendants(root) if needle in _cmdline(p)]
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError(f"no {needle} process appeared under {root}")


def _wait_for_event(path: Path, mnemonic: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(
            e["kind"] == "action_started" and e.get("mnemonic") == mnemonic
            for e in read_events_tolerant(path)
        ):
            return
        time.sleep(0.05)
    raise AssertionError(f"{mnemonic} never started")


def read_events_tolerant(path: Path) -> list[dict]:
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


@pytest.mark.e2e
def test_an_infrastructure_fault_is_retried_and_a_kill_9_leaves_the_round_resumable(tmp_path):
    ws = task_workspace(tmp_path, CAMPAIGN)
    run_rsi(ws, "build", "//tasks/sm:small", timeout=300)  # baseline check + A/A, shared
    cands = ws / "cands"

    # 1. the harness dies mid-measurement: no verdict, nothing cached, the round is retryable
    events = ws.parent / "ev1.jsonl"
    proc = subprocess.Popen(
        [*RSI, "round", C, "--from", str(cands / "vectorised"), "--json", "--events", str(events)],
        cwd=ws,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for_event(events, "Measure")
    for pid in _wait_for_process(proc.pid, "measure.py"):
        os.kill(pid, signal.SIGKILL)
    killed = True
    out, err = proc.communicate(timeout=300)
    assert killed, out + err
    doc = json.loads(out)
    # NB: an infrastructure fault is retried within the round (at most twice): it ends with a
    # verdict, and the round's last attempt is its second
    assert doc["state"] == "done" and doc["verdict"] is not None, out + err
    done = rsi_json(ws, "campaign", "status", C)["rounds"][0]
    assert done["state"] == "done" and done["last_attempt"]["attempt"] == 2
    retried = rsi_json(ws, "round", C, "--round", "1")
    assert retried["state"] == "done" and retried["verdict"] == doc["verdict"]

    # 2. `kill -9` of rsi itself mid-round: the entry is logged whole, the next build resumes
    events = ws.parent / "ev2.jsonl"
    proc = subprocess.Popen(
        [*RSI, "round", C, "--from", str(cands / "inplace"), "--json", "--events", str(events)],
        cwd=ws,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _wait_for_event(events, "Measure")
    _wait_for_process(proc.pid, "measure.py")
    children = _descendants(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(1.0)
    left = {p: _cmdline(p) for p in children if _alive(p)}
    assert children and not left, left  # nothing left running
    status = rsi_json(ws, "campaign", "status", C)
    assert [r["state"] for r in status["rounds"]] == ["done", "interrupted"]  # its rsi died
    resumed = rsi_json(ws, "round", C, "--from", str(cands / "inplace"))  # same content
    assert resumed["round"] == 2 and resumed["added"] is False
    assert resumed["state"] == "done" and resumed["verdict"] == "PASS"

    # 3. a final that faults is not cached either: asking again runs it
    rsi_json(ws, "campaign", "stop", C)
    events = ws.parent / "ev3.jsonl"
    proc = subprocess.Popen(
        [*RSI, "campaign", "final", C, "--json", "--events", str(events)],
        cwd=ws,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for_event(events, "Final")
    for pid in _wait_for_process(proc.pid, "measure.py"):
        os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, out + err
    faulted = json.loads(out)
    assert faulted["state"] == "failed" and faulted["retryable"] and faulted["final"] is None
    final = rsi_json(ws, "campaign", "final", C)
    assert final["state"] == "done" and final["cache"] == "miss"
    # NB: the final re-measures with this test's small policy, which can fall short of a PASS
    # on a noisy host; what is asserted here is that it ran again and judged the candidate
    assert final["final"]["verdict"] in ("PASS", "INCONCLUSIVE")


PROJECT_BUILD = """\
[proj]
rule = "external_project"
root = "../../proj"
editable = ["src/work.py"]
protocol = ["bench.py", "quality.py"]
quality_cmd = "python3 quality.py"
quality_field = "ok"
benchmark_cmd = "python3 bench.py"
metric = "seconds"
direction = "minimize"
measure = {pairs = 6}
assess = {min_improvement = 0.05, bootstrap_resamples = 500, min_pairs = 5}

[campaign]
rule = "campaign"
binding = ":proj"
rounds = {exact = 5}
"""
PROJECT_CANDIDATES = {
    "closed_form": "PATTERN = [(i * i) % 7 for i in range(7)]\n\n\n"
    "def compute(n: int) -> int:\n"
    "    return (n // 7) * sum(PATTERN) + sum(PATTERN[: n % 7])\n",
    "wrong": "def compute(n: int) -> int:\n    return sum((i * i) % 5 for i in range(n))\n",
    "syntax": "def compute(n:\n    return 0\n",
    "unchanged": (FIXTURE / "src" / "work.py").read_text(),
    "chunked": "def compute(n: int) -> int:\n    total = 0\n    for _ in range(n // 7):\n"
    "        total += 14\n"
    "    return total + sum((i * i) % 7 for i in range(n - n % 7, n))\n",
}


@pytest.mark.e2e
def test_scripted_agent_loop_through_an_external_project(tmp_path):
    ws = make_workspace(tmp_path, {"tasks/ext/BUILD.toml": PROJECT_BUILD})
    proj = ws / "proj"
    shutil.copytree(FIXTURE, proj)
    original = {
        p.relative_to(proj).as_posix(): p.read_bytes() for p in proj.rglob("*") if p.is_file()
    }
    camp = "//tasks/ext:campaign"
    start = rsi_json(ws, "campaign", "start", camp)
    assert set(start["frozen"]["protocol"]) == {"bench.py", "quality.py"}

    docs = {}
    for number, (name, text) in enumerate(PROJECT_CANDIDATES.items(), 1):
        work = ws.parent / "agent" / name  # a working copy, as an agent would edit it
        shutil.copytree(proj, work)
        (work / "src" / "work.py").write_text(text)
        (work / "notes.txt").write_text("scratch notes, outside the editable scope")
        doc = rsi_json(ws, "round", camp, "--from", str(work))
        assert doc["state"] == "done" and doc["round"] == number, doc
        docs[name] = doc
        if number == 1:  # the project and its judge change after the start: the campaign
            (proj / "bench.py").write_text("print(1.0)\nprint(1.0)\n")  # keeps its frozen ones
            (proj / "src" / "work.py").write_text(PROJECT_CANDIDATES["closed_form"])
            build = ws / "tasks" / "ext" / "BUILD.toml"
            build.write_text(
                build.read_text().replace(
                    'quality_cmd = "python3 quality.py"', 'quality_cmd = "echo {}"'
                )
            )

    assert docs["closed_form"]["verdict"] == "PASS" and docs["chunked"]["verdict"] == "PASS"
    assert docs["wrong"]["verdict"] == "FAIL"
    assert docs["wrong"]["correctness"]["failure_kind"] == "quality_failed"
    assert docs["syntax"]["verdict"] == "FAIL"
    assert docs["syntax"]["correctness"]["failure_kind"] == "quality_command_failed"
    assert docs["unchanged"]["verdict"] == "INCONCLUSIVE"
    assert docs["chunked"]["best"]["round"] == 1  # the closed form is by far the fastest
    assert docs["chunked"]["speedup"]["point"] < docs["closed_form"]["speedup"]["point"]
    assert set(docs["wrong"]["candidate"]["files"]) == {"src/work.py"}  # notes.txt ignored
    samples = json.loads(Path(docs["chunked"]["evidence"]["samples"]["path"]).read_text())
    arm = samples["pairs"][0]["arms"]["candidate"]
    # the bench prints seconds: kept in its own unit, never labelled nanoseconds
    assert "samples_ns" not in arm and 0 < max(arm["samples"]) < 60
    assert samples["sample_unit"] == "as printed by the benchmark command"

    more = rsi_json(ws, "round", camp, "--from", str(ws.parent / "agent" / "wrong"))
    assert more["added"] is False  # known content: no new round, even with the budget used
    over = ws.parent / "agent" / "over"
    shutil.copytree(ws.parent / "agent" / "wrong", over)
    (over / "src" / "work.py").write_text("def compute(n):\n    return 0\n")
    refused = rsi_json(ws, "round", camp, "--from", str(over), expect=3)
    assert refused["error"]["code"] == "budget_exhausted"

    final = rsi_json(ws, "campaign", "final", camp)
    assert final["state"] == "done" and final["final"]["verdict"] == "PASS"
    assert final["final"]["selected"]["round"] == 1

    status = rsi_json(ws, "campaign", "status", camp)
    assert status["frozen"]["protocol"] == start["frozen"]["protocol"]
    assert any("changed since the start (quality)" in w for w in status["warnings"])
    assert status["budget"]["ended_by"] == "rounds" and status["final"]["state"] == "done"
    assert run_rsi(ws, "build", "//tasks/ext:campaign.baseline").returncode == 0
    frozen = ws / "out" / "tasks" / "ext" / "campaign.baseline" / "frozen"
    assert (frozen / "bench.py").read_bytes() == original["bench.py"]
    assert (frozen / "src" / "work.py").read_bytes() == original["src/work.py"]
    live = {p.relative_to(proj).as_posix() for p in proj.rglob("*") if p.is_file()}
    assert live == set(original)  # no command ever ran in the project folder


@pytest.mark.fast
def test_a_symlinked_folder_or_a_file_as_candidate_is_refused_with_exit_2(tmp_path):
    ws = task_workspace(tmp_path, CAMPAIGN)
    cand = tmp_path / "cand"
    cand.mkdir()
    (cand / "kernel.py").write_text(NAIVE)
    (cand / "linked").symlink_to("/etc")
    refused = rsi_json(ws, "round", C, "--from", str(cand), expect=2)
    assert refused["error"]["code"] == "UsageError"
    assert str(cand / "linked") in refused["error"]["message"]
    as_file = rsi_json(ws, "round", C, "--from", str(cand / "kernel.py"), expect=2)
    assert "not a folder" in as_file["error"]["message"]
    assert not (ws / "cache" / "campaigns").exists() or not any(
        e.get("kind") == "candidate" for e in CampaignLog(ws / "cache", C).read()
    )


# ================================================================================ concurrency

TINY = {
    "measure.samples = 5": "measure.samples = 3",
    "measure.pairs = 16": "measure.pairs = 6",
    "measure.probes = 16": "measure.probes = 4",
}


def tiny_workspace(tmp_path: Path, campaign: str = CAMPAIGN) -> Path:
    ws = task_workspace(tmp_path, campaign)
    build = ws / "tasks" / "sm" / "BUILD.toml"
    text = build.read_text()
    for was, now in TINY.items():
        text = text.replace(was, now)
    build.write_text(text)
    return ws


@pytest.mark.e2e
def test_four_rounds_submitted_at_once_get_their_own_numbers_and_evidence(tmp_path):
    from rsi.digest import digest_file

    ws = tiny_workspace(tmp_path)
    names = ("vectorised", "inplace", "unchanged", "wrong")
    procs = {}
    for name in names:
        events = ws.parent / f"events-{name}.jsonl"
        procs[name] = (
            subprocess.Popen(
                [*RSI, "round", C, "--from", str(ws / "cands" / name), "--json"]
                + ["--events", str(events)],
                cwd=ws,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                stdin=subprocess.DEVNULL,
            ),
            events,
        )
    docs, ran = {}, {}
    for name, (proc, events) in procs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{name}: exit {proc.returncode}\n{out}\n{err}"
        docs[name] = json.loads(out)
        ran[name] = [
            e
            for e in read_events(events)
            if e["kind"] == "action_finished" and e.get("cache") == "miss"
        ]
    assert sorted(d["round"] for d in docs.values()) == [1, 2, 3, 4]
    for name, doc in docs.items():
        assert doc["state"] == "done" and doc["added"] is True, doc
        assert doc["candidate"]["files"]["kernel.py"].split("/")[0] in {
            str(digest_file(ws / "cands" / name / "kernel.py")).split("/")[0]
        }
        # NB: a round runs its own actions and, at most, the binding's shared ones
        own = {doc["label"], "//tasks/sm:small"}
        assert {e["label"] for e in ran[name]} <= own, (name, ran[name])
    shared = [e["mnemonic"] for r in ran.values() for e in r if e["label"] == "//tasks/sm:small"]
    assert sorted(shared) == ["BaselineCheck", "Calibrate"], shared
    # NB: 6 pairs on a shared machine: a clear gain may still be INCONCLUSIVE, never FAIL
    assert {d["verdict"] for n, d in docs.items() if n in ("vectorised", "inplace")} <= {
        "PASS",
        "INCONCLUSIVE",
    }
    assert docs["wrong"]["verdict"] == "FAIL"
    # nothing returned to a caller was replaced: the out/ files still hold what each was
    # given, and asking for each round again serves the very same evidence from the cache
    for name, doc in docs.items():
        for part in ("round", "verdict", "check", "samples"):
            ev = doc["evidence"][part]
            assert str(digest_file(ev["path"])) == ev["digest"], (name, part)
        again = rsi_json(ws, "round", C, "--round", str(doc["round"]))
        assert again["cache"] == "hit", again
        assert {k: v["digest"] for k, v in again["evidence"].items()} == {
            k: v["digest"] for k, v in doc["evidence"].items()
        }
    status = rsi_json(ws, "campaign", "status", C)
    passed = [d["round"] for d in docs.values() if d["verdict"] == "PASS"]
    assert status["best"]["state"] == ("selected" if passed else "none")
    assert status["best"].get("round") in (passed or [None])


# ==================================================================================== regrade


@pytest.mark.e2e
def test_regrade_reassesses_from_retained_measurements_and_lists_what_changed(tmp_path):
    ws = tiny_workspace(tmp_path)
    first = rsi_json(ws, "round", C, "--from", str(ws / "cands" / "vectorised"))
    wrong = rsi_json(ws, "round", C, "--from", str(ws / "cands" / "wrong"))
    assert first["verdict"] in ("PASS", "INCONCLUSIVE") and wrong["verdict"] == "FAIL"
    events = ws.parent / "regrade-events.jsonl"
    t0 = time.monotonic()
    doc = rsi_json(ws, "campaign", "regrade", C, "--min-improvement", "50", "--events", str(events))
    took = time.monotonic() - t0
    ran = {
        e["mnemonic"]
        for e in read_events(events)
        if e["kind"] == "action_finished" and e.get("cache") == "miss"
    }
    # no measurement (nor check, nor calibration) ran: only the assessment and what follows it
    assert not ran & {"Measure", "Calibrate", "Check", "BaselineCheck"}, ran
    assert "Assess" in ran
    assert doc["measure_actions"] == 0 and "Measure" not in doc["executed"]
    assert doc["assess"] == {"min_improvement": 50.0} and doc["logged"]
    r1, r2 = doc["rounds"]
    assert r1["state"] == r2["state"] == "regraded"
    assert r1["before"]["verdict"] == first["verdict"] and r1["after"]["verdict"] != "PASS"
    assert "min_improvement" in r1["changed"]
    # NB: no threshold when the measurement says nothing (e.g. `host_busy` on a loaded host)
    assert ("threshold" in r1["changed"]) == (r1["before"]["threshold"] is not None)
    assert ("verdict" in r1["changed"]) == (first["verdict"] == "PASS")
    assert r1["before"]["speedup"] == r1["after"]["speedup"]  # same pairs, same interval
    assert r2["after"]["verdict"] == "FAIL" and "verdict" not in r2["changed"]
    assert doc["best"]["state"] == "none" and doc["n_changed"] >= 1
    # the round documents follow the regraded policy; the log keeps both policies
    again = rsi_json(ws, "round", C, "--round", "1")
    assert again["cache"] == "hit" and again["verdict"] == r1["after"]["verdict"]
    assert [e["kind"] for e in CampaignLog(ws / "cache", C).read()].count("regrade") == 1
    # back to the declared policy: PASS again, still nothing measured
    back = rsi_json(ws, "campaign", "regrade", C, "--min-improvement", "0.05")
    assert back["measure_actions"] == 0
    assert back["rounds"][0]["after"] == r1["before"]  # the declared policy's very verdict
    assert back["best"]["state"] == ("selected" if first["verdict"] == "PASS" else "none")
    print(f"regrade of 2 rounds: {took:.2f}s")
    bad = rsi_json(ws, "campaign", "regrade", C, "--confidence", "1.5", expect=2)
    assert bad["error"]["code"] == "UsageError"


# ========================================================================= evidence by content

JUDGE_STEPS = {"Check", "Measure", "Assess", "Render", "BaselineCheck", "Calibrate"}


@pytest.mark.e2e
def test_the_same_content_under_the_same_binding_reuses_its_evidence_in_any_campaign(tmp_path):
    second = CAMPAIGN.replace("[campaign]", "[campaign2]")
    ws = tiny_workspace(tmp_path, CAMPAIGN + "\n" + second)
    C2 = "//tasks/sm:campaign2"

    def timed_round(campaign: str, *args: str) -> tuple[dict, set[str], float]:
        events = ws.parent / f"events-{time.monotonic_ns()}.jsonl"
        t0 = time.monotonic()
        doc = rsi_json(ws, "round", campaign, *args, "--events", str(events))
        took = time.monotonic() - t0
        ran = {
            e["mnemonic"]
            for e in read_events(events)
            if e["kind"] == "action_finished" and e.get("cache") == "miss"
        }
        return doc, ran, took

    fresh, ran, t_fresh = timed_round(C, "--from", str(ws / "cands" / "vectorised"))
    assert {"Check", "Measure", "Assess"} <= ran
    assert fresh["reused"] is False and fresh["evidence_reuse"]["samples"]["reused"] is False
    cached, ran, t_cached = timed_round(C, "--round", "1")
    assert not ran and cached["cache"] == "hit"
    # the very same content, from another folder, in another campaign: judged once
    elsewhere = ws.parent / "elsewhere" / "vectorised"
    shutil.copytree(ws / "cands" / "vectorised", elsewhere)
    reused, ran, t_reused = timed_round(C2, "--from", str(elsewhere))
    assert not ran & JUDGE_STEPS, ran  # only the round's own bookkeeping (its document)
    assert reused["round"] == 1 and reused["reused"] is True
    src = reused["evidence_reuse"]["samples"]["from"]
    assert (src["campaign"], src["round"]) == (C, 1)
    assert reused["evidence_reuse"]["check"]["from"]["campaign"] == C
    for part in ("verdict", "samples", "check"):
        assert reused["evidence"][part]["digest"] == fresh["evidence"][part]["digest"]
    assert (reused["verdict"], reused["speedup"]) == (fresh["verdict"], fresh["speedup"])
    assert reused["label"] == C2 + ".round-1" and reused["campaign"] == C2
    print(f"round latency: fresh {t_fresh:.2f}s, cached {t_cached:.2f}s, reused {t_reused:.2f}s")


@pytest.mark.e2e
def test_a_changed_declared_assessment_policy_is_taken_by_regrade_without_measuring(tmp_path):
    ws = tiny_workspace(tmp_path)
    first = rsi_json(ws, "round", C, "--from", str(ws / "cands" / "vectorised"))
    build = ws / "tasks" / "sm" / "BUILD.toml"
    build.write_text(build.read_text().replace("min_improvement = 0.05", "min_improvement = 50.0"))
    refused = rsi_json(ws, "round", C, "--round", "1", expect=2)
    assert "assess.min_improvement" in refused["error"]["message"]
    assert "rsi campaign regrade" in refused["error"]["hint"]
    events = ws.parent / "declared-events.jsonl"
    doc = rsi_json(ws, "campaign", "regrade", C, "--events", str(events))
    ran = {
        e["mnemonic"]
        for e in read_events(events)
        if e["kind"] == "action_finished" and e.get("cache") == "miss"
    }
    assert not ran & {"Measure", "Calibrate", "Check", "BaselineCheck"}, ran
    assert doc["measure_actions"] == 0 and doc["declared_changes"] == ["assess.min_improvement"]
    (r1,) = doc["rounds"]
    assert r1["state"] == "regraded" and r1["before"]["verdict"] == first["verdict"]
    assert r1["after"]["verdict"] != "PASS" and "min_improvement" in r1["changed"]
    # the campaign now goes on under the new policy
    again = rsi_json(ws, "round", C, "--round", "1")
    assert again["cache"] == "hit" and again["verdict"] == r1["after"]["verdict"]
    status = rsi_json(ws, "campaign", "status", C)
    assert status["judge"]["state"] == "unchanged"


# =========================================================================== in-process service


@pytest.mark.e2e
def test_the_campaign_service_runs_rounds_in_process_with_its_own_clock_and_builder(tmp_path):
    from rsi.build import build
    from rsi.workspace import Workspace
    from rules.campaign import CampaignClosed, Campaigns

    ws = tiny_workspace(tmp_path)
    now = [1_000_000.0]
    built = []

    def builder(*args, **kw):
        built.append(list(args[1]))
        return build(*args, **kw)

    svc = Campaigns(Workspace.load(ws), clock=lambda: now[0], builder=builder)
    assert svc.best(C)["state"] == "none"  # no round yet
    doc = svc.round(C, src=ws / "cands" / "wrong", hypothesis="h")
    assert doc["round"] == 1 and doc["verdict"] == "FAIL" and doc["added"] is True
    assert doc["submitted_at"] == 1_000_000.0 and built == [[C + ".round-1"]]
    assert doc["budget"]["started_at"] == 1_000_000.0
    again = svc.round(C, number=1)
    assert again["cache"] == "hit" and again["verdict"] == "FAIL"
    status = svc.status(C)
    assert [r["verdict"] for r in status["rounds"]] == ["FAIL"]
    assert status["budget"]["seconds_left_for_rounds"] == 3600.0 - 600.0
    now[0] += 3500.0  # past the round window (deadline 3600 s, 600 s kept for the final)
    with pytest.raises(CampaignClosed) as info:
        svc.round(C, src=ws / "cands" / "inplace")
    assert info.value.code == "deadline_reached"


@pytest.mark.fast
def test_the_campaign_service_reports_what_is_missing_and_never_measures_for_a_report(
    tmp_path,
):
    from rsi.workspace import Workspace
    from rules.campaign import CampaignClosed, Campaigns

    ws = tiny_workspace(tmp_path)
    now = [5_000.0]
    built = []
    svc = Campaigns(
        Workspace.load(ws), clock=lambda: now[0], builder=lambda *a, **kw: built.append(a)
    )
    with pytest.raises(UsageError):
        svc.report(C)  # no round yet
    with pytest.raises(CampaignClosed) as info:
        svc.stop(C)
    assert info.value.code == "no_rounds"
    added = svc.add(C, ws / "cands" / "vectorised", hypothesis="h", usage={"calls": 2})
    assert added["round"] == 1 and added["added"] is True
    assert added["budget"]["started_at"] == 5_000.0
    doc = svc.report(C)
    assert doc["state"] == "unavailable" and doc["report"] is None and built == []
    assert any(m.startswith("Measure ") for m in doc["missing"])
    assert any(m.startswith("Check ") for m in doc["missing"])
    with pytest.raises(CampaignClosed) as info:
        svc.final(C)
    assert info.value.code == "campaign_open" and "rsi campaign stop" in info.value.hint
    now[0] += 10.0
    stop = svc.stop(C)
    assert stop["stopped_now"] is True and stop["budget"]["ended_by"] == "agent"
    assert stop["budget"]["final_allowed"] is True
    entries = svc.open(C).log.read()
    assert [e["kind"] for e in entries] == ["start", "candidate", "stop"]
    assert entries[-1]["time"] == 5_010.0
    assert svc.stop(C)["stopped_now"] is False  # asking again appends nothing
    assert len(svc.open(C).log.read()) == 3
    now[0] += 3600.0  # past the deadline: a final never built is refused
    with pytest.raises(CampaignClosed) as info:
        svc.final(C)
    assert info.value.code == "deadline_passed" and built == []


@pytest.mark.e2e
def test_the_campaign_service_stops_builds_the_final_and_reports_in_process(tmp_path):
    from rsi.build import build
    from rsi.workspace import Workspace
    from rules.campaign import CampaignClosed, Campaigns

    ws = tiny_workspace(tmp_path)
    now = [2_000_000.0]
    built = []

    def builder(*args, **kw):
        built.append(list(args[1]))
        return build(*args, **kw)

    svc = Campaigns(Workspace.load(ws), clock=lambda: now[0], builder=builder)
    first = svc.round(C, src=ws / "cands" / "vectorised")
    assert first["state"] == "done" and built == [[C + ".round-1"]]
    # while the campaign is open the report is bookkeeping only: the final is pending
    report = svc.report(C)
    assert report["state"] == "done" and report["cache"] == "miss" and report["missing"] == []
    assert built[-1] == [C + ".report"]
    assert report["report"]["schema"] == "rsi.campaign.report/1"
    assert len(report["report"]["rounds"]) == 1
    assert report["evidence"]["report.md"]["path"]
    assert svc.report(C)["cache"] == "hit" and len(built) == 2  # served from the cache
    now[0] += 60.0
    assert svc.stop(C)["stopped_now"] is True
    final = svc.final(C)
    assert final["state"] == "done" and built[-1] == [C + ".final", C + ".report"]
    # NB: the round's verdict under this test's small policy may fall short of a PASS on a
    # noisy host; then the final has no candidate to confirm, and says so
    passed = first["verdict"] == "PASS"
    assert final["final"]["state"] == ("done" if passed else "no_candidate")
    if passed:
        assert final["final"]["selected"]["round"] == 1
    assert final["budget"]["ended_by"] == "agent" and final["evidence"]["final.json"]["digest"]
    attempts = json.loads((svc.open(C).log.dir / "attempts.json").read_text())
    assert attempts["last"]["final"]["outcome"] == "done"
    assert attempts["last"]["final"]["time"] == 2_000_060.0  # the service's clock
    again = svc.report(C)
    assert again["state"] == "done" and again["cache"] == "hit"
    assert again["report"]["final"]["state"] == final["final"]["state"]
    # after the deadline a final already built stays readable, and nothing is built
    now[0] += 7200.0
    late = svc.final(C)
    assert late["state"] == "done" and late["cache"] == "hit" and len(built) == 3
    with pytest.raises(CampaignClosed) as info:
        svc.round(C, src=ws / "cands" / "inplace")
    assert info.value.code == "campaign_stopped"
