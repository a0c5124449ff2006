"""Replace LayerNorms in an ONNX graph with the trtfuse TensorRT plugin nodes, and back.

``rewrite_layernorm`` finds
  * ``LayerNormalization`` (opset 17+),
  * the decomposed form exporters emit for older opsets::

        mean = ReduceMean(x)            axes = last, keepdims = 1 (attribute before opset 18, input from 18)
        d    = Sub(x, mean)
        var  = ReduceMean(Pow(d, 2))    or Mul(d, d)
        n    = Div(d, Sqrt(Add(var, eps)))      or Mul(d, Reciprocal(Sqrt(...))); Add operands in either order
        y    = Add(Mul(n, gamma), beta)         both optional, operands in either order

and replaces each with a ``TrtfuseLayerNorm`` node. When the LayerNorm's input is ``Add(a, b)`` of two
activations of the same shape (a residual connection), optionally with a bias ``Add(a', bias)`` feeding
it, the Adds are folded into a ``TrtfuseSkipLayerNorm`` node; if the sum is also used elsewhere the
plugin's second output (``sum_output=1``) takes over those uses.

Only LayerNorms over the last axis are rewritten (the plugin normalizes the last dimension); every
candidate that is left alone is listed in the report with the reason.

``expand_plugins`` is the inverse (plugin nodes -> standard ONNX ops), so the numerics of a rewritten graph
can be checked with ONNX Runtime on a CPU.

Node contract (docs/ARCHITECTURE.md): op_type = plugin name, domain "trtfuse", attributes
plugin_version="1", plugin_namespace="", fields as plain INT/FLOAT attributes, gamma/beta/bias as float32
1-D initializers.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from trtfuse.errors import UserError

DOMAIN = "trtfuse"
LAYERNORM = "TrtfuseLayerNorm"
SKIP_LAYERNORM = "TrtfuseSkipLayerNorm"
PLUGIN_OPS = (LAYERNORM, SKIP_LAYERNORM)
_COMMON_ATTRS = {"plugin_version": "1", "plugin_namespace": ""}
_PLUGIN_DTYPES = (np.float32, np.float16)


@dataclass
class RewriteReport:
    replaced: Counter = field(default_factory=Counter)   # pattern ("LayerNormalization", "decomposed") -> count
    residual_fused: int = 0        # of those, how many became TrtfuseSkipLayerNorm
    with_bias: int = 0             # ... with a bias Add folded in
    with_sum_output: int = 0       # ... whose sum is also used elsewhere (sum_output=1)
    skipped: list[tuple[str, str]] = field(default_factory=list)          # (node, reason): left as is
    residual_not_fused: list[tuple[str, str]] = field(default_factory=list)  # (node, reason): plain plugin

    @property
    def total(self) -> int:
        return sum(self.replaced.values())

    def plugin_counts(self) -> dict[str, int]:
        return {LAYERNORM: self.total - self.residual_fused, SKIP_LAYERNORM: self.residual_fused}

    def summary(self) -> str:
        lines = [f"replaced {self.total} LayerNorm(s): "
                 + (", ".join(f"{k} {v}" for k, v in sorted(self.replaced.items())) or "none"),
                 "plugin nodes: " + ", ".join(f"{k} {v}" for k, v in self.plugin_counts().items())
                 + f" (bias folded {self.with_bias}, sum_output {self.with_sum_output})"]
        lines += [f"skipped {name}: {why}" for name, why in self.skipped]
        lines += [f"residual not fused at {name}: {why}" for name, why in self.residual_not_fused]
        return "\n".join(lines)


class _Skip(Exception):
    """A LayerNorm candidate that is not rewritten; the message is the reason."""


@dataclass
class _Match:
    pattern: str
    nodes: list            # every node the plugin replaces
    x: gs.Tensor           # normalized input
    y: gs.Tensor           # normalized (and scaled/shifted) output
    gamma: np.ndarray | None
    beta: np.ndarray | None
    epsilon: float


# ----------------------------------------------------------------------------------------------- helpers

def _producer(t: gs.Tensor):
    return t.inputs[0] if len(t.inputs) == 1 else None


def _const(t: gs.Tensor) -> np.ndarray | None:
    """The value of an initializer or a Constant node's output, else None."""
    if isinstance(t, gs.Constant):
        return np.asarray(t.values)
    p = _producer(t)
    if p is not None and p.op == "Constant" and isinstance(p.attrs.get("value"), gs.Constant):
        return np.asarray(p.attrs["value"].values)
    return None


