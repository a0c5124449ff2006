#!/usr/bin/env bash
# One device call: build, SASS check, correctness, compute-sanitizer, tuner, benchmark. Logs under $OUT.
#   run: bash benchmarks/residual_conv_device.sh [quick]
# SKIP_STEPS="sass sanitizer phases bench ncu" leaves those out (e.g. a batch-1 tuning pass that must fit a short
# lease); TUNE_ARGS go to the tuner (e.g. "--batches 1,8"). The tuner's cache starts from the committed one, so its
# output is that cache with this GPU's new picks: what to commit.
set -uo pipefail
OUT=${OUT:-/tmp/rconv_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
source tools/dev_env.sh
status=0
step() { echo "=== $* ($(date +%T))"; }
skip() { case " ${SKIP_STEPS:-} " in *" $1 "*) echo "=== $1 skipped (SKIP_STEPS)"; return 0 ;; esac; return 1; }

step build
# sm_90a: the sm90 configurations (wgw_*) exist only in an sm_90a cubin (the driver loads it on the H100 also when an
# sm_90 one is present); SKIP_BUILD=1 uses a library built elsewhere (e.g. carried to the device machine)
[ "${SKIP_BUILD:-0}" = 1 ] || { python3 -m trtfuse.plugin_build build --kernels-only --archs 90a 2>&1 | tail -3 || exit 1; }
LIB=build/plugins/libtrtfuse_kernels.so
export TRTFUSE_EXPECT_WGMMA=1   # the GPU tests fail (not skip) if the wgmma configurations cannot run

skip sass || { step sass
{
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu --format=csv
  cuobjdump -res-usage "$LIB" 2>&1 | grep -A1 conv_kernel_sm | grep -oE "(conv_kernel_sm[0-9]+I[0-9A-Za-z_]*|REG:[0-9]+|STACK:[0-9]+|LOCAL:[0-9]+)" | paste - - - -
  # every kernel of the library (plugins/conv_int8/host/config_table.cu's kConfigs): instruction mix of its sm_90a SASS
  for k in $(cuobjdump -sass "$LIB" | grep -oE "Function : _ZN7trtfuse5rconv[0-9]+conv_kernel_sm[0-9A-Za-z_]+" | sort -u | cut -d' ' -f3); do
    echo "-- $k"; cuobjdump -sass "$LIB" | awk -v k="$k" '/Function :/{f=index($0,k)>0} f' \
      | grep -oE "\b(MUFU[.A-Z0-9]*|IMMA[.A-Z0-9]*|IGMMA[.A-Z0-9x]*|WARPGROUP[.A-Z]*|FENCE[.A-Z]*|LDSM[.A-Z0-9]*|LDGSTS[.A-Z0-9]*|STG[.A-Z0-9]*|LDS[.A-Z0-9]*|STS[.A-Z0-9]*|LDG[.A-Z0-9]*|LDL[.A-Z0-9]*|STL[.A-Z0-9]*|BAR[.A-Z0-9]*)" | sort | uniq -c
  done
} > "$OUT/sass.txt" 2>&1
grep -E "REG|IMMA|IGMMA|MUFU|LDL|STL|STG|^--" "$OUT/sass.txt" | head -90
}

step pytest
python3 -m pytest -q -m gpu -rs -s tests/test_residual_conv.py -p no:cacheprovider > "$OUT/pytest.log" 2>&1 || status=1
grep -E "LSB|passed|failed|Error|assert" "$OUT/pytest.log" | tail -25

