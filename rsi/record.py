"""Value classes without `dataclasses`: every `rsi build` imports these modules, and `dataclasses`
costs each start ~17 ms on a small VM (it generates and compiles every class's methods from source
at import, and imports `inspect`, `ast` and `dis` to do so). The classes on the build path write
their `__init__` out instead and take equality, hashing, ordering, `repr` and `replace` from here.
It must never import dataclasses, inspect or another rsi module. The meaning is the one
`@dataclass` gives:

- `_fields` names the fields in `__init__` order; `_compare` those equality, hashing and
  ordering look at (all by default); `_hidden` those `repr` leaves out.
- `Value`: equal to an instance of the same class with equal compared fields; unhashable, as a
  mutable dataclass is. `Frozen`: hashable, and assigning or deleting an attribute raises
  `FrozenError` (an AttributeError); `__init__` sets fields with `object.__setattr__`.
- `Ordered`: `<`, `<=`, `>`, `>=` between instances of one class, by the compared fields.
"""

from __future__ import annotations

from typing import Any


class FrozenError(AttributeError):
    """An attribute of a frozen value was assigned or deleted."""


class Value:
    __slots__ = ()
    _fields: tuple[str, ...] = ()
    _compare: tuple[str, ...] = ()
    _hidden: tuple[str, ...] = ()

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if "_compare" not in cls.__dict__:
            cls._compare = cls._fields

    def _values(self) -> tuple:
        return tuple([getattr(self, name) for name in self._compare])

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return self._values() == other._values()  # type: ignore[attr-defined]
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{name}={getattr(self, name)!r}" for name in self._fields if name not in self._hidden
        )
        return f"{type(self).__qualname__}({shown})"

    def replace(self, **changes: Any) -> Any:
        """A copy with `changes` (as dataclasses.replace: through `__init__`)."""
        values = {name: getattr(self, name) for name in self._fields}
        values.update(changes)
        return type(self)(**values)


class Frozen(Value):
    __slots__ = ()

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenError(f"cannot delete field {name!r}")

    def __hash__(self) -> int:
        return hash(self._values())


class Ordered(Frozen):
    __slots__ = ()

    def __lt__(self, other: Any) -> bool:
        if other.__class__ is self.__class__:
            return self._values() < other._values()
        return NotImplemented

    def __le__(self, other: Any) -> bool:
        if other.__class__ is self.__class__:
            return self._values() <= other._values()
        return NotImplemented

    def __gt__(self, other: Any) -> bool:
        if other.__class__ is self.__class__:
            return self._values() > other._values()
        return NotImplemented

    def __ge__(self, other: Any) -> bool:
        if other.__class__ is self.__class__:
            return self._values() >= other._values()
        return NotImplemented
