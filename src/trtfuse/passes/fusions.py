"""The fusion registry: every graph rewrite trtfuse makes for its TensorRT plugins, in one list (FUSIONS).

Each Fusion names its kind, the functions that find it (matchers) and write its plugin node (emitter) in the rewrite
module of its plugin family (residual_conv_rewrite, layernorm_rewrite: their logic lives there), its CPU reference
where one exists, the TensorRT plugin op that runs it, the ``--plugins`` modes that enable it and the build precisions
whose graph it applies to. What iterates over it:

* ``rewrite(model, mode, precision)``: the rewrite ``trtfuse build`` runs (src/trtfuse/trt_graph.py: onnx_for_build). Each
  family's rewrite is one pass over the graph (``PASSES``); a fusion turns on in its pass through its ``option``,
  the pass's keyword (None: on whenever the pass runs);
* ``Rewrite.summary()`` and ``Rewrite.report.table()``: the counts ``trtfuse build`` prints and its refusal table
  (kind, candidates found, fused, the first refusal);
* ``layer_marks()``: how ``trtfuse profile`` tells our plugin layers by their names (engine_inspect.is_ours);
* tests/test_fusions.py.

A new fusion: its matcher and emitter in its family's rewrite module (a new family: its rewrite as a pass in
``PASSES``), one Fusion here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import onnx
from trtfuse.errors import UserError
from trtfuse.passes import layernorm_rewrite as lr
from trtfuse.passes import residual_conv_rewrite as rcr
from trtfuse.passes.residual_conv_rewrite import FusionReport, KindReport

INT8 = ("int8",)
FLOAT = ("fp32", "fp16")


@dataclass(frozen=True)
class Fusion:
    kind: str                      # the report's and the counts' name for it
    label: str                     # what ``trtfuse build`` counts: "residual tail" -> "16 residual tails"
    plugin_op: str                 # the TensorRT plugin (ONNX op type, domain "trtfuse") that runs it
    modes: tuple[str, ...]         # the --plugins modes (config.PLUGIN_MODES) that enable it
    precisions: tuple[str, ...]    # the build precisions whose graph it applies to
    family: str                    # the pass (PASSES) that finds and writes it
    option: str | None             # the pass's keyword that turns it on; None: always, when the pass runs
    matchers: tuple[Callable, ...]  # the functions that find candidates (a match, None, or a refusal with a reason)
    emitter: Callable              # the function that writes its node(s)
    reference: Callable | None     # its output on CPU (numpy, or a standard-ONNX graph for ONNX Runtime)
    count: Callable[[onnx.ModelProto], int]   # how many a rewritten graph holds
    note: str = ""                 # printed after the count
    own_node: bool = True          # False: computed inside another kind's node (counted apart from the nodes)
    plural: str = ""               # the label's plural where it is not label + "s"
    # what the names of its nodes hold, besides plugin_op: TensorRT names a plugin layer after its ONNX node
    names: tuple[str, ...] = ()

    def enabled(self, mode: str, precision: str = "int8") -> bool:
        return mode in self.modes and precision in self.precisions

    def counted(self, n: int) -> str:
        return f"{n} {self.label if n == 1 else self.plural or self.label + 's'}"


def _residual_count(kind: str) -> Callable[[onnx.ModelProto], int]:
    def count(model: onnx.ModelProto) -> int:
        return rcr.plugin_counts(model)[kind]
    return count


def _op_count(op: str) -> Callable[[onnx.ModelProto], int]:
    def count(model: onnx.ModelProto) -> int:
        return sum(n.op_type == op and n.domain == rcr.PLUGIN_DOMAIN for n in model.graph.node)
    return count


_CONV = dict(plugin_op=rcr.PLUGIN_OP, precisions=INT8, family="residual_conv", emitter=rcr.plugin_node,
             reference=rcr.plugin_reference)
# The LayerNorm rewrite names its nodes after the first node they replace, + "_trtfuse<k>".
_LAYERNORM = dict(precisions=FLOAT, family="layernorm", matchers=(lr._match_layernormalization, lr._match_decomposed),
                  emitter=lr._apply, reference=lr.expand_plugins, names=("_trtfuse",))

# In the order ``trtfuse build`` lists them (residual_conv_rewrite.KINDS for the conv family).
FUSIONS: tuple[Fusion, ...] = (
    # conv 1x1 + BN + residual Add (+ ReLU) -> Q: each bottleneck's (or MBConv's) tail
    Fusion("tail", "residual tail", modes=("tails", "all"), option=None, matchers=(rcr.find_tails,),
           count=_residual_count("tail"), **_CONV),
    # a downsample conv 1x1 + BN (stride 1 or 2) quantized on its own, where the plugin is faster (MAX_PROJECTION_CIN)
    Fusion("proj", "projection", modes=("all",), option="projections", matchers=(rcr.find_projections,),
           count=_residual_count("proj"), **_CONV),
    # a projection and the tail that reads it as one node (MAX_FUSED_K_BYTES)
    Fusion("fused", "projection + tail pair", note="(one node each)", modes=("all",), option="fuse",
           matchers=(rcr._fusable,), count=_residual_count("fused"), **_CONV),
    # a stride-1 3x3 conv + BN + ReLU on the halo kernel (MAX_CONV3X3_COUT)
    Fusion("conv3x3", "3x3 conv", modes=("all",), option="conv3x3", matchers=(rcr.find_conv3x3,),
           count=_residual_count("conv3x3"), **_CONV),
    # conv 7x7/2 + BN + ReLU + max pool 3x3/2
    Fusion("stem", "stem", modes=("all",), option="stem", matchers=(rcr.find_stems,), count=_residual_count("stem"),
           **_CONV),
    # the next bottleneck's conv1, computed by the tail (or the stem) before it: a second output, no node of its own
    Fusion("next", "next conv1", note="computed by the tail or stem before it", own_node=False, modes=("all",),
           option="chain_next", matchers=(rcr._chainable,), count=_residual_count("next"),
           **{**_CONV, "reference": rcr.next_reference}),
    # the head's GlobalAveragePool of a dequantized int8 tensor: int8 hi + lo, then two DequantizeLinears and an Add.
    # On the H100 with TensorRT 8.5.3.1 ResNet-50's head takes 0.14 ms instead of 0.43 with it, and the logits agree
    # with plugins off as before it (docs/residual_conv.md, Version 19).
    Fusion("pool", "pool head", rcr.POOL_OP, note="(int8 hi + lo, the mean to 1/256 LSB)", modes=("all",),
           precisions=INT8, family="residual_conv", option="pool_head", matchers=(rcr.find_pool_heads,),
           emitter=rcr.PoolHead.nodes, reference=rcr.pool_reference, count=_op_count(rcr.POOL_OP)),
    # LayerNormalization, or its decomposed form, over the last axis (float I/O: fp32 and fp16 builds)
    Fusion("layernorm", "LayerNorm", lr.LAYERNORM, modes=("all",), option=None, count=_op_count(lr.LAYERNORM),
           **_LAYERNORM),
    # a LayerNorm whose input is a residual Add (and the bias Add before it): one node
    Fusion("skip_layernorm", "LayerNorm with its residual Add", lr.SKIP_LAYERNORM,
           plural="LayerNorms with their residual Add", modes=("all",),
           option="fuse_residual", count=_op_count(lr.SKIP_LAYERNORM),
           **{**_LAYERNORM, "matchers": (lr._match_residual,)}),
)
KINDS = tuple(f.kind for f in FUSIONS)


def by_kind(kind: str) -> Fusion:
    return next(f for f in FUSIONS if f.kind == kind)


def enabled(mode: str, precision: str = "int8") -> list[Fusion]:
    """The fusions ``--plugins mode`` makes in a ``precision`` build."""
    return [f for f in FUSIONS if f.enabled(mode, precision)]


def plugin_ops() -> tuple[str, ...]:
    """Every plugin op a rewrite writes, once each, in registry order."""
    return tuple(dict.fromkeys(f.plugin_op for f in FUSIONS))


def layer_marks() -> tuple[str, ...]:
    """What the name of a plugin node a rewrite writes holds (its plugin op, or its ``names``), once each: TensorRT
    names the plugin's layer after the node (engine_inspect.is_ours)."""
    return tuple(dict.fromkeys(m for f in FUSIONS for m in (f.plugin_op, *f.names)))


