"""Fold BatchNormalization into the Conv before it, in an ONNX graph.

Why: int8 placement wants no Q/DQ between a conv and its BN, and TensorRT (and our fused plugin)
take one conv with a bias. In inference BN is an affine map per output channel, so
``BN(Conv(x, W, b)) == Conv(x, W * k, (b - mean) * k + beta)`` with ``k = gamma / sqrt(var + eps)``.
The fold is exact up to float rounding (checked against ONNX Runtime in tests/test_bn_fold.py).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx
from onnx import numpy_helper


def _consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    users = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            users[name].append(node)
    return users


def _indexed_copy(model: onnx.ModelProto):
    """A copy of the model (the caller's stays untouched) and lookups over its graph: initializers by
    name, the node producing each tensor, the nodes consuming each tensor, the graph output names."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    return model, graph, inits, producer, _consumers(graph), {o.name for o in graph.output}


def fold_batchnorm(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` with every foldable Conv -> BatchNormalization pair merged.

    A pair is foldable when the conv's weight (and bias) and the BN's parameters are initializers
    and the conv output feeds only that BN. Returns (model, number of BNs folded).
    """
    model, graph, inits, producer, users, graph_outputs = _indexed_copy(model)
    weight_users = defaultdict(int)  # a weight shared by two convs must not be scaled in place
    for node in graph.node:
        if node.op_type == "Conv" and len(node.input) > 1:
            weight_users[node.input[1]] += 1

    folded, remove = 0, []
    for bn in graph.node:
        if bn.op_type != "BatchNormalization" or len(bn.output) != 1:
            continue  # training-mode BN (running stats outputs) is not an inference affine map
        conv = producer.get(bn.input[0])
        if conv is None or conv.op_type != "Conv" or conv.output[0] in graph_outputs:
            continue
        if len(users[conv.output[0]]) != 1:
            continue
        params = bn.input[1:5]
        if not all(p in inits for p in params) or conv.input[1] not in inits:
            continue
        if len(conv.input) > 2 and conv.input[2] and conv.input[2] not in inits:
            continue
        eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        gamma, beta, mean, var = (numpy_helper.to_array(inits[p]).astype(np.float64) for p in params)
        w = numpy_helper.to_array(inits[conv.input[1]]).astype(np.float64)
        has_bias = len(conv.input) > 2 and bool(conv.input[2])
        b = numpy_helper.to_array(inits[conv.input[2]]).astype(np.float64) if has_bias \
            else np.zeros(w.shape[0])
        k = gamma / np.sqrt(var + eps)
        w_new = (w * k.reshape(-1, *([1] * (w.ndim - 1)))).astype(np.float32)
        b_new = ((b - mean) * k + beta).astype(np.float32)

        w_name = f"{conv.output[0]}_folded_W" if weight_users[conv.input[1]] > 1 else conv.input[1]
        b_name = f"{conv.output[0]}_folded_B"
        _set_initializer(graph, inits, w_name, w_new)
        _set_initializer(graph, inits, b_name, b_new)
        conv.input[1] = w_name
        if has_bias:
            conv.input[2] = b_name
        else:
            conv.input.append(b_name)
        conv.output[0] = bn.output[0]  # the conv now produces what the BN produced
        remove.append(bn)
        folded += 1

    for bn in remove:
        graph.node.remove(bn)
    _drop_unused_initializers(graph)
    return model, folded


def _set_initializer(graph, inits, name, array):
    tensor = numpy_helper.from_array(array, name)
    if name in inits:
        inits[name].CopyFrom(tensor)
    else:
        graph.initializer.append(tensor)
        inits[name] = graph.initializer[-1]


def _drop_unused_initializers(graph: onnx.GraphProto) -> None:
    used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    stale = {t.name for t in graph.initializer if t.name not in used}
    keep = [t for t in graph.initializer if t.name not in stale]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    # Old exporters also list initializers as graph inputs: drop the declarations that went away.
    inputs = [i for i in graph.input if i.name not in stale]
    del graph.input[:]
    graph.input.extend(inputs)


def fold_pad_into_conv(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` with every zero, spatial-only ``Pad -> Conv`` merged into the conv's pads.

    Why: exports of TensorFlow-style "SAME" padding (EfficientNet) put a Pad before the conv; the
    conv's input must be the tensor that gets the Q/DQ, and TensorRT pads inside the conv for free.
    Returns (model, number of Pads folded).
    """
    model, graph, inits, producer, users, graph_outputs = _indexed_copy(model)
    remove = []
    for conv in graph.node:
        pad = producer.get(conv.input[0]) if conv.op_type == "Conv" else None
        if pad is None or pad.op_type != "Pad" or len(users[pad.output[0]]) != 1:
            continue
        if pad.output[0] in graph_outputs or pad.input[1] not in inits:
            continue
        mode = next((a.s.decode() for a in pad.attribute if a.name == "mode"), "constant")
        value = pad.input[2] if len(pad.input) > 2 and pad.input[2] else None
        if mode != "constant" or (value and (value not in inits or
                                             numpy_helper.to_array(inits[value]).any())):
            continue
        if len(pad.input) > 3 and pad.input[3]:
            continue  # explicit axes: rare, leave it
        pads = numpy_helper.to_array(inits[pad.input[1]]).astype(np.int64)
        rank = len(pads) // 2
        begin, end = pads[:rank], pads[rank:]
        if rank < 3 or begin[:2].any() or end[:2].any() or (pads < 0).any():
            continue  # padding of batch/channels, or cropping
        attr = next((a for a in conv.attribute if a.name == "pads"), None)
        auto = next((a.s.decode() for a in conv.attribute if a.name == "auto_pad"), "NOTSET")
        if auto not in ("NOTSET", ""):
            continue
        old = list(attr.ints) if attr is not None else [0] * (2 * (rank - 2))
        k = rank - 2
        new = [old[i] + int(begin[2 + i]) for i in range(k)] + [old[k + i] + int(end[2 + i]) for i in range(k)]
        if attr is None:
            conv.attribute.append(onnx.helper.make_attribute("pads", new))
        else:
            del attr.ints[:]
            attr.ints.extend(new)
        conv.input[0] = pad.input[0]
        remove.append(pad)
    for pad in remove:
        graph.node.remove(pad)
    _drop_unused_initializers(graph)
    return model, len(remove)
