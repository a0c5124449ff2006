"""What exporters spell differently, made one spelling before calibration and quantization.

Two exports of one network differ in ways the math does not see:

* constants: torch's TorchScript exporter stores equal tensors once and reads the copies through ``Identity``
  nodes (a fresh torchvision ResNet's BN folds into all-zero conv biases, so most biases of a shape become
  ``Identity(bias_of_the_first_conv)``); other exporters write ``Constant`` nodes. Every pass after this one
  (BN fold, Pad fold, Q/DQ placement, the plugin rewrite) wants a conv's weight, bias and pads as initializers;
* ReLU: ``Relu`` or ``Clip(x, 0)`` / ``Clip(x, 0, +inf)`` (``is_relu`` tells both).

``inline_constants`` turns every ``Constant`` node and every ``Identity`` of a constant into an initializer of the
same output name; the graph computes exactly what it did.

* opset: torch's dynamo exporter writes opset 18 whatever is asked (its version converter fails to go down to 17 on
  ReduceMean's axes input), and TensorRT 8.5's parser reads opsets up to 17, where the Reduce ops take their axes as
  an attribute. ``to_opset17`` moves a constant ``axes`` input back into the attribute and declares opset 17 where
  every node means the same in both (else it leaves the model at 18 and says which node keeps it there).

``canonicalize`` does both; the quantize step runs it first.
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


# The Reduce ops whose axes became an input in opset 18 (ReduceSum's did in 13).
_REDUCE_AXES_18 = {"ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin",
                   "ReduceProd", "ReduceSumSquare"}


def to_opset17(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str | None]:
    """A copy of an opset-18 ``model`` declared opset 17, its opset-18 Reduce ops given their (constant) axes as an
    attribute, where every node means the same in both opsets; (model, None). Else the model unchanged and why (the
    first node that keeps it at 18). Models at another opset come back unchanged, with None."""
    from onnx import defs, helper

    opset = next((o for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or opset.version != 18:
        return model, None
    out = onnx.ModelProto.FromString(model.SerializeToString())
    graph = out.graph
    consts = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for n in graph.node:
        if n.op_type == "Constant":
            v = constant_value(n)
            if v is not None:
                consts[n.output[0]] = v
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        try:
            since = defs.get_schema(node.op_type, 18).since_version
        except Exception:   # noqa: BLE001 - not an ONNX op this onnx knows
            return model, f"{node.name or node.op_type}: {node.op_type} is not an ONNX op known here"
        if since < 18:
            continue
        attrs = {a.name for a in node.attribute}
        if node.op_type in _REDUCE_AXES_18:
            axes = None
            if len(node.input) > 1 and node.input[1]:
                axes = consts.get(node.input[1])
                if axes is None:
                    return model, f"{node.name or node.op_type}: {node.op_type}'s axes are not constant"
            noop = next((a.i for a in node.attribute if a.name == "noop_with_empty_axes"), 0)
            if noop and (axes is None or axes.size == 0):   # the identity: no opset-17 Reduce says that
                return model, f"{node.name or node.op_type}: {node.op_type} with noop_with_empty_axes and no axes"
            keep = [a for a in node.attribute if a.name != "noop_with_empty_axes"]   # not an opset-17 attribute
            del node.attribute[:]
            node.attribute.extend(keep)
            if axes is not None:
                del node.input[1:]
                if axes.size:
                    node.attribute.append(helper.make_attribute("axes", [int(a) for a in axes.reshape(-1)]))
        elif node.op_type == "Pad" and len(node.input) > 3 and node.input[3]:
            return model, f"{node.name or node.op_type}: Pad with an axes input"
        elif node.op_type == "Split" and "num_outputs" in attrs:
            return model, f"{node.name or node.op_type}: Split with num_outputs"
        elif node.op_type not in ("Pad", "Split"):
            return model, f"{node.name or node.op_type}: {node.op_type} changed in opset 18"
    for o in out.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = 17
    # drop what only the moved axes read
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    live = [n for n in graph.node if n.op_type != "Constant" or n.output[0] in used]
    del graph.node[:]
    graph.node.extend(live)
    keep = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    return out, None


def canonicalize(model: onnx.ModelProto) -> onnx.ModelProto:
    """``inline_constants`` then ``to_opset17`` (see the module docstring)."""
    model, _ = inline_constants(model)
    model, _ = to_opset17(model)
    return model
