"""Per-action overhead of the docker and bwrap executors, against their bare baselines.

One run measures, interleaved round by round on the same command in the same toolchain:
  bare-subprocess  subprocess.run of the command on the host (no sandbox, no store)
  local-per-action LocalExecutor.run on the host, one bwrap per action (as for non-root users)
  local-persistent LocalExecutor.run on the host, a persistent slot (root only)
  bwrap            BwrapExecutor.run of the equivalent Action (inputs, outputs, store)
  bare-docker      `docker run --rm --network none <image id> <command>` (the CLI, no store)
  bare-docker-sdk  the same through the Docker SDK (`containers.run(..., remove=True)`)
  docker           DockerExecutor.run of the equivalent Action
and reports medians and the ratios docker/bare-docker and bwrap/bare-subprocess.

    python bench/executor_overhead.py [--rounds 20] [--toolchain numpy] [--store DIR]

Writes out/bench/executor_overhead.json. Needs root (to build the toolchain) and a Docker engine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rsi.action import Action
from rsi.digest import FileNode
from rsi.executors.base import host_facts
from rsi.executors.bwrap import BwrapExecutor
from rsi.executors.docker import DockerExecutor
from rsi.executors.local import LocalExecutor
from rsi.executors.pool import pool_supported
from rsi.store import LocalStore
from rsi.toolchain import build
from rsi.toolchain.testing import DECLARATIONS, test_store_dir

# NB: /bin/true isolates the per-action cost; the action still has one input and one output
SCRIPT = b"#!/bin/sh\necho done > out/result\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--toolchain", default="numpy")
    parser.add_argument("--store", default=None)
    parser.add_argument("--out", default=str(REPO / "out" / "bench" / "executor_overhead.json"))
    args = parser.parse_args()

    store = LocalStore(args.store or test_store_dir())
    info = build(DECLARATIONS, store.root, name=args.toolchain, write_lock=False)
    docker_ex, bwrap_ex = DockerExecutor(), BwrapExecutor()
    script = store.put_bytes(SCRIPT)
    action = Action(
        argv=("/bin/sh", "src/run.sh"),
        inputs=(("src/run.sh", FileNode(script, True)),),
        outputs=("out/result",),
        platform=(("toolchain", info.platform_value),),
        timeout_s=60,
    )
    image = docker_ex.image_for(info)
    bare_dir = store.scratch_dir("bench-")
    (bare_dir / "out").mkdir()
    (bare_dir / "run.sh").write_bytes(SCRIPT)

    def bare_subprocess() -> None:
        subprocess.run(["/bin/sh", "run.sh"], cwd=bare_dir, check=True)

    def bare_docker() -> None:
        subprocess.run(
            [
                "docker",
                "run",
                "--rm",
                "--network",
                "none",
                image,
                "/bin/sh",
                "-c",
                "echo done > /tmp/result",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )

    def bare_docker_sdk() -> None:
        docker_ex.client.containers.run(
            image, ["/bin/sh", "-c", "echo done > /tmp/result"], network_mode="none", remove=True
        )

    def via(executor):
        def run() -> None:
            result = executor.run(action, store)
            assert result.ok, result.failure

        return run

    # the host executor on the same script, with no toolchain: one bwrap per action, and the
    # persistent slot (root only) that reuses one sandbox for every action of a job slot
    host_action = Action(
        argv=("/bin/sh", "src/run.sh"),
        inputs=(("src/run.sh", FileNode(script, True)),),
        outputs=("out/result",),
        env=(("PATH", "/usr/bin:/bin"),),
        timeout_s=60,
    )

    def via_host(executor):
        def run() -> None:
            result = executor.run(host_action, store)
            assert result.ok, result.failure

        return run

    cases = {
        "bare-subprocess": bare_subprocess,
        "local-per-action": via_host(LocalExecutor(pool=False)),
        **({"local-persistent": via_host(LocalExecutor(pool=True))} if pool_supported() else {}),
        "bwrap": via(bwrap_ex),
        "bare-docker": bare_docker,
        "bare-docker-sdk": bare_docker_sdk,
        "docker": via(docker_ex),
    }
    for fn in cases.values():  # warm-up: image load, rootfs extraction, page cache
        fn()
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)

    med = {name: statistics.median(s) for name, s in samples.items()}
    report = {
        "schema": "rsi.bench.executor_overhead/1",
        "rounds": args.rounds,
        "toolchain": info.platform_value,
        "image": image,
        "host": {
            **host_facts(),
            "python": platform.python_version(),
            "docker_server": docker_ex._server,
        },
        "median_s": med,
        "min_s": {name: min(s) for name, s in samples.items()},
        "ratios": {
            "docker_vs_bare_docker": med["docker"] / med["bare-docker"],
            "docker_vs_bare_docker_sdk": med["docker"] / med["bare-docker-sdk"],
            "bwrap_vs_bare_subprocess": med["bwrap"] / med["bare-subprocess"],
            "local_per_action_vs_bare_subprocess": med["local-per-action"] / med["bare-subprocess"],
            **(
                {
                    "local_persistent_vs_bare_subprocess": med["local-persistent"]
                    / med["bare-subprocess"]
                }
                if "local-persistent" in med
                else {}
            ),
            "bwrap_vs_bare_docker": med["bwrap"] / med["bare-docker"],
        },
        "overhead_s": {
            "docker_minus_bare_docker": med["docker"] - med["bare-docker"],
            "bwrap_minus_bare_subprocess": med["bwrap"] - med["bare-subprocess"],
        },
        "samples_s": samples,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{'case':<20}{'median ms':>11}{'min ms':>9}")
    for name in cases:
        print(f"{name:<20}{med[name] * 1e3:>11.1f}{report['min_s'][name] * 1e3:>9.1f}")
    for name, value in report["ratios"].items():
        print(f"{name:<28}{value:>8.2f}x")
    print(f"wrote {os.path.relpath(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
