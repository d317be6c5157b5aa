"""The identity of the interpreter `host-python` actions run on: its version and platform and,
for the top-level modules a step imports, the installed distributions providing them and the
closure of their requirements (name, version, digest of the files they installed: RECORD).

It never covers a distribution nothing the step imports needs (an unrelated extra installed
beside them changes no key), and never reads the working directory's `sys.path` entries (an
action runs `python3 -I`). Reads are memoised by the (inode, size, mtime, ctime) of what was
read, so a build pays a few `stat`s per distribution, not a parse.
"""

from __future__ import annotations

import importlib.machinery
import os
import re
import site
import sys
from typing import Any, Iterable

from rsi.digest import digest_bytes, digest_value
from rsi.executors.sandbox import HOST_PYTHON

# NB: a distribution's name as PEP 503 normalises it (`Jinja2`, `typing-extensions`)
_NORMALISE = re.compile(r"[-_.]+")
_REQ_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_STDLIB = frozenset(sys.stdlib_module_names) | frozenset(sys.builtin_module_names)

# path -> (signature, value): what was read from a folder or file, while it keeps its signature
_MEMO: dict[tuple[str, str], tuple[tuple, Any]] = {}
# (modules, search path) -> (signatures of the folders the identity read, the identity)
_IDENTITIES: dict[tuple, tuple[tuple, str]] = {}
_PATHS: dict[tuple, tuple[str, ...]] = {}


def normalise(name: str) -> str:
    return _NORMALISE.sub("_", name).lower()


def _sig(path: str) -> tuple:
    try:
        st = os.stat(path)
    except OSError:
        return ("absent",)
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _memo(kind: str, path: str, sigs: tuple, compute) -> Any:
    key = (kind, path)
    got = _MEMO.get(key)
    if got is not None and got[0] == sigs:
        return got[1]
    value = compute()
    _MEMO[key] = (sigs, value)
    return value


def search_path() -> tuple[str, ...]:
    """The `sys.path` entries an action's `python3 -I` also has: not the working directory
    (`''`, or its absolute path under `python -m`), `$PYTHONPATH` or the user's site folder."""
    key = (tuple(sys.path), os.environ.get("PYTHONPATH", ""), os.getcwd())
    got = _PATHS.get(key)
    if got is None:
        skip = {os.path.realpath(p) for p in key[1].split(os.pathsep) if p}
        skip.add(os.path.realpath(key[2]))
        try:
            user = os.path.realpath(site.getusersitepackages())
            if user not in {os.path.realpath(p) for p in site.getsitepackages()}:
                skip.add(user)
        except (AttributeError, OSError):
            pass
        got = tuple(p for p in key[0] if os.path.isabs(p) and os.path.realpath(p) not in skip)
        _PATHS.clear()
        _PATHS[key] = got
    return got


def _listing(entry: str) -> dict[str, str]:
    """{normalised distribution name: dist-info/egg-info folder} of one path entry."""

    def read() -> dict[str, str]:
        found: dict[str, str] = {}
        try:
            names = sorted(os.listdir(entry))
        except OSError:  # a zip file, a path hook, a folder since removed
            return found
        for name in names:
            stem, _, kind = name.rpartition(".")
            if kind in ("dist-info", "egg-info"):
                found.setdefault(normalise(stem.partition("-")[0]), os.path.join(entry, name))
        return found

    return _memo("listing", entry, (_sig(entry),), read)


def _metadata_file(folder: str) -> str:
    return os.path.join(folder, "METADATA" if folder.endswith(".dist-info") else "PKG-INFO")


def _record_file(folder: str) -> str:
    return os.path.join(folder, "RECORD" if folder.endswith(".dist-info") else "SOURCES.txt")


