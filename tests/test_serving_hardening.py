"""The serving judge's hardening (issue 29 point 6): each hostile fixture under
tests/fixtures/serving/ comes out not-PASS with a reason, and each test fails with its defence
removed. The fast tests start no vLLM server; the e2e ones start one real arm each.
"""

from __future__ import annotations

import importlib.util
import subprocess
import json
import math
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
from test_serving import _run_arm, _serving_env

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ROOT / "tasks" / "serve_tiny" / "project"
HARNESS = ROOT / "rules" / "harness"
FIXTURES = ROOT / "tests" / "fixtures" / "serving"


def _load(path: Path, name: str):
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.fast
def test_a_rewritten_trace_is_refused_before_any_candidate_code_runs(tmp_path):
    judge = _load(PROJECT / "serve_bench.py", "serve_bench_hardening")
    tree = tmp_path / "tree"
    shutil.copytree(PROJECT, tree)
    judge.HERE = tree
    binding = json.loads((tree / "serve.json").read_text())
    # the shipped trace is bound and passes
    data = judge.load_trace(binding)
    assert judge.parse_trace(data, binding)
    # the trace rewriter halves every timestamp (and so the window)
    shutil.copy(FIXTURES / "trace_rewriter" / "trace.jsonl", tree / "trace.jsonl")
    with pytest.raises(judge.Invalid) as exc:
        judge.load_trace(binding)
    assert exc.value.code == "trace_mismatch"
    # a binding without a digest is not checked, so it is not PASS either
    del binding["workload"]["trace_sha256"]
    with pytest.raises(judge.Invalid) as exc:
        judge.load_trace(binding)
    assert exc.value.code == "trace_unchecked"


@pytest.mark.fast
def test_the_trace_is_read_before_the_model_is_built(tmp_path, monkeypatch):
    """arm() checks the trace first: a rewrite made by candidate code later cannot be read."""
    judge = _load(PROJECT / "serve_bench.py", "serve_bench_hardening_order")
    tree = tmp_path / "tree"
    shutil.copytree(PROJECT, tree)
    shutil.copy(FIXTURES / "trace_rewriter" / "trace.jsonl", tree / "trace.jsonl")
    judge.HERE = tree
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(judge, "engine_env_dir", lambda: tmp_path / "no-env")

    def never(*a, **k):
        raise AssertionError("candidate-reachable code ran before the trace was checked")

    monkeypatch.setattr(judge.subprocess, "run", never)
    doc = judge.arm("bench")
    assert doc["ok"] is False and doc["reason"]["code"] == "trace_mismatch", doc


@pytest.mark.fast
def test_samples_forged_onto_the_bench_stdout_are_refused_not_parsed():
    project = _load(HARNESS / "project.py", "rsi_test_serving_project")
    forged = (FIXTURES / "stdout_forger" / "stdout.txt").read_text()
    with pytest.raises(ValueError, match="interference|other output"):
        project.parse_samples(forged)
    # the documented formats still parse
    assert project.parse_samples('{"samples": [812.5], "ok": true}') == [812.5]
    assert project.parse_samples("1.5\n2.5\n") == [1.5, 2.5]
    assert project.parse_samples("[3.0]") == [3.0]


@pytest.mark.fast
def test_a_run_cannot_rewrite_the_baseline_that_later_runs_copy(tmp_path):
    """The pristine trees are held in the harness's memory, not beside the runs: a candidate
    run that rewrites every baseline tree it finds on disk changes no later baseline run."""
    project = _load(HARNESS / "project.py", "rsi_test_serving_project_bench")
    base = tmp_path / "base"
    base.mkdir()
    (base / "bench.py").write_text('import json\nprint(json.dumps({"samples": [2.0]}))\n')
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    shutil.copy(FIXTURES / "baseline_writer" / "bench.py", overlay / "bench.py")
    work = tmp_path / "work"
    work.mkdir()
    spec = {
        "seed": 1,
        "benchmark": {"cmd": "python3 bench.py", "timeout_s": 60},
        "measure": {"pairs": 3},
    }
    doc = project.bench(spec, base, overlay, work)
    assert doc["status"] == "ok", doc["invalid"]
    assert len(doc["pairs"]) == 3
    baseline = [p["arms"]["baseline"]["samples"] for p in doc["pairs"]]
    assert baseline == [[2.0]] * 3, baseline
    # nothing on disk under the harness's folder holds a baseline tree a run could reach
    assert not list(work.rglob("bench.py"))


