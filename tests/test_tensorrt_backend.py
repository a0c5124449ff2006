"""TensorRT backend on a GPU: the int8 engine of a toy ResNet against ONNX Runtime, plugins on vs off,
the serving path, classify, and one engine per GPU spread as lanes (--devices)."""

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
    from trtfuse.quantize_step import QDQ_FILE
    from trtfuse.passes.quantize import top1_onnxruntime

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


@pytest.mark.parametrize("serial_compute", [True, False])
def test_a_trace_times_every_batch_between_start_and_stop(model_dir, serial_compute):  # noqa: F811
    # The serving path under a trace (gpu_trace): each batch's copy and run timed by CUDA events, the
    # answers unchanged; batches before start_trace and after stop_trace not counted.
    from concurrent.futures import ThreadPoolExecutor

    from trtfuse.backends.tensorrt_backend import TensorRTBackend
    from trtfuse.models import load_prepared

    backend = TensorRTBackend(precision="int8", plugins=False, streams=2, cuda_graphs=True,
                              input_format="int8", serial_compute=serial_compute, tactic_sources="none")
    backend.load(load_prepared(model_dir), 8)
    try:
        assert backend.stop_trace() is None  # no trace started
        x = np.concatenate(calib_batches(seed=14, n=2))
        samples = backend.to_input(x)
        store = backend.host_array(samples.shape, samples.dtype)
        store[:] = samples
        rows = [np.array(r) for r in ([3, 4, 5, 6], [15, 0, 7, 7, 2, 9, 1, 8], [5], [10, 11, 12])] * 5
        expected = [backend.classify_rows(store, r) for r in rows[:4]]  # untraced
        backend.start_trace()
        with ThreadPoolExecutor(2) as pool:
            got = list(pool.map(lambda r: backend.classify_rows(store, r), rows))
        trace = backend.stop_trace()
        backend.classify_rows(store, rows[0])  # after the stop: not counted
        for a, b in zip(got, expected * 5):
            np.testing.assert_array_equal(a, b)
        assert trace["batches"] == len(rows)
        assert 0 <= trace["first_run_start_ms"] <= trace["host_span_ms"]
        assert 0 < trace["span_ms"] <= trace["host_span_ms"]
        assert 0 < trace["busy_fraction"] <= 1
        assert 0 < trace["run_ms"]["p50"] <= trace["run_ms"]["max"] < trace["span_ms"]
        assert 0 <= trace["copy_ms"]["mean"] < trace["span_ms"]
        busy_ms = trace["busy_fraction"] * trace["span_ms"]
        if serial_compute:  # one run at a time: the busy time is the runs' sum
            assert busy_ms == pytest.approx(trace["run_ms"]["mean"] * len(rows), rel=0.01, abs=0.01)
        assert busy_ms + trace["idle_ms"] <= trace["span_ms"] + 0.01
    finally:
        backend.close()


def test_engine_alone_runs_on_the_images_it_is_given(model_dir):  # noqa: F811
    # engine_throughput(images=...): each slot's input holds the images, repeated to fill the batch (not the
    # every-byte-1 input); serial=True runs on the first slot only, leaving the others' inputs alone.
    from trtfuse import cuda_runtime
    from trtfuse.backends.tensorrt_backend import TensorRTBackend
    from trtfuse.models import load_prepared

    backend = TensorRTBackend(precision="int8", plugins=False, streams=2, cuda_graphs=True,
                              input_format="int8", tactic_sources="none")
    backend.load(load_prepared(model_dir), 8)

    def device_input(slot):
        slot.host_in.array[:] = 0
        cuda_runtime.copy_dtoh_async(slot.host_in, slot.dev_in, slot.host_in.array[:8].nbytes, slot.stream)
        slot.stream.synchronize()
        return slot.host_in.array[:8].copy()

    try:
        x = calib_batches(seed=15, n=1)[0][:3]
        want = np.resize(backend.to_input(x), (8, *x.shape[1:]))
        assert backend.engine_throughput(8, seconds=0.1) > 0
        for slot in backend.slots:
            assert (device_input(slot) == 1).all()  # the default: every byte 1
        assert backend.engine_throughput(8, seconds=0.1, images=x, serial=True) > 0
        first, second = backend.slots
        np.testing.assert_array_equal(device_input(first), want)
        assert (device_input(second) == 1).all()  # serial: the second slot never ran
        assert backend.engine_throughput(8, seconds=0.1, images=x) > 0
        for slot in backend.slots:
            np.testing.assert_array_equal(device_input(slot), want)
    finally:
        backend.close()


