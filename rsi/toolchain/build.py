"""Building a toolchain: Debian packages (mmdebstrap) plus pinned wheels into a root filesystem,
normalised and packed as a byte-identical tar, cached in the store by recipe digest.

Sources are the host's configured Debian mirror (read from its apt sources at build time) and a
local wheel cache checked against the recipe's sha256 pins. Nothing from the host's Python
environment or pip configuration reaches the tree.
"""

from __future__ import annotations

import fcntl
import hashlib
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rsi.digest import Digest
from rsi.errors import ExecutionError, RsiError
from rsi.fsutil import atomic_write_bytes
from rsi.toolchain.image import image_config, image_id
from rsi.toolchain.lock import (
    LockDiff,
    diff_locks,
    format_lock,
    read_lock_file,
    read_tree_lock,
)
from rsi.toolchain.recipe import Recipe, load_recipe
from rsi.toolchain.tarball import extract_rootfs, write_rootfs_tar

INFO_SCHEMA = "rsi.toolchain.info/1"
IN_IMAGE_LOCK = "etc/rsi/lock.txt"
IN_IMAGE_RECIPE = "etc/rsi/toolchain.json"
EXEC_MOUNT = "rsi/exec"


RECIPE_MARK = "recipe:"  # NB: `<name>@recipe:<recipe hex>`, the platform value rules give


class ToolchainError(RsiError):
    """A toolchain could not be built or found; `field` names the recipe field at fault."""

    def __init__(self, message: str, *, hint: str | None = None, field: str | None = None):
        super().__init__(message, hint=hint)
        self.field = field


def recipe_value(name: str, recipe_digest: str) -> str:
    """The `toolchain` platform value naming a recipe: `<name>@recipe:<recipe hex>`. Rules
    give this one (analysis knows the recipe, never the tree it builds to); executors map it
    to the tree built from that recipe in their store."""
    return f"{name}@{RECIPE_MARK}{recipe_digest}"


@dataclass(frozen=True)
class ToolchainInfo:
    """A built toolchain. `rootfs` (BLAKE3 of the tar) is its identity; the rest derives."""

    name: str
    recipe_digest: str
    rootfs: Digest
    rootfs_sha256: str
    image_id: str
    lock: Mapping[str, str]
    path: Path
    source_date_epoch: int
    env: Mapping[str, str]
    # descriptive only
    build_s: float | None = field(default=None, compare=False)
    cached: bool = field(default=False, compare=False)
    changes: LockDiff | None = field(default=None, compare=False)

    @property
    def platform_value(self) -> str:
        """The `toolchain` platform property of actions that run in it: `<name>@<rootfs hex>`."""
        return f"{self.name}@{self.rootfs.hash}"

    @property
    def recipe_value(self) -> str:
        """The platform value naming its recipe, `<name>@recipe:<recipe hex>` (what rules give)."""
        return recipe_value(self.name, self.recipe_digest)

    @property
    def rootfs_tar(self) -> Path:
        return self.path / "rootfs.tar"

    @property
    def image_config(self) -> bytes:
        return image_config(
            self.name, self.rootfs_sha256, self.rootfs.hash, self.source_date_epoch, dict(self.env)
        )

    def to_json(self) -> dict:
        return {
            "schema": INFO_SCHEMA,
            "name": self.name,
            "recipe_digest": self.recipe_digest,
            "rootfs": str(self.rootfs),
            "rootfs_sha256": self.rootfs_sha256,
            "image_id": self.image_id,
            "platform": self.platform_value,
            "source_date_epoch": self.source_date_epoch,
            "env": dict(self.env),
            "lock": dict(self.lock),
            "build_s": self.build_s,
        }

    @classmethod
    def from_json(cls, doc: dict, path: Path) -> ToolchainInfo:
        if doc.get("schema") != INFO_SCHEMA:
            raise ToolchainError(f"{path}: unknown toolchain info schema {doc.get('schema')!r}")
        return cls(
            name=doc["name"],
            recipe_digest=doc["recipe_digest"],
            rootfs=Digest.parse(doc["rootfs"]),
            rootfs_sha256=doc["rootfs_sha256"],
            image_id=doc["image_id"],
            lock=doc["lock"],
            path=path,
            source_date_epoch=doc["source_date_epoch"],
            env=doc["env"],
            build_s=doc.get("build_s"),
        )


# ----------------------------------------------------------------------------------- layout


def toolchains_root(store_dir: str | os.PathLike) -> Path:
    return Path(store_dir).resolve() / "toolchains"


