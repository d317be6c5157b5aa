"""The toolchain build as an action: what `//toolchains:<name>` declares at analysis and what
runs it at execution.

Analysis knows only the recipe, so the rule declares one host step (`rsi.executors.hoststep`)
whose argv carries the canonical recipe and whose outputs are `<name>.toolchain.json` (which
tree the recipe built to) and `<name>.lock` (every installed package). Running it builds the
rootfs into `<store>/toolchains/<recipe digest>/` with `rsi.toolchain.build` (or finds it
there). Actions that run in the toolchain name it by recipe, `<name>@recipe:<recipe hex>`; the
analysis orders them after this step, and the executors map the value to the built tree.

It runs on the host, never in a sandbox: mmdebstrap and pip need the package mirrors
(network) and root. Nothing here writes into the workspace: the lock beside the declaration
is refreshed by hand from `out/` (or with `python -m rsi.toolchain build`).
"""

from __future__ import annotations

import json
import threading
import time
from typing import TYPE_CHECKING

from rsi.action import Action, ActionResult, OutputFile
from rsi.errors import DeclarationError, RsiError
from rsi.toolchain.build import _load_info, build, recipe_value, toolchains_root
from rsi.toolchain.lock import format_lock, parse_lock
from rsi.toolchain.recipe import BUILDER_VERSION, Recipe, recipe_from_dict

if TYPE_CHECKING:
    from rsi.store import LocalStore

STEP = "toolchain"  # NB: the `host-step` platform value of toolchain builds
ARGV0 = "rsi-host-step"
BUILT_SCHEMA = "rsi.toolchain.built/1"
DECLARED_LOCK_DIR = "declared"  # NB: exec path of the checked-in lock, an input: <pkg>/declared/


def step_argv(recipe: Recipe) -> tuple[str, ...]:
    """The step's command line: the canonical recipe itself, so the step's key is the recipe."""
    return (ARGV0, STEP, json.dumps(recipe.describe(), sort_keys=True, separators=(",", ":")))


def recipe_of(action: Action) -> Recipe:
    """The recipe a toolchain step builds, read back from its argv."""
    if len(action.argv) != 3 or tuple(action.argv[:2]) != (ARGV0, STEP):
        raise RsiError(f"{action.label or 'action'}: not a toolchain build step")
    doc = json.loads(action.argv[2])
    doc.pop("schema", None)
    builder = doc.pop("builder", None)
    if builder != BUILDER_VERSION:
        raise RsiError(
            f"{action.label}: the step was declared for toolchain builder {builder!r}, "
            f"this rsi is builder {BUILDER_VERSION!r}",
            hint="analyse again (a newer rsi declares a new step)",
        )
    return recipe_from_dict(doc)


def built(action: Action, store: LocalStore) -> bool:
    """Whether the tree this step builds is in the store: a cached result of the step counts
    only then (the tree lives beside the CAS and may have been deleted)."""
    try:
        recipe = recipe_of(action)
    except (RsiError, ValueError):
        return False
    return _load_info(toolchains_root(store.root) / recipe.digest().hash) is not None


def run(action: Action, store: LocalStore, cancel: threading.Event | None = None) -> ActionResult:
    """Build (or find) the toolchain; a failure is a failed action naming the recipe field."""
    from rsi.executors.base import host_facts

    started, t0 = time.time(), time.perf_counter()
    log: list[str] = []
    label = action.label or "toolchain"

    def say(message: str) -> None:
        log.append(message)

    def logs() -> bytes:
        return "".join(f"[toolchain] {m}\n" for m in log).encode()

    host = {**host_facts(), "sandbox": "none: host step (network, root)"}
    try:
        recipe = recipe_of(action)
        previous = None
        for path, node in action.inputs:
            if path.split("/")[-2:] == [DECLARED_LOCK_DIR, f"{recipe.name}.lock"]:
                previous = parse_lock(store.read_bytes(node.digest).decode())
        info = build(
            recipe,
            store.root,
            previous_lock=previous,
            write_lock=False,
            progress=say,
            cancel=cancel,
        )
    except (RsiError, ValueError) as exc:
        if cancel is not None and cancel.is_set():
            raise
        field = getattr(exc, "field", None)
        if isinstance(exc, DeclarationError):
            field, detail = (exc.field or "").split("[")[0] or None, exc.detail
        else:
            detail = getattr(exc, "message", str(exc))
            name = json.loads(action.argv[2]).get("name") if len(action.argv) == 3 else None
            if name and detail.startswith(f"{name}: "):
                detail = detail[len(name) + 2 :]  # NB: the target is named already
        hint = getattr(exc, "hint", None)
        failure = (
            f"toolchain {label} failed to build"
            + (f", field '{field}'" if field else "")
            + f": {detail}"
            + (f"\n  hint: {hint}" if hint else "")
        )
        err = store.put_bytes(logs(), fsync=False)  # NB: the steps it got through; not the failure
        return ActionResult(
            exit_code=1,
            stdout=err,
            stderr=err,
            failure=failure,
            executor="host-step",
            host=host,
            timing={"started": started, "wall_s": round(time.perf_counter() - t0, 6)},
        )
    value = recipe_value(info.name, info.recipe_digest)
    lock_text = format_lock(dict(info.lock))
    outputs = []
    for out in action.outputs:
        name = out.rsplit("/", 1)[-1]
        if name == f"{recipe.name}.toolchain.json":
            doc = {
                "schema": BUILT_SCHEMA,
                "toolchain": value,
                "recipe_digest": info.recipe_digest,
                "rootfs": str(info.rootfs),
                "rootfs_sha256": info.rootfs_sha256,
                "rootfs_platform": info.platform_value,
                "image_id": info.image_id,
                # NB: against the lock checked in beside the declaration (an input), else null
                "lock_changes": (
                    info.changes.describe()
                    if previous is not None and info.changes is not None
                    else None
                ),
            }
            data = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
        elif name == f"{recipe.name}.lock":
            data = lock_text.encode()
        else:
            continue
        outputs.append(OutputFile(out, store.put_bytes(data, fsync=False)))
    if previous is None:
        say(f"no {recipe.name}.lock beside the declaration: copy it from out/ (docs/toolchains.md)")
    elif info.changes:
        say(
            f"{label}: packages moved against the checked-in {recipe.name}.lock: "
            + "; ".join(info.changes.describe())
        )
    say(f"{value} is {info.platform_value} ({'cached' if info.cached else 'built'})")
    host["rootfs"] = str(info.rootfs)
    host["toolchain_cached"] = info.cached
    return ActionResult(
        exit_code=0,
        outputs=tuple(outputs),
        stdout=store.put_bytes(logs(), fsync=False),
        stderr=store.put_bytes(b"", fsync=False),
        executor="host-step",
        host=host,
        timing={"started": started, "wall_s": round(time.perf_counter() - t0, 6)},
    )
