"""Helpers of the referee scripts (check, measure): input transport, digests, processes, devices.

The spec, its errors and JSON files live in `_core.py` (re-exported here), which assessments load
without this file.

Standalone on purpose: stdlib + numpy, torch only when a task uses it. Never imports `rsi` or
`rules`, and loads task or candidate code only by explicit file path.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types
import uuid
from pathlib import Path
from typing import Any

import numpy as np

PR_SET_CHILD_SUBREAPER = 36


def _sibling(stem: str) -> types.ModuleType:
    """A sibling harness module by file path, once per process (one HarnessError class)."""
    name = f"_rsi_harness_{stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, Path(__file__).resolve().parent / f"{stem}.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


_core = _sibling("_core")
SPEC_SCHEMA, FRAMEWORKS, DEVICES = _core.SPEC_SCHEMA, _core.FRAMEWORKS, _core.DEVICES
INFRA_EXIT, HarnessError = _core.INFRA_EXIT, _core.HarnessError
BUSY_EXIT, busy_reason, contended = _core.BUSY_EXIT, _core.busy_reason, _core.contended
write_json, read_json, finite_or_none = _core.write_json, _core.read_json, _core.finite_or_none
json_safe, error_summary = _core.json_safe, _core.error_summary
sha256_bytes, load_spec, tolerance_for = _core.sha256_bytes, _core.load_spec, _core.tolerance_for


def tree_digest(root: Path) -> tuple[str, list[str]]:
    """sha256 over the sorted (relative path, content) of every regular file under `root`."""
    root = Path(root)
    if not root.is_dir():
        raise HarnessError(f"implementation folder {root} does not exist")
    files = sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink()
    )
    h = hashlib.sha256(b"rsi-tree-v1\0")
    for rel in files:
        data = (root / rel).read_bytes()
        h.update(rel.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return h.hexdigest(), files


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed from a canonical encoding of `parts` (spec seed, pair index, role, ...)."""
    text = json.dumps(parts, separators=(",", ":"), sort_keys=True)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


# ---------------------------------------------------------------------------------------------
# Loading code by path


def worker_entry(spec: dict, workloads: types.ModuleType) -> dict:
    """The entry as the worker gets it: a class contract also carries the task's init inputs
    (`workloads.init_inputs()`, JSON values) and the seed its weights are drawn with."""
    entry = dict(spec["entry"])
    if entry.get("class"):
        make = getattr(workloads, "init_inputs", None)
        try:
            init = list(make()) if callable(make) else []
            json.dumps(init)
        except Exception as exc:  # noqa: BLE001  a broken workload is the harness's fault
            raise HarnessError(f"workloads.init_inputs failed: {exc!r}") from exc
        # NB: the weights' seed is the task's (workloads.INIT_SEED, which its oracle uses too),
        # never the run's secret: baseline, candidate and oracle must get the same parameters
        names = getattr(workloads, "NAMES", None)
        if not (isinstance(names, (list, tuple)) and all(isinstance(n, str) for n in names)):
            raise HarnessError(
                "a class entry needs workloads.NAMES: the names of make_inputs' values in the "
                "order the model takes them (inputs reach the worker by name, not in order)"
            )
        entry.update(
            init=init,
            init_seed=int(getattr(workloads, "INIT_SEED", 0)),
            device=spec.get("device", "cpu"),
            args=list(names),
        )
    return entry


def load_module_from_path(path: Path, name_hint: str) -> types.ModuleType:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(str(path))
    name = f"_rsi_{name_hint}_{uuid.uuid4().hex[:12]}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_task_module(task_dir: Path, stem: str) -> types.ModuleType:
    path = Path(task_dir) / f"{stem}.py"
    if not path.is_file():
        raise HarnessError(f"task folder {task_dir} lacks {stem}.py")
    try:
        return load_module_from_path(path, stem)
    except Exception as exc:  # a broken task is a harness fault, never the candidate's
        raise HarnessError(f"cannot load {path}: {type(exc).__name__}: {exc}") from exc


# ---------------------------------------------------------------------------------------------
# Arrays: names, raw extents, transport, digests


