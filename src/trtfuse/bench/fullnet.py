"""benchmarks/results/resnet50_fullnet_h100.json, the ResNet-50 full-network record (issue 14's format), composed from
the two device runs that measure it; nothing is measured here:

  - the layers: benchmarks/conv_layers_device.sh -> conv_layers_h100.json (each replaced layer's plugin against
    TensorRT's own kernel for the same layer, in one run; copy bandwidth), and later runs of some layers
    (conv_layers_fused_h100.json: the fused first blocks; conv3x3_h100.json: the 3x3 convs, from
    trtfuse bench layers --kind conv3x3; stem_h100.json: the stem, from trtfuse bench layers --kind stem; next_conv_h100.json: the layer1
    tails and the stem with the next conv1 chained, from trtfuse bench layers --kind next), whose rows add to or replace
    the first file's;
  - the network: trtfuse bench e2e run --plugins off,tails,all -> resnet50_fullnet_e2e_h100.json (engines
    off / tails / all at batch 256 and 2048, TensorRT's per-layer profile, agreement, LoadGen Offline and Server);
  - optionally a second network run (--e2e2, e.g. on a machine without Server latency tails): its --e2e2-keys
    (default server, server_search, accuracy and offline) replace the first's, which stay in the record under "first_run".

    trtfuse bench fullnet [--layers FILE ...] [--e2e FILE] [--e2e2 FILE] [--e2e2-keys K,..] [--out FILE]

A field the runs did not measure is null, with the reason under "missing". Prints a table of the result.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trtfuse.passes.residual_conv_rewrite import MAX_CONV3X3_COUT, MAX_PROJECTION_CIN, POOL_OP
from trtfuse.tuning import RESNET50_STAGES

from trtfuse.bench import RESULTS


SECOND_RUN_KEYS = ("server", "server_search", "accuracy", "offline")


def merge_layers(runs: list[dict]) -> dict:
    """Layer runs in order: a later run's row replaces an earlier one of the same layer and batch; the copy bandwidth
    is the first run's."""
    rows = {}
    for run in runs:
        for r in run.get("rows", []) + run.get("layers", []):   # the conv3x3, stem and next kinds: "layers", named by "layer"
            r = {"stage": r.get("layer"), **r}
            rows[(r["stage"], r["batch"])] = r
    return {**runs[0], "rows": list(rows.values())} if runs else {}


def replaced(r: dict) -> bool:
    """What --plugins all replaces (src/trtfuse/passes/residual_conv_rewrite.py): every tail, (fused-proj-tail) the first blocks
    whose projection and tail fit one kernel, projections up to MAX_PROJECTION_CIN input channels, stride-1 3x3
    convs up to MAX_CONV3X3_COUT output channels (ResNet-50's three in layer1), the stem, and the layer1 tails
    (fused-tail-conv1) and the stem (fused-stem-conv1) with the next conv1 chained."""
    kind = r.get("kind", "tail")
    if kind in ("stem", "fused-tail-conv1", "fused-stem-conv1"):
        return True
    if kind == "conv3x3":   # stride 1 only: the stride-2 ones stay with TensorRT
        return r["cout"] <= MAX_CONV3X3_COUT and r.get("stride", 1) == 1
    return kind in ("tail", "fused-proj-tail") or RESNET50_STAGES[r["stage"]][0] <= MAX_PROJECTION_CIN


