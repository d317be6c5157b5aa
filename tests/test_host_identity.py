"""host-python@<digest>: the interpreter's identity follows every installed distribution's
name and version (a changed one is another toolchain), and nothing else on sys.path."""

from __future__ import annotations

import sys

import pytest

from rsi.executors import local


def _identity(monkeypatch, path: list[str]) -> str:
    monkeypatch.setattr(sys, "path", path)
    local.host_python_identity.cache_clear()
    try:
        return local.host_python_identity()
    finally:
        local.host_python_identity.cache_clear()


@pytest.mark.fast
def test_identity_follows_dist_versions_and_ignores_the_working_directory(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "numpy-2.0.0.dist-info").mkdir(parents=True)
    (site / "legacy.egg-info").mkdir()
    (site / "legacy.egg-info" / "PKG-INFO").write_text("Name: legacy\nVersion: 0.3\n")
    (site / "not_a_dist").mkdir()
    first = _identity(monkeypatch, [str(site)])
    assert local._installed_dists() == ["legacy==0.3", "numpy==2.0.0"]
    assert _identity(monkeypatch, [str(site)]) == first

    (site / "numpy-2.0.0.dist-info").rename(site / "numpy-2.0.1.dist-info")
    bumped = _identity(monkeypatch, [str(site)])
    assert bumped != first
    (site / "legacy.egg-info" / "PKG-INFO").write_text("Name: legacy\nVersion: 0.4\n")
    assert _identity(monkeypatch, [str(site)]) not in (first, bumped)

    # NB: a dist-info in the working directory ('' or a relative entry) is not importable by
    # an action (-I), so it does not name the interpreter
    monkeypatch.chdir(tmp_path)
    (tmp_path / "extra-1.0.dist-info").mkdir()
    here = _identity(monkeypatch, [str(site)])
    assert _identity(monkeypatch, ["", ".", str(site)]) == here
    (site / "rsi-0.1.0.dist-info").mkdir()
    assert _identity(monkeypatch, [str(site)]) == here, "rsi itself is not part of it"
