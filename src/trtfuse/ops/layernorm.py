"""ctypes wrapper over the LayerNorm C ABI (plugins/layernorm/layernorm.h), for tests and benchmarks.

Two levels:
  ``layernorm_raw(...)``   device pointers as ints (from PyTorch, CuPy or cuda-python), no framework needed;
  ``layer_norm(...)``      PyTorch CUDA tensors in, tensors out.

Both check their arguments in Python before calling the library, and the library checks them again
(negative status codes, see ``STATUS``) before it touches the device.
"""

from __future__ import annotations

import ctypes
import functools
import math

DTYPES = {"fp32": 0, "fp16": 1, "bf16": 2}
ALGOS = {"auto": 0, "warp": 1, "block_registers": 2, "block_shared": 3, "block_uncached": 4}
ELEMENT_SIZE = {"fp32": 4, "fp16": 2, "bf16": 2}
MAX_COLS = 1 << 30

# The C ABI's negative return codes (trtfuse::layernorm::Status).
STATUS = {
    -1: "bad dtype",
    -2: "bad shape",
    -3: "null pointer",
    -4: "bad combination",
    -5: "bad epsilon",
    -6: "bad algo",
    -7: "algo not applicable",
    -8: "misaligned pointer",
}
ALGO_NOT_APPLICABLE = -7


class LayerNormError(RuntimeError):
    """The library returned a non-zero status (negative: argument error; positive: cudaError_t)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"trtfuse_layernorm_forward returned {status}: {message}")
        self.status = status


@functools.lru_cache(maxsize=None)
def load_library(path: str | None = None) -> ctypes.CDLL:
    """The kernels library (``trtfuse.plugin_build.library_path('kernels')`` unless a path is given)."""
    if path is None:
        from trtfuse.plugin_build import library_path

        path = str(library_path("kernels"))
    lib = ctypes.CDLL(path)
    f = lib.trtfuse_layernorm_forward
    f.restype = ctypes.c_int
    f.argtypes = [
        ctypes.c_int,
        ctypes.c_int64,
        ctypes.c_int64,  # dtype, rows, cols
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,  # x, residual, bias
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_float,  # gamma, beta, epsilon
        ctypes.c_void_p,
        ctypes.c_void_p,  # y, sum
        ctypes.c_void_p,
        ctypes.c_void_p,  # mean, inv_std
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_void_p,  # algo, tune, stream
    ]
    lib.trtfuse_layernorm_error_string.restype = ctypes.c_char_p
    lib.trtfuse_layernorm_error_string.argtypes = [ctypes.c_int]
    return lib


def error_string(status: int, lib: ctypes.CDLL | None = None) -> str:
    lib = lib or load_library()
    return lib.trtfuse_layernorm_error_string(status).decode()


def check_args(
    dtype: str,
    rows: int,
    cols: int,
    eps: float,
    algo: str,
    tune: int,
    residual: int | None,
    bias: int | None,
    sum_out: int | None,
) -> None:
    """The Python-side checks ``layernorm_raw`` makes (ValueError), mirrored by the C ABI's own."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if algo not in ALGOS:
        raise ValueError(f"algo must be one of {sorted(ALGOS)}, got {algo!r}")
    if not (isinstance(rows, int) and rows >= 0):
        raise ValueError(f"rows must be an int >= 0, got {rows!r}")
    if not (isinstance(cols, int) and 1 <= cols <= MAX_COLS):
        raise ValueError(f"cols must be an int in [1, 2^30], got {cols!r}")
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be finite and >= 0, got {eps!r}")
    if not (isinstance(tune, int) and 0 <= tune <= 1024 and tune % 32 == 0):
        raise ValueError(f"tune must be a multiple of 32 in [0, 1024], got {tune!r}")
    if residual is None and (bias is not None or sum_out is not None):
        raise ValueError("bias and sum_out need a residual")


