"""The `toolchain` rule: a pinned root filesystem, built (or reused by recipe digest) when the
target is analysed, like a Bazel repository rule. Dependents get its identity `name@<digest>`,
which goes into the `toolchain` platform property and so into every action key run on it."""

from __future__ import annotations

import json

from rsi.attrs import attr
from rsi.errors import DeclarationError, RsiError
from rsi.rule import Provider, Rule, RuleContext


def _toolchain(ctx: RuleContext) -> Provider:
    from rsi.toolchain import build, load_recipe

    a = ctx.attrs
    doc = {k: v for k, v in a.items() if k not in ("doc", "tags") and v not in (None, [], ())}
    doc = {k: (list(v) if isinstance(v, tuple) else v) for k, v in doc.items()}
    try:
        recipe = load_recipe(doc, ctx.label.name)
    except DeclarationError as exc:
        # NB: the recipe names no file or target of its own here: this target's, and the
        # attribute (`wheels`, not `wheels[0]`) at fault
        raise ctx.error(exc.detail, (exc.field or "").split("[")[0] or None, exc.hint) from None
    try:
        recipe = type(recipe)(**{**recipe.__dict__, "declared_in": ctx.package_dir / "BUILD.toml"})
        info = build(recipe, ctx.settings["store"])
    except RsiError as exc:
        raise ctx.error(f"toolchain build failed: {exc.message}", hint=exc.hint) from None
    # NB: tracked, so a deleted or rebuilt toolchain invalidates the cached analysis
    ctx.read_file(info.path / "info.json")
    doc = {
        "toolchain": info.platform_value,
        "image_id": info.image_id,
        "recipe_digest": info.recipe_digest,
        "rootfs": str(info.rootfs),
    }
    out = ctx.write(f"{ctx.label.name}.toolchain.json", json.dumps(doc, indent=1, sort_keys=True))
    return Provider(files=(out,), info={"toolchain": info.platform_value, **doc})


TOOLCHAIN = Rule(
    name="toolchain",
    doc="A pinned root filesystem from Debian packages plus hashed wheels, built as a "
    "byte-identical tar (docs/toolchains.md). Its identity is the tar's digest.",
    attrs={
        "description": attr("string", "what it is for", default=""),
        "suite": attr("string", "Debian suite, e.g. bookworm", nonempty=True),
        "packages": attr("string_list", "Debian packages to install", default=[]),
        "wheels": attr("table_list", "pinned wheels: {name, version, file, sha256}", default=[]),
        "source_date_epoch": attr(
            "int", "fixed mtime of every file", default=1735689600, minimum=0, maximum=253402300799
        ),
        "components": attr("string_list", "archive components", default=["main"]),
        "variant": attr("string", "mmdebstrap variant", default="essential"),
        "architecture": attr("string", "Debian architecture", default="amd64"),
        "env": attr(
            "string_dict",
            "environment of actions run in it (default: C.UTF-8 locale, no bytecode)",
            default=None,
            environment=True,
        ),
        "doc": attr("string", "free text", default=""),
        "tags": attr("string_list", "", default=[]),
    },
    impl=_toolchain,
)

RULES = [TOOLCHAIN]
