"""The independent review (issue 21, item 4): rules/harness/review.py reads a frozen candidate's
source beside the baseline and the binding's public spec, and flags what the referee's numbers
cannot show — frame or gc introspection, process and clock manipulation, threads beyond the
binding, delegation to the baseline, special-casing of public shapes and seeds. A review that
does not pass withholds acceptance (selection, the final); it never changes a verdict."""

from __future__ import annotations

import json
import sys
from importlib import util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BASELINE = (REPO / "tasks" / "softmax" / "baseline" / "kernel.py").read_text()
FAST = (REPO / "tasks" / "softmax" / "candidates" / "fast" / "kernel.py").read_text()
SPEC = {
    "entry": {"module": "kernel", "function": "softmax"},
    "editable": ["kernel.py"],
    "threads": 1,
    "seed": 7,
    "cases": [
        {"name": "normal_f32", "shape": [16, 128]},
        {"name": "wide_f32", "shape": [2, 4096]},
        {"name": "single_column_f32", "shape": [5, 1]},
    ],
    "measure": {"workload": {"shape": [64, 1024]}, "seed": 11},
}


def _harness(stem: str):
    spec = util.spec_from_file_location(f"rsi_test_{stem}", REPO / "rules/harness" / f"{stem}.py")
    module = util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


review = _harness("review")


def run_review(tmp_path: Path, source: str, rules: dict | None = None, spec=SPEC) -> dict:
    cand, base = tmp_path / "cand", tmp_path / "base"
    for d, text in ((cand, source), (base, BASELINE)):
        d.mkdir(exist_ok=True)
        (d / "kernel.py").write_text(text)
    return review.review(cand, base, spec, rules or {})


def rules_of(doc: dict) -> set[str]:
    return {f["rule"] for f in doc["findings"]}


# NB: every one of these is correct and the referee would judge it on its numbers alone (it
# isolates the worker, so what the candidate reads gains it nothing): only the review sees it
FRAME_INTROSPECTION = """\
import sys
import numpy as np


def softmax(x):
    frame = sys._getframe(1)
    while frame is not None:
        if "expected" in frame.f_locals:
            return frame.f_locals["expected"]
        frame = frame.f_back
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
"""
INSPECT_STACK = """\
import inspect
import numpy as np


def softmax(x):
    for info in inspect.stack():
        ref = info.frame.f_globals.get("reference")
        if ref is not None:
            return ref
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
"""
DELEGATES_COPY = """\
import numpy as np


def _reference(a):
    af = a.astype(np.float64)
    b = np.exp(af - af.max(axis=-1, keepdims=True))
    return (b / b.sum(axis=-1, keepdims=True)).astype(a.dtype)


def softmax(x):
    return _reference(x)
"""
DELEGATES_IMPORT = """\
import importlib.util
import pathlib

_path = pathlib.Path(__file__).resolve().parent.parent / "baseline" / "kernel.py"
_spec = importlib.util.spec_from_file_location("base_kernel", _path)
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
softmax = _mod.softmax
"""
RENAMED_BASELINE = '''\
"""A 'new' softmax."""
import numpy as np


def softmax(inp):
    """Same thing, other names."""
    wide = inp.astype(np.float64)
    ex = np.exp(wide - wide.max(axis=-1, keepdims=True))
    return (ex / ex.sum(axis=-1, keepdims=True)).astype(inp.dtype)
'''
OBFUSCATED = {
    "dunder_import": "def softmax(x):\n    gc = __import__('g' + 'c')\n    return gc\n",
    "import_module": (
        "import importlib\n\n\ndef softmax(x):\n"
        "    return importlib.import_module('in' + 'spect').stack()\n"
    ),
    "getattr_literal": "import sys\n\n\ndef softmax(x):\n    return getattr(sys, '_getframe')(1)\n",
    "getattr_concat": (
        "import sys\n\n\ndef softmax(x):\n    return getattr(sys, '_get' + 'frame')(1)\n"
    ),
    "getattr_computed": (
        "import sys\n\n\ndef softmax(x):\n    name = ''.join(reversed(x.dtype.name))\n"
        "    return getattr(sys, name)\n"
    ),
    "dunder_computed": (
        "def softmax(x):\n    m = __import__(bytes([103, 99]).decode())\n    return x\n"
    ),
    "eval": "def softmax(x):\n    return eval('__imp' + 'ort__(\"gc\")')\n",
    "builtins_dict": "def softmax(x):\n    return __builtins__['__import__']('gc')\n",
    "sys_modules": ("import sys\n\n\ndef softmax(x):\n    return sys.modules['inspect'].stack()\n"),
}


