"""The checked CUDA runtime layer on a GPU: row copies host -> device, both ways of issuing them."""

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


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
