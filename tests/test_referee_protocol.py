"""The referee's fail-closed pieces on their own (issue 29): the reply parser, the confinement
report, the seccomp filter in a forked child, sealed memfds, and the evidence written when the
referee itself fails after candidate code ran."""

from __future__ import annotations

import errno
import json
import math
import os

import pytest
from harness_support import load_harness_module

pytestmark = pytest.mark.fast

R = load_harness_module("referee", "_rsi_test_proto")
K = load_harness_module("check", "_rsi_test_proto")
M = load_harness_module("measure_doc", "_rsi_test_proto")
confine = R.confine

DONE = {
    "op": "done",
    "i": 3,
    "out": {
        "type": "numpy.ndarray",
        "dtype": "float32",
        "shape": [2, 3],
        "device": "cpu",
        "nbytes": 24,
        "problem": None,
    },
}


def test_a_well_formed_reply_parses():
    assert R.parse_reply(json.dumps(DONE).encode()) == DONE


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 50_000 + b"]" * 50_000,
        b'{"op":"done","out":' + b"[" * 50_000 + b"]" * 50_000 + b"}",
        b'{"op":"done","i":NaN}',
        b'{"op":"done","i":3,"out":{"type":NaN}}',
        b'{"op":"done","i":3,"out":{"nbytes":Infinity}}',
        b'{"op":"done","i":1e999}',
        b'{"op":"done","i":' + b"9" * 5000 + b"}",
        b'{"op":"done","i":true}',
        b'{"op":"done","i":3,"forged":1}',
        b'{"op":"done","i":3,"out":{"shape":[-1]}}',
        b'{"op":"done","i":3,"out":{"extra":1}}',
        b"\xff\xfe{",
        b"[]",
        b'{"i":3}',
    ],
)
def test_any_other_bytes_are_a_protocol_fault_never_another_exception(body):
    """Defence: parse_reply. Without it a deep reply raised RecursionError and a NaN one made
    the evidence unwritable."""
    with pytest.raises(R.WorkerFault) as info:
        R.parse_reply(body)
    assert info.value.code == "protocol"


def test_strings_holding_brackets_are_not_nesting():
    body = json.dumps({"op": "imported", "message": "[" * 100}).encode()
    assert R.parse_reply(body)["message"] == "[" * 100


def test_a_worker_lacking_any_confinement_is_refused():
    full = {"cap_eff": 0, "dumpable": False, "seccomp": 2, "candidate_modules_in_zygote": 0}
    assert R.confinement_missing(full) is None
    assert R.confinement_missing(None)
    for key, bad in [("cap_eff", 1 << 19), ("dumpable", True), ("seccomp", 0)]:
        assert R.confinement_missing(dict(full, **{key: bad}))
    assert R.confinement_missing(dict(full, candidate_modules_in_zygote=1))
    assert R.confinement_missing(dict(full, seccomp=0), skipped=["seccomp"]) is None


def test_sealed_memfds_cannot_change_size_but_stay_writable():
    fd = confine.sealed_memfd("t", 4096)
    try:
        for size in (0, 8192):
            with pytest.raises(OSError):
                os.ftruncate(fd, size)
        assert os.pwrite(fd, b"x", 0) == 1
    finally:
        os.close(fd)


@pytest.mark.skipif(not confine.seccomp_supported(), reason="no seccomp on this host")
def test_the_filter_refuses_reaching_the_parent_and_allows_the_own_tree():
    """A forked child under the filter, protecting its parent: every way to the parent is
    refused (EPERM); signalling itself and its own group still works."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        results = {}
        try:
            os.setsid()
            parent = os.getppid()
            confine.drop_caps()
            confine.no_dump()
            confine.install_seccomp([parent], [os.getpgid(parent)], own_pid=os.getpid())
            tries = {
                "kill_parent": lambda: os.kill(parent, 0),
                "kill_all": lambda: os.kill(-1, 0),
                "killpg_parent": lambda: os.killpg(os.getpgid(parent), 0),
                "affinity_parent": lambda: os.sched_setaffinity(parent, os.sched_getaffinity(0)),
                "nice_parent": lambda: os.setpriority(os.PRIO_PROCESS, parent, 0),
                "nice_uid": lambda: os.setpriority(os.PRIO_USER, 0, 0),
                "nice_self": lambda: os.setpriority(os.PRIO_PROCESS, 0, 0),
                "kill_self": lambda: os.kill(os.getpid(), 0),
                "killpg_own": lambda: os.killpg(0, 0),
            }
            for name, attempt in tries.items():
                try:
                    attempt()
                    results[name] = "ok"
                except OSError as exc:
                    results[name] = exc.errno
            libc = confine._c()
            results["ptrace"] = libc.ptrace(16, parent, None, None)
            results["caps"] = confine.effective_caps()
            results["dumpable"] = confine.is_dumpable()
        finally:
            os.write(w, json.dumps(results).encode())
            os._exit(0)
    os.close(w)
    got = json.loads(os.read(r, 65536))
    os.waitpid(pid, 0)
    os.close(r)
    for name in ("kill_parent", "kill_all", "killpg_parent", "affinity_parent", "nice_parent"):
        assert got[name] == errno.EPERM, got
    assert got["nice_uid"] == errno.EPERM, got
    assert got["kill_self"] == "ok" and got["killpg_own"] == "ok", got
    assert got["nice_self"] == "ok", got
    assert got["ptrace"] == -1 and got["caps"] == 0 and got["dumpable"] is False


def test_the_filter_is_built_for_both_architectures():
    for arch in ("x86_64", "aarch64"):
        prog = confine.build_filter([2, 1], [2], own_pid=5, arch=arch)
        assert prog[0] == (0x20, 0, 0, 4)  # load the arch first
        assert prog[-1] == (0x06, 0, 0, confine.RET_EPERM)
    with pytest.raises(confine.ConfineError):
        confine.build_filter([], [], arch="mips")


def test_a_referee_error_fails_the_first_unjudged_case():
    records = [{"reason": "ok", "passed": True}, {"reason": None}, {"reason": None}]
    try:
        raise KeyError("boom")
    except KeyError as exc:
        K.referee_error(records, exc)
    assert records[0]["passed"] is True
    assert records[1]["reason"] == "referee_error" and "KeyError" in records[1]["detail"]
    assert records[2]["reason"] == "not_run"


def test_an_unwritable_document_is_written_as_a_referee_error(tmp_path):
    doc = {"status": "ok", "failure_kind": None, "reasons": [], "x": float("nan")}
    try:
        K.C.write_json(tmp_path / "a.json", doc)
    except ValueError as exc:
        K.C.write_json(tmp_path / "a.json", K.failure_document(doc, exc))
    written = json.loads((tmp_path / "a.json").read_text())
    assert written["status"] == "candidate_failure"
    assert written["failure_kind"] == "referee_error" and written["x"] is None
    mdoc = {"status": "ok", "invalid": {"baseline": [], "candidate": []}, "y": math.inf}
    try:
        M.C.write_json(tmp_path / "m.json", mdoc)
    except ValueError as exc:
        M.C.write_json(tmp_path / "m.json", M.failure_document(mdoc, exc))
    written = json.loads((tmp_path / "m.json").read_text())
    assert written["status"] == "candidate_invalid"
    assert written["invalid"]["candidate"][0]["code"] == "referee_error"


def test_the_worker_loads_confine_by_path():
    """worker.py runs as `python -I` inside the sandbox: no sys.path to the harness."""
    W = load_harness_module("worker", "_rsi_test_proto")
    assert W.confine.__file__.endswith("confine.py")