_TEARDOWN_PROBE = """
import json, os, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
import serve_bench as j
j.become_subreaper()
group = subprocess.Popen(
    [sys.executable, sys.argv[2], sys.argv[3]], start_new_session=True
)
group.wait()  # NB: the escaper's first parent exits at once: the helper is an orphan now
for _ in range(100):
    if os.path.exists(sys.argv[3]) and os.path.getsize(sys.argv[3]):
        break
    time.sleep(0.05)
escaped, left = j.end_descendants()
print(json.dumps({"escaped": escaped, "left": left}))
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


@pytest.mark.fast
def test_a_setsid_helper_is_found_and_ended_with_the_arm(tmp_path):
    """The group kill misses a setsid'd, double-forked helper; the judge, as subreaper, still
    finds it among its descendants, ends it, and reports it."""
    pidfile = tmp_path / "escaper.pid"
    try:
        probe = subprocess.run(
            [
                sys.executable,
                "-c",
                _TEARDOWN_PROBE,
                str(PROJECT),
                str(FIXTURES / "setsid_escaper" / "escape.py"),
                str(pidfile),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        pid = int(pidfile.read_text())
        assert probe.returncode == 0, probe.stderr
        doc = json.loads(probe.stdout.strip().splitlines()[-1])
        assert pid in doc["escaped"] and doc["left"] == [], doc
        assert not _alive(pid)
    finally:
        # NB: only the helper this test started, even when the probe timed out
        if pidfile.exists() and pidfile.read_text().strip():
            stray = int(pidfile.read_text())
            if _alive(stray):
                os.kill(stray, signal.SIGKILL)


@pytest.mark.e2e
def test_e2e_a_model_whose_helper_escapes_the_group_is_not_pass_and_ends(tmp_path):
    """One real vLLM arm: the candidate's model file spawns a setsid'd helper inside the
    server; the arm is not ok (escaped_process) and no such helper is alive afterwards."""
    _serving_env()
    proc, doc = _run_arm(tmp_path, "quality", overlay=FIXTURES / "setsid_escaper")
    survivors = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if b"rsi_setsid_escaper_sleep" in cmd and _alive(int(entry)):
                survivors.append(int(entry))
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)  # NB: only the fixture's own marked helper
    assert proc.returncode == 0, proc.stderr
    assert doc["ok"] is False and doc["reason"]["code"] == "escaped_process", doc["reason"]
    assert doc["teardown"]["escaped"] and doc["teardown"]["left"] == []
    # the model itself is right: the public prompts still matched
    assert doc["correctness"]["mismatch"] is None
    assert survivors == []


class _StandIn:
    def __init__(self, url: str) -> None:
        self.url = url


def _started(judge, port: int) -> _StandIn:
    """The stand-in server on `port`, once it answers (up to ~10 s)."""
    server = _StandIn(f"http://127.0.0.1:{port}")
    for _ in range(100):
        try:
            judge.http(f"{server.url}/v1/completions", {"prompt": "x", "max_tokens": 1})
            break
        except OSError:
            time.sleep(0.1)
    return server


@pytest.mark.fast
def test_a_model_wrong_only_on_benchmark_requests_fails_the_secret_sample(tmp_path):
    """A stand-in server right on the three public prompts and wrong on every trace request:
    the public check passes, the secret sample of benchmark requests does not."""
    judge = _load(PROJECT / "serve_bench.py", "serve_bench_hardening_sample")
    binding = json.loads((PROJECT / "serve.json").read_text())
    trace = judge.parse_trace((PROJECT / "trace.jsonl").read_bytes(), binding)
    script = FIXTURES / "wrong_on_benchmark" / "standin.py"
    for mode in ("hostile", "honest"):
        port = judge.free_port()
        proc = subprocess.Popen(
            [sys.executable, str(script), str(PROJECT / "serve.json"), str(port), mode]
        )
        try:
            server = _started(judge, port)
            c = binding["correctness"]
            got = []
            for prompt in c["prompts"]:
                body = {"prompt": prompt, "max_tokens": c["max_tokens"]}
                doc = json.loads(judge.http(f"{server.url}/v1/completions", body))
                got.append(doc["choices"][0]["token_ids"])
            assert judge.compare_tokens(c["expected_token_ids"], got) is None
            if mode == "hostile":
                with pytest.raises(judge.Invalid) as exc:
                    judge.check_benchmark_sample(server, binding, trace)
                assert exc.value.code == "wrong_output"
            else:
                doc = judge.check_benchmark_sample(server, binding, trace)
                assert len(doc["requests"]) == binding["workload"]["secret_sample"]
        finally:
            proc.kill()
            proc.wait()
    # a binding without the references cannot be checked: not ok, with a reason
    del binding["workload"]["reference_token_ids"]
    with pytest.raises(judge.Invalid) as exc:
        judge.check_benchmark_sample(_StandIn("http://127.0.0.1:9"), binding, trace)
    assert exc.value.code == "sample_unchecked"


# ------------------------------------------------------- the server's sandbox (issue 29 point 6)


def _isolation():
    return _load(PROJECT / "serve_isolation.py", "serve_isolation_under_test")


@pytest.mark.fast
def test_a_server_that_cannot_be_sandboxed_is_refused_not_run_bare(tmp_path, monkeypatch):
    """No bwrap: the arm is `server_not_isolated`, and no server process was started."""
    judge = _load(PROJECT / "serve_bench.py", "serve_bench_hardening_noiso")
    tree = tmp_path / "tree"
    shutil.copytree(PROJECT, tree)
    judge.HERE = tree
    monkeypatch.setenv("RSI_SERVE_BWRAP", str(tmp_path / "no-bwrap"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    work = tmp_path / "work"
    work.mkdir()
    started = []
    monkeypatch.setattr(judge.subprocess, "Popen", lambda *a, **k: started.append(a))
    binding = json.loads((tree / "serve.json").read_text())
    with pytest.raises(judge.Invalid) as exc:
        judge.Server(tmp_path / "env", model, work, binding, [], [tree])
    assert exc.value.code == "server_not_isolated" and started == []


_INSIDE = r"""
import json, os, sys
judge, hidden, result, own = sys.argv[1:5]
out = {"uid": os.getuid(), "hidden": os.listdir(hidden)}
for name, path in (("result", result), ("stdout", f"/proc/{judge}/fd/1"), ("root", "/rsi-x")):
    try:
        with open(path, "a") as f:
            f.write("forged\n")
        out[name] = "written"
    except OSError as exc:
        out[name] = type(exc).__name__
