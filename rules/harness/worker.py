"""The referee's callee: the only process that ever imports candidate code.

Started by the referee (check.py, measure.py through referee.py) in a sandbox of its own, with
two pipes and two shared buffers as inherited descriptors. It answers requests one at a time:
import the implementation, take a layout (where each input lives in the input buffer), call the
entry on the inputs the referee has just written, copy the returned array into the output
buffer, and reply with what it returned. It never sees a seed, an oracle, an expected output or
a later input; it reads no clock that counts; its stdout and stderr are a log nobody parses.

Whatever it reports (type, dtype, shape) is a claim: the referee judges the raw bytes of the
output buffer against the oracle, with dtype and shape from the task's spec.
Stdlib + numpy, torch only when the framework is torch. Never imports rsi, rules or _common.
"""

from __future__ import annotations

import importlib.util
import json
import mmap
import os
import struct
import sys
import traceback
import types
import uuid
from pathlib import Path

MAX_MESSAGE = 1 << 20
_LEN = struct.Struct("<I")
_SEQ = struct.Struct("<q")
CTL_SIZE = 4096
REQ_AT, DONE_AT = 0, 64  # NB: the referee's and the worker's sequence numbers, a line apart
ARM_SPIN_S = 5.0


def _load_confine():
    spec = importlib.util.spec_from_file_location(
        "_rsi_confine", Path(__file__).resolve().parent / "confine.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


confine = _load_confine()


def read_message(fd: int) -> dict | None:
    head = _read_exact(fd, _LEN.size)
    if head is None:
        return None
    (size,) = _LEN.unpack(head)
    if size > MAX_MESSAGE:
        raise ValueError("message too large")
    body = _read_exact(fd, size)
    if body is None:
        return None
    return json.loads(body)


def _read_exact(fd: int, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def write_message(fd: int, doc: dict) -> None:
    body = json.dumps(doc, separators=(",", ":"), allow_nan=False, default=str).encode()
    data = _LEN.pack(len(body)) + body
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _error(exc: BaseException) -> dict:
    return {
        "type": type(exc).__name__,
        "message": str(exc)[:2000],
        "traceback": traceback.format_exc()[-4000:],
    }


def load_entry(impl_dir: str, entry: dict):
    """Import the editable folder as a uniquely named private package; return the entry."""
    import importlib.util

    impl = Path(impl_dir)
    pkg_name = f"_rsi_impl_{uuid.uuid4().hex[:12]}"
    package = types.ModuleType(pkg_name)
    package.__path__ = [str(impl)]
    package.__package__ = pkg_name
    sys.modules[pkg_name] = package
    module_path = impl / f"{entry['module']}.py"
    if not module_path.is_file():
        raise LookupError(f"editable module {entry['module']}.py is missing")
    full_name = f"{pkg_name}.{entry['module']}"
    spec = importlib.util.spec_from_file_location(full_name, module_path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[full_name] = module
    spec.loader.exec_module(module)
    if entry.get("class"):
        return _construct(module, entry)
    fn = getattr(module, entry["function"], None)
    if not callable(fn):
        raise LookupError(f"{entry['module']}.py defines no callable {entry['function']!r}")
    return fn


def _construct(module, entry: dict):
    """A class contract (KernelBench's `ModelNew`): built once, at import, from the task's
    init inputs with the torch RNG seeded by the (public) init seed, so baseline, candidate and
    oracle start from the same weights; each call is `instance(*inputs)`, in input order."""
    cls = getattr(module, entry["class"], None)
    if not isinstance(cls, type):
        raise LookupError(f"{entry['module']}.py defines no class {entry['class']!r}")
    init = entry.get("init") or []
    try:
        import torch
    except ImportError:
        return _positional(cls(*init), entry.get("args") or [])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(entry.get("init_seed", 0)))
        instance = cls(*init)
    if isinstance(instance, torch.nn.Module):
        instance.eval()
        instance.requires_grad_(False)
        if entry.get("device", "cpu") != "cpu":
            instance.to(entry["device"])  # NB: built on the CPU, as the oracle builds its own
    return _positional(instance, entry.get("args") or [])


def _positional(instance, args: list[str]):
    """`instance(*inputs)` in the order `args` names them (inputs arrive as a mapping whose
    order is the packing's, not the model's: q, k, v must not become k, q, v)."""
    if not callable(instance):
        raise LookupError(f"{type(instance).__name__} instances are not callable")

    def call(**inputs):
        return instance(*(inputs[name] for name in args))

    return call


class Worker:
    def __init__(self, args: dict) -> None:
        self.framework = args["framework"]
        self.device = args.get("device", "cpu")
        self.req, self.resp = args["req_fd"], args["resp_fd"]
        self.in_buf = mmap.mmap(args["in_fd"], args["in_size"])
        self.out_buf = mmap.mmap(args["out_fd"], args["out_size"])
        self.ctl = mmap.mmap(args["ctl_fd"], CTL_SIZE)
        _prefault_heap(args["in_size"] + args["out_size"])
        self.fn = None
        self.layout_msg: dict = {}
        import numpy as np

        self.np = np
        self.torch = None
        if self.framework == "torch":
            import torch

            self.torch = torch
            torch.set_num_threads(int(args["threads"]))
            torch.ones(4).mul(2).sum()
            if self.device != "cpu":
                torch.cuda.init()

    # ----------------------------------------------------------------------- requests
    def layout(self, msg: dict) -> dict:
        """Where each input lives in the input buffer, with the geometry the referee gives."""
        for meta in msg["inputs"].values():
            if meta["kind"] == "array":
                base, length = int(meta["at"]), int(meta["span"])
                if base < 0 or base + length > len(self.in_buf):
                    raise ValueError("layout outside the input buffer")
        self.layout_msg = msg["inputs"]
        return {"op": "ok"}

    def fresh_inputs(self) -> dict:
        """New view objects over the buffer for every call, dropped when the call returns.

        NB: they are not kept alive to stop ids being reused: every timed input is a fresh draw,
        so a result cached by id or address is wrong and the check fails it; and keeping them
        pinned small allocations between each call's large temporaries, so glibc took fresh
        pages for those every call (hundreds of page faults a call, rmsnorm 2-5x slower and
        bimodal, an allocation-heavy baseline penalised more than a lean candidate)."""
        np = self.np
        inputs = {}
        for name, meta in self.layout_msg.items():
            if meta["kind"] == "scalar":
                inputs[name] = {"float": float, "int": int, "bool": bool}[meta["type"]](
                    meta["value"]
                )
                continue
            base, length = int(meta["at"]), int(meta["span"])
            raw = np.frombuffer(self.in_buf, dtype=np.uint8, count=length, offset=base)
            if meta["framework"] == "numpy":
                value = np.ndarray(
                    tuple(meta["shape"]),
                    dtype=np.dtype(meta["dtype"]),
                    buffer=self.in_buf,
                    offset=base + meta["offset_bytes"],
                    strides=tuple(meta["strides_bytes"]),
                )
            else:
                value = self._torch_view(raw, meta)
            inputs[name] = value
        return inputs

    def _torch_view(self, raw, meta: dict):
        torch = self.torch
        itemsize = int(meta["itemsize"])
        dtype = getattr(torch, meta["dtype"])
        if self.device != "cpu":
            span = torch.empty(raw.size, dtype=torch.uint8, device=self.device)
        else:
            span = (
                torch.frombuffer(memoryview(raw), dtype=torch.uint8)
                if raw.size
                else torch.empty(0, dtype=torch.uint8)
            )
        view = torch.empty(0, dtype=dtype, device=span.device)
        view.set_(
            span.untyped_storage(),
            meta["offset_bytes"] // itemsize,
            tuple(meta["shape"]),
            tuple(s // itemsize for s in meta["strides_bytes"]),
        )
        if self.device != "cpu":
            view._rsi_host_span = raw  # NB: copied to the device at every call
            view._rsi_device_span = span
        return view

    def armed_call(self, msg: dict) -> dict | None:
        """Say we are ready, then spin (no sleep: waking a sleeping process costs more than a
        small call) until the referee publishes call `i`, run it, publish that it is done."""
        import time

        index = int(msg["i"])
        write_message(self.resp, {"op": "armed", "i": index})
        ctl, unpack, pause = self.ctl, _SEQ.unpack_from, os.sched_yield
        give_up = time.monotonic() + ARM_SPIN_S
        spins = 0
        while unpack(ctl, REQ_AT)[0] != index:
            # NB: yield, so a referee woken on this CPU runs at once instead of a tick later
            pause()
            spins += 1
            if spins & 0xFFF == 0 and time.monotonic() > give_up:
                return None  # NB: the referee went away or gave up on this call
        reply = self.call(msg)
        _SEQ.pack_into(ctl, DONE_AT, index)
        return reply

    def call(self, msg: dict) -> dict:
        reply = {"op": "done", "i": msg["i"]}
        if msg.get("echo"):
            return reply
        inputs = self.fresh_inputs()
        torch = self.torch
        if self.device != "cpu":
            for value in inputs.values():
                if hasattr(value, "_rsi_device_span"):
                    value._rsi_device_span.copy_(torch.from_numpy(value._rsi_host_span))
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
        try:
            out = self.fn(**inputs)
            if self.device != "cpu":
                # NB: a device-wide synchronise before the end event: work the candidate left
                # on other streams is inside the timed region too
                torch.cuda.synchronize()
                end.record()
                torch.cuda.synchronize()
                reply["event_ns"] = round(start.elapsed_time(end) * 1e6)
                for value in inputs.values():
                    if hasattr(value, "_rsi_device_span"):
                        value._rsi_host_span[...] = value._rsi_device_span.cpu().numpy()
        except BaseException as exc:  # noqa: BLE001  SystemExit included: it is the candidate's
            return {"op": "raised", "i": msg["i"], "error": _error(exc)}
        reply["out"] = self.materialise(out)
        return reply

    def materialise(self, out) -> dict:
        """Copy `out` into the output buffer (C order); report what it claims to be."""
        np, torch = self.np, self.torch
        meta = {"type": f"{type(out).__module__}.{type(out).__qualname__}", "problem": None}
        if self.framework == "numpy":
            if type(out) is not np.ndarray:
                meta["problem"] = "wrong_type"
                return meta
            meta.update(dtype=out.dtype.name, shape=list(out.shape), device="cpu")
            if out.dtype.hasobject or out.dtype.fields is not None:
                meta["problem"] = "wrong_dtype"
                return meta
            flat = np.ascontiguousarray(out)
        else:
            if type(out) is not torch.Tensor:
                meta["problem"] = "wrong_type"
                return meta
            meta.update(
                dtype=str(out.dtype).removeprefix("torch."),
                shape=list(out.shape),
                device=out.device.type,
            )
            if out.layout != torch.strided or out.is_quantized or out.is_complex():
                meta["problem"] = "wrong_type"
                return meta
            if out.device.type != self.device:
                meta["problem"] = "wrong_device"
                return meta
            t = out.detach().contiguous()
            if t.device.type != "cpu":
                t = t.cpu()
            if t.dtype == torch.bfloat16:
                t = t.view(torch.int16)
            try:
                flat = t.numpy()
            except (TypeError, RuntimeError):
                meta["problem"] = "wrong_dtype"
                return meta
        nbytes = flat.size * flat.itemsize
        meta["nbytes"] = nbytes
        if nbytes > len(self.out_buf):
            meta["problem"] = "wrong_shape"
            return meta
        dest = np.frombuffer(self.out_buf, dtype=np.uint8, count=nbytes)
        dest[...] = flat.reshape(-1).view(np.uint8)
        return meta

    def serve(self, confined: dict | None = None) -> None:
        write_message(self.resp, {"op": "ready", "pid": os.getpid(), "confined": confined})
        while True:
            msg = read_message(self.req)
            if msg is None or msg.get("op") == "exit":
                return
            op = msg.get("op")
            if op == "import":
                try:
                    self.fn = load_entry(msg["impl_dir"], msg["entry"])
                except SyntaxError as exc:
                    reply = {"op": "import_failed", "kind": "syntax_error", "error": _error(exc)}
                except LookupError as exc:
                    reply = {"op": "import_failed", "kind": "missing_entry", "error": _error(exc)}
                except BaseException as exc:  # noqa: BLE001  anything the candidate raises
                    reply = {"op": "import_failed", "kind": "import_error", "error": _error(exc)}
                else:
                    reply = {"op": "imported"}
            elif op == "layout":
                reply = self.layout(msg)
            elif op == "arm":
                reply = self.armed_call(msg)
                if reply is None:
                    continue
            else:
                reply = {"op": "error", "message": f"unknown op {op!r}"}
            sys.stdout.flush()
            sys.stderr.flush()
            write_message(self.resp, reply)


def zygote(args: dict) -> None:
    """Import the framework once, then fork one pristine worker per request: every arm of every
    pair starts from the same state (a fresh heap and layout), and no candidate code ever runs
    in this process. In its own pid namespace it ends every process a worker left behind."""
    import gc
    import signal

    _pin_malloc()
    if args["framework"] == "torch":
        import torch

        torch.set_num_threads(int(args["threads"]))
        torch.ones(4).mul(2).sum()
    import numpy  # noqa: F401

    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass
    import shutil  # noqa: F401  (imported before forking: _empty needs it)
    import time  # noqa: F401

    # NB: nothing a worker does may reach this process (every later arm is forked from it):
    # non-dumpable, so a same-uid worker without CAP_SYS_PTRACE cannot ptrace it, read or write
    # its memory (process_vm_*, /proc/<pid>/mem); the workers' seccomp filter refuses it too
    unconfined = set(args.get("unconfined") or ())  # NB: tests only (the referee's private flag)
    if "dump" not in unconfined:
        confine.no_dump()
    gc.collect()
    gc.freeze()
    req, resp = args["req_fd"], args["resp_fd"]
    zygote_fds = _open_fds()
    write_message(resp, {"op": "zygote"})
    while True:
        msg = read_message(req)
        if msg is None or msg.get("op") != "fork":
            return
        sys.stdout.flush()
        sys.stderr.flush()
        # NB: the zygote's own parent (bwrap's init, or the referee) is protected too
        msg["protect"] = [os.getppid(), *(msg.get("protect") or ())]
        msg["unconfined"] = sorted(unconfined)
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                confined = _confine_child(msg, args, zygote_fds)
                Worker(args).serve(confined)
            except BaseException:  # noqa: BLE001  never fall back into the zygote's loop
                code = 70
                try:
                    traceback.print_exc()
                except BaseException:  # noqa: BLE001, S110
                    pass
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                except BaseException:  # noqa: BLE001, S110
                    pass
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        _reap_strays(bool(args.get("own_pid_namespace")))
        _empty(os.environ.get("TMPDIR"))
        ended = {
            "op": "ended",
            "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        }
        write_message(resp, ended)


def _open_fds(limit: int = 1024) -> set[int]:
    """Descriptors open now (fcntl probe: the sandbox's /proc is empty)."""
    import fcntl

    found = set()
    for fd in range(limit):
        try:
            fcntl.fcntl(fd, fcntl.F_GETFD)
        except OSError:
            continue
        found.add(fd)
    return found


def _confine_child(msg: dict, args: dict, zygote_fds: set[int]) -> dict:
    """In a freshly forked worker, before any candidate code: re-apply what it inherits from
    the zygote and confine it (see the module docstring). Returns what holds, for the referee;
    raises nothing it can avoid (a failure shows as a missing item in the report).

    NB: set in every worker, not once in the zygote: a zygote changed behind our back (it
    should not be possible, see zygote()) must not reach a later arm through its settings."""
    report: dict = {}
    os.setsid()  # its own session and process group: signals to others' groups are refused
    _pin_malloc()
    env = msg.get("env")
    if isinstance(env, dict):
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in env.items()})
    cpus = msg.get("cpus")
    if isinstance(cpus, list) and cpus:
        try:
            os.sched_setaffinity(0, cpus)
        except OSError:
            pass
    keep = set(zygote_fds) | {
        args["req_fd"],
        args["resp_fd"],
        args["in_fd"],
        args["out_fd"],
        args["ctl_fd"],
    }
    stray = sorted(_open_fds() - keep)
    for fd in stray:
        try:
            os.close(fd)
        except OSError:
            pass
    report["stray_fds_closed"] = len(stray)
    report["candidate_modules_in_zygote"] = sum(m.startswith("_rsi_impl_") for m in sys.modules)
    protect = [os.getppid(), *(p for p in msg.get("protect") or () if isinstance(p, int))]
    zygote_pid = os.getppid()
    try:
        protect.append(os.getpgid(zygote_pid))
    except OSError:
        pass
    # NB: outside a pid namespace of its own (uid, process modes) the worker can name the other
    # arm's worker and every neighbour: its filter then lets it name no pid but its own
    own_only = not bool(args.get("own_pid_namespace"))
    skip = msg.get("unconfined") or ()  # NB: tests only (the referee's private flag)
    report.update(confine.confine_worker(protect, os.getpid(), skip, own_only=own_only))
    return report


def _pin_malloc() -> None:
    """glibc malloc as the old timer had it through GLIBC_TUNABLES, set here with mallopt
    because the environment variable did not reliably take effect in workers: a 32 MiB mmap
    threshold, a 1 GiB trim threshold and 64 MiB of top padding, so memory a call frees stays
    in the heap and the next call does not fault it in again (a worker left on the defaults
    ran an rmsnorm call at 3-4x its cost, hundreds of page faults each). Both arms alike."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
        libc.mallopt(-2, 64 << 20)  # M_TOP_PAD
    except (OSError, AttributeError):
        pass


def _prefault_heap(io_bytes: int) -> None:
    """Touch, then free, a few times the call's input and output in the heap (32-64 MiB): the
    first calls' temporaries then land on pages this process already has instead of faulting
    them in one by one (a fresh fork otherwise pays hundreds of faults in its first calls,
    and now and then in a timed one). Freed memory stays in the heap (see _pin_malloc).

    NB: at least 32 MiB, not 8: a worker's heap creeps upwards call after call (small objects
    that outlive a call sit between the large temporaries), and rmsnorm's baseline, whose
    float64 temporaries are ~5 MiB a call, crossed an 8 MiB prefault within its 13 calls: one
    timed call in every arm-run of one sandbox took 256 faults and ran 1.5-2x slower (page
    faults counted per call). At 32 MiB, six A/A runs showed no such call. The region is
    offered huge pages first (MADV_HUGEPAGE, where the host has them on request): touching
    32 MiB in 4 KiB pages cost ~15 ms a fork, in 2 MiB pages a few. Both arms alike."""
    size = min(64 << 20, max(32 << 20, 4 * io_bytes))
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.malloc.restype = ctypes.c_void_p
        libc.malloc.argtypes = [ctypes.c_size_t]
        libc.free.argtypes = [ctypes.c_void_p]
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    except (OSError, AttributeError):
        blocks = [bytearray(8 << 20) for _ in range(size // (8 << 20))]
        del blocks
        return
    chunk, huge = 8 << 20, 2 << 20  # NB: under the mmap threshold: from the heap
    blocks = [libc.malloc(chunk) for _ in range(size // chunk)]
    for at in blocks:
        if at:
            lo, hi = (at + huge - 1) & ~(huge - 1), (at + chunk) & ~(huge - 1)
            libc.madvise(lo, hi - lo, 14)  # MADV_HUGEPAGE; refused or ignored: 4 KiB pages
            ctypes.memset(at, 0, chunk)
    for at in blocks:
        if at:
            libc.free(at)


def _reap_strays(own_pid_namespace: bool) -> None:
    """Kill and reap every process a worker left (as a subreaper we inherit the double-forked
    ones); return once we have no child at all, or after about two seconds."""
    import signal
    import time

    for _ in range(400):
        if own_pid_namespace:
            try:
                os.kill(-1, signal.SIGKILL)  # NB: in our own pid namespace: all but us and init
            except OSError:
                pass
        else:
            for pid in _children():
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0] != 0:
                pass
        except ChildProcessError:
            return
        time.sleep(0.005)


def _empty(folder: str | None) -> None:
    """Nothing one worker left in its temp folder reaches the next (another arm's code)."""
    import shutil

    if not folder or not os.path.isdir(folder):
        return
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
        except OSError:
            pass


def _children() -> list[int]:
    mine = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return mine
    for entry in entries:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == os.getpid():
                mine.append(int(entry))
    return mine


def main() -> int:
    sys.dont_write_bytecode = True
    zygote(json.loads(sys.argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