def pool_head_row(e2e: dict) -> dict | None:
    """The network's head from the run's own profiles (same run, batch 2048): TensorRT's standalone
    DequantizeLinear(s) and GlobalAveragePool in the plugins-off engine against the layers named after the
    TrtfuseAvgPool node in the plugins-all engine, by the prefix the rewrite gives them all (``TrtfuseAvgPool_<k>``):
    the plugin, its two DequantizeLinears (``..._DequantizeLinear_hi``, ``..._DequantizeLinear_lo``) and their Add
    (``..._Add``), run on their own or fused with each other (TensorRT names a fused layer after its parts, e.g.
    ``TrtfuseAvgPool_0_DequantizeLinear_lo + TrtfuseAvgPool_0_Add``), and any reformat into them; not a layer that also
    names the fc's Gemm (both engines run the fc; what is fused into it costs nothing apart). Its exactness is
    tests/test_avgpool.py's, not this run's."""
    prof = e2e.get("profile") or {}
    off, on = (dict(map(tuple, (prof.get(m) or {}).get("top", []))) for m in ("off", "all"))
    trt = sum(v for k, v in off.items() if "GlobalAveragePool" in k or ("DequantizeLinear" in k and "Conv" not in k))
    ours = sum(v for k, v in on.items() if f"{POOL_OP}_" in k and "Gemm" not in k)
    if not trt or not ours:
        return None
    return {"name": "head", "kind": "pool-head", "batch": prof["all"]["batch"], "ours_ms": round(ours, 4),
            "trt_ms": round(trt, 4), "speedup": round(trt / ours, 3), "replaced": True, "exact": None,
            "source": "network profile (TensorRT's dequantize + GlobalAveragePool with plugins off)"}


def compose(layers: dict, e2e: dict, e2e2: dict | None = None, e2e2_keys=SECOND_RUN_KEYS) -> dict:
    missing = {}
    first_run = {}
    if e2e2:
        for key in e2e2_keys:
            if e2e2.get(key) is not None and e2e.get(key) is not None:
                first_run[key] = e2e.get(key)
        e2e = {**e2e, **{k: v for k, v in e2e2.items() if k in e2e2_keys and v}}
    rows = [{"name": r["stage"], "kind": r.get("kind", "tail"), "batch": r["batch"], "ours_ms": round(r["ours_ms"], 4),
             "trt_ms": round(r["trt_ms"], 4), "speedup": round(r["trt_ms"] / r["ours_ms"], 3),
             "replaced": replaced(r),
             "exact": all(c["ok"] for c in r["checks"])} for r in layers.get("rows", [])]
    head = pool_head_row(e2e)
    if head:
        rows.append(head)
    prof = (e2e.get("profile") or {}).get("all")
    offline = e2e.get("offline")
    server = e2e.get("server")
    agreement = (e2e.get("resnet50_agreement") or {}).get("all")
    accuracy = e2e.get("accuracy")
    if not accuracy or accuracy.get("int8_plugins_all_top1") is None:
        missing["accuracy"] = "EfficientNet-Lite0 with --plugins all was not run"
        accuracy = None
    if server and e2e.get("server_search"):
        server = {**server, "search": e2e["server_search"]}
    return {
        "gpu": e2e.get("gpu"), "trt_version": e2e.get("trt_version"), "copy_gbps": round(layers.get("copy_gbps", 0), 1),
        "weights": "random (no ImageNet ResNet-50 weights can be installed here): performance only",
        "layers": rows,
        "engine": [{"model": r["model"], "batch": r["batch"], "plugins": r["plugins"],
                    "samples_per_s": r["samples_per_s"]} for r in e2e.get("engine", []) if r["model"] == "resnet50"],
        "speedup": e2e.get("speedup"),
        "profile": None if not prof else {k: prof[k] for k in ("batch", "total_ms", "ours_ms", "trt_ms")},
        "offline": None if not offline else {k: offline.get(k) for k in
                                             ("batch", "plugins", "samples_per_s", "engine_samples_per_s", "valid",
                                              "min_duration_s")},
        "server": server,
        "agreement": None if not agreement else {k: agreement[k] for k in
                                                 ("n", "top1_agreement", "centered_top1_agreement",
                                                  "max_abs_logit_diff", "max_abs_logit")},
        "accuracy": accuracy,
        "missing": missing,
        "first_run": first_run or None,
        "second_run_note": (f"only {', '.join(e2e2_keys)} taken from it; its note: {e2e2['note']}"
                            if e2e2 and e2e2.get("note") else None),
        "sources": {"layers": "conv_layers_h100.json (benchmarks/conv_layers_device.sh), rows of "
                              "conv_layers_fused_h100.json (trtfuse bench layers --kind residual --layers fused1,fused2), "
                              "of conv3x3_h100.json (trtfuse bench layers --kind conv3x3), of stem_h100.json "
                              "(trtfuse bench layers --kind stem) and of next_conv_h100.json (trtfuse bench layers --kind next)",
                    "network": "resnet50_fullnet_e2e_h100.json (trtfuse bench e2e --plugins off,tails,all)",
                    "second_run": ("resnet50_fullnet_e2e2_h100.json: " + ", ".join(e2e2_keys)) if e2e2 else None},
    }


