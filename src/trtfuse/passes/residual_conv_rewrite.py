"""Replace the residual block tails (and, when asked, the projections) of a Q/DQ graph with TrtfuseResidualConv
plugin nodes.

A tail, as ``src/trtfuse/passes/quantize.py`` leaves it (BN folded, so "conv" means conv + BN):

    Q(x) -> DQ -> Conv 1x1 (int8 weights, per-channel DQ; bias) -> Add <- DQ <- Q(r)   [identity]
                                                                 -> Relu? -> Q(out) -> DQ -> ...

becomes ``Q(x) -> TrtfuseResidualConv(x_q, r_q) -> DQ -> ...``: the plugin reads the two int8
tensors and writes the int8 tensor that ``Q(out)`` produced, so TensorRT gives it INT8 I/O (and,
with kCHW32, feeds it straight from the int8 conv before it). The Add's inputs may come in either
order (torchvision: ``Add(main, identity)``; TensorFlow exports such as MLPerf's resnet50_v1.onnx
may swap them); the identity may be a plain tensor or a projection conv's output, as long as it
passed through a Q/DQ. EfficientNet-Lite's MBConv tails have no ReLU (``relu=0``).

A projection (ResNet's downsample: conv 1x1 + BN, stride 1 or 2, no ReLU, its output quantized on its own)

    Q(x) -> DQ -> Conv 1x1, stride s -> Q(out)

becomes ``Q(x) -> TrtfuseResidualConv(x_q; r_scale 0, stride s) -> ...``, only where the plugin is faster than
TensorRT's own kernel: input channels up to ``MAX_PROJECTION_CIN``, output channels from ``MIN_PROJECTION_COUT``
(see there). A 1x1 conv followed by a ReLU (a bottleneck's conv1) is left to TensorRT, which runs it at the DRAM
floor already, unless the tail before it computes it too (``chain_next``, below).

A stride-1 3x3 conv + BN + ReLU (a bottleneck's conv2), when asked (``conv3x3``),

    Q(x) -> DQ -> Conv 3x3, pads 1, stride 1 -> Relu -> Q(out)

becomes ``Q(x) -> TrtfuseResidualConv(x_q; kernel_size 3, r_scale 0, relu 1) -> ...`` (the halo kernel), only where
it is faster than TensorRT's own kernel: output channels up to ``MAX_CONV3X3_COUT`` (see there).

The stem (ResNet's conv1 + BN + ReLU + max pool), when asked (``stem``),

    Q(x) -> DQ -> Conv 7x7, pads 3, stride 2 -> Relu -> MaxPool 3x3, pads 1, stride 2 -> Q(out)

becomes ``Q(x) -> TrtfuseResidualConv(x_q; kernel_size 7, stride 2, r_scale 0, relu 1) -> ...`` (the stem kernel,
which reads the network's int8 input as it comes: up to 4 input channels, 64 output channels).

A stage's first block, a replaced projection whose int8 output only a tail reads (as its residual), becomes one
node (``fuse``, the default with projections): ``TrtfuseResidualConv(x_q, xp_q) -> ...`` with the tail's fields and
the projection's as ``proj_*`` fields (``proj_weights``, ``proj_w_scale``, ``proj_bias``, ``proj_x_scale``,
``proj_out_scale``, ``proj_cin``, ``proj_stride``): x_q is the tail's input, xp_q the block input (the projection's),
and the projection's output never goes to memory. Only where the fused kernel holds both weight matrices
(``MAX_FUSED_K_BYTES``): ResNet-50's layer1.0 and layer2.0; layer3.0 keeps two nodes.

A tail (plain or fused) whose int8 output the next bottleneck's conv1 reads, when asked (``chain_next``),

    tail -> out_q -> DQ -> Conv 1x1, stride 1 -> Relu -> Q(c1) -> ...

also computes that conv1 from its own output tile (``MAX_NEXT_TAIL_COUT``, ``MAX_NEXT_COUT``): the node gets a second
output, Q(c1)'s, and the conv's fields as ``next_*`` fields (``next_weights`` [next_cout][cout], ``next_w_scale``,
``next_bias``, ``next_x_scale``, ``next_out_scale``, ``next_cout``, ``next_relu``); the conv1, its ReLU and its
QuantizeLinear go, and the conv1 no longer reads the tail's output back from memory. ResNet-50: layer1.0 -> layer1.1,
layer1.1 -> layer1.2, layer1.2 -> layer2.0. A 3x3 node may read the second output directly (layer1.1's and layer1.2's
conv2); TensorRT 8.5 builds that only with the plugin's output types pinned (src/trtfuse/trt_graph.py:
pin_int8_plugin_outputs).

The stem, when replaced (``stem``) and asked (``chain_next``), chains the conv1 that reads its pooled output the same
way (``MAX_NEXT_STEM_COUT``): ResNet-50's layer1.0 conv1 (64 -> 64), which the stem kernel computes from its band's
pooled output in shared memory (plugins/conv_int8/kernels/stem_sm90.cuh, NEXT). The stem's node then has the second output and the next_* fields like a tail's
(layer1.0's downsample, the other reader of the pooled output, keeps reading output 0; under ``projections`` as the
fused projection + tail node's xp).

The network's head, when asked (``pool_head``): a GlobalAveragePool of a DequantizeLinear of an int8 tensor,

    t (int8) -> DQ(s, zero point 0) -> GlobalAveragePool -> y -> ...

becomes

    t -> TrtfuseAvgPool -> t_hi (int8 [N, C, 1, 1]) -> DQ(s, 0)       -> a
                        -> t_lo (int8 [N, C, 1, 1]) -> DQ(s / 256, 0) -> b ;  Add(a, b) -> y -> ...

(plugins/avgpool, version 3; no fields: the first DequantizeLinear keeps the original's scale and zero point (an
int8 0 where it had none), the second reads a new initializer holding exactly s / 256, a power-of-two scaling, exact
in fp32; a head whose s / 256 would be subnormal is left alone): one pass over the int8 bytes instead of TensorRT's
dequantize (int8 -> fp32 [N, C, H, W] in memory) and then its pool over the fp32 tensor (ResNet-50 at batch 2048 on
the H100: 0.27 + 0.16 ms).
The plugin writes int8 because TensorRT 8.5 wants a plugin with int8 input in a Q/DQ network bracketed
``Q -> plugin -> DQ`` (NVIDIA/TensorRT issue #3055; with an fp32 output feeding Flatten -> Gemm it refused ResNet-50).
It writes two: m, the nearest integer to 256 * sum / hw (ties to even), split as hi = floor((m + 128) / 256) and
lo = m - 256 * hi, so a + b = s * m / 256, within s / 512 of the exact mean. Version 2 wrote one int8 output, the mean
rounded to t's grid (up to s / 2 off): on random-weight ResNet-50 (H100, TensorRT 8.5.3.1) the centered top-1
agreement with the stock engine fell from 0.836 to 0.648 and the largest logit difference rose from 9.0 to 17.6 (of
888.5). The new nodes are named after the plugin's (``TrtfuseAvgPool_<k>_...``; benchmarks/resnet50_fullnet.py:
pool_head_row).

Each fusion kind (KINDS; each registered in src/trtfuse/passes/fusions.py with the --plugins modes that enable it) has its own
section below: its pattern (a dataclass), ``find_*`` and ``_match_*``; a matcher
answers a match, None (not a candidate) or ``Refused(reason)``, and ``rewrite_report`` returns, with the rewritten
model, a FusionReport (per kind: candidates found, fused, the first refusal) that ``trtfuse build`` prints. The
matchers read the math, not one exporter's spelling: constants through Identity / Constant nodes, ReLU or Clip(0, inf),
a zero Pad between a DequantizeLinear and its conv as the conv's padding, GlobalAveragePool or ReduceMean heads
(docs/int8_pipeline.md, "Any ResNet a user brings").

Fields follow docs/ARCHITECTURE.md exactly; the activation scales are copied from the neighbouring
Q/DQ nodes because TensorRT passes no scales to plugins in explicitly quantized networks.
``evaluate_with_reference`` runs a rewritten graph on CPU (ONNX Runtime between plugin nodes, the
numpy reference of the plugin at them) to check that the rewrite computes the same network.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from trtfuse.passes.canonical import constant_value, is_relu

PLUGIN_OP = "TrtfuseResidualConv"
POOL_OP = "TrtfuseAvgPool"
PLUGIN_DOMAIN = "trtfuse"
WEIGHT_DTYPES = {"int8": np.int8, "int32": np.int32, "float": np.float32}
# Projections with more input channels stay with TensorRT: the Hopper kernel keeps a 256 x Cin weight slice in shared
# memory and holds Cin <= 512; above it the sm80 kernel runs, measured at 0.42-0.48x TensorRT 8.5 on ResNet-50's
# layer4 projection (1024 -> 2048) on the H100 (benchmarks/results/conv_layers_h100.json).
MAX_PROJECTION_CIN = 512
# ... and with fewer output channels: the Hopper kernel's N tile is 256 channels, so a narrower projection (as
# EfficientNet-Lite0's, 16 to 112) would leave most of each tile padding. Not measured against TensorRT; until it is,
# those stay with TensorRT. (Every projection measured, ResNet-50's, has 256 to 2048.)
MIN_PROJECTION_COUT = 256
# A projection and the tail that reads it fuse into one node only where the fused kernel holds both weight matrices:
# the sm90 kernel keeps 256 rows x that many bytes (the projection's K padded to 32 then to 128, then the tail's K
# padded to 32) in shared memory next to its rings. ResNet-50 layer1.0 (64 + 64 -> 192) and layer2.0
# (256 + 128 -> 384) fit, layer3.0 (512 + 256 -> 768) does not (it keeps a projection node and a tail node).
MAX_FUSED_K_BYTES = 512
# Stride-1 3x3 convs go to the halo kernel only up to this many output channels: on the H100 at batch 2048 (random
# weights, benchmarks/results/conv3x3_h100.json) it is 1.89x TensorRT 8.5 at ResNet-50's layer1 (Cout 64, the weights
# in registers), 1.14x at layer2 (128; under issue 14's 1.3x bar for a replaced layer) and slower at layer3 (256, where
# TensorRT runs a Hopper kernel).
MAX_CONV3X3_COUT = 64
# A tail computes the next bottleneck's conv1 from its own output tile only where that tile holds whole rows of the
# tail's output (the conv1 sums over all of its channels): the kernel's N tile is 256 channels, so tails of at most
# 256 (ResNet-50's layer1; layer2's 512 would need each row from two tiles). The conv1's weights and accumulator sit
# beside the tail's in the chained sm90 configuration, which has room for at most 128 conv1 output channels
# (plugins/conv_int8/c_api.h, trtfuse_next_fuses): layer1's conv1s (64) and layer2.0's (128). Only 1x1 stride-1 conv1s with a
# ReLU (the conv1 form the kernel chains), reading exactly the tail's channels, are chained.
MAX_NEXT_TAIL_COUT = 256
MAX_NEXT_COUT = 128
# The stem chains the conv1 that reads its pooled output (1x1 stride 1 + ReLU, cin the stem's cout) only up to the stem
# kernel's N tile, 64 output channels (plugins/conv_int8/c_api.h, trtfuse_next_fuses: the first stem configuration, stem_p8):
# ResNet-50's layer1.0 conv1 (64 -> 64). A wider one stays with TensorRT (the library would run it as a second launch).
MAX_NEXT_STEM_COUT = 64


# ----------------------------------------------------------------------------- what was fused, what was not, and why
# The fusion kinds, in the order the report lists them: a residual tail, a projection, a projection fused with the
# tail that reads it, a stride-1 3x3 conv, the stem, a next conv1 computed by the layer before it, the pool head.
KINDS = ("tail", "proj", "fused", "conv3x3", "stem", "next", "pool")


class Refused(str):
    """Why a candidate of a fusion kind was not taken (a matcher's answer; tell it from a match by its type)."""


@dataclass
class KindReport:
    found: int = 0      # candidates: nodes shaped like the pattern (a residual Add, a 1x1 conv quantized alone ...)
    fused: int = 0      # of them, replaced by a plugin node (or merged into one)
    refused: int = 0
    first_node: str = ""
    first_reason: str = ""


@dataclass
class FusionReport:
    """Per fusion kind (KINDS): how many candidates the rewrite found, how many it fused, and the first refusal (node,
    reason). ``rows()`` is the data, ``table()`` what ``trtfuse build`` prints where something was refused.
    ``sites``: one dict per plugin node written (``node``: its name; ``kind``: plugin_kind's; ``sites``: the site ids
    it computes, see site_id; ``replaced``: the names of the graph's nodes it takes the place of), what
    trtfuse.plugin_sites maps TensorRT's per-layer profile onto."""
    kinds: dict = None
    sites: list = None

    def __post_init__(self):
        self.kinds = {k: KindReport() for k in KINDS} if self.kinds is None else self.kinds
        self.sites = [] if self.sites is None else self.sites

    def found(self, kind: str) -> None:
        self.kinds[kind].found += 1

    def refuse(self, kind: str, node, reason: str) -> None:
        r = self.kinds[kind]
        r.refused += 1
        if not r.first_reason:
            r.first_node = node if isinstance(node, str) else (node.name or node.output[0])
            r.first_reason = str(reason)

    def rows(self) -> list[dict]:
        """One dict per kind asked for or found: kind, found, fused, refused, first_node, first_reason."""
        return [{"kind": k, "found": r.found, "fused": r.fused, "refused": r.refused, "first_node": r.first_node,
                 "first_reason": r.first_reason} for k, r in self.kinds.items() if r.found or r.fused]

    def any_refused(self) -> bool:
        return any(r.refused for r in self.kinds.values())

    def table(self) -> str:
        rows = self.rows()
        head = ("kind", "found", "fused", "first refusal")
        body = [(r["kind"], str(r["found"]), str(r["fused"]),
                 f"{r['first_node']}: {r['first_reason']}" if r["first_reason"] else "-") for r in rows]
        widths = [max(len(x[i]) for x in [head, *body]) for i in range(3)]
        return "\n".join(f"{a:<{widths[0]}}  {b:>{widths[1]}}  {c:>{widths[2]}}  {d}" for a, b, c, d in [head, *body])


def _record(report: FusionReport | None, kind: str, node, result):
    """Count a matcher's answer for ``node`` in ``report``: None (not a candidate), a Refused reason, or a match."""
    if report is not None and result is not None:
        report.found(kind)
        if isinstance(result, Refused):
            report.refuse(kind, node, result)
    return result if result is not None and not isinstance(result, Refused) else None


class UnknownSite(ValueError):
    """rewrite_report's ``exclude`` names a site that is no candidate of the graph."""


def node_name(node) -> str:
    """A node's name, or its first output's where it has none (what a site id and TensorRT's layer names use)."""
    return node.name or node.output[0]


def site_id(kind: str, anchor) -> str:
    """The stable name of one fusion site: "<kind>:<the anchor node's name in the Q/DQ graph>". Anchors: a tail's and
    a projection + tail pair's residual Add, a projection's, 3x3 conv's or stem's conv, a next conv1's own conv, a
    pool head's pool. Independent of which other sites a rewrite takes (the plugin nodes' names are not)."""
    return f"{kind}:{node_name(anchor)}"


def _roundup(v: int, m: int) -> int:
    return -(-v // m) * m


def fused_k_bytes(proj_cin: int, cin: int) -> int:
    """Bytes per weight row of a fused projection + tail node (see MAX_FUSED_K_BYTES)."""
    return _roundup(_roundup(proj_cin, 32), 128) + _roundup(cin, 32)


@dataclass
class Tail:
    conv: onnx.NodeProto
    add: onnx.NodeProto
    relu: onnx.NodeProto | None
    q_out: onnx.NodeProto
    x_q: str
    r_q: str
    fields: dict


class _Graph:
    """Producer/consumer/constant look-ups over an onnx graph."""

    def __init__(self, graph: onnx.GraphProto):
        self.graph = graph
        self.inits = {t.name: t for t in graph.initializer}
        self.producer = {o: n for n in graph.node for o in n.output}
        self.users = defaultdict(list)
        for n in graph.node:
            for i in n.input:
                self.users[i].append(n)
        self.outputs = {o.name for o in graph.output}

    def const(self, name) -> np.ndarray | None:
        """The value of tensor ``name`` if it is constant: an initializer, a Constant node's, or an Identity of one
        (the TorchScript exporter reads equal tensors through Identity nodes)."""
        if name in self.inits:
            return numpy_helper.to_array(self.inits[name])
        node = self.producer.get(name)
        if node is not None and node.op_type == "Constant":
            return constant_value(node)
        if node is not None and node.op_type == "Identity":
            return self.const(node.input[0])
        return None

    def relu(self, node) -> bool:
        """``node`` is max(x, 0): Relu, or Clip(0) / Clip(0, inf)."""
        return is_relu(node, self.const)

    def only_reader(self, name):
        """The one node that reads tensor ``name``, or None (several readers, or a graph output)."""
        readers = self.users[name]
        return readers[0] if len(readers) == 1 and name not in self.outputs else None

    def op(self, name, op_type):
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op_type else None

    def quantized_source(self, name) -> tuple[str, float] | None:
        """If ``name`` is ``DQ(Q(t))`` with one per-tensor scale and zero point 0: (Q output, scale)."""
        dq = self.op(name, "DequantizeLinear")
        q = dq and self.op(dq.input[0], "QuantizeLinear")
        if not q:
            return None
        s_dq, s_q = self.const(dq.input[1]), self.const(q.input[1])
        if s_dq is None or s_q is None or s_dq.size != 1 or s_q.size != 1 or s_dq.item() != s_q.item():
            return None
        if not (_zero(self, dq) and _zero(self, q)):
            return None
        return q.output[0], float(s_q.item())

    def int8_weight(self, name) -> tuple[np.ndarray, np.ndarray] | Refused:
        """(int8 [Cout, Cin, kh, kw], scales [Cout]) of a per-channel weight DQ, either form; else why not."""
        dq = self.op(name, "DequantizeLinear")
        if dq is None:
            return Refused("weights not quantized (no DequantizeLinear)")
        if _axis(dq) != 0 or not _zero(self, dq):
            return Refused("weights not per output channel (axis 0) with zero point 0")
        scale = self.const(dq.input[1])
        w = self.const(dq.input[0])
        if w is None:  # float weights behind a QuantizeLinear (TensorRT 8.5 form)
            q = self.op(dq.input[0], "QuantizeLinear")
            wf = q and self.const(q.input[0])
            if wf is None or _axis(q) != 0:
                return Refused("weights not constant int8 (nor constant float behind a QuantizeLinear)")
            s = scale.reshape(-1, *([1] * (wf.ndim - 1)))
            w = np.clip(np.rint(wf / s), -128, 127).astype(np.int8)
        if w.dtype != np.int8 or scale is None:
            return Refused(f"weights are {w.dtype}, not int8" if scale is not None else "weight scale not constant")
        return w, np.asarray(scale, np.float32).reshape(-1)

    def weight_shape(self, name) -> tuple | None:
        """The shape of a conv's weight (an initializer, or behind its DequantizeLinear / QuantizeLinear)."""
        v = self.const(name)
        node = self.producer.get(name)
        while v is None and node is not None and node.op_type in ("DequantizeLinear", "QuantizeLinear"):
            v = self.const(node.input[0])
            node = self.producer.get(node.input[0])
        return None if v is None else v.shape


def _zero(g: _Graph, node) -> bool:
    if len(node.input) < 3 or not node.input[2]:
        return True
    zp = g.const(node.input[2])
    return zp is not None and not zp.any()


def _axis(node) -> int:
    return next((a.i for a in node.attribute if a.name == "axis"), 1)


def _attr(node, name, default):
    for a in node.attribute:
        if a.name == name:
            return list(a.ints) if a.ints else a.i
    return default


@dataclass
class ConvGeom:
    """A conv's geometry as computed: ``src`` is the tensor it reads, before a zero spatial Pad in front of it (folded
    into ``pads``: [top, left, bottom, right])."""
    src: str
    kernel: list
    strides: list
    pads: list
    dilations: list
    group: int


def _zero_pad(g: _Graph, pad) -> list | None:
    """[top, left, bottom, right] of a constant zero Pad of an NCHW tensor's H and W only, else None."""
    if pad is None or pad.op_type != "Pad":
        return None
    attrs = {a.name: a for a in pad.attribute}
    if attrs.get("mode") is not None and attrs["mode"].s.decode() != "constant":
        return None
    if "pads" in attrs:   # opset < 11
        pads, value = list(attrs["pads"].ints), attrs["value"].f if "value" in attrs else 0.0
    else:
        p = g.const(pad.input[1]) if len(pad.input) > 1 else None
        v = g.const(pad.input[2]) if len(pad.input) > 2 and pad.input[2] else np.zeros(1)
        if p is None or v is None or (len(pad.input) > 3 and pad.input[3]):
            return None
        pads, value = [int(x) for x in p.reshape(-1)], float(v.reshape(-1)[0]) if v.size else 0.0
    if len(pads) != 8 or value != 0.0 or any(x < 0 for x in pads) or any(pads[i] for i in (0, 1, 4, 5)):
        return None
    return [pads[2], pads[3], pads[6], pads[7]]


def _conv_geom(g: _Graph, conv) -> ConvGeom | Refused:
    auto = next((a.s.decode() for a in conv.attribute if a.name == "auto_pad"), "NOTSET")
    if auto not in ("NOTSET", ""):
        return Refused(f"auto_pad {auto} (explicit pads expected)")
    shape = g.weight_shape(conv.input[1])
    kernel = _attr(conv, "kernel_shape", None) or (list(shape[2:]) if shape is not None else None)
    if kernel is None or len(kernel) != 2:
        return Refused("not a 2-D conv with a known kernel")
    pads = _attr(conv, "pads", [0, 0, 0, 0])
    src = conv.input[0]
    extra = _zero_pad(g, g.producer.get(src))
    if extra is not None:
        src = g.producer[src].input[0]
        pads = [p + e for p, e in zip(pads, extra)]
    return ConvGeom(src, list(kernel), _attr(conv, "strides", [1, 1]), list(pads), _attr(conv, "dilations", [1, 1]),
                    _attr(conv, "group", 1))


def _geom_refusal(geom: ConvGeom | Refused, kernel: int, strides: set, pad: int) -> Refused | None:
    """Why a conv is not a ``kernel`` x ``kernel`` conv with padding ``pad`` on every side, a stride (the same along H
    and W) in ``strides``, no dilation and no groups; None if it is."""
    if isinstance(geom, Refused):
        return geom
    if geom.group != 1:
        return Refused(f"grouped conv (group {geom.group}): stays with TensorRT")
    if geom.kernel != [kernel, kernel]:
        return Refused(f"kernel {geom.kernel[0]}x{geom.kernel[1]}, not {kernel}x{kernel}")
    if set(geom.dilations) != {1}:
        return Refused(f"dilations {geom.dilations}")
    if len(set(geom.strides)) != 1 or geom.strides[0] not in strides:
        return Refused(f"stride {geom.strides[0] if len(set(geom.strides)) == 1 else geom.strides} "
                       f"(the kernel takes {' or '.join(map(str, sorted(strides)))})")
    if geom.pads != [pad] * 4:
        return Refused(f"pads {geom.pads} (the kernel takes {[pad] * 4})")
    return None


def _stem_pool_refusal(pool) -> Refused | None:
    """Why ``pool`` is not a 3x3 max pool with padding 1 on every side, stride 2, floor mode, no dilation."""
    if pool is None or pool.op_type != "MaxPool" or len(pool.output) != 1:
        return Refused("the conv's ReLU is not read by a MaxPool alone")
    got = dict(kernel_shape=_attr(pool, "kernel_shape", None), strides=_attr(pool, "strides", None),
               pads=_attr(pool, "pads", [0, 0, 0, 0]), ceil_mode=_attr(pool, "ceil_mode", 0),
               dilations=_attr(pool, "dilations", [1, 1]), storage_order=_attr(pool, "storage_order", 0))
    want = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=0, dilations=[1, 1],
                storage_order=0)
    bad = [f"{k} {got[k]}" for k in want if got[k] != want[k] and not (k == "dilations" and set(got[k]) == {1})]
    return Refused(f"max pool {', '.join(bad)} (the stem kernel's pool is 3x3/2, pads 1)") if bad else None


# ----------------------------------------------------------------------------- kind "tail": conv 1x1 + Add (+ ReLU)
def _residual_add(g: _Graph, add) -> bool:
    """A candidate residual Add: two activation inputs, at least one of them a Conv's output."""
    if add.op_type != "Add" or len(add.input) != 2 or any(g.const(i) is not None for i in add.input):
        return False
    return any(g.op(i, "Conv") is not None for i in add.input)


def find_tails(model: onnx.ModelProto, report: FusionReport | None = None) -> list[Tail]:
    """Every residual tail of a Q/DQ graph that the plugin can compute (``report``: counted, refusals with reasons)."""
    g = _Graph(model.graph)
    tails = []
    for add in model.graph.node:
        if not _residual_add(g, add):
            continue
        found = [_match(g, add, add.input[m], add.input[1 - m]) for m in (0, 1)]
        tail = next((t for t in found if isinstance(t, Tail)), None) or next(
            (t for t in found if isinstance(t, Refused)), Refused("no input is a conv's output"))
        if _record(report, "tail", add, tail) is not None:
            tails.append(tail)
    return tails


def _conv_fields(g: _Graph, conv, q_out) -> tuple[str, dict] | Refused:
    """(x's QuantizeLinear output, the plugin fields a conv brings: weights, w_scale, bias, x_scale, out_scale, cin,
    cout) when its input is DQ(Q(x)) (through a zero Pad folded into the conv), its weights per-channel int8 and
    ``q_out`` quantizes per tensor; else why not."""
    s_out = g.const(q_out.input[1])
    if s_out is None or s_out.size != 1 or not _zero(g, q_out):
        return Refused("the output's QuantizeLinear is not per tensor with zero point 0")
    geom = _conv_geom(g, conv)
    if isinstance(geom, Refused):
        return geom
    x = g.quantized_source(geom.src)
    if x is None:
        return Refused("input is not DQ(Q(x)) with one per-tensor scale and zero point 0")
    weight = g.int8_weight(conv.input[1])
    if isinstance(weight, Refused):
        return weight
    w, w_scale = weight
    cout, cin = w.shape[:2]
    bias = g.const(conv.input[2]) if len(conv.input) > 2 and conv.input[2] else np.zeros(cout)
    if bias is None:
        return Refused("bias not constant")
    return x[0], dict(weights=w.reshape(cout, -1), w_scale=w_scale, bias=np.asarray(bias, np.float32),
                      x_scale=x[1], out_scale=float(s_out.item()), cin=int(cin), cout=int(cout))


def _match(g: _Graph, add, main: str, ident: str) -> Tail | Refused | None:
    """The tail whose conv writes Add input ``main``, the identity being ``ident``; None if ``main`` is no conv's."""
    conv = g.op(main, "Conv")
    if conv is None:
        return None
    bad = _geom_refusal(_conv_geom(g, conv), 1, {1}, 0)
    if bad:
        return Refused(f"the conv before the Add: {bad}")
    if len(g.users[main]) != 1 or main in g.outputs:
        return Refused("the conv's output has readers other than the Add")
    r = g.quantized_source(ident)
    if r is None:
        return Refused("the identity input is not DQ(Q(t)) with one per-tensor scale and zero point 0")
    out, relu = add.output[0], None
    after = g.users[out]
    if len(after) == 1 and g.relu(after[0]) and out not in g.outputs:
        relu = after[0]
        out = relu.output[0]
    if out in g.outputs:
        return Refused("the block output is a graph output, not quantized")
    q_outs = [n for n in g.users[out] if n.op_type == "QuantizeLinear"]
    if len(q_outs) != 1:
        return Refused(f"the block output has {len(q_outs)} QuantizeLinear readers (1 expected)")
    q_out = q_outs[0]
    conv_fields = _conv_fields(g, conv, q_out)
    if isinstance(conv_fields, Refused):
        return conv_fields
    # Everything else reading the float block output must be able to read the dequantized one.
    dq_outs = [n for n in g.users[q_out.output[0]] if n.op_type == "DequantizeLinear"]
    if len(g.users[out]) > 1 and not dq_outs:
        return Refused("the float block output has other readers and no DequantizeLinear to read instead")
    x_q, fields = conv_fields
    return Tail(conv, add, relu, q_out, x_q, r[0], {**fields, "r_scale": r[1], "relu": int(relu is not None)})


# ----------------------------------------------------------------------------- kind "proj": conv 1x1 -> Q
@dataclass
class Projection:
    conv: onnx.NodeProto
    q_out: onnx.NodeProto
    x_q: str
    fields: dict


def find_projections(model: onnx.ModelProto, max_cin: int | None = None,
                     min_cout: int | None = None, report: FusionReport | None = None) -> list[Projection]:
    """Every projection of a Q/DQ graph that the plugin computes faster than TensorRT: input channels up to
    ``max_cin``, output channels from ``min_cout`` (default: MAX_PROJECTION_CIN, MIN_PROJECTION_COUT)."""
    g = _Graph(model.graph)
    max_cin = MAX_PROJECTION_CIN if max_cin is None else max_cin
    min_cout = MIN_PROJECTION_COUT if min_cout is None else min_cout
    found = (_record(report, "proj", conv, _match_projection(g, conv, max_cin, min_cout))
             for conv in model.graph.node if conv.op_type == "Conv")
    return [p for p in found if p is not None]


def _match_projection(g: _Graph, conv, max_cin: int, min_cout: int) -> Projection | Refused | None:
    y = conv.output[0]
    readers = g.users[y]
    geom = _conv_geom(g, conv)
    # a candidate: a 1x1 conv whose only reader quantizes it (a ReLU or an Add in between: a conv1 or a tail)
    if (isinstance(geom, Refused) or geom.kernel != [1, 1] or y in g.outputs or len(readers) != 1
            or readers[0].op_type != "QuantizeLinear"):
        return None
    bad = _geom_refusal(geom, 1, {1, 2}, 0)
    if bad:
        return bad
    q_out = readers[0]
    conv_fields = _conv_fields(g, conv, q_out)
    if isinstance(conv_fields, Refused):
        return conv_fields
    x_q, fields = conv_fields
    if fields["cin"] > max_cin:
        return Refused(f"cin {fields['cin']} > {max_cin} (MAX_PROJECTION_CIN: the Hopper kernel's weight slice)")
    if fields["cout"] < min_cout:
        return Refused(f"cout {fields['cout']} < {min_cout} (MIN_PROJECTION_COUT: the kernel's 256-channel N tile)")
    return Projection(conv, q_out, x_q, {**fields, "r_scale": 0.0, "relu": 0, "stride": int(geom.strides[0])})


# ----------------------------------------------------------------------------- kind "conv3x3": conv 3x3 + ReLU -> Q
@dataclass
class Conv3x3:
    conv: onnx.NodeProto
    relu: onnx.NodeProto
    q_out: onnx.NodeProto
    x_q: str
    fields: dict

    def replaced(self) -> tuple:
        """The nodes the plugin node takes the place of, but q_out."""
        return self.conv, self.relu


def find_conv3x3(model: onnx.ModelProto, max_cout: int | None = None,
                 report: FusionReport | None = None) -> list[Conv3x3]:
    """Every stride-1 3x3 conv + ReLU of a Q/DQ graph, quantized on its own, that the halo kernel computes faster than
    TensorRT: output channels up to ``max_cout`` (default MAX_CONV3X3_COUT)."""
    g = _Graph(model.graph)
    max_cout = MAX_CONV3X3_COUT if max_cout is None else max_cout
    found = (_record(report, "conv3x3", conv, _match_conv3x3(g, conv, max_cout))
             for conv in model.graph.node if conv.op_type == "Conv")
    return [c for c in found if c is not None]


def _relu_q(g: _Graph, conv) -> tuple | None:
    """(relu, q_out) when ``conv``'s only reader is a Relu (or Clip(0, inf)) whose only reader quantizes it (the int8
    tensor a plugin node then writes), else None."""
    relu = g.only_reader(conv.output[0])
    if relu is None or not g.relu(relu):
        return None
    q_out = g.only_reader(relu.output[0])
    if q_out is None or q_out.op_type != "QuantizeLinear":
        return None
    return relu, q_out


def _match_conv3x3(g: _Graph, conv, max_cout: int) -> Conv3x3 | Refused | None:
    geom = _conv_geom(g, conv)
    relu = g.only_reader(conv.output[0])
    # a candidate: a 3x3 conv whose only reader is a ReLU
    if isinstance(geom, Refused) or geom.kernel != [3, 3] or relu is None or not g.relu(relu):
        return None
    bad = _geom_refusal(geom, 3, {1}, 1)
    if bad:
        return bad
    relu_q = _relu_q(g, conv)
    if relu_q is None:
        return Refused("the ReLU's output is not read by one QuantizeLinear alone")
    relu, q_out = relu_q
    conv_fields = _conv_fields(g, conv, q_out)
    if isinstance(conv_fields, Refused):
        return conv_fields
    x_q, fields = conv_fields
    if fields["cout"] > max_cout:
        return Refused(f"cout {fields['cout']} > {max_cout} (MAX_CONV3X3_COUT: TensorRT is as fast or faster)")
    return Conv3x3(conv, relu, q_out, x_q, {**fields, "r_scale": 0.0, "relu": 1, "kernel_size": 3})


# ----------------------------------------------------------------------------- kind "stem": conv 7x7/2 + ReLU + pool
@dataclass
class Stem:
    conv: onnx.NodeProto
    relu: onnx.NodeProto
    pool: onnx.NodeProto
    q_out: onnx.NodeProto
    x_q: str
    fields: dict

    def replaced(self) -> tuple:
        """The nodes the plugin node takes the place of, but q_out."""
        return self.conv, self.relu, self.pool


STEM_MAX_CIN, STEM_MAX_COUT = 4, 64   # the stem kernel's (plugins/conv_int8/kernels/stem_sm90.cuh)


def find_stems(model: onnx.ModelProto, report: FusionReport | None = None) -> list[Stem]:
    """Every 7x7/2 conv + ReLU + 3x3/2 max pool of a Q/DQ graph whose pooled output only a QuantizeLinear reads and
    that the stem kernel holds (cin <= 4, cout <= 64)."""
    g = _Graph(model.graph)
    found = (_record(report, "stem", conv, _match_stem(g, conv)) for conv in model.graph.node if conv.op_type == "Conv")
    return [s for s in found if s is not None]


def _match_stem(g: _Graph, conv) -> Stem | Refused | None:
    geom = _conv_geom(g, conv)
    if isinstance(geom, Refused) or geom.kernel != [7, 7]:   # a candidate: any 7x7 conv
        return None
    bad = _geom_refusal(geom, 7, {2}, 3)
    if bad:
        return bad
    relu = g.only_reader(conv.output[0])
    if relu is None or not g.relu(relu):
        return Refused("the conv's output is not read by a ReLU alone")
    pool = g.only_reader(relu.output[0])
    bad = _stem_pool_refusal(pool)
    if bad:
        return bad
    q_out = g.only_reader(pool.output[0])
    if q_out is None or q_out.op_type != "QuantizeLinear":
        return Refused("the pooled output is not read by one QuantizeLinear alone")
    conv_fields = _conv_fields(g, conv, q_out)
    if isinstance(conv_fields, Refused):
        return conv_fields
    x_q, fields = conv_fields
    if fields["cin"] > STEM_MAX_CIN or fields["cout"] > STEM_MAX_COUT:
        return Refused(f"cin {fields['cin']}, cout {fields['cout']} (the stem kernel holds cin <= {STEM_MAX_CIN}, "
                       f"cout <= {STEM_MAX_COUT})")
    return Stem(conv, relu, pool, q_out, x_q, {**fields, "r_scale": 0.0, "relu": 1, "kernel_size": 7, "stride": 2})


# ----------------------------------------------------------------------------- kind "pool": the head's average pool
# TrtfuseAvgPool's version: 3 writes two int8 outputs, hi and lo (the mean to 1/256 of t's LSB) for a
# DequantizeLinear each; 2 wrote one int8 output (the mean rounded to t's grid), 1 fp32 (field x_scale).
POOL_VERSION = "3"
# lo's scale: s / 2^POOL_LO_SHIFT (the kernel's m is the mean times 256)
POOL_LO_SHIFT = 8


@dataclass
class PoolHead:
    """A GlobalAveragePool of DequantizeLinear(t), t int8 with one fp32 scale (``x_scale``, of shape ``scale_shape``)
    and zero point 0: TrtfuseAvgPool(t) -> (hi, lo) -> DequantizeLinear(hi, s), DequantizeLinear(lo, s / 256) -> Add."""
    dq: onnx.NodeProto
    pool: onnx.NodeProto
    x_q: str
    x_scale: float
    scale_shape: tuple = ()
    keepdims: bool = True   # False: a ReduceMean writing [N, C]; the Add's [N, C, 1, 1] then goes through a Flatten

    def lo_scale(self) -> np.ndarray:
        """s / 256 in fp32, exactly (a power-of-two scaling of a normal fp32 whose result is normal, which
        find_pool_heads checks), with the original scale's shape."""
        return np.ldexp(np.float32(self.x_scale), -POOL_LO_SHIFT).astype(np.float32).reshape(self.scale_shape)

    def nodes(self, name: str) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
        """([the plugin node: t -> (hi, lo), DequantizeLinear(hi, s, 0), DequantizeLinear(lo, s / 256, 0), Add -> the
        pool's output], [the new initializers: s / 256 as ``name``_lo_scale, and an int8 0 as ``name``_zero_point where
        the original DequantizeLinear has no zero point input]), every node named after the plugin (``name``). The hi
        DequantizeLinear is a copy of the original one (its scale and zero point inputs, its attributes)."""
        out = self.pool.output[0]
        hi, lo = f"{out}_{name}_hi", f"{out}_{name}_lo"
        plugin = helper.make_node(POOL_OP, [self.x_q], [hi, lo], name=name, domain=PLUGIN_DOMAIN,
                                  plugin_version=POOL_VERSION, plugin_namespace="")
        inits = [numpy_helper.from_array(self.lo_scale(), f"{name}_lo_scale")]
        zero_point = self.dq.input[2] if len(self.dq.input) > 2 and self.dq.input[2] else ""
        if not zero_point:   # explicit: an int8 0 (without one, ONNX reads the input as uint8)
            inits.append(numpy_helper.from_array(np.array(0, np.int8), f"{name}_zero_point"))
            zero_point = inits[-1].name
        dq_hi = onnx.NodeProto()
        dq_hi.CopyFrom(self.dq)
        dq_hi.name = f"{name}_DequantizeLinear_hi"
        del dq_hi.input[:], dq_hi.output[:]
        dq_hi.input.extend([hi, self.dq.input[1], zero_point])
        dq_hi.output.append(f"{hi}_dq")
        dq_lo = onnx.NodeProto()
        dq_lo.CopyFrom(dq_hi)
        dq_lo.name = f"{name}_DequantizeLinear_lo"
        dq_lo.input[0], dq_lo.input[1], dq_lo.output[0] = lo, inits[0].name, f"{lo}_dq"
        if self.keepdims:
            add = helper.make_node("Add", [dq_hi.output[0], dq_lo.output[0]], [out], name=f"{name}_Add")
            return [plugin, dq_hi, dq_lo, add], inits
        add = helper.make_node("Add", [dq_hi.output[0], dq_lo.output[0]], [f"{out}_{name}_4d"], name=f"{name}_Add")
        flat = helper.make_node("Flatten", [add.output[0]], [out], name=f"{name}_Flatten", axis=1)
        return [plugin, dq_hi, dq_lo, add, flat], inits


def _global_mean(g: _Graph, pool) -> bool | Refused | None:
    """keepdims of a mean over H and W of an NCHW tensor (GlobalAveragePool: True; ReduceMean over axes [2, 3] or
    [-2, -1], opset 13's attribute or 18's input); None for any other node, Refused for another ReduceMean."""
    if pool.op_type == "GlobalAveragePool":
        return True
    if pool.op_type != "ReduceMean":
        return None
    axes = _attr(pool, "axes", None)
    if axes is None and len(pool.input) > 1 and pool.input[1]:
        v = g.const(pool.input[1])
        axes = None if v is None else [int(x) for x in v.reshape(-1)]
    if axes is None or sorted(a % 4 for a in axes) != [2, 3]:
        return Refused(f"ReduceMean over axes {axes}, not H and W of an NCHW tensor")
    return bool(_attr(pool, "keepdims", 1))


def find_pool_heads(model: onnx.ModelProto, report: FusionReport | None = None) -> list[PoolHead]:
    """Every GlobalAveragePool (or ReduceMean over H and W) whose input is the DequantizeLinear (per-tensor fp32 scale
    s > 0 with s / 256 a normal fp32, so exact; zero point 0; read by the pool only) of an int8 tensor: a
    QuantizeLinear's output or a plugin node's. Int8, not uint8: the DequantizeLinear's zero point, if it has one, is
    int8; if not, the tensor is a plugin's or a QuantizeLinear's with an int8 zero point. A nonzero zero point is
    refused (TensorRT's int8 is symmetric; the DequantizeLinears after the plugin take zero point 0, hi on s and lo on
    s / 256)."""
    g = _Graph(model.graph)
    found = []
    for pool in model.graph.node:
        head = _record(report, "pool", pool, _match_pool_head(g, pool))
        if head is not None:
            found.append(head)
    return found


def _match_pool_head(g: _Graph, pool) -> PoolHead | Refused | None:
    keepdims = _global_mean(g, pool)
    if keepdims is None or isinstance(keepdims, Refused):
        return keepdims
    dq = g.op(pool.input[0], "DequantizeLinear")
    if not dq or g.only_reader(dq.output[0]) is not pool:
        return Refused("the pool's input is not a DequantizeLinear read by the pool alone")
    if not _zero(g, dq):
        return Refused("nonzero zero point")
    scale, src = g.const(dq.input[1]), g.producer.get(dq.input[0])
    if scale is None or scale.size != 1 or scale.dtype != np.float32 or not float(scale.item()) > 0 or src is None:
        return Refused("the DequantizeLinear's scale is not one positive fp32 constant")
    if not np.isfinite(scale).all() or abs(np.ldexp(scale.astype(np.float32), -POOL_LO_SHIFT).item()) < \
            np.finfo(np.float32).tiny:   # s / 256 subnormal (or zero): not exact
        return Refused("scale / 256 is not a normal fp32")
    from_plugin = src.domain == PLUGIN_DOMAIN
    if not (from_plugin or src.op_type == "QuantizeLinear"):
        return Refused("the dequantized tensor is neither a QuantizeLinear's nor a plugin's")
    if len(dq.input) > 2 and dq.input[2]:
        if not _int8_zero_point(g, dq):
            return Refused("the zero point is not int8")
    elif not (from_plugin or _int8_zero_point(g, src)):
        return Refused("the zero point is not int8")
    return PoolHead(dq, pool, dq.input[0], float(scale.item()), tuple(scale.shape), keepdims)


def _int8_zero_point(g: _Graph, node) -> bool:
    """A Q/DQ node's zero point input is there and int8 (its tensor int8; without one, ONNX says uint8)."""
    zp = g.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    return zp is not None and zp.dtype == np.int8


def pool_reference(x: np.ndarray, node: onnx.NodeProto) -> tuple[np.ndarray, np.ndarray]:
    """TrtfuseAvgPool on CPU: the kernel's arithmetic, (hi, lo) int8 [N, C, 1, 1] (hi on x's scale, lo on 1/256 of it;
    trtfuse.ops.avgpool.avgpool_reference; the DequantizeLinears and the Add after the node run in ONNX Runtime)."""
    from trtfuse.ops.avgpool import avgpool_reference

    return avgpool_reference(x)


@dataclass
class NextConv:
    """The next bottleneck's conv1 (1x1, stride 1, + ReLU) that a tail or the stem computes too: it reads the layer's
    out_q."""
    conv: onnx.NodeProto
    relu: onnx.NodeProto
    q_out: onnx.NodeProto
    fields: dict

    def replaced(self) -> tuple:
        """The nodes that go: the layer's node writes q_out's output as its second output."""
        return self.conv, self.relu, self.q_out


def _chainable(g: _Graph, tails: list[Tail], stems: list[Stem] = (),
               report: FusionReport | None = None) -> dict[int, NextConv]:
    """{id(tail or stem): the next conv1 it computes too} for each tail (of at most MAX_NEXT_TAIL_COUT channels; a
    conv1 of at most MAX_NEXT_COUT) and each stem (a conv1 of at most MAX_NEXT_STEM_COUT) that can chain one. A
    candidate: a replaced tail or stem whose int8 output a conv reads."""
    found = {}
    for layer, max_cout in [(t, MAX_NEXT_COUT) for t in tails] + [(st, MAX_NEXT_STEM_COUT) for st in stems]:
        out_q = layer.q_out.output[0]
        if not _conv_readers(g, out_q):
            continue
        if isinstance(layer, Tail) and layer.fields["cout"] > MAX_NEXT_TAIL_COUT:
            nxt = Refused(f"the tail's cout {layer.fields['cout']} > {MAX_NEXT_TAIL_COUT} (MAX_NEXT_TAIL_COUT: the "
                          "kernel's N tile holds whole rows)")
        else:
            nxt = _match_next(g, out_q, layer.fields["cout"], max_cout)
        nxt = _record(report, "next", layer.q_out.output[0], nxt)
        if nxt is not None:
            found[id(layer)] = nxt
    return found


def _conv_readers(g: _Graph, out_q: str) -> list:
    """The convs that read int8 tensor ``out_q`` through a DequantizeLinear."""
    return [c for dq in g.users[out_q] if dq.op_type == "DequantizeLinear"
            for c in g.users[dq.output[0]] if c.op_type == "Conv"]


def _match_next(g: _Graph, out_q: str, cin: int, max_cout: int) -> NextConv | Refused:
    """The first conv1 that reads a layer's int8 output ``out_q`` (of ``cin`` channels) through a DequantizeLinear and
    that the chained kernel computes: 1x1 stride 1 + ReLU, cin the layer's cout, at most ``max_cout`` output channels;
    else why the first conv reading it is not."""
    first = None
    for dq in g.users[out_q]:
        for conv in g.users[dq.output[0]] if dq.op_type == "DequantizeLinear" else ():
            if conv.op_type != "Conv":
                continue
            bad = (Refused("reads the DequantizeLinear through another node") if conv.input[0] != dq.output[0]
                   else _geom_refusal(_conv_geom(g, conv), 1, {1}, 0))
            relu_q = None if bad else _relu_q(g, conv)
            if not bad and relu_q is None:
                bad = Refused("the next conv is not followed by a ReLU whose output one QuantizeLinear alone reads")
            conv_fields = None if bad else _conv_fields(g, conv, relu_q[1])
            if isinstance(conv_fields, Refused):
                bad = conv_fields
            # its input must be DQ(out_q) with out_q's scale (_conv_fields checks the DQ against its Q)
            elif not bad and (conv_fields[0] != out_q or conv_fields[1]["cin"] != cin):
                bad = Refused("the next conv does not read exactly the layer's output")
            elif not bad and conv_fields[1]["cout"] > max_cout:
                bad = Refused(f"the next conv's cout {conv_fields[1]['cout']} > {max_cout} (the chained "
                              "configuration's room)")
            if not bad:
                return NextConv(conv, relu_q[0], relu_q[1], {**conv_fields[1], "relu": 1})
            first = first or Refused(f"{conv.name or conv.output[0]}: {bad}")
    return first or Refused("no conv reads the output")


def plugin_node(name: str, x_q: str, r_q: str | None, out_q: str, fields: dict,
                weight_dtype: str = "int32", proj: Projection | None = None,
                next_conv: NextConv | None = None) -> onnx.NodeProto:
    """The TrtfuseResidualConv node (docs/ARCHITECTURE.md field names and types); r_q None: a layer without a
    residual input (r_scale 0). ``proj``: the fused form, a tail (``fields``, r_q None) whose residual is this
    projection: inputs [x_q, proj.x_q], its fields as the proj_* fields. ``next_conv``: a tail (either form) or the
    stem that computes the next conv1 too: outputs [out_q, next_conv's q_out output], its fields as the next_*
    fields."""
    assert proj is None or r_q is None, "a fused node's residual is its projection"
    assert next_conv is None or r_q or proj is not None or fields.get("kernel_size") == 7, \
        "only a tail or the stem chains the next conv"
    attrs = _layer_attrs(name, "", fields, weight_dtype)
    attrs.update(r_scale=float(fields["r_scale"]), relu=int(fields["relu"]), cout=int(fields["cout"]),
                 stride=int(fields.get("stride", 1)))
    if fields.get("kernel_size", 1) != 1:
        attrs.update(kernel_size=int(fields["kernel_size"]))
    inputs = [x_q] + ([r_q] if r_q else [])
    if proj is not None:
        attrs.update(_layer_attrs(name, "proj_", proj.fields, weight_dtype),
                     proj_stride=int(proj.fields.get("stride", 1)))
        inputs.append(proj.x_q)
    outputs = [out_q]
    if next_conv is not None:
        next_attrs = _layer_attrs(name, "next_", next_conv.fields, weight_dtype)
        del next_attrs["next_cin"]   # the layer's cout
        attrs.update(next_attrs, next_cout=int(next_conv.fields["cout"]), next_relu=int(next_conv.fields["relu"]))
        outputs.append(next_conv.q_out.output[0])
    return helper.make_node(PLUGIN_OP, inputs, outputs, name=name, domain=PLUGIN_DOMAIN, plugin_version="1",
                            plugin_namespace="", **attrs)


def _layer_attrs(name: str, prefix: str, fields: dict, weight_dtype: str) -> dict:
    """A conv's weights, w_scale, bias, x_scale, out_scale and cin, as the attributes ``prefix`` + name."""
    weights = fields["weights"].astype(WEIGHT_DTYPES[weight_dtype])
    return {f"{prefix}weights": numpy_helper.from_array(weights, f"{name}_{prefix}weights"),
            f"{prefix}w_scale": [float(v) for v in fields["w_scale"]],
            f"{prefix}bias": [float(v) for v in fields["bias"]],
            f"{prefix}x_scale": float(fields["x_scale"]), f"{prefix}out_scale": float(fields["out_scale"]),
            f"{prefix}cin": int(fields["cin"])}


def plugin_kind(node: onnx.NodeProto) -> str:
    """"stem" (kernel_size 7), "conv3x3" (kernel_size 3), "fused" (a projection + tail node: proj_* fields), "tail" (a
    plugin node with a residual input) or "proj" (a 1x1 node without)."""
    if any(a.name == "kernel_size" and a.i == 7 for a in node.attribute):
        return "stem"
    if any(a.name == "kernel_size" and a.i == 3 for a in node.attribute):
        return "conv3x3"
    if any(a.name == "proj_weights" for a in node.attribute):
        return "fused"
    return "tail" if len(node.input) > 1 else "proj"


def plugin_counts(model: onnx.ModelProto) -> dict[str, int]:
    """TrtfuseResidualConv nodes of a rewritten graph by kind: {"tail": n, "proj": m, "fused": k, "conv3x3": c, "stem":
    s} (a fused node counts only as "fused"), and "next": how many of the tail, fused and stem nodes also compute the
    next conv1 (next_* fields; counted in their kind as well, so not part of the node total). TrtfuseAvgPool nodes
    (pool_head) are not counted here."""
    counts = {"tail": 0, "proj": 0, "fused": 0, "conv3x3": 0, "stem": 0, "next": 0}
    for n in model.graph.node:
        if n.op_type == PLUGIN_OP and n.domain == PLUGIN_DOMAIN:
            counts[plugin_kind(n)] += 1
            counts["next"] += any(a.name == "next_weights" for a in n.attribute)
    return counts


def rewrite(model: onnx.ModelProto, weight_dtype: str = "int32", projections: bool = False,
            fuse: bool = True, conv3x3: bool = False, stem: bool = False,
            chain_next: bool = False, pool_head: bool = False) -> tuple[onnx.ModelProto, int]:
    """``rewrite_report`` without the report: (model, plugin nodes)."""
    model, n, _ = rewrite_report(model, weight_dtype, projections, fuse, conv3x3, stem, chain_next, pool_head)
    return model, n


def rewrite_report(model: onnx.ModelProto, weight_dtype: str = "int32", projections: bool = False,
                   fuse: bool = True, conv3x3: bool = False, stem: bool = False,
                   chain_next: bool = False, pool_head: bool = False,
                   exclude=()) -> tuple[onnx.ModelProto, int, FusionReport]:
    """A copy of the Q/DQ ``model`` with every residual tail fused, every projection the plugin takes (see
    find_projections) when ``projections``, every 3x3 conv it takes (see find_conv3x3) when ``conv3x3``, and the stem
    (see find_stems) when ``stem``; returns (model, plugin nodes). ``plugin_counts`` splits them by kind.

    ``chain_next``: each tail (plain or fused) whose output the next bottleneck's conv1 reads computes that conv1 too
    where the chained kernel holds it (``MAX_NEXT_TAIL_COUT``, ``MAX_NEXT_COUT``), and so does the stem (with
    ``stem``) for the conv1 reading its pooled output (``MAX_NEXT_STEM_COUT``; ResNet-50's layer1.0 conv1): a second
    output and the next_* fields on the layer's node, no node of its own (the node count does not change).

    ``pool_head``: each GlobalAveragePool of a dequantized int8 tensor becomes a TrtfuseAvgPool node (find_pool_heads)
    writing two int8 outputs, hi and lo, then DequantizeLinear(hi, s) + DequantizeLinear(lo, s / 256) -> Add, which
    writes the pool's output (counted as one node).

    ``fuse`` (with ``projections`` only): a replaced projection whose output only a tail reads, as its residual,
    becomes one node with that tail where the fused kernel holds both weight matrices (``MAX_FUSED_K_BYTES``);
    False keeps them two nodes (A/B).

    ``weight_dtype``: how the int8 weight values travel in the ``weights`` tensor attribute. int32
    by default: TensorRT 8.5's ONNX parser is known to pass INT32 and FLOAT tensor attributes to
    plugin creators; the creator accepts int8, int32 or float holding integers in [-127, 127].

    ``exclude``: site ids (site_id) left to TensorRT although they match, each counted as a refusal ("excluded"): a
    tail or projection excluded takes its pair and its chained conv1 with it; "fused:" keeps the pair two nodes,
    "next:" leaves that conv1 to TensorRT. An id of a kind asked for that names no candidate is an UnknownSite error (a typo
    would otherwise build the engine it meant to change).

    Returns (model, plugin nodes, report): the report (FusionReport) counts, for each kind asked for, the candidates
    found, how many were fused and the first refusal with its reason, and lists the sites of each plugin node.
    """
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    report = FusionReport()
    tails = find_tails(model, report=report)
    projs = find_projections(model, report=report) if projections else []
    convs3 = find_conv3x3(model, report=report) if conv3x3 else []
    stems = find_stems(model, report=report) if stem else []
    pools = find_pool_heads(model, report=report) if pool_head else []
    g = _Graph(graph)
    excluded = set(exclude)
    seen = set()   # the site ids of every candidate matched, to tell an exclusion that names none

    def keep(kind: str, items: list, anchor) -> list:
        out = []
        for it in items:
            sid = site_id(kind, anchor(it))
            seen.add(sid)
            if sid in excluded:
                report.refuse(kind, anchor(it), "excluded (tensorrt.plugin_exclude)")
            else:
                out.append(it)
        return out

    if excluded:   # the pairs and conv1s of every candidate, also of the tails and projections excluded
        every = {id(t): t for t in tails}
        seen.update(site_id("fused", every[k].add) for k in (_fusable(g, tails, projs) if projections and fuse else {}))
        seen.update(site_id("next", n.conv) for n in (_chainable(g, tails, stems) if chain_next else {}).values())
    tails = keep("tail", tails, lambda t: t.add)
    projs = keep("proj", projs, lambda p: p.conv)
    convs3 = keep("conv3x3", convs3, lambda c: c.conv)
    stems = keep("stem", stems, lambda st: st.conv)
    pools = keep("pool", pools, lambda h: h.pool)
    by_id = {id(t): t for t in tails}
    # id(tail) -> its projection: one node
    fused = _fusable(g, tails, projs, report if projections else None) if fuse else {}
    fused = {k: p for k, p in fused.items() if keep("fused", [by_id[k]], lambda t: t.add)}
    fused_projs = {id(p) for p in fused.values()}
    # id(tail or stem) -> the conv1 it computes too
    nexts = _chainable(g, tails, stems, report) if chain_next else {}
    nexts = {k: n for k, n in nexts.items() if keep("next", [n], lambda c: c.conv)}
    asked = {"tail"} | {k for k, on in (("proj", projections), ("fused", projections and fuse), ("conv3x3", conv3x3),
                                        ("stem", stem), ("next", chain_next), ("pool", pool_head)) if on}
    unknown = sorted(x for x in excluded - seen if x.partition(":")[0] in asked)
    if unknown:
        raise UnknownSite(f"excluded site(s) {', '.join(unknown)} match no candidate of the graph")
    for kind, n in (("tail", len(tails)), ("proj", len(projs)), ("fused", len(fused)), ("conv3x3", len(convs3)),
                    ("stem", len(stems)), ("next", len(nexts)), ("pool", len(pools))):
        report.kinds[kind].fused = n
    replace, drop = {}, set()

    def site(node, ids: list[str], replaced) -> None:
        report.sites.append({"node": node.name, "kind": plugin_kind(node) if node.op_type == PLUGIN_OP else "pool",
                             "sites": ids, "replaced": [node_name(n) for n in replaced if n is not None]})

    # A projection's plugin node takes the place of its output QuantizeLinear (same output name, so the tail that
    # reads the projection as its residual still finds it); its conv goes. A fused one leaves no node of its own: its
    # QuantizeLinear goes too (the residual's DequantizeLinear, then unread, with it).
    for k, p in enumerate(projs):
        drop.add(id(p.conv))
        if id(p) in fused_projs:
            drop.add(id(p.q_out))
            continue
        replace[id(p.q_out)] = plugin_node(f"{PLUGIN_OP}_proj{k}", p.x_q, None, p.q_out.output[0], p.fields,
                                           weight_dtype)
        site(replace[id(p.q_out)], [site_id("proj", p.conv)], (p.conv, p.q_out))
        graph.value_info.append(helper.make_tensor_value_info(p.q_out.output[0], TensorProto.INT8, None))

    def chain(nxt: NextConv | None) -> None:
        """The conv1 a layer's node computes too: it, its ReLU and its Q go (the DQ feeding it too, if unread:
        _live); its int8 output is the node's second output."""
        if nxt is not None:
            drop.update(id(n) for n in nxt.replaced())
            graph.value_info.append(helper.make_tensor_value_info(nxt.q_out.output[0], TensorProto.INT8, None))

    # A 3x3 conv's or the stem's node takes the place of its output QuantizeLinear, like a projection's; the nodes
    # before it go (conv and ReLU, and the stem's max pool). The stem's may compute the next conv1 too (chain_next).
    chains = [(f"conv3x3_{k}", c) for k, c in enumerate(convs3)] + [(f"stem{k}", st) for k, st in enumerate(stems)]
    for name, c in chains:
        drop.update(id(n) for n in c.replaced())
        nxt = nexts.get(id(c))
        replace[id(c.q_out)] = plugin_node(f"{PLUGIN_OP}_{name}", c.x_q, None, c.q_out.output[0], c.fields,
                                           weight_dtype, next_conv=nxt)
        kind = "stem" if isinstance(c, Stem) else "conv3x3"
        site(replace[id(c.q_out)], [site_id(kind, c.conv)] + ([site_id("next", nxt.conv)] if nxt else []),
             (*c.replaced(), c.q_out, *(nxt.replaced() if nxt else ())))
        chain(nxt)
        graph.value_info.append(helper.make_tensor_value_info(c.q_out.output[0], TensorProto.INT8, None))
    for k, t in enumerate(tails):
        out_q = t.q_out.output[0]
        p, nxt = fused.get(id(t)), nexts.get(id(t))
        if p is not None:   # inputs [x_q, the block input xp_q]: the residual is computed in the node
            node = plugin_node(f"{PLUGIN_OP}_fused{k}", t.x_q, None, out_q, t.fields, weight_dtype, proj=p,
                               next_conv=nxt)
        else:
            node = plugin_node(f"{PLUGIN_OP}_{k}", t.x_q, t.r_q, out_q, t.fields, weight_dtype, next_conv=nxt)
        replace[id(t.add)] = node
        site(node, ([site_id("fused", t.add)] if p is not None else [site_id("tail", t.add)])
             + ([site_id("next", nxt.conv)] if nxt else []),
             (t.conv, t.add, t.relu, t.q_out, *((p.conv, p.q_out) if p is not None else ()),
              *(nxt.replaced() if nxt else ())))
        chain(nxt)
        drop.update({id(t.conv), id(t.q_out)} | ({id(t.relu)} if t.relu is not None else set()))
        # Other readers of the float block output now read the dequantized plugin output.
        float_out = (t.relu or t.add).output[0]
        dq = next(n for n in g.users[out_q] if n.op_type == "DequantizeLinear") if \
            len(g.users[float_out]) > 1 else None
        for reader in g.users[float_out]:
            if reader is not t.q_out:
                for i, name in enumerate(reader.input):
                    if name == float_out:
                        reader.input[i] = dq.output[0]
        graph.value_info.append(helper.make_tensor_value_info(out_q, TensorProto.INT8, None))
    for k, h in enumerate(pools):   # the plugin node takes the DequantizeLinear's place; its DQs and Add the pool's
        (plugin, *after), inits = h.nodes(f"{POOL_OP}_{k}")
        replace[id(h.dq)], replace[id(h.pool)] = plugin, after
        site(plugin, [site_id("pool", h.pool)], (h.dq, h.pool))
        report.sites[-1]["written"] = [n.name for n in after]   # named after the plugin, but nodes of their own
        graph.initializer.extend(inits)
        g.inits.update((t.name, t) for t in inits)   # available to _toposort below
        graph.value_info.extend(helper.make_tensor_value_info(o, TensorProto.INT8, None) for o in plugin.output)
    nodes = []
    for n in graph.node:
        if id(n) in drop:
            continue
        r = replace.get(id(n), n)
        nodes.extend(r if isinstance(r, list) else [r])
    del graph.node[:]
    graph.node.extend(_toposort(_live(nodes, {o.name for o in graph.output}),
                                {i.name for i in graph.input} | set(g.inits)))
    _drop_unused(graph)
    if (tails or projs or convs3 or stems or pools) and not any(o.domain == PLUGIN_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(PLUGIN_DOMAIN, 1))
    return model, len(tails) + len(projs) - len(fused) + len(convs3) + len(stems) + len(pools), report


# ----------------------------------------------------------------------------- kind "fused": projection + its tail
def _fusable(g: _Graph, tails: list[Tail], projs: list[Projection],
             report: FusionReport | None = None) -> dict[int, Projection]:
    """{id(tail): projection} for each tail whose residual is a replaced projection's output that nothing else reads
    (only the tail's Add, through one DequantizeLinear) and whose two weight matrices the fused kernel holds. A
    candidate: a replaced tail whose residual is a replaced projection's output."""
    by_out = {p.q_out.output[0]: p for p in projs}
    fused = {}
    for t in tails:
        p = by_out.get(t.r_q)
        if p is None:
            continue
        if t.fields.get("stride", 1) != 1 or p.fields["cout"] != t.fields["cout"]:
            why = Refused("the tail is strided or its cout differs from the projection's")
        elif fused_k_bytes(p.fields["cin"], t.fields["cin"]) > MAX_FUSED_K_BYTES:
            why = Refused(f"K bytes {fused_k_bytes(p.fields['cin'], t.fields['cin'])} > {MAX_FUSED_K_BYTES} "
                          f"(MAX_FUSED_K_BYTES: proj cin {p.fields['cin']} + tail cin {t.fields['cin']})")
        else:
            dqs = g.users[t.r_q]
            why = None
            if t.r_q in g.outputs or not dqs or any(
                    dq.op_type != "DequantizeLinear" or dq.output[0] in g.outputs
                    or any(u is not t.add for u in g.users[dq.output[0]]) for dq in dqs):
                why = Refused("the projection's output has readers other than the tail")
        if _record(report, "fused", t.add, p if why is None else why) is not None:
            fused[id(t)] = p
    return fused


def _live(nodes, outputs: set[str]) -> list:
    """``nodes`` without the ones nothing reads any more (the fused conv's weight DQ, the DQs that
    fed the removed conv and Add): fewer nodes for the parser, no orphaned weight copies."""
    keep = list(nodes)
    while True:
        read = {i for n in keep for i in n.input} | outputs
        live = [n for n in keep if any(o in read for o in n.output)]
        if len(live) == len(keep):
            return live
        keep = live


def _toposort(nodes, available: set[str]) -> list:
    ready, out, pending = set(available) | {""}, [], list(nodes)
    while pending:
        rest = []
        for n in pending:
            if all(i in ready for i in n.input):
                out.append(n)
                ready.update(n.output)
            else:
                rest.append(n)
        if len(rest) == len(pending):
            raise ValueError(f"graph has a cycle or a missing input near {rest[0].name}")
        pending = rest
    return out


def _drop_unused(graph) -> None:
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    keep = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep)


