"""A mapping kept pickled in shards (by a CRC of each key), each unpickled on first use, its
key order apart: a build that reads a few entries of 100,000 (a one-change build: the dirty
actions' edges and specs) unpickles the shards that hold them, not all. It must never change
what the mapping holds or its order, only when each part is read.
"""

from __future__ import annotations

import pickle
import zlib
from collections.abc import Iterator, Mapping
from typing import Any

SHARDS = 256
_PROTOCOL = pickle.HIGHEST_PROTOCOL


def shard_of(key: Any) -> int:
    """The shard of `key`: the same in every process (no `hash`: strings' hashes are salted)."""
    text = key if isinstance(key, str) else str(key)
    return zlib.crc32(text.encode("utf-8", "surrogatepass")) % SHARDS


class Sharded(Mapping):
    """Read-only. Equal keys must have equal `str` (action ids, labels)."""

    __slots__ = ("_order", "_shards", "_len")

    def __init__(self, order: bytes | list, shards: list, length: int) -> None:
        self._order = order
        self._shards = shards
        self._len = length

    @classmethod
    def pack(cls, values: Mapping) -> Sharded:
        if isinstance(values, Sharded):
            return values
        buckets: list[dict] = [{} for _ in range(SHARDS)]
        for key, value in values.items():
            buckets[shard_of(key)][key] = value
        dumps = pickle.dumps
        return cls(
            dumps(list(values), _PROTOCOL), [dumps(b, _PROTOCOL) for b in buckets], len(values)
        )

    def _shard(self, at: int) -> dict:
        part = self._shards[at]
        if isinstance(part, bytes):
            part = self._shards[at] = pickle.loads(part)
        return part

    def __getitem__(self, key: Any) -> Any:
        return self._shard(shard_of(key))[key]

    def get(self, key: Any, default: Any = None) -> Any:
        return self._shard(shard_of(key)).get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._shard(shard_of(key))

    def __iter__(self) -> Iterator:
        if isinstance(self._order, bytes):
            self._order = pickle.loads(self._order)
        return iter(self._order)

    def __len__(self) -> int:
        return self._len

    def __reduce__(self) -> tuple:
        order = self._order
        if not isinstance(order, bytes):
            order = pickle.dumps(order, _PROTOCOL)
        shards = [p if isinstance(p, bytes) else pickle.dumps(p, _PROTOCOL) for p in self._shards]
        return (Sharded, (order, shards, self._len))
