"""The workspace: its root (the folder holding `rsi.toml`), its settings, and where its store is.

Settings come from `rsi.toml` and may be overridden on the command line; unknown settings are
errors naming the file and key, never ignored.
"""

from __future__ import annotations

import os
import re

from pathlib import Path
from typing import Iterable

from rsi.digest import DIGEST_FUNCTIONS
from rsi.errors import DeclarationError, UsageError
from rsi.fsutil import read_regular
from rsi.record import Frozen

CONFIG_FILE = "rsi.toml"
BUILD_FILE = "BUILD.toml"
EXECUTORS = ("local", "bwrap", "docker", "remote", "slurm")
_RULE_REF = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(:[A-Za-z_]\w*)?$")

_SETTINGS = {
    "salt": str,
    "store": str,
    "jobs": int,
    "digest_function": str,
    "keep_going": bool,
    "remote": str,
    "remote_mode": str,
    "remote_fallback": bool,
    "executor": str,
    "rules": list,
}


_LIMITS = ("scratch_mb", "memory_mb")


def _limits(section: object, file: str) -> dict:
    """The [limits] table: whole MiB, at least 1 (see rsi.limits)."""
    if not isinstance(section, dict):
        raise DeclarationError("[limits] must be a table", file=file, field="limits")
    for key, value in section.items():
        if key not in _LIMITS:
            raise DeclarationError(
                "unknown setting in [limits]",
                file=file,
                field=key,
                hint=f"known settings: {', '.join(_LIMITS)}",
            )
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise DeclarationError(
                f"expected a whole number of MiB, at least 1, got {value!r}", file=file, field=key
            )
    return dict(section)


REMOTE_HINT = (
    'write e.g. remote = "grpc://127.0.0.1:50051" (grpcs:// for TLS, an optional /INSTANCE '
    "path for the REAPI instance name)"
)


def remote_address_problem(url: str) -> str | None:
    """What is wrong with a remote address, or None for `grpc[s]://HOST:PORT[/INSTANCE]` (the
    form rsi.remote's endpoint takes; checked here so that a bad setting is refused with the
    other settings, before anything is written, without loading the gRPC client)."""
    from urllib.parse import urlparse

    try:
        parsed = urlparse(url)
        port = parsed.port
    except ValueError:
        port = None
        parsed = None
    if parsed is None or parsed.scheme not in ("grpc", "grpcs") or not parsed.hostname or not port:
        return f"remote address {url!r:.80} is not grpc://HOST:PORT"
    return None


def _refuse_hostile(data: dict, file: str) -> None:
    """A NUL character or a non-finite number anywhere in rsi.toml (a key or a value, in any
    section) is refused naming the setting: neither can reach a path, an argv or a key."""
    import math

    stack: list[tuple[str, object]] = [("", data)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, dict):
            for k, v in value.items():
                name = f"{where}.{k}" if where else str(k)
                if "\x00" in str(k):
                    raise DeclarationError(
                        "a setting's name holds a NUL character",
                        file=file,
                        field=repr(name)[1:-1],
                    )
                stack.append((name, v))
        elif isinstance(value, list):
            stack.extend((where, v) for v in value)
        elif isinstance(value, str) and "\x00" in value:
            raise DeclarationError(
                f"{value!r:.60} contains a NUL character", file=file, field=where.split(".")[-1]
            )
        elif isinstance(value, float) and not math.isfinite(value):
            raise DeclarationError(
                f"expected a finite number, got {value!r}", file=file, field=where.split(".")[-1]
            )


