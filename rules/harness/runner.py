"""Check zygote: imports the framework once, then runs each case in a forked, pristine child.

Each child loads the case's inputs from .npy files, imports the candidate by path, calls the
entry once, enforces the exact output type, and writes the output plus its post-call copy of the
inputs. It never judges values; check.py does that in the parent. On a `cuda` spec the child
initialises CUDA itself, copies the inputs to the device (same view geometry) before importing
the candidate, synchronises after the call, and copies outputs and inputs back for judging.
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from pathlib import Path


def _load_common():
    path = Path(__file__).resolve().parent / "_common.py"
    spec = importlib.util.spec_from_file_location("_rsi_harness_common", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


C = _load_common()
np = C.np


def _error(exc: BaseException) -> dict:
    return {"type": type(exc).__name__, "message": str(exc)[:2000],
            "traceback": traceback.format_exc()[-4000:]}


def _to_device(job: dict, inputs: dict, result: dict):
    """Move the case's inputs to the spec's accelerator (CUDA initialised here, in the forked
    child, never in the zygote); None and a `harness_error` outcome if that fails."""
    try:
        torch = C.import_torch()
        torch.cuda.init()
        result["device"] = C.cuda_device_facts(torch)
        dev_inputs, spans, _ = C.inputs_to_device(inputs, job["device"])
        torch.cuda.synchronize()
    except BaseException as exc:  # noqa: BLE001  no candidate code has run: the harness's fault
        result.update(outcome="harness_error", error=_error(exc))
        return None
    return torch, dev_inputs, spans


def run_case(job: dict, io_dir: Path) -> None:
    result: dict = {"phase": "load_inputs"}
    C.set_threads(job["framework"], job["threads"])
    inputs, buffers, manifest = C.read_inputs(io_dir)
    device = job.get("device", "cpu")
    spans = torch = None
    if device != "cpu":
        moved = _to_device(job, inputs, result)
        if moved is None:
            C.write_json(io_dir / "result.json", result)
            return
        torch, inputs, spans = moved
    result["phase"] = "import"
    try:
        fn = C.load_impl_entry(Path(job["impl_dir"]), job["entry"])
    except SyntaxError as exc:
        result.update(outcome="syntax_error", error=_error(exc))
    except LookupError as exc:
        result.update(outcome="missing_entry", error=_error(exc))
    except BaseException as exc:  # noqa: BLE001  anything the candidate raises at import
        result.update(outcome="import_error", error=_error(exc))
    else:
        result["phase"] = "call"
        try:
            out = fn(**inputs)
            if torch is not None:
                torch.cuda.synchronize()  # NB: an asynchronous kernel fault is the candidate's
                for name, span in spans.items():
                    buffers[name][...] = span.cpu().numpy()
        except BaseException as exc:  # noqa: BLE001  SystemExit included: it is the candidate's
            result.update(outcome="exception", error=_error(exc))
        else:
            result["phase"] = "output"
            arr, meta = C.materialise_output(out, job["framework"], device)
            del out
            result["output"] = meta
            if arr is not None and meta["problem"] is None:
                np.save(io_dir / "out.npy", arr, allow_pickle=False)
            result["outcome"] = "returned"
    for name, buf in buffers.items():
        np.save(io_dir / f"after_{name}.npy", buf, allow_pickle=False)
    result["manifest_names"] = sorted(manifest)
    C.write_json(io_dir / "result.json", result)


def run_job(job: dict) -> None:
    work_root = Path(job["work_dir"])
    for item in job["items"]:
        io_dir = Path(item["io_dir"])
        C.write_json(io_dir / "started.json", {"started": True})
        status = C.fork_item(lambda io_dir=io_dir: run_case(job, io_dir),
                             float(job["call_timeout_s"]), work_root, io_dir / "log.txt")
        C.write_json(io_dir / "status.json", status)
        if status["timed_out"] or status["exit_code"] != 0:
            break
        result = C.read_json(io_dir / "result.json") if (io_dir / "result.json").exists() else {}
        if not result or result.get("outcome") in ("syntax_error", "missing_entry", "import_error",
                                                     "harness_error"):
            break


if __name__ == "__main__":
    sys.exit(C.zygote_main(__doc__, run_job))