with open(os.path.join(own, "probe"), "w") as f:
    f.write("mine")
print(json.dumps(out))
"""


@pytest.mark.fast
def test_the_server_sandbox_reaches_nothing_of_the_judge(tmp_path):
    """What runs in the server's sandbox cannot see the judge's folders, write the result
    file, write the judge's stdout through /proc, or write anywhere but its own scratch."""
    iso = _isolation()
    hidden = tmp_path / "judge"
    hidden.mkdir(mode=0o700)
    result = hidden / "result.json"
    result.write_text("{}")
    own = tmp_path / "srv"
    own.mkdir()
    iso.hand_over(own)
    os.chmod(tmp_path, 0o755)
    ro = tmp_path / "ro"
    ro.mkdir()
    probe = ro / "probe.py"
    probe.write_text(_INSIDE)
    os.chmod(probe, 0o644)
    wrap, how = iso.sandbox_argv([hidden], [ro], [own], Path(sys.executable))
    proc = subprocess.run(
        [*wrap, sys.executable, str(probe), str(os.getpid()), str(hidden), str(result), str(own)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["hidden"] == [], seen
    assert seen["result"] != "written" and seen["stdout"] != "written", seen
    assert seen["root"] != "written", seen
    assert result.read_text() == "{}"
    assert (own / "probe").read_text() == "mine"
    if os.geteuid() == 0:
        assert seen["uid"] == iso.SERVER_UID and how["uid"] == iso.SERVER_UID


def _raw(prompt: str, ids: list[int]) -> dict:
    chunks = [{"choices": [{"index": 0, "text": "x", "token_ids": [t]}]} for t in ids] + [
        {"choices": [], "usage": {"completion_tokens": len(ids)}}
    ]
    packets = [
        {"perf_ns": k, "packets": [{"name": "data", "value": json.dumps(c)}]}
        for k, c in enumerate(chunks)
    ]
    packets.append({"perf_ns": 99, "packets": [{"name": "data", "value": "[DONE]"}]})
    return {"payload": {"prompt": prompt, "stream": True}, "responses": packets}


@pytest.mark.fast
def test_every_timed_answer_is_checked_inside_the_replay_window():
    """The streamed token ids AIPerf recorded for the replayed requests (the timed ones) must
    equal the reference up to each one's near-tie; a model right only outside the window (the
    window detector: a shifted argmax on the replay) is `wrong_output`."""
    judge = _load(PROJECT / "serve_bench.py", "serve_bench_hardening_window")
    binding = json.loads((PROJECT / "serve.json").read_text())
    trace = judge.parse_trace((PROJECT / "trace.jsonl").read_bytes(), binding)
    refs = binding["workload"]["reference_token_ids"]
    honest = [_raw(t["text_input"], refs[i]) for i, t in enumerate(trace)]
    doc = judge.check_window_answers(honest, binding, trace)
    assert doc["requests"] == sum(1 for n in binding["workload"]["reference_trusted"] if n > 0)
    # the window detector's answers: each argmax shifted by one inside the window
    shifted = [_raw(t["text_input"], [(x + 1) % 75 for x in refs[i]]) for i, t in enumerate(trace)]
    with pytest.raises(judge.Invalid) as exc:
        judge.check_window_answers(shifted, binding, trace)
    assert exc.value.code == "wrong_output"
    # one request wrong is enough
    one = list(honest)
    one[5] = _raw(trace[5]["text_input"], [(x + 1) % 75 for x in refs[5]])
    with pytest.raises(judge.Invalid) as exc:
        judge.check_window_answers(one, binding, trace)
    assert exc.value.code == "wrong_output"
    # an answer without token ids, or a request missing, cannot be checked: not ok
    with pytest.raises(judge.Invalid) as exc:
        judge.check_window_answers(honest[:-1], binding, trace)
    assert exc.value.code == "sample_unchecked"
    bare = list(honest)
    bare[0] = _raw(trace[0]["text_input"], [])
    with pytest.raises(judge.Invalid) as exc:
        judge.check_window_answers(bare, binding, trace)
    assert exc.value.code == "run_invalid"


@pytest.mark.fast
def test_the_result_comes_from_the_result_file_never_from_stdout(tmp_path):
    """A project in result-file mode: its samples are read from the harness's 0700 folder; a
    forged stdout is ignored, and a run that wrote no file has no samples (no stdout fallback)."""
    project = _load(HARNESS / "project.py", "rsi_test_serving_project_result")
    base = tmp_path / "base"
    base.mkdir()
    (base / "bench.py").write_text(
        "import json, os, sys\n"
        "print(json.dumps({'samples': [1000000.0]}))\n"  # NB: what a forger on stdout says
        "if sys.argv[1:] != ['silent']:\n"
        "    with open(os.environ['RSI_RESULT_FILE'], 'w') as f:\n"
        "        json.dump({'samples': [2.0], 'ok': True}, f)\n"
    )
    spec = {
        "seed": 1,
        "benchmark": {"cmd": "python3 bench.py", "timeout_s": 60},
        "measure": {"pairs": 1},
        "env": {"RSI_RESULT": "file"},
    }
    work = tmp_path / "work"
    work.mkdir()
    doc = project.bench(spec, base, None, work)
    assert doc["status"] == "ok", doc["invalid"]
    assert [a["samples"] for a in doc["pairs"][0]["arms"].values()] == [[2.0], [2.0]]
    spec["benchmark"]["cmd"] = "python3 bench.py silent"
    work2 = tmp_path / "work2"
    work2.mkdir()
    doc = project.bench(spec, base, None, work2)
    codes = [r["code"] for r in doc["invalid"]["baseline"]]
    assert codes == ["no_samples"], doc["invalid"]


def _arm_with_result_file(tmp_path: Path, step: str, overlay: Path):
    """One real arm as the harness runs it: the result goes to a file in a 0700 folder of the
    caller's (RSI_RESULT_FILE), the server's log is kept (RSI_SERVE_KEEP)."""
    env_dir = _serving_env()
    tree = tmp_path / f"tree-{step}"
    shutil.copytree(PROJECT, tree)
    for f in overlay.iterdir():
        shutil.copy(f, tree / f.name)
    results = tmp_path / "results"
    results.mkdir(mode=0o700)
    keep = tmp_path / "keep"
    keep.mkdir()
    env = {
        "PATH": "/usr/bin:/bin",
        "TMPDIR": str(tmp_path),
        "HOME": str(tmp_path),
        "RSI_RESULT_FILE": str(results / "result.json"),
        "RSI_SERVE_KEEP": str(keep),
        "RSI_SERVING_ROOT": str(env_dir.parent),
    }
    proc = subprocess.run(
        [sys.executable, "serve_bench.py", step],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    doc = json.loads((results / "result.json").read_text())
    log = (
        (keep / "server.log").read_text(errors="replace") if (keep / "server.log").exists() else ""
    )
    return proc, doc, log


@pytest.mark.e2e
def test_e2e_the_export_forger_reaches_nothing_the_benchmark_reads(tmp_path):
    """A model that, inside the server, tries to forge the judge's stdout, AIPerf's export, the
    result file and the baseline tree: every attempt is blocked, the arm's figures are AIPerf's
    own, and the result file holds the judge's document."""
    proc, doc, log = _arm_with_result_file(tmp_path, "bench", FIXTURES / "export_forger")
    assert "FORGER ok" not in log, [x for x in log.splitlines() if "FORGER" in x]
    assert "FORGER blocked" in log, log[-2000:]
    assert doc["ok"] is True, doc["reason"]
    assert doc["isolation"]["bwrap"] and doc["samples"] == [doc["serving"]["goodput_tokens_per_s"]]
    assert doc["serving"]["window_answers"]["requests"] > 0
    # the stdout is a log line naming the result file, no samples a parser could take
    assert "samples" not in proc.stdout


@pytest.mark.e2e
def test_e2e_a_model_wrong_only_inside_the_replay_window_fails(tmp_path):
    """The window detector answers the public prompts and the secret sample before the replay
    right, and every replayed request wrong: the timed answers themselves are checked."""
    proc, doc, _ = _arm_with_result_file(tmp_path, "bench", FIXTURES / "window_detector")
    assert doc["correctness"]["mismatch"] is None  # right outside the window
    assert doc["benchmark_sample"]["requests"]
    assert doc["ok"] is False and doc["reason"]["code"] == "wrong_output", doc["reason"]
    assert "replayed request" in doc["reason"]["detail"]
    assert proc.returncode == 1


_POOL_LIKE = r"""
import ctypes, json, os, subprocess, sys
sys.path.insert(0, sys.argv[1])
os.setgroups([]); os.setgid(65534); os.setuid(65534)  # NB: as rsi's pooled slot runs actions
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
import serve_isolation as iso
from pathlib import Path
wrap, how = iso.sandbox_argv([], [], [], Path(sys.executable))
code = (
    "import os, json\n"
    "own = os.readlink('/proc/self') == str(os.getpid())\n"
    "try:\n"
    "    open('/proc/JUDGE/fd/1', 'a'); judge = 'written'\n"
    "except OSError as e:\n"
    "    judge = type(e).__name__\n"
    "print(json.dumps({'own_status': own, 'judge_stdout': judge}))\n"
).replace("JUDGE", str(os.getpid()))
r = subprocess.run([*wrap, sys.executable, "-c", code], capture_output=True, text=True)
print(json.dumps({"how": how, "rc": r.returncode, "out": r.stdout, "err": r.stderr[-500:]}))
"""


@pytest.mark.fast
def test_inside_a_pooled_action_sandbox_the_server_still_finds_its_own_proc(tmp_path):
    """rsi's pooled slot (bwrap as root, the action at uid 65534, /proc partly masked) refuses a
    new /proc: the server's sandbox binds the host's, shares the pid namespace (so the engine's
    /proc/<getpid()> exists) and still cannot write the judge's stdout (it is non-dumpable)."""
    if os.geteuid() != 0:
        pytest.fail("this check builds rsi's pooled slot, which needs root (as the CI has)")
    py = Path(os.path.realpath(sys.executable))
    prefix = py.parent.parent
    outer = [
        "/usr/bin/bwrap",
        "--unshare-net",
        "--unshare-pid",
        "--unshare-ipc",
        "--die-with-parent",
        "--ro-bind",
        "/",
        "/",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--perms",
        "1777",
        "--tmpfs",
        "/tmp",
        "--perms",
        "0755",
        "--tmpfs",
        "/root",
    ]
    for d in reversed(prefix.parents):
        if d.is_relative_to("/root") and d != Path("/root"):
            outer += ["--perms", "0755", "--dir", str(d)]
    outer += ["--ro-bind", str(prefix), str(prefix), "--ro-bind", str(PROJECT), str(PROJECT)]
    outer += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--"]
    proc = subprocess.run(
        [*outer, str(py), "-c", _POOL_LIKE, str(PROJECT)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc["rc"] == 0, doc
    inside = json.loads(doc["out"].strip().splitlines()[-1])
    assert inside["own_status"] is True, doc
    assert inside["judge_stdout"] != "written", doc


# ------------------------------------------------- fresh prompts, timed packets (issue 32 review)


@pytest.mark.fast
def test_text_streamed_ahead_of_its_token_is_not_timed_as_one():
    """AIPerf times the first packet that carries text as the first token. A server that sends
    text with no token id ahead of the real tokens (a model's code runs in the API server's
    process and could patch its stream) would set its own time to first token: `run_invalid`.
    A packet with token ids and no text (held-back text) only makes AIPerf's time later."""
    judge = _load(PROJECT / "serve_bench.py", "serve_bench_hardening_ahead")
    binding = json.loads((PROJECT / "serve.json").read_text())
    trace = judge.parse_trace((PROJECT / "trace.jsonl").read_bytes(), binding)
    refs = binding["workload"]["reference_token_ids"]
    honest = [_raw(t["text_input"], refs[i]) for i, t in enumerate(trace)]
    assert judge.check_window_answers(honest, binding, trace)["requests"] == len(trace)
    for ahead in ({"index": 0, "text": " "}, {"index": 0, "text": "a", "token_ids": []}):
        early = list(honest)
        early[7] = _raw(trace[7]["text_input"], refs[7])
        packet = {"name": "data", "value": json.dumps({"choices": [ahead]})}
        early[7]["responses"].insert(0, {"perf_ns": 0, "packets": [packet]})
        with pytest.raises(judge.Invalid) as exc:
            judge.check_window_answers(early, binding, trace)
        assert exc.value.code == "run_invalid" and "without token ids" in exc.value.detail
    held = list(honest)
    held[3] = _raw(trace[3]["text_input"], refs[3])
    first = json.loads(held[3]["responses"][0]["packets"][0]["value"])
    first["choices"][0]["text"] = ""
    held[3]["responses"][0]["packets"][0]["value"] = json.dumps(first)
    assert judge.check_window_answers(held, binding, trace)["requests"] == len(trace)


@pytest.mark.fast
def test_the_fresh_pool_falls_short_only_by_a_vanishing_chance_and_costs_only_what_it_needs():
    """CI once judged an honest arm sample_unchecked: 1.5 prompts per need plus 2 left a shape
    with fewer fully trusted references than it needed (about 1 arm in 14 at the 78% measured
    here). The pool is now large enough that a shortage needs a run of bad luck, and the
    reference stops computing a shape once it has enough, so the pool does not cost time."""
    import torch

    judge = _load(PROJECT / "serve_bench.py", "serve_bench_hardening_pool")
    maker = _load(PROJECT / "make_model.py", "make_model_hardening_pool")
    binding = json.loads((PROJECT / "serve.json").read_text())
    trace = judge.parse_trace((PROJECT / "trace.jsonl").read_bytes(), binding)
    k = binding["workload"]["secret_sample"]
    pool = judge.draw_prompts(trace, binding["model"]["alphabet"], k)
    need: dict = {}
    for shape in judge._slots(trace, k):
        need[shape] = need.get(shape, 0) + 1
    short = 0.0
    for (chars, answer), m in need.items():
        rows = [r for r in pool if (len(r["text_input"]), r["output_length"]) == (chars, answer)]
        assert {r["enough"] for r in rows} == {m}
        n = len(rows)
        short += sum(math.comb(n, i) * 0.78**i * 0.22 ** (n - i) for i in range(m))
    assert short < 1e-5, short  # NB: per arm, at the 78% fully trusted measured here

    # NB: the reference engine's loop, on a stand-in model whose every third row has a near-tie
    # on its first token: rows past a shape's `enough` are not computed and are never usable
    calls = []

    class Model:
        def __call__(self, input_ids, past_key_values, use_cache):
            calls.append(1)
            tie = past_key_values is None and int(input_ids[0, 0]) % 3 == 0
            logits = torch.zeros(1, 1, 8)
            logits[0, -1, 1] = 5.0
            logits[0, -1, 2] = 5.0 if tie else 0.0
            return type("Out", (), {"logits": logits, "past_key_values": ()})()

    def fast(text, add_special_tokens):
        return {"input_ids": [ord(text[0])]}

    rows = [{"text_input": chr(48 + j) + "x", "output_length": 4, "enough": 3} for j in range(12)]
    ids, trusted = maker.greedy_rows(binding, fast, Model(), rows)
    full = [j for j, t in enumerate(trusted) if t >= 4]
    assert len(full) == 3 and full == [1, 2, 4]  # NB: '0' and '3' tie (48, 51 divisible by 3)
    assert all(ids[j] == [] and trusted[j] == 0 for j in range(5, 12))
    assert len(calls) == 5 * 4  # NB: five rows computed, four tokens each
    # NB: without `enough` (the trace's own reference) every row is computed
    calls.clear()
    plain = [{"text_input": r["text_input"], "output_length": 4} for r in rows]
    maker.greedy_rows(binding, fast, Model(), plain)
    assert len(calls) == 12 * 4


@pytest.mark.fast
def test_each_arm_replays_prompts_no_model_has_seen():
    """The pinned trace and its reference are public, so a model could answer them from a
    table without computing (the stand-in `wrong_on_benchmark` in its honest mode is such a
    table: right on every pinned prompt). Each arm draws its own prompts at run time: the
    pinned load (times, answer lengths), new words, none a pinned prompt, with a reference
    computed for them; the table then answers none of them right."""
    judge = _load(PROJECT / "serve_bench.py", "serve_bench_hardening_fresh")
    binding = json.loads((PROJECT / "serve.json").read_text())
    trace = judge.parse_trace((PROJECT / "trace.jsonl").read_bytes(), binding)
    alphabet, k = binding["model"]["alphabet"], binding["workload"]["secret_sample"]
    pool = judge.draw_prompts(trace, alphabet, k)
    again = judge.draw_prompts(trace, alphabet, k)
    texts = [r["text_input"] for r in pool]
    assert len(texts) == len(set(texts)) >= math.ceil((len(trace) + k) * judge.FRESH_POOL)
    assert not set(texts) & {t["text_input"] for t in trace}
    assert not set(texts) & {r["text_input"] for r in again}  # NB: drawn anew each run
    assert all(set(t) <= set(alphabet) and t == t.strip() for t in texts)
    assert {len(t) for t in texts} == {len(t["text_input"]) for t in trace}

    ids = [[(j + n) % 75 for n in range(24)] for j in range(len(pool))]
    trusted = [5 if j % 4 == 0 else 24 for j in range(len(pool))]  # NB: a near-tie: not used
    before = json.dumps(binding)
    run_b, rows, data, pre_b, pre = judge.fresh_workload(binding, trace, pool, ids, trusted)
    assert json.dumps(binding) == before  # NB: the pinned binding is not changed
    assert judge.parse_trace(data, run_b) == rows  # NB: still exactly the bound load shape
    at = {t: j for j, t in enumerate(texts)}
    used = [at[r["text_input"]] for r in rows] + [at[r["text_input"]] for r in pre]
    assert len(set(used)) == len(trace) + k and all(trusted[j] == 24 for j in used)
    # NB: each replayed prompt has the pinned one's length at the pinned one's time
    assert [len(r["text_input"]) for r in rows] == [len(t["text_input"]) for t in trace]
    assert run_b["workload"]["reference_token_ids"] == [ids[j] for j in used[: len(trace)]]
    assert pre_b["workload"]["reference_token_ids"] == [ids[j] for j in used[len(trace) :]]
    with pytest.raises(judge.Invalid) as exc:
        judge.fresh_workload(binding, trace, pool, ids, [23] * len(pool))
    assert exc.value.code == "sample_unchecked"
    # NB: a server that refuses a check's request leaves it unmade: not ok, never a crash
    with pytest.raises(judge.Invalid) as exc:
        judge.check_benchmark_sample(_StandIn("http://127.0.0.1:9"), pre_b, pre)
    assert exc.value.code == "sample_unchecked"
    with pytest.raises(judge.Invalid) as exc:
        judge.greedy(_StandIn("http://127.0.0.1:9"), binding)
    assert exc.value.code == "correctness_unchecked"

    port = judge.free_port()
    script = FIXTURES / "wrong_on_benchmark" / "standin.py"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(PROJECT / "serve.json"), str(port), "honest"]
    )
    try:
        server = _started(judge, port)
        # NB: the table is right on the pinned prompts (what the old judge asked) ...
        assert judge.check_benchmark_sample(server, binding, trace)["requests"]
        # ... and on none of the arm's own
        for b, r in ((pre_b, pre), (run_b, rows)):
            with pytest.raises(judge.Invalid) as exc:
                judge.check_benchmark_sample(server, b, r)
            assert exc.value.code == "wrong_output"
    finally:
        proc.kill()
        proc.wait()
