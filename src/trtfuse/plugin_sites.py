"""Per fusion site: trtfuse's plugin node against the TensorRT layers it takes the place of, at one batch, and the
sites to leave to TensorRT (``tensorrt.plugin_exclude``).

The evidence is TensorRT's own per-layer profile (engine_inspect.profile_engine) of two engines built alike but for
their plugins: one with plugins off, one with them. The rewrite lists, for each plugin node it wrote, its site ids
(residual_conv_rewrite.site_id) and the names of the graph's nodes it replaced (FusionReport.sites). TensorRT names a
layer after the ONNX nodes it fused, joined by " + " (reformatting layers after the layer they feed), so:

* ours: the layers of the plugins-on engine whose name holds the plugin node's name (or, for the pool head, one of
  the nodes written under its name);
* TensorRT's: the layers of the plugins-off engine whose name holds one of the replaced nodes' names.

A layer that holds nodes of several plugin nodes is split evenly between them. A node is kept where its time is at
most TensorRT's for the same nodes (times ``1 + margin``); where it loses, the one site of it that can go alone goes
(losers): a chained next conv1 first, else a projection + tail pair (two nodes then), else the node's own site. A
second round (auto_exclude) measures what the first left (a tail without its conv1, a pair as two nodes). A node
whose TensorRT layers were not found (no name matched) is reported as unmapped and kept.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

from trtfuse.build_config import BuildConfig

# what TensorRT puts between the node names in a layer's name: " + " between fused nodes, "Reformatting CopyNode for
# Input Tensor 0 to NAME", "PWN(NAME)" for fused pointwise layers
_SEPARATORS = re.compile(r"[\s+()\[\]]+")


def layer_tokens(layer_name: str) -> set[str]:
    """The node names a TensorRT layer's name may hold (its words)."""
    return {t for t in _SEPARATORS.split(layer_name) if t}


def _qdq(name: str) -> bool:
    return "QuantizeLinear" in name or "DequantizeLinear" in name


def attribute(layers: dict[str, float], groups: dict[str, set[str]],
              others: frozenset[str] = frozenset()) -> tuple[dict[str, float], float, list]:
    """Each layer's ms (``layers``: name -> ms) to the groups (group -> node names) whose names it holds, split evenly
    where it holds several. A Q/DQ node's name alone takes a layer only where the layer holds no name of ``others``
    (the graph's compute nodes outside every group): TensorRT folds a QuantizeLinear into the layer before it or the
    one after, and the one after may be a neighbour's conv. Returns ({group: ms}, the ms of the layers no group
    takes, [(layer, [groups])] of the layers taken)."""
    owner = {name: g for g, names in groups.items() for name in names}
    out = {g: 0.0 for g in groups}
    rest, held = 0.0, []
    for layer, ms in layers.items():
        tokens = layer_tokens(layer)
        gs = sorted({owner[t] for t in tokens if t in owner and not _qdq(t)})
        if not gs and not tokens & others:
            gs = sorted({owner[t] for t in tokens if t in owner})
        if not gs:
            rest += ms
            continue
        for g in gs:
            out[g] += ms / len(gs)
        held.append((layer, gs))
    return out, rest, held


def compare(off_layers: dict[str, float], on_layers: dict[str, float], nodes: list[dict],
            margin: float = 0.0, graph_nodes: frozenset[str] = frozenset()) -> dict:
    """Per plugin node (``nodes``: FusionReport.sites): ours (``on_layers``, the plugins-on engine's per-layer ms)
    against TensorRT's (``off_layers``, the plugins-off engine's) for the nodes it replaced. ``graph_nodes``: the
    names of the plugins-off graph's nodes (attribute's ``others``). Rows: node, kind, sites, ours_ms, tensorrt_ms,
    ratio (ours / TensorRT's), verdict ("wins", "loses", "unmapped"), and the layers each side was given."""
    ours_groups = {n["node"]: {n["node"], *n.get("written", ())} for n in nodes}
    trt_groups = {n["node"]: set(n["replaced"]) for n in nodes}
    replaced = {name for names in trt_groups.values() for name in names}
    others = frozenset(name for name in graph_nodes if name not in replaced and not _qdq(name))
    ours, ours_rest, ours_held = attribute(on_layers, ours_groups)
    trt, trt_rest, trt_held = attribute(off_layers, trt_groups, others)
    rows = []
    for n in nodes:
        o, t = ours[n["node"]], trt[n["node"]]
        verdict = ("unmapped" if t <= 0 or o <= 0 else "loses" if o > t * (1 + margin) else "wins")
        rows.append({"node": n["node"], "kind": n["kind"], "sites": list(n["sites"]), "ours_ms": round(o, 5),
                     "tensorrt_ms": round(t, 5), "ratio": round(o / t, 4) if t > 0 and o > 0 else None,
                     "verdict": verdict,
                     "ours_layers": [layer for layer, gs in ours_held if n["node"] in gs],
                     "tensorrt_layers": [layer for layer, gs in trt_held if n["node"] in gs]})
    return {"rows": rows, "margin": margin,
            "ours_ms": round(sum(r["ours_ms"] for r in rows), 5),
            "tensorrt_ms": round(sum(r["tensorrt_ms"] for r in rows), 5),
            # the rest of each engine: the layers both engines run (they should agree), and what no name matched
            "rest_on_ms": round(ours_rest, 5), "rest_off_ms": round(trt_rest, 5),
            "total_on_ms": round(sum(on_layers.values()), 5), "total_off_ms": round(sum(off_layers.values()), 5)}


