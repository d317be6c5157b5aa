"""Finding rule families: the `rsi.rules` entry point group, plus modules a workspace names.

Each entry point is a callable returning a list of `Rule`s. The engine imports rule code only
through here, so it never depends on a particular family.

A family that keeps state of its own in the store (the campaign logs) registers its gc roots
the same way, in the `rsi.gc_roots` group: a callable taking the store and yielding the
digests (`Digest`, `hash/size` or bare hash texts) of blobs `rsi cache gc` must keep.
"""

from __future__ import annotations

import importlib
import re
from importlib import metadata
from typing import Any, Callable, Iterable

from rsi.errors import DeclarationError, RsiError, UsageError
from rsi.rule import Rule

ENTRY_POINT_GROUP = "rsi.rules"
GC_ROOTS_GROUP = "rsi.gc_roots"
# NB: the module sets host-python actions of a family import (their identity names them), so a
# remote worker can advertise the identities it would run: rsi/worker.py
HOST_IMPORTS_GROUP = "rsi.host_imports"
CONFIG_FILE = "rsi.toml"
_REF = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(:[A-Za-z_]\w*)?$")


def _bad(ref: str, message: str, hint: str | None = None) -> DeclarationError:
    return DeclarationError(
        f"rule module {ref!r}: {message}", file=CONFIG_FILE, field="rules", hint=hint
    )


def _load(ref: str) -> list[Rule]:
    """The rules `module:function` (or `module:list`) returns; every way it can go wrong is a
    declaration error naming the entry, never a traceback."""
    if not isinstance(ref, str) or not _REF.match(ref):
        raise _bad(ref, "is not of the form module.name or module.name:function")
    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise DeclarationError(
            f"cannot import rule module {module_name!r}: {exc}", file=CONFIG_FILE, field="rules"
        ) from None
    except Exception as exc:  # NB: the workspace's own code; whatever it raises is its error
        raise _bad(ref, f"importing it raised {type(exc).__name__}: {exc}") from None
    factory = getattr(module, attr or "rules", None)
    if factory is None:
        raise DeclarationError(
            f"{module_name} has no {attr or 'rules'}", file=CONFIG_FILE, field="rules"
        )
    try:
        found = factory() if callable(factory) else factory
        found = list(found)
    except Exception as exc:
        raise _bad(
            ref,
            f"did not give a list of rules ({type(exc).__name__}: {exc})",
            hint="name a function taking no arguments that returns a list of rsi.rule.Rule",
        ) from None
    for rule in found:
        if not isinstance(rule, Rule):
            raise _bad(ref, f"gave {type(rule).__name__} {rule!r:.60}, not an rsi.rule.Rule")
    return found


def load_rules(extra: Iterable[str] = ()) -> dict[str, Rule]:
    extra = tuple(extra)
    rules: dict[str, Rule] = {}
    sources = [ep.value for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)]
    for ref in [*sources, *extra]:
        for rule in _load(ref):
            if rule.name in rules and rules[rule.name] is not rule:
                raise DeclarationError(
                    f"rule {rule.name!r} is registered twice ({ref})",
                    file=CONFIG_FILE if ref in extra else None,
                    field="rules" if ref in extra else None,
                )
            rules[rule.name] = rule
    return rules


_HASH = re.compile(r"^[0-9a-f]{64}$")


def gc_root_providers() -> list[tuple[str, Callable[[Any], Iterable[Any]]]]:
    """(name, callable) of every `rsi.gc_roots` entry point, sorted by name. One that cannot be
    loaded is an error, never skipped: gc without it would remove what it keeps."""
    found = []
    for ep in sorted(metadata.entry_points(group=GC_ROOTS_GROUP), key=lambda e: e.name):
        try:
            provider = ep.load()
        except Exception as exc:  # NB: whatever the family's import raises
            raise UsageError(
                f"gc root provider {ep.name!r} ({ep.value}) cannot be loaded: "
                f"{type(exc).__name__}: {exc}; nothing was removed",
                hint="fix or reinstall the package that registers it (pip install -e .)",
            ) from None
        if not callable(provider):
            raise UsageError(
                f"gc root provider {ep.name!r} ({ep.value}) is not callable; nothing was removed"
            )
        found.append((ep.name, provider))
    return found


