"""Attribute schemas for rules: typed, documented, validated with errors naming the field. It must
never run project code.

Declarations are data; this module turns a TOML table into checked Python values without running
any project code. Attributes of type `label`/`label_list` are the edges of the target graph.
"""

from __future__ import annotations

import math
from typing import Any

from rsi.errors import DeclarationError, LabelError
from rsi.label import Label
from rsi.record import Frozen, Value

_MISSING = object()

KINDS = (
    "string",
    "int",
    "float",
    "bool",
    "string_list",
    "label",
    "label_list",
    "string_dict",
    "table",
    "table_list",
)


class Attr(Frozen):
    _fields = (
        "kind",
        "doc",
        "default",
        "choices",
        "nonempty",
        "minimum",
        "maximum",
        "exclusive_minimum",
        "environment",
    )
    kind: str
    doc: str
    default: Any
    choices: tuple[str, ...]
    nonempty: bool
    # bounds of an int or float (a float is always finite: nan and inf are refused)
    minimum: float | None
    maximum: float | None
    exclusive_minimum: bool  # `minimum` itself is refused (e.g. a timeout of 0)
    environment: bool  # a string_dict whose keys are environment variable names

    def __init__(
        self,
        kind: str,
        doc: str = "",
        default: Any = _MISSING,
        choices: tuple[str, ...] = (),
        nonempty: bool = False,
        minimum: float | None = None,
        maximum: float | None = None,
        exclusive_minimum: bool = False,
        environment: bool = False,
    ) -> None:
        d = self.__dict__
        d["kind"] = kind
        d["doc"] = doc
        d["default"] = default
        d["choices"] = choices
        d["nonempty"] = nonempty
        d["minimum"] = minimum
        d["maximum"] = maximum
        d["exclusive_minimum"] = exclusive_minimum
        d["environment"] = environment

    @property
    def required(self) -> bool:
        return self.default is _MISSING

    @property
    def is_dependency(self) -> bool:
        return self.kind in ("label", "label_list")

    def describe_range(self) -> str:
        """The bounds in words, for the declaration reference ("" when unbounded)."""
        parts = []
        if self.minimum is not None:
            word = "more than" if self.exclusive_minimum else "at least"
            parts.append(f"{word} {_plain(self.minimum)}")
        if self.maximum is not None:
            parts.append(f"at most {_plain(self.maximum)}")
        return ", ".join(parts)


def _plain(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else repr(float(number))


def attr(kind: str, doc: str = "", default: Any = _MISSING, **kw: Any) -> Attr:
    if kind not in KINDS:
        raise ValueError(f"unknown attribute kind {kind}")
    made = Attr(kind, doc, default, **kw)
    if (made.minimum is not None or made.maximum is not None) and kind not in ("int", "float"):
        raise ValueError(f"bounds on a {kind} attribute")
    if made.environment and kind != "string_dict":
        raise ValueError(f"environment names on a {kind} attribute")
    return made


_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    list: "a list",
    dict: "a table",
}


def _type_name(value: Any) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


class _LazyBad(Exception):
    """Raised in place of the DeclarationError it stands for; built only when it is thrown."""

    def __init__(self, where: "Where", name: str, want: str, value: Any) -> None:
        self.args_ = (where, name, want, value)

    def real(self) -> DeclarationError:
        where, name, want, value = self.args_
        return _err(where, name, f"expected {want}, got {_type_name(value)} {value!r:.60}")


class Where(Value):
    _fields = ("file", "target", "package")

    def __init__(self, file: str, target: str, package: str) -> None:
        self.file = file
        self.target = target
        self.package = package


def _err(where: Where, field_name: str, msg: str, hint: str | None = None) -> DeclarationError:
    return DeclarationError(msg, file=where.file, target=where.target, field=field_name, hint=hint)


def coerce(a: Attr, name: str, value: Any, where: Where) -> Any:
    """Check and convert one attribute value; errors name the file, target and field."""
    try:
        return _coerce(a, name, value, where)
    except _LazyBad as bad:
        raise bad.real() from None


def _hostile_leaf(value: Any) -> str | None:
    """What is wrong with a value no attribute may hold, at any depth: a string (key or value)
    with a NUL character, a float that is nan or infinite, a TOML date or time."""
    stack = [value]
    while stack:
        v = stack.pop()
        if v is None or isinstance(v, (bool, int)):
            continue  # NB: None only reaches here from a generated target (JSON null)
        if isinstance(v, str):
            if "\x00" in v:
                return f"{v!r:.60} contains a NUL character"
        elif isinstance(v, float):
            if not math.isfinite(v):
                return f"expected a finite number, got {v!r}"
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        else:
            return f"a TOML {type(v).__name__} ({v}) is not a value declarations may hold"
    return None