# ----------------------------------------------------------------------------- CPU check
def plugin_reference(x: np.ndarray, r: np.ndarray | None, node: onnx.NodeProto,
                     xp: np.ndarray | None = None) -> np.ndarray:
    """The plugin's output for int8 NCHW inputs, by the exact numpy reference (trtfuse.ops); r None: a node without
    a residual input. A fused node (proj_* fields) takes the block input ``xp`` instead of r: its residual is the
    projection's reference output (the composition the fused kernel computes exactly)."""
    from trtfuse.ops.residual_conv_reference import accumulate3x3, accumulate_stem, maxpool3x3s2, reference_fp32

    a = {at.name: at for at in node.attribute}
    cout = a["cout"].i
    if plugin_kind(node) == "stem":
        w = numpy_helper.to_array(a["weights"].t).reshape(cout, a["cin"].i, 7, 7).astype(np.int8)
        return maxpool3x3s2(reference_fp32(x, None, np.asarray(a["w_scale"].floats, np.float32),
                                           np.asarray(a["bias"].floats, np.float32), None, a["x_scale"].f, 0.0,
                                           a["out_scale"].f, a["relu"].i, acc=accumulate_stem(x, w)))
    if plugin_kind(node) == "conv3x3":
        w = numpy_helper.to_array(a["weights"].t).reshape(cout, a["cin"].i, 3, 3).astype(np.int8)
        return reference_fp32(x, None, np.asarray(a["w_scale"].floats, np.float32),
                              np.asarray(a["bias"].floats, np.float32), None, a["x_scale"].f, 0.0, a["out_scale"].f,
                              a["relu"].i, acc=accumulate3x3(x, w))

    if "proj_weights" in a:
        assert r is None and xp is not None, "a fused node takes x and the block input xp"
        r = _conv1x1_reference(a, "proj_", cout, xp, None, 0.0, 0, a["proj_stride"].i if "proj_stride" in a else 1)
    return _conv1x1_reference(a, "", cout, x, r, a["r_scale"].f, a["relu"].i, a["stride"].i if "stride" in a else 1)


