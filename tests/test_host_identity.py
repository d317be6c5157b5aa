"""host-python@<digest>:<modules>: the interpreter's identity follows the distributions the
named modules come from and their requirements (a changed one is another toolchain), and
nothing else on sys.path: not an unrelated dist, not the working directory."""

from __future__ import annotations

import sys

import pytest

from rsi.executors import host_python, local


def _identity(monkeypatch, path: list[str], imports=("numpy",)) -> str:
    monkeypatch.setattr(sys, "path", path)
    return local.host_python_identity(imports)


def _dist(site, name: str, version: str, requires=(), top=None) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = [f"Name: {name}", f"Version: {version}", *(f"Requires-Dist: {r}" for r in requires)]
    (info / "METADATA").write_text("\n".join(lines) + "\n\nprose\n")
    (info / "RECORD").write_text(f"{top or name}/__init__.py,,\n")
    pkg = site / (top or name)
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text("")


@pytest.mark.fast
def test_identity_follows_imported_dists_and_ignores_the_rest(tmp_path, monkeypatch):
    site = tmp_path / "site"
    _dist(site, "numpy", "2.0.0", requires=["helper>=1", 'extraonly; extra == "x"'])
    _dist(site, "helper", "1.0")
    first = _identity(monkeypatch, [str(site)])
    assert first.endswith(":numpy") and first.startswith("host-python@")
    assert {k: v.split()[0] for k, v in host_python.packages(["numpy"]).items()} == {
        "helper": "1.0",
        "numpy": "2.0.0",
    }

    _dist(site, "unrelated", "9.9")  # NB: installed beside, imported by nobody
    _dist(site, "extraonly", "1.0")  # NB: only an extra of numpy's needs it
    assert _identity(monkeypatch, [str(site)]) == first

    (site / "helper-1.0.dist-info").rename(site / "helper-1.1.dist-info")
    (site / "helper-1.1.dist-info" / "METADATA").write_text("Name: helper\nVersion: 1.1\n")
    bumped = _identity(monkeypatch, [str(site)])
    assert bumped != first, "a requirement of an imported dist is part of it"
    (site / "numpy-2.0.0.dist-info" / "RECORD").write_text("numpy/__init__.py,sha256=x,1\n")
    assert _identity(monkeypatch, [str(site)]) not in (first, bumped), "its files are too"

    # NB: the working directory ('' or a relative entry) is not importable by an action (-I)
    monkeypatch.chdir(tmp_path)
    here = _identity(monkeypatch, [str(site)])
    (tmp_path / "numpy").mkdir()
    assert _identity(monkeypatch, ["", ".", str(site)]) == here


@pytest.mark.fast
def test_an_executor_checks_the_identity_it_is_given(tmp_path, monkeypatch):
    site = tmp_path / "site"
    _dist(site, "numpy", "2.0.0")
    ident = _identity(monkeypatch, [str(site)])
    assert host_python.is_this_interpreter(ident)
    assert not host_python.is_this_interpreter(ident.replace(":numpy", ":numpy,absentmod"))
    (site / "numpy-2.0.0.dist-info").rename(site / "numpy-2.0.1.dist-info")
    (site / "numpy-2.0.1.dist-info" / "METADATA").write_text("Name: numpy\nVersion: 2.0.1\n")
    assert not host_python.is_this_interpreter(ident)
    assert not host_python.is_this_interpreter("host-python@00:numpy;rm")


@pytest.mark.fast
def test_a_module_of_a_dist_named_otherwise_is_found_by_its_record(tmp_path, monkeypatch):
    site = tmp_path / "site"
    _dist(site, "PyYAML", "6.0", top="yaml")  # NB: no top_level.txt, another name
    first = _identity(monkeypatch, [str(site)], imports=("yaml",))
    assert {k: v.split()[0] for k, v in host_python.packages(["yaml"]).items()} == {"pyyaml": "6.0"}
    (site / "PyYAML-6.0.dist-info" / "METADATA").write_text("Name: PyYAML\nVersion: 6.1\n")
    (site / "PyYAML-6.0.dist-info").rename(site / "PyYAML-6.1.dist-info")
    assert _identity(monkeypatch, [str(site)], imports=("yaml",)) != first