def _is_output(t: gs.Tensor, graph: gs.Graph) -> bool:
    return any(t is o for o in graph.outputs)


def _rank(t: gs.Tensor) -> int | None:
    return len(t.shape) if t.shape is not None else None


def _last_dim(t: gs.Tensor) -> int | None:
    if t.shape is None or not t.shape:
        return None
    d = t.shape[-1]
    return int(d) if isinstance(d, (int, np.integer)) and d > 0 else None


def _is_last_axis(axes, rank: int | None) -> bool:
    axes = [int(a) for a in np.atleast_1d(axes)] if axes is not None else None
    if axes is None:                      # all axes: the last one only for rank-1 tensors
        return rank == 1
    return len(axes) == 1 and (axes[0] == -1 or (rank is not None and axes[0] == rank - 1))


def _reduce_axes(node: gs.Node):
    """ReduceMean axes: an attribute before opset 18, an optional constant input from 18."""
    if len(node.inputs) > 1:
        axes = _const(node.inputs[1])
        if axes is None:
            raise _Skip(f"{node.name}: ReduceMean axes are not a constant")
        return axes
    return node.attrs.get("axes")


def _check_mean(node: gs.Node, x: gs.Tensor) -> None:
    if not _is_last_axis(_reduce_axes(node), _rank(x)):
        raise _Skip(f"ReduceMean {node.name} reduces axes {_reduce_axes(node)}, not only the last axis: "
                    "the plugin normalizes the last dimension only")
    if node.attrs.get("keepdims", 1) != 1:
        raise _Skip(f"ReduceMean {node.name} has keepdims=0")


def _only_consumer(t: gs.Tensor, op: str) -> gs.Node | None:
    """The single consumer of ``t`` if it is an ``op`` node and ``t`` is used nowhere else."""
    if len(t.outputs) == 1 and t.outputs[0].op == op:
        return t.outputs[0]
    return None


def _other_input(node: gs.Node, t: gs.Tensor) -> gs.Tensor | None:
    """For a binary commutative node with ``t`` as one operand, the other operand."""
    if len(node.inputs) != 2:
        return None
    a, b = node.inputs
    return b if a is t else a if b is t else None


def _vector(value: np.ndarray | None, cols: int | None, x_rank: int | None) -> np.ndarray | None:
    """``value`` as a float32 ``[cols]`` vector if it broadcasts along the last axis only, else None."""
    if value is None or not np.issubdtype(value.dtype, np.floating):
        return None
    if value.ndim > 0 and any(d != 1 for d in value.shape[:-1]):
        return None
    if x_rank is not None and value.ndim > x_rank:
        return None
    n = value.shape[-1] if value.ndim else 1
    if cols is None:
        cols = n if n > 1 else None
    if cols is None or n not in (1, cols):
        return None
    return np.ascontiguousarray(np.broadcast_to(value.reshape(-1), (cols,)), dtype=np.float32)


def _escapes(nodes: list, keep: gs.Tensor, graph: gs.Graph) -> str | None:
    """Name of an intermediate tensor of ``nodes`` used outside them (other than ``keep``), else None."""
    inside = {id(n) for n in nodes}
    for n in nodes:
        for t in n.outputs:
            if t is keep:
                continue
            if _is_output(t, graph) or any(id(c) not in inside for c in t.outputs):
                return t.name
    return None


# ---------------------------------------------------------------------------------------------- matchers

