"""The model checker's workspace: a small generated rsi workspace of `command` targets, the
file-system changes a sequence makes to it, and the oracle (what each output must hold, computed
in Python from the files on disk). Never runs rsi; bench/model_check.py does."""

from __future__ import annotations

import hashlib
import os
import random
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import blake3  # NB: rsi's own dependency: the store's default digest

PACKAGES = ("a", "a/sub", "b")
PATTERNS = ("//...", "//a/...", "//b:all")
# Every command is `{ echo TAG; cat INPUTS; } | FILTER > $(OUT)`: cheap, deterministic, and each
# filter has a Python twin below, so the oracle needs no build.
FILTERS = {
    "cat": lambda d: d,
    "tr a-z A-Z": lambda d: d.upper(),
    "tr -d aeiou": lambda d: bytes(c for c in d if c not in b"aeiou"),
    "sort": lambda d: b"".join(sorted(ln.rstrip(b"\n") + b"\n" for ln in d.splitlines(True))),
    "sha256sum": lambda d: hashlib.sha256(d).hexdigest().encode() + b"  -\n",
    "(sleep 1; cat)": lambda d: d,  # NB: a slow action widens the window a change can hit
}
CMD = re.compile(r"^\{ echo (\w+); cat (.+); \} \| (.+) > \$\(OUT\)$")
INPUT = re.compile(r"(\$\(SRCS\)|\$\(location ([^)]+)\))")
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india")


@dataclass
class Target:
    srcs: list[str]  # package-relative source files
    deps: list[str]  # labels
    filt: str
    tag: str  # always 4 characters, so a tag change is a same-size BUILD.toml rewrite

    def cmd(self) -> str:
        inputs = (["$(SRCS)"] if self.srcs else []) + [f"$(location {d})" for d in self.deps]
        return f"{{ echo {self.tag}; cat {' '.join(inputs)}; }} | {self.filt} > $(OUT)"


@dataclass
class Model:
    """What the sequence declared: packages -> target name -> Target. The oracle never trusts
    it (it reads the disk); it only drives which changes are made."""

    pkgs: dict[str, dict[str, Target]] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)  # workspace-relative
    deleted: list[str] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)  # workspace-relative, newest last
    history: dict[str, list[bytes]] = field(default_factory=dict)  # earlier contents
    linked: set[str] = field(default_factory=set)  # changed through a later hard link
    serial: int = 0

    def mounted(self, rel: str) -> bool:
        """Whether a bind mount covers this source (it cannot be renamed or deleted then)."""
        return any(rel == m or rel.startswith(m + "/") for m in self.mounts)

    def labels(self) -> list[str]:
        return [f"//{p}:{n}" for p, ts in self.pkgs.items() for n in ts]

    def target(self, label: str) -> Target:
        pkg, name = label[2:].split(":")
        return self.pkgs[pkg][name]


def words(rng: random.Random, n: int | None = None) -> bytes:
    n = rng.randint(1, 6) if n is None else n
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3))) for _ in range(n)]
    return ("\n".join(lines) + "\n").encode()


def same_size_other(rng: random.Random, data: bytes) -> bytes:
    """Different bytes of the same length (lowercase letters, newlines kept)."""
    if not data:
        return data
    out = bytearray(data)
    for _ in range(8):
        i = rng.randrange(len(out))
        if out[i] != ord("\n"):
            out[i] = ord("a") + (out[i] - ord("a") + rng.randint(1, 25)) % 26
    if bytes(out) == data:
        i = next((k for k, c in enumerate(out) if c != ord("\n")), None)
        if i is not None:
            out[i] = ord("z") if out[i] != ord("z") else ord("y")
    return bytes(out)


def render(model: Model, pkg: str) -> str:
    parts = []
    for name, t in model.pkgs[pkg].items():
        srcs = ", ".join(f'"{s}"' for s in t.srcs)
        deps = ", ".join(f'"{d}"' for d in t.deps)
        parts.append(
            f'[{name}]\nrule = "command"\nsrcs = [{srcs}]\ndeps = [{deps}]\n'
            f'outs = ["{name}.out"]\ncmd = "{t.cmd()}"\n'
        )
    return "\n".join(parts)


def write_build(ws: Path, model: Model, pkg: str) -> None:
    (ws / pkg / "BUILD.toml").write_text(render(model, pkg))


