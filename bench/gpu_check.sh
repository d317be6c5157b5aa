#!/usr/bin/env bash
# The GPU checks of issue 5, prepared for a session that is lent a device machine (an H200 with
# its own python3 3.12 + CUDA torch; nothing can be fetched there). Here, first:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_17_x86_64 -d .whl blake3==1.0.11 docker==7.1.0
# then run, with `carry: [".whl"]` and a timeout that leaves time for a rerun:
#   bash bench/gpu_check.sh
# It installs rsi (no deps) into that python, runs tests/test_gpu.py for real (CUDA events, the
# L2 flush, bandwidth fraction, fingerprints, both GPU verdicts) and the docker GPU test when an
# engine is there, and leaves the logs and evidence under $OUT. First of all it checks that a
# CUDA worker starts and answers its calls under the seccomp filter (confine.py) in every
# isolation mode this machine has (the own-pid-only filter of uid/process mode included): a
# CUDA start-up the filter refused would fail every GPU verdict. Without a GPU that step and
# the rest say SKIP and the script exits 0.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/rsi-gpu-out}"
mkdir -p "$out"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "SKIP: no NVIDIA GPU here (nvidia-smi missing or sees no device)" | tee "$out/skip.txt"
  exit 0
fi
python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl 2>&1 | tail -2
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.memory --format=csv | tee "$out/gpu.txt"
python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())" \
  | tee -a "$out/gpu.txt"
export PYTHONUNBUFFERED=1
# NB: a CUDA worker under the seccomp filter, one check (its calls) per isolation mode
python3 bench/gpu_seccomp_check.py "$out" 2>&1 | tee "$out/seccomp_cuda.log"
seccomp_rc=${PIPESTATUS[0]}
python3 -m pytest -q -p no:cacheprovider -rs tests/test_gpu.py 2>&1 | tee "$out/test_gpu.log"
rc=${PIPESTATUS[0]}
if [ "$rc" -eq 0 ] && [ "$seccomp_rc" -ne 0 ]; then
  rc=$seccomp_rc
fi
find /tmp -path '*out/tasks/*' -name 'verdict*.json' -newer "$out/gpu.txt" 2>/dev/null \
  | head -4 | while read -r f; do cp "$f" "$out/$(echo "$f" | tr '/' '_' | tail -c 80)"; done
exit "$rc"
