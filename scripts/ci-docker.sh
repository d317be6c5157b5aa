#!/usr/bin/env bash
# Prepare the sandboxed executors for tests, idempotently: system packages (docker.io, mmdebstrap,
# bubblewrap), a running Docker engine, the docker SDK in .venv, and the declared toolchains
# built into the test store and loaded into the engine. A toolchain whose recipe digest is
# already in the store is reused, not rebuilt; downloaded .debs and wheels stay in
# $RSI_TOOLCHAIN_CACHE (default /var/cache/rsi-toolchains) for later runs.
set -euo pipefail
cd "$(dirname "$0")/.."
export RSI_TOOLCHAIN_CACHE="${RSI_TOOLCHAIN_CACHE:-/var/cache/rsi-toolchains}"
export RSI_TEST_STORE="${RSI_TEST_STORE:-$RSI_TOOLCHAIN_CACHE/store}"
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3

if [ "$(id -u)" != 0 ]; then
  echo "ci-docker: not root; cannot start dockerd or build toolchains (tests will skip)" >&2
  exit 0
fi

need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v bwrap >/dev/null || need+=(bubblewrap)
command -v newuidmap >/dev/null || need+=(uidmap)
if [ ${#need[@]} -gt 0 ]; then
  echo "ci-docker: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  echo "ci-docker: starting dockerd" >&2
  # NB: no bridge and no iptables: actions run with --network none, and CI hosts often forbid both
  nohup dockerd --iptables=false --bridge=none >/tmp/rsi-dockerd.log 2>&1 &
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && break
    sleep 0.5
  done
  docker info >/dev/null 2>&1 || { echo "ci-docker: dockerd did not start:" >&2;
                                   tail -20 /tmp/rsi-dockerd.log >&2; exit 1; }
fi

"$PY" -c "import docker" 2>/dev/null || "$PY" -m pip install -q "docker>=7.1"

mkdir -p "$RSI_TOOLCHAIN_CACHE" "$RSI_TEST_STORE"
started=$(date +%s)
"$PY" -m rsi.toolchain build toolchains/BUILD.toml --store "$RSI_TEST_STORE" --load-image \
  | "$PY" -c 'import json, sys
for line in sys.stdin:
    d = json.loads(line)
    state = "reused" if d["cached"] else "built in %ss" % d["build_s"]
    print("ci-docker: %s %s, image %s" % (d["platform"], state, d["image_id"][:19]), file=sys.stderr)'
echo "ci-docker: toolchains ready in $(( $(date +%s) - started ))s (store $RSI_TEST_STORE)" >&2