def next_reference(y: np.ndarray, node: onnx.NodeProto) -> np.ndarray:
    """The second output of a node with next_* fields: the next conv1 (1x1, stride 1, no residual) of its first output
    ``y`` (int8 NCHW), by the same exact reference as any 1x1 layer."""
    a = {at.name: at for at in node.attribute}
    return _conv1x1_reference(a, "next_", a["next_cout"].i, y, None, 0.0, a["next_relu"].i, 1)


def _conv1x1_reference(a: dict, prefix: str, cout: int, x: np.ndarray, r: np.ndarray | None, r_scale: float,
                       relu: int, stride: int) -> np.ndarray:
    """The exact reference of the 1x1 conv whose fields are the attributes ``prefix`` + name of a plugin node
    (``a``: name -> attribute); weights [cout][x's channels]."""
    from trtfuse.ops.residual_conv_reference import reference_fp32

    w = numpy_helper.to_array(a[prefix + "weights"].t).reshape(cout, -1)
    return reference_fp32(x, w.astype(np.int8), np.asarray(a[prefix + "w_scale"].floats, np.float32),
                          np.asarray(a[prefix + "bias"].floats, np.float32), r, a[prefix + "x_scale"].f,
                          r_scale, a[prefix + "out_scale"].f, relu, stride=stride)