def default_cache_dir() -> Path:
    """Downloaded .debs and wheels, shared by builds (and by CI runs) outside any repo."""
    env = os.environ.get("RSI_TOOLCHAIN_CACHE")
    if env:
        return Path(env)
    system = Path("/var/cache/rsi-toolchains")
    if os.access(system if system.exists() else system.parent, os.W_OK):
        return system
    return Path.home() / ".cache" / "rsi-toolchains"


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write_json(path: Path, doc: dict) -> None:
    atomic_write_bytes(path, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())


def _load_info(directory: Path) -> ToolchainInfo | None:
    try:
        doc = json.loads((directory / "info.json").read_text())
    except (OSError, ValueError):
        return None
    info = ToolchainInfo.from_json(doc, directory)
    try:
        if os.path.getsize(info.rootfs_tar) != info.rootfs.size:
            return None
    except OSError:
        return None
    return info


# ---------------------------------------------------------------------------------- lookup


def find_toolchain(store_dir: str | os.PathLike, platform_value: str) -> ToolchainInfo:
    """The built toolchain named by a `toolchain` platform value: `<name>@recipe:<recipe hex>`
    (the tree this store built from that recipe) or `<name>@<rootfs hex>` (that exact tree)."""
    name, _, rootfs_hash = platform_value.partition("@")
    if rootfs_hash.startswith(RECIPE_MARK):
        recipe_digest = rootfs_hash[len(RECIPE_MARK) :]
        info = None
        if re.fullmatch(r"[0-9a-f]{16,128}", recipe_digest):
            info = _load_info(toolchains_root(store_dir) / recipe_digest)
        if info is None or info.name != name:
            raise ExecutionError(
                f"toolchain {platform_value} is not built in the store at {store_dir}",
                hint=f"build //toolchains:{name} first (`rsi build //toolchains:{name}`; a "
                "build of a target that runs in it builds it first)",
            )
        return info
    index = toolchains_root(store_dir) / "by-rootfs" / f"{rootfs_hash}.json"
    try:
        recipe_digest = json.loads(index.read_text())["recipe_digest"]
    except (OSError, ValueError, KeyError):
        raise ExecutionError(
            f"toolchain {platform_value} is not built in the store at {store_dir}",
            hint=f"build it first: python -m rsi.toolchain build toolchains/BUILD.toml:{name} "
            f"--store {store_dir}",
        ) from None
    info = _load_info(toolchains_root(store_dir) / recipe_digest)
    if info is None or info.rootfs.hash != rootfs_hash:
        raise ExecutionError(
            f"toolchain {platform_value}: store entry is incomplete", hint="rebuild it with --force"
        )
    return info


@functools.lru_cache(maxsize=64)
def _find_cached(store_root: str, platform_value: str) -> ToolchainInfo:
    return find_toolchain(store_root, platform_value)


def lookup_toolchain(store_dir: str | os.PathLike, platform_value: str) -> ToolchainInfo:
    """`find_toolchain`, remembered per process for a rootfs digest (the answer for one store
    never changes; executors ask once per action). A recipe value is looked up each time: its
    tree may be built, or rebuilt, while this process runs."""
    if "@" + RECIPE_MARK in platform_value:
        return find_toolchain(store_dir, platform_value)
    return _find_cached(str(Path(store_dir).resolve()), platform_value)


def verify(info: ToolchainInfo) -> bool:
    """Re-hash the rootfs tar; False if it no longer matches its recorded digest."""
    from rsi.digest import digest_file

    return digest_file(info.rootfs_tar) == info.rootfs


def rootfs_dir(info: ToolchainInfo) -> Path:
    """The rootfs tar extracted once into the store (by rootfs digest); never written after."""
    root = info.path.parent / "rootfs" / info.rootfs.hash
    if (root / IN_IMAGE_LOCK).exists():
        return root
    with _file_lock(info.path.parent / "rootfs" / f".{info.rootfs.hash}.lock"):
        if not (root / IN_IMAGE_LOCK).exists():
            if root.exists():
                shutil.rmtree(root)
            extract_rootfs(info.rootfs_tar, root)
    return root


# ----------------------------------------------------------------------------------- build


