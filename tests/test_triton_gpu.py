"""`trtfuse serve` with TensorRT on a GPU, against the harness's `triton` backend over each transport:
every batch's top classes through Triton equal the engine's own, direct; with transport cuda the
images are read by the served engine in GPU memory (no host copy), as the server's log counts. Served
one batch at a time per instance, and two at once (``--concurrency 2``: decoupled, over a gRPC stream)."""

import importlib.util
import re

import numpy as np
import pytest
from test_engine import model_dir  # noqa: F401 - fixture
from test_quantize import calib_batches
from test_tensorrt_backend import _BATCHES, _OPTIONS, _classify_through_a_store

pytestmark = pytest.mark.tensorrt

pytest.importorskip("tritonclient")
if importlib.util.find_spec("pytriton") is None:
    pytest.skip("nvidia-pytriton (its tritonserver) is not installed", allow_module_level=True)


def _classify_on_each_slot(backend, x, batches) -> list[list[np.ndarray]]:
    """The answers of ``batches`` on each of the backend's slots (streams) alone, one list per slot."""
    slots = [backend._free.get() for _ in backend.slots]  # all taken: then each is put back alone
    answers = []
    try:
        for slot in slots:
            backend._free.put(slot)
            answers.append(_classify_through_a_store(backend, x, batches))
            assert backend._free.get() is slot
    finally:
        for slot in slots:
            backend._free.put(slot)
    return answers


@pytest.mark.parametrize("concurrency", [1, 2], ids=["unary", "stream"])
def test_every_transport_answers_as_the_engine_direct(model_dir, tmp_path, concurrency):  # noqa: F811
    from trtfuse.backends import create_backend
    from trtfuse.backends.tensorrt_backend import TensorRTBackend
    from trtfuse.models import load_prepared
    from trtfuse.triton.process import ServeProcess

    model = load_prepared(model_dir)
    x = np.concatenate(calib_batches(seed=17, n=2))
    direct = TensorRTBackend(**{**_OPTIONS, "input_format": "int8"})
    direct.load(model, 8)
    try:
        # Each stream of the engine is an optimization profile of its own, whose kernels TensorRT picks
        # separately, so their answers need not be bit for bit the same. A served batch runs on any of
        # them: it must equal that of one. (What did differ once was a served answer from all of them:
        # a decoupled instance read its inputs after Triton had reused their memory.)
        expected = _classify_on_each_slot(direct, x, _BATCHES)
    finally:
        direct.close()

    def assert_answers(got, rows, i, why):
        assert any(np.array_equal(got, on_slot[i]) for on_slot in expected), f"{why}: rows {rows}"

    with ServeProcess([str(model_dir), "--backend", "tensorrt", "--input-format", "int8", "--batch-size", "8",
                       "--instances", "2", "--concurrency", str(concurrency)], tmp_path / "serve") as server:
        assert server.ready["device_input"] and server.ready["input"] == "INT8"
        assert server.ready["decoupled"] == (concurrency > 1)
        for transport in ("cuda", "shm", "grpc"):
            client = create_backend("triton", url=server.url, transport=transport, inflight=4)
            client.load(model, 8)
            assert client.decoupled == (concurrency > 1)
            try:
                got = _classify_through_a_store(client, x, _BATCHES, threads=4)
                for i, (rows, a) in enumerate(zip(_BATCHES, got)):
                    assert_answers(a, rows, i, transport)
                # A batch from anywhere (staged, then uploaded with cuda) answers the same.
                assert_answers(client.classify(x[:8]), _BATCHES[-1], len(_BATCHES) - 1, f"{transport} classify")
            finally:
                client.close()
    log = (server.workspace / "tritonserver.log").read_text()
    counts = [(int(a), int(b)) for a, b in re.findall(r"ran (\d+) requests \((\d+) read in GPU memory\)", log)]
    assert len(counts) == 2, log[-2000:]  # both instances said what they ran
    per_transport = len(_BATCHES) + 1
    assert sum(a for a, _ in counts) == 3 * per_transport
    assert sum(b for _, b in counts) == per_transport  # exactly the cuda transport's requests