@pytest.mark.fast
def test_a_benign_fast_numpy_candidate_passes(tmp_path):
    doc = run_review(tmp_path, FAST)
    assert doc["verdict"] == "pass", doc["findings"]
    assert doc["schema"] == "rsi.review/1" and doc["findings"] == []
    legit = (
        "import math\nimport numpy as np\n\n\ndef softmax(x):\n"
        "    if x.ndim == 1 or len(x.shape) == 2 and x.shape[-1] == 1:\n"
        "        return np.ones_like(x)\n"
        "    n, d = x.shape[0], x.shape[-1]\n"
        "    if d >= 1024:\n        pass\n"
        "    out = np.empty_like(x)\n"
        "    m = x.max(axis=-1, keepdims=True)\n"
        "    np.subtract(x, m, out=out)\n    np.exp(out, out=out)\n"
        "    out /= out.sum(axis=-1, keepdims=True)\n    return out\n"
    )
    assert run_review(tmp_path, legit)["verdict"] == "pass"


@pytest.mark.fast
@pytest.mark.parametrize(
    "source", [FRAME_INTROSPECTION, INSPECT_STACK], ids=["getframe", "inspect"]
)
def test_frame_introspection_fails_the_review(tmp_path, source):
    doc = run_review(tmp_path, source)
    assert doc["verdict"] == "fail"
    assert "frame_introspection" in rules_of(doc)
    first = next(f for f in doc["findings"] if f["rule"] == "frame_introspection")
    assert first["file"] == "kernel.py" and first["line"] >= 1


@pytest.mark.fast
@pytest.mark.parametrize(
    "source, rule",
    [
        (DELEGATES_COPY, "delegates_to_baseline"),
        (DELEGATES_IMPORT, "delegates_to_baseline"),
        (RENAMED_BASELINE, "unchanged_computation"),
        (BASELINE, "unchanged_computation"),
    ],
    ids=["copy", "import", "renamed", "unchanged"],
)
def test_delegation_to_the_baseline_or_its_computation_fails(tmp_path, source, rule):
    doc = run_review(tmp_path, source)
    assert doc["verdict"] == "fail" and rule in rules_of(doc), doc["findings"]


@pytest.mark.fast
def test_a_baseline_copy_kept_beside_a_new_path_is_not_a_pass(tmp_path):
    source = DELEGATES_COPY.replace(
        "    return _reference(x)\n",
        "    if x.dtype == np.float64:\n        return _reference(x)\n"
        "    e = np.exp(x - x.max(axis=-1, keepdims=True))\n"
        "    return e / e.sum(axis=-1, keepdims=True)\n",
    )
    assert run_review(tmp_path, source)["verdict"] == "inconclusive"


@pytest.mark.fast
@pytest.mark.parametrize("name", sorted(OBFUSCATED))
def test_an_obfuscated_import_or_attribute_is_never_a_pass(tmp_path, name):
    doc = run_review(tmp_path, OBFUSCATED[name])
    assert doc["verdict"] in ("fail", "inconclusive"), doc
    if name in ("dunder_import", "import_module", "getattr_literal", "getattr_concat"):
        assert doc["verdict"] == "fail"  # NB: resolved statically to gc, inspect, _getframe


@pytest.mark.fast
def test_public_shapes_and_seeds_and_process_tricks_are_flagged(tmp_path):
    cases = {
        "if x.shape == (64, 1024):\n        return x": "special_cases_public_shape",
        "rng = np.random.default_rng(11)": "replays_seed",
        "import os; os.kill(os.getppid(), 9)": "process_control",
        "import time; time.perf_counter = lambda: 0.0": "clock_manipulation",
        "import threading; threading.Thread(target=print).start()": "threads_beyond_binding",
        "data = open('/proc/self/environ').read()": "reads_outside_scope",
        "import os; seed = os.environ.get('RSI_SEED')": "reads_outside_scope",
        "import gc; gc.get_objects()": "gc_introspection",
        "import ctypes": "native_access",
        "import oracle": "imports_harness",
    }
    for body, rule in cases.items():
        source = f"import numpy as np\n\n\ndef softmax(x):\n    {body}\n    return x\n"
        doc = run_review(tmp_path, source)
        assert doc["verdict"] == "fail" and rule in rules_of(doc), (body, doc["findings"])
    # NB: a dimension of a public case compared alone is suspicious, not proof
    doc = run_review(tmp_path, "def softmax(x):\n    if x.shape[-1] == 4096:\n        pass\n")
    assert doc["verdict"] == "inconclusive"


@pytest.mark.fast
def test_declared_rules_forbid_and_allow(tmp_path):
    source = FAST.replace("import numpy as np", "import numpy as np\nimport scipy.special")
    assert run_review(tmp_path, source)["verdict"] == "pass"
    doc = run_review(tmp_path, source, {"forbid": ["scipy.special"]})
    assert doc["verdict"] == "fail" and rules_of(doc) == {"forbidden_import"}
    call = FAST.replace("np.exp(e, out=e)", "np.linalg.norm(e)\n    np.exp(e, out=e)")
    doc = run_review(tmp_path, call, {"forbid": ["numpy.linalg.norm"]})
    assert rules_of(doc) == {"forbidden_call"}
    threads = "import threading\n" + FAST
    assert run_review(tmp_path, threads)["verdict"] == "fail"
    assert run_review(tmp_path, threads, {"allow": ["threading"]})["verdict"] == "pass"
    assert run_review(tmp_path, threads, spec=dict(SPEC, threads=4))["verdict"] == "pass"


