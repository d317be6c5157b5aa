"""A mapping kept pickled in shards (by a CRC of each key), each unpickled on first use, its
key order apart: a build that reads a few entries of 100,000 (a one-change build: the dirty
actions' edges and specs) unpickles the shards that hold them, not all. It must never change
what the mapping holds or its order, only when each part is read.
"""

from __future__ import annotations

import pickle
import zlib
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

from rsi.sections import Packed, is_packed, raw

SHARDS = 256
_MISSING = object()
_PROTOCOL = pickle.HIGHEST_PROTOCOL


def shard_of(key: Any) -> int:
    """The shard of `key`: the same in every process (no `hash`: strings' hashes are salted)."""
    text = key if isinstance(key, str) else str(key)
    return zlib.crc32(text.encode("utf-8", "surrogatepass")) % SHARDS


def _pickled_shards(values: Mapping) -> list[bytes]:
    """`values` split by `shard_of` their key, each shard pickled."""
    buckets: list[dict] = [{} for _ in range(SHARDS)]
    for key, value in values.items():
        buckets[shard_of(key)][key] = value
    return [pickle.dumps(b, _PROTOCOL) for b in buckets]


def _packed(part: Any) -> Any:
    """A still pickled part as `Packed` (bytes as they are, a section not read yet kept as it
    is: written again, it is read then)."""
    return Packed(part) if type(part) is bytes else part


def _packed_shards(shards: list) -> list:
    return [_packed(p) if is_packed(p) else Packed(pickle.dumps(p, _PROTOCOL)) for p in shards]


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
        return cls(pickle.dumps(list(values), _PROTOCOL), _pickled_shards(values), len(values))

    def _shard(self, at: int) -> dict:
        part = self._shards[at]
        if is_packed(part):
            part = self._shards[at] = pickle.loads(raw(part))
        return part

    def __getitem__(self, key: Any) -> Any:
        return self._shard(shard_of(key))[key]

    def pick(self, keys: Any) -> list[tuple]:
        """(key, value) of each of `keys` the mapping holds: one lookup each (no `in` and then
        a `[]`, each finding the key's shard again)."""
        shard, missing = self._shard, _MISSING
        out = []
        for key in keys:
            text = key if isinstance(key, str) else str(key)
            value = shard(zlib.crc32(text.encode("utf-8", "surrogatepass")) % SHARDS).get(
                key, missing
            )
            if value is not missing:
                out.append((key, value))
        return out

    def get(self, key: Any, default: Any = None) -> Any:
        return self._shard(shard_of(key)).get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._shard(shard_of(key))

    def __iter__(self) -> Iterator:
        if is_packed(self._order):
            self._order = pickle.loads(raw(self._order))
        return iter(self._order)

    def __len__(self) -> int:
        return self._len

    def shard_items(self, first: int = 0, end: int = SHARDS) -> Iterator[tuple]:
        """Every (key, value) of shards `first` to `end` (all, by default), shard by shard, not
        in order (no key order unpickled, no key's shard looked up): for a reader of all of
        it, or of a share of it, that does not care about order."""
        for at in range(first, end):
            yield from self._shard(at).items()

    def shards(self) -> list[dict]:
        """Every shard, loaded (for a reader of all of it that does not care about order)."""
        return [self._shard(at) for at in range(SHARDS)]

    def loaded(self) -> int:
        """How many shards have been unpickled (0: no entry has been read)."""
        return sum(1 for part in self._shards if not is_packed(part))

    def __reduce__(self) -> tuple:
        # NB: each shard and the order `Packed`: a sectioned file (rsi.sections) puts them in
        # sections of their own, each read when first needed
        order = self._order
        if not is_packed(order):
            order = pickle.dumps(order, _PROTOCOL)
        return (type(self), (_packed(order), _packed_shards(self._shards), self._len))