def generate(ws: Path, rng: random.Random) -> Model:
    """A fresh workspace: a few sources per package, leaves, chains and a fan-in across
    packages (deps only point at earlier targets, so there is no cycle)."""
    (ws / "rsi.toml").write_text("")
    model = Model()
    order: list[str] = []
    for pkg in PACKAGES:
        model.pkgs[pkg] = {}
        for i in range(rng.randint(2, 3)):
            rel = f"{pkg}/src/s{i}.txt"
            (ws / rel).parent.mkdir(parents=True, exist_ok=True)
            (ws / rel).write_bytes(words(rng))
            model.sources.append(rel)
        for _ in range(rng.randint(2, 3)):
            add_target(model, pkg, rng, order)
    for pkg in PACKAGES:
        write_build(ws, model, pkg)
    return model


def new_tag(model: Model) -> str:
    model.serial += 1
    return f"t{model.serial:03d}"[-4:]


def add_target(model: Model, pkg: str, rng: random.Random, order: list[str] | None = None) -> str:
    order = model.labels() if order is None else order
    name = f"n{model.serial + 1}"
    own = [s.removeprefix(pkg + "/") for s in model.sources if s.rsplit("/src/", 1)[0] == pkg]
    own = [s for s in own if f"{pkg}/{s}" not in model.deleted]
    srcs = rng.sample(own, rng.randint(0, min(2, len(own)))) if own else []
    deps = rng.sample(order, rng.randint(0, min(2, len(order)))) if order else []
    deps = [d.replace(f"//{pkg}:", ":") for d in deps]
    if not srcs and not deps:
        srcs = own[:1] if own else []
    if not srcs and not deps:
        return ""
    model.pkgs[pkg][name] = Target(srcs, deps, rng.choice(list(FILTERS)), new_tag(model))
    order.append(f"//{pkg}:{name}")
    return f"//{pkg}:{name}"


def dependants(model: Model, label: str) -> list[str]:
    pkg = label[2:].split(":")[0]
    found = []
    for p, ts in model.pkgs.items():
        for n, t in ts.items():
            for d in t.deps:
                full = f"//{p}{d}" if d.startswith(":") else d
                if full == label or (p == pkg and d == ":" + label.split(":")[1]):
                    found.append(f"//{p}:{n}")
    return found


# ------------------------------------------------------------------------------ the oracle
def _resolve(pkg: str, ref: str) -> tuple[str, str]:
    if ref.startswith(":"):
        return pkg, ref[1:]
    p, _, n = ref[2:].partition(":")
    return p, n or p.rsplit("/", 1)[-1]


def read_declared(ws: Path) -> dict[tuple[str, str], dict]:
    """Every (package, target) declared on disk now, as its TOML table."""
    found = {}
    for pkg in PACKAGES:
        path = ws / pkg / "BUILD.toml"
        if path.exists():
            for name, table in tomllib.loads(path.read_text()).items():
                found[(pkg, name)] = table
    return found


def oracle(ws: Path, labels: list[str]) -> dict[str, bytes] | None:
    """{out/ relative path: bytes} a clean build of `labels` must produce from the files on
    disk now, or None when that build must fail (a source is missing)."""
    declared = read_declared(ws)
    memo: dict[tuple[str, str], bytes | None] = {}

    def value(key: tuple[str, str]) -> bytes | None:
        if key in memo:
            return memo[key]
        table = declared[key]
        m = CMD.match(table["cmd"])
        assert m, f"unmodelled command {table['cmd']!r}"
        tag, inputs, filt = m.groups()
        data = tag.encode() + b"\n"
        result: bytes | None = None
        for token, ref in INPUT.findall(inputs):
            if token == "$(SRCS)":
                for s in table.get("srcs", []):
                    path = ws / key[0] / s
                    if not path.is_file():
                        memo[key] = None
                        return None
                    data += path.read_bytes()
            else:
                dep = value(_resolve(key[0], ref))
                if dep is None:
                    memo[key] = None
                    return None
                data += dep
        result = FILTERS[filt](data)
        memo[key] = result
        return result

    expected = {}
    for label in labels:
        pkg, name = label[2:].split(":")
        out = value((pkg, name))
        if out is None:
            return None
        expected[f"{pkg}/{declared[(pkg, name)]['outs'][0]}"] = out
    return expected


def requested(ws: Path, pattern: str) -> list[str]:
    """The labels a pattern names, from the declarations on disk."""
    keys = read_declared(ws)
    if pattern == "//...":
        return [f"//{p}:{n}" for p, n in keys]
    if pattern.endswith("/..."):
        base = pattern[2:-4]
        return [f"//{p}:{n}" for p, n in keys if p == base or p.startswith(base + "/")]
    if pattern.endswith(":all"):
        base = pattern[2:-4]
        return [f"//{p}:{n}" for p, n in keys if p == base]
    return [pattern]


