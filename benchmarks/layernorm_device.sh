#!/usr/bin/env bash
# LayerNorm on the GPU machine, in one call: (build), GPU tests, benchmark (ours vs torch), compute-sanitizer
# memcheck + racecheck on a small driver. Step time limits: T_TEST, T_BENCH, T_SAN (seconds). Logs and JSON go under $OUT; a short table is printed last.
#
#   bash benchmarks/layernorm_device.sh [build] [test] [sanitize] [bench] [explore]
#   (default: test sanitize bench; the kernels library is built first when build/ln lacks it)
#
# Only plugins/common and plugins/layernorm are compiled (copied to a private --source folder), so other ops'
# work in progress cannot break this run.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/layernorm_out}
mkdir -p "$OUT"
source tools/dev_env.sh
export PYTHONUNBUFFERED=1
steps=" ${*:-test sanitize bench} "
has() { [[ "$steps" == *" $1 "* ]]; }
lib=build/ln/libtrtfuse_kernels.so

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/env.log"
if has build || [ ! -f "$lib" ]; then
    rm -rf build/lnsrc && mkdir -p build/lnsrc && cp -r plugins/common plugins/layernorm build/lnsrc/
    if ! python3 -m trtfuse.plugin_build build --kernels-only --archs 90 --source build/lnsrc --build-dir build/ln \
            > "$OUT/build.log" 2>&1; then
        echo "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1
    fi
    tail -1 "$OUT/build.log"
fi
export TRTFUSE_KERNELS_LIB=$PWD/$lib

if has test; then
    timeout ${T_TEST:-170} python3 -m pytest -q -m gpu --maxfail=20 -p no:cacheprovider tests/test_layernorm_kernel.py \
        > "$OUT/pytest.log" 2>&1
    echo "pytest rc=$?"
    grep -E "^(FAILED|ERROR)|Error|assert" "$OUT/pytest.log" | head -20
    tail -2 "$OUT/pytest.log"
fi

if has bench; then
    timeout ${T_BENCH:-240} python3 -m trtfuse.bench.layernorm --json "$OUT/layernorm_h100.json" \
        $(has explore && echo --explore --explore-dtypes ${EXPLORE_DTYPES:-fp16,fp32}) > "$OUT/bench.log" 2>&1
    echo "bench rc=$?"
    grep -E "Error|error" "$OUT/bench.log" | head -5
fi

if has sanitize; then
    # Every tensor its own cudaMalloc, so memcheck sees the true end of each buffer.
    # memcheck: every path with reference checks; racecheck (shared memory only, slow): the block paths.
    for tool in memcheck racecheck; do
        mode=--sanitize; [ "$tool" = racecheck ] && mode=--sanitize-launch-only
        PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout ${T_SAN:-150} compute-sanitizer --tool "$tool" --error-exitcode 9 \
            python3 -m trtfuse.bench.layernorm $mode > "$OUT/$tool.log" 2>&1
        echo "$tool rc=$? ($(grep -c '^=========' "$OUT/$tool.log") sanitizer lines)"
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|sanitize driver" "$OUT/$tool.log" | tail -3
    done
fi

if has bench; then  # the table last: the summary, or the cells measured before a time limit
    grep -q '^dtype' "$OUT/bench.log" && sed -n '/^dtype/,$p' "$OUT/bench.log" || grep -E '^(fp|bf)' "$OUT/bench.log"
fi
