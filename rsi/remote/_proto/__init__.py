"""Generated REAPI v2 / ByteStream / Remote Workers stubs: see scripts/buildgrid/gen_protos.sh."""
