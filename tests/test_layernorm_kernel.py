"""LayerNorm kernels through the C ABI.

CPU (CI): the wrapper's argument checks, and the C ABI's own argument checks when the kernels library is
built (they return before any CUDA call). GPU (marked ``gpu``): every path, dtype and width against a
float64 reference on fresh random inputs, NaN-poisoned outputs, misaligned pointers, the skip variant.
"""

from __future__ import annotations

import ctypes
import os

import pytest

from trtfuse.ops import layernorm as ln

COLS = [
    1,
    2,
    3,
    31,
    32,
    33,
    64,
    127,
    128,
    384,
    511,
    768,
    1000,
    1023,
    1024,
    1025,
    2048,
    4095,
    4096,
    8192,
    12289,
    32768,
    65536,
]
DTYPES = ["fp32", "fp16", "bf16"]
PATHS = ["warp", "block_registers", "block_shared", "block_uncached"]
# |y - ref| <= atol + rtol * |ref|: fp32 arithmetic, plus rounding of the output to the dtype.
TOL = {"fp32": (1e-4, 1e-4), "fp16": (4e-3, 2e-3), "bf16": (3e-2, 1.6e-2)}


# ------------------------------------------------------------------------------------------- CPU


def test_wrapper_rejects_bad_arguments():
    good = dict(
        dtype="fp16",
        rows=4,
        cols=8,
        eps=1e-5,
        algo="auto",
        tune=0,
        residual=None,
        bias=None,
        sum_out=None,
    )
    ln.check_args(**good)  # the baseline passes
    for change in (
        dict(dtype="fp64"),
        dict(rows=-1),
        dict(cols=0),
        dict(cols=(1 << 30) + 1),
        dict(eps=-1.0),
        dict(eps=float("nan")),
        dict(eps=float("inf")),
        dict(algo="fastest"),
        dict(tune=100),
        dict(tune=2048),
        dict(bias=1234),
        dict(sum_out=1234),
    ):
        with pytest.raises(ValueError):
            ln.check_args(**{**good, **change})


def test_torch_wrapper_rejects_cpu_and_bad_tensors():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="CUDA"):
        ln.layer_norm(torch.randn(4, 8))
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        ln.layer_norm(torch.randn(4, 8, dtype=torch.float64))


def _built_kernels_lib():
    from trtfuse.errors import UserError
    from trtfuse.plugin_build import library_path

    try:
        path = library_path("kernels")
    except UserError:
        pytest.skip(
            "kernels library not built (python3 -m trtfuse.plugin_build build --kernels-only)"
        )
    try:
        return ln.load_library(str(path))
    except OSError as e:  # e.g. no libcudart on this machine
        pytest.skip(f"kernels library does not load here: {e}")


def test_c_abi_rejects_bad_arguments_before_touching_the_device():
    lib = _built_kernels_lib()
    f = lib.trtfuse_layernorm_forward
    fake = 0x10000  # never dereferenced: every call below must fail validation first
    base = dict(
        dtype=1,
        rows=4,
        cols=8,
        x=fake,
        residual=None,
        bias=None,
        gamma=fake,
        beta=fake,
        eps=1e-5,
        y=fake,
        sum=None,
        mean=None,
        inv_std=None,
        algo=0,
        tune=0,
        stream=None,
    )
    cases = [
        (dict(dtype=3), -1),
        (dict(dtype=-1), -1),
        (dict(rows=-1), -2),
        (dict(cols=0), -2),
        (dict(cols=(1 << 30) + 1), -2),
        (dict(x=None), -3),
        (dict(y=None), -3),
        (dict(bias=fake), -4),
        (dict(sum=fake), -4),
        (dict(eps=-1.0), -5),
        (dict(eps=float("nan")), -5),
        (dict(eps=float("inf")), -5),
        (dict(algo=5), -6),
        (dict(algo=-1), -6),
        (dict(tune=33), -6),
        (dict(tune=1056), -6),
        (dict(x=fake + 1), -8),
        (dict(gamma=fake + 2), -8),
        (dict(mean=fake + 1), -8),
        (dict(dtype=0, y=fake + 2), -8),
    ]
    for change, expected in cases:
        a = {**base, **change}
        status = f(*a.values())
        assert status == expected, (change, status)
        assert ln.error_string(status, lib) and ln.error_string(status, lib) != "unknown status"
    # rows == 0 is a valid no-op: nothing is read, written or launched.
    assert f(*{**base, "rows": 0, "x": None, "y": None}.values()) == 0


# ------------------------------------------------------------------------------------------- GPU


@pytest.fixture(scope="module")
def torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for torch")
    return torch


def _tdtype(torch, dtype):
    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]