def _dist(folder: str) -> dict:
    """name, version, requirements, top-level names and files digest of one installed dist."""
    meta, record, top = _metadata_file(folder), _record_file(folder), "top_level.txt"
    sigs = (_sig(folder), _sig(meta), _sig(record), _sig(os.path.join(folder, top)))

    def read() -> dict:
        name, version, requires = "", "?", []
        try:
            with open(meta, encoding="utf-8", errors="replace") as f:
                for line in f:
                    if not line.strip():
                        break  # NB: the headers end at the first blank line; the rest is prose
                    key, _, value = line.partition(":")
                    value = value.strip()
                    if key == "Name":
                        name = value
                    elif key == "Version":
                        version = value
                    elif key == "Requires-Dist":
                        requires.append(value)
        except OSError:
            pass
        if folder.endswith(".egg-info"):
            requires += _egg_requires(os.path.join(folder, "requires.txt"))
        try:
            with open(record, "rb") as f:
                files = str(digest_bytes(f.read()))
        except OSError:
            files = None
        try:
            with open(os.path.join(folder, top), encoding="utf-8", errors="replace") as f:
                tops = sorted({t.strip() for t in f if t.strip()})
        except OSError:
            tops = []
        stem = os.path.basename(folder).rpartition(".")[0]
        return {
            "name": normalise(name or stem.partition("-")[0]),
            "version": version if version != "?" else (stem.partition("-")[2] or "?"),
            "files": files,
            "requires": [r for r in (_requirement(q) for q in requires) if r],
            "top_level": tops,
        }

    return _memo("dist", folder, sigs, read)


