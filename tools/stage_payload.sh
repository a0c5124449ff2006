#!/usr/bin/env bash
# Stage, here, the e2e payload of the device runbook (benchmarks/README.md): what tools/device_trt.sh's network
# steps need on the lent GPU machine beyond the TensorRT staging (../shared/device/stage-trt.sh):
#   - e2e/: the bundle's ResNet-50 int8 model, labels and first image part (images0), which payload_unpack.sh also
#     puts where `trtfuse bench bundle stash` would (/tmp/trtfuse-e2e);
#   - mlperf/: MLCommons' scripts (../shared/third_party/mlperf: TEST01/TEST04, accuracy-imagenet.py, the checker);
#   - native/: the wheels and sources Python 3.10 there lacks, unpacked by device_trt.sh into the staging:
#     LoadGen's sdist (native-build), tomli (TOML settings), nvidia-ml-py (GPU energy), tqdm, and exceptiongroup
#     (the staged pytest imports it on 3.10: without it every pytest step fails to start).
# Run from the checkout root, after `trtfuse bench bundle prepare`:
#   bash tools/stage_payload.sh [OUT]        # OUT: .devcache/pay
# Environment: E2E (the bundle, default .devcache/e2e), NATIVE (default .devcache/native: the LoadGen sdist and
# wheels already fetched), MLPERF (default ../shared/third_party/mlperf), PIECE (bytes of each piece: the default
# keeps the payload in one piece that rides alone in a device call with stage/zstd).
# Writes OUT/piece00.., OUT/MANIFEST (piece count, sha256 of the whole) and OUT/unpack.sh (tools/payload_unpack.sh).
set -euo pipefail
ROOT=$(pwd)
OUT=${1:-$ROOT/.devcache/pay}
E2E=${E2E:-$ROOT/.devcache/e2e}
NATIVE=${NATIVE:-$ROOT/.devcache/native}
MLPERF=${MLPERF:-$ROOT/../shared/third_party/mlperf}
PIECE=${PIECE:-60000000}
WORK=${TMPDIR:-/tmp}/payload-stage-work
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tools/pieces.sh
source "$HERE/pieces.sh"
WHEELS=(tomli==2.5.0 nvidia-ml-py==13.615.71 tqdm==4.70.1 exceptiongroup==1.3.2)
die() { echo "stage_payload: $*" >&2; exit 2; }
[ -f "$E2E/models/resnet50/model.json" ] && [ -d "$E2E/images0" ] || die "no bundle in $E2E: run \`trtfuse bench bundle prepare\` (or set E2E)"
ls "$NATIVE"/mlcommons_loadgen-*.tar.gz > /dev/null 2>&1 || die "no LoadGen sdist in $NATIVE: pip download --no-binary :all: --no-deps mlcommons-loadgen==VERSION -d $NATIVE (VERSION: the wheel's)"
[ -f "$MLPERF/tools/accuracy-imagenet.py" ] || die "no MLCommons scripts in $MLPERF (set MLPERF)"
for tool in zstd pip; do command -v $tool > /dev/null || die "$tool is not installed"; done
rm -rf "$WORK"
mkdir -p "$WORK/root/e2e/models" "$WORK/root/native"
echo "== e2e: ResNet-50, labels, images0"
cp -r "$E2E/images0" "$WORK/root/e2e/"
for f in "$E2E"/models/*; do
    case $(basename "$f") in efficientnet-lite0) ;; *) cp -r "$f" "$WORK/root/e2e/models/" ;; esac  # Triton's payload has it
done
echo "== mlperf"
cp -r "$MLPERF" "$WORK/root/mlperf"
echo "== native: $(cd "$NATIVE" && ls mlcommons_loadgen-*.tar.gz) ${WHEELS[*]}"
cp "$NATIVE"/mlcommons_loadgen-*.tar.gz "$WORK/root/native/"
pip download -q --no-deps --only-binary=:all: --python-version 3.10 --implementation cp -d "$WORK/root/native" "${WHEELS[@]}"
echo "== pack ($(du -sh "$WORK/root" | cut -f1))"
tar -C "$WORK/root" --owner=0 --group=0 -cf - . | zstd -q -19 --long=27 -T0 -o "$WORK/payload.tar.zst"
write_pieces "$WORK/payload.tar.zst" "$OUT" "$HERE/payload_unpack.sh" "$PIECE" "$PIECE"
rm -rf "$WORK"
