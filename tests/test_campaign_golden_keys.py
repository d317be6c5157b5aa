"""Golden action keys: what a fixed small workspace (a domain verdict and a campaign round, best,
final and report) analyses into, pinned per target in tests/fixtures/campaign_golden_keys.json.

Each action gets an *analysis key*: the digest of its argv, env, platform, timeout, declared
outputs and inputs, where a source or rule-written input counts by its content digest and an
output of another action by its path and the producing step (its mnemonic), not by content,
which is only known once that step ran. Two actions with the same analysis key have the same real
key whenever their producers produced the same outputs (early cutoff), so a changed analysis key
is exactly a step that reruns because of what it reads itself (the harness scripts' contents are
inputs: editing rules/harness/*.py changes the keys of the steps that read them), and a step
whose key did not change reruns only when a producer's output changes.

A mismatch is not a failure to paper over: rerun with RSI_UPDATE_GOLDEN=1 to rewrite the file,
and say in the commit which keys changed and why.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rsi.digest import digest_bytes, digest_file, digest_value

REPO = Path(__file__).resolve().parents[1]
SOFTMAX = REPO / "tasks" / "softmax"
GOLDEN = Path(__file__).resolve().parent / "fixtures" / "campaign_golden_keys.json"

NAIVE = (
    "import numpy as np\n\n\ndef softmax(x):\n    rows = x.reshape(-1, x.shape[-1])\n"
    "    out = np.empty(rows.shape, dtype=x.dtype)\n    for i in range(rows.shape[0]):\n"
    "        r = rows[i].astype(np.float64)\n        r = np.exp(r - r.max())\n"
    "        out[i] = r / r.sum()\n    return out.reshape(x.shape)\n"
)
FAST = (
    "import numpy as np\n\n\ndef softmax(x):\n    e = np.exp(x - x.max(axis=-1, keepdims=True))\n"
    "    return e / e.sum(axis=-1, keepdims=True)\n"
)
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
rounds = {up_to = 3}
"""
TARGETS = (
    "small",
    "verdict",
    "campaign.round-1",
    "campaign.best",
    "campaign.final",
    "campaign.report",
)


# NB: host-python@<digest> names this interpreter and every installed package (a fresh CI venv
# differs from a developer's); it is what the machine offers, not what the rules declare, and it
# reaches both the platform and the specs the binding writes, so it is pinned for the analysis
PINNED_HOST = "host-python@" + "0" * 32


def analysis_keys(tmp_path: Path, make_workspace, monkeypatch) -> dict[str, dict[str, str]]:
    """{target: {"<mnemonic> <first output>": analysis key}} of the fixed workspace."""
    import rules.domain

    monkeypatch.setattr(rules.domain, "host_python_identity", lambda: PINNED_HOST)
    from rsi.analysis import analyze
    from rsi.label import Label
    from rsi.loader import Loader
    from rsi.registry import load_rules
    from rules.campaign import CampaignLog

    ws = make_workspace(
        tmp_path,
        {
            "tasks/sm/BUILD.toml": BUILD,
            "tasks/sm/oracle.py": (SOFTMAX / "oracle.py").read_bytes(),
            "tasks/sm/workloads.py": (SOFTMAX / "workloads.py").read_bytes(),
            "tasks/sm/baseline/kernel.py": NAIVE,
            "tasks/sm/cands/fast/kernel.py": FAST,
        },
    )
    store = tmp_path / "store"
    log = CampaignLog(store, "//tasks/sm:campaign")
    with log.locked():
        log.append(
            {
                "kind": "candidate",
                "time": 1.0,
                "digest": "d1",
                "files": {"kernel.py": str(digest_bytes(FAST.encode()))},
                "executable": [],
                "hypothesis": "vectorised",
                "usage": {},
            }
        )
    labels = [Label.parse(f"//tasks/sm:{t}") for t in TARGETS]
    graph = analyze(
        Loader(ws, load_rules(), {"store": str(store)}), labels, store_put=digest_bytes, settings={}
    )
    keys: dict[str, str] = {}

    def key_of(action_id: str) -> str:
        action_id = graph.producer(action_id)
        if action_id in keys:
            return keys[action_id]
        spec = graph.actions[action_id]
        inputs = []
        for art in spec.inputs:
            if art.producer:
                what = ["output", graph.actions[graph.producer(art.producer)].mnemonic]
            elif art.digest is not None:
                what = ["blob", str(art.digest)]
            elif art.source:
                what = ["source", str(digest_file(art.source))]
            else:
                what = ["?", None]
            inputs.append([art.path, *what, art.executable, art.symlink])
        keys[action_id] = str(
            digest_value(
                {
                    "argv": list(spec.argv),
                    "env": [list(e) for e in spec.env],
                    "platform": dict(spec.platform),
                    "timeout_s": spec.timeout_s,
                    "outputs": list(spec.outputs),
                    "inputs": sorted(inputs),
                }
            )
        ).split("/")[0]
        return keys[action_id]

    out: dict[str, dict[str, str]] = {}
    for label in labels:
        per: dict[str, str] = {}
        for action_id in graph.target_actions[label]:
            spec = graph.actions[graph.producer(action_id)]
            name = f"{spec.mnemonic} {spec.outputs[0] if spec.outputs else ''}".strip()
            per[name] = key_of(action_id)
        out[label.name] = dict(sorted(per.items()))
    return out


@pytest.mark.fast
def test_golden_action_keys(tmp_path, make_workspace, monkeypatch):
    now = analysis_keys(tmp_path, make_workspace, monkeypatch)
    if os.environ.get("RSI_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
    pinned = json.loads(GOLDEN.read_text())
    changed = []
    for target in sorted(set(now) | set(pinned)):
        was, got = pinned.get(target, {}), now.get(target, {})
        for step in sorted(set(was) | set(got)):
            if was.get(step) != got.get(step):
                changed.append(f"  {target}: {step}: {was.get(step)} -> {got.get(step)}")
    assert not changed, (
        "action keys changed (every changed key reruns that step for every existing campaign "
        "and verdict):\n"
        + "\n".join(changed)
        + f"\nif intended, rerun with RSI_UPDATE_GOLDEN=1 to rewrite {GOLDEN.name} and explain in "
        "the commit which keys changed and why"
    )