def _egg_requires(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        if line.startswith("["):
            break  # NB: the sections below are extras (and markers): not what an import needs
        if line.strip():
            out.append(line.strip())
    return out


def _requirement(text: str) -> str | None:
    """The normalised name a `Requires-Dist` value needs here, or None: an extra's
    requirement, or one whose environment marker this interpreter does not meet."""
    name_match = _REQ_NAME.match(text)
    if not name_match:
        return None
    _, _, marker = text.partition(";")
    if marker.strip():
        if re.search(r"\bextra\b", marker):
            return None  # NB: an extra's requirement is not needed by the dist's own imports
        if not _marker_holds(marker.strip()):
            return None
    return normalise(name_match.group(1))


def _marker_holds(marker: str) -> bool:
    try:
        # NB: optional (vendored by pip and setuptools, not one of rsi's dependencies); without
        # it every marker counts as met, which can only add distributions, never drop one
        from packaging.markers import InvalidMarker, Marker
    except ImportError:
        return True
    try:
        return bool(Marker(marker).evaluate())
    except (InvalidMarker, Exception):  # NB: an unparsable marker: count it as met
        return True


def _find(name: str, paths: tuple[str, ...]) -> str | None:
    """The distribution folder of normalised `name` on the search path (first wins)."""
    for entry in paths:
        folder = _listing(entry).get(name)
        if folder is not None:
            return folder
    return None


def _owner(module: str, paths: tuple[str, ...]) -> tuple[str, str | None]:
    """(where `module` is imported from, the dist folder providing it or None)."""
    try:
        spec = importlib.machinery.PathFinder.find_spec(module, list(paths))
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return "absent", None
    where = spec.origin or next(iter(spec.submodule_search_locations or ()), "") or "?"
    entry = max((p for p in paths if where.startswith(p.rstrip("/") + "/")), key=len, default="")
    listing = _listing(entry) if entry else {}
    want = normalise(module)
    if want in listing:
        return where, listing[want]
    for folder in listing.values():
        if module in _dist(folder)["top_level"]:
            return where, folder
    # NB: a dist named otherwise and without top_level.txt (PyYAML's `yaml`): its RECORD
    for folder in listing.values():
        if module in _record_tops(folder):
            return where, folder
    return where, None


def _record_tops(folder: str) -> frozenset[str]:
    """The top-level names a dist installed, from its RECORD (`yaml/__init__.py` -> yaml)."""
    record = _record_file(folder)

    def read() -> frozenset[str]:
        tops = set()
        try:
            with open(record, encoding="utf-8", errors="replace") as f:
                for line in f:
                    first = line.split(",", 1)[0].split("/", 1)[0]
                    tops.add(first[:-3] if first.endswith(".py") else first.split(".", 1)[0])
        except OSError:
            pass
        return frozenset(tops)

    return _memo("tops", folder, (_sig(record),), read)


def closure(imports: Iterable[str], read: list[str] | None = None) -> dict:
    """What the identity of `imports` covers: per module where it comes from and its dist, and
    per distribution in the closure of their requirements its version and files digest."""
    paths = search_path()
    modules: dict[str, Any] = {}
    dists: dict[str, Any] = {}
    todo: list[str] = []
    for module in sorted(set(imports)):
        if module in _STDLIB:
            modules[module] = "stdlib"  # NB: the interpreter's version covers it
            continue
        where, folder = _owner(module, paths)
        if folder is None:
            # NB: absent, or not from an installed distribution: named by where it is, so
            # installing it (or shadowing it) is another identity
            modules[module] = where if where == "absent" else f"unpackaged:{where}"
            continue
        info = _dist(folder)
        modules[module] = info["name"]
        todo.append(folder)
    seen: set[str] = set()
    while todo:
        folder = todo.pop()
        if folder in seen:
            continue
        seen.add(folder)
        if read is not None:
            read += (folder, _metadata_file(folder), _record_file(folder))
        info = _dist(folder)
        dists[info["name"]] = {"version": info["version"], "files": info["files"]}
        for need in info["requires"]:
            found = _find(need, paths)
            if found is None:
                dists.setdefault(need, None)  # NB: needed and missing: named as such
            else:
                todo.append(found)
    return {"modules": modules, "dists": dict(sorted(dists.items()))}


def host_python_identity(imports: Iterable[str] = ()) -> str:
    """`host-python@<digest>[:module,...]`: this interpreter's version and platform, and the
    closure of the distributions `imports` (top-level module names) need. The modules are
    named in the identity so that an executor can check it against its own interpreter."""
    roots = sorted(set(imports))
    for root in roots:
        if not root.isidentifier():
            raise ValueError(f"not a module name: {root!r}")
    paths = search_path()
    key = (tuple(roots), paths)
    got = _IDENTITIES.get(key)
    # NB: kept while every path entry and every dist folder of the closure keeps its signature
    # (a pip install or uninstall replaces the dist folder and changes its entry's)
    if got is not None and all(_sig(p) == sig for p, sig in got[0]):
        return got[1]
    ident: dict[str, Any] = {"version": sys.version, "platform": sys.platform}
    read: list[str] = list(paths)
    if roots:
        ident["imports"] = closure(roots, read)
    digest = digest_value(ident).hash[:32]
    identity = f"{HOST_PYTHON}@{digest}" + (f":{','.join(roots)}" if roots else "")
    _IDENTITIES[key] = (tuple((p, _sig(p)) for p in read), identity)
    return identity


def identity_imports(toolchain: str) -> tuple[str, ...] | None:
    """The modules a `host-python@…` identity covers (None: not a host-python identity)."""
    if not toolchain.startswith(HOST_PYTHON + "@"):
        return None
    _, _, names = toolchain.partition(":")
    return tuple(n for n in names.split(",") if n)


def is_this_interpreter(toolchain: str) -> bool:
    """Whether `toolchain` (a `host-python@…` identity) names this interpreter as it is now."""
    imports = identity_imports(toolchain)
    if imports is None or not all(n.isidentifier() for n in imports):
        return False
    return host_python_identity(imports) == toolchain


def packages(imports: Iterable[str]) -> dict[str, str]:
    """{distribution: "version files-digest"} of the closure ("absent" for a needed one that
    is missing; `module NAME` for a module from no distribution): what a judge records."""
    got = closure(imports)
    out = {
        name: "absent" if v is None else f"{v['version']} {v['files']}"
        for name, v in got["dists"].items()
    }
    for module, where in got["modules"].items():
        if where == "absent" or where.startswith("unpackaged:"):
            out[f"module {module}"] = where
    return out


def legacy_identity() -> str:
    """The identity rsi gave this interpreter before identities named their modules (every
    installed dist by folder name): a campaign recorded under it can be matched to now."""
    found: set[str] = set()
    for entry in search_path():
        for name in _listing_names(entry):
            stem, _, kind = name.rpartition(".")
            dist, _, version = stem.partition("-")
            if not version:
                version = _dist(os.path.join(entry, name))["version"]
            dist = dist.lower().replace("-", "_").replace(".", "_")
            if dist != "rsi":
                found.add(f"{dist}=={version}")
    ident = {"version": sys.version, "platform": sys.platform, "dists": sorted(found)}
    return f"{HOST_PYTHON}@{digest_value(ident).hash[:32]}"


def _listing_names(entry: str) -> list[str]:
    try:
        names = os.listdir(entry)
    except OSError:
        return []
    return [n for n in names if n.rpartition(".")[2] in ("dist-info", "egg-info")]
