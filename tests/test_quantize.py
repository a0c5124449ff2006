"""PTQ: calibration split, weight quantization, amax methods, Q/DQ placement, numerics in ORT."""

import numpy as np
import onnx
import pytest
from test_bn_fold import GraphBuilder, run, toy_resnet
from trtfuse.models.quantize import (
    HIST_BINS,
    TensorStats,
    amax_from_stats,
    calibrate,
    calibration_split,
    quantize,
    quantize_weights,
    top1_onnxruntime,
    weights_as_float_qdq,
)


def calib_batches(seed=0, n=4, size=16):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(8, 3, size, size)).astype(np.float32) for _ in range(n)]


@pytest.fixture(scope="module")
def toy_qdq():
    model = toy_resnet()
    stats = calibrate(model, calib_batches(), progress=False)
    return model, quantize(model, stats, "max")


def test_calibration_split_is_fixed_disjoint_and_complete():
    names = [f"img_{i:03d}.JPEG" for i in range(50)][::-1]  # given in reverse: the rule sorts names
    calib, evaluation = calibration_split(names, every=7)
    assert set(calib).isdisjoint(evaluation) and sorted(calib + evaluation) == list(range(50))
    assert sorted(names[i] for i in calib) == [f"img_{i:03d}.JPEG" for i in range(0, 50, 7)]
    assert calibration_split(names, every=7) == (calib, evaluation)


def test_weights_per_output_channel():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(6, 4, 3, 3)).astype(np.float32) * np.arange(1, 7)[:, None, None, None]
    q, scale = quantize_weights(w)
    assert q.dtype == np.int8 and scale.shape == (6,)
    assert (np.abs(q).reshape(6, -1).max(axis=1) == 127).all()  # each channel uses the full range
    np.testing.assert_allclose(scale, np.abs(w).reshape(6, -1).max(axis=1) / 127, rtol=1e-6)
    err = np.abs(q * scale[:, None, None, None] - w)
    assert (err <= scale[:, None, None, None] / 2 + 1e-7).all()


def _stats_of(values):
    a = np.abs(values)
    h, _ = np.histogram(a, bins=HIST_BINS, range=(0, a.max()))
    return TensorStats(float(a.max()), h)


def test_amax_methods_clip_outliers_but_not_plain_data():
    rng = np.random.default_rng(0)
    normal = rng.normal(size=200_000)
    with_outlier = np.concatenate([normal, [60.0]])
    s = _stats_of(with_outlier)
    assert amax_from_stats(s, "max") == pytest.approx(60.0)
    assert amax_from_stats(s, "percentile", 99.99) < 6.0
    assert 2.0 < amax_from_stats(s, "entropy") < 20.0
    uniform = _stats_of(rng.uniform(-1, 1, 200_000))
    assert amax_from_stats(uniform, "entropy") > 0.9  # nothing to clip in a uniform distribution
    assert amax_from_stats(uniform, "percentile", 99.99) > 0.99


def test_placement(toy_qdq):
    _, result = toy_qdq
    g = result.model.graph
    producer = {o: n for n in g.node for o in n.output}
    inits = {t.name: t for t in g.initializer}
    convs = [n for n in g.node if n.op_type == "Conv"]
    assert len(convs) == 8 and result.weight_qdq == 8 and result.identity_adds == 2
    projections = []
    for conv in convs:
        assert producer[conv.input[0]].op_type == "DequantizeLinear"
        wdq = producer[conv.input[1]]
        assert wdq.op_type == "DequantizeLinear" and [a.i for a in wdq.attribute if a.name == "axis"] == [0]
        assert inits[wdq.input[0]].data_type == onnx.TensorProto.INT8
        assert not onnx.numpy_helper.to_array(inits[wdq.input[2]]).any()  # zero point 0
        # nothing between a conv and its ReLU/Add (BN folded); a Q right after a conv only where that
        # conv is a projection shortcut whose output is the quantized identity input of an Add
        for n in g.node:
            if conv.output[0] in n.input:
                assert n.op_type in ("Relu", "Add", "QuantizeLinear")
                if n.op_type == "QuantizeLinear":
                    dq = [m for m in g.node if n.output[0] in m.input]
                    readers = [m for m in g.node if dq[0].output[0] in m.input]
                    assert [m.op_type for m in readers] == ["Add"]
                    projections.append(conv)
    assert len(projections) == 1
    for add in (n for n in g.node if n.op_type == "Add"):
        kinds = sorted(producer[i].op_type for i in add.input)
        assert kinds == ["Conv", "DequantizeLinear"]  # identity branch only is quantized
    act_q = [n for n in g.node if n.op_type == "QuantizeLinear"]
    assert len(act_q) == result.activation_qdq
    for q in act_q:  # per-tensor, zero point 0, int8
        zp = onnx.numpy_helper.to_array(inits[q.input[2]])
        assert zp.dtype == np.int8 and zp.shape == () and zp == 0
    # the last block output is quantized before pooling (the fused tail needs an int8 output)
    pool = next(n for n in g.node if n.op_type == "GlobalAveragePool")
    assert producer[pool.input[0]].op_type == "DequantizeLinear"


def test_qdq_model_tracks_fp32_and_float_weight_form_is_identical(toy_qdq):
    model, result = toy_qdq
    x = calib_batches(seed=5, n=1)[0]
    ref = run(model, x)
    labels = ref.argmax(1)
    acc, got = top1_onnxruntime(result.model, x, labels, progress=False)
    assert np.abs(got - ref).max() < 0.1 * np.abs(ref).max()
    assert acc >= 0.75
    _, got2 = top1_onnxruntime(weights_as_float_qdq(result.model), x, labels, progress=False)
    np.testing.assert_array_equal(got, got2)


def test_quantize_rejects_old_opset():
    g = GraphBuilder()
    out = g.op("Relu", g.conv("input", 8, 8))
    model = g.model(out, opset=11)
    stats = calibrate(model, [np.ones((1, 8, 8, 8), np.float32)], progress=False)
    from trtfuse.errors import UserError

    with pytest.raises(UserError, match="opset"):
        quantize(model, stats, "max")
