"""Toolchain recipes, deterministic tars, image identity, locks, and real builds (cached)."""

from __future__ import annotations

import json
import os
import tarfile
import time
from pathlib import Path

import pytest

from rsi.errors import DeclarationError
from rsi.toolchain import (
    build,
    diff_locks,
    format_lock,
    load_declarations,
    load_recipe,
    parse_lock,
    toolchains_root,
)
from rsi.toolchain.image import image_config, image_id
from rsi.toolchain.recipe import recipe_from_dict
from rsi.toolchain.tarball import write_rootfs_tar
from rsi.toolchain.testing import DECLARATIONS, built_toolchain, test_store_dir

EPOCH = 1735689600


def _numpy_doc() -> dict:
    tables = __import__("tomllib").loads(DECLARATIONS.read_text())
    return {k: v for k, v in tables["numpy"].items() if k != "rule"}


# ------------------------------------------------------------------------------ declarations


@pytest.mark.fast
def test_declarations_hold_numpy_and_torch_toolchains() -> None:
    recipes = load_declarations(DECLARATIONS)
    assert {"numpy", "torch-cpu"} <= set(recipes)
    torch = recipes["torch-cpu"]
    assert any(w.name == "torch" and w.version.startswith("2.13.0") for w in torch.wheels)
    assert all(len(w.sha256) == 64 for r in recipes.values() for w in r.wheels)


@pytest.mark.fast
def test_recipe_digest_ignores_description_and_declaring_file() -> None:
    doc = _numpy_doc()
    a = recipe_from_dict(doc, name="numpy", file=str(DECLARATIONS))
    b = recipe_from_dict({**doc, "description": "something else"}, name="numpy")
    assert a.digest() == b.digest()


@pytest.mark.fast
def test_recipe_digest_changes_with_a_wheel_pin_or_a_package() -> None:
    doc = _numpy_doc()
    base = recipe_from_dict(doc, name="numpy").digest()
    wheel = dict(doc["wheels"][0], sha256="0" * 64)
    assert recipe_from_dict({**doc, "wheels": [wheel]}, name="numpy").digest() != base
    more = {**doc, "packages": [*doc["packages"], "less"]}
    assert recipe_from_dict(more, name="numpy").digest() != base


@pytest.mark.fast
def test_bad_wheel_pin_names_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "BUILD.toml"
    bad.write_text(
        '[x]\nrule = "toolchain"\nsuite = "bookworm"\npackages = ["python3"]\n'
        'wheels = [{name="numpy", version="1", file="n.whl", sha256="abc"}]\n'
    )
    with pytest.raises(DeclarationError) as err:
        load_recipe(f"{bad}:x")
    assert "wheels[0]" in str(err.value) and "sha256" in str(err.value)


@pytest.mark.fast
def test_unknown_toolchain_name_lists_the_declared_ones() -> None:
    with pytest.raises(DeclarationError) as err:
        load_recipe(DECLARATIONS, "nope")
    assert "numpy" in str(err.value)


# --------------------------------------------------------------------------------- locks


@pytest.mark.fast
def test_lock_diff_names_each_moved_package() -> None:
    old = {"deb:python3": "3.11.2-1", "wheel:numpy": "2.4.6", "deb:less": "590-2"}
    new = {"deb:python3": "3.11.2-1+b1", "wheel:numpy": "2.4.6", "wheel:torch": "2.13.0"}
    diff = diff_locks(old, new)
    assert diff.changed == (("deb:python3", "3.11.2-1", "3.11.2-1+b1"),)
    assert diff.added == (("wheel:torch", "2.13.0"),)
    assert diff.removed == (("deb:less", "590-2"),)
    assert diff.packages == ["deb:less", "deb:python3", "wheel:torch"]
    assert not diff_locks(old, dict(old))


@pytest.mark.fast
def test_lock_text_round_trips() -> None:
    lock = {"deb:python3": "3.11.2-1+b1", "wheel:numpy": "2.4.6"}
    assert parse_lock(format_lock(lock)) == lock


# -------------------------------------------------------------------------------- tarball


def _make_tree(root: Path, order: list[str], mtime: float) -> None:
    for name in order:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"content of {name}\n")
    os.symlink("b/c.txt", root / "link")
    os.link(root / "a.txt", root / "hard")
    for path in [*root.rglob("*"), root]:
        os.utime(path, (mtime, mtime), follow_symlinks=False)


