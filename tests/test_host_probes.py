"""Host probes kept between builds (rsi/executors/probes.py): an answer is reused only under
the same binary and host signature, a failure is never kept, and a slot that fails to start
drops them all. The probe here is a real executable on PATH that counts its own runs."""

from __future__ import annotations

import json
import os
import stat

import pytest

from rsi.executors import local, pool, probes


@pytest.fixture
def kept(tmp_path, monkeypatch):
    path = tmp_path / "host-probes.json"
    monkeypatch.setattr(probes, "_path", lambda: str(path))
    monkeypatch.setattr(probes, "_loaded", None)
    yield path
    # NB: what a fake bwrap answered must not stay cached for the tests after this one
    for fn in (local.sandbox_mode, pool.bwrap_has_perms, pool.bwrap_has_size):
        fn.cache_clear()


def _fake_bwrap(folder, *, works: bool, runs):
    """A `bwrap` that records each run in `runs` and answers as a given version would."""
    folder.mkdir(exist_ok=True)
    exe = folder / "bwrap"
    exe.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {runs}\n'
        'case "$1" in\n'
        '  --version) echo "bubblewrap 0.8.0" ;;\n'
        '  --help) echo "usage: bwrap ... --size BYTES ..." ;;\n'
        f"  *) exit {0 if works else 1} ;;\n"
        "esac\n"
    )
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def _on_path(monkeypatch, exe):
    """`exe` first on PATH, and no RSI_SANDBOX to decide for the probe."""
    monkeypatch.setenv("PATH", f"{exe.parent}:{os.environ['PATH']}")
    monkeypatch.delenv("RSI_SANDBOX", raising=False)
    return exe


def _probe_all():
    for fn in (local.sandbox_mode, pool.bwrap_has_perms, pool.bwrap_has_size):
        fn.cache_clear()
    return local.sandbox_mode(), pool.bwrap_has_perms(), pool.bwrap_has_size()


@pytest.mark.fast
def test_answers_are_kept_until_the_binary_changes(kept, tmp_path, monkeypatch):
    runs = tmp_path / "runs.txt"
    exe = _on_path(monkeypatch, _fake_bwrap(tmp_path / "bin", works=True, runs=runs))
    assert _probe_all() == ("bwrap", True, True)
    assert len(runs.read_text().splitlines()) == 3  # works?, --version, --help
    assert json.loads(kept.read_text())["schema"] == "rsi.host-probes/1"
    monkeypatch.setattr(probes, "_loaded", None)  # NB: as a new rsi process reads it
    assert _probe_all() == ("bwrap", True, True)
    assert len(runs.read_text().splitlines()) == 3  # nothing asked again
    # the binary replaced (new inode, size and times): every answer is asked again
    exe.unlink()
    exe = _fake_bwrap(tmp_path / "bin", works=True, runs=runs)
    with open(exe, "a") as f:
        f.write("# another build of it\n")
    monkeypatch.setattr(probes, "_loaded", None)
    assert _probe_all() == ("bwrap", True, True)
    assert len(runs.read_text().splitlines()) == 6


@pytest.mark.fast
def test_a_failing_sandbox_is_never_kept(kept, tmp_path, monkeypatch):
    runs = tmp_path / "runs.txt"
    _on_path(monkeypatch, _fake_bwrap(tmp_path / "bin", works=False, runs=runs))
    for _ in range(2):
        local.sandbox_mode.cache_clear()
        monkeypatch.setattr(probes, "_loaded", None)
        assert local.sandbox_mode() != "bwrap"
    assert [line for line in runs.read_text().splitlines() if "--unshare-all" in line] == [
        "--unshare-all --die-with-parent --ro-bind / / true"
    ] * 2
    assert "bwrap-works" not in json.loads(kept.read_text() if kept.exists() else "{}")


@pytest.mark.fast
def test_another_host_signature_asks_again_and_forget_drops_all(kept, monkeypatch):
    asked = []

    def ask():
        asked.append(1)
        return True

    assert probes.cached("x", ["bin", ["host", 1]], ask, keep=bool) is True
    assert probes.cached("x", ["bin", ["host", 1]], ask, keep=bool) is True
    assert len(asked) == 1
    assert probes.cached("x", ["bin", ["host", 2]], ask, keep=bool) is True  # e.g. a reboot
    assert len(asked) == 2
    probes.forget()
    assert not kept.exists()
    monkeypatch.setattr(probes, "_loaded", None)
    probes.cached("x", ["bin", ["host", 2]], ask, keep=bool)
    assert len(asked) == 3
    # a key of None (no binary) is never kept, and a damaged file is as none
    probes.cached("y", None, ask, keep=bool)
    kept.write_text("{not json")
    monkeypatch.setattr(probes, "_loaded", None)
    probes.cached("x", ["bin", ["host", 2]], ask, keep=bool)
    assert len(asked) == 5


@pytest.mark.fast
def test_host_key_names_this_kernel_boot_and_namespaces():
    key = probes.host_key()
    assert key[0] == os.uname().release and key[2] == os.geteuid()
    assert any(isinstance(k, str) and k.startswith("user:[") for k in key)


@pytest.mark.fast
def test_an_unwritable_folder_means_asking_each_time(tmp_path, monkeypatch):
    monkeypatch.setattr(probes, "_path", lambda: str(tmp_path / "missing" / "probes.json"))
    monkeypatch.setattr(probes, "_loaded", None)
    asked = []
    for _ in range(2):
        monkeypatch.setattr(probes, "_loaded", None)
        probes.cached("x", ["k"], lambda: asked.append(1) or True, keep=bool)
    assert len(asked) == 2
