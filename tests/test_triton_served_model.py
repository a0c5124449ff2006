"""`trtfuse serve`'s inference callable without a server: PyTriton hands it a list of requests (one
dynamic batch); it must answer each request with its own rows, dequantize int8 pixels for a float
backend exactly as the network's DequantizeLinear would, and compute the scores only when asked."""

import numpy as np
import pytest
from conftest_harness import tiny_model
from trtfuse.backends import top_k_classes
from trtfuse.backends.onnxruntime_backend import OnnxRuntimeBackend
from trtfuse.triton.model_io import triton_model
from trtfuse.triton.serve import ServedModel


class Request(dict):
    """What PyTriton passes: the inputs by name, and the outputs the client asked for."""

    def __init__(self, inputs, requested_output_names=None):
        super().__init__(inputs)
        self.requested_output_names = requested_output_names


class Recording(OnnxRuntimeBackend):
    def __init__(self):
        super().__init__()
        self.seen = []

    def infer(self, batch):
        self.seen.append(batch)
        return super().infer(batch)


@pytest.fixture
def served(tmp_path):
    model = tiny_model(tmp_path)
    backend = Recording()
    backend.load(model, 16)
    return model, backend


def test_each_request_gets_its_own_rows_and_scores_only_when_asked(served):
    model, backend = served
    spec = triton_model(model, "FP32", 16)
    callable_ = ServedModel(backend, spec, scale=None)
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, *model.input_shape)).astype(np.float32) for n in (3, 5))
    answers = callable_([Request({"input": a}, ["top_classes"]), Request({"input": b}, ["top_classes"])])
    assert [set(r) for r in answers] == [{"top_classes"}, {"top_classes"}]  # no scores computed
    for x, answer in zip((a, b), answers):
        np.testing.assert_array_equal(answer["top_classes"], top_k_classes(x.mean(axis=(2, 3)), 5))
    assert callable_.requests == 2 and callable_.samples == 8

    (both,) = callable_([Request({"input": a}, None)])  # no list: every output, as Triton means it
    np.testing.assert_allclose(both[model.output_name], a.mean(axis=(2, 3)), rtol=1e-5)
    assert both[model.output_name].dtype == np.float32 and both["top_classes"].dtype == np.int32


def test_int8_pixels_are_dequantized_for_a_float_backend(served):
    model, backend = served
    scale = 0.05
    spec = triton_model(model, "INT8", 16)
    q = np.random.default_rng(1).integers(-128, 128, (4, *model.input_shape), dtype=np.int8)
    (answer,) = ServedModel(backend, spec, scale)([Request({"input": q}, ["top_classes"])])
    np.testing.assert_array_equal(backend.seen[-1], q.astype(np.float32) * np.float32(scale))
    np.testing.assert_array_equal(answer["top_classes"],
                                  top_k_classes((q.astype(np.float32) * np.float32(scale)).mean(axis=(2, 3)), 5))
