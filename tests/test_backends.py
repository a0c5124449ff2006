"""The Backend interface: onnxruntime and null backends, and the registry."""

import numpy as np
import pytest
from conftest_harness import SyntheticDataset, tensorrt_backend_usable, tiny_model
from trtfuse.backends import Backend, create_backend
from trtfuse.errors import UserError


def test_onnxruntime_computes_the_model(tmp_path):
    model = tiny_model(tmp_path)
    backend = create_backend("onnxruntime")
    assert isinstance(backend, Backend)
    backend.load(model, 8)
    x = SyntheticDataset(5).images(range(5))
    np.testing.assert_allclose(backend.infer(x), x.mean(axis=(2, 3)), rtol=1e-5)


def test_fixed_batch_model_pads_small_batches_and_rejects_large_ones(tmp_path):
    model = tiny_model(tmp_path, batch=4)
    backend = create_backend("onnxruntime")
    backend.load(model, 4)
    x = SyntheticDataset(3).images(range(3))
    assert backend.infer(x).shape == (3, 10)
    with pytest.raises(UserError, match="fixed batch of 4"):
        create_backend("onnxruntime").load(model, 16)


def test_null_backend_answers_at_once_with_the_right_shape(tmp_path):
    backend = create_backend("null")
    backend.load(tiny_model(tmp_path, background=True), 16)
    assert backend.infer(np.zeros((7, 10, 2, 2), np.float32)).shape == (7, 11)


def test_unknown_backend_is_a_user_error():
    with pytest.raises(UserError, match="unknown backend 'tensorflow'"):
        create_backend("tensorflow")


@pytest.mark.skipif(tensorrt_backend_usable(), reason="TensorRT is installed here")
def test_auto_falls_back_to_onnxruntime_with_a_note(capsys):
    with pytest.raises(UserError, match="TensorRT is not installed"):
        create_backend("tensorrt")
    backend = create_backend("auto")
    assert backend.name == "onnxruntime"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "using onnxruntime" in err
