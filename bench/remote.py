"""Remote cache benchmark against a local BuildGrid 0.4.4 (started here on a loopback port):

  * cache-hit latency: GetActionResult + fetch of a small result into a fresh store;
  * blob throughput: upload and download of one 64 MiB blob (ByteStream) and of 2,000
    4 KiB blobs (batches);
  * a fully cached graph built by a fresh workspace from the remote cache (`rsi build`), as
    wall time next to the same build served from its own local store.

    python bench/remote.py [--json]

Needs scripts/buildgrid/setup.sh. Numbers are wall times on this machine; they are never
asserted in tests.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts" / "buildgrid"))

import servers

from rsi.action import Action
from rsi.digest import FileNode, digest_bytes
from rsi.executors.local import LocalExecutor
from rsi.remote import RemoteCache, RemoteClient, RemoteConfig, RemoteSession
from rsi.store import LocalStore


def cache_hit_latency(url: str, tmp: Path, n: int = 50) -> dict:
    producer = LocalStore(tmp / "producer", "sha256")
    action = Action(
        argv=("sh", "-c", "cat in.txt > out.txt"),
        inputs=(("in.txt", FileNode(producer.put_bytes(b"bench\n"))),),
        outputs=("out.txt",),
        digest_function="sha256",
    )
    result = LocalExecutor().run(action, producer)
    RemoteCache(RemoteSession(RemoteConfig(url), producer)).put(action, result, producer)
    times = []
    for i in range(n):
        store = LocalStore(tmp / f"consumer-{i}", "sha256")
        cache = RemoteCache(RemoteSession(RemoteConfig(url), store))
        cache.session.check()
        t0 = time.perf_counter()
        assert cache.get(action, store) is not None
        times.append(time.perf_counter() - t0)
    return {
        "n": n,
        "median_ms": round(statistics.median(times) * 1e3, 2),
        "p90_ms": round(sorted(times)[int(n * 0.9) - 1] * 1e3, 2),
    }


def throughput(url: str, tmp: Path) -> dict:
    big = os.urandom(64 << 20)
    small = [os.urandom(4096) for _ in range(2000)]
    with RemoteClient(url) as client:
        client.capabilities()
        big_digest = digest_bytes(big, "sha256")
        t0 = time.perf_counter()
        client.upload({big_digest: big})
        up_big = time.perf_counter() - t0
        store = LocalStore(tmp / "dl", "sha256")
        t0 = time.perf_counter()
        client.download_to_store([big_digest], store)
        down_big = time.perf_counter() - t0
        blobs = {digest_bytes(b, "sha256"): b for b in small}
        t0 = time.perf_counter()
        client.upload(blobs)
        up_small = time.perf_counter() - t0
        t0 = time.perf_counter()
        client.download_to_store(list(blobs), store)
        down_small = time.perf_counter() - t0
    mb = len(big) / 1e6
    return {
        "bytestream_64MiB_up_MBps": round(mb / up_big, 1),
        "bytestream_64MiB_down_MBps": round(mb / down_big, 1),
        "batch_2000x4KiB_up_blobs_per_s": round(2000 / up_small),
        "batch_2000x4KiB_down_blobs_per_s": round(2000 / down_small),
    }


def _rsi_build(ws: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "rsi.cli", "build", "//:all"],
        cwd=ws,
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - t0


def cached_graph_from_remote(url: str, tmp: Path, width: int = 40) -> dict:
    build = []
    for i in range(width):
        build.append(
            f'[leaf{i}]\nrule = "command"\nouts = ["l{i}.txt"]\ncmd = "echo {i} > $(OUT)"\n'
        )
    deps = ", ".join(f'":leaf{i}"' for i in range(width))
    build.append(
        f'[top]\nrule = "command"\nouts = ["top.txt"]\ndeps = [{deps}]\n'
        'cmd = "cat $(SRCS) > $(OUT)"\n'
    )
    config = f'[workspace]\ndigest_function = "sha256"\nremote = "{url}"\n'
    walls = {}
    for name in ("first", "fresh"):
        ws = tmp / name
        ws.mkdir()
        (ws / "rsi.toml").write_text(config)
        (ws / "BUILD.toml").write_text("\n".join(build))
        walls[name] = _rsi_build(ws)
    walls["fresh_again_local"] = _rsi_build(tmp / "fresh")
    return {
        "actions": width + 1,
        "first_build_s": round(walls["first"], 3),
        "fresh_workspace_from_remote_s": round(walls["fresh"], 3),
        "same_workspace_local_hits_s": round(walls["fresh_again_local"], 3),
    }


def _mk(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, servers.BuildGridServer("cache") as server:
        tmp_path = Path(tmp)
        report = {
            "server": "BuildGrid 0.4.4 (in-memory CAS/AC, loopback)",
            "cache_hit": cache_hit_latency(server.url, _mk(tmp_path / "hit")),
            "throughput": throughput(server.url, _mk(tmp_path / "tp")),
            "cached_graph": cached_graph_from_remote(server.url, _mk(tmp_path / "graph")),
        }
    if "--json" in sys.argv:
        print(json.dumps(report, indent=1))
    else:
        for section, values in report.items():
            print(f"{section}: {values}")


if __name__ == "__main__":
    main()
