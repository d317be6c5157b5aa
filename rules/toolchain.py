"""The `toolchain` rule: a pinned root filesystem. Analysis only reads the recipe: it declares one
build step (a host action, `rsi.toolchain.step`) that builds the rootfs, or finds it built, when a
build needs it, and writes `<name>.toolchain.json` and `<name>.lock`. Dependents get the recipe's
identity `name@recipe:<recipe digest>`, which goes into the `toolchain` platform property and so
into every action key run on it; those actions run after the step. Analysis must never build the
rootfs itself."""

from __future__ import annotations


from rsi.attrs import attr
from rsi.errors import DeclarationError
from rsi.executors.hoststep import HOST_STEP, PROVIDES_TOOLCHAIN
from rsi.rule import Provider, Rule, RuleContext

BUILD_TIMEOUT_S = 3600.0  # NB: torch-cpu takes ~60 s warm; a cold download cache much longer


def _toolchain(ctx: RuleContext) -> Provider:
    from rsi.toolchain import load_recipe
    from rsi.toolchain.build import recipe_value, toolchains_root
    from rsi.toolchain.step import DECLARED_LOCK_DIR, STEP, step_argv

    a = ctx.attrs
    doc = {k: v for k, v in a.items() if k not in ("doc", "tags") and v not in (None, [], ())}
    doc = {k: (list(v) if isinstance(v, tuple) else v) for k, v in doc.items()}
    try:
        recipe = load_recipe(doc, ctx.label.name)
    except DeclarationError as exc:
        # NB: the recipe names no file or target of its own here: this target's, and the
        # attribute (`wheels`, not `wheels[0]`) at fault
        raise ctx.error(exc.detail, (exc.field or "").split("[")[0] or None, exc.hint) from None
    value = recipe_value(recipe.name, recipe.digest().hash)
    if ctx.tracker is not None and ctx.settings.get("store"):
        # NB: read-only: whether (and to what) the tree is built keeps a cached analysis and
        # the incremental state honest when the tree is built, rebuilt or deleted
        ctx.tracker.file(
            toolchains_root(ctx.settings["store"]) / value.split(":")[-1] / "info.json"
        )
    inputs = []
    lock_name = f"{recipe.name}.lock"
    if ctx.tracker is not None:
        ctx.tracker.stat(ctx.package_dir / lock_name)  # NB: a lock added later re-analyses
    if (ctx.package_dir / lock_name).is_file():
        # NB: the checked-in lock, so the step names the packages that moved against it; at
        # its own exec path, since the step's fresh lock is an output `<name>.lock`
        lock = ctx.source(lock_name, "lock")
        inputs.append(lock.replace(path=ctx.exec_path(f"{DECLARED_LOCK_DIR}/{lock_name}")))
    files = ctx.action(
        argv=step_argv(recipe),
        inputs=inputs,
        outputs=[f"{recipe.name}.toolchain.json", lock_name],
        mnemonic="ToolchainBuild",
        platform={HOST_STEP: STEP, PROVIDES_TOOLCHAIN: value},
        timeout_s=BUILD_TIMEOUT_S,
    )
    info = {"toolchain": value, "recipe_digest": recipe.digest().hash, "name": recipe.name}
    return Provider(files=files, info=info)


TOOLCHAIN = Rule(
    name="toolchain",
    doc="A pinned root filesystem from Debian packages plus hashed wheels, built as a "
    "byte-identical tar by a host step when a build needs it (docs/toolchains.md). Actions "
    "name it by recipe digest; the built tar's digest is recorded in their results.",
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
