"""A small softmax catalog task for end-to-end tests that need a verdict or a campaign round
quickly (one correctness case, 6 pairs of 3 samples): `small_task_files()` gives the files of
`tasks/sm` with a naive baseline, a `fast` candidate, a verdict and a campaign."""

from __future__ import annotations

from pathlib import Path

SOFTMAX = Path(__file__).resolve().parents[1] / "tasks" / "softmax"

BUILD = """\
[task]
rule = "task"
runtime = ["workloads.py", "oracle.py"]
baseline = "baseline"
framework = "numpy"
entry = {module = "kernel", function = "softmax"}
editable = ["kernel.py"]
tolerances = {float32 = {atol = 1e-06, rtol = 1e-05}}
cases = [{name = "normal_f32", shape = [16, 128], dtype = "float32", kind = "normal"}]

[small]
rule = "binding"
task = ":task"
measure.workload = {name = "bench", shape = [64, 256], dtype = "float32", kind = "normal"}
measure.warmups = 1
measure.samples = 3
measure.pairs = 6
measure.probes = 4
measure.metric = "latency"
measure.direction = "minimize"
assess = {min_improvement = 0.05, confidence = 0.95, bootstrap_resamples = 200, min_pairs = 5}

[fast]
rule = "candidate"
task = ":task"
src = "cands/fast"

[verdict]
rule = "verdict"
binding = ":small"
candidate = ":fast"

[campaign]
rule = "campaign"
binding = ":small"
rounds = {up_to = 2}
"""
NAIVE = (
    "import numpy as np\n\n\ndef softmax(x):\n    out = np.empty_like(x)\n"
    "    for i in range(x.shape[0]):\n        r = x[i].astype(np.float64)\n"
    "        r = np.exp(r - r.max())\n        out[i] = r / r.sum()\n    return out\n"
)
FAST = (
    "import numpy as np\n\n\ndef softmax(x):\n    e = np.exp(x - x.max(axis=-1, keepdims=True))\n"
    "    return e / e.sum(axis=-1, keepdims=True)\n"
)


def small_task_files() -> dict[str, str | bytes]:
    return {
        "tasks/sm/BUILD.toml": BUILD,
        "tasks/sm/oracle.py": (SOFTMAX / "oracle.py").read_bytes(),
        "tasks/sm/workloads.py": (SOFTMAX / "workloads.py").read_bytes(),
        "tasks/sm/baseline/kernel.py": NAIVE,
        "tasks/sm/cands/fast/kernel.py": FAST,
    }