def layernorm_raw(
    dtype: str,
    rows: int,
    cols: int,
    x: int,
    y: int,
    *,
    gamma: int | None = None,
    beta: int | None = None,
    residual: int | None = None,
    bias: int | None = None,
    sum_out: int | None = None,
    mean: int | None = None,
    inv_std: int | None = None,
    eps: float = 1e-5,
    algo: str = "auto",
    tune: int = 0,
    stream: int = 0,
    lib: ctypes.CDLL | None = None,
) -> None:
    """Launch on device pointers (ints). gamma/beta/bias/mean/inv_std are float32; x/residual/y/sum
    are `dtype`. Raises ValueError for bad arguments, LayerNormError for a non-zero status."""
    check_args(dtype, rows, cols, eps, algo, tune, residual, bias, sum_out)
    lib = lib or load_library()
    status = lib.trtfuse_layernorm_forward(
        DTYPES[dtype],
        rows,
        cols,
        x,
        residual,
        bias,
        gamma,
        beta,
        eps,
        y,
        sum_out,
        mean,
        inv_std,
        ALGOS[algo],
        tune,
        stream,
    )
    if status != 0:
        raise LayerNormError(status, error_string(status, lib))


def _torch_dtype_name(t) -> str:
    import torch

    names = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
    if t.dtype not in names:
        raise ValueError(f"x must be float32, float16 or bfloat16, got {t.dtype}")
    return names[t.dtype]


def layer_norm(
    x,
    gamma=None,
    beta=None,
    eps: float = 1e-5,
    *,
    residual=None,
    bias=None,
    return_sum: bool = False,
    return_stats: bool = False,
    algo: str = "auto",
    tune: int = 0,
    out=None,
):
    """LayerNorm of PyTorch CUDA tensors over the last dimension (x + residual (+ bias) first when a
    residual is given). gamma/beta/bias: float32 [cols]. Returns y, or a tuple (y[, sum][, mean, inv_std])."""
    import torch

    dtype = _torch_dtype_name(x)
    if not x.is_cuda:
        raise ValueError("x must be a CUDA tensor")
    if x.dim() < 1 or x.shape[-1] < 1:
        raise ValueError(f"x must have a non-empty last dimension, got shape {tuple(x.shape)}")
    if not x.is_contiguous():
        raise ValueError("x must be contiguous")
    cols = x.shape[-1]
    rows = x.numel() // cols
    for name, p in (("gamma", gamma), ("beta", beta), ("bias", bias)):
        if p is None:
            continue
        if p.dtype != torch.float32 or not p.is_cuda or p.numel() != cols or not p.is_contiguous():
            raise ValueError(f"{name} must be a contiguous float32 CUDA tensor of {cols} values")
    if residual is not None and (
        residual.shape != x.shape
        or residual.dtype != x.dtype
        or not residual.is_contiguous()
        or not residual.is_cuda
    ):
        raise ValueError("residual must be a contiguous CUDA tensor of x's shape and dtype")
    if (bias is not None or return_sum) and residual is None:
        raise ValueError("bias and return_sum need a residual")
    y = torch.empty_like(x) if out is None else out
    if y.shape != x.shape or y.dtype != x.dtype or not y.is_contiguous():
        raise ValueError("out must be a contiguous tensor of x's shape and dtype")
    s = torch.empty_like(x) if return_sum else None
    stats_shape = x.shape[:-1]
    mean = torch.empty(stats_shape, dtype=torch.float32, device=x.device) if return_stats else None
    inv_std = (
        torch.empty(stats_shape, dtype=torch.float32, device=x.device) if return_stats else None
    )

    def ptr(t):
        return None if t is None else t.data_ptr()

    with torch.cuda.device(x.device):
        layernorm_raw(
            dtype,
            rows,
            cols,
            ptr(x),
            ptr(y),
            gamma=ptr(gamma),
            beta=ptr(beta),
            residual=ptr(residual),
            bias=ptr(bias),
            sum_out=ptr(s),
            mean=ptr(mean),
            inv_std=ptr(inv_std),
            eps=eps,
            algo=algo,
            tune=tune,
            stream=torch.cuda.current_stream(x.device).cuda_stream,
        )
    result = (y,) + ((s,) if return_sum else ()) + ((mean, inv_std) if return_stats else ())
    return result if len(result) > 1 else y
