"""The ResNet stem (7x7/2 conv + BN + ReLU + 3x3/2 max pool) on the sm_90a kernel: exactness against the integer
reference (the rounding rule on every conv output, then the max pool of the rounded bytes).

GPU tests use the CUDA runtime through ctypes (test_residual_conv.Cuda), so they run under compute-sanitizer too:
  compute-sanitizer --tool memcheck python -m pytest -m gpu tests/test_stem.py -k small
"""

from __future__ import annotations

import numpy as np
import pytest
from test_residual_conv import POISON, Cuda, _kernels_lib, trt_benchmark
from trtfuse.ops import residual_conv_reference as ref

ERR_SHAPE, ERR_CONFIG, ERR_ALIGN, ERR_FIT, ERR_FUSED, ERR_ROW = -2, -5, -6, -9, -12, -14


def random_stem(rng, cin, cout, relu):
    """A random stem whose 7x7 weights [cout, cin, 7, 7] are a 49 cin-wide 1x1 layer's rows (output spans int8)."""
    L = ref.random_layer(rng, 49 * cin, cout, relu)
    L["w"] = np.ascontiguousarray(L["w"].reshape(cout, cin, 7, 7))
    return L


def stem_reference(x, L, relu):
    """(the rule's bytes, float64's bytes): conv -> rounding rule -> max pool, and the same from the float64 formula."""
    acc = ref.accumulate_stem(x, L["w"])
    args = (x, None, L["w_scale"], L["bias"], None, L["x_scale"], 0.0, L["out_scale"], relu)
    return (ref.maxpool3x3s2(ref.reference_fp32(*args, acc=acc)),
            ref.maxpool3x3s2(ref.reference_fp64(*args, acc=acc)))


# ---------------------------------------------------------------------------------------------- CPU
def test_stem_reference_pool_matches_a_direct_max():
    """maxpool3x3s2 against a loop over every window (padding never wins)."""
    rng = np.random.default_rng()
    q = rng.integers(-128, 128, size=(1, 2, 7, 6), dtype=np.int8)
    got = ref.maxpool3x3s2(q)
    assert got.shape == (1, 2, 4, 3)
    for y in range(4):
        for x in range(3):
            win = q[:, :, max(2 * y - 1, 0) : 2 * y + 2, max(2 * x - 1, 0) : 2 * x + 2]
            assert (got[:, :, y, x] == win.max(axis=(2, 3))).all()


def test_stem_check_without_gpu():
    op = _kernels_lib()
    rng = np.random.default_rng()
    L = random_stem(rng, 3, 64, True)
    args = [L["w"], L["w_scale"], L["bias"], 0.02, 0.04]
    assert op.check_stem(3, 64, *args) == 0
    bad_w = L["w"].copy()
    bad_w[63, 2, 6, 6] = -128  # the last weight: the check covers all 49 cin cout of them
    assert op.check_stem(3, 64, bad_w, *args[1:]) == -4
    assert op.check_stem(3, 64, L["w"], L["w_scale"], L["bias"], 0.0, 0.04) == -3
    L5 = random_stem(rng, 5, 64, True)  # 5 channels: more than one k32 step of a kernel row holds
    assert op.check_stem(5, 64, L5["w"], L5["w_scale"], L5["bias"], 0.02, 0.04) == ERR_SHAPE
    L65 = random_stem(rng, 3, 65, True)  # more output channels than the kernel's N tile
    assert op.check_stem(3, 65, L65["w"], L65["w_scale"], L65["bias"], 0.02, 0.04) == ERR_SHAPE
    assert op.stem_output_hw(224, 224) == (56, 56)
    assert op.stem_output_hw(21, 48) == (6, 12)


def test_stem_config_count_is_the_librarys():
    assert _kernels_lib().stem_config_names() == ["stem_p8", "stem_p6", "stem_p4", "stem_p2"]


# ---------------------------------------------------------------------------------------------- GPU
@pytest.fixture(scope="module")
def cuda():
    return Cuda()


