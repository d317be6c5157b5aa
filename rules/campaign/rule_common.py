"""What the campaign rules share: the tool platform their host actions run on, artifact unions,
where a target is declared, and what kind of binding a provider is. Owns no rule; must never
read a campaign log."""

from typing import Any, Mapping

from rsi.rule import Artifact, RuleContext
from rules.providers import (
    BindingInfo,
    ProjectDecl,
)


def tool_platform(platform: Mapping[str, str]) -> dict[str, str]:
    """The platform of a campaign's bookkeeping actions (round document, snapshot, selection,
    report, pending final): the toolchain only. They time nothing and touch no device, so they
    never inherit a binding's `accelerator` (or any device request) and never wait for one."""
    return {"toolchain": platform["toolchain"]} if "toolchain" in platform else {}


def union(*groups: tuple[Artifact, ...]) -> tuple[Artifact, ...]:
    seen: dict[str, Artifact] = {}
    for group in groups:
        for art in group:
            seen.setdefault(art.path, art)
    return tuple(seen.values())


def declared_where(ctx: RuleContext) -> tuple[str, str]:
    return ctx.build_file, str(ctx.label)


def binding_kind(info: Any) -> str | None:
    if isinstance(info, ProjectDecl):
        return "project"
    if isinstance(info, BindingInfo):
        return "task"
    return None
