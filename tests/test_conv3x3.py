"""The 3x3 conv (padding 1, stride 1) + BN (+ReLU) on the sm_90a halo kernel: exactness against the integer reference.

GPU tests use the CUDA runtime through ctypes (test_residual_conv.Cuda), so they run under compute-sanitizer too:
  compute-sanitizer --tool memcheck python -m pytest -m gpu tests/test_conv3x3.py -k small
"""

from __future__ import annotations

import numpy as np
import pytest
from test_residual_conv import POISON, Cuda, _kernels_lib, trt_benchmark
from trtfuse.ops import residual_conv_reference as ref

ERR_FIT, ERR_STRIDE, ERR_FUSED = -9, -11, -12


def random_conv3x3(rng, cin, cout, relu):
    """A random layer whose 3x3 weights [cout, cin, 3, 3] are a 9 cin-wide 1x1 layer's rows (so the output spans the
    int8 range as the 1x1 tests' do)."""
    L = ref.random_layer(rng, 9 * cin, cout, relu)
    L["w"] = np.ascontiguousarray(L["w"].reshape(cout, cin, 3, 3))
    return L


# ---------------------------------------------------------------------------------------------- CPU
def test_conv3x3_check_without_gpu():
    op = _kernels_lib()
    rng = np.random.default_rng()
    L = random_conv3x3(rng, 64, 64, True)
    args = [64, 64, L["w"], L["w_scale"], L["bias"], 0.02, 0.04]
    assert op.check_conv3x3(*args) == 0
    assert op.check_conv3x3(*args, stride=2) == 0
    assert op.check_conv3x3(*args, stride=3) == ERR_STRIDE
    bad_w = L["w"].copy()
    bad_w[63, 63, 2, 2] = -128  # the last weight: the check covers all 9 cin cout of them
    assert op.check_conv3x3(64, 64, bad_w, L["w_scale"], L["bias"], 0.02, 0.04) == -4
    assert op.check_conv3x3(64, 64, L["w"], L["w_scale"], L["bias"], 0.0, 0.04) == -3
    assert op.check_conv3x3(64, 64, L["w"][:, :32], L["w_scale"], L["bias"], 0.02, 0.04) == -2  # shape mismatch
    L2 = random_conv3x3(rng, 40, 72, False)  # channels not multiples of 32: accepted (kCHW32 padding)
    assert op.check_conv3x3(40, 72, L2["w"], L2["w_scale"], L2["bias"], 0.02, 0.04) == 0


# ---------------------------------------------------------------------------------------------- GPU
@pytest.fixture(scope="module")
def cuda():
    return Cuda()