skip sanitizer || { step sanitizer
SAN="compute-sanitizer --error-exitcode 9 --print-limit 20"
K="small_every_config or (small_auto_config and (1x144 or 3x128 or 1x32)) or rejects"
{ $SAN --tool memcheck python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_residual_conv.py -k "$K" 2>&1; echo "memcheck rc=$?";
  $SAN --tool racecheck --racecheck-report analysis python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_residual_conv.py -k "small_every_config and 3x128" 2>&1; echo "racecheck rc=$?";
  $SAN --tool synccheck python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_residual_conv.py -k "small_every_config and 3x128" 2>&1; echo "synccheck rc=$?";
  # every config on the persistent shapes (several tiles per block: residual-buffer rotation, k-stage counters, the
  # sm90 kernel's mbarrier rings and, at 42x512 and 136x512 on 132 SMs, extra blocks that reload the weight slice).
  # Time-capped (rc 124 = ran out of time, reported, not a failure) so a slow sanitizer cannot eat the tuner's and
  # the benchmark's time.
  timeout 240 $SAN --tool memcheck python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_residual_conv.py -k "persistent_every_config" 2>&1; echo "memcheck-persistent rc=$?";
  timeout 240 $SAN --tool racecheck --racecheck-report analysis python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_residual_conv.py -k "persistent_every_config and (8x64 or 42x512)" 2>&1; echo "racecheck-persistent rc=$?";
  timeout 90 $SAN --tool synccheck python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_residual_conv.py -k "persistent_every_config and (16x256 or 42x512) and (cfg2 or cfg3 or cfg4 or cfg5 or cfg6)" 2>&1; echo "synccheck-persistent rc=$?";
} > "$OUT/sanitizer.log"
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=|passed|failed" "$OUT/sanitizer.log"
# any non-zero rc fails the run, except a time-capped persistent step that ran out of time (124)
grep -E "^[a-z-]+ rc=[1-9]" "$OUT/sanitizer.log" | grep -vE "^(memcheck|racecheck|synccheck)-persistent rc=124( |$)" | grep -q . && status=1
}

step tune
cp benchmarks/results/residual_conv_tuning_h100.json "$OUT/residual_conv_tuning_h100.json"
python3 -m trtfuse.tuning --out "$OUT/residual_conv_tuning_h100.json" ${1:+--reps 30} ${TUNE_ARGS:-} 2>&1 | tee "$OUT/tune.log" | cut -c1-400 \
  || { echo "tuner: failed (see tune.log)"; status=1; }
# a config whose full-shape output differs from config 0's is a bug (excluded from the cache, but fail the run)
grep -q MISMATCH "$OUT/tune.log" && { echo "tuner: MISMATCH (see tune.log)"; status=1; }

skip phases || { step phases
# where a wgw consumer tile's time goes (clock64 per phase; benchmarks/experiments/residual_conv_wgw_phases.cu)
nvcc -std=c++17 -O3 -arch=sm_90a -Iplugins -o /tmp/wgw_phases benchmarks/experiments/residual_conv_wgw_phases.cu \
  && timeout -s KILL 120 /tmp/wgw_phases > "$OUT/wgw_phases.log" 2>&1; echo "phases rc=$?"; cut -c1-200 "$OUT/wgw_phases.log"
}

skip bench || { step bench
TRTFUSE_RESIDUAL_CONV_CACHE="$OUT/residual_conv_tuning_h100.json" \
  python3 -m trtfuse.bench.conv_kernel --out "$OUT/residual_conv_bench_h100.json" 2>&1 | tee "$OUT/bench.log" | tail -12
}


{ [ "${SKIP_NCU:-0}" = 1 ] || skip ncu; } && { echo "pytest/sanitizer/tuner status=$status"; exit $status; }
step ncu
ncu --section SpeedOfLight --section WarpStateStats --section Occupancy --section MemoryWorkloadAnalysis \
  -k regex:residual_conv --launch-skip 12 --launch-count 1 \
  env TRTFUSE_RESIDUAL_CONV_CACHE="$OUT/residual_conv_tuning_h100.json" \
  python3 -m trtfuse.bench.conv_kernel --stages res2 --batches 2048 --no-peer --reps 5 --out /tmp/ncu_bench.json \
  > "$OUT/ncu.txt" 2>&1
grep -E "Throughput|Duration|Achieved Occupancy|Registers|Stall|Theoretical Occupancy|Issue Slots|Executed Ipc|Block Limit" "$OUT/ncu.txt" | head -30
echo "pytest/sanitizer/tuner status=$status"