@pytest.mark.fast
def test_rootfs_tar_is_byte_identical_whatever_the_mtimes_and_creation_order(
    tmp_path: Path,
) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    _make_tree(one, ["a.txt", "b/c.txt", "b/d.txt", "z.txt"], time.time())
    _make_tree(two, ["z.txt", "b/d.txt", "b/c.txt", "a.txt"], time.time() + 1000)
    d1, s1 = write_rootfs_tar(one, tmp_path / "1.tar", EPOCH)
    d2, s2 = write_rootfs_tar(two, tmp_path / "2.tar", EPOCH)
    assert (d1, s1) == (d2, s2)
    with tarfile.open(tmp_path / "1.tar") as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == ["a.txt", "b", "b/c.txt", "b/d.txt", "hard", "link", "z.txt"]
    assert {m.mtime for m in members} == {EPOCH}
    assert all(m.uname == "" and m.gname == "" for m in members)
    assert next(m for m in members if m.name == "hard").islnk()


@pytest.mark.fast
def test_image_id_follows_the_rootfs_tar_and_nothing_else() -> None:
    env = {"PATH": "/usr/bin"}
    a = image_config("numpy", "a" * 64, "b" * 64, EPOCH, env)
    assert image_id(a) == image_id(image_config("numpy", "a" * 64, "b" * 64, EPOCH, dict(env)))
    assert image_id(a) != image_id(image_config("numpy", "c" * 64, "b" * 64, EPOCH, env))
    config = json.loads(a)
    assert config["created"] == "2025-01-01T00:00:00Z"
    assert config["config"]["User"] == "65534:65534"
    assert "RepoTags" not in config and "tag" not in json.dumps(config).lower()


# --------------------------------------------------------------------------- real builds


@pytest.mark.e2e
def test_built_toolchain_carries_its_lock_in_the_image_and_beside_the_store_entry() -> None:
    info = built_toolchain("numpy")
    assert info.platform_value == f"numpy@{info.rootfs.hash}"
    assert info.lock["wheel:numpy"] == "2.4.6"
    assert info.lock["deb:python3"].startswith("3.11")
    with tarfile.open(info.rootfs_tar) as tar:
        in_image = tar.extractfile("etc/rsi/lock.txt").read().decode()
        bad = [
            m.name
            for m in tar.getmembers()
            if m.mtime > info.source_date_epoch
            or m.uname
            or m.name.startswith("var/lib/apt/lists/")
            and m.isfile()
        ]
    assert parse_lock(in_image) == dict(info.lock)
    assert parse_lock((info.path / "lock.txt").read_text()) == dict(info.lock)
    assert bad == []


@pytest.mark.e2e
def test_unchanged_recipe_is_reused_not_rebuilt() -> None:
    info = built_toolchain("numpy")
    started = time.monotonic()
    again = build(DECLARATIONS, test_store_dir(), name="numpy", write_lock=False)
    assert again.cached and again.rootfs == info.rootfs
    assert time.monotonic() - started < 5
    assert (toolchains_root(test_store_dir()) / info.recipe_digest / "rootfs.tar").exists()


@pytest.mark.e2e
def test_rebuilding_from_scratch_gives_the_same_digests(tmp_path: Path) -> None:
    info = built_toolchain("numpy")
    fresh = build(DECLARATIONS, tmp_path / "store", name="numpy", write_lock=False, force=True)
    assert not fresh.cached
    assert fresh.rootfs == info.rootfs
    assert fresh.rootfs_sha256 == info.rootfs_sha256
    assert fresh.image_id == info.image_id
    assert fresh.lock == info.lock


@pytest.mark.e2e
def test_moved_package_gives_a_new_digest_and_names_what_changed() -> None:
    info = built_toolchain("numpy")
    doc = _numpy_doc()
    # NB: an older numpy stands in for "upstream moved": same recipe shape, another version
    doc["wheels"] = [
        {
            "name": "numpy",
            "version": "2.3.5",
            "file": "numpy-2.3.5-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
            "sha256": "8cba086a43d54ca804ce711b2a940b16e452807acebe7852ff327f1ecd49b0d4",
        }
    ]
    try:
        moved = build({**doc, "name": "numpy-moved"}, test_store_dir(), previous_lock=info.lock)
    except Exception as exc:  # noqa: BLE001
        from rsi.toolchain.testing import skip_or_fail

        skip_or_fail(f"cannot build the moved variant here: {exc}")
    assert moved.rootfs != info.rootfs and moved.image_id != info.image_id
    assert moved.changes is not None
    assert moved.changes.changed == (("wheel:numpy", "2.4.6", "2.3.5"),)
    assert moved.changes.packages == ["wheel:numpy"]


@pytest.mark.e2e
def test_torch_toolchain_pins_torch_cpu_and_numpy() -> None:
    info = built_toolchain("torch-cpu")
    assert info.lock["wheel:torch"] == "2.13.0+cpu"
    assert info.lock["wheel:numpy"] == "2.4.6"
    assert info.rootfs != built_toolchain("numpy").rootfs
