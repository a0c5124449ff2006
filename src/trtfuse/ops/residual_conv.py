"""ctypes wrapper over the C ABI of the fused int8 residual conv (plugins/conv_int8/c_api.h).

Device memory is passed as integer pointers (torch/cupy `data_ptr()`), so this module needs neither torch
nor cupy; `check` needs no GPU at all.
"""

from __future__ import annotations

import ctypes
import functools
import os
from importlib import resources
from pathlib import Path

import numpy as np
from trtfuse.errors import UserError


TUNING_ENV = "TRTFUSE_RESIDUAL_CONV_CACHE"
SEPARATE_CONFIG = -2  # ProjTail.select_config: the tuner chose the two layers as plain launches


def use_shipped_tuning_cache() -> str | None:
    """The tile-configuration cache the kernels read: $TRTFUSE_RESIDUAL_CONV_CACHE, else (set here, before the library
    reads it) the one shipped in trtfuse/configs/residual_conv_tuning.json: the tuner's picks on the H100 and the
    H200 (benchmarks/results/residual_conv_tuning_h100.json). Without any, the kernels fall back to a heuristic that
    is up to 1.17x slower on the H100. Returns the path in effect (None: none)."""
    if not os.environ.get(TUNING_ENV):
        shipped = Path(str(resources.files("trtfuse.configs").joinpath("residual_conv_tuning.json")))
        if shipped.is_file():
            os.environ[TUNING_ENV] = str(shipped)
    return os.environ.get(TUNING_ENV) or None


