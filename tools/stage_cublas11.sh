#!/usr/bin/env bash
# cuBLAS 11 for TensorRT 8.5 on the lent GPU machine.
#
# TensorRT 8.5's Myelin backend (which compiles transformer subgraphs such as MiniLM's attention and
# embeddings) refuses any cuBLASLt but the 11.x it was built against ("Myelin compiler is built against
# cuBLASLt 11.11.3.0 but compiling graph against cuBLASLt 13.1.0.0"), and the machine has only CUDA 13.
# PyPI's nvidia-cublas-cu11 wheel (418 MB) travels in parts of 60 MiB, one device call each:
#
#   here:    bash tools/stage_cublas11.sh pack          -> .devcache/cublas/part00.. (git-ignored)
#   device:  bash tools/stage_cublas11.sh unpack        (carry .devcache/cublas/partNN and MANIFEST)
#            prints READY once /tmp/cublas11/libcublas{,Lt}.so.11 exist; then
#            export LD_LIBRARY_PATH=/tmp/cublas11:$LD_LIBRARY_PATH
set -euo pipefail
cd "$(dirname "$0")/.."
stage=.devcache/cublas
case ${1:-} in
  pack)
    rm -rf "$stage" && mkdir -p "$stage"
    pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 --python-version 3.10 \
        "nvidia-cublas-cu11==11.11.3.6" -d "$stage/dl"
    ( cd "$stage" && split -b 62914560 -d -a 2 dl/*.whl part && rm -rf dl && ls part?? | wc -l > MANIFEST )
    echo "staged $(cat $stage/MANIFEST) parts in $stage" ;;
  unpack)
    keep=/tmp/cublas11-parts; mkdir -p "$keep"
    [ -f /tmp/cublas11/libcublasLt.so.11 ] && { echo "READY (already)"; exit 0; }
    cp "$stage"/part?? "$keep"/ 2>/dev/null || true
    n=$(cat "$stage/MANIFEST"); have=$(ls "$keep" | wc -l)
    [ "$have" -lt "$n" ] && { echo "have $have of $n parts"; exit 0; }
    cat "$keep"/part?? > /tmp/cublas11.whl && rm -rf "$keep"
    mkdir -p /tmp/cublas11
    python3 - <<'PY'
import zipfile, os
with zipfile.ZipFile("/tmp/cublas11.whl") as z:
    for name in ("libcublas.so.11", "libcublasLt.so.11"):
        with z.open(f"nvidia/cublas/lib/{name}") as src, open(f"/tmp/cublas11/{name}", "wb") as dst:
            dst.write(src.read())
PY
    rm -f /tmp/cublas11.whl
    echo "READY: export LD_LIBRARY_PATH=/tmp/cublas11:\$LD_LIBRARY_PATH" ;;
  *) echo "usage: $0 pack|unpack" >&2; exit 2 ;;
esac
