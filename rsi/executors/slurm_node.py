"""The Slurm job's side of an action: `python -m rsi.executors.slurm_node JOB_DIR`. It must never
write outside its job folder and the action's scratch.

Reads `JOB_DIR/action.json` (written by rsi/executors/slurm.py), runs the action in this node's
sandbox with the local executor against the shared store (inputs are blobs there; outputs go
there), and writes `JOB_DIR/result.json`: the action's result and this node's host facts, which
are the evidence's hardware fingerprint. SIGTERM (scancel, Slurm's time limit) cancels the
action, whose sandbox is then killed. Exit 0 once a result is written, whatever the action's
own exit code; 2 when no result could be produced (the submitting side reports that as an
infrastructure failure)."""

from __future__ import annotations

import json
import signal
import socket
import sys
import threading
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m rsi.executors.slurm_node JOB_DIR", file=sys.stderr)
        return 2
    job_dir = Path(args[0])
    cancel = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: cancel.set())
    try:
        from rsi.executors.local import LocalExecutor
        from rsi.executors.slurm import decode_action
        from rsi.fsutil import atomic_write_bytes
        from rsi.limits import Limits
        from rsi.store import LocalStore

        doc = json.loads((job_dir / "action.json").read_text())
        action = decode_action(doc)
        store = LocalStore(Path(doc["store"]), action.digest_function)
        limits = Limits(**doc["limits"])
        result = LocalExecutor(limits=limits).run(action, store, cancel)
    except Exception as exc:  # noqa: BLE001 - NB: any failure here is infrastructure
        print(f"rsi slurm node: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    out = {"result": result.to_json(), "node_host": socket.gethostname()}
    atomic_write_bytes(job_dir / "result.json", json.dumps(out).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
