"""A worker faults its heap in before any call (rules/harness/worker.py, `_prefault_heap`): a
call's temporaries must land on pages the process already has, or a timed call pays for page
faults the other arm's calls did not (measured: one timed call per arm-run of one sandbox with
256 faults, 1.5-2x slower). Each case runs in a fresh interpreter, as a forked worker starts
with a heap of its own; the figure asserted is a count of page faults, never a time."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from harness_support import HARNESS

pytestmark = pytest.mark.fast

# NB: a worker's malloc settings, then (or not) the prefault, then 24 MiB of temporaries in
# three 8 MiB arrays, written whole, as a call's would be: the minor faults that took
PROBE = """
import importlib.util, json, resource, sys
spec = importlib.util.spec_from_file_location("w", sys.argv[1] + "/worker.py")
W = importlib.util.module_from_spec(spec); spec.loader.exec_module(W)
W._pin_malloc()
import numpy as np
if sys.argv[2] == "1":
    W._prefault_heap(1 << 20)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    blocks = [np.ones(1 << 20) for _ in range(3)]
    del blocks
after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
print(json.dumps({"faults": after - before}))
"""


def _faults(prefault: bool) -> int:
    got = subprocess.run(
        [sys.executable, "-c", PROBE, str(HARNESS), "1" if prefault else "0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(got.stdout.strip().splitlines()[-1])["faults"]


def test_temporaries_after_the_prefault_take_no_new_pages():
    without, with_prefault = _faults(False), _faults(True)
    # NB: 24 MiB is 6,144 pages of 4 KiB: without the prefault they are faulted in, in fewer
    # faults where the kernel maps larger folios (1,531 here; the probe's own proof that it
    # can see them); after it, a few for small objects at most
    if without <= 500:
        # NB: a host whose kernel maps fresh anonymous memory in huge pages (THP "always")
        # faults 24 MiB in a dozen times: too few to tell a prefault from none
        pytest.skip(f"24 MiB took only {without} faults without a prefault: nothing to tell")
    assert with_prefault * 10 < without, (with_prefault, without)
