"""The model checker of "never a stale result" (bench/model_check.py): it catches a stale
output (fast, with no rsi run: the check itself must be able to fail), a planted stale engine
(e2e), and a short run of seeded sequences over every build mode finds no difference (e2e)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from model_check import Sequence, main  # noqa: E402
from model_check_run import Outcome  # noqa: E402
from model_check_ws import edit_source, oracle, requested  # noqa: E402


def _export(seq: Sequence, want: dict[str, bytes]) -> None:
    """What a correct build leaves under out/."""
    for rel, data in want.items():
        path = seq.ws / "out" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


@pytest.mark.fast
def test_a_stale_output_after_a_same_size_rewrite_is_a_difference(tmp_path):
    seq = Sequence(11, ["plain"], tmp_path, None, "none", 0)
    want = oracle(seq.ws, requested(seq.ws, "//..."))
    _export(seq, want)
    seq.check(0, Outcome("plain", 0, "", ""), want, "single")
    assert seq.differences == []
    # the sources change under out/ (same size, mtime put back); a build that says "ok" and
    # leaves out/ as it was is reported with its seed, step and sequence
    edit_source(seq.ws, seq.model, seq.rng, "same_size")
    newer = oracle(seq.ws, requested(seq.ws, "//..."))
    assert newer != want
    seq.check(1, Outcome("plain", 0, "", ""), newer, "single")
    (found,) = seq.differences
    assert found["seed"] == 11 and found["step"] == 1 and found["detail"]
    # a reported artifact (a job's digest) that is not the oracle's is one too
    rel = next(iter(newer))
    _export(seq, newer)
    seq.check(2, Outcome("job", 0, "", "", digests={rel: "0" * 64 + "/1"}), newer, "single")
    assert len(seq.differences) == 2 and "job artifact" in seq.differences[1]["detail"][0]


@pytest.mark.fast
def test_exit_0_with_a_needed_source_missing_is_a_difference(tmp_path):
    seq = Sequence(12, ["plain"], tmp_path, None, "none", 0)
    while oracle(seq.ws, requested(seq.ws, "//...")) is not None:
        edit_source(seq.ws, seq.model, seq.rng, "delete")  # until a needed one is gone
    seq.check(0, Outcome("plain", 1, "", ""), None, "single")
    assert seq.differences == [] and seq.failures == []
    seq.check(1, Outcome("plain", 0, "", ""), None, "single")
    assert [d["step"] for d in seq.differences] == [1]


@pytest.mark.e2e
def test_a_planted_stale_engine_fails_the_check(tmp_path):
    out = tmp_path / "planted.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "model_check.py"), "--sequences", "2", "--seed",
         "1", "--modes", "plain", "--plant", "stale", "--out", str(out), "--quiet"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "RSI_SERVER": "0"},
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert json.loads(out.read_text())["differences"] and "DIFFERENCE seed" in proc.stdout


@pytest.mark.e2e
def test_a_short_run_of_every_mode_finds_no_stale_output(tmp_path):
    summary = main(
        ["--sequences", "10", "--seed", "9001", "--crosscheck-every", "4", "--quiet",
         "--out", str(tmp_path / "model_check.json")]
    )  # fmt: skip
    assert summary["sequences"] == 10 and summary["crosschecks"] > 0
    assert set(summary["builds"]) == {"plain", "served", "watch", "job", "env2"}
    assert summary["checker_errors"] == [], summary["checker_errors"]
    assert summary["oracle_disagreements"] == [], summary["oracle_disagreements"]
    assert summary["differences"] == [], json.dumps(summary["differences"], indent=1)
    assert summary["unexpected_failures"] == [], summary["unexpected_failures"]