def options(family: str, mode: str, precision: str = "int8") -> dict[str, bool]:
    """The keywords of ``family``'s pass for ``mode``: each of its fusions' option, on where the mode enables it."""
    return {f.option: f.enabled(mode, precision) for f in FUSIONS if f.family == family and f.option}


# ----------------------------------------------------------------------------- the passes
def _residual_conv_pass(model: onnx.ModelProto, weight_dtype: str, exclude=(),
                        **opts) -> tuple[onnx.ModelProto, int, dict, list]:
    try:
        out, n, report = rcr.rewrite_report(model, weight_dtype, exclude=exclude, **opts)
    except rcr.UnknownSite as e:
        raise UserError(f"tensorrt.plugin_exclude: {e}",
                        "take the site ids from `trtfuse bench edge latency-profile`'s record or the build's sites "
                        "file (model.int8.plugins-all.sites.json), for this model") from None
    return out, n, report.kinds, report.sites


def _layernorm_pass(model: onnx.ModelProto, weight_dtype: str, exclude=(),
                    **opts) -> tuple[onnx.ModelProto, int, dict, list]:
    """rewrite_layernorm, its report as the registry's rows; a graph where nothing was replaced stays as it came (the
    rewrite re-exports every graph through onnx-graphsurgeon). Its LayerNorms have no site ids: ``exclude`` holds
    only the conv family's (config.plugin_exclude)."""
    out, r = lr.rewrite_layernorm(model, **opts)
    kinds = {"layernorm": KindReport(found=r.total + len(r.skipped), fused=r.total, refused=len(r.skipped)),
             "skip_layernorm": KindReport(found=r.residual_fused + len(r.residual_not_fused), fused=r.residual_fused,
                                          refused=len(r.residual_not_fused))}
    for kind, refusals in (("layernorm", r.skipped), ("skip_layernorm", r.residual_not_fused)):
        if refusals:
            kinds[kind].first_node, kinds[kind].first_reason = refusals[0]
    return (out if r.total else model), r.total, kinds, []


