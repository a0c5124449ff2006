#!/usr/bin/env bash
# Runs on the GPU machine (tools/stage_triton.sh puts it, after tools/pieces.sh, in .devcache/triton/unpack.sh
# beside the pieces it made): keeps each carried piece outside the work tree (every call replaces the tree); once
# every piece has arrived and their checksum is the staged one, unpacks the Triton payload whole into /tmp/triton:
#   site-packages/  the tritonserver of nvidia-pytriton 0.7.0 and the cp310 packages the triton steps import
#   numpy1/         numpy 1.26, for the steps that serve through Triton's Python backend (its stub needs numpy < 2)
#   backend/        Triton's TensorRT backend (tensorrt/libtriton_tensorrt.so, BUILD.json; runtime/ is made here)
# and EfficientNet-Lite0's model into the e2e stash (/tmp/trtfuse-e2e/models). tools/device_trt.sh puts
# site-packages on PYTHONPATH and the backend in TRTFUSE_TRITON_BACKEND_DIR when /tmp/triton is there.
# Idempotent: a second run after READY does nothing. The folders can be moved for a dry run here:
# TRITON_DEST, TRITON_PIECES, TRTFUSE_E2E_STASH, TRT85.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
declare -F extract_pieces > /dev/null || source "$here/pieces.sh"   # run from tools/ itself
dest=${TRITON_DEST:-/tmp/triton}
keep=${TRITON_PIECES:-/tmp/triton-pieces}
stash=${TRTFUSE_E2E_STASH:-/tmp/trtfuse-e2e}
if [ -f "$dest/.ready" ]; then echo "TRITON READY (already): $dest"; exit 0; fi
extract_pieces "$here" "$keep" "triton payload" "$dest.tmp"   # exits unless every piece is there
# The libraries the backend loads: TensorRT 8.5 of the staging (libnvinfer and its plugin-library stand-in),
# as `trtfuse triton build-backend` lays the folder out (trtfuse triton serve takes $TENSORRT_LIB_DIR first).
trt=${TRT85:-/opt/trt85}
mkdir -p "$dest.tmp/triton/backend/runtime"
for lib in libnvinfer.so.8 libnvinfer_plugin.so.8; do ln -sfn "$trt/lib/$lib" "$dest.tmp/triton/backend/runtime/$lib"; done
mkdir -p "$stash/models"
cp -r "$dest.tmp/triton/e2e/models/." "$stash/models/"
rm -rf "$dest"
mv "$dest.tmp/triton" "$dest"
rm -rf "$dest.tmp" "$keep"
touch "$dest/.ready"
echo "TRITON READY: $dest ($(ls "$dest/site-packages" | grep -vc dist-info) packages), models in $stash/models: $(ls "$stash/models" | tr '\n' ' ')"
