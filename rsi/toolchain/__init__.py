"""Toolchains: pinned root filesystems built from declared recipes, identified by the digest of
their byte-identical tar, runnable by the docker and bwrap executors.

Plain API for rules and tests: `build(recipe, store_dir) -> ToolchainInfo`, `find_toolchain`,
`rootfs_dir`, `diff_locks`. `step` is the toolchain rule's build action (a host step run by the
scheduler); nothing else here runs an action.
"""

from rsi.toolchain.build import (
    ToolchainError,
    ToolchainInfo,
    build,
    default_cache_dir,
    find_toolchain,
    host_mirror,
    rootfs_dir,
    toolchains_root,
    verify,
)
from rsi.toolchain.lock import LockDiff, diff_locks, format_lock, parse_lock
from rsi.toolchain.recipe import Recipe, Wheel, load_declarations, load_recipe

__all__ = [
    "LockDiff",
    "Recipe",
    "ToolchainError",
    "ToolchainInfo",
    "Wheel",
    "build",
    "default_cache_dir",
    "diff_locks",
    "find_toolchain",
    "format_lock",
    "host_mirror",
    "load_declarations",
    "load_recipe",
    "parse_lock",
    "rootfs_dir",
    "toolchains_root",
    "verify",
]
