#!/usr/bin/env bash
# A/B of two builds of the kernels library on the GPU machine, in one call: the tuner's timings of the wgw configs,
# old and new interleaved (old, new, old, new per stage; per config the minimum of the two repeats), plus the GPU
# tests (and optionally a sanitizer) of the new one. Results under $OUT (ab.log and a per-shape summary on stdout).
#   OLD_LIB=path/old.so NEW_LIB=path/new.so [OLD_TREE=checkout of the old library's code] [K=pytest-k] \
#     [SAN=racecheck SANK=pytest-k] [STAGES="res2 res5"] [CFGS=wgw_] [REPS=30] bash benchmarks/experiments/residual_conv_ab.sh
# (build each library here with `python -m trtfuse.plugin_build build --kernels-only --archs 90a` and carry both;
# the iteration log of stop 10: `git show 74e77f2:benchmarks/results/logs/residual_conv_wgw_v10_ab.log`)
set -u
source tools/dev_env.sh
export PYTHONUNBUFFERED=1 TRTFUSE_EXPECT_WGMMA=1
OUT=${OUT:-/tmp/rconv_ab}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
if [ -n "${K:-}" ]; then
  TRTFUSE_KERNELS_LIB=$NEW_LIB timeout -s KILL "${PT:-200}" python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_residual_conv.py -k "$K" > "$OUT/pytest.log" 2>&1; echo "pytest rc=$?"; tail -1 "$OUT/pytest.log"
fi
if [ -n "${SAN:-}" ]; then
  TRTFUSE_KERNELS_LIB=$NEW_LIB timeout -s KILL "${ST:-240}" compute-sanitizer --error-exitcode 9 --print-limit 10 \
    --tool "$SAN" python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_residual_conv.py -k "$SANK" \
    > "$OUT/san.log" 2>&1; echo "$SAN rc=$?"; grep -E "SUMMARY|passed|failed" "$OUT/san.log" | tail -3
fi
for st in ${STAGES:-res2 res3 res4 res5}; do
  for lib in old new old new; do
    [ "$lib" = old ] && L=$OLD_LIB || L=$NEW_LIB
    # OLD_TREE: the old library runs under its own checkout's Python (its C ABI may lack what the new code binds)
    ( if [ "$lib" = old ] && [ -n "${OLD_TREE:-}" ]; then source "$OLD_TREE/tools/dev_env.sh"; fi
      TRTFUSE_KERNELS_LIB=$L timeout -s KILL 90 python3 -m trtfuse.tuning --stages "$st" --configs "${CFGS:-wgw_}" \
        --reps "${REPS:-30}" --out /tmp/ab_tune.json 2>&1 ) | grep -E "^tune .*best|MISMATCH|Error" | sed "s/^/$lib /" >> "$OUT/ab.log"
  done
done
grep -E "MISMATCH|Error" "$OUT/ab.log"
python3 - "$OUT/ab.log" <<'P'
import re, sys, collections
rows = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    # (the form, e.g. "tail s1", is absent from logs of builds before the projections)
    m = re.match(r'(\w+) tune (\d+)->(\d+) \S+ (?:(\w+ s\d) )?batch (\d+): best \S+ \S+ ms \| (.*)', line)
    if m:
        lib, ci, co, form, b, cands = m.groups()
        for k, v in re.findall(r'(\S+)=([\d.]+)', cands):
            rows[(int(ci), int(co), form or 'tail s1', int(b))][(lib, k)].append(float(v))
for shape in sorted(rows):
    r = rows[shape]
    for k in sorted({k for _, k in r}):
        o, n = r.get(('old', k)), r.get(('new', k))
        if o and n:
            print(f"{shape[0]:>4}->{shape[1]:<4} {shape[2]} b{shape[3]:<5} {k:32s} old {min(o):.4f} new {min(n):.4f} {100 * (min(n) / min(o) - 1):+5.1f} %")
    best = {lib: min((min(v), k) for (l, k), v in r.items() if l == lib) for lib in ('old', 'new')}
    print(f"best {shape}: old {best['old'][0]:.4f} ({best['old'][1]}) new {best['new'][0]:.4f} ({best['new'][1]})")
P
