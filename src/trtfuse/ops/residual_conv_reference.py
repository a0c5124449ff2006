"""Exact reference of the fused int8 1x1 conv + BN + residual Add (+ReLU) and its rounding rule.

The rounding rule (the kernel, the TensorRT plugin and this reference all follow it). Per-channel constants,
each one fp32 operation in this order:

    inv_out = 1.0f / out_scale
    a[n]    = (x_scale * w_scale[n]) * inv_out
    b[n]    = bias[n] * inv_out
    s       = r_scale * inv_out

and per element, with acc[m, n] = sum_k int32(x[m, k]) * int32(w[n, k]) exact in int32:

    t = fma(fp32(acc), a[n], fma(fp32(r), s, b[n]))      fma: one rounding (fp32, nearest even);
                                                         fp32(acc) rounds to nearest even (exact below 2**24)
    t = min(max(t, 0 if relu else -128), 127)
    q = rint(t)                                           half to even, as ONNX QuantizeLinear

(clamping before rint equals clamping after it; max(t, 0) equals ReLU before the division by out_scale.)
`reference_fp32` reproduces that bit for bit: the kernel must match it exactly. `reference_fp64` evaluates the
same formula in float64 (the "ideal" result, what TensorRT's own int8 conv approximates in its own way): it may
differ from the rule by 1 LSB where v / out_scale lies near a .5 boundary; compare with `count_lsb_diffs`.

A layer without a residual input (r None) has a residual term of 0; with stride 2 output (oh, ow) reads input
(2 oh, 2 ow), no padding: both references take ``stride`` and apply it to x (and ``accumulate`` too, for an acc
computed once and passed to both).

Tensors are NCHW int8 here; `to_nc32hw32` / `from_nc32hw32` convert to TensorRT's kCHW32 (channels padded
to a multiple of 32 with zeros, [N][ceil(C/32)][H][W][32]).
"""

from __future__ import annotations

import numpy as np