def _match_layernormalization(node: gs.Node, graph: gs.Graph) -> _Match:
    x = node.inputs[0]
    axis = int(node.attrs.get("axis", -1))
    if not _is_last_axis([axis], _rank(x)):
        raise _Skip(f"normalizes from axis {axis}, not over the last axis only "
                    f"(input rank {_rank(x)}): the plugin normalizes the last dimension only")
    for extra in node.outputs[1:]:
        if extra.outputs or _is_output(extra, graph):
            raise _Skip(f"its {extra.name} output (Mean/InvStdDev, keepdims shape) is used")
    cols = _last_dim(x)
    gamma = _vector(_const(node.inputs[1]), cols, _rank(x))
    if gamma is None:
        raise _Skip("Scale is not a constant vector over the last axis")
    has_b = len(node.inputs) > 2 and node.inputs[2].name != ""
    beta = _vector(_const(node.inputs[2]), gamma.size, _rank(x)) if has_b else np.zeros_like(gamma)
    if beta is None:
        raise _Skip("B is not a constant vector over the last axis")
    return _Match("LayerNormalization", [node], x, node.outputs[0], gamma, beta,
                  float(node.attrs.get("epsilon", 1e-5)))


def _match_decomposed(sub: gs.Node, graph: gs.Graph) -> _Match | None:
    """None when ``sub`` is not ``Sub(x, ReduceMean(x))``; _Skip when it starts a pattern that fails."""
    if len(sub.inputs) != 2:
        return None
    x, mean = sub.inputs
    rm1 = _producer(mean)
    if rm1 is None or rm1.op != "ReduceMean" or rm1.inputs[0] is not x:
        return None
    _check_mean(rm1, x)
    d = sub.outputs[0]
    nodes = [rm1, sub]

    # var = ReduceMean(d * d), squared as Pow(d, 2) or Mul(d, d)
    sq = next((c for c in d.outputs if
               (c.op == "Pow" and c.inputs[0] is d and _const(c.inputs[1]) is not None
                and np.all(_const(c.inputs[1]) == 2))
               or (c.op == "Mul" and len(c.inputs) == 2 and c.inputs[0] is d and c.inputs[1] is d)), None)
    if sq is None:
        raise _Skip("x - mean is not squared (Pow(d, 2) or Mul(d, d))")
    rm2 = _only_consumer(sq.outputs[0], "ReduceMean")
    if rm2 is None:
        raise _Skip("(x - mean)^2 does not feed only a ReduceMean")
    _check_mean(rm2, x)
    var = rm2.outputs[0]
    nodes += [sq, rm2]

    add_eps = _only_consumer(var, "Add")
    if add_eps is None:
        if _only_consumer(var, "Sqrt") is not None:
            raise _Skip("epsilon is added after Sqrt (x-mean)/(sqrt(var)+eps), not LayerNorm's 1/sqrt(var+eps)")
        raise _Skip("variance is not followed by Add(epsilon)")
    eps = _const(_other_input(add_eps, var))
    if eps is None or eps.size != 1:
        raise _Skip("epsilon is not a scalar constant")
    sqrt = _only_consumer(add_eps.outputs[0], "Sqrt")
    if sqrt is None:
        raise _Skip("var + eps is not followed by Sqrt")
    std = sqrt.outputs[0]
    nodes += [add_eps, sqrt]

    norm = _only_consumer(std, "Div")
    if norm is not None:
        if norm.inputs[0] is not d:
            raise _Skip("Div does not divide x - mean by the standard deviation")
    else:
        recip = _only_consumer(std, "Reciprocal")
        norm = recip and _only_consumer(recip.outputs[0], "Mul")
        if norm is None or _other_input(norm, recip.outputs[0]) is not d:
            raise _Skip("x - mean is not divided by the standard deviation")
        nodes.append(recip)
    nodes.append(norm)
    y = norm.outputs[0]

    # Optional affine part: Mul by a constant vector, then Add a constant vector (either operand order).
    cols, rank = _last_dim(x), _rank(x)
    gamma = beta = None
    mul = _only_consumer(y, "Mul")
    if mul is not None and not _is_output(y, graph):
        gamma = _vector(_const(_other_input(mul, y)), cols, rank)
        if gamma is not None:
            nodes.append(mul)
            y = mul.outputs[0]
    add = _only_consumer(y, "Add")
    if add is not None and not _is_output(y, graph):
        beta = _vector(_const(_other_input(add, y)), cols or (gamma.size if gamma is not None else None), rank)
        if beta is not None:
            nodes.append(add)
            y = add.outputs[0]
    cols = cols or (gamma.size if gamma is not None else beta.size if beta is not None else None)
    if cols is None:
        raise _Skip("the width of the last axis is unknown (no static shape and no gamma/beta)")
    gamma = gamma if gamma is not None else np.ones(cols, np.float32)
    beta = beta if beta is not None else np.zeros(cols, np.float32)
    if gamma.size != beta.size:
        raise _Skip(f"gamma ({gamma.size}) and beta ({beta.size}) widths differ")

    leaked = _escapes(nodes, y, graph)
    if leaked:
        raise _Skip(f"intermediate {leaked} is used outside the LayerNorm")
    return _Match("decomposed", nodes, x, y, gamma, beta, float(eps.reshape(-1)[0]))