def losers(rows: list[dict]) -> list[str]:
    """The site ids to exclude for the rows that lose: per node, the one site that can go without the others (a
    chained next conv1, else a projection + tail pair, else the node's own site)."""
    out = []
    for r in rows:
        if r["verdict"] != "loses":
            continue
        by_kind = {s.partition(":")[0]: s for s in r["sites"]}
        out.append(by_kind.get("next") or by_kind.get("fused") or r["sites"][0])
    return sorted(out)


def select(rows: list[dict], before: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The exclusion after a round: the one before it and this round's losers."""
    return tuple(sorted(set(before) | set(losers(rows))))


def format_rows(result: dict) -> str:
    """The comparison as a table: node, its sites, ours and TensorRT's ms, the ratio and verdict."""
    lines = [f"  {'ours ms':>9} {'TRT ms':>9} {'ratio':>6}  {'verdict':8}  node: sites"]
    for r in result["rows"]:
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
        lines.append(f"  {r['ours_ms']:9.4f} {r['tensorrt_ms']:9.4f} {ratio:>6}  {r['verdict']:8}  "
                     f"{r['node']}: {', '.join(r['sites'])}")
    lines.append(f"  sum: ours {result['ours_ms']:.4f} ms, TensorRT's {result['tensorrt_ms']:.4f} ms; rest of the "
                 f"engines {result['rest_on_ms']:.4f} (on) / {result['rest_off_ms']:.4f} (off) ms")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- on the GPU
def sites_of(model_dir: Path, cfg: BuildConfig) -> tuple[list[dict], frozenset[str]]:
    """The plugin nodes of ``cfg``'s rewrite of the model's Q/DQ graph, with their sites (FusionReport.sites): what
    onnx_for_build hands TensorRT, recomputed on the CPU (the rewrite is deterministic); and the names of the Q/DQ
    graph's nodes (compare's ``graph_nodes``)."""
    import onnx
    from trtfuse.passes.fusions import rewrite
    from trtfuse.passes.residual_conv_rewrite import node_name
    from trtfuse.quantize_step import QDQ_FILE

    model = onnx.load(Path(model_dir) / QDQ_FILE)
    sites = rewrite(model, cfg.plugins, cfg.precision, cfg.weight_dtype, cfg.plugin_exclude).report.sites
    return sites, frozenset(node_name(n) for n in model.graph.node)


def layer_ms(profile: dict) -> dict[str, float]:
    """engine_inspect.profile_engine's rows as {layer: ms}."""
    return {r["layer"]: r["ms"] for r in profile["layers"]}


def profile_pair(off_engine: Path, on_engine: Path, sites: tuple[list[dict], frozenset[str]], batch: int,
                 runs: int = 50, plugin_lib: str | None = None, margin: float = 0.0) -> dict:
    """Both engines' per-layer profiles at ``batch`` and the per-node comparison (compare) of ``sites`` (sites_of's
    answer)."""
    from trtfuse.engine_inspect import profile_engine

    off = profile_engine(off_engine, batch, runs, plugin_lib)
    on = profile_engine(on_engine, batch, runs, plugin_lib)
    result = compare(layer_ms(off), layer_ms(on), sites[0], margin, sites[1])
    result.update(batch=batch, runs=runs, off_engine=str(off_engine), on_engine=str(on_engine),
                  gpu=on.get("gpu"), tensorrt=on.get("tensorrt"), profile_off=off, profile_on=on)
    return result


def auto_exclude(model_dir: Path, cfg: BuildConfig, plugin_lib: str | None = None, runs: int = 50,
                 rounds: int = 2, margin: float = 0.0) -> tuple[tuple[str, ...], list[dict]]:
    """The sites of ``cfg``'s plugins that lose to TensorRT at ``cfg.batch`` (its engine's opt batch): up to
    ``rounds`` rounds of build, profile (plugins off against ``cfg`` with the exclusion so far) and select, from
    ``cfg.plugin_exclude``. Returns (the exclusion, each round's comparison)."""
    from trtfuse.engine import build_engine

    off = build_engine(model_dir, dataclasses.replace(cfg, plugins="off", plugin_exclude=()), plugin_lib)
    exclude, records = tuple(cfg.plugin_exclude), []
    for k in range(rounds):
        now = dataclasses.replace(cfg, plugin_exclude=exclude)
        on = build_engine(model_dir, now, plugin_lib)
        result = profile_pair(off, on, sites_of(model_dir, now), cfg.batch, runs, plugin_lib, margin)
        result.update(round=k, exclude=list(exclude))
        records.append(result)
        print(f"trtfuse: plugin sites at batch {cfg.batch}, round {k} ({len(exclude)} excluded):\n"
              + format_rows(result), file=sys.stderr)
        after = select(result["rows"], exclude)
        if after == exclude:
            break
        exclude = after
    return exclude, records


def write_json(path: Path, data) -> Path:
    """``data`` as JSON at ``path``, whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)
    return path