def to_nc32hw32(a: np.ndarray) -> np.ndarray:
    """NCHW -> kCHW32 [N, ceil(C/32), H, W, 32], zero padded."""
    n, c, h, w = a.shape
    cp = -(-c // 32) * 32
    padded = np.zeros((n, cp, h, w), dtype=a.dtype)
    padded[:, :c] = a
    return np.ascontiguousarray(padded.reshape(n, cp // 32, 32, h, w).transpose(0, 1, 3, 4, 2))


def from_nc32hw32(a: np.ndarray, c: int) -> np.ndarray:
    """kCHW32 [N, C/32, H, W, 32] -> NCHW with the first c channels."""
    n, cb, h, w, _ = a.shape
    return np.ascontiguousarray(a.transpose(0, 1, 4, 2, 3).reshape(n, cb * 32, h, w)[:, :c])


def strided(x: np.ndarray, stride: int) -> np.ndarray:
    """The input positions a 1x1 conv of this stride reads (no padding)."""
    return x if stride == 1 else np.ascontiguousarray(x[:, :, ::stride, ::stride])


def accumulate(x: np.ndarray, w: np.ndarray, stride: int = 1) -> np.ndarray:
    """int32 acc [N, Cout, Ho, Wo] of x [N, Cin, H, W] int8 and w [Cout, Cin] int8 (exact)."""
    x = strided(x, stride)
    n, cin, h, wd = x.shape
    # float64 BLAS: every product and partial sum is an integer below 2**53, so the result is exact
    assert cin * 128 * 128 < 2**53
    xm = x.transpose(0, 2, 3, 1).reshape(-1, cin).astype(np.float64)
    acc = xm @ w.astype(np.float64).T
    assert np.abs(acc).max(initial=0) < 2**31
    return acc.astype(np.int32).reshape(n, h, wd, -1).transpose(0, 3, 1, 2)


def accumulate3x3(x: np.ndarray, w: np.ndarray, stride: int = 1) -> np.ndarray:
    """int32 acc [N, Cout, Ho, Wo] of a 3x3 conv with padding 1 (Ho = ceil(H / stride)): x [N, Cin, H, W] int8,
    w [Cout, Cin, 3, 3] int8, exact (each tap a 1x1 accumulate of the shifted, zero-padded input)."""
    n, cin, h, wd = x.shape
    ho, wo = -(-h // stride), -(-wd // stride)
    padded = np.zeros((n, cin, h + 2, wd + 2), np.int8)
    padded[:, :, 1:-1, 1:-1] = x
    acc = np.zeros((n, w.shape[0], ho, wo), np.int64)
    for ky in range(3):
        for kx in range(3):
            tap = np.ascontiguousarray(padded[:, :, ky : ky + stride * (ho - 1) + 1 : stride,
                                              kx : kx + stride * (wo - 1) + 1 : stride])
            acc += accumulate(tap, np.ascontiguousarray(w[:, :, ky, kx]))
    assert np.abs(acc).max(initial=0) < 2**31
    return acc.astype(np.int32)


def accumulate_stem(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """int32 acc [N, Cout, ceil(H / 2), ceil(W / 2)] of the ResNet stem's 7x7 conv, stride 2, padding 3: x
    [N, Cin, H, W] int8, w [Cout, Cin, 7, 7] int8, exact (each tap a 1x1 accumulate of the shifted, padded input)."""
    n, cin, h, wd = x.shape
    ho, wo = -(-h // 2), -(-wd // 2)
    padded = np.zeros((n, cin, h + 6, wd + 6), np.int8)
    padded[:, :, 3:-3, 3:-3] = x
    acc = np.zeros((n, w.shape[0], ho, wo), np.int64)
    for ky in range(7):
        for kx in range(7):
            tap = np.ascontiguousarray(padded[:, :, ky : ky + 2 * (ho - 1) + 1 : 2, kx : kx + 2 * (wo - 1) + 1 : 2])
            acc += accumulate(tap, np.ascontiguousarray(w[:, :, ky, kx]))
    assert np.abs(acc).max(initial=0) < 2**31
    return acc.astype(np.int32)


def maxpool3x3s2(q: np.ndarray) -> np.ndarray:
    """3x3 max pool, stride 2, padding 1 (the padding never wins), of int8 NCHW: [N, C, ceil(H / 2), ceil(W / 2)]."""
    n, c, h, w = q.shape
    ho, wo = -(-h // 2), -(-w // 2)
    padded = np.full((n, c, h + 2, w + 2), -128, np.int8)
    padded[:, :, 1:-1, 1:-1] = q
    out = np.full((n, c, ho, wo), -128, np.int8)
    for dy in range(3):
        for dx in range(3):
            out = np.maximum(out, padded[:, :, dy : dy + 2 * (ho - 1) + 1 : 2, dx : dx + 2 * (wo - 1) + 1 : 2])
    return out


def fma32(x, y, z) -> np.ndarray:
    """fp32 fused multiply-add with one rounding, exactly: x*y is exact in float64 (24 + 24 bits); the sum's
    float64 rounding error (TwoSum) settles the one case double rounding gets wrong, an fp32 midpoint."""
    x, y, z = (np.asarray(v, dtype=np.float32).astype(np.float64) for v in (x, y, z))
    p = x * y
    s = p + z
    bp = s - p
    e = (p - (s - bp)) + (z - bp)  # p + z == s + e exactly
    r = s.astype(np.float32)
    up = np.nextafter(r, np.float32(np.inf)).astype(np.float64)
    dn = np.nextafter(r, np.float32(-np.inf)).astype(np.float64)
    rr = r.astype(np.float64)
    tie = ((s == (rr + up) / 2) | (s == (rr + dn) / 2)) & (e != 0)
    if tie.any():
        nudged = np.nextafter(
            s, s + np.sign(e)
        )  # strictly off the midpoint, towards the exact value
        r = np.where(tie, nudged.astype(np.float32), r)
    return r


def constants(w_scale, bias, x_scale, r_scale, out_scale, relu):
    """(a[n], b[n], s, lo) of the rounding rule, each computed as one fp32 operation."""
    f = np.float32
    inv_out = f(1.0) / f(out_scale)
    a = ((f(x_scale) * np.asarray(w_scale, dtype=f)).astype(f) * inv_out).astype(f)
    b = (np.asarray(bias, dtype=f) * inv_out).astype(f)
    s = f(f(r_scale) * inv_out)
    return a, b, s, f(0.0 if relu else -128.0)


def reference_fp32(
    x, w, w_scale, bias, r, x_scale, r_scale, out_scale, relu, acc=None, stride=1
) -> np.ndarray:
    """The rounding rule, bit for bit (NCHW int8 in and out; r None: no residual input)."""
    acc = accumulate(x, w, stride) if acc is None else acc
    r = np.zeros(acc.shape, np.int8) if r is None else r
    a, b, s, lo = constants(w_scale, bias, x_scale, r_scale, out_scale, relu)
    inner = fma32(r.astype(np.float32), s, b[None, :, None, None])
    t = fma32(acc.astype(np.float32), a[None, :, None, None], inner)
    t = np.minimum(np.maximum(t, lo), np.float32(127))
    return np.rint(t).astype(np.int8)


def reference_fp64(
    x, w, w_scale, bias, r, x_scale, r_scale, out_scale, relu, acc=None, stride=1
) -> np.ndarray:
    """The same formula in float64 (no intermediate fp32 rounding)."""
    acc = accumulate(x, w, stride) if acc is None else acc
    r = np.zeros(acc.shape, np.int8) if r is None else r
    v = (
        acc.astype(np.float64)
        * (float(x_scale) * np.asarray(w_scale, np.float64))[None, :, None, None]
        + np.asarray(bias, np.float64)[None, :, None, None]
        + r.astype(np.float64) * float(r_scale)
    )
    if relu:
        v = np.maximum(v, 0.0)
    return np.clip(np.rint(v / float(out_scale)), -128, 127).astype(np.int8)


def count_lsb_diffs(a: np.ndarray, b: np.ndarray) -> tuple[int, int]:
    """(elements differing by exactly 1, elements differing by more than 1)."""
    d = np.abs(a.astype(np.int16) - b.astype(np.int16))
    return int((d == 1).sum()), int((d > 1).sum())


def random_layer(rng: np.random.Generator, cin: int, cout: int, relu: bool = True):
    """Weights/scales like a BN-folded, per-channel quantized conv whose output spans the int8 range."""
    w = rng.integers(-127, 128, size=(cout, cin), dtype=np.int8)
    # every row reaches +-127, so a per-channel max-abs weight quantizer (TensorRT's) recovers w_scale exactly
    w[np.arange(cout), rng.integers(0, cin, size=cout)] = rng.choice(
        np.array([-127, 127], dtype=np.int8), size=cout
    )
    x_scale = float(rng.uniform(0.01, 0.05))
    r_scale = float(rng.uniform(0.01, 0.05))
    w_scale = (rng.uniform(0.5, 2.0, size=cout) / (127 * np.sqrt(cin))).astype(np.float32)
    bias = rng.normal(0, 0.5, size=cout).astype(np.float32)
    # std of x*w sum ~ 73*73*sqrt(cin)*x_scale*w_scale ~ 0.04*73*73/127 ~ 1.7: put ~3 sigma at 127
    out_scale = float(rng.uniform(3.0, 6.0) / 127)
    return dict(
        w=w,
        w_scale=w_scale,
        bias=bias,
        x_scale=x_scale,
        r_scale=r_scale,
        out_scale=out_scale,
        relu=relu,
    )