# -- several GPUs: one backend per device, spread as lanes --------------------------------------

_OPTIONS = {"precision": "int8", "plugins": False, "streams": 2, "cuda_graphs": True,
            "tactic_sources": "none"}


def _classify_through_a_store(backend, x, batches, threads=1):
    """Top classes of ``batches`` (lists of rows of ``x``), through the serving path: ``x`` converted
    into the backend's pinned store, each batch answered by ``classify_rows`` (on ``threads`` worker
    threads: with lanes, a thread calls whichever GPU is least busy)."""
    from concurrent.futures import ThreadPoolExecutor

    samples = backend.to_input(x)
    store = backend.host_array(samples.shape, samples.dtype)
    store[:] = samples
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda rows: backend.classify_rows(store, np.array(rows)), batches))


_BATCHES = [[3, 4, 5, 6], [15, 0, 7, 7, 2, 9, 1, 8], [5], [10, 11, 12], [0, 1, 2, 3, 4, 5, 6, 7]] * 2


def test_one_gpu_as_a_lane_answers_as_the_plain_backend(model_dir):  # noqa: F811
    from trtfuse.backends import create_backend
    from trtfuse.backends.lanes import LanesBackend
    from trtfuse.backends.tensorrt_backend import TensorRTBackend
    from trtfuse.models import load_prepared

    model = load_prepared(model_dir)
    x = np.concatenate(calib_batches(seed=13, n=2))
    plain = create_backend("tensorrt", devices="0", **_OPTIONS)
    assert type(plain) is TensorRTBackend and plain.device == 0
    lanes = LanesBackend([TensorRTBackend(device=0, **_OPTIONS)])
    plain.load(model, 8)
    lanes.load(model, 8)
    try:
        assert lanes.concurrency == plain.concurrency and lanes.max_batch == plain.max_batch
        expected = _classify_through_a_store(plain, x, _BATCHES)
        got = _classify_through_a_store(lanes, x, _BATCHES)
        for a, b in zip(got, expected):
            np.testing.assert_array_equal(a, b)
        assert lanes.lane_stats()[0]["batches"] == len(_BATCHES)
    finally:
        lanes.close()
        plain.close()


@pytest.mark.parametrize("input_format", ["float", "int8"])
def test_classify_of_a_batch_gives_what_classify_rows_gives(model_dir, input_format):  # noqa: F811
    from trtfuse.backends import top_k_classes
    from trtfuse.backends.tensorrt_backend import TensorRTBackend
    from trtfuse.models import load_prepared

    backend = TensorRTBackend(**{**_OPTIONS, "input_format": input_format})
    backend.load(load_prepared(model_dir), 8)
    try:
        assert backend.top_k >= 5  # the engine ranks on the GPU: classify takes its TopK output
        x = np.concatenate(calib_batches(seed=14, n=2))
        by_rows = _classify_through_a_store(backend, x, _BATCHES)
        for rows, expected in zip(_BATCHES, by_rows):
            top = backend.classify(x[rows])
            assert top.dtype == np.int32 and top.shape == (len(rows), 5)
            np.testing.assert_array_equal(top, expected)
            np.testing.assert_array_equal(backend.classify(x[rows], k=2), expected[:, :2])
        # More classes than the engine's TopK ranks: ranked on the host from the scores instead.
        np.testing.assert_array_equal(backend.classify(x[:8], k=10), top_k_classes(backend.infer(x[:8]), 10))
    finally:
        backend.close()