@functools.cache
def library(path: str | None = None) -> ctypes.CDLL:
    from trtfuse.plugin_build import library_path

    use_shipped_tuning_cache()

    lib = ctypes.CDLL(str(path or library_path("kernels")))
    c_i8p, c_fp = ctypes.POINTER(ctypes.c_int8), ctypes.POINTER(ctypes.c_float)
    # cin, cout, weights, w_scale, bias, x_scale, r_scale, out_scale: what check and create both take
    layer = [ctypes.c_int, ctypes.c_int, c_i8p, c_fp, c_fp, ctypes.c_float, ctypes.c_float, ctypes.c_float]
    lib.trtfuse_residual_conv_check.argtypes = layer
    lib.trtfuse_residual_conv_create.argtypes = layer + [ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
    lib.trtfuse_conv1x1_create.argtypes = layer + [ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
    # the tail's fields (+ relu for create), then the projection's: proj_cin, weights, w_scale, bias, x_scale,
    # out_scale, stride
    proj = [ctypes.c_int, c_i8p, c_fp, c_fp, ctypes.c_float, ctypes.c_float, ctypes.c_int]
    lib.trtfuse_proj_tail_check.argtypes = layer + proj
    lib.trtfuse_proj_tail_create.argtypes = layer + [ctypes.c_int] + proj + [ctypes.POINTER(ctypes.c_void_p)]
    lib.trtfuse_proj_tail_forward.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 3 + [
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_void_p,
    ]
    lib.trtfuse_proj_tail_fuses.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.trtfuse_proj_tail_select_config.argtypes = [ctypes.c_void_p] + [ctypes.c_int] * 3
    lib.trtfuse_proj_tail_workspace_size.restype = ctypes.c_int64
    lib.trtfuse_proj_tail_workspace_size.argtypes = [ctypes.c_void_p] + [ctypes.c_int] * 3
    # the 3x3 conv: cin, cout, weights, w_scale, bias, x_scale, out_scale (+ relu for create), stride
    conv3 = [ctypes.c_int, ctypes.c_int, c_i8p, c_fp, c_fp, ctypes.c_float, ctypes.c_float]
    lib.trtfuse_conv3x3_check.argtypes = conv3 + [ctypes.c_int]
    lib.trtfuse_conv3x3_create.argtypes = conv3 + [ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
    lib.trtfuse_conv3x3_forward.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 4 + [ctypes.c_void_p]
    lib.trtfuse_conv3x3_select_config.argtypes = [ctypes.c_void_p] + [ctypes.c_int] * 3
    lib.trtfuse_conv3x3_config_name.restype = ctypes.c_char_p
    lib.trtfuse_conv3x3_config_name.argtypes = [ctypes.c_int]
    # the stem: cin, cout, weights, w_scale, bias, x_scale, out_scale (+ relu for create)
    lib.trtfuse_stem_check.argtypes = conv3
    lib.trtfuse_stem_create.argtypes = conv3 + [ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
    lib.trtfuse_stem_forward.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 4 + [ctypes.c_void_p]
    lib.trtfuse_stem_select_config.argtypes = [ctypes.c_void_p] + [ctypes.c_int] * 3
    lib.trtfuse_stem_config_name.restype = ctypes.c_char_p
    lib.trtfuse_stem_config_name.argtypes = [ctypes.c_int]
    # a tail's chained next conv: cin (check only), cout, weights, w_scale, bias, x_scale, out_scale (+ relu)
    nxt = [ctypes.c_int, c_i8p, c_fp, c_fp, ctypes.c_float, ctypes.c_float]
    lib.trtfuse_next_check.argtypes = [ctypes.c_int] + nxt
    lib.trtfuse_next_attach.argtypes = [ctypes.c_void_p] + nxt + [ctypes.c_int]
    lib.trtfuse_next_fuses.argtypes = [ctypes.c_void_p] + [ctypes.c_int] * 4
    lib.trtfuse_next_forward.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 3 + [
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_void_p,
    ]
    lib.trtfuse_residual_conv_destroy.argtypes = [ctypes.c_void_p]
    lib.trtfuse_residual_conv_forward.argtypes = (
        [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4 + [ctypes.c_void_p]
    )
    lib.trtfuse_residual_conv_config_name.restype = ctypes.c_char_p
    lib.trtfuse_residual_conv_config_name.argtypes = [ctypes.c_int]
    lib.trtfuse_residual_conv_select_config.argtypes = [ctypes.c_int] * 4
    lib.trtfuse_residual_conv_config_supported.argtypes = [ctypes.c_int]
    lib.trtfuse_residual_conv_config_fits.argtypes = [ctypes.c_int] * 3
    lib.trtfuse_residual_conv_load_cache.argtypes = [ctypes.c_char_p]
    lib.trtfuse_residual_conv_cache_lookup.argtypes = [ctypes.c_char_p] * 2 + [ctypes.c_int] * 7 + [
        ctypes.c_char_p, ctypes.c_int]
    lib.trtfuse_residual_conv_error_string.restype = ctypes.c_char_p
    lib.trtfuse_residual_conv_error_string.argtypes = [ctypes.c_int]
    lib.trtfuse_residual_conv_wgw_schedule.argtypes = [ctypes.c_int] * 6 + [ctypes.POINTER(ctypes.c_int)] * 2
    return lib


def _ptr(a: np.ndarray, ctype):
    return a.ctypes.data_as(ctypes.POINTER(ctype))


def _raise(status: int, what: str) -> None:
    if status != 0:
        msg = library().trtfuse_residual_conv_error_string(status).decode()
        raise RuntimeError(f"trtfuse_residual_conv_{what} failed ({status}): {msg}")


def _arrays(w, w_scale, bias) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The layer's arrays as the C ABI reads them (keep them alive during the call that gets their pointers)."""
    return (np.ascontiguousarray(w, dtype=np.int8), np.ascontiguousarray(w_scale, dtype=np.float32),
            np.ascontiguousarray(bias, dtype=np.float32))


def _fields(cin, cout, arrays, x_scale, r_scale, out_scale) -> tuple:
    """cin, cout, weights, w_scale, bias, x_scale, r_scale, out_scale: the arguments check and create share."""
    w, ws, b = arrays
    return (cin, cout, _ptr(w, ctypes.c_int8), _ptr(ws, ctypes.c_float), _ptr(b, ctypes.c_float), x_scale, r_scale,
            out_scale)


def _proj_fields(proj_arrays, proj_x_scale, proj_out_scale, proj_stride) -> tuple:
    """The projection's arguments of the proj_tail calls: proj_cin, weights, w_scale, bias, x_scale, out_scale,
    stride."""
    w, ws, b = proj_arrays
    return (w.shape[1] if w.ndim == 2 else 0, _ptr(w, ctypes.c_int8), _ptr(ws, ctypes.c_float),
            _ptr(b, ctypes.c_float), proj_x_scale, proj_out_scale, proj_stride)


def check(cin, cout, w, w_scale, bias, x_scale, r_scale, out_scale) -> int:
    """Validation of the layer fields (no GPU): 0 or the C ABI's negative status."""
    arrays = _arrays(w, w_scale, bias)
    if arrays[0].size != cin * cout or arrays[1].size != cout or arrays[2].size != cout:
        return -2
    return library().trtfuse_residual_conv_check(*_fields(cin, cout, arrays, x_scale, r_scale, out_scale))


def check_proj_tail(cin, cout, w, w_scale, bias, x_scale, r_scale, out_scale, proj_w, proj_w_scale, proj_bias,
                    proj_x_scale, proj_out_scale, proj_stride) -> int:
    """Validation of a projection + tail layer's fields (no GPU): 0 or the C ABI's negative status. The projection's
    weights are [cout][proj_cin]."""
    arrays, proj_arrays = _arrays(w, w_scale, bias), _arrays(proj_w, proj_w_scale, proj_bias)
    pw, pws, pb = proj_arrays
    if arrays[0].size != cin * cout or arrays[1].size != cout or arrays[2].size != cout:
        return -2
    if pw.ndim != 2 or pw.shape[0] != cout or pws.size != cout or pb.size != cout:
        return -2
    return library().trtfuse_proj_tail_check(
        *_fields(cin, cout, arrays, x_scale, r_scale, out_scale),
        *_proj_fields(proj_arrays, proj_x_scale, proj_out_scale, proj_stride),
    )


def num_configs() -> int:
    return library().trtfuse_residual_conv_num_configs()


def config_names() -> list[str]:
    return [library().trtfuse_residual_conv_config_name(i).decode() for i in range(num_configs())]


def config_supported(config: int) -> bool:
    """Whether `config` runs on the current device: the sm90 ("wgw_*") configurations need the library built
    for sm_90a (``plugin_build --archs ...,90a``) and a compute capability 9.0 GPU; False without a GPU."""
    return bool(library().trtfuse_residual_conv_config_supported(config))


def config_fits(config: int, cin: int, cout: int) -> bool:
    """Whether `config` can hold a layer of this shape (the sm90 "wgw_*" configurations keep a 256 x Cin weight
    slice in shared memory); no GPU needed."""
    return bool(library().trtfuse_residual_conv_config_fits(config, cin, cout))


def select_config(cin: int, cout: int, n: int, hw: int) -> int:
    return library().trtfuse_residual_conv_select_config(cin, cout, n, hw)


def wgw_schedule(m_blocks: int, n_blocks: int, resident: int, balance: bool) -> list[list[tuple[int, int]]]:
    """The wgw_* configs' tile schedule, as the kernel walks it: per block, its (M block, N block) tiles in order.
    No GPU needed (plugins/conv_int8/core/schedule_sm90.h)."""
    lib = library()
    grid = lib.trtfuse_residual_conv_wgw_schedule(m_blocks, n_blocks, resident, int(balance), -1, 0, None, None)
    _raise(min(grid, 0), "wgw_schedule")
    blocks = []
    for b in range(grid):
        cap = m_blocks * n_blocks
        ms, ns = (ctypes.c_int * cap)(), (ctypes.c_int * cap)()
        count = lib.trtfuse_residual_conv_wgw_schedule(m_blocks, n_blocks, resident, int(balance), b, cap, ms, ns)
        _raise(min(count, 0), "wgw_schedule")
        blocks.append(list(zip(ms[:count], ns[:count])))
    return blocks


def load_cache(path: str | None) -> int:
    st = library().trtfuse_residual_conv_load_cache(path.encode() if path else None)
    if st < 0:
        raise UserError(
            f"tuning cache {path} could not be read",
            "regenerate it with `python -m trtfuse.tuning`",
        )
    return st


def cache_lookup(gpu: str, family: str, cin: int, cout: int, hw: int, n: int, residual: bool = False,
                 stride: int = 1, proj_cin: int = 0) -> str | None:
    """The loaded tuning cache's configuration name for a GPU of that name, a family ("" the 1x1 conv, "conv3x3",
    "stem") and a layer at batch n (the entry of the nearest batch within a factor of 16); None if it has none.
    Needs no GPU."""
    name = ctypes.create_string_buffer(128)
    st = library().trtfuse_residual_conv_cache_lookup(gpu.encode(), family.encode(), cin, cout, hw, n, int(residual),
                                                      stride, proj_cin, name, len(name))
    if st < 0:
        raise RuntimeError(f"trtfuse_residual_conv_cache_lookup failed ({st})")
    return name.value.decode() if st > 0 else None


class _Layer:
    """A layer handle of the C ABI (any form): freed by close() or when collected."""

    _h = None

    def close(self) -> None:
        if self._h:
            _raise(library().trtfuse_residual_conv_destroy(self._h), "destroy")
            self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def check_next(cin, cout, w, w_scale, bias, x_scale, out_scale) -> int:
    """0 if a next conv with these fields (weights [cout][cin]) can be chained onto a tail or a stem of cin output
    channels, else the C ABI's error code (no GPU needed)."""
    w, ws, b = _arrays(w, w_scale, bias)
    return library().trtfuse_next_check(cin, cout, _ptr(w, ctypes.c_int8), _ptr(ws, ctypes.c_float),
                                        _ptr(b, ctypes.c_float), x_scale, out_scale)


class _Chains(_Layer):
    """A layer onto which the next 1x1 conv (the next bottleneck's conv1) may be chained, so that the layer's kernel
    also writes that conv's output from its own output tile: a tail (_Tail) or the stem (Stem). Where the chained
    kernel cannot run the configuration (next_fuses), forward_next takes two launches."""

    def attach_next(self, w, w_scale, bias, x_scale: float, out_scale: float, relu: bool = True) -> None:
        """The next 1x1 conv (stride 1, no residual): weights [next_cout][cout]; x_scale: the scale it reads this
        layer's int8 output with."""
        w, ws, b = _arrays(w, w_scale, bias)
        _raise(library().trtfuse_next_attach(self._h, w.shape[0], _ptr(w, ctypes.c_int8), _ptr(ws, ctypes.c_float),
                                             _ptr(b, ctypes.c_float), x_scale, out_scale, int(relu)), "next_attach")
        self.next_cout = w.shape[0]

    def next_fuses(self, config: int = -1, n: int = 0, h: int = 0, w: int = 0) -> bool:
        """Whether forward_next on `config` (the layer's own configuration index; -1: its pick for an n x h x w input,
        as forward_next takes them) runs one kernel on this device."""
        st = library().trtfuse_next_fuses(self._h, config, n, h, w)
        _raise(min(st, 0), "next_fuses")
        return bool(st)


class _Tail(_Chains):
    """A tail (ResidualConv with a residual, ProjTail), onto which the next bottleneck's conv1 may be chained: one
    kernel then writes both outputs where an sm90 configuration can (next_fuses), else two launches."""

    def forward_next(self, x_ptr: int, second_ptr: int, out_ptr: int, next_out_ptr: int, n: int, h: int, w: int,
                     workspace_ptr: int = 0, config: int = -1, stream: int = 0) -> None:
        """out as forward() writes it, and next_out [n, next_cout, ho, wo], the next conv of out. second: r (a tail),
        xp (a ProjTail); n, h, w and the workspace as forward()'s."""
        _raise(library().trtfuse_next_forward(self._h, x_ptr, second_ptr, out_ptr, next_out_ptr, n, h, w,
                                              workspace_ptr, config, stream), "next_forward")


class ResidualConv(_Tail):
    """One layer's packed weights on the device; forward() on kCHW32 int8 device buffers.

    r_scale 0: a layer without a residual input (a projection with relu False, a bottleneck's conv1 with relu True),
    whose forward takes r_ptr 0. stride 1 or 2: output (oh, ow) reads input (stride oh, stride ow)."""

    def __init__(
        self,
        w,
        w_scale,
        bias,
        x_scale: float,
        r_scale: float,
        out_scale: float,
        relu: bool,
        stride: int = 1,
    ):
        arrays = _arrays(w, w_scale, bias)
        self.cout, self.cin = arrays[0].shape
        h = ctypes.c_void_p()
        fields = _fields(self.cin, self.cout, arrays, x_scale, r_scale, out_scale) + (int(relu),)
        if r_scale != 0 and stride == 1:  # the residual form: the same layer as the general create makes
            _raise(library().trtfuse_residual_conv_create(*fields, ctypes.byref(h)), "create")
        else:
            _raise(library().trtfuse_conv1x1_create(*fields, int(stride), ctypes.byref(h)), "create")
        self._h = h

    def forward(
        self,
        x_ptr: int,
        r_ptr: int,
        out_ptr: int,
        n: int,
        h: int,
        w: int,
        config: int = -1,
        stream: int = 0,
    ) -> None:
        """x [n, cin, h, w], r and out [n, cout, ceil(h / stride), ceil(w / stride)]: int8 kCHW32 device pointers
        (r_ptr 0 for a layer without a residual input); config -1 = pick."""
        _raise(
            library().trtfuse_residual_conv_forward(
                self._h, x_ptr, r_ptr, out_ptr, n, h, w, config, stream
            ),
            "forward",
        )


class ProjTail(_Tail):
    """A stage's first block in one kernel: its tail (1x1 conv + BN + residual Add + ReLU, stride 1) whose residual
    is its projection (1x1 conv of the block input, stride 1 or 2, no ReLU), computed in the same kernel on the sm90
    configurations that hold both weight matrices; exactly ResidualConv(projection) then ResidualConv(tail).
    Elsewhere forward() runs the two as separate launches through a workspace (workspace_size)."""

    def __init__(self, w, w_scale, bias, x_scale: float, r_scale: float, out_scale: float, relu: bool,
                 proj_w, proj_w_scale, proj_bias, proj_x_scale: float, proj_out_scale: float, proj_stride: int):
        arrays, proj_arrays = _arrays(w, w_scale, bias), _arrays(proj_w, proj_w_scale, proj_bias)
        self.cout, self.cin = arrays[0].shape
        self.proj_cin = proj_arrays[0].shape[1]
        self.proj_stride = proj_stride
        h = ctypes.c_void_p()
        fields = (
            _fields(self.cin, self.cout, arrays, x_scale, r_scale, out_scale)
            + (int(relu),)
            + _proj_fields(proj_arrays, proj_x_scale, proj_out_scale, proj_stride)
        )
        _raise(library().trtfuse_proj_tail_create(*fields, ctypes.byref(h)), "create")
        self._h = h

    def fuses(self, config: int) -> bool:
        """Whether forward on `config` runs the fused kernel on this device (else two launches, with a workspace)."""
        return bool(library().trtfuse_proj_tail_fuses(self._h, config))

    def select_config(self, n: int, h: int, w: int) -> int:
        """The configuration forward(config=-1) picks here for a block input of n x h x w; SEPARATE_CONFIG: the
        tuner's "separate" (two plain launches)."""
        config = library().trtfuse_proj_tail_select_config(self._h, n, h, w)
        if config == -1:
            _raise(config, "select_config")
        return config

    def workspace_size(self, n: int, h: int, w: int) -> int:
        """Bytes of workspace forward(config=-1) needs for a block input of n x h x w (0 where it fuses)."""
        size = library().trtfuse_proj_tail_workspace_size(self._h, n, h, w)
        _raise(min(size, 0), "workspace_size")
        return size

    def forward(self, x_ptr: int, xp_ptr: int, out_ptr: int, n: int, h: int, w: int, workspace_ptr: int = 0,
                config: int = -1, stream: int = 0) -> None:
        """x (the tail's input) and out [n, c, ceil(h / stride), ceil(w / stride)], xp (the block input, the
        projection's) [n, proj_cin, h, w]: int8 kCHW32 device pointers; config -1 = pick."""
        _raise(
            library().trtfuse_proj_tail_forward(self._h, x_ptr, xp_ptr, out_ptr, n, h, w, workspace_ptr, config,
                                                stream),
            "forward",
        )


def check_conv3x3(cin, cout, w, w_scale, bias, x_scale, out_scale, stride=1) -> int:
    """Validation of a 3x3 conv's fields (no GPU; weights [cout][cin][3][3]): 0 or the C ABI's negative status."""
    w, ws, b = _arrays(w, w_scale, bias)
    if w.size != 9 * cin * cout or ws.size != cout or b.size != cout:
        return -2
    return library().trtfuse_conv3x3_check(cin, cout, _ptr(w, ctypes.c_int8), _ptr(ws, ctypes.c_float),
                                           _ptr(b, ctypes.c_float), x_scale, out_scale, stride)


def conv3x3_config_names() -> list[str]:
    """The halo kernel's configurations, in the order trtfuse_conv3x3_forward indexes them."""
    lib = library()
    return [lib.trtfuse_conv3x3_config_name(i).decode() for i in range(lib.trtfuse_conv3x3_num_configs())]


class Conv3x3(_Layer):
    """A 3x3 conv (padding 1, stride 1 or 2) + BN (+ReLU), no residual, on the sm_90a halo kernel: weights
    [cout][cin][3][3]; forward on kCHW32 int8 device buffers, output ceil(h / stride) x ceil(w / stride)."""

    def __init__(self, w, w_scale, bias, x_scale: float, out_scale: float, relu: bool, stride: int = 1):
        w, ws, b = _arrays(w, w_scale, bias)
        if w.ndim != 4 or w.shape[2:] != (3, 3):
            raise UserError(f"Conv3x3 takes weights [cout, cin, 3, 3], got shape {w.shape}")
        self.cout, self.cin = w.shape[:2]
        h = ctypes.c_void_p()
        _raise(
            library().trtfuse_conv3x3_create(self.cin, self.cout, _ptr(w, ctypes.c_int8), _ptr(ws, ctypes.c_float),
                                             _ptr(b, ctypes.c_float), x_scale, out_scale, int(relu), int(stride),
                                             ctypes.byref(h)),
            "create",
        )
        self._h = h

    def select_config(self, n: int, h: int, w: int) -> int:
        """The halo configuration forward(config=-1) takes for an n x h x w input on this GPU (the tuning cache's
        "conv3x3" entry, else the heuristic), -1 if none holds the layer."""
        return library().trtfuse_conv3x3_select_config(self._h, n, h, w)

    def forward(self, x_ptr: int, out_ptr: int, n: int, h: int, w: int, config: int = -1, stream: int = 0) -> None:
        """x [n, cin, h, w] -> out [n, cout, ceil(h / stride), ceil(w / stride)], int8 kCHW32 device pointers;
        config: an index of conv3x3_config_names(), -1 = pick."""
        _raise(library().trtfuse_conv3x3_forward(self._h, x_ptr, out_ptr, n, h, w, config, stream), "forward")


def check_stem(cin, cout, w, w_scale, bias, x_scale, out_scale) -> int:
    """Validation of a stem's fields (no GPU; weights [cout][cin][7][7]): 0 or the C ABI's negative status."""
    w, ws, b = _arrays(w, w_scale, bias)
    if w.size != 49 * cin * cout or ws.size != cout or b.size != cout:
        return -2
    return library().trtfuse_stem_check(cin, cout, _ptr(w, ctypes.c_int8), _ptr(ws, ctypes.c_float),
                                        _ptr(b, ctypes.c_float), x_scale, out_scale)


def stem_config_names() -> list[str]:
    """The stem kernel's configurations (pooled rows per block), in the order trtfuse_stem_forward indexes them."""
    lib = library()
    return [lib.trtfuse_stem_config_name(i).decode() for i in range(lib.trtfuse_stem_num_configs())]


def stem_output_hw(h: int, w: int) -> tuple[int, int]:
    """The stem's output size: a 7x7/2 conv (padding 3) then a 3x3/2 max pool (padding 1)."""
    hc, wc = -(-h // 2), -(-w // 2)
    return -(-hc // 2), -(-wc // 2)


class Stem(_Chains):
    """The ResNet stem on the sm_90a kernel: 7x7 conv (stride 2, padding 3) + BN (+ReLU) + 3x3 max pool (stride 2,
    padding 1); weights [cout][cin][7][7], cin <= 4, cout <= 64. forward reads the network's int8 input as linear NCHW
    (W a multiple of 16) and writes kCHW32. The next 1x1 conv (ResNet-50: layer1.0's conv1) may be chained onto it
    (attach_next): stem_p8, stem_p4 and stem_p2 compute it from the pooled output in the same kernel where its cout is
    at most 64; otherwise forward_next takes two launches."""

    def __init__(self, w, w_scale, bias, x_scale: float, out_scale: float, relu: bool = True):
        w, ws, b = _arrays(w, w_scale, bias)
        if w.ndim != 4 or w.shape[2:] != (7, 7):
            raise UserError(f"Stem takes weights [cout, cin, 7, 7], got shape {w.shape}")
        self.cout, self.cin = w.shape[:2]
        h = ctypes.c_void_p()
        _raise(
            library().trtfuse_stem_create(self.cin, self.cout, _ptr(w, ctypes.c_int8), _ptr(ws, ctypes.c_float),
                                          _ptr(b, ctypes.c_float), x_scale, out_scale, int(relu), ctypes.byref(h)),
            "create",
        )
        self._h = h

    def select_config(self, n: int, h: int, w: int) -> int:
        """The stem configuration forward(config=-1) takes for an n x h x w input on this GPU (the tuning cache's
        "stem" entry where it holds the image, else the first)."""
        return library().trtfuse_stem_select_config(self._h, n, h, w)

    def forward(self, x_ptr: int, out_ptr: int, n: int, h: int, w: int, config: int = -1, stream: int = 0) -> None:
        """x [n, cin, h, w] int8 linear -> out [n, cout, *stem_output_hw(h, w)] int8 kCHW32 (device pointers);
        config: an index of stem_config_names(), -1 = pick."""
        _raise(library().trtfuse_stem_forward(self._h, x_ptr, out_ptr, n, h, w, config, stream), "forward")

    def forward_next(self, x_ptr: int, out_ptr: int, next_out_ptr: int, n: int, h: int, w: int, config: int = -1,
                     stream: int = 0) -> None:
        """out as forward() writes it, and next_out [n, next_cout, *stem_output_hw(h, w)] int8 kCHW32, the next conv of
        out (device pointers); x, n, h, w and config as forward()'s (-1: select_config's)."""
        _raise(library().trtfuse_next_forward(self._h, x_ptr, None, out_ptr, next_out_ptr, n, h, w, None, config,
                                              stream), "next_forward")