# family -> its rewrite: (model, weight_dtype, exclude, **options) -> (model, plugin nodes, {kind: KindReport}, the
# sites of its plugin nodes: FusionReport.sites)
PASSES: dict[str, Callable] = {"residual_conv": _residual_conv_pass, "layernorm": _layernorm_pass}


@dataclass
class Rewrite:
    model: onnx.ModelProto
    mode: str
    precision: str
    nodes: int                 # plugin nodes written (a pool head's counts as one)
    counts: dict[str, int]     # per kind listed (listed()): how many the graph holds
    report: FusionReport       # per kind: candidates found, fused, the first refusal (registry order)

    def listed(self) -> list[Fusion]:
        """The kinds ``summary`` counts: every fusion of each plugin op that the mode enables at this precision (a
        kind the mode leaves off shows as 0)."""
        ops = {f.plugin_op for f in enabled(self.mode, self.precision)}
        return [f for f in FUSIONS if f.plugin_op in ops and self.precision in f.precisions]

    def summary(self) -> str:
        """One line: per plugin op, how many of each kind it runs ("TrtfuseResidualConv for 16 residual tails, ...")."""
        groups = {}
        for f in self.listed():
            groups.setdefault(f.plugin_op, []).append(f)
        parts = []
        for op, kinds in groups.items():
            said = [f.counted(self.counts[f.kind]) + (f" {f.note}" if f.note else "") for f in kinds]
            own = [s for f, s in zip(kinds, said) if f.own_node]
            text = own[0] if len(own) == 1 else ", ".join(own[:-1]) + " and " + own[-1]
            parts.append(f"{op} for {text}" + "".join(f"; {s}" for f, s in zip(kinds, said) if not f.own_node))
        return f"--plugins {self.mode}: " + "; ".join(parts)


def rewrite(model: onnx.ModelProto, mode: str, precision: str = "int8", weight_dtype: str = "int32",
            exclude: tuple[str, ...] = ()) -> Rewrite:
    """``model`` with the fusions ``--plugins mode`` enables at ``precision`` (a normalized mode: config.plugin_mode):
    each pass (PASSES) whose family has one of them runs, in registry order, with its options (``options``), but
    at the sites ``exclude`` names (config.plugin_exclude; residual_conv_rewrite.site_id)."""
    report = FusionReport(kinds={k: KindReport() for k in KINDS})
    nodes = 0
    for family, run in PASSES.items():
        if any(f.family == family for f in enabled(mode, precision)):
            model, n, kinds, sites = run(model, weight_dtype, exclude=exclude, **options(family, mode, precision))
            nodes += n
            report.kinds.update((k, r) for k, r in kinds.items() if k in report.kinds)
            report.sites.extend(sites)
    result = Rewrite(model, mode, precision, nodes, {}, report)
    result.counts = {f.kind: f.count(model) for f in result.listed()}
    return result