def table(d: dict) -> str:
    lines = [f"{d['gpu']}, TensorRT {d['trt_version']}, copy {d['copy_gbps']:.0f} GB/s ({d['weights']})",
             f"{'layer':12} {'kind':15} {'batch':>5} {'ours ms':>8} {'TRT ms':>8} {'speedup':>7}  replaced"]
    for r in d["layers"]:
        lines.append(f"{r['name']:12} {r['kind']:15} {r['batch']:5d} {r['ours_ms']:8.4f} {r['trt_ms']:8.4f} "
                     f"{r['speedup']:7.3f}  {'yes' if r['replaced'] else 'no'}")
    lines.append(f"{'engine':6} {'plugins':7} {'batch':>5} {'samples/s':>10}")
    for r in d["engine"]:
        lines.append(f"{'':6} {r['plugins']:7} {r['batch']:5d} {r['samples_per_s']:10,.0f}")
    for key in ("speedup", "profile", "offline", "agreement"):
        lines.append(f"{key}: {json.dumps(d[key])}")
    s = d["server"] or {}
    lines.append(f"server (plugins {s.get('plugins')}): {s.get('qps')} QPS valid {s.get('valid')} p99 {s.get('p99_ms')} ms")
    lines.append(f"accuracy: {json.dumps(d['accuracy'])}")
    if d["missing"]:
        lines.append(f"missing: {d['missing']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=Path, nargs="+",
                   default=[RESULTS / "conv_layers_h100.json", RESULTS / "conv_layers_fused_h100.json",
                            RESULTS / "conv3x3_h100.json", RESULTS / "stem_h100.json", RESULTS / "next_conv_h100.json"],
                   help="layer runs, later ones replacing rows of earlier ones")
    p.add_argument("--e2e", type=Path, default=RESULTS / "resnet50_fullnet_e2e_h100.json")
    p.add_argument("--e2e2", type=Path, default=RESULTS / "resnet50_fullnet_e2e2_h100.json",
                   help="a second network run whose --e2e2-keys replace the first's (skipped if absent)")
    p.add_argument("--e2e2-keys", default=",".join(SECOND_RUN_KEYS), help="what the second run replaces")
    p.add_argument("--out", type=Path, default=RESULTS / "resnet50_fullnet_h100.json")
    args = p.parse_args(argv)
    for f in (*args.layers, args.e2e):
        if not f.is_file():
            p.error(f"{f} does not exist: make it on the GPU machine first (see this script's docstring)")
    e2e2 = json.loads(args.e2e2.read_text()) if args.e2e2.is_file() else None
    keys = tuple(k for k in args.e2e2_keys.split(",") if k)
    unknown = set(keys) - set(SECOND_RUN_KEYS)
    if unknown:
        p.error(f"--e2e2-keys: unknown {sorted(unknown)}; choose from {SECOND_RUN_KEYS}")
    layers = merge_layers([json.loads(f.read_text()) for f in args.layers])
    d = compose(layers, json.loads(args.e2e.read_text()), e2e2, keys)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(d, indent=1) + "\n")
    tmp.replace(args.out)
    print(table(d))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
