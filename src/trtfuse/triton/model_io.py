"""The Triton model trtfuse serves: its name, its one input, its outputs, and its config.pbtxt.

One description for every path, so that they cannot drift apart: ``trtfuse triton export`` writes it
for Triton's TensorRT backend, ``trtfuse serve`` writes it for Triton's Python backend, and the harness's ``triton``
backend checks a server's model against it before a run.

The model: ``input`` [C, H, W] (INT8: pixels already quantized with the network's input scale, a
quarter of the bytes; or FP32), and two outputs: ``top_classes`` [k] INT32 (the response MLPerf logs,
ranked on the server so that k int32 per sample travel back) and the scores [classes] (FP32, or FP16
where the engine has them so). A client asks only for the outputs it reads.

config.pbtxt is made through Triton's own protobuf schema (``model_config_pb2`` from tritonclient), so
a field or value Triton does not know fails here, not in the server.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from trtfuse.errors import UserError
from trtfuse.trt_graph import TOP_CLASSES  # the engine's response output, served under the same name

# Beside config.pbtxt in an exported model's folder (written by `trtfuse triton export`, read by `trtfuse triton serve`).
PLUGIN_DIR = "plugins"          # not a number: Triton does not take it for a model version
COMMAND_FILE = "tritonserver.txt"

# Triton's data types by numpy dtype, and TensorRT's by name, for the types these models use.
TRITON_DTYPE = {np.dtype(np.int8): "INT8", np.dtype(np.float32): "FP32", np.dtype(np.float16): "FP16",
                np.dtype(np.int32): "INT32"}
NUMPY_DTYPE = {v: k for k, v in TRITON_DTYPE.items()}
TENSORRT_DTYPE = {"INT8": "INT8", "FLOAT": "FP32", "HALF": "FP16", "INT32": "INT32"}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str               # Triton's name: INT8, FP32, FP16, INT32
    dims: tuple[int, ...]    # without the batch dimension

    @property
    def numpy_dtype(self) -> np.dtype:
        return NUMPY_DTYPE[self.dtype]


@dataclass(frozen=True)
class TritonModel:
    name: str
    max_batch_size: int
    input: TensorSpec
    outputs: tuple[TensorSpec, ...]  # top_classes first

    @property
    def top_classes(self) -> TensorSpec:
        return next(o for o in self.outputs if o.name == TOP_CLASSES)

    @property
    def top_k(self) -> int:
        return self.top_classes.dims[0]


def _schema():
    """Triton's model configuration schema, as tritonclient ships it."""
    try:
        from tritonclient.grpc import model_config_pb2
    except ImportError as e:
        raise UserError("tritonclient is not installed (Triton's model configuration schema comes with it)",
                        'pip install "trtfuse[triton]" (or: pip install "tritonclient[grpc]")') from e
    return model_config_pb2


def triton_model(prepared, input_dtype: str, max_batch_size: int, top_k: int = 5,
                 scores_dtype: str = "FP32", name: str | None = None) -> TritonModel:
    """The Triton model for a prepared model (``trtfuse.models.PreparedModel``) served with this
    input type, batch limit and ranking depth."""
    if input_dtype not in ("INT8", "FP32"):
        raise UserError(f"a trtfuse Triton model takes INT8 or FP32 images, not {input_dtype}",
                        "build the engine with --input-format int8 or float")
    if top_k < 1:
        raise UserError("the engine has no top_classes output (built with top_k=0)",
                        "rebuild it with trtfuse build (top-5 by default): Triton serves the ranked classes")
    if max_batch_size < 1:
        raise UserError(f"max batch size {max_batch_size} is impossible", "use a batch size of 1 or more")
    return TritonModel(
        name=name or prepared.name, max_batch_size=int(max_batch_size),
        input=TensorSpec(prepared.input_name, input_dtype, tuple(int(d) for d in prepared.input_shape)),
        outputs=(TensorSpec(TOP_CLASSES, "INT32", (int(top_k),)),
                 TensorSpec(prepared.output_name, scores_dtype, (int(prepared.num_classes),))))


def model_config(model: TritonModel, *, platform: str = "", backend: str = "", gpus: list[int] | None = None,
                 instances_per_gpu: int = 1, profiles: int = 0, preferred_batch_sizes: list[int] | None = None,
                 max_queue_delay_us: int = 0):
    """``model`` as Triton's ModelConfig message (tritonclient's schema).

    ``gpus``: one instance group per GPU (KIND_GPU), else one on the CPU. ``profiles``: a TensorRT
    engine with one optimization profile per concurrent context (trtfuse builds one per stream) gets
    its instances spread over them, since a TensorRT 8 profile serves one context at a time.
    """
    pb = _schema()
    cfg = pb.ModelConfig(name=model.name, max_batch_size=model.max_batch_size)
    if platform:
        cfg.platform = platform
    if backend:
        cfg.backend = backend

    def tensor(message, spec: TensorSpec):
        message.name = spec.name
        message.data_type = pb.DataType.Value(f"TYPE_{spec.dtype}")
        message.dims.extend(spec.dims)

    tensor(cfg.input.add(), model.input)
    for out in model.outputs:
        tensor(cfg.output.add(), out)
    if gpus:
        for gpu in gpus:
            if profiles > 1:
                # One instance per profile: instance i of a GPU uses profile i (TensorRT 8: a profile
                # serves one execution context at a time).
                for p in range(instances_per_gpu):
                    group = cfg.instance_group.add(count=1, kind=pb.ModelInstanceGroup.KIND_GPU, gpus=[gpu])
                    group.profile.append(str(p % profiles))
            else:
                cfg.instance_group.add(count=instances_per_gpu, kind=pb.ModelInstanceGroup.KIND_GPU, gpus=[gpu])
    else:
        cfg.instance_group.add(count=instances_per_gpu, kind=pb.ModelInstanceGroup.KIND_CPU)
    batching = cfg.dynamic_batching
    batching.preferred_batch_size.extend(preferred_batch_sizes or [model.max_batch_size])
    batching.max_queue_delay_microseconds = int(max_queue_delay_us)
    return cfg


def config_text(cfg) -> str:
    """A ModelConfig as config.pbtxt text."""
    from google.protobuf import text_format

    return text_format.MessageToString(cfg)


def parse_config(text: str):
    """config.pbtxt text as a ModelConfig; a UserError naming the problem if Triton's schema rejects it."""
    from google.protobuf import text_format

    cfg = _schema().ModelConfig()
    try:
        text_format.Parse(text, cfg)
    except text_format.ParseError as e:
        raise UserError(f"config.pbtxt does not parse with Triton's schema: {e}",
                        "write it again with `trtfuse triton export`") from None
    return cfg


def model_from_config(cfg) -> TritonModel:
    """The TritonModel a parsed config.pbtxt (or a server's model config) describes."""
    pb = _schema()

    def spec(t) -> TensorSpec:
        return TensorSpec(t.name, pb.DataType.Name(t.data_type).removeprefix("TYPE_"), tuple(t.dims))

    if len(cfg.input) != 1:
        raise UserError(f"Triton model {cfg.name!r} has {len(cfg.input)} inputs; trtfuse's have one",
                        "serve it with `trtfuse serve` or export it with `trtfuse triton export`")
    outputs = tuple(spec(o) for o in cfg.output)
    if TOP_CLASSES not in [o.name for o in outputs]:
        raise UserError(f"Triton model {cfg.name!r} has no {TOP_CLASSES!r} output",
                        "serve it with `trtfuse serve` or export a trtfuse engine (built with its top-5 output)")
    return TritonModel(cfg.name, cfg.max_batch_size, spec(cfg.input[0]), outputs)
