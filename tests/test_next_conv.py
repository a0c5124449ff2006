"""A tail, or the stem, with the next bottleneck's conv1 chained onto it (trtfuse_next_*): both outputs against the fp32
rounding rule of the layers composed (the next conv reads the layer's int8 output), on every configuration: the
chained sm90 kernel where one is compiled and holds the layer, two launches elsewhere."""

from __future__ import annotations

import numpy as np
import pytest
from test_residual_conv import NUM_CONFIGS, POISON, Cuda, _kernels_lib, trt_benchmark
from test_stem import random_stem, stem_reference
from trtfuse.ops import residual_conv_reference as ref

# The configuration compiled with a chained next conv (plugins/conv_int8/host/config_table.h: kNextConfig)
NEXT_CONFIG = "wgw_64x256x64_s4_r2"
ERR_SCALE, ERR_CONFIG, ERR_ALIGN, ERR_NEXT = -3, -5, -6, -15

# (n, h, w, cin, cout, next_cout, proj): the tail's input n x cin x h x w (with proj = (proj_cin, stride): the block
# input's, n x proj_cin x h x w, the tail's then at ceil(h / stride) x ceil(w / stride)); the tail's output has cout
# channels, the next conv's next_cout
CASES = [
    (2, 9, 7, 64, 256, 64, None),  # layer1.1 -> layer1.2 conv1 class: M = 126, tiles straddle images, the last partial
    (2, 9, 7, 64, 256, 128, None),  # layer1.2 -> layer2.0 conv1 class: the next conv's N tile of 128
    (1, 5, 7, 40, 96, 72, None),  # channels not multiples of 32: the next conv's K 96 (padded to 128), N 72
    (4, 56, 56, 64, 256, 64, None),  # layer1 at batch 4: several tiles per block
    (2, 9, 7, 64, 256, 64, (64, 1)),  # layer1.0 (projection + tail) -> layer1.1 conv1
    (4, 56, 56, 64, 256, 64, (64, 1)),
    (2, 9, 7, 128, 512, 128, None),  # the tail's output is two N blocks: never chained, two launches
    (2, 9, 7, 64, 256, 256, None),  # the next conv wider than 128: never chained
]


def chainable(case) -> bool:
    _, _, _, _, cout, next_cout, _ = case
    return cout <= 256 and next_cout <= 128


@pytest.fixture(scope="module")
def cuda():
    return Cuda()


