"""The stat loop of a state's check: `stale` stats every path of a mapping and returns the keys
not at the signature their value records. The loop is in C (rsi/_statloop.c, built by
`python -m rsi.native build`, which scripts/setup.sh runs) where that module is built for this
interpreter and its source; otherwise, and with `RSI_NATIVE=0`, it is the Python loop below,
which gives the same answer. The C loop releases the interpreter's lock once for the whole
batch and splits it over threads: at 100,000 paths, two cores stat them in ~0.05 s, against
~0.2 s for a Python loop (whose threads would hand the lock over at every call).

Either way the answer only ever says "these keys, at least, need a look": every key returned
is looked at again by the caller, one by one, as before. It must never call a key clean that it
could not judge: one that is not a str, a path with a NUL or a lone surrogate, a value of
another shape, a time it cannot hold are all returned. A module built from another revision of
the C source is never loaded."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from blake3 import blake3

_SOURCE = Path(__file__).with_name("_statloop.c")


def _source_digest() -> str | None:
    try:
        return blake3(_SOURCE.read_bytes()).hexdigest()[:16]
    except OSError:
        return None


# NB: why the Python loop runs (None: the C loop is in use); `rsi info` shows it
_why_not: str | None = None


def _load():
    global _why_not
    if os.environ.get("RSI_NATIVE", "") == "0":
        _why_not = "RSI_NATIVE=0"
        return None
    # NB: the C loop encodes a path as UTF-8; os.fsencode does too only with this encoding
    if sys.getfilesystemencoding() != "utf-8" or not sys.platform.startswith("linux"):
        _why_not = f"not Linux with UTF-8 paths ({sys.platform}, {sys.getfilesystemencoding()})"
        return None
    try:
        from rsi import _statloop  # type: ignore[attr-defined]
    except ImportError:
        _why_not = "not built for this interpreter (python -m rsi.native build)"
        return None
    # NB: a module built from another revision of the source is not used (the loop it runs
    # may not be the one this checkout's tests hold to); without the source, it is trusted
    want = _source_digest()
    if want is not None and getattr(_statloop, "SOURCE_DIGEST", None) != want:
        _why_not = "built from another revision of rsi/_statloop.c (python -m rsi.native build)"
        return None
    _why_not = None
    return _statloop


_native = _load()


def available() -> bool:
    """The C loop is in use."""
    return _native is not None


def describe() -> str:
    """Which loop the state's check runs, for people (`rsi info`)."""
    if _native is not None:
        return f"C ({os.path.basename(_native.__file__)}), {threads()} threads"
    return f"Python: {_why_not or 'the C loop is off'}"


def threads() -> int:
    """How many threads the C loop splits a batch over: the cores this process may use, at
    most 4 (the stats of one folder tree scale no further)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(4, n))


def stale(
    parts: Sequence[Mapping],
    *,
    prefix: str | None = None,
    follow: bool = False,
    sig_at: int = -1,
    mode_at: int = -1,
    linked: bool = False,
) -> tuple[list, list]:
    """(the keys of the dicts in `parts` that are not clean, the clean keys whose stat shows
    more than one link or a symbolic link, with `linked`). A key is clean when it is a str
    whose path (the key itself, or `prefix/key[:2]/key`) can be `lstat`ed (`stat`ed with
    `follow`), and its value holds that stat's (st_ino, st_size, st_mtime_ns, st_ctime_ns) as
    a tuple of four ints, or of six ending in its st_uid and st_mode (a prepared tree's
    entries, rsi/executors/staged.py): the value itself, or its item `sig_at`; with
    `mode_at`, the value is a list of exactly `mode_at + 1` items, the last being that stat's
    st_mode."""
    if _native is not None:
        return _native.stale(
            parts if isinstance(parts, list) else list(parts),
            prefix,
            follow,
            sig_at,
            mode_at,
            threads(),
            linked,
        )
    return _stale_py(parts, prefix, follow, sig_at, mode_at, linked)


def _stale_py(
    parts: Sequence[Mapping],
    prefix: str | None,
    follow: bool,
    sig_at: int,
    mode_at: int,
    linked: bool,
) -> tuple[list, list]:
    look = os.stat if follow else os.lstat
    out: list = []
    out_linked: list = []
    for part in parts:
        for key, value in part.items():
            try:
                if type(key) is not str or "\0" in key:
                    raise ValueError
                path = key if prefix is None else f"{prefix}/{key[:2]}/{key}"
                st = look(path)
            except (OSError, ValueError):
                out.append(key)
                continue
            if not _clean(value, st, sig_at, mode_at):
                out.append(key)
            elif linked and (st.st_nlink > 1 or stat.S_ISLNK(st.st_mode)):
                out_linked.append(key)
    return out, out_linked


def _clean(value: object, st: os.stat_result, sig_at: int, mode_at: int) -> bool:
    sig = value
    if sig_at >= 0 or mode_at >= 0:
        if type(value) is not list:
            return False
        if mode_at >= 0 and (
            len(value) != mode_at + 1
            or type(value[mode_at]) is not int
            or value[mode_at] != st.st_mode
        ):
            return False
        if sig_at >= 0:
            if sig_at >= len(value):
                return False
            sig = value[sig_at]
    if type(sig) is not tuple or not all(type(x) is int for x in sig):
        return False
    if len(sig) == 6:
        return sig == (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_uid, st.st_mode)
    return len(sig) == 4 and sig == (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def build(quiet: bool = False) -> Path | None:
    """Compile rsi/_statloop.c for this interpreter beside this file (a temporary name, then
    a rename: a process starting meanwhile loads the old module or the new one, never half of
    one). The path built, or None where it could not be (no compiler or headers: rsi then runs
    the Python loop)."""
    # NB: imported here: every rsi start imports this module (~5 ms of imports otherwise)
    import subprocess
    import sysconfig
    import tempfile

    digest = _source_digest()
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    include = sysconfig.get_paths()["include"]
    target = _SOURCE.with_name(f"_statloop{suffix}")
    if digest is None or not Path(include, "Python.h").exists():
        if not quiet:
            print(
                "rsi.native: no C source or no Python.h: the Python loop is used", file=sys.stderr
            )
        return None
    cc = os.environ.get("CC", "cc")
    fd, tmp = tempfile.mkstemp(prefix=".statloop-", suffix=suffix, dir=_SOURCE.parent)
    os.close(fd)
    cmd = [
        cc, "-O2", "-shared", "-fPIC", "-pthread", "-Wall", "-Werror",
        f"-I{include}", f'-DSOURCE_DIGEST="{digest}"', str(_SOURCE), "-o", tmp,
    ]  # fmt: skip
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        done = None
        err = str(e)
    else:
        err = done.stderr
    if done is None or done.returncode != 0:
        Path(tmp).unlink(missing_ok=True)
        if not quiet:
            print(f"rsi.native: {cc} failed; the Python loop is used:\n{err}", file=sys.stderr)
        return None
    os.replace(tmp, target)
    return target


if __name__ == "__main__":
    if sys.argv[1:] != ["build"]:
        raise SystemExit("usage: python -m rsi.native build")
    # NB: a module already built from this source is kept (setup runs this every time)
    built = Path(_native.__file__) if _native is not None else build()
    print(built if built is not None else "not built (the Python loop is used)")