def import_torch():
    import torch

    return torch


def is_torch_tensor(value: Any) -> bool:
    mod = sys.modules.get("torch")
    return mod is not None and isinstance(value, mod.Tensor)


def dtype_name(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return value.dtype.name
    return str(value.dtype).removeprefix("torch.")


def _geometry(value: Any) -> tuple[int, list[int], list[int], int, int]:
    """(data address, shape, byte strides, itemsize, byte offset of first element in extent)."""
    if isinstance(value, np.ndarray):
        addr, shape, strides, itemsize = (
            value.ctypes.data,
            list(value.shape),
            list(value.strides),
            value.itemsize,
        )
    else:
        itemsize = value.element_size()
        addr, shape = value.data_ptr(), list(value.shape)
        strides = [s * itemsize for s in value.stride()]
    lo = sum(min(0, s * (n - 1)) for s, n in zip(strides, shape, strict=True) if n > 0)
    return addr, shape, strides, itemsize, -lo


def extent_bytes(value: Any) -> bytes:
    """The raw bytes of the memory span a (possibly strided) array view covers."""
    addr, shape, strides, itemsize, neg_lo = _geometry(value)
    if any(n == 0 for n in shape):
        return b""
    hi = sum(max(0, s * (n - 1)) for s, n in zip(strides, shape, strict=True)) + itemsize
    size = neg_lo + hi
    return bytes((ctypes.c_char * size).from_address(addr - neg_lo))


def describe_input(value: Any) -> dict:
    if isinstance(value, bool | int | float) and not isinstance(value, np.generic):
        return {"kind": "scalar", "type": type(value).__name__, "value": value}
    if type(value) is np.ndarray:
        framework = "numpy"
    elif is_torch_tensor(value) and type(value) is sys.modules["torch"].Tensor:
        framework = "torch"
        if value.device.type != "cpu":
            raise HarnessError("only CPU tensors can be transported to the child")
    else:
        raise HarnessError(f"workloads produced an unsupported input type {type(value).__name__}")
    _, shape, strides, itemsize, neg_lo = _geometry(value)
    return {
        "kind": "array",
        "framework": framework,
        "dtype": dtype_name(value),
        "shape": shape,
        "strides_bytes": strides,
        "offset_bytes": neg_lo,
        "itemsize": itemsize,
    }


def inputs_digest(inputs: dict[str, Any]) -> str:
    header = {name: describe_input(inputs[name]) for name in sorted(inputs)}
    return digest_spans(header, lambda name: extent_bytes(inputs[name]))


def digest_spans(header: dict[str, dict], span_bytes) -> str:
    """The input digest from each input's description and `span_bytes(name)` of every array."""
    h = hashlib.sha256(b"rsi-input-v1\0")
    h.update(json.dumps(header, sort_keys=True, separators=(",", ":")).encode() + b"\0")
    for name in sorted(header):
        if header[name]["kind"] == "array":
            data = span_bytes(name)
            h.update(name.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return h.hexdigest()


def as_float64(raw: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return raw.astype(np.float64)


# ---------------------------------------------------------------------------------------------
# Comparison


def within_tolerance(
    actual: np.ndarray, expected: np.ndarray, atol: float, rtol: float
) -> np.ndarray:
    """The elementwise pass mask: a == e, or |a-e| <= atol + rtol*|e|. NaN never passes: every
    comparison with a NaN is false, so it needs no pass of its own."""
    with np.errstate(invalid="ignore", over="ignore"):
        # NB: a ufunc on 0-d arrays (a loss, a scalar output) returns a numpy scalar, which
        # `out=` and in-place operators cannot write into: hold every step as an array (no
        # copy of one that already is: this mask runs on every timed output)
        err = np.asarray(np.subtract(actual, expected), dtype=np.float64)
        np.abs(err, out=err)
        bound = np.asarray(np.abs(expected), dtype=np.float64)
        bound *= rtol
        bound += atol
        ok = np.asarray(err <= bound)
        ok |= actual == expected
    return ok


def mismatched(actual: np.ndarray, expected: np.ndarray, atol: float, rtol: float) -> int:
    """How many elements fail `within_tolerance`: compare()'s count without its error figures
    (the referee checks every timed output of a measurement; a third of compare's time)."""
    ok = within_tolerance(actual, expected, atol, rtol)
    return int(ok.size - np.count_nonzero(ok))


def compare(actual: np.ndarray, expected: np.ndarray, atol: float, rtol: float) -> dict:
    """Elementwise |a-e| <= atol + rtol*|e|; NaN never matches; inf must match exactly."""
    ok = within_tolerance(actual, expected, atol, rtol)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(actual - expected)
        exact = actual == expected
        finite_err = err[np.isfinite(err)]
        nz = np.abs(expected) > 0
        rel = err[nz] / np.abs(expected[nz])
        rel = rel[np.isfinite(rel)]
        # NB: an error where the reference is 0 has no relative size (it is unbounded), so the
        # maximum relative error is then unknown (null), never the 0.0 of the other elements
        off_at_zero = int(np.count_nonzero((expected == 0) & ~exact))
    nonfinite = int(np.count_nonzero(~np.isfinite(actual) & np.isfinite(expected)))
    bad = int(ok.size - np.count_nonzero(ok))
    return {
        "passed": bad == 0,
        "mismatched": bad,
        "nonfinite": nonfinite,
        "max_abs_err": finite_or_none(finite_err.max()) if finite_err.size else None,
        "max_rel_err": finite_or_none(rel.max()) if rel.size and not off_at_zero else None,
    }


# ---------------------------------------------------------------------------------------------
# Processes


def become_subreaper() -> bool:
    """Orphaned descendants are re-parented to us, so we can find and kill them later."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def descendants(pid: int | None = None) -> list[int]:
    if not Path("/proc").is_dir():
        return []
    root = os.getpid() if pid is None else pid
    tree, found, stack = _children_map(), [], [root]
    while stack:
        for child in tree.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def kill_descendants(exclude: set[int] | None = None) -> int:
    """SIGKILL every process below us (bar `exclude`) and reap those that are our children."""
    killed = 0
    for _ in range(5):
        victims = [p for p in descendants() if p not in (exclude or set())]
        if not victims:
            break
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)
        reap_zombies()
    return killed


def reap_zombies() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


# NB: the lock file a live scratch folder holds; named last (renamed into place after it is
# locked), so a sweeper never finds it unlocked while its run lives
SCRATCH_LOCK = ".rsi-alive"


def sweep_scratch(prefix: str, root: Path) -> list[str]:
    """Remove the `prefix` folders under `root` that an earlier run left: those whose lock no
    process holds (a run killed with SIGKILL never reaches its `finally`). A folder without
    the lock (still being made, or an older layout), or whose lock is held, is left alone."""
    gone: list[str] = []
    try:
        names = [n for n in os.listdir(root) if n.startswith(prefix)]
    except OSError:
        return gone
    for name in names:
        try:
            fd = os.open(root / name / SCRATCH_LOCK, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # NB: held: its run is alive
        finally:
            os.close(fd)
        shutil.rmtree(root / name, ignore_errors=True)
        gone.append(name)
    return gone


def scratch_dir(prefix: str, root: Path | None = None) -> tuple[Path, int]:
    """A fresh scratch folder under `root` (TMPDIR) that holds a lock for this process's life,
    after sweeping the orphans of earlier runs (`sweep_scratch`). Returns the folder and the
    lock's descriptor: close it after removing the folder. The descriptor is not inherited, so
    a candidate's process that outlives the run does not keep its folder alive."""
    root = Path(tempfile.gettempdir()) if root is None else root
    sweep_scratch(prefix, root)
    work = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
    making = work / (SCRATCH_LOCK + ".new")
    fd = os.open(making, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(making, work / SCRATCH_LOCK)
    return work, fd


# ---------------------------------------------------------------------------------------------
# Accelerators (CUDA through torch), bandwidth and the hardware fingerprint
#
# NB: nothing here may touch CUDA in a process that forks afterwards: the zygotes import torch
# but never initialise CUDA; each forked item does, for itself, before any candidate code runs.

NO_CUDA = "no CUDA device: torch.cuda.is_available() is False"
# Assumed L2 size when neither torch nor the driver reports one: larger than the L2 of any
# current NVIDIA GPU (H100/H200: 50 MiB, B200: 126 MiB), so 2x it still evicts everything.
DEFAULT_L2_BYTES = 256 * 2**20
L2_FLUSH_FACTOR = 2
NVIDIA_SMI_FIELDS = (
    "name",
    "uuid",
    "driver_version",
    "clocks.sm",
    "clocks.mem",
    "clocks.max.sm",
    "clocks.max.mem",
)
# CUdevice_attribute values (cuda.h): a fallback when torch does not expose a property
_CU_ATTR = {"memory_clock_khz": 36, "memory_bus_width_bits": 37, "l2_cache_bytes": 38}


def require_device(spec: dict) -> None:
    """Refuse to judge a `cuda` spec where no CUDA device is visible: a harness fault (exit 2),
    never a silent run on the CPU and never a verdict from the wrong device."""
    if spec["device"] == "cpu":
        return
    try:
        torch = import_torch()
    except ImportError as exc:
        raise HarnessError(f"spec device {spec['device']!r} needs torch: {exc}") from exc
    if not torch.cuda.is_available():
        raise HarnessError(
            f"{NO_CUDA} (torch {torch.__version__}, built for CUDA {torch.version.cuda}); the "
            f"binding needs device {spec['device']!r} and the harness refuses to judge on another "
            "device. Run it where a GPU is visible (docker executor, which requests GPUs for an "
            "`accelerator` platform property, or a remote worker advertising accelerator=cuda)"
        )


def _positive(value: Any) -> int | None:
    try:
        value = int(value)
    except (TypeError, ValueError):
        return None
    return value if value > 0 else None


def _driver_attributes(ordinal: int) -> dict[str, int | None]:
    """Device attributes through the CUDA driver API (ctypes; CUDA already initialised)."""
    found: dict[str, int | None] = dict.fromkeys(_CU_ATTR)
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        dev = ctypes.c_int()
        if lib.cuDeviceGet(ctypes.byref(dev), int(ordinal)) != 0:
            return found
        for key, attr in _CU_ATTR.items():
            value = ctypes.c_int()
            if lib.cuDeviceGetAttribute(ctypes.byref(value), attr, dev) == 0:
                found[key] = _positive(value.value)
    except (OSError, AttributeError):
        pass
    return found


def _gpu_uuid(raw: Any) -> str | None:
    text = str(raw or "").strip()
    if not text:
        return None
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def peak_bandwidth_gb_s(memory_clock_khz: int | None, bus_width_bits: int | None) -> float | None:
    """Theoretical DRAM peak: 2 transfers per memory clock (double data rate) x bus width.

    Null, never 0, when either number is unknown."""
    if not memory_clock_khz or not bus_width_bits:
        return None
    return 2.0 * memory_clock_khz * 1e3 * (bus_width_bits / 8) / 1e9


def cuda_device_facts(torch) -> dict:
    """What the current CUDA device says about itself (call in a forked item, after CUDA init)."""
    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    names = (
        ("memory_clock_khz", "memory_clock_rate"),
        ("memory_bus_width_bits", "memory_bus_width"),
        ("l2_cache_bytes", "L2_cache_size"),
    )
    from_torch = {key: _positive(getattr(props, attr, None)) for key, attr in names}
    driver = _driver_attributes(index) if None in from_torch.values() else dict.fromkeys(_CU_ATTR)
    facts: dict[str, Any] = {
        "index": index,
        "name": getattr(props, "name", None),
        "uuid": _gpu_uuid(getattr(props, "uuid", None)),
        "compute_capability": f"{props.major}.{props.minor}",
        "total_memory_bytes": _positive(getattr(props, "total_memory", None)),
        "multi_processor_count": _positive(getattr(props, "multi_processor_count", None)),
        "sm_clock_khz": _positive(getattr(props, "clock_rate", None)),
    }
    for key, _ in names:
        value, source = from_torch[key], "torch"
        if value is None and driver[key] is not None:
            value, source = driver[key], "driver"
        facts[key] = value
        facts[f"{key}_source"] = source if value is not None else None
    return facts


def device_facts(spec: dict) -> dict | None:
    """The spec's accelerator as the referee sees it (None on a CPU spec or when unreadable:
    the facts are informational, and unknown is null)."""
    if spec["device"] == "cpu":
        return None
    try:
        torch = import_torch()
        torch.cuda.init()
        return cuda_device_facts(torch)
    except Exception:  # noqa: BLE001
        return None


def l2_flush_bytes(facts: dict | None) -> tuple[int, int, str]:
    """(flush buffer bytes, L2 bytes assumed, where that L2 size came from)."""
    l2 = (facts or {}).get("l2_cache_bytes")
    source = (facts or {}).get("l2_cache_bytes_source") or "default"
    if not l2:
        l2, source = DEFAULT_L2_BYTES, "default"
    return L2_FLUSH_FACTOR * int(l2), int(l2), source


def _smi_value(text: str) -> str | None:
    text = text.strip()
    if not text or text.strip("[]").lower() in (
        "n/a",
        "not supported",
        "unknown error",
        "insufficient permissions",
    ):
        return None
    return text


def nvidia_smi(timeout_s: float = 15.0) -> list[dict] | None:
    """One row per visible GPU from `nvidia-smi --query-gpu=...`; None when not readable."""
    import csv

    exe = shutil.which("nvidia-smi") or next(
        (
            p
            for p in ("/usr/bin/nvidia-smi", "/usr/local/nvidia/bin/nvidia-smi")
            if os.access(p, os.X_OK)
        ),
        None,
    )
    if exe is None:
        return None
    try:
        proc = subprocess.run(
            [exe, "--query-gpu=" + ",".join(NVIDIA_SMI_FIELDS), "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    rows = []
    for fields in csv.reader(proc.stdout.splitlines(), skipinitialspace=True):
        if len(fields) != len(NVIDIA_SMI_FIELDS):
            continue
        row = {k: _smi_value(v) for k, v in zip(NVIDIA_SMI_FIELDS, fields, strict=True)}
        for k in NVIDIA_SMI_FIELDS[3:]:
            try:
                row[k] = int(float(row[k])) if row[k] is not None else None
            except ValueError:
                row[k] = None
        rows.append(row)
    return rows or None


def _match_smi(rows: list[dict] | None, uuid_: str | None) -> dict | None:
    if not rows:
        return None
    if uuid_:
        want = uuid_.lower().removeprefix("gpu-")
        for row in rows:
            if (row.get("uuid") or "").lower().removeprefix("gpu-") == want:
                return row
        return None
    return rows[0] if len(rows) == 1 else None


def _kernel_driver_version() -> str | None:
    for path in ("/sys/module/nvidia/version", "/proc/driver/nvidia/version"):
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        for token in text.split():
            if token[:1].isdigit() and "." in token:
                return token
    return None


def cpu_model() -> str | None:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    for key in ("model name", "Model", "Hardware", "cpu model", "uarch"):
        for line in text.splitlines():
            name, _, value = line.partition(":")
            if name.strip() == key and value.strip():
                return value.strip()
    return platform.processor() or None


GPU_FINGERPRINT_KEYS = (
    "gpu_name",
    "gpu_uuid",
    "gpu_driver",
    "gpu_compute_capability",
    "gpu_memory_bytes",
    "gpu_sm_clock_mhz",
    "gpu_mem_clock_mhz",
    "gpu_max_sm_clock_mhz",
    "gpu_max_mem_clock_mhz",
    "gpu_l2_cache_bytes",
    "gpu_memory_bus_width_bits",
    "gpu_peak_gb_s",
    "gpu_peak_source",
)


def fingerprint(spec: dict, facts: dict | None = None, smi: list[dict] | None = None) -> dict:
    """Where the evidence came from. Every key is always present; unknown values are null.

    `facts` is what a forked item's CUDA device reported (`cuda_device_facts`); `smi` the rows of
    `nvidia_smi()`, matched to that device by UUID. On a CPU spec the GPU fields stay null.
    """
    torch = sys.modules.get("torch")
    doc: dict[str, Any] = {
        "device": spec["device"],
        "cpu_model": cpu_model(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": str(torch.__version__) if torch is not None else None,
        "cuda": getattr(getattr(torch, "version", None), "cuda", None),
        "toolchain": spec.get("toolchain"),
    }
    doc.update(dict.fromkeys(GPU_FINGERPRINT_KEYS))
    if spec["device"] == "cpu":
        return doc
    facts = facts or {}
    row = _match_smi(smi, facts.get("uuid")) or {}
    sm_khz = facts.get("sm_clock_khz")
    peak, peak_source = peak_bandwidth(facts, row)
    doc.update(
        gpu_name=facts.get("name") or row.get("name"),
        gpu_uuid=facts.get("uuid") or row.get("uuid"),
        gpu_driver=row.get("driver_version") or _kernel_driver_version(),
        gpu_compute_capability=facts.get("compute_capability"),
        gpu_memory_bytes=facts.get("total_memory_bytes"),
        gpu_sm_clock_mhz=row.get("clocks.sm"),
        gpu_mem_clock_mhz=row.get("clocks.mem"),
        gpu_max_sm_clock_mhz=row.get("clocks.max.sm") or (round(sm_khz / 1000) if sm_khz else None),
        gpu_max_mem_clock_mhz=row.get("clocks.max.mem")
        or (round(facts["memory_clock_khz"] / 1000) if facts.get("memory_clock_khz") else None),
        gpu_l2_cache_bytes=facts.get("l2_cache_bytes"),
        gpu_memory_bus_width_bits=facts.get("memory_bus_width_bits"),
        gpu_peak_gb_s=peak,
        gpu_peak_source=peak_source,
    )
    return doc


def peak_bandwidth(
    facts: dict | None, smi_row: dict | None = None
) -> tuple[float | None, str | None]:
    """(peak DRAM GB/s, source): torch/driver memory clock x bus width, else nvidia-smi's
    maximum memory clock x the bus width; (None, None) when unknown."""
    facts, smi_row = facts or {}, smi_row or {}
    bus = facts.get("memory_bus_width_bits")
    peak = peak_bandwidth_gb_s(facts.get("memory_clock_khz"), bus)
    if peak is not None:
        return peak, facts.get("memory_clock_khz_source") or "torch"
    max_mhz = smi_row.get("clocks.max.mem")
    peak = peak_bandwidth_gb_s(max_mhz * 1000 if max_mhz else None, bus)
    return (peak, "nvidia-smi") if peak is not None else (None, None)


def bandwidth(bytes_per_call: int | None, median_ns: float | None, peak_gb_s: float | None) -> dict:
    """Achieved bandwidth (bytes per call / median time; bytes per ns = GB/s) and its fraction of
    the peak. Unknown parts are null, never 0."""
    achieved = (
        bytes_per_call / median_ns if bytes_per_call and median_ns and median_ns > 0 else None
    )
    fraction = achieved / peak_gb_s if achieved is not None and peak_gb_s else None
    return {"median_ns": median_ns, "achieved_gb_s": achieved, "fraction": fraction}


def dtype_itemsize(name: str) -> int:
    if name in ("bfloat16", "float16", "half"):
        return 2
    try:
        return np.dtype(name).itemsize
    except TypeError:
        torch = import_torch()
        dt = getattr(torch, name, None)
        if not isinstance(dt, torch.dtype):
            raise HarnessError(f"unknown torch dtype {name}") from None
        return dt.itemsize


def tensor_bytes(inputs: dict[str, Any], out_shape, out_dtype: str) -> int:
    """Bytes a call must move at least: every array input's elements plus the output's."""
    total = 0
    for value in inputs.values():
        if isinstance(value, np.ndarray):
            total += value.size * value.itemsize
        elif is_torch_tensor(value):
            total += value.numel() * value.element_size()
    n_out = 1
    for n in out_shape:
        n_out *= int(n)
    return total + n_out * dtype_itemsize(out_dtype)
