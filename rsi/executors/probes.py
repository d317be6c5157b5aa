"""Host probes kept between builds: whether bubblewrap works here, and which options it has. A probe
must never decide a key.

Each answer costs a process start (5-10 ms on a small VM) on the critical path of every build
that runs something, and none of them changes unless what it was asked of does. So the answer is
kept beside rsi's bytecode (`rsi/__pycache__/host-probes-<euid>.json`), under a key naming all
of that: the binary (real path, inode, size, mtime, ctime) and, for "does a sandbox start", the
kernel (release, boot id), the user and mount namespaces this process is in, and the sysctls that
allow user namespaces. A key that differs means asking again. Only a positive answer to "does
bwrap work" is kept (a failure is asked again each time, and costs only the hosts that have it);
a slot that then fails to start drops the file (`forget`). No file, an unreadable one or a
folder rsi cannot write to means asking every time, as before.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from typing import Any

# NB: what can make a working bwrap stop working without the binary changing
_NAMESPACE_SYSCTLS = (
    "/proc/sys/kernel/unprivileged_userns_clone",
    "/proc/sys/user/max_user_namespaces",
    "/proc/sys/user/max_net_namespaces",
    "/proc/sys/user/max_pid_namespaces",
    "/proc/sys/user/max_mnt_namespaces",
    "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
)
_SCHEMA = "rsi.host-probes/1"


def _path() -> str:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.join(here, "__pycache__", f"host-probes-{os.geteuid()}.json")


def binary_key(name: str) -> list[Any] | None:
    """Where `name` is on PATH and the signature of the file there; None when absent."""
    found = shutil.which(name)
    if not found:
        return None
    try:
        real = os.path.realpath(found)
        st = os.stat(real)
    except OSError:
        return None
    return [found, real, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return None


def host_key() -> list[Any]:
    """The kernel, this boot, this user and the namespaces it is in, and the namespace
    limits: a sandbox that started under all of these starts again."""
    parts: list[Any] = [os.uname().release, _read("/proc/sys/kernel/random/boot_id"), os.geteuid()]
    for ns in ("user", "mnt", "pid", "net"):
        try:
            parts.append(os.readlink(f"/proc/self/ns/{ns}"))
        except OSError:
            parts.append(None)
    parts.extend(_read(p) for p in _NAMESPACE_SYSCTLS)
    return parts


_loaded: dict[str, Any] | None = None


def _load() -> dict[str, Any]:
    global _loaded
    if _loaded is None:
        try:
            with open(_path(), encoding="utf-8") as f:
                doc = json.load(f)
            ok = isinstance(doc, dict) and doc.get("schema") == _SCHEMA
            _loaded = doc.get("answers", {}) if ok and isinstance(doc.get("answers"), dict) else {}
        except (OSError, ValueError):
            _loaded = {}
    return _loaded


def _store(name: str, key: Any, value: Any) -> None:
    global _loaded
    answers = dict(_load())
    answers[name] = {"key": key, "value": value}
    _loaded = answers
    path = _path()
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"schema": _SCHEMA, "answers": answers}, f)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def cached(name: str, key: Any, ask: Callable[[], Any], keep: Callable[[Any], bool]) -> Any:
    """The answer kept for `name` under `key`, else `ask()` (kept when `keep(answer)`)."""
    if key is None:
        return ask()
    key = json.loads(json.dumps(key))  # NB: as it reads back (tuples become lists)
    got = _load().get(name)
    if isinstance(got, dict) and got.get("key") == key:
        return got.get("value")
    value = ask()
    if keep(value):
        _store(name, key, value)
    return value


def forget() -> None:
    """Drop every kept answer (a sandbox they vouched for failed to start)."""
    global _loaded
    _loaded = {}
    try:
        os.unlink(_path())
    except OSError:
        pass