def build(
    spec: str | os.PathLike | Mapping[str, Any] | Recipe,
    store_dir: str | os.PathLike,
    *,
    name: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    force: bool = False,
    previous_lock: Mapping[str, str] | None = None,
    write_lock: bool = True,
    progress: Callable[[str], None] | None = None,
    cancel: threading.Event | None = None,
) -> ToolchainInfo:
    """Build (or reuse) a toolchain and return its info.

    `spec` is a Recipe, a recipe dict, `path/BUILD.toml:name`, or a path with `name`. A toolchain
    whose recipe digest is already in the store is reused unless `force`. `changes` on the result
    says which packages moved against `previous_lock`, else the lock beside the declaration, else
    the last build of the same name in this store. `cancel` (set by a build's Ctrl-C or
    SIGTERM) kills the step that runs (mmdebstrap, pip) with its process group.
    """
    from rsi.store_folder import claim_store

    recipe = load_recipe(spec, name)
    say = progress or (lambda msg: print(f"[toolchain {recipe.name}] {msg}", file=sys.stderr))
    claim_store(Path(store_dir).resolve())  # NB: never write into a folder that is not a store
    root = toolchains_root(store_dir)
    recipe_digest = recipe.digest().hash
    directory = root / recipe_digest
    with _file_lock(root / f".{recipe_digest}.lock"):
        info = None if force else _load_info(directory)
        cached = info is not None
        if info is None:
            info = _build_into(
                recipe, directory, Path(cache_dir or default_cache_dir()), say, cancel
            )
    previous = previous_lock
    if previous is None and recipe.lock_path is not None:
        previous = read_lock_file(recipe.lock_path)
    if previous is None:
        last = _load_last(root, recipe.name)
        previous = last.lock if last is not None else None
    changes = diff_locks(dict(previous), dict(info.lock)) if previous is not None else None
    if write_lock and recipe.lock_path is not None:
        text = format_lock(dict(info.lock))
        if not recipe.lock_path.exists() or recipe.lock_path.read_text() != text:
            atomic_write_bytes(recipe.lock_path, text.encode(), fsync=False)
    _write_json(
        root / "by-rootfs" / f"{info.rootfs.hash}.json",
        {"name": info.name, "recipe_digest": recipe_digest},
    )
    _write_json(root / "by-name" / f"{recipe.name}.json", {"recipe_digest": recipe_digest})
    if changes:
        say("packages changed since the previous lock: " + "; ".join(changes.describe()))
    return ToolchainInfo(**{**info.__dict__, "cached": cached, "changes": changes})


def _load_last(root: Path, name: str) -> ToolchainInfo | None:
    try:
        recipe_digest = json.loads((root / "by-name" / f"{name}.json").read_text())["recipe_digest"]
    except (OSError, ValueError, KeyError):
        return None
    return _load_info(root / recipe_digest)


def _build_into(
    recipe: Recipe,
    directory: Path,
    cache: Path,
    say: Callable[[str], None],
    cancel: threading.Event | None = None,
) -> ToolchainInfo:
    t0 = time.monotonic()
    # NB: the pins first: a wrong one fails in seconds, naming the wheel, before any Debian work
    wheels = _fetch_wheels(recipe, cache / "wheels", say, cancel)
    if shutil.which("mmdebstrap") is None:
        raise ToolchainError(
            "mmdebstrap is not installed",
            hint="apt-get install mmdebstrap (scripts/ci-docker.sh does it)",
        )
    directory.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".build-{recipe.name}-"))
    try:
        tree = work / "root"
        _debootstrap(recipe, tree, cache / "debs", say, cancel)
        if wheels:
            _install_wheels(recipe, tree, wheels, say, cancel)
        _normalise(recipe, tree)
        lock = read_tree_lock(tree)
        lock_file = tree / IN_IMAGE_LOCK
        lock_file.parent.mkdir(parents=True, exist_ok=True)
        lock_file.write_text(format_lock(lock))
        (tree / IN_IMAGE_RECIPE).write_text(
            json.dumps(recipe.describe(), indent=1, sort_keys=True) + "\n"
        )
        for p in (lock_file, tree / IN_IMAGE_RECIPE):
            os.chmod(p, 0o644)
        say("packing rootfs tar")
        out = work / "out"
        out.mkdir()
        rootfs, sha256 = write_rootfs_tar(tree, out / "rootfs.tar", recipe.source_date_epoch)
        env = dict(recipe.env)
        config = image_config(recipe.name, sha256, rootfs.hash, recipe.source_date_epoch, env)
        info = ToolchainInfo(
            name=recipe.name,
            recipe_digest=recipe.digest().hash,
            rootfs=rootfs,
            rootfs_sha256=sha256,
            image_id=image_id(config),
            lock=lock,
            path=directory,
            source_date_epoch=recipe.source_date_epoch,
            env=env,
            build_s=round(time.monotonic() - t0, 1),
        )
        (out / "lock.txt").write_text(format_lock(lock))
        (out / "image-config.json").write_bytes(config)
        _write_json(out / "info.json", info.to_json())
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(out, directory)
        say(f"built {info.platform_value} in {info.build_s}s ({rootfs.size / 1e6:.0f} MB)")
        return info
    finally:
        mounted = _mounts_under(work)
        if mounted:
            # NB: a killed mmdebstrap may leave /dev, /proc or /sys bound in the tree: removing
            # the tree would reach the host's files through them. Left for a person to unmount.
            say(f"left {work}: still mounted there: {', '.join(mounted[:4])}")
        else:
            shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------------------ build steps