def _check_number(a: Attr, name: str, value: int | float, where: Where) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise _err(where, name, f"expected a finite number, got {value!r}")
    low, high = a.minimum, a.maximum
    if low is not None and (value < low or (a.exclusive_minimum and value == low)):
        raise _err(where, name, f"{value!r} is out of range: must be {a.describe_range()}")
    if high is not None and value > high:
        raise _err(where, name, f"{value!r} is out of range: must be {a.describe_range()}")


def _check_environment(a: Attr, name: str, value: dict, where: Where) -> None:
    for key in value:
        if not key or "=" in key:
            raise _err(
                where,
                name,
                f"{key!r} is not an environment variable name",
                hint="a name is not empty and holds no '='",
            )


def _coerce(a: Attr, name: str, value: Any, where: Where) -> Any:
    k = a.kind
    want = {
        "string": "a string",
        "int": "an integer",
        "float": "a number",
        "bool": "true or false",
        "string_list": "a list of strings",
        "label": "a label string",
        "label_list": "a list of label strings",
        "string_dict": "a table of strings",
        "table": "a table",
        "table_list": "a list of tables",
    }[k]
    bad = _LazyBad(where, name, want, value)
    # NB: scalars of another type (a TOML date in a string attribute) get the type error
    hostile = _hostile_leaf(value) if isinstance(value, (str, float, list, dict)) else None
    if hostile is not None:
        # NB: a NUL cannot reach an argv, an environment or a path, and nan/inf have no
        # canonical encoding; refused here, for every attribute, rather than as a traceback
        # or an infrastructure fault when the action starts
        raise _err(where, name, hostile)
    if k == "string":
        if not isinstance(value, str):
            raise bad
        if a.choices and value not in a.choices:
            raise _err(where, name, f"{value!r} is not one of {', '.join(a.choices)}")
        if a.nonempty and not value:
            raise _err(where, name, "must not be empty")
        return value
    if k == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        _check_number(a, name, value, where)
        return value
    if k == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        try:
            number = float(value)
        except OverflowError:  # NB: an int past 1.8e308
            raise _err(where, name, f"{value!r:.60} is too large") from None
        _check_number(a, name, number, where)
        return number
    if k == "bool":
        if not isinstance(value, bool):
            raise bad
        return value
    if k in ("string_list", "label_list"):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise bad
        if a.nonempty and not value:
            raise _err(where, name, "must list at least one entry")
        if len(set(value)) != len(value):
            dup = next(v for v in value if value.count(v) > 1)
            raise _err(where, name, f"{dup!r} is listed twice")
        if k == "label_list":
            return tuple(_label(v, name, where) for v in value)
        return tuple(value)
    if k == "label":
        if not isinstance(value, str):
            raise bad
        return _label(value, name, where)
    if k == "string_dict":
        if not isinstance(value, dict) or not all(
            isinstance(kk, str) and isinstance(v, str) for kk, v in value.items()
        ):
            raise bad
        if a.environment:
            _check_environment(a, name, value, where)
        return dict(value)
    if k == "table":
        if not isinstance(value, dict):
            raise bad
        return value
    if k == "table_list":
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise bad
        return list(value)
    raise AssertionError(k)


def _label(text: str, name: str, where: Where) -> Label:
    try:
        return Label.parse(text, where.package)
    except LabelError as exc:
        raise _err(where, name, exc.message, hint=exc.hint) from None


class Schema(Frozen):
    _fields = ("attrs",)
    attrs: dict[str, Attr]

    def __init__(self, attrs: dict[str, Attr] | None = None) -> None:
        self.__dict__["attrs"] = {} if attrs is None else attrs

    def validate(self, raw: dict, where: Where) -> dict:
        try:
            return self._validate(raw, where)
        except _LazyBad as bad:
            raise bad.real() from None

    def _validate(self, raw: dict, where: Where) -> dict:
        out: dict[str, Any] = {}
        for key in raw:
            if key not in self.attrs:
                import difflib

                close = difflib.get_close_matches(key, list(self.attrs), n=1)
                raise _err(
                    where,
                    key,
                    "unknown attribute",
                    hint=f"did you mean '{close[0]}'?"
                    if close
                    else f"known attributes: {', '.join(sorted(self.attrs))}",
                )
        for name, a in self.attrs.items():
            if name in raw:
                out[name] = _coerce(a, name, raw[name], where)
            elif a.required:
                raise _err(where, name, "required attribute is missing")
            else:
                d = a.default
                out[name] = (
                    tuple(d) if isinstance(d, list) else (dict(d) if isinstance(d, dict) else d)
                )
        return out
