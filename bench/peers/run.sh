#!/usr/bin/env bash
# rsi beside Nix and Bazel on the peers' fan-in graph (../shared/peers), in one run, and a
# table: out/bench/peers.md and out/bench/peers.json. Keep the machine otherwise idle.
#
#   bash bench/peers/run.sh                       # peers and rsi at N=1000; rsi at 10k, 100k
#   PEERS_AT=1000 RSI_AT=1000 bash bench/peers/run.sh
#   PEERS_AT= RSI_AT=100000 MERGE=1 bash bench/peers/run.sh   # rsi alone at 100k, other rows kept
#   PEERS=nix RUNS=5 bash bench/peers/run.sh
#   RSI_TOOLS=rsi-server PEERS_AT= RSI_AT=100000 MERGE=1 bash bench/peers/run.sh
#
# rsi runs three ways: in process (`rsi`), with its build server (`rsi-server`, RSI_SERVER=1,
# rsi/server.py) and with the server watching the sources (`rsi-watch`, RSI_SERVER_WATCH=1),
# each in a workspace of its own; a server is stopped after its row.
#   MERGE=1 RSI_AT=1000 bash bench/peers/run.sh   # redo N=1000, keep the earlier 10k/100k rows
#
# Nix (Debian nix-bin) and Bazel (bazel-bootstrap) are installed with apt-get when missing and
# this runs as root; when that fails the table says "not installed" for them. Workspaces, logs
# and Bazel's output root live under $PEERS_ROOT (default /tmp/peers); the rsi workspaces at
# 10,000 and 100,000 leaves are deleted after their row (about 1.5 GB of small files at 100k).
# Nix's cold scenario runs nix-collect-garbage, which empties /nix/store.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
src="${PEERS_SRC:-$repo/../shared/peers}"
out="${OUT:-$repo/out/bench}"
export PEERS_ROOT="${PEERS_ROOT:-/tmp/peers}"
export RSI_HOST_LOCK="${RSI_HOST_LOCK:-$PEERS_ROOT/rsi-host.lock}"
mkdir -p "$PEERS_ROOT" "$out"
work="$(mktemp -d "$PEERS_ROOT/harness.XXXXXX")"
trap 'rm -rf "$work"' EXIT
cp -r "$src/." "$work/"
cp "$here/gen_rsi.py" "$here/compare.py" "$work/"

note="apt"
need=()
case ",${PEERS:-nix,bazel}," in *,nix,*) command -v nix-build >/dev/null || need+=(nix-bin) ;; esac
case ",${PEERS:-nix,bazel}," in *,bazel,*) command -v bazel >/dev/null || need+=(bazel-bootstrap) ;; esac
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" \
      >"$PEERS_ROOT/apt.log" 2>&1; then
    note="installed by run.sh"
  else
    note="apt-get install ${need[*]} failed, see $PEERS_ROOT/apt.log"
    echo "run.sh: $note; their rows will say so" >&2
  fi
fi
export PEERS_INSTALL_NOTE="$note"
# NB: rsi runs from a copy of rsi/ and rules/ taken now (first on PYTHONPATH, ahead of the
# editable install), so an edit to the tree while this runs cannot invalidate rsi's caches
# mid-run; its bytecode is compiled once, as scripts/setup.sh does (with
# PYTHONDONTWRITEBYTECODE set, every start would compile the engine again)
snap="$work/rsi-snapshot"
mkdir -p "$snap"
cp -r "$repo/rsi" "$repo/rules" "$snap/"
find "$snap" -name __pycache__ -prune -exec rm -rf {} +
"$repo/.venv/bin/python" -m compileall -q "$snap/rsi" >/dev/null || true
"$repo/.venv/bin/python" -m compileall -q -x '/rules/harness/' "$snap/rules" >/dev/null || true
export PYTHONPATH="$snap${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$repo/.venv/bin:$PATH"
cd "$work"
"$repo/.venv/bin/python" compare.py --out "$out" --peers "${PEERS:-nix,bazel}" \
  --peers-at "${PEERS_AT-1000}" --rsi-at "${RSI_AT:-1000,10000,100000}" \
  --rsi-tools "${RSI_TOOLS:-rsi,rsi-server,rsi-watch}" ${MERGE:+--merge}
echo "wrote $out/peers.md and $out/peers.json"
