#!/usr/bin/env bash
# Idempotent set-up of a fresh machine for rsi: system packages, the virtual environment with
# rsi installed (editable) and, with --test, what the test suite needs. Safe to run again.
# Plain set-up covers the README's commands: the sandbox (bubblewrap) and building a pinned
# toolchain (mmdebstrap; `rsi build //toolchains:numpy`, `//tasks/softmax:verdict_in_toolchain`).
# --print-packages only prints the Debian packages this machine still lacks, and exits.
set -euo pipefail
cd "$(dirname "$0")/.."
want_test=0
print_only=0
for arg in "$@"; do
  case "$arg" in
    --test) want_test=1 ;;
    --print-packages) print_only=1 ;;
    *) echo "setup: unknown argument $arg (use --test, --print-packages)" >&2; exit 2 ;;
  esac
done

need_apt=()
command -v bwrap >/dev/null || need_apt+=(bubblewrap)
command -v mmdebstrap >/dev/null || need_apt+=(mmdebstrap)
if [ "$want_test" = 1 ]; then
  command -v dockerd >/dev/null || need_apt+=(docker.io)
  # NB: the dashboard's browser test drives Debian's chromium (playwright's own download
  # needs the network at test time)
  command -v chromium >/dev/null || need_apt+=(chromium)
  # NB: the Slurm executor's tests start a one-node cluster of their own on loopback
  for bin in slurmctld slurmd munged sbatch; do
    command -v "$bin" >/dev/null || { need_apt+=(slurmctld slurmd munge slurm-client); break; }
  done
fi
if [ "$print_only" = 1 ]; then
  echo "${need_apt[*]}"
  exit 0
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "setup: installing ${need_apt[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q "${need_apt[@]}" >/dev/null
  else
    echo "setup: please install ${need_apt[*]} (not root, cannot apt-get)" >&2
  fi
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip
fi
# NB: `mcp` too, so `rsi mcp` works from the environment the main job sets up; the judge's
# identity covers only what its steps import (rules/step_imports.py), so it does not move
extras="torch,mcp"
[ "$want_test" = 1 ] && extras="test"
stamp=".venv/.rsi-installed-$extras-compat-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  # NB: torch is pinned to 2.13.0 in pyproject.toml; an unpinned torch pulls a multi-GB CUDA build.
  # `compat`: the checkout on sys.path through a plain .pth line; the default editable mode
  # imports a finder module (and pathlib) at every interpreter start, ~15 ms of each `rsi` and
  # of each harness action. Setuptools calls compat transitional: without it, the default.
  .venv/bin/pip install -q -e ".[$extras]" --config-settings editable_mode=compat 2>/dev/null \
    || .venv/bin/pip install -q -e ".[$extras]"
  touch "$stamp"
fi
# NB: the C stat loop of the state's check (rsi/native.py; where it cannot be built, rsi runs
# the same loop in Python, ~3x slower at 100,000 sources)
.venv/bin/python -m rsi.native build >/dev/null || true
# NB: an editable install leaves rsi's own modules uncompiled, and with PYTHONDONTWRITEBYTECODE
# set (as in some CI shells) every `rsi` start would compile them again; compile them once here
# (rules/harness is left alone: it is copied into prepared packages, which refuse bytecode),
# as pip does for the packages it installs. Bytecode is git-ignored and never part of a key.
.venv/bin/python -m compileall -q rsi >/dev/null \
  && .venv/bin/python -m compileall -q -x '/rules/harness/' rules >/dev/null || true