@pytest.mark.fast
def test_an_external_reviewer_adds_evidence_and_can_only_add_findings(tmp_path):
    script = tmp_path / "reviewer.py"
    script.write_text(
        "import json, sys\n"
        "verdict = sys.argv[1]\n"
        "print(json.dumps({'verdict': verdict, 'findings': [] if verdict == 'pass' else "
        "[{'file': 'kernel.py', 'line': 3, 'detail': 'looks like a lookup table'}]}))\n"
    )
    cmd = f"{sys.executable} {script} "
    ok = run_review(tmp_path, FAST, {"reviewer": cmd + "pass"})
    assert ok["verdict"] == "pass" and ok["reviewer"]["verdict"] == "pass"
    assert ok["reviewer"]["stdout_sha256"] and ok["reviewer"]["exit"] == 0
    bad = run_review(tmp_path, FAST, {"reviewer": cmd + "fail"})
    assert bad["verdict"] == "fail" and rules_of(bad) == {"reviewer"}
    # NB: a reviewer that says pass waives nothing the static rules found
    assert (
        run_review(tmp_path, FRAME_INTROSPECTION, {"reviewer": cmd + "pass"})["verdict"] == "fail"
    )
    broken = run_review(tmp_path, FAST, {"reviewer": f"{sys.executable} -c 'print(1)'"})
    assert broken["verdict"] == "inconclusive" and rules_of(broken) == {"reviewer_failed"}
    missing = run_review(tmp_path, FAST, {"reviewer": "/nonexistent/reviewer"})
    assert missing["verdict"] == "inconclusive"


@pytest.mark.fast
def test_a_failed_or_inconclusive_review_blocks_selection_but_never_changes_a_verdict():
    rnd = _harness("round")
    sel = _harness("selection")
    verdict = {
        "verdict": "PASS",
        "reasons": [],
        "speedup": {"point": 2.0, "lo": 1.8, "hi": 2.2},
        "threshold": 1.05,
        "noise_floor": 0.0,
    }
    check = {"status": "ok", "cases": []}
    docs = []
    for n, (v, rv) in enumerate(
        [("PASS", "pass"), ("PASS", "fail"), ("PASS", "inconclusive"), ("FAIL", "pass")], 1
    ):
        meta = {
            "campaign": "//p:c",
            "round": n,
            "label": f"//p:c.round-{n}",
            "kind": "task",
            "digest": f"d{n}",
            "files": {},
            "hypothesis": "",
            "usage": {},
            "submitted_at": 0.0,
        }
        speed = dict(verdict["speedup"], point=1.5 if n == 1 else 3.0)
        review_doc = {
            "verdict": rv,
            "findings": []
            if rv == "pass"
            else [{"rule": "frame_introspection", "severity": rv, "file": "kernel.py", "line": 5}],
        }
        doc = rnd.round_doc(meta, dict(verdict, verdict=v, speedup=speed), check, {}, review_doc)
        assert doc["verdict"] == v  # NB: the review never rewrites the numbers' verdict
        assert doc["accepted"] is (v == "PASS" and rv == "pass")
        docs.append(doc)
    best = sel.select(docs)
    assert best["selected"]["round"] == 1 and best["selected"]["review"] == "pass"
    assert "review fail" in best["considered"][1]["why_not"]
    assert "review inconclusive" in best["considered"][2]["why_not"]
    assert sel.select(docs[1:3])["selected"] is None
    fin = _harness("final")
    bad = {"selected": {"round": 2, "review": "fail"}}
    with pytest.raises(RuntimeError, match="review"):
        fin.final({"candidates": {"2": "x"}, "specs": {}, "outputs": []}, bad, 1, Path("."))


@pytest.mark.fast
def test_the_review_writes_its_document_from_the_command_line(tmp_path):
    cand, base = tmp_path / "c", tmp_path / "b"
    cand.mkdir()
    base.mkdir()
    (cand / "kernel.py").write_text(FRAME_INTROSPECTION)
    (base / "kernel.py").write_text(BASELINE)
    (tmp_path / "spec.json").write_text(json.dumps(SPEC))
    (tmp_path / "rules.json").write_text("{}")
    argv = ["review.py", "--task", ".", "--candidate", str(cand), "--baseline", str(base)]
    argv += ["--spec", str(tmp_path / "spec.json"), "--rules", str(tmp_path / "rules.json")]
    argv += ["--out", str(tmp_path / "review.json")]
    old = sys.argv
    try:
        sys.argv = argv
        assert review.main() == 0
    finally:
        sys.argv = old
    doc = json.loads((tmp_path / "review.json").read_text())
    assert doc["verdict"] == "fail" and doc["files"]["kernel.py"]
