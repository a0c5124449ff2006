#!/usr/bin/env bash
# Stage, here, what the Triton steps of tools/device_trt.sh (triton-native, triton:STAGES) need on the lent GPU
# machine beyond the TensorRT staging (../shared/device/stage-trt.sh) and the e2e payload, in pieces that ride
# in the device calls (benchmarks/README.md, "Triton on the GPU machine"):
#   - nvidia-pytriton 0.7.0's tritonserver (Triton 2.51, what the backend is built for): its wheel is
#     manylinux_2_35, which stage-trt.sh's platforms do not take. Only what that server, its Python backend with
#     the Python 3.10 stub, and our backend load is kept (the stubs of other Pythons and libpython3.13 go);
#   - cp310 packages the staging lacks: tritonclient with grpcio and python-rapidjson (its gRPC client imports
#     both; protobuf and numpy are staged), onnxruntime (the tests calibrate their toy model with it), and
#     exceptiongroup (pytest on Python 3.10; stage-trt.sh resolved pytest's needs for the host's Python);
#   - numpy 1.26 in a folder of its own (numpy1/): Triton 2.51's Python backend stub answers empty outputs with
#     the staging's numpy 2 (no error: LoadGen then reads nothing); device_trt.sh puts it first for the steps that
#     serve through that backend (triton:triton-*, gpu-test). The TensorRT backend has no Python in the server;
#   - Triton's TensorRT backend as `trtfuse triton build-backend` built it (tensorrt/ of its folder);
#   - EfficientNet-Lite0's int8 model of the e2e bundle (bench triton's native-accuracy; the payload has
#     ResNet-50 only).
# Run from the checkout root, after `trtfuse triton build-backend` and `trtfuse bench bundle prepare`:
#   bash tools/stage_triton.sh [OUT]        # OUT: .devcache/triton
# Environment: TRTFUSE_TRITON_BACKEND_DIR (the backend's build folder, default build/triton_backend),
# LITE0 (the model folder, default .devcache/e2e/models/efficientnet-lite0), FIRST_PIECE and PIECE (bytes of
# piece00 and of each later piece).
# Writes OUT/piece00.., OUT/MANIFEST (piece count, sha256 of the whole) and OUT/unpack.sh (tools/triton_unpack.sh).
set -euo pipefail
ROOT=$(pwd)
OUT=${1:-$ROOT/.devcache/triton}
BACKEND=${TRTFUSE_TRITON_BACKEND_DIR:-$ROOT/build/triton_backend}
LITE0=${LITE0:-$ROOT/.devcache/e2e/models/efficientnet-lite0}
FIRST_PIECE=${FIRST_PIECE:-26000000}   # rides beside the payload's 32 MB piece06 (benchmarks/README.md)
PIECE=${PIECE:-40000000}
WORK=${TMPDIR:-/tmp}/triton-stage-work
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tools/pieces.sh
source "$HERE/pieces.sh"
PYTRITON=nvidia-pytriton==0.7.0
NUMPY1=numpy==1.26.4
WHEELS=(tritonclient==2.73.0 grpcio==1.85.3 python-rapidjson==1.25 onnxruntime==1.23.2 exceptiongroup==1.3.2)
PIPOPTS=(--no-deps --only-binary=:all: --python-version 3.10 --implementation cp
         --platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
         --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)

die() { echo "stage_triton: $*" >&2; exit 2; }
lib=$BACKEND/tensorrt/libtriton_tensorrt.so
[ -f "$lib" ] && [ -f "$BACKEND/tensorrt/BUILD.json" ] || die "no built backend in $BACKEND/tensorrt: run \`trtfuse triton build-backend\` first (or set TRTFUSE_TRITON_BACKEND_DIR)"
[ -f "$LITE0/model.json" ] || die "no EfficientNet-Lite0 model in $LITE0: run \`trtfuse bench bundle prepare\` (or set LITE0)"
for tool in readelf zstd pip; do command -v $tool > /dev/null || die "$tool is not installed"; done

rm -rf "$WORK"
mkdir -p "$WORK/dl" "$WORK/root/triton/site-packages" "$WORK/root/triton/backend/tensorrt" "$WORK/root/triton/e2e/models"
echo "== pip download (cp310): $PYTRITON ${WHEELS[*]} $NUMPY1"
pip download -q "${PIPOPTS[@]}" -d "$WORK/dl" "$PYTRITON" "${WHEELS[@]}"
sp=$WORK/root/triton/site-packages
for w in "$WORK"/dl/*.whl; do python3 -m zipfile -e "$w" "$sp/"; done
pip download -q "${PIPOPTS[@]}" -d "$WORK/dl-numpy1" "$NUMPY1"
python3 -m zipfile -e "$WORK"/dl-numpy1/numpy-*.whl "$WORK/root/triton/numpy1/"

echo "== nvidia-pytriton: the server, its Python backend and the Python 3.10 stub"
stubs=$sp/pytriton/tritonserver/python_backend_stubs
chmod +x "$sp"/pytriton/tritonserver/bin/* "$stubs"/*/*   # zipfile drops the executable bits
find "$stubs" -mindepth 1 -maxdepth 1 ! -name 3.10 -exec rm -rf {} +
# pytriton's own Python code is not used (trtfuse finds the server through the package's folder)
find "$sp/pytriton" -mindepth 1 -maxdepth 1 ! -name tritonserver ! -name __init__.py -exec rm -rf {} +
libs=$sp/nvidia_pytriton.libs
# What the loader needs, transitively, from nvidia_pytriton.libs: every other library there goes.
roots=("$sp/pytriton/tritonserver/bin/tritonserver" "$sp/pytriton/tritonserver/backends/python/libtriton_python.so"
       "$stubs/3.10/triton_python_backend_stub" "$sp"/pytriton/tritonserver/caches/*/*.so "$lib")
declare -A keep=()
todo=("${roots[@]}")
while [ ${#todo[@]} -gt 0 ]; do
    f=${todo[0]}; todo=("${todo[@]:1}")
    for n in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
        if [ -f "$libs/$n" ] && [ -z "${keep[$n]:-}" ]; then keep[$n]=1; todo+=("$libs/$n"); fi
    done
done
for f in "$libs"/*; do [ -n "${keep[$(basename "$f")]:-}" ] || { echo "  dropped $(basename "$f")"; rm -f "$f"; }; done
for n in $(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(lib\(tritonserver\|cudart\)[^]]*\)\]/\1/p'); do
    [ -f "$libs/$n" ] || die "the backend in $BACKEND needs $n, which $PYTRITON does not have: rebuild it (trtfuse triton build-backend) against that nvidia-pytriton"
done
cp "$lib" "$BACKEND/tensorrt/BUILD.json" "$WORK/root/triton/backend/tensorrt/"
cp -r "$LITE0" "$WORK/root/triton/e2e/models/"

echo "== pack ($(du -sh "$WORK/root/triton" | cut -f1))"
tar -C "$WORK/root" --owner=0 --group=0 -cf - triton | zstd -q -19 --long=27 -T0 -o "$WORK/triton.tar.zst"
write_pieces "$WORK/triton.tar.zst" "$OUT" "$HERE/triton_unpack.sh" "$FIRST_PIECE" "$PIECE"
rm -rf "$WORK"
