"""The Docker image of a toolchain, derived from its rootfs tar alone.

The image archive (docker-archive: manifest.json, config, one layer = the rootfs tar) is written
by rsi, with a fixed config and `created` = SOURCE_DATE_EPOCH and no tag, so the same tar always
yields the same `sha256:` image ID. Containers start by that ID, never by a tag.
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

SANDBOX_USER = "65534:65534"


def image_config(
    name: str, rootfs_sha256: str, rootfs_blake3: str, epoch: int, env: dict[str, str]
) -> bytes:
    created = datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "config": {
            "Env": [f"{k}={v}" for k, v in sorted(env.items())],
            "User": SANDBOX_USER,
            "WorkingDir": "/",
            "Labels": {"rsi.toolchain": f"{name}@{rootfs_blake3}"},
        },
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{rootfs_sha256}"]},
        "history": [{"created": created, "created_by": f"rsi toolchain {name}"}],
    }
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def image_id(config: bytes) -> str:
    return "sha256:" + hashlib.sha256(config).hexdigest()


def _member(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, 0
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def _pad(size: int) -> bytes:
    return b"\0" * (-size % tarfile.BLOCKSIZE)


def image_archive(
    config: bytes, rootfs_tar: Path, rootfs_sha256: str, chunk: int = 1 << 20
) -> Iterator[bytes]:
    """Stream a docker-archive for `docker load` without copying the rootfs tar."""
    config_name = image_id(config).split(":", 1)[1] + ".json"
    layer_name = f"{rootfs_sha256}/layer.tar"
    manifest = json.dumps(
        [{"Config": config_name, "RepoTags": None, "Layers": [layer_name]}]
    ).encode()
    for name, data in ((config_name, config), ("manifest.json", manifest)):
        yield _member(name, len(data)) + data + _pad(len(data))
    size = os.path.getsize(rootfs_tar)
    yield _member(layer_name, size)
    with open(rootfs_tar, "rb") as f:
        while block := f.read(chunk):
            yield block
    yield _pad(size) + b"\0" * (2 * tarfile.BLOCKSIZE)


def ensure_loaded(client, config: bytes, rootfs_tar: Path, rootfs_sha256: str) -> str:
    """The image ID, loading the image into the engine if it is not there yet."""
    import docker.errors

    wanted = image_id(config)
    try:
        client.images.get(wanted)
        return wanted
    except docker.errors.ImageNotFound:
        pass
    stream = client.api.load_image(image_archive(config, rootfs_tar, rootfs_sha256), quiet=True)
    for _ in stream or ():
        pass
    try:
        client.images.get(wanted)
    except docker.errors.ImageNotFound:
        raise RuntimeError(
            f"docker load did not produce {wanted}; the engine may use an image store that "
            "derives IDs differently"
        ) from None
    return wanted


__all__ = ["SANDBOX_USER", "ensure_loaded", "image_archive", "image_config", "image_id"]