def _same_shape(a: gs.Tensor, b: gs.Tensor) -> bool:
    """True when both shapes are known and equal dim by dim (same static size or same symbol)."""
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return False
    return all(isinstance(p, (int, np.integer, str)) and p == q and p not in ("", -1)
               for p, q in zip(a.shape, b.shape))


def _match_residual(x: gs.Tensor, m: _Match, graph: gs.Graph):
    """(add_nodes, x_in, residual, bias, sum_tensor_if_used_elsewhere) or a reason string."""
    add = _producer(x)
    if add is None or add.op != "Add" or len(add.inputs) != 2:
        return "input is not an Add"
    a, b = add.inputs
    if _const(a) is not None or _const(b) is not None:
        return "the Add has a constant operand (a bias, not a residual)"
    if not (_same_shape(a, b) and _same_shape(a, x)):
        return (f"Add operands are not provably the same shape ({a.shape} + {b.shape}); "
                "the plugin adds without broadcasting")
    nodes, bias = [add], None
    for operand, other in ((a, b), (b, a)):
        p = _producer(operand)
        if p is None or p.op != "Add" or len(p.inputs) != 2 or _is_output(operand, graph):
            continue
        if len(operand.outputs) != 1:
            continue
        for t, c in ((p.inputs[0], p.inputs[1]), (p.inputs[1], p.inputs[0])):
            vec = _vector(_const(c), m.gamma.size, _rank(x))
            if vec is not None and _const(t) is None and _same_shape(t, operand):
                nodes, bias, a, b = [p, add], vec, t, other
                break
        if bias is not None:
            break
    inside = {id(n) for n in m.nodes}
    used_elsewhere = _is_output(x, graph) or any(id(c) not in inside for c in x.outputs)
    return nodes, a, b, bias, (x if used_elsewhere else None)


# ---------------------------------------------------------------------------------------------- rewrite

def _plugin_attrs(**fields) -> dict:
    return {**_COMMON_ATTRS, **fields}