class Workspace(Frozen):
    _fields = (
        "root",
        "salt",
        "store",
        "jobs",
        "digest_function",
        "keep_going",
        "remote",
        "remote_mode",
        "remote_fallback",
        "executor",
        "rules",
        "scratch_mb",
        "memory_mb",
        "slurm",
        "digest_function_explicit",
        "store_from",
    )
    _compare = _fields[:-2]
    root: Path
    salt: str
    store: Path
    jobs: int
    digest_function: str
    keep_going: bool
    remote: str
    remote_mode: str  # "cache" or "execute"
    remote_fallback: bool
    executor: str
    rules: tuple[str, ...]
    # NB: [limits]: every action's scratch and memory in MiB (None: rsi.limits' defaults)
    scratch_mb: int | None
    memory_mb: int | None
    # NB: [slurm]: the cluster the slurm executor submits to (rsi/executors/slurm.py)
    slurm: tuple[tuple[str, object], ...]
    digest_function_explicit: bool
    # NB: where `store` came from ("rsi.toml", "--store" or "" for the default), for errors
    store_from: str

    def __init__(
        self,
        root: Path,
        salt: str = "",
        store: Path = Path("cache"),
        jobs: int | None = None,
        digest_function: str = "blake3",
        keep_going: bool = False,
        remote: str = "",
        remote_mode: str = "cache",
        remote_fallback: bool = False,
        executor: str = "local",
        rules: tuple[str, ...] = (),
        scratch_mb: int | None = None,
        memory_mb: int | None = None,
        slurm: tuple[tuple[str, object], ...] = (),
        digest_function_explicit: bool = False,
        store_from: str = "",
    ) -> None:
        d = self.__dict__
        d["root"] = root
        d["salt"] = salt
        d["store"] = store
        d["jobs"] = (os.cpu_count() or 1) if jobs is None else jobs
        d["digest_function"] = digest_function
        d["keep_going"] = keep_going
        d["remote"] = remote
        d["remote_mode"] = remote_mode
        d["remote_fallback"] = remote_fallback
        d["executor"] = executor
        d["rules"] = rules
        d["scratch_mb"] = scratch_mb
        d["memory_mb"] = memory_mb
        d["slurm"] = slurm
        d["digest_function_explicit"] = digest_function_explicit
        d["store_from"] = store_from

    @property
    def store_dir(self) -> Path:
        return self.store if self.store.is_absolute() else self.root / self.store

    @property
    def out_dir(self) -> Path:
        return self.root / "out"

    def with_overrides(self, **kw: object) -> "Workspace":
        clean = {k: v for k, v in kw.items() if v is not None}
        if "digest_function" in clean:
            clean["digest_function_explicit"] = True
        if "store" in clean:
            if "\x00" in str(clean["store"]):
                raise UsageError("--store: a path cannot hold a NUL character")
            clean["store"] = Path(str(clean["store"])).absolute()
            clean["store_from"] = "--store"
        if clean.get("remote"):
            problem = remote_address_problem(str(clean["remote"]))
            if problem:
                raise UsageError(f"--remote: {problem}", hint=REMOTE_HINT)
        ws = self.replace(**clean)
        ws._check()
        if ws.executor == "remote" and not ws.remote:
            # NB: checked once the command line is applied: it may give the remote
            raise DeclarationError(
                "the remote executor needs a remote",
                file=CONFIG_FILE,
                field="executor",
                hint='set remote = "grpc://HOST:PORT" (or --remote), or use another executor',
            )
        return ws

    def _check(self, file: str = CONFIG_FILE) -> None:
        if self.digest_function not in DIGEST_FUNCTIONS:
            raise DeclarationError(
                f"unknown digest function {self.digest_function!r}",
                file=file,
                field="digest_function",
                hint=f"use one of {', '.join(DIGEST_FUNCTIONS)}",
            )
        if self.jobs < 1:
            raise DeclarationError("jobs must be at least 1", file=file, field="jobs")
        if self.remote_mode not in ("cache", "execute"):
            raise DeclarationError(
                "remote_mode must be 'cache' or 'execute'", file=file, field="remote_mode"
            )
        if self.executor not in EXECUTORS:
            raise DeclarationError(
                f"unknown executor {self.executor!r}",
                file=file,
                field="executor",
                hint=f"use one of {', '.join(EXECUTORS)}",
            )
        for ref in self.rules:
            if not isinstance(ref, str) or not _RULE_REF.match(ref):
                raise DeclarationError(
                    f"{ref!r} is not a rule module",
                    file=file,
                    field="rules",
                    hint='list "package.module" or "package.module:function" strings',
                )

    def check_store(self) -> None:
        """Refuse a store folder rsi must not write into: the workspace root or a folder above
        it, `out/`, or a folder that holds files and is not an rsi store (rsi deletes files in
        its store). Exit 2, naming where the setting came from."""
        from rsi.store_folder import store_folder_problem

        store = self.store_dir.resolve()
        root = self.root.resolve()
        problem = None
        if store == root or store in root.parents:
            where = "the workspace root" if store == root else "a folder above the workspace"
            problem = f"it is {where} ({root}); rsi deletes files in its store"
        elif store == self.out_dir.resolve() or self.out_dir.resolve() in store.parents:
            problem = "it is under out/, which rsi replaces"
        else:
            problem = store_folder_problem(store)
        if problem is None:
            return
        self._store_error(
            f"the store {store} cannot be used: {problem}",
            "use a new or empty folder, or an existing rsi store; nothing was written",
        )

    def _store_error(self, message: str, hint: str) -> None:
        if self.store_from == "--store":
            raise UsageError(f"--store: {message}", hint=hint)
        raise DeclarationError(
            message + ("" if self.store_from else " (the default store folder)"),
            file=str(self.root / CONFIG_FILE),
            field="store",
            hint=hint + ("" if self.store_from else "; set `store` under [workspace]"),
        )

    def check_writable(self) -> None:
        """Refuse a build whose store or `out/` (or the folder either would be made in) rsi
        cannot write (a read-only mount, an immutable folder, a mode closed to this user),
        before it writes anything: exit 2 naming `store` or out/, nothing written. Commands
        that only read the store (`why`, `cache stats`, `cache verify` of a sound store) do
        not ask it."""
        from rsi.store_folder import folder_write_problem

        store = self.store_dir
        problem = folder_write_problem(store)
        if problem is not None:
            self._store_error(
                f"the store {store} cannot be written: {problem}",
                "make it writable (a read-write mount, `chattr -i`, its mode), or use another "
                "folder; nothing was written",
            )
        problem = folder_write_problem(self.out_dir, f"{self.out_dir}", ())
        if problem is not None:
            raise DeclarationError(
                f"the build's outputs cannot be written under out/: {problem}",
                file=str(self.out_dir),
                hint="make out/ writable (a read-write mount, `chattr -i`, its mode); "
                "nothing was written",
            )

    @classmethod
    def load(cls, root: Path) -> "Workspace":
        path = root / CONFIG_FILE
        data = _config_data(path)
        _refuse_hostile(data, str(path))
        section = data.get("workspace", {})
        extra = set(data) - {"workspace", "limits", "slurm"}
        if extra or not isinstance(section, dict):
            raise DeclarationError(
                f"unknown section(s) {', '.join(sorted(extra)) or 'workspace'}",
                file=str(path),
                hint="settings go under [workspace] (and [limits], [slurm])",
            )
        kw: dict = _limits(data.get("limits", {}), str(path))
        if "slurm" in data:
            from rsi.executors.slurm import check_settings

            kw["slurm"] = tuple(
                (k, tuple(v) if isinstance(v, list) else v)
                for k, v in sorted(check_settings(data["slurm"], str(path)).items())
            )
        for key, value in section.items():
            want = _SETTINGS.get(key)
            if want is None:
                raise DeclarationError(
                    "unknown setting",
                    file=str(path),
                    field=key,
                    hint=f"known settings: {', '.join(sorted(_SETTINGS))}",
                )
            if not isinstance(value, want) or (want is int and isinstance(value, bool)):
                raise DeclarationError(
                    f"expected {want.__name__}, got {value!r}", file=str(path), field=key
                )
            kw[key] = value
        if kw.get("remote"):
            problem = remote_address_problem(kw["remote"])
            if problem:
                raise DeclarationError(problem, file=str(path), field="remote", hint=REMOTE_HINT)
        if "store" in kw:
            kw["store"] = Path(kw["store"])
        if "rules" in kw:
            kw["rules"] = tuple(kw["rules"])
        ws = cls(
            root=root,
            digest_function_explicit="digest_function" in kw,
            store_from=CONFIG_FILE if "store" in kw else "",
            **kw,
        )
        ws._check(str(path))
        return ws

    @classmethod
    def discover(cls, start: Path | None = None) -> "Workspace":
        here = (start or Path.cwd()).resolve()
        for candidate in (here, *here.parents):
            if (candidate / CONFIG_FILE).is_file():
                return cls.load(candidate)
        raise UsageError(
            f"{here} is not inside an rsi workspace (no {CONFIG_FILE} here or above)",
            hint=f"create an empty {CONFIG_FILE} at the root of your project, or pass --workspace",
        )


