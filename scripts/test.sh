#!/usr/bin/env bash
# Set up everything the tests need (packages, venv, Docker engine, toolchains, BuildGrid) and run
# the whole suite. `.ci/run` calls exactly this. pytest's "no tests collected" (5) is a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --test || exit 1
for extra in scripts/ci-docker.sh scripts/buildgrid/setup.sh; do
  if [ -x "$extra" ]; then
    "$extra" || { echo "test.sh: $extra failed" >&2; exit 1; }
  fi
done
# NB: CI must exercise the real sandboxes; an unavailable one fails instead of skipping
export RSI_REQUIRE_SANDBOXES="${RSI_REQUIRE_SANDBOXES:-1}"
export RSI_REQUIRE_BUILDGRID="${RSI_REQUIRE_BUILDGRID:-1}"
.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" = 5 ]; then
  echo "test.sh: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit "$rc"