def _apply(graph: gs.Graph, m: _Match, fuse_residual: bool, report: RewriteReport, index: int) -> None:
    name = f"{m.nodes[0].name or 'layernorm'}_trtfuse{index}"
    gamma = gs.Constant(f"{name}_gamma", m.gamma)
    beta = gs.Constant(f"{name}_beta", m.beta)
    residual = _match_residual(m.x, m, graph) if fuse_residual else "residual fusion is off"
    if isinstance(residual, str):
        if fuse_residual and residual != "input is not an Add":
            report.residual_not_fused.append((m.nodes[0].name, residual))
        removed, op = m.nodes, LAYERNORM
        inputs, outputs = [m.x, gamma, beta], [m.y]
        attrs = _plugin_attrs(epsilon=m.epsilon, stats_outputs=0)
    else:
        add_nodes, x_in, res, bias, sum_t = residual
        removed, op = m.nodes + add_nodes, SKIP_LAYERNORM
        inputs = [x_in, res, gamma, beta] + ([gs.Constant(f"{name}_bias", bias)] if bias is not None else [])
        outputs = [m.y] + ([sum_t] if sum_t is not None else [])
        attrs = _plugin_attrs(epsilon=m.epsilon, has_bias=int(bias is not None),
                              sum_output=int(sum_t is not None))
        report.residual_fused += 1
        report.with_bias += bias is not None
        report.with_sum_output += sum_t is not None
    # Detach the replaced nodes first so the reused output tensors get the plugin as their only producer.
    for n in removed:
        n.inputs.clear()
        n.outputs.clear()
    graph.nodes.append(gs.Node(op, name=name, attrs=attrs, inputs=inputs, outputs=outputs, domain=DOMAIN))
    report.replaced[m.pattern] += 1


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _finish(graph: gs.Graph, source: onnx.ModelProto, use_domain: bool) -> onnx.ModelProto:
    graph.cleanup(remove_unused_graph_inputs=False).toposort()
    model = gs.export_onnx(graph)
    model.ir_version = source.ir_version
    kept = [o for o in model.opset_import if o.domain != DOMAIN]
    del model.opset_import[:]
    model.opset_import.extend(kept)
    if use_domain:
        model.opset_import.append(onnx.helper.make_opsetid(DOMAIN, 1))
    return model


def check(model: onnx.ModelProto) -> None:
    """onnx.checker with full_check (strict shape inference) where the model allows it."""
    try:
        onnx.checker.check_model(model, full_check=True)
    except onnx.shape_inference.InferenceError:
        # Strict inference cannot type custom-domain ops; the structural check still runs.
        onnx.checker.check_model(model)


def _import(model: onnx.ModelProto) -> gs.Graph:
    if not isinstance(model, onnx.ModelProto):
        raise UserError(f"expected an onnx.ModelProto, got {type(model).__name__}",
                        "load the file with onnx.load first")
    try:
        # Shapes tell a residual Add from a broadcasting one; data_prop resolves Reshape targets.
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # noqa: BLE001 - inference is an aid; without it fewer residuals are provable
        inferred = model
    return gs.import_onnx(inferred)


def rewrite_layernorm(model: onnx.ModelProto, *, fuse_residual: bool = True
                      ) -> tuple[onnx.ModelProto, RewriteReport]:
    """Replace the LayerNorms of ``model`` by trtfuse plugin nodes; returns (new model, report)."""
    graph = _import(model)
    report = RewriteReport()
    for node in list(graph.toposort().nodes):
        if not node.outputs:            # already replaced as part of an earlier match
            continue
        try:
            if node.op == "LayerNormalization" and node.domain in ("", "ai.onnx", None):
                m = _match_layernormalization(node, graph)
            elif node.op == "Sub":
                m = _match_decomposed(node, graph)
                if m is None:
                    continue
            else:
                continue
            if not (np.isfinite(m.epsilon) and m.epsilon >= 0):
                raise _Skip(f"epsilon {m.epsilon} is not a finite value >= 0 (the plugin refuses it)")
            dtype = m.x.dtype
            if dtype is not None and np.dtype(dtype) not in [np.dtype(t) for t in _PLUGIN_DTYPES]:
                raise _Skip(f"input type {np.dtype(dtype)} (the plugin takes float32/float16)")
        except _Skip as why:
            report.skipped.append((node.name, str(why)))
            continue
        _apply(graph, m, fuse_residual, report, report.total)
    out = _finish(graph, model, use_domain=True)
    check(out)
    return out, report


# ---------------------------------------------------------------------------------------------- expand

