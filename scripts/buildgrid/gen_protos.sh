#!/usr/bin/env bash
# Regenerates rsi/remote/_proto/ (REAPI v2, ByteStream, Remote Workers v1test2 and the Google
# protos they import) with grpcio-tools. The descriptors come from the protos that BuildGrid's
# PyPI package ships (run scripts/buildgrid/setup.sh first); protoc reads them with
# --descriptor_set_in, so no .proto source is vendored. Imports are rewritten to live under
# rsi.remote._proto so that rsi needs only grpcio + protobuf at run time.
#
# NB: grpcio-tools 1.71.0 emits protobuf 5.29 gencode and grpc 1.71 stubs: rsi then needs
# protobuf>=5.29 and grpcio>=1.71, which leaves room for the rest of the environment.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BGD_VENV="${RSI_BUILDGRID_HOME:-/opt/rsi-buildgrid}/venv"
GEN_VENV="${RSI_BUILDGRID_HOME:-/opt/rsi-buildgrid}/gen-venv"
OUT="$ROOT/rsi/remote/_proto"
[ -x "$GEN_VENV/bin/python" ] || python3 -m venv "$GEN_VENV"
"$GEN_VENV/bin/python" -m grpc_tools.protoc --version >/dev/null 2>&1 \
  || "$GEN_VENV/bin/pip" install -q grpcio-tools==1.71.0
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT

"$BGD_VENV/bin/python" - "$TMP/protos.pb" <<'PY'
import sys
from google.protobuf import descriptor_pb2
from buildgrid._protos.build.bazel.remote.execution.v2 import remote_execution_pb2
from buildgrid._protos.google.bytestream import bytestream_pb2
from buildgrid._protos.google.devtools.remoteworkers.v1test2 import bots_pb2

seen, out = set(), descriptor_pb2.FileDescriptorSet()
def add(fd):
    if fd.name in seen:
        return
    seen.add(fd.name)
    for dep in fd.dependencies:
        add(dep)
    proto = descriptor_pb2.FileDescriptorProto()
    fd.CopyToProto(proto)
    out.file.append(proto)
for module in (remote_execution_pb2, bytestream_pb2, bots_pb2):
    add(module.DESCRIPTOR)
open(sys.argv[1], "wb").write(out.SerializeToString())
print("\n".join(f.name for f in out.file))
PY

TARGETS=(
  build/bazel/semver/semver.proto
  build/bazel/remote/execution/v2/remote_execution.proto
  google/bytestream/bytestream.proto
  google/devtools/remoteworkers/v1test2/bots.proto
  google/devtools/remoteworkers/v1test2/worker.proto
  google/longrunning/operations.proto
  google/rpc/status.proto
  google/api/annotations.proto google/api/http.proto
)
rm -rf "$OUT/build" "$OUT/google"
"$GEN_VENV/bin/python" -m grpc_tools.protoc --descriptor_set_in="$TMP/protos.pb" \
  --python_out="$OUT" --grpc_python_out="$OUT" --pyi_out="$OUT" "${TARGETS[@]}"
find "$OUT/build" "$OUT/google" -type d -exec touch {}/__init__.py \;
# Absolute proto imports -> package-relative ones; google.protobuf stays the runtime's.
find "$OUT" -name '*.py' -o -name '*.pyi' | xargs sed -i -E \
  -e 's/^from (build|google\.(api|rpc|longrunning|bytestream|devtools))(\.| )/from rsi.remote._proto.\1\3/' \
  -e 's/^import (build|google\.(api|rpc|longrunning|bytestream|devtools))\./import rsi.remote._proto.\1./'
# Stubs of protos that declare no service are empty.
grep -L '^class ' $(find "$OUT" -name '*_pb2_grpc.py') | xargs -r rm
printf '"""Generated REAPI v2 / ByteStream / Remote Workers stubs: see scripts/buildgrid/gen_protos.sh."""\n' > "$OUT/__init__.py"
echo "generated into $OUT"