def host_mirror(suite: str) -> str:
    """The Debian mirror this host's apt uses for `suite` (or $RSI_DEBIAN_MIRROR)."""
    if os.environ.get("RSI_DEBIAN_MIRROR"):
        return os.environ["RSI_DEBIAN_MIRROR"]
    candidates: list[tuple[list[str], list[str]]] = []
    apt = Path("/etc/apt")
    for path in sorted(apt.glob("sources.list.d/*.sources")):
        for stanza in re.split(r"\n\s*\n", path.read_text()):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if ":" in line and not line.startswith(("#", " ")):
                    key, value = line.split(":", 1)
                    fields[key.strip().lower()] = value.strip()
            if "deb" in fields.get("types", "").split():
                candidates.append(
                    (fields.get("uris", "").split(), fields.get("suites", "").split())
                )
    for path in [apt / "sources.list", *sorted(apt.glob("sources.list.d/*.list"))]:
        if path.exists():
            for line in path.read_text().splitlines():
                words = re.sub(r"\[[^]]*\]", "", line).split()
                if len(words) >= 3 and words[0] == "deb":
                    candidates.append(([words[1]], [words[2]]))
    for uris, suites in candidates:
        if suite in suites and uris:
            return uris[0]
    for uris, suites in candidates:
        if any(s.split("-")[0] == suite.split("-")[0] for s in suites) and uris:
            return uris[0]
    raise ToolchainError(
        f"no Debian mirror for suite {suite!r} in /etc/apt/sources.list(.d)",
        hint="configure apt, or set RSI_DEBIAN_MIRROR to the mirror's URL",
        field="suite",
    )


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _fetch_wheels(
    recipe: Recipe, cache: Path, say: Callable[[str], None], cancel: threading.Event | None = None
) -> list[Path]:
    cache.mkdir(parents=True, exist_ok=True)
    found = []
    for wheel in recipe.wheels:
        path = cache / wheel.file
        if not path.exists() or _sha256_file(path) != wheel.sha256:
            say(f"downloading {wheel.name}=={wheel.version}")
            with tempfile.TemporaryDirectory(dir=cache) as tmp:
                proc = _call(
                    [
                        sys.executable,
                        "-m",
                        "pip",
                        "download",
                        "--no-deps",
                        "--only-binary=:all:",
                        "--disable-pip-version-check",
                        "-d",
                        tmp,
                        f"{wheel.name}=={wheel.version}",
                    ],
                    cancel,
                )
                got = Path(tmp) / wheel.file
                if proc.returncode != 0 or not got.exists():
                    raise ToolchainError(
                        f"{recipe.name}: cannot download {wheel.file}: "
                        f"{(proc.stderr or proc.stdout).strip()[-400:]}",
                        hint=f"put the wheel into {cache} by hand, or fix the pin",
                        field="wheels",
                    )
                os.replace(got, path)
            digest = _sha256_file(path)
            if digest != wheel.sha256:
                path.unlink()
                raise ToolchainError(
                    f"{recipe.name}: {wheel.file} has sha256 {digest}, the recipe pins "
                    f"{wheel.sha256}",
                    hint="upstream replaced the file or the pin is wrong; check and update it",
                    field="wheels",
                )
        found.append(path)
    return found


def _mounts_under(path: Path) -> list[str]:
    """Mount points at or below `path` (from /proc/self/mountinfo)."""
    prefix = os.fspath(path).rstrip("/") + "/"
    found = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                point = line.split()[4].encode().decode("unicode_escape")
                if point + "/" == prefix or point.startswith(prefix):
                    found.append(point)
    except (OSError, IndexError, UnicodeDecodeError):
        return [os.fspath(path)]  # NB: cannot tell: assume the worst, keep it
    return found