def expand_plugins(model: onnx.ModelProto) -> onnx.ModelProto:
    """Plugin nodes back to standard ONNX: LayerNormalization (opset >= 17) or the decomposed form."""
    opset = _opset(model)
    graph = gs.import_onnx(model)
    for node in list(graph.nodes):
        if node.domain != DOMAIN or node.op not in PLUGIN_OPS:
            continue
        if node.attrs.get("stats_outputs", 0):
            raise UserError(f"{node.name} has stats_outputs=1", "expand_plugins expands only y (and sum)")
        eps = float(node.attrs["epsilon"])
        x, outputs, base = node.inputs[0], list(node.outputs), node.name
        new = []
        if node.op == SKIP_LAYERNORM:
            x_in, res, gamma, beta = node.inputs[:4]
            if node.attrs.get("has_bias", 0):
                biased = gs.Variable(f"{base}_biased", dtype=x_in.dtype)
                new.append(gs.Node("Add", f"{base}_bias_add", inputs=[x_in, node.inputs[4]], outputs=[biased]))
                x_in = biased
            s = outputs[1] if node.attrs.get("sum_output", 0) else gs.Variable(f"{base}_sum", dtype=x_in.dtype)
            new.append(gs.Node("Add", f"{base}_residual_add", inputs=[x_in, res], outputs=[s]))
            x = s
        else:
            gamma, beta = node.inputs[1:3]
        y = outputs[0]
        node.inputs.clear()
        node.outputs.clear()
        new += _layernorm_nodes(base, x, gamma, beta, y, eps, opset)
        graph.nodes.extend(new)
    return _finish(graph, model, use_domain=False)


def _layernorm_nodes(base, x, gamma, beta, y, eps, opset) -> list:
    if opset >= 17:
        return [gs.Node("LayerNormalization", f"{base}_ln", attrs={"axis": -1, "epsilon": eps},
                        inputs=[x, gamma, beta], outputs=[y])]
    if opset < 13:
        raise UserError(f"cannot expand for opset {opset}", "use opset 13 or newer")

    def var(suffix):
        return gs.Variable(f"{base}_{suffix}", dtype=x.dtype)

    def const(suffix, v):
        return gs.Constant(f"{base}_{suffix}", np.asarray(v, dtype=np.float32))

    mean, d, sq, v, ve, std, n, g = (var(s) for s in ("mean", "d", "sq", "var", "ve", "std", "n", "g"))
    last = {"axes": [-1], "keepdims": 1}     # opset < 17 here, so ReduceMean axes is an attribute
    return [
        gs.Node("ReduceMean", f"{base}_rm1", attrs=last, inputs=[x], outputs=[mean]),
        gs.Node("Sub", f"{base}_sub", inputs=[x, mean], outputs=[d]),
        gs.Node("Mul", f"{base}_sq", inputs=[d, d], outputs=[sq]),
        gs.Node("ReduceMean", f"{base}_rm2", attrs=last, inputs=[sq], outputs=[v]),
        gs.Node("Add", f"{base}_eps", inputs=[v, const("epsilon", eps)], outputs=[ve]),
        gs.Node("Sqrt", f"{base}_sqrt", inputs=[ve], outputs=[std]),
        gs.Node("Div", f"{base}_div", inputs=[d, std], outputs=[n]),
        gs.Node("Mul", f"{base}_gamma_mul", inputs=[n, gamma], outputs=[g]),
        gs.Node("Add", f"{base}_beta_add", inputs=[g, beta], outputs=[y]),
    ]


def count_plugin_nodes(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node if n.domain == DOMAIN)


# ---------------------------------------------------------------------------------------------- CLI

def main(argv: list[str] | None = None) -> int:
    """``python -m trtfuse.passes.layernorm_rewrite IN.onnx OUT.onnx [--no-residual]``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--no-residual", action="store_true", help="do not fold residual Adds (TrtfuseLayerNorm only)")
    args = p.parse_args(argv)
    try:
        try:
            model = onnx.load(args.input)
        except Exception as e:
            raise UserError(f"cannot read ONNX model {args.input}: {e}", "pass a valid .onnx file") from e
        out, report = rewrite_layernorm(model, fuse_residual=not args.no_residual)
        onnx.save(out, args.output, save_as_external_data=out.ByteSize() > 1_900_000_000)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
