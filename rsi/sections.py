"""Sealed files in sections: the pickled payload, and apart from it every large blob the
payload's objects hand over as `Packed` (a shard of a sharded mapping, a lazily read field of
the analysis' graph), each with its own digest. A reader checks the header and the payload
against the seal on the first line, and each section only when it is first read (`Section`):
a no-op reads none of the state's action shards, and a one-change build the graph's few
shards it needs, not 160 MB.

Layout: the seal (the digest of the header line and the payload) on a line; the header line,
`rsi-sections/1 ` and JSON `{"payload": bytes, "sections": [[bytes, digest], ...]}`; the
payload; the sections, back to back. A file shorter or longer than its header says is not
read at all. A section read later that no longer holds its digest (the file was changed in
place, or the disk under it went bad) raises `CacheDamaged`: a build then forgets the file and
goes again without it (rsi/build.py), as it would had the file been missing.

It must never hand over bytes no digest vouched for: the payload is checked before it is
unpickled, and a section each time it is read.

A `Section` pickled by plain `pickle` is its bytes; an object that held one pickles as if it
had held bytes. Files are only ever replaced by a rename, so the descriptor a reader keeps
open reads the file it checked, whatever is written under its name meanwhile.
"""

from __future__ import annotations

import io
import json
import os
import pickle
from typing import Any

from rsi.digest import hasher

MAGIC = b"rsi-sections/1 "
# NB: blobs smaller than this stay in the payload: a section costs a header row and a read
SECTION_MIN = 16 * 1024
# NB: a header of 1,000,000 sections is ~80 MB; larger is not a file this module wrote
_HEADER_MAX = 1 << 27


class CacheDamaged(Exception):
    """A section of a sealed cache file no longer holds its digest. Not an `RsiError`: no
    action's failure, but the build's, which forgets the file and goes again."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"the cache file {path} changed or was damaged while in use")


class _Blob(bytearray):
    """The copy of a blob handed to the pickler as a buffer: `dumps` puts those of this type
    in sections (any other buffer stays in the payload)."""


def _rebuilt(data: Any) -> Any:
    """A blob unpickled: the section `load` handed over for it, else (a plain pickle) its
    bytes."""
    return data if type(data) is Section else bytes(data)


def _reduced(data: bytes, protocol: int) -> tuple:
    # NB: protocol 5's out-of-band buffers: the pickler hands them to `dumps` without a call
    # back into Python per pickled object (a state of 100,000 sources is ~1,000,000 of them)
    if protocol >= 5 and len(data) >= SECTION_MIN:
        return (_rebuilt, (pickle.PickleBuffer(_Blob(data)),))
    return (bytes, (data,))


class Packed:
    """Bytes its owner wants in a section of their own when written by `dumps`; plain
    `pickle` writes them as bytes (and reads them back as bytes)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __reduce_ex__(self, protocol: Any) -> tuple:
        return _reduced(self.data, protocol)


class _File:
    """The open file a reader's sections are read from (closed with the last of them)."""

    __slots__ = ("fd", "path", "function")

    def __init__(self, fd: int, path: str, function: str) -> None:
        self.fd, self.path, self.function = fd, path, function

    def __del__(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


class Section:
    """A blob of a sealed file, read and checked against its digest on each `read`."""

    __slots__ = ("_file", "_at", "_n", "_digest")

    def __init__(self, file: _File, at: int, n: int, digest: str) -> None:
        self._file, self._at, self._n, self._digest = file, at, n, digest

    def __len__(self) -> int:
        return self._n

    def read(self) -> bytes:
        f = self._file
        try:
            data = os.pread(f.fd, self._n, self._at)
            while len(data) < self._n:
                more = os.pread(f.fd, self._n - len(data), self._at + len(data))
                if not more:
                    break
                data += more
        except OSError as exc:
            raise CacheDamaged(f.path) from exc
        h = hasher(f.function)
        h.update(data)
        if len(data) != self._n or h.hexdigest() != self._digest:
            raise CacheDamaged(f.path)
        return data

    def __reduce_ex__(self, protocol: Any) -> tuple:
        return _reduced(self.read(), protocol)


def raw(part: Any) -> Any:
    """The bytes of a `Section` (read now) or `Packed`; anything else as it is."""
    if type(part) is Section:
        return part.read()
    if type(part) is Packed:
        return part.data
    return part


def is_packed(part: Any) -> bool:
    """Still pickled: bytes, or a section not read yet."""
    return type(part) in (bytes, Section, Packed)


def dumps(obj: Any, function: str) -> tuple[str, list[bytes]]:
    """(the seal, the file's parts in order) of `obj` pickled with its `Packed` blobs (and
    sections it still holds) of `SECTION_MIN` bytes or more in sections."""
    blobs: list[Any] = []

    def out_of_band(buffer: pickle.PickleBuffer) -> bool:
        view = buffer.raw()
        if type(view.obj) is not _Blob:
            return True  # NB: not ours (an array's, say): in the payload, as plain pickle has it
        blobs.append(view)
        return False

    payload = pickle.dumps(obj, 5, buffer_callback=out_of_band)
    rows = []
    for blob in blobs:
        h = hasher(function)
        h.update(blob)
        rows.append([len(blob), h.hexdigest()])
    header = MAGIC + json.dumps({"payload": len(payload), "sections": rows}).encode() + b"\n"
    h = hasher(function)
    h.update(header)
    h.update(payload)
    seal = h.hexdigest()
    return seal, [seal.encode() + b"\n", header, payload, *blobs]


def load(f: Any, path: str, function: str, seal: str) -> Any:
    """The object of a sectioned file, `f` open on it just after the seal's line (its header
    line next); raises ValueError when the file is not whole or not what the seal says. `f`'s
    descriptor is kept (a duplicate) for the sections."""
    header = f.readline(_HEADER_MAX)
    if not header.startswith(MAGIC) or not header.endswith(b"\n"):
        raise ValueError("not a sectioned file")
    meta = json.loads(header[len(MAGIC) :])
    n = meta["payload"]
    rows = meta["sections"]
    if not isinstance(n, int) or n < 0 or not isinstance(rows, list):
        raise ValueError("malformed header")
    payload = f.read(n)
    h = hasher(function)
    h.update(header)
    h.update(payload)
    if len(payload) != n or h.hexdigest() != seal:
        raise ValueError("payload not as sealed")
    at = f.tell()
    end = at
    for row in rows:
        if (
            not isinstance(row, list)
            or len(row) != 2
            or not isinstance(row[0], int)
            or row[0] < 0
            or not isinstance(row[1], str)
        ):
            raise ValueError("malformed section row")
        end += row[0]
    if os.fstat(f.fileno()).st_size != end:
        raise ValueError("not the size its header says")
    sections: list[Section] = []
    file = _File(os.dup(f.fileno()), path, function) if rows else None
    for size, digest in rows:
        sections.append(Section(file, at, size, digest))  # type: ignore[arg-type]
        at += size

    # NB: a pickle asking for more sections than the header lists fails (no such buffer)
    return pickle.Unpickler(io.BytesIO(payload), buffers=sections).load()
