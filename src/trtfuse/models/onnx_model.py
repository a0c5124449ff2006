"""ONNX graphs for preparation: export a torch classifier, or take a user's ONNX file as it is.

Exports use torch's TorchScript-based exporter (``dynamo=False``): it needs no extra package, and
with ``training=TrainingMode.PRESERVE`` on an eval-mode module it keeps every BatchNormalization
node (in inference mode). Its default, ``TrainingMode.EVAL``, folds BN into the convolutions,
which must not happen here: a later pass folds BN explicitly.
"""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path

import numpy as np
from trtfuse.errors import UserError
from trtfuse.models.prepared import PreprocessSpec

OPSET = 17
INPUT_NAME = "input"
OUTPUT_NAME = "logits"

# MLPerf's resnet50_v1.onnx (TensorFlow origin): 1001 classes with "background" at 0, and
# pre_process_vgg's mean subtraction without any scaling.
MLPERF_RESNET50_CLASSES = 1001
MLPERF_PREPROCESS = PreprocessSpec(mean=(123.68, 116.78, 103.94), std=(1.0, 1.0, 1.0))
IMAGENET_CLASSES = 1000


def export_torch(module, input_shape: tuple[int, int, int] = (3, 224, 224)):
    """``onnx.ModelProto`` of an image classifier: input ``input`` float32 ``[batch, C, H, W]``
    (dynamic batch), output ``logits`` ``[batch, classes]``, opset 17, BatchNormalization kept."""
    import onnx
    import torch

    module = module.eval()
    sample = torch.zeros((1, *input_shape), dtype=torch.float32)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        # The TorchScript exporter announces its deprecation and suggests do_constant_folding=False
        # for PRESERVE; neither applies to an eval-mode module.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            (sample,),
            buffer,
            dynamo=False,
            opset_version=OPSET,
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
            training=torch.onnx.TrainingMode.PRESERVE,
            do_constant_folding=True,
        )
    return fold_constants(onnx.load_from_string(buffer.getvalue()))


def fold_constants(model):
    """Evaluate every subgraph that depends on constants only (ONNX-GraphSurgeon + ONNX Runtime).

    The exporter leaves two kinds of them: shape arithmetic (EfficientNet's "SAME" padding becomes
    ConstantOfShape/Slice/Concat/... feeding each Pad) and ``Identity(initializer)`` nodes (equal
    tensors, such as a fresh BatchNorm's weight and running_var, are stored once). Folding turns
    both into initializers, so each Pad and BatchNormalization reads constants of its own. Only
    constant subgraphs are evaluated: no operator fusion, BatchNormalization stays.
    """
    import onnx_graphsurgeon as gs

    graph = gs.import_onnx(model)
    graph.fold_constants().cleanup().toposort()
    return gs.export_onnx(graph)


def load_onnx(path: str | os.PathLike):
    """Load and check a user's ONNX file, with clear errors for a missing or malformed one."""
    import onnx

    path = Path(path).expanduser()
    if not path.is_file():
        raise UserError(f"ONNX file {path} does not exist", "check the --onnx path")
    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    # protobuf's DecodeError, onnx's ValidationError, ...: all of them mean "not a usable ONNX".
    except Exception as e:
        raise UserError(
            f"{path} is not a valid ONNX model ({type(e).__name__}: {e})".split("\n")[0],
            "pass an ONNX file exported for inference",
        ) from e
    return model


def classifier_io(model) -> dict:
    """Describe an ONNX image classifier: its input, its scores output and its label convention.

    Returns ``input_name``, ``input_shape`` (C, H, W), ``output_name``, ``num_classes``,
    ``label_offset`` and ``preprocess``. The scores output is the first float output shaped
    ``[batch, 1000 or 1001]`` (an ArgMax output, integer, is skipped). 1001 classes is MLPerf's
    resnet50_v1.onnx layout (background at 0, mean subtraction only); 1000 classes is assumed to be
    a torchvision-style model (torchvision mean/std).
    """
    from onnx import TensorProto

    initializer_names = {init.name for init in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializer_names]
    if len(inputs) != 1:
        raise UserError(
            f"the ONNX model has {len(inputs)} inputs ({[i.name for i in inputs]})",
            "trtfuse runs image classifiers with a single NCHW float32 input",
        )
    image = inputs[0]
    dims = _dims(image)
    if (
        image.type.tensor_type.elem_type != TensorProto.FLOAT
        or len(dims) != 4
        or dims[1] != 3
        or not all(isinstance(d, int) for d in dims[1:])
    ):
        raise UserError(
            f"ONNX input {image.name!r} is {_describe(image)}",
            "trtfuse feeds float32 [batch, 3, H, W] (NCHW) images",
        )
    if dims[2] != dims[3]:
        raise UserError(
            f"ONNX input {image.name!r} is {_describe(image)}, not square",
            "trtfuse's preprocessing makes square centre crops",
        )

    scores = [
        o
        for o in model.graph.output
        if o.type.tensor_type.elem_type in (TensorProto.FLOAT, TensorProto.FLOAT16)
        and len(_dims(o)) == 2
        and _dims(o)[1] in (IMAGENET_CLASSES, MLPERF_RESNET50_CLASSES)
    ]
    if not scores:
        raise UserError(
            "the ONNX model has no float [batch, 1000] or [batch, 1001] output "
            f"(outputs: {', '.join(_describe(o, named=True) for o in model.graph.output)})",
            "export the classifier with its logits or probabilities as an output",
        )
    output = scores[0]
    num_classes = _dims(output)[1]
    mlperf = num_classes == MLPERF_RESNET50_CLASSES
    size = dims[2]
    spec = MLPERF_PREPROCESS if mlperf else PreprocessSpec()
    if size != spec.size:
        # Keep the reference's 87.5% crop ratio for other input sizes.
        spec = PreprocessSpec(mean=spec.mean, std=spec.std, size=size, resize=int(size / 0.875))
    return {
        "input_name": image.name,
        "input_shape": (3, size, size),
        "output_name": output.name,
        "num_classes": num_classes,
        "label_offset": 1 if mlperf else 0,
        "preprocess": spec,
    }


def _dims(value_info) -> list:
    """Dimensions: ints where fixed, the symbolic name (or None) where not."""
    return [
        d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
        for d in value_info.type.tensor_type.shape.dim
    ]


def _describe(value_info, named: bool = False) -> str:
    from onnx import TensorProto

    dtype = TensorProto.DataType.Name(value_info.type.tensor_type.elem_type).lower()
    text = f"{dtype} {[d if d is not None else '?' for d in _dims(value_info)]}"
    return f"{value_info.name} {text}" if named else text


def run_onnx(
    path: str | os.PathLike, batch: np.ndarray, output_name: str | None = None
) -> np.ndarray:
    """One ONNX Runtime (CPU) inference: convenience for tests and accuracy checks."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: batch}
    return session.run([output_name] if output_name else None, feed)[0]