class ShardedDict(Sharded, MutableMapping):
    """As `Sharded`, and writable: a write loads its key's shard (kept loaded, and pickled
    again only when the mapping is); a new key goes last in the order. `defer` replaces
    entries without loading their shards: each shard takes its deferred entries when loaded."""

    __slots__ = ("_pending",)

    def __init__(self, order: bytes | list, shards: list, length: int) -> None:
        super().__init__(order, shards, length)
        self._pending: dict[int, dict] = {}

    def defer(self, values: Mapping) -> None:
        """Replace these entries (keys already held, as a delta's) when their shard loads."""
        for key, value in values.items():
            at = shard_of(key)
            if is_packed(self._shards[at]):
                self._pending.setdefault(at, {})[key] = value
            else:
                self[key] = value

    def peek(self, key: Any, default: Any = None) -> Any:
        """As `get`, a deferred entry without loading its shard."""
        pending = self._pending.get(shard_of(key))
        if pending is not None and key in pending:
            return pending[key]
        return self.get(key, default)

    def _shard(self, at: int) -> dict:
        part = self._shards[at]
        if is_packed(part):
            part = self._shards[at] = pickle.loads(raw(part))
            for key, value in self._pending.pop(at, {}).items():
                if key not in part:
                    self._new_key(key)
                part[key] = value
        return part

    def _new_key(self, key: Any) -> None:
        if is_packed(self._order):
            self._order = pickle.loads(raw(self._order))
        self._order.append(key)
        self._len += 1

    def __reduce__(self) -> tuple:
        for at in list(self._pending):
            self._shard(at)
        return super().__reduce__()

    def __setitem__(self, key: Any, value: Any) -> None:
        part = self._shard(shard_of(key))
        if key not in part:
            self._new_key(key)
        part[key] = value

    def __delitem__(self, key: Any) -> None:
        raise TypeError("entries are replaced, never removed")


class UnorderedShardedDict(ShardedDict):
    """As `ShardedDict`, keeping no key order: a walk goes shard by shard, and a new key costs
    the load of its shard only, not of the order of every key (a build's delta adding a few
    blobs to a state of 110,000: ~10 ms). For a mapping whose readers never need its order."""

    __slots__ = ()

    @classmethod
    def pack(cls, values: Mapping) -> UnorderedShardedDict:
        if isinstance(values, UnorderedShardedDict):
            return values
        return cls(b"", _pickled_shards(values), len(values))

    def __iter__(self) -> Iterator:
        for at in range(SHARDS):
            yield from self._shard(at)

    def _new_key(self, key: Any) -> None:
        self._len += 1

    def __reduce__(self) -> tuple:
        for at in list(self._pending):
            self._shard(at)
        return (type(self), (b"", _packed_shards(self._shards), self._len))


class EntryShardedDict(ShardedDict):
    """As `ShardedDict`, each value pickled on its own as well: a loaded shard holds its values
    pickled until each is first read. A one-change build re-keying a root of 10,000 inputs
    reads 10,000 entries of 110,000, scattered over every shard: it unpickles those, not all
    (at 100,000 actions: ~0.2 s less). Values are never bytes (a bytes value is a pickled one)."""

    __slots__ = ()

    @classmethod
    def pack(cls, values: Mapping) -> EntryShardedDict:
        if isinstance(values, EntryShardedDict):
            return values
        dumps = pickle.dumps
        entries = {k: dumps(v, _PROTOCOL) for k, v in values.items()}
        return cls(pickle.dumps(list(values), _PROTOCOL), _pickled_shards(entries), len(values))

    def _value(self, part: dict, key: Any) -> Any:
        value = part[key]
        if type(value) is bytes:
            value = part[key] = pickle.loads(value)
        return value

    def __getitem__(self, key: Any) -> Any:
        return self._value(self._shard(shard_of(key)), key)

    def get(self, key: Any, default: Any = None) -> Any:
        part = self._shard(shard_of(key))
        return self._value(part, key) if key in part else default

    def pick(self, keys: Any) -> list[tuple]:
        return [(key, self._value(part, key)) for key, part in self._parts(keys)]

    def _parts(self, keys: Any) -> Iterator[tuple]:
        for key in keys:
            part = self._shard(shard_of(key))
            if key in part:
                yield key, part

    def peek(self, key: Any, default: Any = None) -> Any:
        pending = self._pending.get(shard_of(key))
        if pending is not None and key in pending:
            return pending[key]
        return self.get(key, default)

    def shard_items(self, first: int = 0, end: int = SHARDS) -> Iterator[tuple]:
        for at in range(first, end):
            part = self._shard(at)
            for key in list(part):
                yield key, self._value(part, key)

    def __reduce__(self) -> tuple:
        for at in list(self._pending):
            self._shard(at)
        order = self._order
        if not is_packed(order):
            order = pickle.dumps(order, _PROTOCOL)
        shards = []
        for part in self._shards:
            if not is_packed(part):
                dumps = pickle.dumps
                part = {k: v if type(v) is bytes else dumps(v, _PROTOCOL) for k, v in part.items()}
            shards.append(part)
        return (type(self), (_packed(order), _packed_shards(shards), self._len))