def gc_root_blobs(store: Any) -> set[str]:
    """The blob hashes every registered `rsi.gc_roots` provider says to keep in `store`."""
    from rsi.digest import Digest

    keep: set[str] = set()
    for name, provider in gc_root_providers():
        try:
            for value in provider(store):
                if isinstance(value, Digest):
                    value = value.hash
                text = value.split("/", 1)[0] if isinstance(value, str) else None
                if text is None or not _HASH.match(text):
                    raise ValueError(f"yielded {value!r:.80}, not a digest")
                keep.add(text)
        except Exception as exc:  # NB: a root we cannot list is a root we would delete
            raise RsiError(
                f"gc root provider {name!r} failed: {type(exc).__name__}: {exc}; "
                "nothing was removed",
                hint="fix what it names and run `rsi cache gc` again",
            ) from None
    return keep


def host_import_sets() -> list[tuple[str, ...]]:
    """The top-level module sets every `rsi.host_imports` entry point says its families'
    host-python actions import (each a `host-python@…:modules` identity), sorted, unique."""
    found: set[tuple[str, ...]] = set()
    for ep in sorted(metadata.entry_points(group=HOST_IMPORTS_GROUP), key=lambda e: e.name):
        try:
            for modules in ep.load()():
                found.add(tuple(sorted(str(m) for m in modules)))
        except Exception as exc:  # NB: whatever the family's import raises
            raise UsageError(
                f"host imports provider {ep.name!r} ({ep.value}) failed: "
                f"{type(exc).__name__}: {exc}",
                hint="fix or reinstall the package that registers it (pip install -e .)",
            ) from None
    return sorted(found)


def describe_rules(rules: dict[str, Rule]) -> list[dict]:
    out = []
    for name in sorted(rules):
        rule = rules[name]
        attrs = []
        for attr_name, a in rule.attrs.items():
            default = None if a.required else a.default
            attrs.append(
                {
                    "name": attr_name,
                    "kind": a.kind,
                    "required": a.required,
                    "default": list(default) if isinstance(default, tuple) else default,
                    "choices": list(a.choices) or None,
                    "range": a.describe_range() or None,
                    "doc": a.doc,
                }
            )
        out.append(
            {
                "name": name,
                "doc": rule.doc,
                "attrs": attrs,
                "generates_targets": rule.generate is not None,
            }
        )
    return out


def _short(value: Any, limit: int = 48) -> str:
    import json

    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def rules_text(doc: list[dict]) -> str:
    """`rsi rules` for people: every rule, and one line per attribute with its kind, whether it
    is required (or its default) and what it means."""
    lines: list[str] = []
    for r in doc:
        if lines:
            lines.append("")
        lines.append(f"{r['name']}: {r['doc']}")
        width = max((len(a["name"]) for a in r["attrs"]), default=0)
        for a in r["attrs"]:
            need = "required" if a["required"] else f"default {_short(a['default'])}"
            meaning = a["doc"] or "-"
            if a["choices"]:
                meaning += f" (one of {', '.join(a['choices'])})"
            if a.get("range"):
                meaning += f" ({a['range']})"
            lines.append(f"  {a['name']:<{width}}  {a['kind']}, {need}: {meaning}")
    return "\n".join(lines)


def rules_markdown(doc: list[dict]) -> str:
    import json

    lines = [
        "## Rules",
        "",
        "Generated by `rsi rules --markdown`; `tests/test_docs.py` checks it is current.",
        "",
    ]
    for r in doc:
        lines += [
            f"### `{r['name']}`",
            "",
            r["doc"],
            "",
            "| attribute | kind | required | default | meaning |",
            "|---|---|---|---|---|",
        ]
        for a in r["attrs"]:
            default = "" if a["required"] else f"`{json.dumps(a['default'])}`"
            meaning = a["doc"] + (f" (one of {', '.join(a['choices'])})" if a["choices"] else "")
            if a.get("range"):
                meaning += f" ({a['range']})"
            lines.append(
                f"| `{a['name']}` | {a['kind']} | {'yes' if a['required'] else 'no'} "
                f"| {default} | {meaning} |"
            )
        lines.append("")
    return "\n".join(lines)