def _call(
    cmd: list[str], cancel: threading.Event | None = None, **kw: Any
) -> subprocess.CompletedProcess:
    """Run `cmd` to its end, output captured, in its own process group: killed with every
    process it started when `cancel` is set (or this thread is interrupted)."""
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **kw,
    )
    try:
        while True:
            try:
                out, err = proc.communicate(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if cancel is not None and cancel.is_set():
                    raise ToolchainError(f"{os.path.basename(cmd[0])} cancelled") from None
    finally:
        if proc.returncode is None:
            # NB: SIGTERM first: mmdebstrap unmounts what it bound into the tree on its way out
            for sig, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, None)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass
                try:
                    proc.communicate(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _run(
    cmd: list[str], what: str, cancel: threading.Event | None = None, *, field: str, **kw: Any
) -> None:
    proc = _call(cmd, cancel, **kw)
    if proc.returncode != 0:
        tail = (proc.stderr + proc.stdout).strip()[-2000:]
        raise ToolchainError(f"{what} failed (exit {proc.returncode}):\n{tail}", field=field)


def _debootstrap(
    recipe: Recipe,
    tree: Path,
    debs: Path,
    say: Callable[[str], None],
    cancel: threading.Event | None = None,
) -> None:
    debs.mkdir(parents=True, exist_ok=True)
    mirror = host_mirror(recipe.suite)
    say(f"mmdebstrap {recipe.suite} ({len(recipe.packages)} packages)")
    source = f"deb {mirror} {recipe.suite} {' '.join(recipe.components)}"
    cmd = [
        "mmdebstrap",
        f"--variant={recipe.variant}",
        f"--architectures={recipe.architecture}",
        f"--include={','.join(sorted(recipe.packages))}",
        '--aptopt=APT::Install-Recommends "false"',
        '--aptopt=Acquire::Retries "3"',
        "--skip=essential/unlink",
        '--setup-hook=mkdir -p "$1"/var/cache/apt/archives/',
        f"--setup-hook=sync-in {debs} /var/cache/apt/archives/",
        f"--customize-hook=sync-out /var/cache/apt/archives {debs}",
        recipe.suite,
        os.fspath(tree),
        source,
    ]
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "SOURCE_DATE_EPOCH": str(recipe.source_date_epoch),
    }
    _run(cmd, "mmdebstrap", cancel, field="packages", env=env)


def _install_wheels(
    recipe: Recipe,
    tree: Path,
    wheels: list[Path],
    say: Callable[[str], None],
    cancel: threading.Event | None = None,
) -> None:
    say(f"pip install {len(wheels)} pinned wheel(s) with --require-hashes")
    stage = tree / "tmp" / "rsi-wheels"
    stage.mkdir(parents=True)
    for path in wheels:
        shutil.copyfile(path, stage / path.name)
    (stage / "requirements.txt").write_text(
        "".join(f"{w.name}=={w.version} --hash=sha256:{w.sha256}\n" for w in recipe.wheels)
    )
    cmd = [
        "chroot",
        os.fspath(tree),
        "/usr/bin/env",
        "-i",
        "PATH=/usr/bin:/bin",
        "LANG=C.UTF-8",
        "HOME=/tmp",
        f"SOURCE_DATE_EPOCH={recipe.source_date_epoch}",
        "PIP_CONFIG_FILE=/dev/null",
        "PIP_NO_CACHE_DIR=1",
        "PIP_DISABLE_PIP_VERSION_CHECK=1",
        "PYTHONHASHSEED=0",
        "python3",
        "-m",
        "pip",
        "install",
        "--break-system-packages",
        "--no-index",
        "--find-links",
        "/tmp/rsi-wheels",
        "--require-hashes",
        "--no-deps",
        "-r",
        "/tmp/rsi-wheels/requirements.txt",
    ]
    _run(cmd, "pip install into the rootfs", cancel, field="wheels")
    shutil.rmtree(stage)


def _normalise(recipe: Recipe, tree: Path) -> None:
    """Make every file the build wrote from the clock, the host or a download deterministic."""
    for rel in (
        "tmp",
        "run",
        "var/lib/apt/lists",
        "var/cache/apt/archives",
        "root/.cache",
        "var/cache/ldconfig",
    ):
        d = tree / rel
        if d.is_dir():
            for child in d.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
    (tree / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
    (tree / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
    for pattern in (
        "var/cache/apt/*.bin",
        "var/cache/debconf/*-old",
        "var/lib/dpkg/*-old",
        "var/backups/*",
    ):
        for path in tree.glob(pattern):
            path.unlink()
    for path in (tree / "var/log").rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.write_bytes(b"")
    (tree / "etc/hostname").write_text("rsi\n")
    resolv = tree / "etc/resolv.conf"
    if resolv.is_symlink() or resolv.exists():
        resolv.unlink()
    resolv.write_text("")
    (tree / EXEC_MOUNT).mkdir(parents=True, exist_ok=True)
    os.chmod(tree / "tmp", 0o1777)
