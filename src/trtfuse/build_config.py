"""What one TensorRT engine is built for (``BuildConfig``): precision, plugins, batch, input format, tactics. Part of
the engine cache's key; read by the graph step (trt_graph) and the build (engine).
"""

from __future__ import annotations

import dataclasses
import os

from trtfuse.errors import UserError


@dataclasses.dataclass
class BuildConfig:
    precision: str = "int8"          # int8 | fp16 | fp32
    plugins: str = "off"             # off | tails | all (config.PLUGIN_MODES; true/false accepted, see __post_init__)
    batch: int = 256                 # max (= opt) batch of the optimization profile
    min_batch: int = 1
    workspace_gb: float = 8.0
    input_format: str = "float"      # float | int8 (CHW4 int8 input: the host sends quantized pixels)
    # TensorRT's own ("default"), or "none": no cuBLAS/cuDNN tactics, for a TensorRT install without
    # those libraries; a property of the install, so its default comes from $TRTFUSE_TACTIC_SOURCES.
    tactic_sources: str = dataclasses.field(default_factory=lambda: default_tactic_sources())
    weight_dtype: str = "int32"      # how the plugin's int8 weights travel in the ONNX attribute
    profiles: int = 2                # one optimization profile per concurrent context (stream)
    top_k: int = 5                   # a TopK output (TOP_CLASSES) of this many classes; 0: scores only
    # fusion sites left to TensorRT (config.plugin_exclude: sorted site ids); only with plugins on
    plugin_exclude: tuple = ()

    def __post_init__(self):
        from trtfuse.config import plugin_exclude, plugin_mode

        self.plugins = plugin_mode(self.plugins)
        self.plugin_exclude = plugin_exclude(self.plugin_exclude) if self.plugins != "off" else ()

    def key(self) -> dict:
        """The engine cache's key; without plugin_exclude where it is empty, so that the key of every engine built
        before the field (none excluded) stays as it was."""
        key = dataclasses.asdict(self)
        if not self.plugin_exclude:
            del key["plugin_exclude"]
        else:
            key["plugin_exclude"] = list(self.plugin_exclude)
        return key


TACTIC_SOURCES = ("default", "none")


def default_tactic_sources() -> str:
    value = os.environ.get("TRTFUSE_TACTIC_SOURCES", "default")
    if value not in TACTIC_SOURCES:
        raise UserError(f"TRTFUSE_TACTIC_SOURCES={value!r} is not one of {', '.join(TACTIC_SOURCES)}",
                        "unset it (TensorRT's own tactics) or set it to none (no cuBLAS/cuDNN installed)")
    return value
