"""`python -m rsi.toolchain build|show`: build toolchains outside a graph (CI, people).

In a workspace a build builds them itself (`rsi build //toolchains:NAME`, a host step: see
`rsi.toolchain.step`); this is how CI prepares the test store and how a checked-in lock beside a
declaration is refreshed (`build` writes it there; the build step never writes the workspace).
"""

from __future__ import annotations

import argparse
import json
import sys

from rsi.errors import RsiError
from rsi.toolchain import build, find_toolchain, load_declarations


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rsi.toolchain")
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build (or reuse) toolchains; prints info JSON lines")
    b.add_argument("specs", nargs="+", help="BUILD.toml:name, or BUILD.toml for all of it")
    b.add_argument("--store", default="cache", help="the rsi store root (default: cache)")
    b.add_argument("--cache-dir", default=None, help="download cache for .debs and wheels")
    b.add_argument("--force", action="store_true", help="rebuild even when cached")
    b.add_argument(
        "--load-image",
        action="store_true",
        help="also load each image into the local Docker engine",
    )
    s = sub.add_parser("show", help="print the info of a built toolchain by platform value")
    s.add_argument("platform_value", help="<name>@<rootfs hex>")
    s.add_argument("--store", default="cache")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "show":
            print(json.dumps(find_toolchain(args.store, args.platform_value).to_json(), indent=1))
            return 0
        for spec in args.specs:
            path, _, name = spec.partition(":")
            names = [name] if name else sorted(load_declarations(path))
            for n in names:
                info = build(path, args.store, name=n, cache_dir=args.cache_dir, force=args.force)
                doc = {
                    **info.to_json(),
                    "cached": info.cached,
                    "changes": info.changes.to_json() if info.changes else None,
                }
                doc.pop("lock")
                if args.load_image:
                    import docker

                    from rsi.toolchain.image import ensure_loaded

                    ensure_loaded(
                        docker.from_env(), info.image_config, info.rootfs_tar, info.rootfs_sha256
                    )
                print(json.dumps(doc, sort_keys=True), flush=True)
    except RsiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
