"""The checked CUDA runtime layer: row copies host -> device (both ways of issuing them), one pinned
store feeding every GPU, the current device per thread. All but the first test need a GPU."""

import threading

import numpy as np
import pytest
from trtfuse.errors import UserError


def _cuda_runtime():
    try:
        from trtfuse import cuda_runtime
    except UserError:
        pytest.skip("cuda-python is not installed")
    return cuda_runtime


def test_batch_copy_attributes_name_each_destination_gpu():
    # Made once per device, not once per process: a copy to GPU 1 must not carry GPU 0's hint.
    cr = _cuda_runtime()
    if not hasattr(cr.cudart, "cudaMemcpyAttributes"):
        pytest.skip("this cuda-python has no cudaMemcpyBatchAsync")
    batch_copy = cr._BatchCopy()
    one, zero = batch_copy.attributes(1), batch_copy.attributes(0)
    assert (one.dstLocHint.id, zero.dstLocHint.id) == (1, 0)
    assert batch_copy.attributes(1) is one


@pytest.mark.gpu
@pytest.mark.parametrize("batched", [True, False])
def test_copy_rows_assembles_the_batch_on_the_device(batched, monkeypatch):
    from trtfuse import cuda_runtime as cr

    if not batched:
        monkeypatch.setattr(cr._batch_copy, "_usable", False)
    elif not cr._batch_copy.usable():
        pytest.skip("this cuda-python has no cudaMemcpyBatchAsync")
    rng = np.random.default_rng(5)
    row_bytes = 150_528  # one 3x224x224 int8 image
    src = cr.PinnedBuffer((40, row_bytes), np.int8)
    src.array[:] = rng.integers(-128, 128, size=src.array.shape, dtype=np.int8)
    rows = np.array([7, 8, 9, 10, 3, 3, 39, 0, 1, 25])  # a run, a repeat, both ends
    dev = cr.DeviceBuffer(len(rows) * row_bytes)
    back = cr.PinnedBuffer((len(rows), row_bytes), np.int8)
    back.array[:] = 0x55  # poison
    stream = cr.Stream()
    try:
        cr.memset(dev, 0xAA)
        cr.copy_rows_htod_async(dev, src.ptr + rows * row_bytes, row_bytes, stream)
        cr.copy_dtoh_async(back, dev, back.nbytes, stream)
        stream.synchronize()
        np.testing.assert_array_equal(back.array, src.array[rows])
        assert cr._batch_copy.usable() == batched  # the batched call worked where it was tried
    finally:
        stream.destroy()
        for b in (src, dev, back):
            b.free()


@pytest.mark.gpu
def test_set_device_is_per_thread_and_checked():
    cr = _cuda_runtime()
    last = cr.device_count() - 1
    seen = []

    def other_thread():
        seen.append(int(cr.check(cr.cudart.cudaGetDevice())))

    cr.set_device(last)
    try:
        assert int(cr.check(cr.cudart.cudaGetDevice())) == last
        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
        assert seen == [0]  # a new thread starts on GPU 0, whatever this one set
        with pytest.raises(cr.CudaError, match="cudaSetDevice"):
            cr.set_device(last + 1)
    finally:
        cr.set_device(0)


@pytest.mark.gpu
def test_one_pinned_store_feeds_every_gpu():
    # The QSL's store, allocated once (portable), copied row by row to each GPU's own buffer.
    cr = _cuda_runtime()
    rng = np.random.default_rng(6)
    row_bytes = 4096
    src = cr.PinnedBuffer((12, row_bytes), np.int8)
    flags = int(cr.check(cr.cudart.cudaHostGetFlags(src.ptr), "cudaHostGetFlags"))
    assert flags & int(cr.cudart.cudaHostAllocPortable)
    src.array[:] = rng.integers(-128, 128, size=src.array.shape, dtype=np.int8)
    rows = np.array([11, 2, 3, 4, 0, 0])
    try:
        for device in range(cr.device_count()):
            cr.set_device(device)
            dev = cr.DeviceBuffer(len(rows) * row_bytes)
            back = cr.PinnedBuffer((len(rows), row_bytes), np.int8)
            stream = cr.Stream()
            try:
                cr.copy_rows_htod_async(dev, src.ptr + rows * row_bytes, row_bytes, stream, device)
                cr.copy_dtoh_async(back, dev, back.nbytes, stream)
                stream.synchronize()
                np.testing.assert_array_equal(back.array, src.array[rows], err_msg=f"GPU {device}")
            finally:
                stream.destroy()
                dev.free()
                back.free()
    finally:
        cr.set_device(0)
        src.free()
