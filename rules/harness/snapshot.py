"""Copy a candidate's (or a frozen baseline's) files to declared outputs, so the snapshot is kept by
`rsi cache gc` and readable under out/ like any other evidence. Stdlib only. It must never change a
byte it copies."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--from", dest="src", required=True, type=Path)
    ap.add_argument("--to", dest="dest", required=True, type=Path)
    args = ap.parse_args()
    try:
        for dirpath, _, filenames in os.walk(args.src):
            for name in filenames:
                src = Path(dirpath) / name
                dest = args.dest / src.relative_to(args.src)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dest)
                os.chmod(dest, 0o755 if os.access(src, os.X_OK) else 0o644)
    except OSError as exc:
        print(f"rsi harness fault (snapshot): {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
