"""The generic `command` rule (Bazel's genrule): run a shell command over sources and the files of
dependencies, producing declared outputs. Makes the engine usable with no domain rules. It must
never read anything its action does not declare."""

from __future__ import annotations

from rsi.attrs import attr
from rsi.rule import MAX_TIMEOUT_S, Provider, Rule, RuleContext, expand_make_vars

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


def _command(ctx: RuleContext) -> Provider:
    a = ctx.attrs
    srcs = [ctx.source(s) for s in a["srcs"]]
    dep_files = []
    for dep in a["deps"]:
        dep_files.extend(ctx.dep(dep).all_files)
    outs = [ctx.exec_path(o) for o in a["outs"]]
    by_label = {str(d): [f.path for f in ctx.dep(d).files] for d in a["deps"]}

    def locate(ref: str) -> list[str]:
        if ref in a["srcs"]:
            return [ctx.exec_path(ref)]
        if ref in a["outs"]:
            return [ctx.exec_path(ref)]
        from rsi.label import Label

        try:
            key = str(Label.parse(ref, ctx.label.package))
        except Exception:
            key = None
        if key in by_label:
            return by_label[key]
        raise ctx.error(f"$(location {ref}) names nothing in srcs, outs or deps", "cmd")

    try:
        cmd = expand_make_vars(
            a["cmd"],
            {
                "SRCS": [s.path for s in srcs],
                "OUTS": outs,
                "OUT": outs[:1] if len(outs) == 1 else outs,
                "PKG": [ctx.label.package or "."],
            },
            locate,
        )
    except KeyError as exc:
        raise ctx.error(
            f"unknown make variable $({exc.args[0]})",
            "cmd",
            hint="known: $(SRCS) $(OUTS) $(OUT) $(PKG) $(location x)",
        ) from None
    env = {"PATH": DEFAULT_PATH, **a["env"]}
    produced = ctx.action(
        argv=["/bin/sh", "-c", cmd],
        inputs=[*srcs, *dep_files],
        outputs=a["outs"],
        mnemonic="Command",
        env=env,
        timeout_s=a["timeout"],
        tags=a["tags"],
        fields={"argv": "cmd", "env": "env", "timeout_s": "timeout", "outputs": "outs"},
    )
    return Provider(files=produced)


COMMAND = Rule(
    name="command",
    doc="Run `cmd` with /bin/sh in a fresh sandbox; srcs and deps' files are read-only inputs "
    "at their workspace paths; each of `outs` must be created (package-relative).",
    attrs={
        "srcs": attr("string_list", "files of this package the command reads", default=[]),
        "deps": attr("label_list", "targets whose files the command reads", default=[]),
        "outs": attr("string_list", "files the command must create", nonempty=True),
        "cmd": attr(
            "string", "shell command; $(SRCS) $(OUTS) $(OUT) $(location x) expand", nonempty=True
        ),
        "env": attr(
            "string_dict",
            "environment variables (the rest is cleared)",
            default={},
            environment=True,
        ),
        "timeout": attr(
            "float",
            "seconds before the whole process tree is killed",
            default=600.0,
            minimum=0,
            exclusive_minimum=True,
            maximum=MAX_TIMEOUT_S,
        ),
        "tags": attr("string_list", "scheduling tags, e.g. 'exclusive'", default=[]),
        "doc": attr("string", "free text", default=""),
    },
    impl=_command,
)

RULES = [COMMAND]
