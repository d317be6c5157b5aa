"""The accelerator part: GPU bindings, CUDA-event timing, L2 flush, bandwidth, fingerprints.

Most tests run on any machine: the bandwidth and peak arithmetic, fingerprints with nulls on a
CPU, the refusal of a `cuda` spec where no GPU is visible (a harness fault, exit 2), device input
transport, nvidia-smi parsing (a fake nvidia-smi on PATH), the GPU arm's control flow against a
simulated `torch.cuda`, the bindings' platform properties, and the silu_mul task on the CPU.
The tests marked `needs_cuda` build the shipped GPU verdicts through the real CLI; without a CUDA
device they skip with the reason below, and with one they run for real. torch is imported only by
the tests that use it (the `torch` fixture): without torch installed those skip, and the rest run.
"""

from __future__ import annotations

import json
import re
import shutil
import types
from pathlib import Path

import numpy as np
import pytest
from harness_support import (
    ROOT,
    TASKS,
    load_harness_module,
    run_check,
    run_harness,
    run_measure,
    task_spec,
)

SILU = TASKS / "silu_mul"

NO_CUDA_REASON = "no CUDA device: torch.cuda.is_available() is False"


@pytest.fixture
def cuda(torch):
    """Skips the test unless torch sees a CUDA device."""
    if not torch.cuda.is_available():
        pytest.skip(NO_CUDA_REASON)