def run_conv3x3(cuda, n, cin, cout, h, w, relu, config, rng, stride=1):
    """One 3x3 layer on the GPU against the fp32 rounding rule (exact) and float64 (within 1 LSB), on a poisoned
    output buffer. Returns the number of outputs."""
    L = random_conv3x3(rng, cin, cout, relu)
    x = rng.integers(-128, 128, size=(n, cin, h, w), dtype=np.int8)
    x32 = ref.to_nc32hw32(x)
    poisoned = np.full((n, -(-cout // 32), -(-h // stride), -(-w // stride), 32), POISON, np.int8)
    dx, do = cuda.upload(x32), cuda.upload(poisoned)
    layer = cuda.op.Conv3x3(L["w"], L["w_scale"], L["bias"], L["x_scale"], L["out_scale"], relu, stride)
    try:
        layer.forward(dx.value, do.value, n, h, w, config)
        cuda.sync()
        got32 = cuda.download(do, poisoned)
        assert (cuda.download(dx, x32) == x32).all(), "the input was modified"
    finally:
        layer.close()
        cuda.free(dx, do)
    assert (ref.from_nc32hw32(got32, got32.shape[1] * 32)[:, cout:] == 0).all()  # padded channels are 0
    got = ref.from_nc32hw32(got32, cout)
    acc = ref.accumulate3x3(x, L["w"], stride)
    args = (x, None, L["w_scale"], L["bias"], None, L["x_scale"], 0.0, L["out_scale"], relu)
    want = ref.reference_fp32(*args, acc=acc)
    mism = int((got != want).sum())
    assert mism == 0, f"{mism} of {got.size} outputs differ from the fp32 rounding rule"
    assert ref.count_lsb_diffs(got, ref.reference_fp64(*args, acc=acc))[1] == 0
    return got.size


SHAPES = [  # (n, cin, cout, h, w[, stride]): h x w is the input
    (2, 64, 64, 56, 56),  # ResNet-50 layer1 conv2: 4 image rows per tile, 14 tiles per image
    (2, 128, 128, 28, 28),  # layer2 conv2
    (2, 256, 256, 14, 14),  # layer3 conv2: 4 N tiles of 64
    (3, 64, 64, 9, 7),  # one tile per image, most padded rows thrown away
    (1, 40, 72, 5, 7),  # channels not multiples of 32 (padded)
    (2, 128, 256, 13, 11),  # two N tiles of 128; H not a multiple of the tile's rows: the last one clipped
    (2, 96, 64, 10, 12),  # three input slabs: more than the weights-in-registers configuration holds (refused)
    (3, 32, 32, 1, 1),  # a 1x1 image: every tap but the center reads padding
    (2, 16, 64, 6, 5),  # Cin 16: |acc| < 2^22, the accumulators start at the magic bits (Rule.small_acc)
    (1, 64, 64, 3, 120),  # a wide image: Wp 122, two rows per 256-row tile and one per 128-row tile
    (2, 128, 128, 56, 56, 2),  # layer2.0 conv2: stride 2, four phase boxes a slab
    (3, 64, 64, 9, 7, 2),  # stride 2, odd input: the last output row and column read the bottom/right padding
    (1, 40, 72, 5, 8, 2),  # stride 2, channels not multiples of 32
    (2, 32, 64, 2, 2, 2),  # stride 2 on a 2x2 input: one output position
]


# configurations that must hold these layers (n dropped): weight slice, halo ring and staging within 227 KB
MUST_FIT = {
    ("halo_64x128_s2_b2_pp", (128, 128, 56, 56, 2)),
    ("halo_128x64_s2_b2_pp", (128, 128, 56, 56, 2)),
    ("halo_64x256_s4_b2_pp", (64, 64, 56, 56)),
    ("halo_64x128_s4_b2_pp", (64, 64, 56, 56)),
    ("halo_128x128_s3_b1_pp", (128, 128, 28, 28)),
    ("halo_64x128_s4_b2_pp", (128, 128, 28, 28)),
    ("halo_64x128_s4_b2_pp", (256, 256, 14, 14)),
    ("halo_64x128_s4_b2_pp_c3", (64, 64, 56, 56)),
    ("halo_64x256_s4_b2_wr", (64, 64, 56, 56)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("relu", [True, False])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_small_auto_config(cuda, shape, relu):
    n, cin, cout, h, w, *stride = shape
    run_conv3x3(cuda, n, cin, cout, h, w, relu, -1, np.random.default_rng(), *stride)


HALO_CONFIGS = 7  # plugins/conv_int8/host/config_table.cu's kHaloConfigs


def test_config_count_is_the_librarys():
    assert len(_kernels_lib().conv3x3_config_names()) == HALO_CONFIGS


@pytest.mark.gpu
@pytest.mark.parametrize("config", range(HALO_CONFIGS), ids=lambda c: f"cfg{c}")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_config(cuda, shape, config):
    try:
        n, cin, cout, h, w, *stride = shape
        run_conv3x3(cuda, n, cin, cout, h, w, True, config, np.random.default_rng(), *stride)
    except RuntimeError as e:
        if f"({ERR_FIT})" not in str(e):
            raise
        name = cuda.op.conv3x3_config_names()[config]
        assert (name, shape[1:]) not in MUST_FIT, f"{name} refused {shape}"
        pytest.skip(f"{name} cannot hold {shape}")


@pytest.mark.gpu
def test_batch_with_many_tiles_per_block(cuda):
    """layer1 at batch 40: 560 tiles, several per block and consumer, so the rings and staging buffers wrap."""
    run_conv3x3(cuda, 40, 64, 64, 56, 56, True, -1, np.random.default_rng())


@pytest.mark.gpu
def test_a_cache_entry_picks_the_configuration_at_its_batch(cuda, tmp_path):
    """The tuning cache's "conv3x3" entry for this GPU, layer and batch decides forward(-1), exactly; a name that is
    no configuration leaves the heuristic (the pick of an empty cache: the committed one has batch-1 entries)."""
    rng = np.random.default_rng()
    L = random_conv3x3(rng, 64, 64, True)
    layer = cuda.op.Conv3x3(L["w"], L["w_scale"], L["bias"], L["x_scale"], L["out_scale"], True)
    names = cuda.op.conv3x3_config_names()
    key = {"family": "conv3x3", "cin": 64, "cout": 64, "hw": 56 * 56, "residual": 0, "stride": 1}
    try:
        cuda.op.load_cache(cuda.cache_with(tmp_path))
        default = layer.select_config(1, 56, 56)
        other = next(n for n in ("halo_128x64_s2_b2_pp", "halo_64x128_s2_b2_pp") if names.index(n) != default)
        cuda.op.load_cache(cuda.cache_with(tmp_path, {**key, "batch": 1, "config": other}))
        assert names[layer.select_config(1, 56, 56)] == other
        run_conv3x3(cuda, 1, 64, 64, 56, 56, True, -1, rng)
        cuda.op.load_cache(cuda.cache_with(tmp_path, {**key, "batch": 1, "config": "no_such_config"}))
        assert layer.select_config(1, 56, 56) == default
    finally:
        cuda.op.load_cache(None)
        layer.close()


@pytest.mark.gpu
def test_refusals(cuda):
    rng = np.random.default_rng()
    L = random_conv3x3(rng, 64, 64, True)
    layer = cuda.op.Conv3x3(L["w"], L["w_scale"], L["bias"], L["x_scale"], L["out_scale"], True)
    buf = cuda.upload(np.zeros(2 * 64 * 300 * 4, np.int8))
    try:
        assert layer.select_config(1, 56, 56) >= 0
        with pytest.raises(RuntimeError, match=rf"\({ERR_FIT}\)"):  # too wide for any tile
            layer.forward(buf.value, buf.value, 1, 2, 300)
        with pytest.raises(RuntimeError, match=r"\(-6\)"):
            layer.forward(buf.value + 1, buf.value, 1, 8, 8)
        # layer3.0's stride-2 conv: its weight slice (147 KB) leaves no room for four-phase-box slots
        L3 = random_conv3x3(rng, 256, 256, True)
        wide = cuda.op.Conv3x3(L3["w"], L3["w_scale"], L3["bias"], L3["x_scale"], L3["out_scale"], True, 2)
        try:
            assert wide.select_config(1, 28, 28) == -1
            with pytest.raises(RuntimeError, match=rf"\({ERR_FIT}\)"):
                wide.forward(buf.value, buf.value, 1, 4, 4)
        finally:
            wide.close()
        with pytest.raises(RuntimeError, match=r"\(-5\)"):
            layer.forward(buf.value, buf.value, 1, 8, 8, config=99)
        # the 1x1 forward refuses a 3x3 layer, naming the right one
        with pytest.raises(RuntimeError, match="trtfuse_conv3x3_forward"):
            cuda.op._raise(
                cuda.op.library().trtfuse_residual_conv_forward(layer._h, buf.value, None, buf.value, 1, 8, 8, -1,
                                                                None),
                "forward",
            )
    finally:
        layer.close()
        cuda.free(buf)


@pytest.mark.tensorrt
def test_plugin_node_in_a_tensorrt_engine():
    """The TrtfuseResidualConv node with kernel_size 3 in a TensorRT engine, next to TensorRT's own 3x3 conv on the
    same int8 data (`trtfuse bench layers --kind conv3x3` at batch 2): the plugin exact, TensorRT within 1 LSB of float64."""
    pytest.importorskip("tensorrt")
    bench, stream = trt_benchmark("conv3x3")
    row = bench.run_case("layer1.conv2", 2, 3, stream, np.random.default_rng(), True)
    names = [c["name"] for c in row["checks"] if c["ok"]]
    assert len(names) == len(row["checks"]) and "ours plugin vs rounding rule (exact)" in names