def evaluate_with_reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run a rewritten graph on CPU: ONNX Runtime for each stretch of ordinary nodes, the plugin's
    numpy reference for each plugin node. Returns the graph outputs."""
    import onnxruntime as ort

    graph = model.graph
    opset = [o for o in model.opset_import if o.domain != PLUGIN_DOMAIN]
    inits = {t.name: t for t in graph.initializer}
    consumers_after = defaultdict(set)
    for k, n in enumerate(graph.node):
        for i in n.input:
            consumers_after[i].add(k)
    graph_out = [o.name for o in graph.output]
    values = dict(feeds)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # see quantize.top1

    def run_segment(start, stop):
        seg = list(graph.node[start:stop])
        produced = {o for n in seg for o in n.output}
        needed = [i for i in dict.fromkeys(x for n in seg for x in n.input)
                  if i and i not in produced and i not in inits]
        outs = [o for o in produced if o in graph_out or any(k >= stop for k in consumers_after[o])]
        seg_inits = [inits[i] for i in dict.fromkeys(x for n in seg for x in n.input) if i in inits]
        g = helper.make_graph(
            seg, "segment",
            [helper.make_tensor_value_info(i, helper.np_dtype_to_tensor_dtype(values[i].dtype),
                                           values[i].shape) for i in needed], [], seg_inits)
        m = helper.make_model(g, opset_imports=opset, ir_version=model.ir_version)
        # ORT wants typed outputs: take the types from ONNX shape inference of the segment.
        types = {v.name: v.type.tensor_type.elem_type
                 for v in onnx.shape_inference.infer_shapes(m).graph.value_info}
        m.graph.output.extend(helper.make_tensor_value_info(o, types[o], None) for o in outs)
        sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        values.update(zip(outs, sess.run(outs, {i: values[i] for i in needed})))

    start = 0
    for k, n in enumerate(graph.node):
        if n.op_type == POOL_OP:
            if k > start:
                run_segment(start, k)
            values[n.output[0]], values[n.output[1]] = pool_reference(values[n.input[0]], n)   # hi, lo
            start = k + 1
        elif n.op_type == PLUGIN_OP:
            if k > start:
                run_segment(start, k)
            second = values[n.input[1]] if len(n.input) > 1 else None
            if plugin_kind(n) == "fused":   # [x, xp]: the projection's output is the residual, computed here
                values[n.output[0]] = plugin_reference(values[n.input[0]], None, n, xp=second)
            else:
                values[n.output[0]] = plugin_reference(values[n.input[0]], second, n)
            if len(n.output) > 1:   # next_* fields: the next conv1 of the node's own output
                values[n.output[1]] = next_reference(values[n.output[0]], n)
            start = k + 1
    if start < len(graph.node):
        run_segment(start, len(graph.node))
    return [values[o] for o in graph_out]


def node_agreement(qdq: onnx.ModelProto, rewritten: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict:
    """Each TrtfuseResidualConv node of ``rewritten`` (a rewrite of ``qdq``) against the Q/DQ graph, node by node: its
    reference (the plugin's rounding rule) on the int8 tensors ONNX Runtime computes for its inputs in ``qdq``, against
    the int8 tensor(s) ``qdq`` computes for its outputs (a chained node's second output from ORT's first). ORT sums in
    fp32 in its own order, so a value may round to the neighbouring int8 step. Returns {kind: {"nodes", "values",
    "exact" (fraction equal), "max_lsb"}}."""
    import onnxruntime as ort

    nodes = [n for n in rewritten.graph.node if n.op_type == PLUGIN_OP and n.domain == PLUGIN_DOMAIN]
    names = list(dict.fromkeys(t for n in nodes for t in [*n.input, *n.output]))
    probe = onnx.ModelProto.FromString(qdq.SerializeToString())
    have = {o.name for o in probe.graph.output}
    probe.graph.output.extend(helper.make_tensor_value_info(t, TensorProto.INT8, None) for t in names
                              if t not in have)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(probe.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    v = dict(zip(names, sess.run(names, feeds)))
    out: dict = {}
    for n in nodes:
        kind = plugin_kind(n)
        second = v[n.input[1]] if len(n.input) > 1 else None
        pairs = [(plugin_reference(v[n.input[0]], None, n, xp=second) if kind == "fused"
                  else plugin_reference(v[n.input[0]], second, n), v[n.output[0]])]
        if len(n.output) > 1:
            pairs.append((next_reference(v[n.output[0]], n), v[n.output[1]]))
        for got, want in pairs:
            d = np.abs(got.astype(np.int16) - want.astype(np.int16))
            r = out.setdefault(kind, {"nodes": 0, "values": 0, "equal": 0, "max_lsb": 0})
            r["values"] += d.size
            r["equal"] += int((d == 0).sum())
            r["max_lsb"] = max(r["max_lsb"], int(d.max()))
        out[kind]["nodes"] += 1
    for r in out.values():
        r["exact"] = r.pop("equal") / max(r["values"], 1)
    return out


def compare_logits(a: np.ndarray, b: np.ndarray) -> dict:
    """Top-1 agreement and the largest logit difference between two runs of one network.

    A random-weight classifier tends to predict one class for every image, which makes plain top-1
    agreement vacuous: ``distinct_top1`` says how many classes ``a`` predicts, and
    ``centered_top1_agreement`` compares argmaxes after removing each class's mean logit over the
    batch (the per-class bias), which do differ from image to image.
    """
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ca, cb = a64 - a64.mean(0, keepdims=True), b64 - a64.mean(0, keepdims=True)
    return {"n": len(a), "top1_agreement": float((a.argmax(1) == b.argmax(1)).mean()),
            "distinct_top1": len(set(a.argmax(1).tolist())),
            "centered_top1_agreement": float((ca.argmax(1) == cb.argmax(1)).mean()),
            "centered_distinct_top1": len(set(ca.argmax(1).tolist())),
            "max_abs_logit_diff": float(np.abs(a64 - b64).max()),
            "max_abs_logit": float(np.abs(a64).max()),
            "logit_std": float(a64.std())}


def main(argv=None) -> int:  # python -m trtfuse.passes.residual_conv_rewrite IN OUT
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("qdq_onnx")
    p.add_argument("out_onnx")
    p.add_argument("--weight-dtype", choices=sorted(WEIGHT_DTYPES), default="int32")
    p.add_argument("--projections", action="store_true", help="the projections too (see MAX_PROJECTION_CIN)")
    p.add_argument("--no-fuse", dest="fuse", action="store_false",
                   help="with --projections: keep each projection and the tail reading it two nodes (A/B)")
    p.add_argument("--conv3x3", action="store_true", help="the stride-1 3x3 convs too (see MAX_CONV3X3_COUT)")
    p.add_argument("--stem", action="store_true", help="the stem (7x7/2 conv + ReLU + 3x3/2 max pool) too")
    p.add_argument("--pool-head", action="store_true",
                   help="a GlobalAveragePool of a dequantized int8 tensor as TrtfuseAvgPool")
    p.add_argument("--chain-next", action="store_true",
                   help="tails (and the stem, with --stem) also compute the next bottleneck's conv1 (see "
                        "MAX_NEXT_TAIL_COUT, MAX_NEXT_STEM_COUT)")
    args = p.parse_args(argv)
    model, _, report = rewrite_report(onnx.load(args.qdq_onnx), args.weight_dtype, args.projections, args.fuse,
                                      args.conv3x3, args.stem, args.chain_next, args.pool_head)
    onnx.save(model, args.out_onnx)
    counts = plugin_counts(model)
    print(f"replaced {counts['tail']} residual tails, {counts['proj']} projections, {counts['fused']} "
          f"projection + tail pairs (one node each), {counts['conv3x3']} 3x3 convs and {counts['stem']} stems with "
          f"{PLUGIN_OP} ({counts['next']} of them computing the next conv1 too) -> "
          f"{args.out_onnx}", file=sys.stderr)
    if report.any_refused():
        print(report.table(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
