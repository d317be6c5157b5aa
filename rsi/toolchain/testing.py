"""Test support for toolchains and sandboxed executors: one persistent store of built test
toolchains (reused across runs by recipe digest), and honest skip reasons. It must never be imported
by the engine itself.

Set RSI_REQUIRE_SANDBOXES=1 (CI does) to turn every "cannot run here" skip into a failure.
"""

from __future__ import annotations

import os
from functools import cache, lru_cache
from pathlib import Path

from rsi.toolchain.build import ToolchainInfo, build, default_cache_dir

REPO = Path(__file__).resolve().parents[2]
DECLARATIONS = REPO / "toolchains" / "BUILD.toml"


def require_sandboxes() -> bool:
    return os.environ.get("RSI_REQUIRE_SANDBOXES") == "1"


def skip_or_fail(reason: str) -> None:
    import pytest

    if require_sandboxes():
        pytest.fail(f"RSI_REQUIRE_SANDBOXES=1 but {reason}")
    pytest.skip(reason)


def test_store_dir() -> Path:
    """The store holding built test toolchains: $RSI_TEST_STORE, else under the download cache."""
    return Path(os.environ.get("RSI_TEST_STORE") or default_cache_dir() / "store")


@cache
def _built(name: str) -> ToolchainInfo | str:
    if os.geteuid() != 0:
        return "building toolchains needs root (mmdebstrap --mode=root)"
    try:
        return build(DECLARATIONS, test_store_dir(), name=name, write_lock=False)
    except Exception as exc:  # noqa: BLE001 - the reason is reported as the skip
        return f"toolchain {name} could not be built here: {exc}"


def built_toolchain(name: str) -> ToolchainInfo:
    """The declared toolchain `name`, built once per store; skips (or fails in CI) if impossible."""
    got = _built(name)
    if isinstance(got, str):
        skip_or_fail(got)
    return got  # type: ignore[return-value]


@lru_cache(maxsize=1)
def docker_skip_reason() -> str | None:
    try:
        from rsi.executors.docker import docker_client

        docker_client(timeout=10)
    except Exception as exc:  # noqa: BLE001
        return f"no usable Docker engine: {exc}"
    return None


@lru_cache(maxsize=1)
def bwrap_skip_reason() -> str | None:
    from rsi.executors.bwrap import bwrap_available

    return bwrap_available()


test_store_dir.__test__ = False  # type: ignore[attr-defined]