@pytest.fixture
def no_cuda(torch):
    """Skips the test where torch sees a CUDA device."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible here")


needs_cuda = pytest.mark.usefixtures("cuda")


def _load(stem: str):
    return load_harness_module(stem, prefix="_rsi_test_gpu")


C = _load("_common")
_check = run_check
_measure = run_measure


# ------------------------------------------------------------------------- bandwidth arithmetic


@pytest.mark.fast
def test_peak_bandwidth_is_double_data_rate_times_bus_width_and_null_when_unknown():
    # H100 SXM: 2619 MHz HBM3 on a 5120-bit bus is the datasheet's 3.35 TB/s
    assert C.peak_bandwidth_gb_s(2_619_000, 5120) == pytest.approx(3352.32)
    assert C.peak_bandwidth_gb_s(None, 5120) is None
    assert C.peak_bandwidth_gb_s(2_619_000, None) is None
    assert C.peak_bandwidth_gb_s(0, 5120) is None  # unknown is null, never 0
    facts = {
        "memory_clock_khz": 2_619_000,
        "memory_bus_width_bits": 5120,
        "memory_clock_khz_source": "torch",
    }
    assert C.peak_bandwidth(facts) == (pytest.approx(3352.32), "torch")
    # no clock from torch or the driver: nvidia-smi's maximum memory clock with the bus width
    no_clock = {"memory_clock_khz": None, "memory_bus_width_bits": 6144}
    peak, source = C.peak_bandwidth(no_clock, {"clocks.max.mem": 3201})
    assert source == "nvidia-smi" and peak == pytest.approx(2 * 3201e6 * 768 / 1e9)
    assert C.peak_bandwidth(no_clock, {}) == (None, None)
    assert C.peak_bandwidth(None, None) == (None, None)


@pytest.mark.fast
def test_achieved_bandwidth_is_bytes_over_median_time_and_fraction_of_peak():
    bw = C.bandwidth(3_000_000, 1500.0, 4000.0)  # 3 MB in 1.5 us = 2000 GB/s
    assert bw == {
        "median_ns": 1500.0,
        "achieved_gb_s": pytest.approx(2000.0),
        "fraction": pytest.approx(0.5),
    }
    cpu = C.bandwidth(3_000_000, 1500.0, None)
    assert cpu["achieved_gb_s"] == pytest.approx(2000.0) and cpu["fraction"] is None
    for median in (None, 0.0):
        assert C.bandwidth(3_000_000, median, 4000.0) == {
            "median_ns": median,
            "achieved_gb_s": None,
            "fraction": None,
        }


@pytest.mark.e2e
@pytest.mark.usefixtures("torch")  # silu_mul's workloads make torch tensors
def test_bytes_per_call_counts_every_input_and_the_output():
    loaded = C.load_module_from_path(SILU / "workloads.py", "workloads")
    inputs = loaded.make_inputs({"shape": [4, 16], "dtype": "bfloat16", "kind": "strided"}, 1)
    assert not inputs["x"].is_contiguous()
    # the strided view's 64 elements count, not its span; output is [4, 8] bfloat16
    assert C.tensor_bytes(inputs, (4, 8), "bfloat16") == 64 * 2 + 32 * 2
    arrays = {"a": np.zeros((3, 5), np.float32), "eps": 1e-6}
    assert C.tensor_bytes(arrays, (3,), "float64") == 60 + 24


@pytest.mark.fast
def test_l2_flush_is_twice_the_reported_l2_or_twice_the_documented_default():
    assert C.l2_flush_bytes({"l2_cache_bytes": 50 * 2**20, "l2_cache_bytes_source": "torch"}) == (
        100 * 2**20,
        50 * 2**20,
        "torch",
    )
    assert C.l2_flush_bytes({"l2_cache_bytes": None}) == (
        2 * C.DEFAULT_L2_BYTES,
        C.DEFAULT_L2_BYTES,
        "default",
    )
    assert C.l2_flush_bytes(None)[0] == 2 * C.DEFAULT_L2_BYTES >= 2 * 126 * 2**20


# ------------------------------------------------------------------------------ fingerprints


@pytest.mark.e2e
def test_fingerprint_on_a_cpu_has_every_field_and_null_gpu_fields(torch):
    fp = C.fingerprint({"device": "cpu", "toolchain": "host-python@abc"})
    for key in (
        "device",
        "cpu_model",
        "python",
        "numpy",
        "torch",
        "cuda",
        "toolchain",
        *C.GPU_FINGERPRINT_KEYS,
    ):
        assert key in fp, key
    assert all(fp[k] is None for k in C.GPU_FINGERPRINT_KEYS)
    assert fp["device"] == "cpu" and fp["toolchain"] == "host-python@abc"
    assert fp["torch"] == str(torch.__version__) and fp["cuda"] == torch.version.cuda
    if Path("/proc/cpuinfo").exists():
        assert fp["cpu_model"]


SMI_ROWS = (
    "NVIDIA H100 80GB HBM3, GPU-aaaaaaaa-0000-0000-0000-000000000000, 550.54.15, "
    "345, 2619, 1980, 2619",
    "NVIDIA H200, GPU-bbbbbbbb-0000-0000-0000-000000000000, 550.54.15, [N/A], 3201, 1980, 3201",
)
FAKE_SMI = (
    "#!/bin/sh\n"
    'case "$*" in\n'
    "  *--query-gpu=name,uuid,driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem"
    "*)\n" + "".join(f"    echo '{row}'\n" for row in SMI_ROWS) + "    ;;\n"
    "  *) exit 9 ;;\n"
    "esac\n"
)


@pytest.mark.fast
def test_nvidia_smi_rows_are_parsed_and_matched_to_the_device_by_uuid(tmp_path, monkeypatch):
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}:/usr/bin:/bin")
    rows = C.nvidia_smi()
    assert [r["name"] for r in rows] == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    assert rows[1]["clocks.sm"] is None and rows[1]["clocks.max.mem"] == 3201
    facts = {
        "name": "NVIDIA H200",
        "uuid": "GPU-bbbbbbbb-0000-0000-0000-000000000000",
        "compute_capability": "9.0",
        "total_memory_bytes": 150_000_000_000,
        "sm_clock_khz": 1_980_000,
        "memory_clock_khz": None,
        "memory_clock_khz_source": None,
        "memory_bus_width_bits": 6144,
        "l2_cache_bytes": 50 * 2**20,
    }
    fp = C.fingerprint({"device": "cuda", "toolchain": "t@1"}, facts, rows)
    assert fp["gpu_name"] == "NVIDIA H200" and fp["gpu_uuid"].startswith("GPU-bbbbbbbb")
    assert fp["gpu_driver"] == "550.54.15"
    assert fp["gpu_sm_clock_mhz"] is None and fp["gpu_mem_clock_mhz"] == 3201
    assert fp["gpu_max_sm_clock_mhz"] == 1980 and fp["gpu_max_mem_clock_mhz"] == 3201
    assert fp["gpu_peak_source"] == "nvidia-smi"
    assert fp["gpu_peak_gb_s"] == pytest.approx(2 * 3201e6 * 768 / 1e9)
    # a device nvidia-smi does not list takes nothing from another GPU's row
    other = C.fingerprint({"device": "cuda"}, dict(facts, uuid="GPU-cccccccc"), rows)
    assert other["gpu_mem_clock_mhz"] is None and other["gpu_name"] == "NVIDIA H200"
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    if not Path("/usr/bin/nvidia-smi").exists():
        assert C.nvidia_smi() is None


# ------------------------------------------------------------------------ refusal without CUDA


@pytest.mark.e2e
@pytest.mark.usefixtures("no_cuda")
@pytest.mark.parametrize("script", ["check.py", "measure.py"])
def test_cuda_spec_without_cuda_is_a_harness_fault_not_a_cpu_run(tmp_path, script):
    spec = task_spec("silu_mul", device="cuda")
    if script == "check.py":
        proc, out = _check(tmp_path, "silu_mul", SILU / "baseline", spec)
    else:
        proc, out = _measure(tmp_path, "silu_mul", SILU / "baseline", SILU / "baseline", spec)
    assert proc.returncode == C.INFRA_EXIT == 2, proc.stderr
    assert NO_CUDA_REASON in proc.stderr
    assert "refuses to judge on another device" in proc.stderr
    assert not out.exists()


@pytest.mark.e2e
@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"device": "tpu"}, "spec device must be one of"),
        ({"measure": {"bytes_per_call": 0}}, "bytes_per_call must be a positive integer"),
        ({"toolchain": 7}, "spec toolchain must be a string"),
    ],
)
def test_bad_accelerator_fields_are_harness_faults(tmp_path, overrides, message):
    proc, out = _check(tmp_path, "silu_mul", SILU / "baseline", task_spec("silu_mul", **overrides))
    assert proc.returncode == 2 and message in proc.stderr and not out.exists()


@pytest.mark.e2e
def test_cuda_needs_a_torch_task(tmp_path):
    spec = task_spec("softmax", device="cuda")
    proc, out = _check(tmp_path, "softmax", TASKS / "softmax" / "baseline", spec)
    assert proc.returncode == 2 and "needs framework 'torch'" in proc.stderr


# ------------------------------------------------- device facts against a simulated torch.cuda


class _FakeEvent:
    def __init__(self, enable_timing: bool = False):
        assert enable_timing
        self.t = None

    def record(self, stream=None):
        import time

        self.t = time.perf_counter_ns()

    def elapsed_time(self, other) -> float:
        return (other.t - self.t) / 1e6  # ms, as CUDA events report


def _simulated_cuda(torch, monkeypatch, calls: list[str]) -> None:
    """Stand-ins for the torch.cuda calls the arm makes; tensors stay on the CPU."""
    props = types.SimpleNamespace(
        name="Simulated GPU",
        uuid="1234abcd-0000",
        major=9,
        minor=0,
        total_memory=80 * 2**30,
        multi_processor_count=132,
        clock_rate=1_980_000,
        memory_clock_rate=2_619_000,
        memory_bus_width=5120,
        L2_cache_size=2**20,
    )
    monkeypatch.setattr(torch.cuda, "init", lambda: calls.append("init"))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)


@pytest.mark.e2e
def test_device_facts_fall_back_to_the_driver_and_stay_null_when_nobody_knows(torch, monkeypatch):
    _simulated_cuda(torch, monkeypatch, [])
    props = torch.cuda.get_device_properties(0)
    monkeypatch.setattr(props, "memory_clock_rate", 0)  # not exposed: reads as 0
    monkeypatch.delattr(props, "L2_cache_size")
    monkeypatch.setattr(
        C,
        "_driver_attributes",
        lambda index: {
            "memory_clock_khz": None,
            "memory_bus_width_bits": None,
            "l2_cache_bytes": 40 * 2**20,
        },
    )
    facts = C.cuda_device_facts(torch)
    assert facts["memory_clock_khz"] is None and facts["memory_clock_khz_source"] is None
    assert (
        facts["memory_bus_width_bits"] == 5120 and facts["memory_bus_width_bits_source"] == "torch"
    )
    assert facts["l2_cache_bytes"] == 40 * 2**20 and facts["l2_cache_bytes_source"] == "driver"
    assert C.l2_flush_bytes(facts) == (80 * 2**20, 40 * 2**20, "driver")
    fp = C.fingerprint({"device": "cuda"}, facts, None)
    assert fp["gpu_peak_gb_s"] is None and fp["gpu_peak_source"] is None
    assert C.bandwidth(10**9, 10**6, fp["gpu_peak_gb_s"])["fraction"] is None


# ------------------------------------------------------------------- bindings and declarations


def _analyze(*labels: str):
    from rsi.analysis import analyze
    from rsi.digest import digest_bytes
    from rsi.label import Label
    from rsi.loader import Loader
    from rsi.registry import load_rules

    blobs: dict[str, bytes] = {}

    def put(data: bytes):
        digest = digest_bytes(data)
        blobs[str(digest)] = data
        return digest

    graph = analyze(
        Loader(ROOT, load_rules()), [Label.parse(lb) for lb in labels], store_put=put, settings={}
    )
    return graph, blobs


@pytest.mark.e2e
@pytest.mark.usefixtures("torch")  # analysing a torch task needs torch
@pytest.mark.parametrize("task", ["rmsnorm", "silu_mul"])
def test_gpu_binding_asks_for_an_accelerator_only_where_the_device_is_used(task):
    graph, blobs = _analyze(f"//tasks/{task}:verdict_gpu", f"//tasks/{task}:verdict")
    by_mnemonic: dict[str, list[dict]] = {}
    for spec in graph.actions.values():
        by_mnemonic.setdefault(
            f"{spec.label.split(':')[1].split('#')[0]}#{spec.mnemonic}", []
        ).append(dict(spec.platform))
    for name in ("gpu#BaselineCheck", "gpu#Calibrate", "verdict_gpu#Check", "verdict_gpu#Measure"):
        assert [p.get("accelerator") for p in by_mnemonic[name]] == ["cuda"], name
    for name in ("verdict_gpu#Assess", "cpu#Calibrate", "verdict#Measure"):
        assert all("accelerator" not in p for p in by_mnemonic[name]), name
    from rsi.label import Label

    info = graph.providers[Label.parse(f"//tasks/{task}:gpu")].info
    spec = json.loads(blobs[str(info["spec_file"].digest)])
    assert spec["device"] == "cuda" and spec["framework"] == "torch"
    assert spec["toolchain"] == info["platform"]["toolchain"]
    assert spec["toolchain"].startswith("host-python@")
    cpu = graph.providers[Label.parse(f"//tasks/{task}:cpu")].info
    assert json.loads(blobs[str(cpu["spec_file"].digest)])["device"] == "cpu"


def _action_of(task: str, mnemonic: str):
    from rsi.action import Action

    graph, _ = _analyze(f"//tasks/{task}:verdict_gpu")
    (spec,) = [a for a in graph.actions.values() if a.mnemonic == mnemonic]
    return Action(
        argv=spec.argv,
        outputs=spec.outputs,
        env=spec.env,
        platform=spec.platform,
        label=spec.label,
        mnemonic=spec.mnemonic,
    )


@pytest.mark.e2e
@pytest.mark.usefixtures("torch")  # analysing a torch task needs torch
def test_docker_executor_requests_gpus_for_a_gpu_binding_and_not_for_its_assess():
    pytest.importorskip("docker")
    from rsi.executors.docker import DockerExecutor
    from rsi.limits import Limits

    executor = DockerExecutor.__new__(DockerExecutor)  # NB: container_kwargs needs no engine
    executor.limits, executor.pids_limit = Limits(memory_bytes=4 << 30), 1024
    info = types.SimpleNamespace(env={})
    measure = executor.container_kwargs(
        _action_of("silu_mul", "Measure"), info, Path("/x"), ["out"]
    )
    (request,) = measure["device_requests"]
    assert request["Count"] == -1 and request["Capabilities"] == [["gpu"]]
    assess = executor.container_kwargs(_action_of("silu_mul", "Assess"), info, Path("/x"), ["out"])
    assert "device_requests" not in assess


@pytest.mark.e2e
@pytest.mark.usefixtures("torch")  # analysing a torch task needs torch
def test_local_bwrap_sandbox_binds_nvidia_devices_for_accelerator_actions(monkeypatch):
    from rsi.executors import local

    action = _action_of("rmsnorm", "Measure")
    sandbox = local.LocalExecutor(sandbox="bwrap")
    cmd, _ = sandbox._wrap(action, list(action.argv), [], Path("/tmp/exec"))
    assert not any(a.startswith("/dev/nvidia") for a in cmd) or Path("/dev/nvidiactl").exists()
    fake = ["/dev/nvidia0", "/dev/nvidia-uvm", "/dev/nvidiactl"]
    monkeypatch.setattr("glob.glob", lambda pattern: fake if pattern == "/dev/nvidia*" else [])
    cmd, _ = sandbox._wrap(action, list(action.argv), [], Path("/tmp/exec"))
    for dev in fake:
        i = cmd.index(dev)
        assert cmd[i - 1] == "--dev-bind" and cmd[i + 1] == dev
    assert cmd.index("/dev/nvidia0") > cmd.index("--dev")  # after the fresh /dev is mounted
    plain = _action_of("rmsnorm", "Assess")
    cmd, _ = sandbox._wrap(plain, list(plain.argv), [], Path("/tmp/exec"))
    assert "/dev/nvidia0" not in cmd


# ---------------------------------------------------------------- the silu_mul task on the CPU


@pytest.mark.e2e
@pytest.mark.usefixtures("torch")  # a torch task
@pytest.mark.parametrize(
    "impl", ["baseline", "candidates/fast", "candidates/gain20", "candidates/same"]
)
def test_silu_mul_baseline_and_good_candidates_pass_every_case(tmp_path, impl):
    spec = task_spec("silu_mul", toolchain="host-python@test")
    proc, out = _check(tmp_path, "silu_mul", SILU / impl, spec)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["status"] == "ok", doc["reasons"]
    assert doc["n_passed"] == len(spec["cases"])
    assert doc["device"] == "cpu" and doc["fingerprint"]["toolchain"] == "host-python@test"
    assert all(doc["fingerprint"][k] is None for k in C.GPU_FINGERPRINT_KEYS)


@pytest.mark.e2e
@pytest.mark.usefixtures("torch")  # a torch task
@pytest.mark.parametrize("impl", ["wrong_half", "no_silu", "zeros"])
def test_silu_mul_wrong_controls_fail_as_wrong_output(tmp_path, impl):
    spec = task_spec("silu_mul")
    spec["cases"] = [c for c in spec["cases"] if c["name"] in ("zeros_f32", "normal_bf16")]
    proc, out = _check(tmp_path, "silu_mul", SILU / "candidates" / impl, spec)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["status"] == "candidate_failure" and doc["failure_kind"] == "wrong_output"
    assert [r["case"] for r in doc["reasons"]] == ["normal_bf16"]


@pytest.mark.e2e
@pytest.mark.usefixtures("torch")  # a torch task
def test_cpu_measure_reports_bandwidth_with_a_null_peak_and_assess_carries_it(tmp_path):
    spec = task_spec(
        "silu_mul",
        toolchain="host-python@test",
        measure={"pairs": 4, "samples": 3, "warmups": 1},
        assess={"min_pairs": 3, "bootstrap_resamples": 200},
    )
    base, fast = SILU / "baseline", SILU / "candidates" / "fast"
    runs = {}
    for name, cand in (("calibration", base), ("samples", fast)):
        proc, out = _measure(tmp_path, "silu_mul", base, cand, spec, name)
        assert proc.returncode == 0, proc.stderr
        runs[name] = out
    doc = json.loads(runs["samples"].read_text())
    assert doc["timing"]["clock"] == "perf_counter_ns" and doc["timing"]["l2_flush"] is None
    assert doc["device"] is None and doc["fingerprint"]["device"] == "cpu"
    bw = doc["bandwidth"]
    assert bw["bytes_per_call"] == 128 * 8192 * 2 + 128 * 4096 * 2
    assert bw["bytes_source"] == "input and output tensor bytes"
    assert bw["peak_gb_s"] is None and bw["peak_source"] is None
    for arm in ("baseline", "candidate"):
        assert bw[arm]["achieved_gb_s"] > 0 and bw[arm]["fraction"] is None
        assert bw[arm]["median_ns"] > 0
    checks = {}
    for name, impl in (("check", fast), ("baseline_check", base)):
        proc, out = _check(tmp_path, "silu_mul", impl, spec, name)
        assert proc.returncode == 0, proc.stderr
        checks[name] = out
    spec_path = tmp_path / "assess.spec.json"
    spec_path.write_text(json.dumps(spec))
    out = tmp_path / "verdict.json"
    proc = run_harness(
        "assess.py",
        [
            "--spec",
            str(spec_path),
            "--samples",
            str(runs["samples"]),
            "--check",
            str(checks["check"]),
            "--baseline-check",
            str(checks["baseline_check"]),
            "--calibration",
            str(runs["calibration"]),
            "--out",
            str(out),
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    verdict = json.loads(out.read_text())
    assert verdict["bandwidth"]["achieved_gb_s"] == bw["candidate"]["achieved_gb_s"]
    assert verdict["bandwidth"]["peak_gb_s"] is None and verdict["bandwidth"]["fraction"] is None
    assert verdict["timing"] == "perf_counter_ns"
    assert verdict["fingerprint"]["toolchain"] == "host-python@test"


@pytest.mark.e2e
@pytest.mark.usefixtures("torch")  # a torch task
def test_bytes_per_call_from_the_spec_wins(tmp_path):
    spec = task_spec(
        "silu_mul", measure={"pairs": 1, "samples": 2, "warmups": 0, "bytes_per_call": 12345}
    )
    proc, out = _measure(tmp_path, "silu_mul", SILU / "baseline", SILU / "baseline", spec)
    assert proc.returncode == 0, proc.stderr
    bw = json.loads(out.read_text())["bandwidth"]
    assert bw["bytes_per_call"] == 12345 and bw["bytes_source"] == "measure.bytes_per_call"


@pytest.mark.fast
def test_calibration_from_another_kind_of_device_does_not_apply():
    assess = _load("assess")
    fp = {"device": "cuda", "gpu_name": "NVIDIA H200", "gpu_uuid": "GPU-1"}
    assert assess._hardware({"fingerprint": fp}) == ("cuda", "NVIDIA H200")
    same_model = dict(fp, gpu_uuid="GPU-2")
    assert assess._hardware({"fingerprint": same_model}) == assess._hardware({"fingerprint": fp})
    assert assess._hardware({"fingerprint": dict(fp, gpu_name="NVIDIA A100")}) != assess._hardware(
        {"fingerprint": fp}
    )
    assert assess._hardware({}) == ()  # older evidence says nothing, matches anything


@pytest.mark.fast
def test_calibration_from_another_cpu_model_does_not_apply():
    """A noise floor measured on another CPU model (say, served from a shared cache) is not
    this host's noise floor."""
    assess = _load("assess")
    here = {"device": "cpu", "cpu_model": "AMD EPYC", "gpu_name": None}
    there = dict(here, cpu_model="Intel Xeon Platinum 8480")
    assert assess._hardware({"fingerprint": here}) == ("cpu", "AMD EPYC")
    assert assess._hardware({"fingerprint": there}) != assess._hardware({"fingerprint": here})