def test_all_gpus_answer_as_gpu_0_and_each_does_its_share(model_dir, monkeypatch):  # noqa: F811
    # Every visible GPU (one here is fine: then the plain backend): worker threads from a pool call
    # whichever lane is least busy, each lane's copies read the one portable store in place.
    from trtfuse import cuda_runtime
    from trtfuse.backends import create_backend
    from trtfuse.backends.lanes import LanesBackend
    from trtfuse.backends.tensorrt_backend import TensorRTBackend
    from trtfuse.models import load_prepared

    model = load_prepared(model_dir)
    x = np.concatenate(calib_batches(seed=15, n=2))
    count = cuda_runtime.device_count()
    reference = TensorRTBackend(device=0, **_OPTIONS)
    reference.load(model, 8)
    try:
        expected = _classify_through_a_store(reference, x, _BATCHES)
    finally:
        reference.close()

    row_copies = []
    original = cuda_runtime.copy_rows_htod_async
    monkeypatch.setattr(cuda_runtime, "copy_rows_htod_async",
                        lambda *a: (row_copies.append(a[4]), original(*a))[1])
    backend = create_backend("tensorrt", devices="all", **_OPTIONS)
    if count == 1:
        assert type(backend) is TensorRTBackend
    else:
        assert isinstance(backend, LanesBackend) and [lane.device for lane in backend.lanes] == list(range(count))
    backend.load(model, 8)
    try:
        assert backend.concurrency == 2 * count
        got = _classify_through_a_store(backend, x, _BATCHES * count, threads=backend.concurrency)
        for a, b in zip(got, expected * count):
            np.testing.assert_array_equal(a, b)
        assert len(row_copies) == len(_BATCHES) * count  # every batch, on every GPU, took the direct path
        assert set(row_copies) == set(range(count))       # ... and its copies went to its own GPU
        if count > 1:
            assert all(s["batches"] > 0 for s in backend.lane_stats()), backend.lane_stats()
    finally:
        backend.close()


@pytest.mark.parametrize("input_format", ["float", "int8"])
def test_images_in_gpu_memory_give_what_host_images_give(model_dir, input_format):  # noqa: F811
    # What `trtfuse serve` does with a request in CUDA shared memory: the images are on the GPU
    # already (in the engine's input type), in several runs (one per request of a dynamic batch);
    # classify_device and infer_device copy them device to device and answer as classify and infer.
    from trtfuse import cuda_runtime
    from trtfuse.backends.tensorrt_backend import TensorRTBackend
    from trtfuse.models import load_prepared

    backend = TensorRTBackend(**{**_OPTIONS, "input_format": input_format})
    backend.load(load_prepared(model_dir), 8)
    x = backend.to_input(np.concatenate(calib_batches(seed=16, n=1)))
    staged = cuda_runtime.PinnedBuffer(x.shape, x.dtype)
    device = cuda_runtime.DeviceBuffer(x.nbytes)
    stream = cuda_runtime.Stream()
    try:
        staged.array[...] = x
        cuda_runtime.copy_htod_async(device, staged, x.nbytes, stream)
        stream.synchronize()
        row = x[0].nbytes
        parts = [(device.ptr, 3), (device.ptr + 3 * row, 1), (device.ptr + 4 * row, 4)]  # requests of 3, 1, 4
        np.testing.assert_array_equal(backend.classify_device(parts), backend.classify(x))
        np.testing.assert_array_equal(backend.classify_device(parts[1:], k=2), backend.classify(x[3:], k=2))
        np.testing.assert_array_equal(backend.infer_device(parts), backend.infer(x))
        with pytest.raises(ValueError, match="exceeds max_batch"):
            backend.classify_device([(device.ptr, 8), (device.ptr, 1)])
    finally:
        stream.destroy()
        device.free()
        staged.free()
        backend.close()
