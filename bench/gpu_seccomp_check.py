"""bench/gpu_check.sh's first step: a CUDA worker starts and answers its calls under the seccomp
filter (confine.py) in every isolation mode this machine can run, proven by a real check of
silu_mul's baseline on `cuda` (the worker imports torch, initialises CUDA, runs every case).

Writes each mode's evidence under the folder it is given; prints one line per mode (OK, FAIL
or SKIP with why); exit 0 when no mode failed (no GPU at all: every mode SKIP). Never decides
a verdict and never runs without a CUDA device."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from harness_support import (  # noqa: E402
    TASKS,
    isolation_unavailable,
    open_to_worker_uid,
    run_check,
    task_spec,
)

MODES = ("namespaces", "uid", "process")


def cuda_missing() -> str | None:
    try:
        import torch
    except ImportError as exc:
        return f"no torch ({exc})"
    return None if torch.cuda.is_available() else "torch.cuda.is_available() is False"


def check_mode(mode: str, out: Path) -> tuple[str, str]:
    """(OK | FAIL | SKIP, detail) for one isolation mode."""
    why = isolation_unavailable(mode)
    if why:
        return "SKIP", why
    os.environ["RSI_WORKER_ISOLATION"] = mode
    tmp = Path(tempfile.mkdtemp(prefix=f"rsi-seccomp-cuda-{mode}-"))
    try:
        if mode == "uid":
            open_to_worker_uid(tmp)
        spec = task_spec("silu_mul", device="cuda")
        proc, path = run_check(tmp, "silu_mul", TASKS / "silu_mul" / "baseline", spec, mode)
        doc = json.loads(path.read_text()) if path.exists() else None
        if path.exists():
            shutil.copy(path, out / f"seccomp_cuda_{mode}.json")
        referee = (doc or {}).get("referee") or {}
        conf = referee.get("confinement") or {}
        own = mode == "namespaces" or conf.get("signals") == "own"
        if proc.returncode == 0 and (doc or {}).get("status") == "ok" and conf.get("seccomp") == 2:
            if referee.get("isolation", mode) == mode and own:
                return "OK", f"confinement {conf}"
        return "FAIL", (
            f"exit {proc.returncode}, status {(doc or {}).get('status')}, isolation "
            f"{referee.get('isolation')}, confinement {conf}, reasons "
            f"{json.dumps((doc or {}).get('reasons'))[:1500]}; stderr {proc.stderr[-2000:]}"
        )
    finally:
        os.environ.pop("RSI_WORKER_ISOLATION", None)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/rsi-gpu-out")
    out.mkdir(parents=True, exist_ok=True)
    missing = cuda_missing()
    if missing:
        print(f"SKIP all modes: {missing}")
        return 0
    failed = 0
    for mode in MODES:
        verdict, detail = check_mode(mode, out)
        print(f"{verdict} {mode}: {detail}", flush=True)
        failed += verdict == "FAIL"
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
