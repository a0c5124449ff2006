"""What exporters spell differently, made one spelling before calibration and quantization.

Two exports of one network differ in ways the math does not see:

* constants: torch's TorchScript exporter stores equal tensors once and reads the copies through ``Identity``
  nodes (a fresh torchvision ResNet's BN folds into all-zero conv biases, so most biases of a shape become
  ``Identity(bias_of_the_first_conv)``); other exporters write ``Constant`` nodes. Every pass after this one
  (BN fold, Pad fold, Q/DQ placement, the plugin rewrite) wants a conv's weight, bias and pads as initializers;
* ReLU: ``Relu`` or ``Clip(x, 0)`` / ``Clip(x, 0, +inf)`` (``is_relu`` tells both).

``inline_constants`` turns every ``Constant`` node and every ``Identity`` of a constant into an initializer of the
same output name; the graph computes exactly what it did.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper


def constant_value(node: onnx.NodeProto) -> np.ndarray | None:
    """The value of a ``Constant`` node (any of its attribute spellings), else None."""
    if node.op_type != "Constant":
        return None
    for a in node.attribute:
        if a.name == "value":
            return numpy_helper.to_array(a.t)
        if a.name == "value_float":
            return np.array(a.f, np.float32)
        if a.name == "value_floats":
            return np.array(list(a.floats), np.float32)
        if a.name == "value_int":
            return np.array(a.i, np.int64)
        if a.name == "value_ints":
            return np.array(list(a.ints), np.int64)
    return None


def is_relu(node: onnx.NodeProto | None, const) -> bool:
    """``node`` is max(x, 0): a Relu, or a Clip whose min is 0 and whose max is absent or +inf (opset 6's attributes
    or opset 11's inputs). ``const(name)`` gives an input's constant value or None."""
    if node is None:
        return False
    if node.op_type == "Relu":
        return True
    if node.op_type != "Clip":
        return False
    attrs = {a.name: a.f for a in node.attribute}
    if "min" in attrs or "max" in attrs:   # opset < 11
        return attrs.get("min", -np.inf) == 0.0 and attrs.get("max", np.inf) == np.inf
    lo = const(node.input[1]) if len(node.input) > 1 and node.input[1] else None
    hi = const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if lo is None or lo.size != 1 or float(lo.item()) != 0.0:
        return False
    if len(node.input) > 2 and node.input[2]:
        return hi is not None and hi.size == 1 and float(hi.item()) == np.inf
    return True


def inline_constants(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` with every ``Constant`` node, and every ``Identity`` whose input is constant, replaced by an
    initializer of the same name. Returns (model, nodes replaced)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    values = {t.name: t for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    replaced, keep = 0, []
    for node in graph.node:
        value = None
        if node.op_type == "Constant":
            v = constant_value(node)
            value = None if v is None else numpy_helper.from_array(v, node.output[0])
        elif node.op_type == "Identity" and node.input[0] in values:
            value = onnx.TensorProto()
            value.CopyFrom(values[node.input[0]])
            value.name = node.output[0]
        if value is None or node.output[0] in outputs:
            keep.append(node)
            continue
        graph.initializer.append(value)
        values[value.name] = graph.initializer[-1]
        replaced += 1
    if replaced:
        del graph.node[:]
        graph.node.extend(keep)
        used = {i for n in graph.node for i in n.input} | outputs
        inits = [t for t in graph.initializer if t.name in used]
        del graph.initializer[:]
        graph.initializer.extend(inits)
    return model, replaced
