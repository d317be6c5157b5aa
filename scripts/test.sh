#!/usr/bin/env bash
# Set up everything the tests need (packages, venv, Docker engine, toolchains, BuildGrid) and run
# the whole suite. `.ci/run` calls exactly this. pytest's "no tests collected" (5) is a failure.
# Arguments go to pytest. With `-m fast` (or `-m "not e2e"`) only the unit tests run, and the
# set-up stops at the venv: no Docker engine, toolchain images or BuildGrid (only e2e tests use
# them).
# Services this run starts (dockerd and its containerd, BuildGrid servers and their PostgreSQL)
# are stopped when it ends, however it ends; ones already running before it started are left.
set -uo pipefail
cd "$(dirname "$0")/.."

# NB: everything this run starts inherits RSI_TEST_RUN_ID; at exit, whatever still carries it
# is a leftover of this run and is stopped (scripts/stop-run-services.py)
RSI_TEST_RUN_ID="$$-$(date +%s%N)"
export RSI_TEST_RUN_ID
stop_started_services() {
  python3 scripts/stop-run-services.py "$RSI_TEST_RUN_ID" || true
}
trap stop_started_services EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The marker expression pytest is given (the last -m wins, as in pytest).
markexpr=""
prev=""
for arg in "$@"; do
  if [ "$prev" = "-m" ]; then
    markexpr="$arg"
  else
    case "$arg" in
      -m=*) markexpr="${arg#-m=}" ;;
      -m?*) markexpr="${arg#-m}" ;;
    esac
  fi
  prev="$arg"
done
markexpr="$(echo "$markexpr" | tr -s '[:space:]' ' ' | sed 's/^ //; s/ $//')"
only_fast=0
case "$markexpr" in
  fast | "not e2e") only_fast=1 ;;
esac

./scripts/setup.sh --test || exit 1
if [ "$only_fast" = 0 ]; then
  for extra in scripts/ci-docker.sh scripts/buildgrid/setup.sh scripts/setup_serving.sh; do
    if [ -x "$extra" ]; then
      "$extra" || { echo "test.sh: $extra failed" >&2; exit 1; }
    fi
  done
fi
# NB: CI must exercise the real sandboxes; an unavailable one fails instead of skipping
export RSI_REQUIRE_SANDBOXES="${RSI_REQUIRE_SANDBOXES:-1}"
export RSI_REQUIRE_BUILDGRID="${RSI_REQUIRE_BUILDGRID:-1}"
export RSI_REQUIRE_SLURM="${RSI_REQUIRE_SLURM:-1}"
# NB: the 30 slowest tests at the end of the report: CI has 90 minutes and the suite ~60
.venv/bin/python -m pytest --durations=30 "$@"
rc=$?
if [ "$rc" = 5 ]; then
  echo "test.sh: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit "$rc"