# NB: folders never searched for packages (outputs, caches, vendored trees)
SKIP_DIRS = {"cache", "out", "node_modules", "__pycache__", "build", "dist"}


def packages_under(root: Path, package: str) -> Iterable[str]:
    """Every package at or below `package` (folders holding a BUILD.toml), in walk order."""
    base = root / package if package else root
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in SKIP_DIRS)
        if BUILD_FILE in filenames:
            rel = os.path.relpath(dirpath, root)
            yield "" if rel == "." else rel.replace(os.sep, "/")


# NB: rsi.toml parsed, kept beside rsi's bytecode under the file's signature: every build reads
# it, and parsing it means importing tomllib (with datetime and typing), ~4 ms of each start
_CONFIG_MEMO = "rsi.config-memo/1"
# NB: a file changed less than this long before it was read may change again within its file
# system's timestamp granularity without its signature moving: such a reading is not kept
_RACY_NS = 2_000_000_000


def _config_memo_path(path: str) -> str:
    import zlib

    here = os.path.dirname(os.path.abspath(__file__))
    name = f"config-{os.geteuid()}-{zlib.crc32(path.encode('utf-8', 'surrogateescape')):08x}.json"
    return os.path.join(here, "__pycache__", name)


def _config_data(path: Path) -> dict:
    """`path` (an rsi.toml) parsed: from the memo when the file's signature (device, inode,
    size, mtime, ctime) is the one it was parsed at, else by tomllib (and kept when the file
    is not racily new and its values are plain JSON ones)."""
    import json

    try:
        st = os.stat(path)
    except OSError as exc:
        raise DeclarationError(f"cannot read it: {exc.strerror or exc}", file=str(path)) from None
    sig = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    memo = _config_memo_path(str(path))
    try:
        with open(memo, encoding="utf-8") as f:
            doc = json.load(f)
        if (
            isinstance(doc, dict)
            and doc.get("schema") == _CONFIG_MEMO
            and doc.get("path") == str(path)
            and doc.get("sig") == sig
            and isinstance(doc.get("data"), dict)
        ):
            return doc["data"]
    except (OSError, ValueError):
        pass
    import time
    import tomllib

    now = time.time_ns()
    try:
        raw = read_regular(path)
        text = raw.decode("utf-8")
        data = tomllib.loads(text)
    except OSError as exc:
        raise DeclarationError(f"cannot read it: {exc.strerror or exc}", file=str(path)) from None
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DeclarationError(
            f"not UTF-8 text (byte {raw[exc.start]:#04x} on line {line})",
            file=str(path),
            hint="TOML files are UTF-8; write the value with \\u escapes or re-save as UTF-8",
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise DeclarationError(f"not valid TOML: {exc}", file=str(path)) from None
    except RecursionError:  # NB: tomllib recurses per nested array/inline table
        raise DeclarationError(
            "not valid TOML: values are nested too deeply", file=str(path)
        ) from None
    if now - max(st.st_mtime_ns, st.st_ctime_ns) < _RACY_NS:
        return data
    try:
        text = json.dumps({"schema": _CONFIG_MEMO, "path": str(path), "sig": sig, "data": data})
        if json.loads(text)["data"] != data:
            return data  # NB: a value JSON would change (a date, a tuple): parsed each time
    except (TypeError, ValueError, RecursionError):
        return data  # NB: a value JSON cannot hold: no memo
    tmp = f"{memo}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, memo)
    except OSError:  # NB: a read-only install: no memo
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return data
