#!/usr/bin/env bash
# TensorRT 8.5 work on the lent GPU machine, once /opt/trt85 is staged (../shared/device/README.md).
# Every step, the record it writes, and the device suites beside this one: benchmarks/README.md. The benchmark steps
# run `trtfuse bench SUITE` (src/trtfuse/bench/; `python3.10 -m trtfuse bench --help` lists the suites), imported from
# this checkout through tools/dev_env.sh.
#
#   bash tools/device_trt.sh STEP [STEP ...]
#
# Steps: build (the plugin library against /opt/trt85), layernorm (plugin tests), backend-test (the
# TensorRT backend and CUDA layer tests), conv-kernel (the fused
# conv's kernel checks, tuner and benchmark: benchmarks/residual_conv_device.sh), conv (TensorRT's
# own int8 conv+add+relu vs the plugin, benchmark: bench layers --kind residual), conv3x3 (the 3x3 kernel's GPU
# tests, then TensorRT's own 3x3 convs vs ours and vs the plugin node: bench layers --kind conv3x3), stem (the stem
# kernel's GPU and plugin tests, then TensorRT's own stem vs ours and the plugin node: bench layers --kind stem),
# next (a tail or the stem with the next conv1 chained: its GPU tests, then TensorRT's two layers vs ours and the
# plugin node: bench layers --kind next; for these four, extra arguments from $LAYERS_ARGS, e.g. "--batches 1,8", and
# $LAYERS_TAG after the record's name, e.g. "_b1_8": residual_conv_h200_b1_8.json), minilm (bench minilm check: rewritten MiniLM engine vs PyTorch),
# probe (bench probe: row copies and the backend loop without LoadGen), gap
# (bench gap: the engine alone against the Offline path step by step, extra arguments from $GAP_ARGS),
# e2e-stash (bench bundle stash: keep a carried e2e bundle part), e2e:STAGES (bench e2e run --stages STAGES; extra
# arguments from $E2E_ARGS, e.g. E2E_ARGS="--server-tries 3"), conf:STAGES (bench conformance run
# --stages STAGES, extra arguments from $CONF_ARGS),
# edge:UNITS (bench edge UNITS, comma-separated in the step: the edge v6.1 tree in $RESULTS/edge; extra arguments
# from $EDGE_ARGS); edge-seed (copy carried .devcache/edge_seed/UNIT folders, e.g. an earlier lease's ms-perf, into
# the edge runs, so that ms-test04 finds its reference: bg:edge-seed+edge:ms-test04; and edge_seed/edge_submission.json,
# an earlier record, whose latency_profile then fixes --plugins auto's exclusion for every job).
# conf* and edge* need the MLCommons scripts carried in .devcache/mlperf (a copy of ../shared/third_party/mlperf).
# qs-stash (keep carried .devcache/qs/{val,calib,models}), quickstart (bench quickstart: the
# README's GPU quick start verbatim, then profile and compare of the ResNet-50 engines).
# pytriton-stash (unzip the carried .devcache/pytriton/nvidia_pytriton-*.whl into /opt/trt85: its wheel is
# manylinux_2_35, which stage-trt.sh's platform list does not take; only its tritonserver is used),
# triton:STAGES (bench triton run --stages STAGES, extra arguments from $TRITON_ARGS),
# multigpu or multigpu-native (bench multigpu run: the native SUT on N GPUs, engine alone per GPU, the
# null engine's host path; after native-build; extra arguments from $MULTIGPU_ARGS, e.g. --stages, --counts,
# --out), gpu-test (the GPU/TensorRT tests of the lanes, the TensorRT backend, the Triton export
# and trtfuse serve with TensorRT over each transport), switch (benchmarks/experiments/server_switch_interval.py: Server
# p50/p99 against Python's GIL switch interval; extra arguments from $SWITCH_ARGS), native-build (the native SUT with
# TensorRT), native:STAGES (bench native run: the native SUT against the Python one; extra arguments from
# $NATIVE_ARGS),
# any-resnet (bench any-resnet run: our export vs torchvision's of ResNet-50, and torchvision's ResNet-101,
# engines alone at batch 2048, plugins off/all),
# triton-native (Triton's own TensorRT backend, carried in build/triton_backend/tensorrt or the Triton payload: the
# toy engine with our plugins exported and served by it, answers equal to direct; needs gpu-test's staging; the
# benchmark: triton:native-offline,native-server,native-accuracy). The Triton payload (tools/stage_triton.sh,
# unpacked into /tmp/triton) brings tritonserver, tritonclient, onnxruntime and the backend: no pytriton-stash then.
# redesign-ab (bench ab run: the commit packed in .devcache/ab by `trtfuse bench ab pack` against this tree, built
# by each one's own code, timed by one timer, then this tree's GPU tests; it stops starting work $AB_DEADLINE_S
# (550) s after this call began and goes on where it stopped when run again; AB_AFTER_COMMIT names this tree's
# commit in the record; extra arguments from $AB_ARGS).
# bg:STEP+STEP... (those steps detached, from a copy of the tree, with this call's environment: run one per GPU
# with CUDA_VISIBLE_DEVICES=K set, so that each GPU of a host works on its own; results and logs in
# $RESULTS/gpuK), bg-wait (wait up to $WAIT_S s for every bg job; their logs' tails).
# A failing step does not stop the next. Logs and results accumulate in /tmp/trtfuse-results (outside
# the work tree, which each call replaces); $OUT gets the JSON results and logs.tgz (at most 8 files come back).
# Exit status: the number of failed steps.
set -u
cd "$(dirname "$0")/.."
# The machine's own python3 (PyTorch, CuPy) runs the kernel-only steps: keep its environment.
ORIG_ENV=(PATH="$PATH" PYTHONPATH="${PYTHONPATH:-}" LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}")
# shellcheck disable=SC1091
source /opt/trt85/env.sh
# shellcheck disable=SC1091
source tools/dev_env.sh
# Pure-Python wheels the staging lacks, carried in .devcache/native or unpacked from the payload into
# /tmp/payload/native (tools/stage_payload.sh): tomli (Python 3.10 reads TOML with it, and every `trtfuse` command
# reads its settings; pytest too), exceptiongroup (the staged pytest imports it on 3.10), nvidia-ml-py (GPU energy),
# tqdm. Unpacked once per machine.
for w in .devcache/native/*.whl /tmp/payload/native/*.whl; do
    [ -f "$w" ] && [ ! -f "$TRT85/site-packages/.$(basename "$w").done" ] && python3.10 -m zipfile -e "$w" "$TRT85/site-packages/" \
        && touch "$TRT85/site-packages/.$(basename "$w").done"
done
# The Triton payload (tools/stage_triton.sh, unpacked by .devcache/triton/unpack.sh): tritonserver and the cp310
# packages of the triton steps and their tests, and Triton's TensorRT backend.
NUMPY1=
if [ -f /tmp/triton/.ready ]; then
    NUMPY1=/tmp/triton/numpy1:
    export TRTFUSE_TRITON_NUMPY1=/tmp/triton/numpy1   # bench ab's gpu-test puts it first, as gpu-test here does
    export PYTHONPATH=/tmp/triton/site-packages:$PYTHONPATH
    export TRTFUSE_TRITON_BACKEND_DIR=${TRTFUSE_TRITON_BACKEND_DIR:-/tmp/triton/backend}
fi
OUT=${OUT:-/tmp/trtfuse-out}
RESULTS=${TRTFUSE_RESULTS:-/tmp/trtfuse-results}   # a bg job's own: $RESULTS/gpuK
mkdir -p "$OUT" "$RESULTS/logs"
export PYTHONUNBUFFERED=1
export TRTFUSE_BUILD_DIR=/tmp/trtfuse-build   # kept between calls on a warm machine
export TRTFUSE_PLUGIN_LIB=$TRTFUSE_BUILD_DIR/libtrtfuse_plugins.so
export TRTFUSE_NATIVE_BUILD_DIR=/tmp/trtfuse-native   # the native SUT's build, kept between calls too
# This machine's TensorRT 8.5 has no cuBLAS/cuDNN to load: every engine build leaves their tactics out.
export TRTFUSE_TACTIC_SOURCES=none
# The fused conv's tile choice: this machine's fresh tuning if a conv-kernel step ran, else the committed one.
tuned=$RESULTS/residual_conv_tuning_h100.json
[ -f "$tuned" ] || tuned=$PWD/benchmarks/results/residual_conv_tuning_h100.json
export TRTFUSE_RESIDUAL_CONV_CACHE=$tuned
# Records are named for the GPU that made them (multigpu_h200.json): the device tool may lend another kind than asked.
GPU_TAG=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oiE 'gh200|h100|h200|b200|a100|l40s' | head -1 | tr '[:upper:]' '[:lower:]')
GPU_TAG=${GPU_TAG:-gpu}
failed=0

run_step() {
    local name=$1; shift
    echo "=== $name: $*"
    local t0=$SECONDS
    "$@" > "$RESULTS/logs/$name.log" 2>&1
    local rc=$?
    echo "=== $name rc=$rc ($((SECONDS - t0)) s)"
    tail -n "${TAIL:-12}" "$RESULTS/logs/$name.log"
    [ "$rc" = 0 ] || failed=$((failed + 1))
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for step in "$@"; do
    case $step in
        build) run_step build python3.10 -m trtfuse.plugin_build build --tensorrt-root "$TENSORRT_ROOT" --archs 90a ;;
        layernorm) run_step layernorm python3.10 -m pytest -q -m tensorrt -p no:cacheprovider tests/test_layernorm_plugin.py ;;
        conv-kernel) run_step conv-kernel env -u TRTFUSE_BUILD_DIR "${ORIG_ENV[@]}" OUT="$RESULTS/conv-kernel" bash benchmarks/residual_conv_device.sh quick
                     cp "$RESULTS/conv-kernel/residual_conv_tuning_h100.json" "$RESULTS/conv-kernel/residual_conv_bench_h100.json" "$RESULTS/" 2>/dev/null
                     [ -f "$RESULTS/residual_conv_tuning_h100.json" ] && export TRTFUSE_RESIDUAL_CONV_CACHE=$RESULTS/residual_conv_tuning_h100.json ;;
        conv) run_step conv python3.10 -m trtfuse bench layers --kind residual --qdq --out "$RESULTS/residual_conv_${GPU_TAG}${LAYERS_TAG:-}.json" ${LAYERS_ARGS:-} ;;
        conv-test) run_step conv-test python3.10 -m pytest -q -m tensorrt -p no:cacheprovider tests/test_residual_conv_plugin.py ;;
        conv3x3) run_step conv3x3-test python3.10 -m pytest -q -m gpu -p no:cacheprovider tests/test_conv3x3.py
                 run_step conv3x3 python3.10 -m trtfuse bench layers --kind conv3x3 --out "$RESULTS/conv3x3_${GPU_TAG}${LAYERS_TAG:-}.json" ${LAYERS_ARGS:-} ;;
        stem) run_step stem-test python3.10 -m pytest -q -m "gpu or tensorrt" -p no:cacheprovider tests/test_stem.py
              run_step stem python3.10 -m trtfuse bench layers --kind stem --out "$RESULTS/stem_${GPU_TAG}${LAYERS_TAG:-}.json" ${LAYERS_ARGS:-} ;;
        next) run_step next-test python3.10 -m pytest -q -m "gpu or tensorrt" -p no:cacheprovider tests/test_next_conv.py
              run_step next python3.10 -m trtfuse bench layers --kind next --out "$RESULTS/next_conv_${GPU_TAG}${LAYERS_TAG:-}.json" ${LAYERS_ARGS:-} ;;
        backend-test) run_step backend-test python3.10 -m pytest -q -m "gpu or tensorrt" -p no:cacheprovider \
                          tests/test_cuda_runtime.py tests/test_tensorrt_backend.py ;;
        minilm) run_step minilm python3.10 -m trtfuse bench minilm check --out "$RESULTS/minilm_trt.json" ;;
        minilm-cublas)  # TensorRT 8.5's Myelin needs cuBLAS(Lt) 11: tools/stage_cublas11.sh puts it in /tmp/cublas11
            LD_LIBRARY_PATH=/tmp/cublas11:$LD_LIBRARY_PATH TRTFUSE_TACTIC_SOURCES=cublas \
                run_step minilm-cublas python3.10 -m trtfuse bench minilm check --out "$RESULTS/minilm_trt.json" ;;
        probe) run_step probe python3.10 -m trtfuse bench probe --out "$RESULTS/serving_probe.json" ;;
        gap) run_step gap python3.10 -m trtfuse bench gap --out "$RESULTS/offline_gap_${GPU_TAG}.json" ${GAP_ARGS:-} ;;
        e2e-stash) run_step e2e-stash python3.10 -m trtfuse bench bundle stash ;;
        e2e:*) run_step "e2e-${step#e2e:}" python3.10 -m trtfuse bench e2e run \
                   --out "$RESULTS/resnet50_e2e_${GPU_TAG}.json" --stages "${step#e2e:}" ${E2E_ARGS:-} ;;
        conf:*) run_step "conf-${step#conf:}" python3.10 -m trtfuse bench conformance run \
                    --out "$RESULTS/mlperf_conformance_${GPU_TAG}.json" --stages "${step#conf:}" ${CONF_ARGS:-} ;;
        qs-stash)  # carried .devcache/qs/{val,calib,models}: kept in /tmp/qs (outside the work tree)
            mkdir -p /tmp/qs /tmp/trtfuse-home/models
            for d in val calib; do [ -d .devcache/qs/$d ] && cp -r .devcache/qs/$d /tmp/qs/; done
            [ -d .devcache/qs/models ] && cp -r .devcache/qs/models/. /tmp/trtfuse-home/models/
            ls /tmp/qs /tmp/trtfuse-home/models ;;
        quickstart)  # README's GPU quick start verbatim: `trtfuse` on PATH, the stashed images and model
            mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3.10 -m trtfuse "$@"\n' > /tmp/bin/trtfuse && chmod +x /tmp/bin/trtfuse
            PATH=/tmp/bin:$PATH TRTFUSE_HOME=/tmp/trtfuse-home run_step quickstart python3.10 -m trtfuse bench quickstart \
                --images /tmp/qs/val --calibration /tmp/qs/calib --resnet50 /tmp/trtfuse-e2e/models/resnet50 \
                --out "$RESULTS/gpu_quickstart_${GPU_TAG}.json" --e2e-results "$RESULTS/resnet50_e2e_${GPU_TAG}.json" ;;
        pytriton-stash)  # the tritonserver binary, its Python backend and stubs that trtfuse serve runs
            for w in .devcache/pytriton/*.whl; do
                [ -f "$w" ] && run_step "unzip-$(basename "$w" | cut -d- -f1)" python3.10 -m zipfile -e "$w" "$TRT85/site-packages/"
            done
            # zipfile drops the executable bits
            p=$TRT85/site-packages/pytriton/tritonserver
            [ -d "$p" ] && chmod +x "$p"/bin/* "$p"/python_backend_stubs/*/* 2>/dev/null ;;
        # Triton 2.51's Python backend stub answers empty outputs with numpy 2: the payload's numpy 1.26 for the
        # stages that serve through it (triton-*: trtfuse serve); direct, lanes and native-* keep the staged numpy.
        triton:*) np=; case ",${step#triton:}," in *,triton-*) np=$NUMPY1 ;; esac
                  PYTHONPATH=$np$PYTHONPATH run_step "triton-${step#triton:}" python3.10 -m trtfuse bench triton run \
                      --out "$RESULTS/triton_${GPU_TAG}.json" --stages "${step#triton:}" ${TRITON_ARGS:-} ;;
        redesign-ab) run_step redesign-ab python3.10 -m trtfuse bench ab run --pack .devcache/ab \
                         --out "$RESULTS/redesign_ab_${GPU_TAG}.json" --deadline-s $((${AB_DEADLINE_S:-550} - SECONDS)) ${AB_ARGS:-} ;;
        edge-seed)  # completed runs of an earlier lease (carried .devcache/edge_seed/UNIT): the references of later
            # units; and its record (edge_seed/edge_submission.json), whose latency_profile gives every job of a host
            # the same --plugins auto exclusion (the units of one scenario must run one engine)
            mkdir -p "$RESULTS/edge/runs"
            for f in .devcache/edge_seed/*; do
                case $f in */edge_submission.json) [ -f "$RESULTS/edge/edge_submission.json" ] || cp "$f" "$RESULTS/edge/" ;;
                            *) cp -r "$f" "$RESULTS/edge/runs/" ;; esac
            done
            ls "$RESULTS/edge/runs" ;;
        triton-native) run_step triton-native python3.10 -m pytest -q -rs -m tensorrt -p no:cacheprovider tests/test_triton_native.py ;;
        edge:*) run_step "edge-${step#edge:}" python3.10 -m trtfuse bench edge ${step#edge:} \
                    --out "$RESULTS/edge" --mlperf-dir .devcache/mlperf ${EDGE_ARGS:-}
                cp "$RESULTS/edge/edge_submission.json" "$RESULTS/" 2>/dev/null ;;
        switch) run_step switch python3.10 benchmarks/experiments/server_switch_interval.py ${SWITCH_ARGS:-} ;;
        multigpu|multigpu-native) run_step "$step" python3.10 -m trtfuse bench multigpu run \
                                      --out "$RESULTS/multigpu_${GPU_TAG}.json" ${MULTIGPU_ARGS:-} ;;
        # gpu-test needs pytest and onnxruntime (cp310): a staging made with them, or both on $PYTHONPATH (the staged
        # pytest 9 also needs exceptiongroup on 3.10; redesign-ab carries it and onnxruntime in .devcache/ab/wheels)
        # any-resnet: bench any-resnet run on the carried .devcache/any_resnet (made by its prepare on the CPU
        # machine); extra arguments from $ANY_RESNET_ARGS (e.g. "--stages build" then "--stages engine")
        any-resnet) run_step any-resnet python3.10 -m trtfuse bench any-resnet run --bundle .devcache/any_resnet \
                        --out "$RESULTS/any_resnet_${GPU_TAG}.json" ${ANY_RESNET_ARGS:-} ;;
        gpu-test) PYTHONPATH=$NUMPY1$PYTHONPATH run_step gpu-test python3.10 -m pytest -q -m "gpu or tensorrt" -p no:cacheprovider \
                      tests/test_lanes.py tests/test_tensorrt_backend.py tests/test_cuda_runtime.py tests/test_triton_export.py \
                      tests/test_triton_gpu.py ;;
        native-build)  # the native SUT with TensorRT: LoadGen's sdist and nvidia-ml-py carried in .devcache/native
            TRTFUSE_LOADGEN_SDIST=$(ls .devcache/native/mlcommons_loadgen-*.tar.gz /tmp/payload/native/mlcommons_loadgen-*.tar.gz 2>/dev/null | head -1) \
                run_step native-build python3.10 -m trtfuse.plugin_build build --native --tensorrt-root "$TENSORRT_ROOT" ;;
        native:*) run_step "native-${step#native:}" python3.10 -m trtfuse bench native run \
                      --out "$RESULTS/native_sut_${GPU_TAG}.json" --stages "${step#native:}" ${NATIVE_ARGS:-} ;;
        bg:*)
            job=gpu${CUDA_VISIBLE_DEVICES:-all}; job=${job//,/_}; dir=$RESULTS/$job; steps=${step#bg:}
            if [ -f "$dir/bg.pid" ] && kill -0 "$(cat "$dir/bg.pid")" 2>/dev/null; then
                echo "=== $job busy (pid $(cat "$dir/bg.pid"))"; failed=$((failed + 1)); continue; fi
            rm -rf "/tmp/trtfuse-bg-tree-$job" && cp -r "$PWD" "/tmp/trtfuse-bg-tree-$job" && mkdir -p "$dir"
            rm -f "$dir/bg.pid"
            # Every descriptor of the job points away from this call's output (a holder of it keeps the call
            # waiting for the job), and the job writes its own pid: it is the process bg-wait watches. It starts
            # from this call's environment before the sourcing above (ORIG_ENV), so that its kernel-only steps
            # find the machine's python3 (PyTorch) first again, and sources its own tree's.
            (cd "/tmp/trtfuse-bg-tree-$job" && exec env "${ORIG_ENV[@]}" TRTFUSE_RESULTS="$dir" OUT="$dir/out" setsid bash -c \
                 'echo $$ > "$0"; exec bash tools/device_trt.sh "$@"' "$dir/bg.pid" ${steps//+/ }) \
                > "$dir/bg.log" 2>&1 < /dev/null &
            for _ in $(seq 50); do [ -s "$dir/bg.pid" ] && break; sleep 0.1; done
            echo "=== $job started: ${steps//+/ } (pid $(cat "$dir/bg.pid" 2>/dev/null))" ;;
        bg-wait) t0=$SECONDS
            while [ $((SECONDS - t0)) -lt "${WAIT_S:-500}" ]; do
                alive=$(for f in "$RESULTS"/gpu*/bg.pid; do [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && echo "$f"; done)
                [ -z "$alive" ] && break
                sleep 5
            done
            for f in "$RESULTS"/gpu*/bg.log; do [ -f "$f" ] && { echo "--- $f"; tail -n "${TAIL:-6}" "$f"; }; done
            [ -n "$alive" ] && echo "=== still running: $alive" ;;
        *) echo "unknown step $step"; failed=$((failed + 1)) ;;
    esac
done
echo "conv tile cache: $TRTFUSE_RESIDUAL_CONV_CACHE"
cp "$RESULTS"/*.json "$OUT"/ 2>/dev/null
# At most 8 files of 16 MiB come back: a bg job's edge runs (accuracy logs of several MB) in a file of their own
# (the Triton runs' exported repositories hold plans and plugin libraries: a logs.tgz over 16 MiB does not come back)
tar -C "$RESULTS" --exclude='./gpu*/out' --exclude='./gpu*/edge' --exclude='*/triton-runs' --exclude='*.plan' \
    --exclude='*.engine' --exclude='*.so' -czf "$OUT/logs.tgz" .
for d in "$RESULTS"/gpu*/edge; do [ -d "$d" ] && tar -C "$d/.." -czf "$OUT/edge-$(basename "$(dirname "$d")").tgz" edge; done
exit "$failed"
