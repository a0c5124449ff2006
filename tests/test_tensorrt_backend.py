"""TensorRT backend on a GPU: the int8 engine of a toy ResNet against ONNX Runtime, plugins on vs off."""

import numpy as np
import pytest
from test_engine import model_dir  # noqa: F401 - fixture
from test_quantize import calib_batches

pytestmark = pytest.mark.tensorrt


def _run(model_dir, plugins, streams=2, cuda_graphs=True, input_format="float"):  # noqa: F811
    from trtfuse.backends.tensorrt_backend import TensorRTBackend
    from trtfuse.models import load_prepared

    backend = TensorRTBackend(precision="int8", plugins=plugins, streams=streams,
                              cuda_graphs=cuda_graphs, input_format=input_format,
                              tactic_sources="none")  # any TensorRT, the lent machine's 8.5 too
    backend.load(load_prepared(model_dir), 8)
    try:
        x = calib_batches(seed=11, n=1)[0]
        return x, [backend.infer(x) for _ in range(3)], backend.engine_throughput(8, seconds=0.2)
    finally:
        backend.close()


def test_int8_engine_matches_onnxruntime(model_dir):  # noqa: F811
    import onnx
    from trtfuse.engine import QDQ_FILE
    from trtfuse.models.quantize import top1_onnxruntime

    x, outs, sps = _run(model_dir, plugins=False)
    _, ref = top1_onnxruntime(onnx.load(model_dir / QDQ_FILE), x, np.zeros(len(x), np.int64), progress=False)
    for out in outs:  # repeated calls (plain, then CUDA graph) give the same answer
        np.testing.assert_array_equal(out, outs[0])
    assert np.abs(outs[0] - ref).max() < 0.1 * np.abs(ref).max()
    assert sps > 0


def test_plugins_compute_the_same_network(model_dir):  # noqa: F811
    from trtfuse.errors import UserError
    from trtfuse.plugin_build import library_path

    try:
        library_path("plugins")
    except UserError:
        pytest.skip("libtrtfuse_plugins.so is not built (trtfuse plugins build)")
    _, off, _ = _run(model_dir, plugins=False)
    _, on, _ = _run(model_dir, plugins=True)
    assert (off[0].argmax(1) == on[0].argmax(1)).mean() >= 0.875
    assert np.abs(off[0] - on[0]).max() < 0.05 * np.abs(off[0]).max()


def test_int8_input_and_single_stream_without_graphs(model_dir):  # noqa: F811
    _, outs, _ = _run(model_dir, plugins=False, streams=1, cuda_graphs=False, input_format="int8")
    assert outs[0].shape == (8, 10) and np.isfinite(outs[0]).all()


@pytest.mark.parametrize("input_format, serial_compute", [("float", False), ("int8", True)])
def test_rows_of_a_pinned_store_give_what_infer_gives(model_dir, input_format, serial_compute,  # noqa: F811
                                                      monkeypatch):
    # The serving path: samples converted once (to_input) into pinned memory (host_array), batches
    # named by rows (repeats, a consecutive run, ragged sizes padded to a graph bucket) and copied
    # row by row to the device, against infer() on the same samples gathered on the host.
    from trtfuse import cuda_runtime
    from trtfuse.backends.tensorrt_backend import TensorRTBackend
    from trtfuse.models import load_prepared

    row_copies = []
    original = cuda_runtime.copy_rows_htod_async
    monkeypatch.setattr(cuda_runtime, "copy_rows_htod_async",
                        lambda *a: (row_copies.append(len(a[1])), original(*a))[1])
    backend = TensorRTBackend(precision="int8", plugins=False, streams=2, cuda_graphs=True,
                              input_format=input_format, serial_compute=serial_compute,
                              tactic_sources="none")
    backend.load(load_prepared(model_dir), 8)
    try:
        x = np.concatenate(calib_batches(seed=12, n=2))
        samples = backend.to_input(x)
        assert samples.dtype == (np.int8 if input_format == "int8" else np.float32)
        store = backend.host_array(samples.shape, samples.dtype)
        store[:] = samples
        for rows in ([3, 4, 5, 6], [15, 0, 7, 7, 2, 9, 1, 8], [5], [10, 11, 12]):
            rows = np.array(rows)
            np.testing.assert_array_equal(backend.infer_rows(store, rows), backend.infer(x[rows]))
        assert row_copies == [4, 8, 1, 3]  # every batch took the direct path
        # A store that is not pinned memory from this backend takes the gathering path.
        np.testing.assert_array_equal(backend.infer_rows(samples.copy(), np.array([1, 2])), backend.infer(x[[1, 2]]))
        assert len(row_copies) == 4
    finally:
        backend.close()