def run_stem(cuda, n, cin, cout, h, w, relu, config, rng):
    """One stem on the GPU against the rule (exact) and float64 (within 1 LSB), on a poisoned output buffer."""
    L = random_stem(rng, cin, cout, relu)
    x = rng.integers(-128, 128, size=(n, cin, h, w), dtype=np.int8)
    hp, wp = cuda.op.stem_output_hw(h, w)
    poisoned = np.full((n, -(-cout // 32), hp, wp, 32), POISON, np.int8)
    dx, do = cuda.upload(x), cuda.upload(poisoned)
    layer = cuda.op.Stem(L["w"], L["w_scale"], L["bias"], L["x_scale"], L["out_scale"], relu)
    try:
        layer.forward(dx.value, do.value, n, h, w, config)
        cuda.sync()
        got32 = cuda.download(do, poisoned)
        assert (cuda.download(dx, x) == x).all(), "the input was modified"
    finally:
        layer.close()
        cuda.free(dx, do)
    assert (ref.from_nc32hw32(got32, got32.shape[1] * 32)[:, cout:] == 0).all()  # padded channels are 0
    got = ref.from_nc32hw32(got32, cout)
    want, want64 = stem_reference(x, L, relu)
    mism = int((got != want).sum())
    assert mism == 0, f"{mism} of {got.size} outputs differ from the rule + max pool"
    assert ref.count_lsb_diffs(got, want64)[1] == 0


SHAPES = [  # (n, cin, cout, h, w)
    (2, 3, 64, 224, 224),  # ResNet-50: 56 pooled rows, 7 blocks of 8 (with 6 a block: the last holds 2)
    (3, 3, 64, 32, 32),
    (1, 3, 64, 21, 48),  # odd H: conv 11 rows, pool 6; the bottom block's last conv rows lie below the image
    (2, 1, 40, 16, 16),  # one input channel; 40 outputs: two slabs, the padded channels 0
    (1, 4, 32, 30, 64),  # four channels (every lane's high registers loaded); one output slab
    (1, 3, 64, 5, 208),  # not a square; a box row of 240 bytes
    (2, 2, 64, 2, 16),  # one conv row, one pooled row
]


@pytest.mark.gpu
@pytest.mark.parametrize("relu", [True, False])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_small_auto_config(cuda, shape, relu):
    run_stem(cuda, *shape, relu, -1, np.random.default_rng())


STEM_CONFIGS = 4


@pytest.mark.gpu
@pytest.mark.parametrize("config", range(STEM_CONFIGS), ids=lambda c: f"cfg{c}")
@pytest.mark.parametrize("shape", SHAPES[:4], ids=lambda s: "x".join(map(str, s)))
def test_every_config(cuda, shape, config):
    run_stem(cuda, *shape, True, config, np.random.default_rng())


@pytest.mark.gpu
def test_batch_of_many_blocks(cuda):
    """ResNet-50 at batch 40: 280 blocks, more than the two an SM holds on 132 SMs."""
    run_stem(cuda, 40, 3, 64, 224, 224, True, -1, np.random.default_rng())


@pytest.mark.gpu
def test_refusals(cuda):
    rng = np.random.default_rng()
    L = random_stem(rng, 3, 64, True)
    layer = cuda.op.Stem(L["w"], L["w_scale"], L["bias"], L["x_scale"], L["out_scale"], True)
    buf = cuda.upload(np.zeros(3 * 64 * 264 * 4, np.int8))
    try:
        with pytest.raises(RuntimeError, match=rf"\({ERR_ROW}\).*W % 16"):  # the TMA row pitch
            layer.forward(buf.value, buf.value, 1, 8, 20)
        with pytest.raises(RuntimeError, match=rf"\({ERR_FIT}\).*wider than 224"):  # more pooled columns than 8 warps x 7
            layer.forward(buf.value, buf.value, 1, 2, 240)
        with pytest.raises(RuntimeError, match=rf"\({ERR_ALIGN}\)"):
            layer.forward(buf.value + 1, buf.value, 1, 8, 16)
        with pytest.raises(RuntimeError, match=rf"\({ERR_CONFIG}\)"):
            layer.forward(buf.value, buf.value, 1, 8, 16, config=STEM_CONFIGS)
        with pytest.raises(RuntimeError, match="trtfuse_stem_forward"):  # the 3x3 forward refuses a stem
            cuda.op._raise(
                cuda.op.library().trtfuse_conv3x3_forward(layer._h, buf.value, buf.value, 1, 8, 16, -1, None),
                "forward",
            )
    finally:
        layer.close()
        cuda.free(buf)


@pytest.mark.tensorrt
def test_plugin_node_in_a_tensorrt_engine():
    """The TrtfuseResidualConv node with kernel_size 7 in a TensorRT engine (int8 LINEAR input, as the network's),
    next to TensorRT's own stem on the same data (`trtfuse bench layers --kind stem` at batch 2): the plugin exact, TensorRT
    within 1 LSB of float64."""
    pytest.importorskip("tensorrt")
    bench, stream = trt_benchmark("stem")
    row = bench.run_case(2, 3, stream, np.random.default_rng(), True)
    names = [c["name"] for c in row["checks"] if c["ok"]]
    assert len(names) == len(row["checks"]) and "ours plugin vs rounding rule + max pool (exact)" in names
