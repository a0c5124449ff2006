"""What differs between the TensorRT versions trtfuse builds with (8.5 to 11), decided by the API each
one offers rather than by its version number.

- 8.x: networks need the EXPLICIT_BATCH flag; precisions are builder flags (FP16, INT8) over a weakly
  typed network: TensorRT picks each layer's type, the Q/DQ nodes pin the int8 ones.
- 10.x: EXPLICIT_BATCH is deprecated and ignored; STRONGLY_TYPED exists; the precision flags still do.
- 11.x: weak typing is gone: no FP16/INT8 builder flags, no calibrators, no dynamic ranges; every
  network is strongly typed (the STRONGLY_TYPED flag is kept but ignored). An explicitly quantized
  graph already states every type (Q/DQ around the int8 layers, float elsewhere), so it builds as is.
"""

from __future__ import annotations

from trtfuse.errors import UserError


def major_version(trt) -> int:
    return int(str(trt.__version__).split(".")[0])


def weakly_typed(trt) -> bool:
    """Whether this TensorRT still has precision builder flags (weak typing)."""
    return hasattr(trt.BuilderFlag, "INT8")


def network_flags(trt) -> int:
    """createNetworkV2's flags: explicit batch where it is still a flag that matters (before 10). Where
    weak typing remains (8.x, 10.x) the network stays weakly typed, as the measured 8.5 engines are;
    11 builds every network strongly typed by itself."""
    names = trt.NetworkDefinitionCreationFlag
    if major_version(trt) < 10 and hasattr(names, "EXPLICIT_BATCH"):
        return 1 << int(names.EXPLICIT_BATCH)
    return 0


def precision_flags(trt, precision: str) -> list:
    """The builder flags a weakly typed build of ``precision`` needs; none for a strongly typed one.
    A precision the network cannot say by itself on a strongly typed TensorRT is refused."""
    if not weakly_typed(trt):
        if precision == "fp16":
            raise UserError(f"TensorRT {trt.__version__} has no FP16 builder flag (weak typing is gone)",
                            "export the model in fp16, or use --precision int8 (its Q/DQ graph states every "
                            "type) or fp32")
        return []
    flags = []
    if precision in ("int8", "fp16"):
        flags.append(trt.BuilderFlag.FP16)  # layers left in float may use fp16
    if precision == "int8":
        flags.append(trt.BuilderFlag.INT8)
    return flags
