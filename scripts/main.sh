#!/usr/bin/env bash
# The main job on the embedded default (local store under cache/, local sandboxed executor, no
# server): build the verdict of the softmax task's example candidate and print its table.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/rsi build //tasks/softmax:verdict "$@"
