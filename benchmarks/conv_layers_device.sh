#!/usr/bin/env bash
# One device call, TensorRT 8.5 staged (/opt/trt85): the fused 1x1 conv library's layers against TensorRT's own.
#   build (kernels + plugins, sm_90a) -> kernel GPU tests -> compute-sanitizer on the forms without a residual
#   -> tuner (every ResNet-50 tail, projection and fused first block, this GPU) -> plugin tests in TensorRT
#   -> `trtfuse bench layers --kind residual` on every layer, with this run's tuning.
# Results under $OUT: conv_layers_h100.json, residual_conv_tuning_h100.json, and the logs.
#   bash benchmarks/conv_layers_device.sh [STAGES] [BATCHES]     (defaults: every layer; 256,2048)
set -uo pipefail
OUT=${OUT:-/tmp/conv_layers_out}; mkdir -p "$OUT"
STAGES=${1:-res2,res3,res4,res5,proj1,proj2,proj3,proj4,fused1,fused2}
BATCHES=${2:-256,2048}
export PYTHONUNBUFFERED=1 TRTFUSE_EXPECT_WGMMA=1
status=0
step() { echo "=== $* ($(date +%T))"; }

# The machine's python3 (PyTorch) runs the kernel steps; TensorRT's python3.10 the engine steps.
source tools/dev_env.sh
export TRTFUSE_BUILD_DIR=/tmp/trtfuse-build
export TRTFUSE_KERNELS_LIB=$TRTFUSE_BUILD_DIR/libtrtfuse_kernels.so TRTFUSE_PLUGIN_LIB=$TRTFUSE_BUILD_DIR/libtrtfuse_plugins.so

step build
(source /opt/trt85/env.sh && source tools/dev_env.sh && python3.10 -m trtfuse.plugin_build build --tensorrt-root "$TENSORRT_ROOT" --archs 90a \
  2>&1 | tail -2) || exit 1

step kernel tests
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_residual_conv.py > "$OUT/pytest.log" 2>&1 || status=1
tail -1 "$OUT/pytest.log"

step sanitizer
SAN="compute-sanitizer --error-exitcode 9 --print-limit 20"
P="python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_residual_conv.py"
{ timeout 200 $SAN --tool memcheck $P -k "no_residual or stride_2 or residual_pointer or (proj_tail and not 56 and not 28)" 2>&1
  echo "memcheck rc=$?"
  timeout 150 $SAN --tool racecheck --racecheck-report analysis $P \
    -k "(no_residual and (64x256x56 or 256x512x56 or 256x64)) or (proj_tail_every and 9x)" 2>&1
  echo "racecheck rc=$?"; } > "$OUT/sanitizer.log"
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=" "$OUT/sanitizer.log"
grep -qE "^[a-z]+ rc=[1-9]" "$OUT/sanitizer.log" && status=1

step tune
python3 -m trtfuse.tuning --stages "$STAGES" --batches "$BATCHES" --out "$OUT/residual_conv_tuning_h100.json" \
  > "$OUT/tune.log" 2>&1 || status=1
cut -c1-240 "$OUT/tune.log"
grep -q MISMATCH "$OUT/tune.log" && { echo "tuner: MISMATCH"; status=1; }
export TRTFUSE_RESIDUAL_CONV_CACHE=$OUT/residual_conv_tuning_h100.json

source /opt/trt85/env.sh
source tools/dev_env.sh
export TRTFUSE_TACTIC_SOURCES=none   # this machine's TensorRT has no cuBLAS/cuDNN
step plugin tests
# pytest for TensorRT's python3.10, where the call carried its wheels (the staged TensorRT has none)
[ -d .devcache/ptw ] && for w in .devcache/ptw/*.whl; do python3.10 -m zipfile -e "$w" /opt/trt85/site-packages/; done
python3.10 -m pytest -q -m tensorrt -p no:cacheprovider tests/test_residual_conv_plugin.py > "$OUT/plugin_tests.log" 2>&1 \
  || status=1
tail -1 "$OUT/plugin_tests.log"

step layers vs TensorRT
timeout 420 python3.10 -m trtfuse bench layers --kind residual --layers "$STAGES" --batches "$BATCHES" \
  --out "$OUT/conv_layers_h100.json" > "$OUT/trt.log" 2>&1 || status=1
grep -vE "^  (proj|res|fused)[0-9] batch|Calibrator" "$OUT/trt.log" | tail -24
echo "status=$status"
exit $status
