"""rsi.toml is parsed once per version of the file: later builds read the parse kept beside
rsi's bytecode, by the file's signature. A changed file is always parsed again, even when the
change keeps its size and puts its mtime back."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from rsi import workspace as workspace_mod
from rsi.errors import DeclarationError
from rsi.workspace import Workspace


@pytest.fixture
def ws(tmp_path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "rsi.toml").write_text('[workspace]\nsalt = "aaaa"\n')
    return root


def _memo(root: Path) -> Path:
    return Path(workspace_mod._config_memo_path(str(root / "rsi.toml")))


@pytest.fixture(autouse=True)
def _no_memo_left(ws):
    yield
    _memo(ws).unlink(missing_ok=True)


@pytest.mark.fast
def test_a_settled_config_is_parsed_once_then_read_from_the_memo(ws, monkeypatch):
    import tomllib

    # NB: as if the file had been written long before (its ctime cannot be set back)
    monkeypatch.setattr(workspace_mod, "_RACY_NS", -(10**18))
    assert Workspace.load(ws).salt == "aaaa"
    assert _memo(ws).exists()

    def refuse(text):
        raise AssertionError("parsed again")

    monkeypatch.setattr(tomllib, "loads", refuse)
    assert Workspace.load(ws).salt == "aaaa"


@pytest.mark.fast
def test_a_rewrite_with_the_same_size_and_mtime_put_back_is_parsed_again(ws, monkeypatch):
    """The memo is keyed by ctime too, which no one can put back."""
    path = ws / "rsi.toml"
    st = os.stat(path)
    # NB: a memo written as if the file had been parsed long ago at this very signature
    monkeypatch.setattr(workspace_mod, "_RACY_NS", -(10**18))
    assert Workspace.load(ws).salt == "aaaa"
    assert _memo(ws).exists()
    time.sleep(0.02)
    path.write_text('[workspace]\nsalt = "bbbb"\n')
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns
    assert Workspace.load(ws).salt == "bbbb"


@pytest.mark.fast
def test_a_racily_new_config_is_not_kept(ws):
    (ws / "rsi.toml").write_text('[workspace]\nsalt = "cccc"\n')
    assert Workspace.load(ws).salt == "cccc"
    assert not _memo(ws).exists()


@pytest.mark.fast
def test_a_broken_config_is_never_kept_and_names_the_file(ws, monkeypatch):
    monkeypatch.setattr(workspace_mod, "_RACY_NS", -(10**18))
    (ws / "rsi.toml").write_text("[workspace\n")
    with pytest.raises(DeclarationError) as err:
        Workspace.load(ws)
    assert "rsi.toml" in str(err.value) and "not valid TOML" in str(err.value)
    assert not _memo(ws).exists()


@pytest.mark.fast
def test_a_garbled_memo_is_ignored(ws, monkeypatch):
    monkeypatch.setattr(workspace_mod, "_RACY_NS", -(10**18))
    Workspace.load(ws)
    _memo(ws).write_text("{not json")
    assert Workspace.load(ws).salt == "aaaa"
    _memo(ws).write_text('{"schema": "rsi.config-memo/1", "path": "elsewhere", "data": {}}')
    assert Workspace.load(ws).salt == "aaaa"