def run_chain(cuda, case, config, rng):
    """The tail (or projection + tail) and its next conv through forward_next; returns whether one kernel ran."""
    n, h, w, cin, cout, next_cout, proj = case
    stride = proj[1] if proj else 1
    ho, wo = -(-h // stride), -(-w // stride)
    T, N = ref.random_layer(rng, cin, cout, True), ref.random_layer(rng, cout, next_cout, True)
    N["x_scale"] = T["out_scale"]  # a Q/DQ graph reads the tail's int8 output with the scale it was quantized by
    x = rng.integers(-128, 128, size=(n, cin, ho, wo), dtype=np.int8)
    tail = (T["w"], T["w_scale"], T["bias"], T["x_scale"], T["r_scale"], T["out_scale"], True)
    if proj:
        P = ref.random_layer(rng, proj[0], cout, False)
        second = rng.integers(-128, 128, size=(n, proj[0], h, w), dtype=np.int8)
        layer = cuda.op.ProjTail(*tail, P["w"], P["w_scale"], P["bias"], P["x_scale"], P["out_scale"], stride)
        residual = ref.reference_fp32(second, P["w"], P["w_scale"], P["bias"], None, P["x_scale"], 0.0,
                                      P["out_scale"], False, stride=stride)
    else:
        second = rng.integers(-128, 128, size=(n, cout, ho, wo), dtype=np.int8)
        layer = cuda.op.ResidualConv(*tail)
        residual = second
    out_shape, next_shape = (n, -(-cout // 32), ho, wo, 32), (n, -(-next_cout // 32), ho, wo, 32)
    bufs = []
    try:
        layer.attach_next(N["w"], N["w_scale"], N["bias"], N["x_scale"], N["out_scale"], True)
        fused = layer.next_fuses(config, n, h, w)
        ws_bytes = layer.workspace_size(n, h, w) if proj else 0
        dx, ds = cuda.upload(ref.to_nc32hw32(x)), cuda.upload(ref.to_nc32hw32(second))
        do, dn = cuda.upload(np.full(out_shape, POISON, np.int8)), cuda.upload(np.full(next_shape, POISON, np.int8))
        bufs = [dx, ds, do, dn]
        ws = 0
        if proj and (ws_bytes or not fused):  # the two launches: the projection's output goes here
            bufs.append(cuda.upload(np.full(out_shape, POISON, np.int8)))
            ws = bufs[-1].value
        layer.forward_next(dx.value, ds.value, do.value, dn.value, n, h, w, ws, config)
        cuda.sync()
        got32 = cuda.download(do, np.zeros(out_shape, np.int8))
        next32 = cuda.download(dn, np.zeros(next_shape, np.int8))
    finally:
        layer.close()
        cuda.free(*bufs)
    want = ref.reference_fp32(x, T["w"], T["w_scale"], T["bias"], residual, T["x_scale"], T["r_scale"],
                              T["out_scale"], True)
    want_next = ref.reference_fp32(want, N["w"], N["w_scale"], N["bias"], None, N["x_scale"], 0.0, N["out_scale"], True)
    for name, got32, want_, c in (("tail", got32, want, cout), ("next conv", next32, want_next, next_cout)):
        assert (ref.from_nc32hw32(got32, got32.shape[1] * 32)[:, c:] == 0).all(), f"{name}: padded channels not 0"
        got = ref.from_nc32hw32(got32, c)
        mism = int((got != want_).sum())
        assert mism == 0, f"{name}: {mism} of {got.size} outputs differ from the composed rounding rule"
    return fused


def _ids(case):
    n, h, w, cin, cout, next_cout, proj = case
    return f"{n}x{cin}x{h}x{w}-{cout}-{next_cout}" + (f"_proj{proj[0]}s{proj[1]}" if proj else "")


@pytest.mark.gpu
@pytest.mark.parametrize("config", [-1] + list(range(NUM_CONFIGS)), ids=lambda c: f"cfg{c}" if c >= 0 else "auto")
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_chained_next_conv_is_exact_on_every_config(cuda, case, config):
    names = cuda.op.config_names()
    if config >= len(names):
        pytest.skip("no such configuration")
    fused = run_chain(cuda, case, config, np.random.default_rng())
    sm90a = cuda.op.config_supported(names.index(NEXT_CONFIG))
    if config >= 0:
        assert fused == (names[config] == NEXT_CONFIG and sm90a and chainable(case))
    else:  # the pick chains wherever a chained configuration can run the layer
        assert fused == (sm90a and chainable(case))


@pytest.mark.gpu
def test_attach_next_refuses_what_it_cannot_chain(cuda):
    rng = np.random.default_rng()
    T, C = ref.random_layer(rng, 64, 256), ref.random_layer(rng, 256, 64)
    conv1 = cuda.op.ResidualConv(C["w"], C["w_scale"], C["bias"], C["x_scale"], 0.0, C["out_scale"], True)
    tail = cuda.op.ResidualConv(T["w"], T["w_scale"], T["bias"], T["x_scale"], T["r_scale"], T["out_scale"], True)
    N = ref.random_layer(rng, 256, 64)
    fields = (N["w"], N["w_scale"], N["bias"], T["out_scale"], N["out_scale"])
    try:
        with pytest.raises(RuntimeError, match=r"\(-15\).*attach one next conv to a tail"):
            conv1.attach_next(*fields)  # no residual: not a tail
        with pytest.raises(RuntimeError, match=r"\(-15\)"):
            tail.forward_next(1 << 8, 1 << 8, 1 << 8, 1 << 8, 1, 8, 8)  # nothing attached yet
        tail.attach_next(*fields)
        with pytest.raises(RuntimeError, match=r"\(-15\)"):
            tail.attach_next(*fields)  # already has one
        with pytest.raises(RuntimeError, match=r"\(-6\)"):
            tail.forward_next(1 << 8, 1 << 8, 1 << 8, (1 << 8) + 4, 1, 8, 8)  # next_out not 16-byte aligned
    finally:
        conv1.close()
        tail.close()


def test_next_check_validates_without_gpu():
    _kernels_lib()
    from trtfuse.ops import residual_conv as op

    rng = np.random.default_rng(0)
    N = ref.random_layer(rng, 256, 64)
    good = (256, 64, N["w"], N["w_scale"], N["bias"], 0.02, N["out_scale"])
    assert op.check_next(*good) == 0
    assert op.check_next(*good[:5], 0.0, N["out_scale"]) == ERR_SCALE  # the tail's output scale must be > 0
    bad = N["w_scale"].copy()
    bad[3] = np.nan
    assert op.check_next(256, 64, N["w"], bad, N["bias"], 0.02, N["out_scale"]) == ERR_SCALE


@pytest.mark.tensorrt
@pytest.mark.parametrize("pair", ["layer1.0+layer1.1.conv1", "layer1.2+layer2.0.conv1"])
def test_plugin_node_with_next_fields_is_exact(cuda, pair):
    """The TrtfuseResidualConv node with next_* fields (two outputs) in a TensorRT engine, next to TensorRT's own two
    layers on the same data (`trtfuse bench layers --kind next` at batch 2): both of the plugin's outputs exact against the
    composed rounding rule, and ours through the C ABI too."""
    pytest.importorskip("tensorrt")
    bench, stream = trt_benchmark("next")
    row = bench.run_case(pair, 2, 3, stream, np.random.default_rng(), True)
    checks = {c["name"]: c["ok"] for c in row["checks"]}
    assert all(checks.values()), checks
    assert "plugin: conv1 vs rounding rule of the tail's output (exact)" in checks


# ---------------------------------------------------------------------------------------------- the stem
# The stem configurations compiled with the chained conv1 (plugins/conv_int8/host/config_table.cu: kStemConfigs), and
# the widest conv1 they chain (the stem kernel's N tile); others take two launches (the stem, then a 1x1 launch)
STEM_CHAINED_CONFIGS = ("stem_p8", "stem_p4", "stem_p2")
STEM_NEXT_MAX_COUT = 64

# (n, cin, cout, h, w, next_cout): the stem's int8 LINEAR input n x cin x h x w, its cout; the next conv's next_cout
STEM_CASES = [
    (2, 3, 64, 224, 224, 64),  # ResNet-50: the stem and layer1.0's conv1 (56 x 56 pooled)
    (1, 3, 64, 21, 48, 40),  # odd H (the bottom block's conv rows below the image); next conv 40: a padded slab
    (2, 1, 40, 16, 16, 32),  # a stem of 40 channels (its second slab padded): the next conv's K 40
    (2, 3, 24, 16, 16, 48),  # one slab: the chained conv's second k32 step runs on zero-padded weights
    (2, 3, 64, 32, 32, 96),  # a next conv wider than the stem kernel's N tile: two launches on every configuration
]


def stem_chainable(case) -> bool:
    return case[-1] <= STEM_NEXT_MAX_COUT


def run_stem_chain(cuda, case, config, rng):
    """The stem and its next conv through Stem.forward_next on poisoned outputs; returns whether one kernel ran."""
    n, cin, cout, h, w, next_cout = case
    S = random_stem(rng, cin, cout, True)
    N = ref.random_layer(rng, cout, next_cout, True)
    N["x_scale"] = S["out_scale"]  # a Q/DQ graph reads the stem's int8 output with the scale it was quantized by
    x = rng.integers(-128, 128, size=(n, cin, h, w), dtype=np.int8)
    hp, wp = cuda.op.stem_output_hw(h, w)
    out_shape, next_shape = (n, -(-cout // 32), hp, wp, 32), (n, -(-next_cout // 32), hp, wp, 32)
    layer = cuda.op.Stem(S["w"], S["w_scale"], S["bias"], S["x_scale"], S["out_scale"], True)
    bufs = []
    try:
        layer.attach_next(N["w"], N["w_scale"], N["bias"], N["x_scale"], N["out_scale"], True)
        assert layer.next_cout == next_cout
        fused = layer.next_fuses(config, n, h, w)
        dx = cuda.upload(x)  # linear NCHW, as the network's input
        do, dn = cuda.upload(np.full(out_shape, POISON, np.int8)), cuda.upload(np.full(next_shape, POISON, np.int8))
        bufs = [dx, do, dn]
        layer.forward_next(dx.value, do.value, dn.value, n, h, w, config)
        cuda.sync()
        got32 = cuda.download(do, np.zeros(out_shape, np.int8))
        next32 = cuda.download(dn, np.zeros(next_shape, np.int8))
        assert (cuda.download(dx, x) == x).all(), "the input was modified"
    finally:
        layer.close()
        cuda.free(*bufs)
    want, want64 = stem_reference(x, S, True)
    want_next = ref.reference_fp32(want, N["w"], N["w_scale"], N["bias"], None, N["x_scale"], 0.0, N["out_scale"], True)
    assert want_next.max() > 0, "the next conv's reference is all 0: the case tests nothing"
    for name, dev32, want_, c in (("stem", got32, want, cout), ("next conv", next32, want_next, next_cout)):
        assert (ref.from_nc32hw32(dev32, dev32.shape[1] * 32)[:, c:] == 0).all(), f"{name}: padded channels not 0"
        got = ref.from_nc32hw32(dev32, c)
        mism = int((got != want_).sum())
        assert mism == 0, f"{name}: {mism} of {got.size} outputs differ from the composed rounding rule"
    assert ref.count_lsb_diffs(ref.from_nc32hw32(got32, cout), want64)[1] == 0  # the stem within 1 LSB of float64
    return fused


def _stem_ids(case):
    n, cin, cout, h, w, next_cout = case
    return f"{n}x{cin}x{h}x{w}-{cout}-{next_cout}"


@pytest.mark.gpu
@pytest.mark.parametrize("config", [-1, 0, 1, 2, 3], ids=lambda c: f"cfg{c}" if c >= 0 else "auto")
@pytest.mark.parametrize("case", STEM_CASES, ids=_stem_ids)
def test_stem_with_next_conv_is_exact_on_every_config(cuda, case, config):
    """Both outputs exact on every stem configuration: stem_p8, stem_p4 and stem_p2 chain the conv1 (next cout <= 64)
    in the stem's kernel, stem_p6 (and the others with a wider conv1) runs the stem, then the conv1, as two launches;
    next_fuses says which."""
    names = cuda.op.stem_config_names()
    if config >= len(names):
        pytest.skip("no such configuration")
    if not cuda.op.config_supported(cuda.op.config_names().index(NEXT_CONFIG)):
        pytest.skip("the stem kernel needs sm_90a (an H100/H200 and the library built for 90a)")
    fused = run_stem_chain(cuda, case, config, np.random.default_rng())
    name = names[config] if config >= 0 else names[0]  # -1: the first, stem_p8
    assert fused == (name in STEM_CHAINED_CONFIGS and stem_chainable(case))


@pytest.mark.gpu
def test_a_cache_entry_picks_the_stem_band_at_its_batch(cuda, tmp_path):
    """The tuning cache's "stem" entry for this GPU and batch decides forward(-1) and forward_next(-1): stem_p2 at
    batch 1, chaining layer1.0's conv1, both outputs exact."""
    names = cuda.op.stem_config_names()
    if not cuda.op.config_supported(cuda.op.config_names().index(NEXT_CONFIG)):
        pytest.skip("the stem kernel needs sm_90a (an H100/H200 and the library built for 90a)")
    entry = {"family": "stem", "cin": 3, "cout": 64, "hw": 56 * 56, "batch": 1, "residual": 0, "stride": 2,
             "config": "stem_p2"}
    rng = np.random.default_rng()
    try:
        cuda.op.load_cache(cuda.cache_with(tmp_path, entry))
        S = random_stem(rng, 3, 64, True)
        stem = cuda.op.Stem(S["w"], S["w_scale"], S["bias"], S["x_scale"], S["out_scale"], True)
        try:
            assert names[stem.select_config(1, 224, 224)] == "stem_p2"
        finally:
            stem.close()
        assert run_stem_chain(cuda, (1, 3, 64, 224, 224, 64), -1, rng)   # one kernel: stem_p2 chains the conv1
    finally:
        cuda.op.load_cache(None)


@pytest.mark.gpu
def test_stem_next_refusals(cuda):
    rng = np.random.default_rng()
    S = random_stem(rng, 3, 64, True)
    N = ref.random_layer(rng, 64, 64)
    fields = (N["w"], N["w_scale"], N["bias"], S["out_scale"], N["out_scale"])
    stem = cuda.op.Stem(S["w"], S["w_scale"], S["bias"], S["x_scale"], S["out_scale"], True)
    try:
        with pytest.raises(RuntimeError, match=rf"\({ERR_NEXT}\)"):
            stem.forward_next(1 << 8, 1 << 8, 1 << 8, 1, 8, 16)  # nothing attached yet
        stem.attach_next(*fields)
        with pytest.raises(RuntimeError, match=rf"\({ERR_NEXT}\)"):
            stem.attach_next(*fields)  # already has one
        with pytest.raises(RuntimeError, match=rf"\({ERR_ALIGN}\)"):
            stem.forward_next(1 << 8, 1 << 8, (1 << 8) + 4, 1, 8, 16)  # next_out not 16-byte aligned
        with pytest.raises(RuntimeError, match=rf"\({ERR_CONFIG}\)"):
            stem.forward_next(1 << 8, 1 << 8, 1 << 8, 1, 8, 16, config=len(cuda.op.stem_config_names()))
        with pytest.raises(RuntimeError, match=r"next_fuses failed \(-"):  # a stem's config indexes its own
            stem.next_fuses(len(cuda.op.stem_config_names()))
    finally:
        stem.close()


@pytest.mark.tensorrt
def test_stem_plugin_node_with_next_fields_is_exact(cuda):
    """The TrtfuseResidualConv node with kernel_size 7 and next_* fields (int8 LINEAR input, two outputs) in a TensorRT
    engine, next to TensorRT's own stem and conv1 on the same data (`trtfuse bench layers --kind next` at batch 2): both of
    the plugin's outputs exact against the composed rounding rule, and ours through the C ABI too (one kernel)."""
    pytest.importorskip("tensorrt")
    bench, stream = trt_benchmark("next")
    row = bench.run_case(bench.STEM_PAIR, 2, 3, stream, np.random.default_rng(), True)
    checks = {c["name"]: c["ok"] for c in row["checks"]}
    assert all(checks.values()), checks
    assert row["kind"] == "fused-stem-conv1" and row["ours_chained"]
    assert "plugin: conv1 vs rounding rule of the stem's output (exact)" in checks
    assert "ours_separate: stem vs rounding rule (exact)" in checks
