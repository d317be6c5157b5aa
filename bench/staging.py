"""Staging a fan-in's inputs: one action of N small inputs (the fan-in root at 100k has 10,000)
run by the local executor with prepared input trees (rsi.executors.staged: the tree is brought
to the inputs by their difference, hard links to the blobs) and without (copied into a pooled
slot's tmpfs), interleaved in one run. Each round changes one input, as a one-change build
does. Prints the executor's wall time per action beside the action's own time.

    python bench/staging.py [--inputs 10000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rsi.action import Action  # noqa: E402
from rsi.digest import FileNode  # noqa: E402
from rsi.executors import base  # noqa: E402
from rsi.executors.local import LocalExecutor  # noqa: E402
from rsi.store import LocalStore  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--inputs", type=int, default=10000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    n = args.inputs
    with tempfile.TemporaryDirectory(prefix="rsi-staging-") as tmp:
        store = LocalStore(Path(tmp) / "store")
        nodes = [
            (f"mid_{j}.out", FileNode(store.put_bytes(b"x" * 200 + b"%d\n" % j), False))
            for j in range(n)
        ]
        ex = LocalExecutor(pool=True)
        files = " ".join(rel for rel, _ in nodes[:50])

        def action(r: int) -> Action:
            ins = list(nodes)
            ins[n // 2] = (ins[n // 2][0], FileNode(store.put_bytes(b"changed %d\n" % r), False))
            return Action(
                argv=("/bin/sh", "-c", f"cat {files} > root.out; ls | wc -l >> root.out"),
                inputs=tuple(ins),
                outputs=("root.out",),
                env=(("PATH", "/usr/bin:/bin"),),
                label="//:root",
                mnemonic="Command",
            )

        rows: dict[str, list[float]] = {"tree": [], "tree_own": [], "copy": [], "copy_own": []}
        time.sleep(1.1)
        for r in range(-1, args.repeat):  # NB: round -1 warms both ways (the tree is made)
            for name, on in (("tree", "1"), ("copy", "0")):
                os.environ["RSI_STAGE_TREES"] = on
                a = action(r)
                t0 = time.perf_counter()
                res = ex.run(a, store)
                dt = time.perf_counter() - t0
                assert res.ok, store.read_bytes(res.stderr)
                assert (res.host.get("sandbox_inputs") == "prepared tree") == (on == "1")
                if r >= 0:
                    rows[name].append(dt)
                    rows[name + "_own"].append(res.timing["wall_s"])
                base.TRASH.drain()
            time.sleep(1.1)  # NB: past the racy window, as between two builds
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(
        f"{n} inputs, one changed per round: prepared tree {med['tree'] * 1e3:.1f} ms per action "
        f"(own {med['tree_own'] * 1e3:.1f} ms) | copied into a slot {med['copy'] * 1e3:.1f} ms "
        f"(own {med['copy_own'] * 1e3:.1f} ms) | load {os.getloadavg()[0]:.1f}"
    )
    print(json.dumps({k: [round(x, 4) for x in v] for k, v in rows.items()}))


if __name__ == "__main__":
    main()