def _random(torch, shape, dtype, seed_gen, scale=1.0, shift=0.0):
    # Rows with their own offset and scale, so mean and variance differ per row (and are not ~0/1).
    t = torch.randn(*shape, generator=seed_gen, device="cuda", dtype=torch.float64)
    row_shift = (
        torch.randn(*shape[:-1], 1, generator=seed_gen, device="cuda", dtype=torch.float64) * 3
        + shift
    )
    row_scale = (
        torch.rand(*shape[:-1], 1, generator=seed_gen, device="cuda", dtype=torch.float64) * 2 + 0.1
    )
    return (t * row_scale * scale + row_shift).to(_tdtype(torch, dtype))


def _reference(torch, x, gamma, beta, eps, residual=None, bias=None):
    s = x.double()
    if residual is not None:
        s = s + residual.double()
        if bias is not None:
            s = s + bias.double()
    mean = s.mean(dim=-1, keepdim=True)
    var = ((s - mean) ** 2).mean(dim=-1, keepdim=True)
    inv_std = 1.0 / torch.sqrt(var + eps)
    y = (s - mean) * inv_std
    if gamma is not None:
        y = y * gamma.double()
    if beta is not None:
        y = y + beta.double()
    return y, s, mean.squeeze(-1), inv_std.squeeze(-1)


def _assert_close(torch, got, ref, dtype, what):
    atol, rtol = TOL[dtype]
    got64 = got.double()
    assert torch.isfinite(got64).all(), f"{what}: unwritten (NaN-poisoned) or non-finite elements"
    err = (got64 - ref).abs()
    bound = atol + rtol * ref.abs()
    bad = (err > bound).nonzero()
    assert bad.numel() == 0, (
        f"{what}: {bad.shape[0]} elements off, first at {bad[0].tolist()}: "
        f"got {got64[tuple(bad[0])].item()} want {ref[tuple(bad[0])].item()}"
    )
    rel = (got64 - ref).norm() / ref.norm().clamp_min(1e-30)
    assert rel < {"fp32": 1e-5, "fp16": 1e-3, "bf16": 8e-3}[dtype], f"{what}: relative error {rel}"


def _run(
    torch,
    dtype,
    rows,
    cols,
    *,
    algo="auto",
    affine=True,
    stats=True,
    skip=False,
    bias=False,
    sum_out=False,
    offset=0,
    eps=1e-5,
    seed=None,
    tune=0,
):
    """One checked launch. offset > 0 shifts every pointer by that many elements (misalignment)."""
    g = torch.Generator(device="cuda")
    g.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(4), "little"))
    td = _tdtype(torch, dtype)
    n = rows * cols

    def buf(t_dtype, count, fill=None):  # a buffer `offset` elements into a larger allocation
        b = torch.empty(count + offset, dtype=t_dtype, device="cuda")
        if fill is not None:
            b.fill_(fill)
        return b[offset:]

    x = buf(td, n)
    x.copy_(_random(torch, (rows, cols), dtype, g).reshape(-1))
    res = b_ = None
    if skip:
        res = buf(td, n)
        res.copy_(_random(torch, (rows, cols), dtype, g, scale=0.5).reshape(-1))
        if bias:
            b_ = buf(torch.float32, cols)
            b_.copy_(torch.randn(cols, generator=g, device="cuda"))
    gamma = beta = None
    if affine:
        gamma = buf(torch.float32, cols)
        gamma.copy_(torch.rand(cols, generator=g, device="cuda") * 2 - 0.5)
        beta = buf(torch.float32, cols)
        beta.copy_(torch.randn(cols, generator=g, device="cuda"))
    y = buf(td, n, float("nan"))
    s = buf(td, n, float("nan")) if sum_out else None
    mean = buf(torch.float32, rows, float("nan")) if stats else None
    inv = buf(torch.float32, rows, float("nan")) if stats else None

    def ptr(t):
        return None if t is None else t.data_ptr()

    stream = torch.cuda.current_stream().cuda_stream
    ln.layernorm_raw(
        dtype,
        rows,
        cols,
        ptr(x),
        ptr(y),
        gamma=ptr(gamma),
        beta=ptr(beta),
        residual=ptr(res),
        bias=ptr(b_),
        sum_out=ptr(s),
        mean=ptr(mean),
        inv_std=ptr(inv),
        eps=eps,
        algo=algo,
        tune=tune,
        stream=stream,
    )
    torch.cuda.synchronize()
    x2 = x.view(rows, cols)
    ref_y, ref_s, ref_m, ref_i = _reference(
        torch, x2, gamma, beta, eps, None if res is None else res.view(rows, cols), b_
    )
    what = f"{dtype} rows={rows} cols={cols} algo={algo} skip={skip} offset={offset}"
    _assert_close(torch, y.view(rows, cols), ref_y, dtype, what + " y")
    if stats:
        # mean/inv_std are float32 whatever the dtype; inv_std is relative to the spread of the row.
        assert torch.isfinite(mean).all() and torch.isfinite(inv).all(), what + ": stats unwritten"
        spread = 1.0 / ref_i
        assert ((mean.double() - ref_m).abs() <= 1e-5 * (ref_m.abs() + spread) + 1e-6).all(), (
            what + " mean"
        )
        assert ((inv.double() - ref_i).abs() <= 1e-4 * ref_i + 1e-6).all(), what + " inv_std"
    if sum_out:
        _assert_close(torch, s.view(rows, cols), ref_s, dtype, what + " sum")
    return y


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", COLS)
def test_auto_path_matches_float64_reference(torch_cuda, dtype, cols):
    for rows in (1, 37):
        _run(torch_cuda, dtype, rows, cols)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("cols", COLS)
