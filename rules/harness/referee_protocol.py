"""The referee's protocol with a worker (worker.py, mr_worker.py): length-prefixed JSON on a
pipe pair, the shared call buffers and their control page, reply parsing, input packing.

Owns what the worker's bytes may say (parse_reply: size, depth, NaN and every field checked) and
how they are framed; it must never trust a reply it did not parse, never time anything and never
judge an output. Stdlib + confine.py (sealed buffers).
"""

from __future__ import annotations

import runpy
import json
import mmap
import os
import re
import select
import struct
import time
from pathlib import Path


# NB: the harness's one sibling loader (siblings.py), itself run by path: no sys.path here
load_siblings = runpy.run_path(str(Path(__file__).resolve().parent / "siblings.py"))["load"]
(confine,) = load_siblings("confine")

MAX_MESSAGE = 1 << 20
MAX_DEPTH = 16  # the deepest reply the protocol has is 3 levels; a deeper one is refused
LEN = struct.Struct("<I")
SEQ = struct.Struct("<q")
CTL_SIZE = 4096
REQ_AT, DONE_AT = 0, 64  # the same layout as worker.py's control buffer
NO_CALL = -(1 << 62)  # the sequence numbers' value before the first call (never an index)
ALIGN = 64
SHIFT_MAX = 4096


class WorkerStartError(Exception):
    """The worker could not be started or did not get ready: nothing of the candidate ran."""


class WorkerFault(Exception):
    """The worker ended, stalled or broke the protocol after candidate code was imported."""

    def __init__(self, code: str, detail: str):
        super().__init__(detail)
        self.code, self.detail = code, detail


# -------------------------------------------------------------------------- the worker's bytes

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_BRACKET = re.compile(rb"[\[\]{}]")
_SHORT, _LONG = 256, 8192


def _depth_ok(body: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether no array or object in `body` nests deeper than `limit` (no recursion: a reply
    50,000 levels deep must not reach json.loads, whose recursion would raise)."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return True
    depth = 0
    for m in _BRACKET.finditer(_STRING.sub(b'""', body)):
        depth += 1 if m.group() in (b"[", b"{") else -1
        if depth > limit:
            return False
    return True


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number the protocol allows")


def _finite_float(text: str) -> float:
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{text[:40]} is not a finite number")
    return value


def _is_int(v) -> bool:
    return type(v) is int and -(1 << 62) <= v <= (1 << 62)


def _is_str(limit: int):
    return lambda v: type(v) is str and len(v) <= limit


def _or_none(check):
    return lambda v: v is None or check(v)


def _dict_of(fields: dict):
    return lambda v: type(v) is dict and all(k in fields and fields[k](x) for k, x in v.items())


def _list_of(check, limit: int):
    return lambda v: type(v) is list and len(v) <= limit and all(check(x) for x in v)


_OUT = {
    "type": _or_none(_is_str(_SHORT)),
    "dtype": _or_none(_is_str(_SHORT)),
    "shape": _or_none(_list_of(lambda x: _is_int(x) and x >= 0, 64)),
    "device": _or_none(_is_str(_SHORT)),
    "nbytes": _or_none(lambda x: _is_int(x) and x >= 0),
    "problem": _or_none(_is_str(_SHORT)),
}
_ERROR = {
    "type": _or_none(_is_str(_LONG)),
    "message": _or_none(_is_str(_LONG)),
    "traceback": _or_none(_is_str(_LONG)),
}
_HOW = {"exit": _or_none(_is_int), "signal": _or_none(_is_int)}
# NB: every field a reply may carry, and what it may hold; anything else is a protocol fault.
# multirank.py's replies (rank, ranks) share this table.
REPLY_FIELDS = {
    "op": _is_str(64),
    "i": _is_int,
    "pid": _is_int,
    "rank": _is_int,
    "event_ns": _is_int,
    "echo": lambda v: type(v) is bool,
    "kind": _is_str(64),
    "message": _is_str(_LONG),
    "out": _or_none(_dict_of(_OUT)),
    "error": _or_none(_dict_of(_ERROR)),
    "exit": _or_none(_is_int),
    "signal": _or_none(_is_int),
    "ranks": _list_of(_dict_of(_HOW), 4096),
    "confined": _or_none(
        _dict_of(
            {
                k: _or_none(lambda v: _is_int(v) or type(v) is bool or _is_str(_SHORT)(v))
                for k in (
                    "cap_eff",
                    "dumpable",
                    "seccomp",
                    "stray_fds_closed",
                    "candidate_modules_in_zygote",
                    "cap_error",
                    "dump_error",
                    "seccomp_error",
                    "signals",
                )
            }
        )
    ),
}


_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite_float)