# ------------------------------------------------------------- the real thing, on a real GPU


def _gpu_workspace(tmp_path: Path, make_workspace, tasks: tuple[str, ...]) -> Path:
    ws = make_workspace(tmp_path)
    for task in tasks:
        dest = ws / "tasks" / task
        shutil.copytree(TASKS / task, dest, ignore=shutil.ignore_patterns("__pycache__"))
        build_file = dest / "BUILD.toml"
        text = build_file.read_text()
        text = re.sub(r"pairs = \d+", "pairs = 6", text)
        text = re.sub(r"samples = \d+", "samples = 5", text)
        text = re.sub(r"warmups = \d+", "warmups = 2", text)
        text = re.sub(r"min_pairs = \d+", "min_pairs = 4", text)
        build_file.write_text(text)
    return ws


@pytest.mark.e2e
@needs_cuda
@pytest.mark.parametrize("task", ["rmsnorm", "silu_mul"])
def test_gpu_verdict_builds_for_real_with_cuda_event_timing(tmp_path, make_workspace, build, task):
    ws = _gpu_workspace(tmp_path, make_workspace, (task,))
    build(ws, f"//tasks/{task}:verdict_gpu", timeout=3600)
    out = ws / "out" / "tasks" / task
    verdict = json.loads((out / "verdict_gpu" / "verdict.json").read_text())
    samples = json.loads((out / "_evidence" / "gpu" / "fast" / "samples.json").read_text())
    check = json.loads((out / "_evidence" / "gpu" / "fast" / "check.json").read_text())
    assert check["status"] == "ok" and check["device"] == "cuda", check["reasons"]
    assert verdict["verdict"] in ("PASS", "INCONCLUSIVE"), verdict["reasons"]
    assert samples["status"] == "ok" and samples["expected_output"]["device"] == "cuda"
    # CUDA-event timing, synchronised, with an L2 flush of at least twice the L2 before each call
    timing = samples["timing"]
    assert timing["clock"] == "cuda_event" and "synchronize" in timing["sync"]
    flush = timing["l2_flush"]
    assert flush["l2_cache_bytes"] > 0 and flush["bytes"] >= 2 * flush["l2_cache_bytes"]
    for pair in samples["pairs"]:
        for arm in pair["arms"].values():
            assert len(arm["samples_ns"]) == len(arm["wall_ns"]) == 5
            assert all(ns > 0 for ns in arm["samples_ns"])
    # achieved bandwidth as a fraction of the device's peak
    bw = samples["bandwidth"]
    assert bw["peak_gb_s"] and bw["peak_gb_s"] > 100
    for arm in ("baseline", "candidate"):
        assert 0 < bw[arm]["fraction"] <= 1, bw
    assert verdict["bandwidth"]["fraction"] == bw["candidate"]["fraction"]
    assert verdict["timing"] == "cuda_event"
    # the hardware fingerprint names the GPU
    for doc in (samples, check):
        fp = doc["fingerprint"]
        assert fp["device"] == "cuda" and fp["gpu_name"], fp
        assert fp["gpu_uuid"] and fp["gpu_uuid"].startswith(("GPU-", "MIG-")), fp
        assert fp["torch"] and fp["cuda"] and fp["toolchain"].startswith("host-python@")
        assert fp["gpu_compute_capability"] and fp["gpu_memory_bytes"]
    assert samples["device"]["uuid"] == samples["fingerprint"]["gpu_uuid"]


@pytest.mark.e2e
@needs_cuda
def test_gpu_check_judges_outputs_on_the_device(tmp_path):
    spec = task_spec("silu_mul", device="cuda")
    for impl, status in (
        ("baseline", "ok"),
        ("candidates/fast", "ok"),
        ("candidates/wrong_half", "candidate_failure"),
    ):
        proc, out = _check(tmp_path, "silu_mul", SILU / impl, spec, impl.replace("/", "_"))
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(out.read_text())
        assert doc["status"] == status, doc["reasons"]
        assert all(c["output"]["device"] == "cuda" for c in doc["cases"] if c["output"])
    # a candidate returning a host tensor on a cuda binding is on the wrong device
    impl = tmp_path / "host"
    impl.mkdir()
    (impl / "kernel.py").write_text(
        "import torch.nn.functional as F\n\ndef silu_mul(x):\n    d = x.shape[-1] // 2\n"
        "    return (F.silu(x[..., :d]) * x[..., d:]).cpu()\n"
    )
    proc, out = _check(tmp_path, "silu_mul", impl, spec, "host")
    doc = json.loads(out.read_text())
    assert doc["failure_kind"] == "wrong_type" and doc["reasons"][0]["code"] == "wrong_device"
