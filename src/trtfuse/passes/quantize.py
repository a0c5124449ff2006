"""Post-training int8 quantization of a CNN's ONNX graph into explicit QuantizeLinear/DequantizeLinear.

Placement (what TensorRT's explicit-quantization fusions and the TrtfuseResidualConv plugin need):
  * every Conv's activation input: one Q/DQ pair per tensor (per-tensor scale, zero point 0), shared
    by every conv (and residual Add) that reads the tensor;
  * every Conv's weight: per output channel (axis 0), symmetric, ``scale = amax / 127``, stored as an
    int8 initializer feeding a DequantizeLinear (``weights_as_float_qdq`` gives TensorRT 8.5 the
    older float-weight ``Q -> DQ`` form of the same values);
  * residual Add: only the identity branch is quantized (the other input comes straight from a conv,
    so TensorRT fuses the Add into that conv), and the block output (after its ReLU, if any) too,
    so every bottleneck tail has int8 on all its edges (the fused plugin's contract);
  * nothing between a conv and its BN/ReLU: BNs are folded first (``bn_fold``).

Calibration runs the fp32 model in ONNX Runtime over a fixed calibration subset and collects, for
every tensor to quantize, its absolute max and a 2048-bin histogram of |x| (TensorRT's layout);
``max``, ``percentile`` and ``entropy`` (KL divergence, as TensorRT's entropy calibrator) turn the
same statistics into amax, so all methods cost one pair of calibration passes.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from trtfuse.errors import UserError
from trtfuse.passes.bn_fold import fold_batchnorm
from trtfuse.passes.canonical import canonicalize, is_relu

HIST_BINS = 2048
METHODS = ("max", "percentile", "entropy")
QDQ_OPSET = 13  # per-axis DequantizeLinear; TensorRT 8.5 parses opsets up to 17


# ----------------------------------------------------------------------------- calibration subset
def calibration_split(names: list[str], every: int = 7) -> tuple[list[int], list[int]]:
    """(calibration indices, evaluation indices): image i (in sorted-name order) calibrates iff
    ``i % every == 0``. A fixed rule so the two sets never overlap and anyone can rebuild them."""
    order = sorted(range(len(names)), key=lambda i: names[i])
    calib = sorted(order[i] for i in range(0, len(order), every))
    chosen = set(calib)
    return calib, [i for i in range(len(names)) if i not in chosen]


# ----------------------------------------------------------------------------- graph analysis
@dataclass
class QuantPlan:
    """Which tensors get an activation Q/DQ, and which (node, input index) read them through it."""

    activations: dict[str, list[tuple[onnx.NodeProto, int]]] = field(default_factory=dict)
    convs: list[onnx.NodeProto] = field(default_factory=list)
    identity_adds: int = 0

    def add(self, tensor: str, node=None, index: int = 0) -> None:
        readers = self.activations.setdefault(tensor, [])
        if node is not None and (node, index) not in readers:
            readers.append((node, index))


def _users(graph) -> dict[str, list[onnx.NodeProto]]:
    users = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            users[name].append(node)
    return users


def residual_branches(graph, add: onnx.NodeProto, producer, users) -> tuple[int, int] | None:
    """(main input index, identity input index) of a residual Add, or None if it is not one.

    Main branch: produced by a Conv whose output only this Add reads and whose own input has a
    single reader. That tells the last conv of a block from a projection shortcut (its input fans
    out to the block's first conv too) and from the previous block's output (read again later).
    """
    if add.op_type != "Add" or len(add.input) != 2:
        return None

    def is_main(i):
        conv = producer.get(add.input[i])
        return (conv is not None and conv.op_type == "Conv" and len(users[add.input[i]]) == 1
                and len(users[conv.input[0]]) == 1)

    def is_activation(i):
        return add.input[i] in producer or add.input[i] in {g.name for g in graph.input}

    if not (is_activation(0) and is_activation(1)):
        return None  # a bias or constant Add, not a residual
    if is_main(0):
        return 0, 1
    if is_main(1):
        return 1, 0
    return None


def plan_quantization(model: onnx.ModelProto) -> QuantPlan:
    """Find the tensors to quantize in a BN-folded fp32 graph (see the module docstring)."""
    graph = model.graph
    inits = {t.name for t in graph.initializer}
    values = {t.name: t for t in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    users = _users(graph)
    plan = QuantPlan()

    def const(name):
        return numpy_helper.to_array(values[name]) if name in values else None

    for node in graph.node:
        if node.op_type == "Conv":
            if len(node.input) < 2 or node.input[1] not in inits:
                raise UserError(f"Conv {node.name!r} has a weight that is not a constant",
                                "export the model with constant weights (eval mode, constant folding on)")
            plan.convs.append(node)
            plan.add(node.input[0], node, 0)
    for node in graph.node:
        branches = residual_branches(graph, node, producer, users)
        if branches is None:
            continue
        _, ident = branches
        plan.add(node.input[ident], node, ident)
        plan.identity_adds += 1
        # The block output: after the ReLU (or Clip(0, inf)) that follows the Add, if one does.
        out = node.output[0]
        after = users[out]
        if len(after) == 1 and is_relu(after[0], const):
            out = after[0].output[0]
        plan.add(out)
    return plan


# ----------------------------------------------------------------------------- statistics
@dataclass
class TensorStats:
    amax: float = 0.0
    hist: np.ndarray | None = None  # HIST_BINS counts of |x| over [0, amax]


def collect_stats(model: onnx.ModelProto, batches, tensors: list[str], progress: bool = True,
                  threads: int = 0) -> dict[str, TensorStats]:
    """Run the fp32 ``model`` in ONNX Runtime over ``batches`` (a re-iterable of float32 arrays)
    twice: once for each tensor's |x| max, once for its histogram over [0, max]."""
    import onnxruntime as ort

    probe = onnx.ModelProto.FromString(model.SerializeToString())
    existing = {o.name for o in probe.graph.output}
    for name in tensors:
        if name not in existing:
            probe.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = threads
    session = ort.InferenceSession(probe.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name
    stats = {name: TensorStats() for name in tensors}

    def run(label):
        batches_list = list(batches)
        for i, batch in enumerate(batches_list):
            if progress:
                print(f"\r  calibration {label}: batch {i + 1}/{len(batches_list)}", end="",
                      file=sys.stderr, flush=True)
            yield dict(zip(tensors, session.run(tensors, {input_name: batch})))
        if progress:
            print(file=sys.stderr)

    for values in run("pass 1/2 (max)"):
        for name, v in values.items():
            stats[name].amax = max(stats[name].amax, float(np.abs(v).max()))
    for name in tensors:
        stats[name].hist = np.zeros(HIST_BINS, np.int64)
    for values in run("pass 2/2 (histograms)"):
        for name, v in values.items():
            top = stats[name].amax or 1.0
            h, _ = np.histogram(np.abs(v), bins=HIST_BINS, range=(0.0, top))
            stats[name].hist += h
    return stats


def amax_from_stats(stats: TensorStats, method: str, percentile: float = 99.99) -> float:
    """One tensor's clipping threshold by ``method`` (max | percentile | entropy)."""
    if method == "max" or stats.amax == 0.0:
        return stats.amax
    width = stats.amax / HIST_BINS
    if method == "percentile":
        cdf = np.cumsum(stats.hist) / max(stats.hist.sum(), 1)
        idx = int(np.searchsorted(cdf, percentile / 100.0))
        return float(min(idx + 1, HIST_BINS) * width)
    if method == "entropy":
        return float(_entropy_bins(stats.hist) * width)
    raise UserError(f"unknown calibration method {method!r}", f"use one of: {', '.join(METHODS)}")


def _entropy_bins(hist: np.ndarray, levels: int = 128, start: int = 128) -> int:
    """Number of histogram bins to keep that minimises KL(P || Q), as TensorRT's entropy calibrator:
    P = the histogram cut at i bins with the tail folded into the last bin, Q = P squeezed into
    ``levels`` int8 levels and expanded back over P's non-empty bins. Ties go to the most bins
    (the least clipping), as TensorRT's last argmin."""
    kl = _entropy_divergences(hist, levels, start)
    finite = np.isfinite(kl)
    if not finite.any():
        return len(hist)  # nothing to choose from (no counts): keep the whole range
    # A tie is a tie within rounding: cuts that tie exactly (a sparse histogram whose P equals Q at
    # several of them) come out about 1e-16 apart, and which side wins differed between machines
    # (test_entropy_degenerate_histograms passed on one CI machine and picked the other cut on another).
    ties = np.flatnonzero(kl <= kl[finite].min() + 1e-12)
    return start + int(ties[-1])


def _entropy_divergences(hist: np.ndarray, levels: int = 128, start: int = 128) -> np.ndarray:
    """KL(P || Q) for every candidate i = start..len(hist) bins (inf where undefined), at once.

    Within a level, Q gives each non-empty bin the level's mean (sum S over n non-empty bins), so
    sum_j h_j log(h_j / q_j) = sum_j h_j log h_j - sum_levels S log(S / n): prefix sums instead of
    a 2048-step loop over P and Q (that took 0.3 s per tensor, half a minute per model)."""
    h = hist.astype(np.float64)  # a copy: the caller's statistics stay as collected
    # Bin 0 holds the exact zeros (after a ReLU/ReLU6 often most of the tensor). They quantize
    # exactly at any scale, but left in, that one spike decides KL: Q spreads it evenly over the
    # bins sharing bin 0's level, which costs least with the fewest bins per level, so every
    # ReLU output got a threshold near ``start`` bins (EfficientNet-Lite0: top-1 0.16 %).
    # TensorRT's calibrator (and pytorch-quantization's copy of it) replace bin 0 by bin 1.
    if len(h) > 1:
        h[0] = h[1]
    total = h.sum()
    i = np.arange(start, len(h) + 1)
    if total == 0:
        return np.full(len(i), np.inf)
    csum = np.concatenate([[0.0], np.cumsum(h)])
    nonempty = np.concatenate([[0], np.cumsum(h > 0)])
    hlogh = np.concatenate([[0.0], np.cumsum(_xlogx(h))])
    edges = np.arange(levels + 1) * i[:, None] // levels  # [candidates, levels + 1], integer edges
    level_sum = np.diff(csum[edges], axis=1)
    level_mean = level_sum / np.maximum(np.diff(nonempty[edges], axis=1), 1)
    kept, last, tail = csum[i], h[i - 1], total - csum[i]
    q_last = level_mean[:, -1]  # Q's count in the last kept bin (if that bin is non-empty)
    with np.errstate(divide="ignore", invalid="ignore"):
        # sum of p log(p / q) over the kept bins (p, q in counts) without the tail ...
        log_mean = np.log(np.where(level_sum > 0, level_mean, 1))
        plogpq = hlogh[i] - np.sum(level_sum * log_mean, axis=1)
        # ... then the last bin's term redone with the tail folded into p
        plogpq += _xlogx(last + tail) - _xlogx(last) - tail * np.log(np.where(last > 0, q_last, 1))
        # normalised: P sums to total, Q to the kept counts
        kl = plogpq / total + np.log(kept / total)
    # P has mass where Q has none (the folded tail past an empty bin), or Q is empty: KL is infinite
    kl[(kept == 0) | ((last == 0) & (tail > 0))] = np.inf
    return kl


def _xlogx(x):
    return np.where(x > 0, x * np.log(np.where(x > 0, x, 1)), 0.0)


# ----------------------------------------------------------------------------- QDQ insertion
def _scale(amax: float) -> float:
    # A tensor that is all zeros on the calibration set still needs a valid (non-zero) scale.
    return float(amax) / 127.0 if amax > 0 else 1.0 / 127.0


def quantize_weights(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-output-channel symmetric int8: (int8 values, float32 scales [Cout]), q = round(w/s)."""
    flat = np.abs(w.reshape(w.shape[0], -1)).max(axis=1).astype(np.float64)
    scale = np.where(flat > 0, flat / 127.0, 1.0)
    q = np.clip(np.round(w / scale.reshape(-1, *([1] * (w.ndim - 1)))), -127, 127).astype(np.int8)
    return q, scale.astype(np.float32)


def insert_qdq(model: onnx.ModelProto, plan: QuantPlan, amax: dict[str, float]) -> onnx.ModelProto:
    """``model`` with Q/DQ pairs per ``plan`` (activation scales from ``amax``) and int8 weights."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    new_nodes_after: dict[str, list[onnx.NodeProto]] = defaultdict(list)  # tensor -> nodes to add
    weight_nodes: dict[int, list[onnx.NodeProto]] = defaultdict(list)      # conv id -> DQ nodes

    for tensor, readers in plan.activations.items():
        if tensor not in amax:
            raise KeyError(f"no calibration amax for {tensor}")
        s, zp, q, dq = (f"{tensor}_scale", f"{tensor}_zero_point", f"{tensor}_quantized",
                        f"{tensor}_dequantized")
        graph.initializer.append(numpy_helper.from_array(np.array(_scale(amax[tensor]), np.float32), s))
        graph.initializer.append(numpy_helper.from_array(np.array(0, np.int8), zp))
        new_nodes_after[tensor] = [
            helper.make_node("QuantizeLinear", [tensor, s, zp], [q], name=f"{tensor}_QuantizeLinear"),
            helper.make_node("DequantizeLinear", [q, s, zp], [dq], name=f"{tensor}_DequantizeLinear"),
        ]
        for node, index in readers:
            node.input[index] = dq
        if not readers:
            # A block output read by non-conv layers only (the last block -> pooling): they read the
            # dequantized tensor, so the tail's int8 output scale is real, not just recorded.
            for node in graph.node:
                for k, name in enumerate(node.input):
                    if name == tensor:
                        node.input[k] = dq

    for conv in plan.convs:
        w_name = conv.input[1]
        w = numpy_helper.to_array(inits[w_name]).astype(np.float32)
        q, scale = quantize_weights(w)
        base = f"{conv.name or conv.output[0]}_weight"
        graph.initializer.append(numpy_helper.from_array(q, f"{base}_int8"))
        graph.initializer.append(numpy_helper.from_array(scale, f"{base}_scale"))
        graph.initializer.append(numpy_helper.from_array(np.zeros(len(scale), np.int8), f"{base}_zero_point"))
        weight_nodes[id(conv)].append(helper.make_node(
            "DequantizeLinear", [f"{base}_int8", f"{base}_scale", f"{base}_zero_point"],
            [f"{base}_dequantized"], name=f"{base}_DequantizeLinear", axis=0))
        conv.input[1] = f"{base}_dequantized"

    # Rebuild the node list in topological order: Q/DQ right after the producer of their tensor
    # (graph inputs first), weight DQs right before their conv.
    graph_inputs = {i.name for i in graph.input}
    ordered = []
    for tensor in plan.activations:
        if tensor in graph_inputs:
            ordered.extend(new_nodes_after.pop(tensor))
    for node in list(graph.node):
        ordered.extend(weight_nodes.get(id(node), []))
        ordered.append(node)
        for out in node.output:
            ordered.extend(new_nodes_after.pop(out, []))
    if new_nodes_after:
        raise ValueError(f"tensors to quantize with no producer: {sorted(new_nodes_after)[:5]}")
    del graph.node[:]
    graph.node.extend(ordered)
    _drop_unused(graph)
    _ensure_opset(model, QDQ_OPSET)
    return model


def _drop_unused(graph) -> None:
    used = {name for node in graph.node for name in node.input}
    keep = [t for t in graph.initializer if t.name in used]
    stale = {t.name for t in graph.initializer} - used
    del graph.initializer[:]
    graph.initializer.extend(keep)
    inputs = [i for i in graph.input if i.name not in stale]
    del graph.input[:]
    graph.input.extend(inputs)


def _ensure_opset(model: onnx.ModelProto, version: int) -> None:
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx") and opset.version < version:
            raise UserError(f"the model uses ONNX opset {opset.version}; per-channel "
                            f"QuantizeLinear needs opset {version} or newer",
                            f"re-export the model with opset_version >= {version}")


def weights_as_float_qdq(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same network with each int8 weight ``DQ(W_int8)`` rewritten as ``DQ(Q(W_float))``.

    Why: TensorRT 8.5's ONNX parser expects quantized weights as float constants behind a
    QuantizeLinear (the pytorch-quantization export form); newer TensorRT reads both. The values are
    exactly ``W_int8 * scale``, so ``Q`` gives back ``W_int8`` and the network is unchanged.
    """
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    out_nodes = []
    for node in graph.node:
        src = node.input[0] if node.op_type == "DequantizeLinear" else None
        if src in inits and inits[src].data_type == TensorProto.INT8:
            q = numpy_helper.to_array(inits[src]).astype(np.float32)
            scale = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            shape = [1] * q.ndim
            if scale.ndim:
                shape[axis] = -1
            fname = f"{src}_float"
            graph.initializer.append(numpy_helper.from_array(q * scale.reshape(shape), fname))
            qname = f"{src}_requantized"
            out_nodes.append(helper.make_node(
                "QuantizeLinear", [fname, *node.input[1:]], [qname], name=f"{src}_QuantizeLinear",
                **({"axis": axis} if scale.ndim else {})))
            node.input[0] = qname
        out_nodes.append(node)
    del graph.node[:]
    graph.node.extend(out_nodes)
    _drop_unused(graph)
    return model


# ----------------------------------------------------------------------------- the whole step
@dataclass
class QuantizeResult:
    model: onnx.ModelProto
    method: str
    folded_bn: int
    activation_qdq: int
    weight_qdq: int
    identity_adds: int
    percentile: float | None = None  # the percentile of method "percentile"


def quantize(model: onnx.ModelProto, stats: dict[str, TensorStats], method: str,
             percentile: float = 99.99) -> QuantizeResult:
    """BN-fold ``model`` (if not done) and insert Q/DQ with amax from ``stats`` by ``method``. Constants an exporter
    wrote as nodes (``Constant``, ``Identity`` of an initializer) become initializers first, and an opset-18 graph
    opset 17 where it means the same (canonical.py)."""
    folded, n_bn = fold_batchnorm(canonicalize(model))
    plan = plan_quantization(folded)
    amax = {name: amax_from_stats(stats[name], method, percentile) for name in plan.activations}
    out = insert_qdq(folded, plan, amax)
    onnx.checker.check_model(out)
    return QuantizeResult(out, method, n_bn, len(plan.activations), len(plan.convs),
                          plan.identity_adds, percentile if method == "percentile" else None)


def calibrate(model: onnx.ModelProto, batches, progress: bool = True) -> dict[str, TensorStats]:
    """Statistics of every tensor ``plan_quantization`` picks, from the fp32 model on ``batches``."""
    folded, _ = fold_batchnorm(canonicalize(model))
    plan = plan_quantization(folded)
    return collect_stats(folded, batches, list(plan.activations), progress)


def top1_onnxruntime(model: onnx.ModelProto | bytes, images: np.ndarray, labels: np.ndarray,
                     label_offset: int = 0, batch: int = 32, progress: bool = True) -> tuple[float, np.ndarray]:
    """(top-1 accuracy, logits) of ``model`` in ONNX Runtime CPU, Q/DQ evaluated as written.

    Why graph optimizations are off: ORT would fuse DQ->Conv->Q into its x86 int8 kernels, whose
    u8s8 VPMADDUBSW path saturates 16-bit sums with full-range int8 weights (ORT's documented
    "saturation issue"); on EfficientNet-Lite0 that alone cost 20 points of top-1 here. Unfused,
    every Q/DQ rounds and clamps exactly as ONNX defines it and the conv accumulates in fp32: the
    int8 network as TensorRT means it, up to TensorRT's own accumulation order.
    """
    import onnxruntime as ort

    data = model if isinstance(model, bytes) else model.SerializeToString()
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    outs = []
    for start in range(0, len(images), batch):
        if progress:
            print(f"\r  onnxruntime: {start}/{len(images)}", end="", file=sys.stderr, flush=True)
        outs.append(session.run(None, {name: np.ascontiguousarray(images[start:start + batch])})[0])
    if progress:
        print(file=sys.stderr)
    logits = np.concatenate(outs).reshape(len(images), -1)
    pred = logits.argmax(axis=1) - label_offset
    return float((pred == labels).mean()), logits


# The candidates of ``choose_method``, simplest first: a tie keeps the earlier one.
METHOD_CANDIDATES = (("max", None), ("percentile", 99.99), ("percentile", 99.999), ("entropy", None))


def method_label(method: str, percentile: float | None) -> str:
    return method if method != "percentile" else f"percentile-{percentile:g}"


def choose_method(model: onnx.ModelProto, stats: dict[str, TensorStats], images: np.ndarray,
                  labels: np.ndarray, label_offset: int = 0, candidates=METHOD_CANDIDATES,
                  progress: bool = True) -> tuple[QuantizeResult, dict[str, float]]:
    """The calibration method whose int8 model scores the best top-1 on ``images`` (held apart from
    the calibration images), measured in ONNX Runtime; ties keep the earlier, simpler method.
    Returns (the chosen quantization, top-1 of every candidate by label)."""
    scores: dict[str, float] = {}
    best = None
    for method, pct in candidates:
        result = quantize(model, stats, method, pct or 99.99)
        label = method_label(method, pct)
        scores[label], _ = top1_onnxruntime(result.model, images, labels, label_offset, progress=progress)
        if progress:
            print(f"trtfuse: int8 ({label}) top-1 {scores[label] * 100:.2f} % on {len(images)} images",
                  file=sys.stderr)
        if best is None or scores[label] > best[0]:
            best = (scores[label], result)
    return best[1], scores
