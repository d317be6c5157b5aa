#!/usr/bin/env bash
# Time rsi with the peers' own harness on their fan-in graph (N=100 and N=1000), then print
# rsi's medians beside the peers' recorded ones. Keep the machine otherwise idle.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
src="${PEERS_SRC:-$repo/../shared/peers}"
work="$(mktemp -d)/peers"
cp -r "$src" "$work"
cp "$here/gen_rsi.py" "$work/"
export PATH="$repo/.venv/bin:$PATH"
cd "$work"
for n in ${SIZES:-100 1000}; do
  "$repo/.venv/bin/python" bench.py rsi "$n" --runs "${RUNS:-5}"
done
"$repo/.venv/bin/python" - "$work" <<'PY'
import json, sys, pathlib
res = pathlib.Path(sys.argv[1]) / "results"
for f in sorted(res.glob("*.json")):
    d = json.loads(f.read_text())
    cells = {k: v.get("median") for k, v in d.get("scenarios", d).items() if isinstance(v, dict) and "median" in v}
    print(f.stem, json.dumps({k: round(v, 3) for k, v in cells.items()}))
PY