def test_every_path_at_every_width(torch_cuda, dtype, path, cols):
    """Forced paths: each must be right wherever it applies, and must apply where it is meant to."""
    try:
        _run(torch_cuda, dtype, 19, cols, algo=path)
    except ln.LayerNormError as e:
        assert e.status == ln.ALGO_NOT_APPLICABLE, e
        limits = {
            "warp": 128,
            "block_registers": 4096,
            "block_shared": 8192,
        }  # widths each path must take
        assert cols > limits.get(path, 1 << 31), f"{path} refused cols={cols}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [8, 33, 768, 1024, 4096, 12289])
@pytest.mark.parametrize("offset", [1, 3])
def test_misaligned_pointers(torch_cuda, dtype, cols, offset):
    skip = (
        cols % 2 == 0
    )  # odd widths: plain LayerNorm; even widths: the skip variant with bias and sum
    for path in ("auto", "block_shared", "block_uncached"):
        _run(
            torch_cuda,
            dtype,
            23,
            cols,
            algo=path,
            offset=offset,
            skip=skip,
            bias=skip,
            sum_out=skip,
        )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [1, 32, 384, 768, 1000, 1024, 2048, 4096, 12289, 32768, 65536])
def test_skip_layernorm(torch_cuda, dtype, cols):
    _run(torch_cuda, dtype, 29, cols, skip=True, bias=True, sum_out=True)
    _run(torch_cuda, dtype, 29, cols, skip=True, bias=False, sum_out=False, stats=False)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_without_affine_and_other_eps(torch_cuda, dtype):
    for cols in (64, 1000, 4096):
        _run(torch_cuda, dtype, 17, cols, affine=False, eps=0.1)
        _run(torch_cuda, dtype, 17, cols, affine=False, eps=0.0)


@pytest.mark.gpu
@pytest.mark.parametrize("tune", [32, 64, 256, 512, 1024])
def test_block_register_tuning(torch_cuda, tune):
    for cols in (1024, 4096, 32768):
        _run(torch_cuda, "fp16", 21, cols, algo="block_registers", tune=tune)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "rows,cols,dtype",
    [
        (2_000_003, 32, "fp16"),
        (1_000_001, 64, "bf16"),
        (1_048_577, 384, "fp16"),
        (300_001, 1024, "fp32"),
        (49152, 4096, "fp16"),
        (3, 65536, "fp32"),
        (2, 1 << 20, "fp16"),
    ],
)
def test_many_rows_and_very_wide_rows(torch_cuda, rows, cols, dtype):
    _run(torch_cuda, dtype, rows, cols, stats=True)


@pytest.mark.gpu
def test_repeat_is_bitwise_identical(torch_cuda):
    """A race shows as run-to-run differences on the same input."""
    for path in PATHS:
        for cols in (127, 1024, 4096):
            try:
                a = _run(torch_cuda, "fp32", 513, cols, algo=path, seed=7)
            except ln.LayerNormError:
                continue
            b = _run(torch_cuda, "fp32", 513, cols, algo=path, seed=7)
            assert torch_cuda.equal(a, b), f"{path} cols={cols} differs between runs"


@pytest.mark.gpu
def test_torch_wrapper_matches_torch(torch_cuda):
    torch = torch_cuda
    x = torch.randn(2, 3, 768, device="cuda", dtype=torch.float16)
    gamma = torch.rand(768, device="cuda") + 0.5
    beta = torch.randn(768, device="cuda")
    y = ln.layer_norm(x, gamma, beta, 1e-5)
    ref = torch.nn.functional.layer_norm(x.float(), (768,), gamma, beta, 1e-5)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert (y.float() - ref).abs().max().item() < 1e-2
    _y2, s, m, i = ln.layer_norm(x, gamma, beta, residual=x, return_sum=True, return_stats=True)
    assert s.shape == x.shape and m.shape == (2, 3) and i.shape == (2, 3)
    assert torch.equal(s, (x.float() * 2).half())


@pytest.mark.gpu
def test_rows_zero_is_a_no_op(torch_cuda):
    ln.layernorm_raw("fp16", 0, 128, 0, 0)
    assert ctypes  # keep the import meaningful for the CPU-only tests
