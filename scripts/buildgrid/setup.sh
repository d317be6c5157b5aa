#!/usr/bin/env bash
# Installs what rsi's remote tests and benchmarks need, idempotently:
#   - PostgreSQL (Debian's package) for BuildGrid's execution scheduler;
#   - BuildGrid 0.4.4 (the newest release that installs on Python 3.11) in its own venv at
#     $RSI_BUILDGRID_HOME/venv (default /opt/rsi-buildgrid), so its grpc/protobuf never meet
#     rsi's environment.
# Safe to run again: each step checks before it installs. Needs root for apt-get.
set -euo pipefail
HOME_DIR="${RSI_BUILDGRID_HOME:-/opt/rsi-buildgrid}"
PY="${RSI_BUILDGRID_PYTHON:-python3}"

if [ ! -x /usr/lib/postgresql/15/bin/postgres ] && ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq postgresql >/dev/null
  # NB: the tests start their own cluster on a free loopback port; the packaged one stays off.
  service postgresql stop >/dev/null 2>&1 || true
fi

if ! "$HOME_DIR/venv/bin/bgd" --help >/dev/null 2>&1; then
  mkdir -p "$HOME_DIR"
  "$PY" -m venv "$HOME_DIR/venv"
  "$HOME_DIR/venv/bin/pip" install -q --disable-pip-version-check \
    "buildgrid[database]==0.4.4" 2>&1 | grep -v "is ignored" || true
fi
"$HOME_DIR/venv/bin/bgd" --help >/dev/null
echo "BuildGrid ready: $HOME_DIR/venv/bin/bgd ($("$HOME_DIR/venv/bin/pip" show buildgrid 2>/dev/null | sed -n 's/^Version: //p'))"