def compare(
    ws: Path, expected: dict[str, bytes], seen: dict[str, bytes] | None = None
) -> list[str]:
    """How out/ (or `seen`, e.g. a job's artifacts) differs from `expected`: one line each."""
    wrong = []
    for rel, want in sorted(expected.items()):
        if seen is not None:
            if rel not in seen:
                continue
            got = seen[rel]
        else:
            path = ws / "out" / rel
            got = path.read_bytes() if path.is_file() else None
        if got is None:
            wrong.append(f"{rel}: missing, want {len(want)} bytes")
        elif got != want:
            pairs = enumerate(zip(got, want, strict=False))
            at = max(0, next((i for i, (x, y) in pairs if x != y), min(len(got), len(want))) - 8)
            wrong.append(
                f"{rel}: {len(got)} bytes, want {len(want)}; from byte {at}: "
                f"{got[at : at + 24]!r} != {want[at : at + 24]!r}"
            )
    return wrong


def digest(data: bytes) -> str:
    """The store's default digest (blake3, `hex/size`), to check a job's artifact list."""
    return f"{blake3.blake3(data).hexdigest()}/{len(data)}"


# ---------------------------------------------------------------------- file-system changes
def _stat(path: Path) -> os.stat_result:
    return path.stat()


def _put_back(path: Path, st: os.stat_result) -> None:
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def edit_source(ws: Path, model: Model, rng: random.Random, kind: str) -> str:
    """One change to a source; returns what it did (for the sequence's record)."""
    live = [s for s in model.sources if s not in model.deleted]
    if kind == "recreate" and model.deleted:
        rel = model.deleted.pop(0)
        (ws / rel).write_bytes(words(rng))
        return f"recreate {rel}"
    if kind == "unmount":
        if not model.mounts:
            return "noop"
        rel = model.mounts.pop()
        subprocess.run(["umount", str(ws / rel)], check=True)
        return f"unmount {rel} (the file or folder under it shows again, no event)"
    if kind in ("delete", "rename", "reuse_inode", "swap", "replace_dir", "bind_file", "bind_dir"):
        live = [s for s in live if not model.mounted(s)]
    if kind == "replace_dir":  # NB: a folder holding a mount point cannot be swapped
        live = [s for s in live if not any(m.startswith(s.rsplit("/", 1)[0]) for m in model.mounts)]
    if not live:
        return "noop"
    rel = rng.choice(live)
    path = ws / rel
    if not path.is_file():  # NB: hidden or shown again by a mount made or undone since
        path.write_bytes(words(rng))
        return f"write {rel} (it was gone)"
    old = path.read_bytes()
    st = _stat(path)
    if kind == "revert":  # an editor's undo: earlier bytes back (a poisoned cache entry shows)
        if not model.history.get(rel):
            return "noop"
        path.write_bytes(model.history[rel].pop())
        return f"revert {rel} to its previous content"
    model.history.setdefault(rel, []).append(old)
    if kind == "edit":
        new = old + words(rng, 1) if rng.random() < 0.5 or len(old) < 8 else old[: len(old) // 2]
        path.write_bytes(new)
        return f"edit {rel} ({len(old)}->{len(new)} bytes)"
    if kind == "same_size":  # a rewrite in place: same inode, size and mtime; only ctime moves
        with open(path, "r+b") as f:
            f.write(same_size_other(rng, old))
        _put_back(path, st)
        return f"same-size rewrite {rel}, mtime put back"
    if kind == "touch":
        os.utime(path)
        return f"touch {rel}"
    if kind == "rename":  # a new inode by rename over the source, mtime put back
        tmp = path.with_name(path.name + ".new")
        tmp.write_bytes(same_size_other(rng, old))
        os.replace(tmp, path)
        _put_back(path, st)
        return f"rename new file over {rel} (same size, mtime put back)"
    if kind == "reuse_inode":  # delete and re-create at once: ext4 often hands the inode back
        path.unlink()
        path.write_bytes(same_size_other(rng, old))
        _put_back(path, st)
        same = _stat(path).st_ino == st.st_ino
        return f"delete+recreate {rel} same size, mtime put back (inode reused: {same})"
    if kind == "replace_dir":  # the source's folder swapped for a copy (one file rewritten)
        folder, fresh = path.parent, path.parent.with_name("src.new")
        shutil.copytree(folder, fresh)  # NB: copy2 keeps every mtime
        (fresh / path.name).write_bytes(same_size_other(rng, old))
        _put_back(fresh / path.name, st)
        gone = folder.with_name("src.old")
        os.rename(folder, gone)
        os.rename(fresh, folder)
        shutil.rmtree(gone)
        return f"replace folder of {rel} by rename (one file same size, mtimes kept)"
    if kind == "bind_file":  # another file bind-mounted over the source: no inotify event
        other = ws.parent / "mnt" / f"f{model.serial}-{rng.randrange(10**6)}"
        other.parent.mkdir(exist_ok=True)
        other.write_bytes(same_size_other(rng, old))
        _put_back(other, st)
        subprocess.run(["mount", "--bind", str(other), str(path)], check=True)
        model.mounts.append(rel)
        return f"bind-mount a same-size file (mtime put back) over {rel}"
    if kind == "bind_dir":  # a copy of the source's folder (one file rewritten) mounted over it
        folder = path.parent
        other = ws.parent / "mnt" / f"d{model.serial}-{rng.randrange(10**6)}"
        shutil.copytree(folder, other)
        (other / path.name).write_bytes(same_size_other(rng, old))
        _put_back(other / path.name, st)
        subprocess.run(["mount", "--bind", str(other), str(folder)], check=True)
        model.mounts.append(str(folder.relative_to(ws)))
        return f"bind-mount a copy of {folder.relative_to(ws)} over it ({rel} same size)"
    if kind == "hardlink":  # rewritten through a hard link made now in an unwatched folder
        link = ws.parent / "links" / f"l{model.serial}-{rng.randrange(10**6)}"
        link.parent.mkdir(exist_ok=True)
        os.link(path, link)
        with open(link, "r+b") as f:
            f.write(same_size_other(rng, old))
        _put_back(link, st)
        model.linked.add(rel)
        return f"hard link to {rel} made elsewhere, rewritten through it (same size, mtime back)"
    if kind == "swap":
        same = [s for s in live if s != rel and (ws / s).stat().st_size == st.st_size]
        other = ws / (rng.choice(same) if same else rng.choice(live))
        if other == path:
            return "noop"
        tmp = path.with_name(path.name + ".swap")
        os.replace(path, tmp)
        os.replace(other, path)
        os.replace(tmp, other)
        return f"swap {rel} <-> {other.relative_to(ws)} by rename"
    if kind == "delete":
        path.unlink()
        model.deleted.append(rel)
        return f"delete {rel}"
    raise ValueError(kind)


def unmount_all(ws: Path, model: Model) -> None:
    """Undo every bind mount a sequence made (newest first), even a busy one (lazily)."""
    while model.mounts:
        subprocess.run(["umount", "-l", str(ws / model.mounts.pop())], check=False)


def edit_build(ws: Path, model: Model, rng: random.Random, kind: str) -> str:
    """One change to a BUILD.toml; returns what it did."""
    pkg = rng.choice(PACKAGES)
    path = ws / pkg / "BUILD.toml"
    names = list(model.pkgs[pkg])
    if kind == "add_target" or not names:
        label = add_target(model, pkg, rng)
        write_build(ws, model, pkg)
        return f"add target {label}"
    name = rng.choice(names)
    t = model.pkgs[pkg][name]
    label = f"//{pkg}:{name}"
    if kind == "retag_same_size":  # same bytes count, mtime put back
        st = _stat(path)
        t.tag = new_tag(model)
        data = render(model, pkg).encode()
        assert len(data) == st.st_size
        with open(path, "r+b") as f:
            f.write(data)
        _put_back(path, st)
        return f"retag {label} -> {t.tag} (same-size BUILD.toml, mtime put back)"
    if kind == "filter":
        t.filt = rng.choice([f for f in FILTERS if f != t.filt])
        write_build(ws, model, pkg)
        return f"filter of {label} -> {t.filt}"
    if kind == "remove_target":
        if dependants(model, label) or len(names) == 1:  # NB: `//b:all` must match something
            return "noop"
        del model.pkgs[pkg][name]
        write_build(ws, model, pkg)
        return f"remove target {label}"
    if kind == "srcs":
        own = [s.removeprefix(pkg + "/") for s in model.sources if s.startswith(pkg + "/src/")]
        own = [s for s in own if f"{pkg}/{s}" not in model.deleted]
        if not own:
            return "noop"
        t.srcs = rng.sample(own, rng.randint(0 if t.deps else 1, min(2, len(own))))
        write_build(ws, model, pkg)
        return f"srcs of {label} -> {t.srcs}"
    raise ValueError(kind)