def parse_reply(body: bytes) -> dict:
    """The worker's reply as a dict, or WorkerFault("protocol"): never anything else, whatever
    the bytes (nesting, NaN, Infinity, huge numbers, bad UTF-8, unknown fields, wrong types)."""
    try:
        if not _depth_ok(body):
            raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
        doc = _DECODER.decode(body.decode("utf-8"))
        if type(doc) is not dict or "op" not in doc:
            raise ValueError("not a JSON object with an op")
        for key, value in doc.items():
            check = REPLY_FIELDS.get(key)
            if check is None:
                raise ValueError(f"unknown field {key[:40]!r}")
            if not check(value):
                raise ValueError(f"field {key!r} holds {str(value)[:80]!r}")
    except WorkerFault:
        raise
    except Exception as exc:  # noqa: BLE001  whatever the bytes did, it is theirs: a protocol fault
        raise WorkerFault(
            "protocol", f"a reply the protocol does not allow: {str(exc)[:200]}"
        ) from None
    return doc


# -------------------------------------------------------------------------- the channel


class Channel:
    """One request/reply pipe pair to a process of a sandbox, in worker.py's framing. The
    child's ends (`child_ends`) are handed over once and closed here (`close_child_ends`)."""

    def __init__(self, who: str) -> None:
        self.who = who
        self.req_r, self.req_w = os.pipe()
        self.resp_r, self.resp_w = os.pipe()

    def child_ends(self) -> list[int]:
        return [self.req_r, self.resp_w]

    def close_child_ends(self) -> None:
        """Once the sandbox holds them (each end closed once: a number is reused at once)."""
        for fd in (self.req_r, self.resp_w):
            if fd >= 0:
                os.close(fd)
        self.req_r = self.resp_w = -1

    def close(self) -> None:
        for fd in (self.req_r, self.req_w, self.resp_r, self.resp_w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.req_r = self.req_w = self.resp_r = self.resp_w = -1

    def send(self, doc: dict) -> None:
        body = json.dumps(doc, separators=(",", ":")).encode()
        try:
            os.write(self.req_w, LEN.pack(len(body)) + body)
        except (BrokenPipeError, OSError) as exc:
            raise WorkerFault("crash", f"the worker is gone ({exc})") from exc

    def recv(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        head = self._read(LEN.size, deadline)
        (size,) = LEN.unpack(head)
        if size > MAX_MESSAGE:
            raise WorkerFault("protocol", f"a {size}-byte reply (the limit is {MAX_MESSAGE})")
        body = self._read(size, deadline)
        return parse_reply(body)

    def request(self, doc: dict, timeout_s: float) -> dict:
        self.send(doc)
        return self.recv(timeout_s)

    def layout(self, header: dict, timeout_s: float) -> None:
        reply = self.request({"op": "layout", "inputs": header}, timeout_s)
        if reply.get("op") != "ok":
            raise WorkerFault("protocol", f"layout answered {str(reply)[:200]}")

    def late(self) -> str:
        """What a reply that did not come in time says."""
        return f"{self.who}: no reply in time"

    def ended(self) -> WorkerFault:
        """The fault of a reply cut short by the end of the pipe."""
        return WorkerFault("crash", f"{self.who} ended without a reply")

    def readable(self, deadline: float) -> bool:
        """Wait (until `deadline`, then a timeout fault) for the reply pipe to have bytes."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise WorkerFault("timeout", self.late())
        ready, _, _ = select.select([self.resp_r], [], [], remaining)
        return bool(ready)

    def _read(self, size: int, deadline: float) -> bytes:
        chunks, left = [], size
        while left:
            if not self.readable(deadline):
                continue
            chunk = os.read(self.resp_r, left)
            if not chunk:
                raise self.ended()
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)


def sealed_memfd(name: str, size: int, sealed: bool = True) -> int:
    """A shared buffer of `size` bytes, sealed against shrinking and growing (confine.py)."""
    if not sealed:
        fd = os.memfd_create(name, 0)
        os.ftruncate(fd, size)
        return fd
    try:
        return confine.sealed_memfd(name, size)
    except (confine.ConfineError, OSError) as exc:
        raise WorkerStartError(f"cannot make a sealed shared buffer: {exc}") from exc


class CallChannel(Channel):
    """A channel with a worker's call buffers: input, output and the control page (sequence
    numbers at REQ_AT and DONE_AT), each a memfd the worker gets as a descriptor.

    NB: sealed against shrinking and growing before the worker gets them: a worker that
    truncated one (its fds are in its argv) made the referee die of SIGBUS on its mapping."""

    def __init__(self, who: str, in_size: int, out_size: int, sealed: bool, tag: str = "") -> None:
        super().__init__(who)
        self.in_fd = self.out_fd = self.ctl_fd = -1
        self.in_buf = self.out_buf = self.ctl = None
        self.in_size, self.out_size = max(in_size, 1), max(out_size, 1)
        try:
            self.in_fd = sealed_memfd(f"rsi-in{tag}", self.in_size, sealed)
            self.out_fd = sealed_memfd(f"rsi-out{tag}", self.out_size, sealed)
            self.ctl_fd = sealed_memfd(f"rsi-ctl{tag}", CTL_SIZE, sealed)
        except WorkerStartError:
            self.close()
            raise
        self.in_buf = mmap.mmap(self.in_fd, self.in_size)
        self.out_buf = mmap.mmap(self.out_fd, self.out_size)
        self.ctl = mmap.mmap(self.ctl_fd, CTL_SIZE)
        SEQ.pack_into(self.ctl, REQ_AT, NO_CALL)
        SEQ.pack_into(self.ctl, DONE_AT, NO_CALL)

    def child_ends(self) -> list[int]:
        return [*super().child_ends(), self.in_fd, self.out_fd, self.ctl_fd]

    def close(self) -> None:
        super().close()
        for fd in (self.in_fd, self.out_fd, self.ctl_fd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.in_fd = self.out_fd = self.ctl_fd = -1
        for buf in (self.in_buf, self.out_buf, self.ctl):
            try:
                if buf is not None:
                    buf.close()
            except (BufferError, ValueError):
                pass


# -------------------------------------------------------------------------- input packing


def pack_inputs(C, inputs: dict, shift: int = 0) -> tuple[dict, bytes]:
    """(layout header, packed bytes): each array's raw memory span at an aligned offset, the
    first `shift` bytes (a multiple of ALIGN below SHIFT_MAX) left empty.

    NB: where an input sits relative to a page decides whether it 4K-aliases the worker's
    outputs and temporaries, whose addresses differ from one sandbox to the next (ASLR): a
    fixed placement turned into a bias of one arm's sandbox (2x on an A/A run). A shift drawn
    per call makes that an averaged-out effect instead, identical for both arms of a pair."""
    header, parts, at = {}, [], 0
    if shift:
        parts.append(b"\0" * shift)
        at = shift
    for name in sorted(inputs):
        meta = C.describe_input(inputs[name])
        if meta["kind"] == "array":
            span = C.extent_bytes(inputs[name])
            pad = (-at) % ALIGN
            if pad:
                parts.append(b"\0" * pad)
                at += pad
            meta = dict(meta, at=at, span=len(span))
            parts.append(span)
            at += len(span)
        header[name] = meta
    return header, b"".join(parts)


def packed_size(C, inputs: dict) -> int:
    return len(pack_inputs(C, inputs)[1]) + ALIGN
