"""The graph TensorRT gets: the ONNX bytes handed to its parser for a build config (the Q/DQ graph with its weights
as float constants, the fusions of ``--plugins`` rewritten into trtfuse's plugin nodes, an int8 input), the plugin
library those nodes need, and the edits to the parsed network (the plugins' int8 outputs pinned, the top classes).
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

from trtfuse.build_config import BuildConfig
from trtfuse.errors import UserError
from trtfuse.quantize_step import QDQ_FILE

# The engine's response output: the top-k class indices (int32, best first), ranked on the GPU so
# that k int32 per sample leave the device instead of the scores. The scores stay an output too
# (for `infer`, agreement checks); the serving path copies back only this one.
TOP_CLASSES = "top_classes"


def onnx_for_build(model_dir: Path, cfg: BuildConfig) -> bytes:
    """The ONNX bytes the parser gets for ``cfg`` (int8: Q/DQ graph), rewritten by the fusions ``cfg.plugins`` enables
    at ``cfg.precision`` (src/trtfuse/passes/fusions.py)."""
    import onnx
    from trtfuse.models import load_prepared
    from trtfuse.passes.fusions import enabled
    from trtfuse.passes.quantize import weights_as_float_qdq

    if cfg.precision != "int8":
        source = Path(load_prepared(model_dir).onnx_path)
        if cfg.plugins == "off":
            return source.read_bytes()
        if not enabled(cfg.plugins, cfg.precision):
            raise UserError(f"--plugins {cfg.plugins} needs --precision int8 (the fused plugin is int8)",
                            "add --precision int8, or use --plugins off")
        return rewrite_for_build(model_dir, onnx.load(source), cfg).SerializeToString()
    qdq = model_dir / QDQ_FILE
    if not qdq.is_file():
        raise UserError(f"{qdq} does not exist: int8 needs a calibrated Q/DQ model",
                        f"quantize first: `trtfuse build {model_dir} --precision int8 --calibration "
                        "IMAGES --quantize-only` (IMAGES: a folder of labelled images)")
    model = onnx.load(qdq)
    if cfg.plugins != "off":
        model = rewrite_for_build(model_dir, model, cfg)
    # TensorRT 8.5's parser wants quantized weights as float constants behind a QuantizeLinear; every
    # later version parses that form too, so it is the one handed over.
    model = weights_as_float_qdq(model)
    if cfg.input_format == "int8":
        model = int8_input_graph(model)
    return model.SerializeToString()


def rewritten_file(precision: str, plugins: str) -> str:
    """Where the rewritten graph is kept in the model folder, for a look at it: model.int8.plugins.onnx (tails),
    model.int8.plugins-all.onnx (all); model.fp32.plugins-all.onnx ..."""
    return f"model.{precision}.plugins{'' if plugins == 'tails' else '-' + plugins}.onnx"


def rewrite_for_build(model_dir: Path, model, cfg: BuildConfig):
    """``model`` rewritten for ``cfg`` (fusions.rewrite); prints the counts per kind and, where a candidate was
    refused, the refusal table; keeps the graph in the model folder (rewritten_file)."""
    import onnx
    from trtfuse.passes.fusions import FUSIONS, rewrite

    result = rewrite(model, cfg.plugins, cfg.precision, cfg.weight_dtype, cfg.plugin_exclude)
    print(f"trtfuse: {result.summary()}" + (f" ({len(cfg.plugin_exclude)} sites excluded)" if cfg.plugin_exclude
                                            else ""), file=sys.stderr)
    if result.report.any_refused():   # what the plugins did not take, and the first reason per kind
        print("trtfuse: not fused (candidates per kind; the first refusal):\n  "
              + result.report.table().replace("\n", "\n  "), file=sys.stderr)
    if result.nodes == 0:
        # the precisions whose builds this mode has other fusions for (int8: the conv family; fp32/fp16: LayerNorms)
        elsewhere = sorted({p for f in FUSIONS if cfg.plugins in f.modes and cfg.precision not in f.precisions
                            for p in f.precisions}, reverse=True)
        raise UserError(f"--plugins {cfg.plugins} found no layer to fuse in this model at --precision {cfg.precision}",
                        "use --plugins off for it" + (f" (or --precision {' or '.join(elsewhere)}, whose fusions "
                                                      "differ)" if elsewhere else ""))
    onnx.save(result.model, model_dir / rewritten_file(cfg.precision, cfg.plugins))
    # each plugin node's fusion sites and the nodes it replaced: the ids tensorrt.plugin_exclude takes
    sites = model_dir / rewritten_file(cfg.precision, cfg.plugins).replace(".onnx", ".sites.json")
    tmp = sites.with_name(sites.name + ".tmp")
    tmp.write_text(json.dumps({"exclude": list(cfg.plugin_exclude), "nodes": result.report.sites}, indent=1) + "\n")
    tmp.replace(sites)
    return result.model


def int8_input_graph(model):
    """The graph with an int8 input: the input's QuantizeLinear goes and its DequantizeLinear reads the
    input directly, so the host sends round(x / s) itself. In an explicitly quantized network this is how
    an int8 input is said (TensorRT refuses dynamic ranges once Q/DQ layers are present)."""
    import onnx

    graph = model.graph
    name = graph.input[0].name
    quant = [n for n in graph.node if n.op_type == "QuantizeLinear" and n.input[0] == name]
    if len(quant) != 1:
        raise UserError("int8 input needs exactly one QuantizeLinear on the model input",
                        "use --input-format float for this model")
    q = quant[0]
    for node in graph.node:
        for i, value in enumerate(node.input):
            if value == q.output[0]:
                node.input[i] = name
    graph.node.remove(q)
    graph.input[0].type.tensor_type.elem_type = onnx.TensorProto.INT8
    return model


def load_plugin_library(path: str | None = None) -> Path:
    """dlopen libtrtfuse_plugins.so (RTLD_GLOBAL) so its creators register before parsing."""
    from trtfuse.ops.residual_conv import use_shipped_tuning_cache
    from trtfuse.plugin_build import library_path

    lib = Path(path) if path else Path(library_path("plugins"))
    if not lib.is_file():
        raise UserError(f"the TensorRT plugin library {lib} does not exist",
                        "build it with `trtfuse plugins build --tensorrt-root $TENSORRT_ROOT` "
                        "(or set TRTFUSE_PLUGIN_LIB)")
    use_shipped_tuning_cache()  # before the plugin's first forward reads it
    ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    return lib


def pin_int8_plugin_outputs(trt, network) -> int:
    """Pins every output of a TrtfuseResidualConv layer to int8 (the type the plugin declares for all of them); returns
    how many. TensorRT 8.5 does not carry a plugin's int8 type to a second output that feeds another plugin directly
    (no Q/DQ between them, as a chained tail's next-conv output feeding the 3x3 plugin): its Q/DQ optimizer then
    finds no format for that edge and stops the build ("All of the candidates were removed ... incorrectly marked as
    an int8 node"). Before the build the parsed network reports these outputs as float, so the pin goes by the
    plugin's type, not by the tensor's; other plugins (LayerNorm, whose outputs are float) are left alone."""
    from trtfuse.passes.residual_conv_rewrite import PLUGIN_OP

    pinned = 0
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if layer.type != trt.LayerType.PLUGIN_V2:
            continue
        layer.__class__ = trt.IPluginV2Layer   # the Python API's way to reach a layer's plugin
        if layer.plugin.plugin_type != PLUGIN_OP:
            continue
        for j in range(layer.num_outputs):
            layer.set_output_type(j, trt.int8)
            pinned += 1
    return pinned


def add_top_classes(trt, network, scores_name: str, k: int) -> None:
    """Append TopK(k) over the class axis of the scores output and mark its indices TOP_CLASSES
    (int32, as MLPerf submitters' engines do; a Cast where a TensorRT gives other index types)."""
    outputs = {network.get_output(i).name: network.get_output(i) for i in range(network.num_outputs)}
    scores = outputs.get(scores_name) or network.get_output(0)
    if len(scores.shape) < 2 or (scores.shape[1] > 0 and k > scores.shape[1]):
        raise UserError(f"cannot rank the top {k} classes of output {scores.name!r} with shape {tuple(scores.shape)}",
                        "build with top_k=0 for a model whose output is not [batch, classes]")
    indices = network.add_topk(scores, trt.TopKOperation.MAX, k, 1 << 1).get_output(1)
    if indices.dtype != trt.int32:
        indices = network.add_cast(indices, trt.int32).get_output(0)
    indices.name = TOP_CLASSES
    network.mark_output(indices)
