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
        expected = _classify_through_a_store(direct, x, _BATCHES)
        scores = direct.infer(x)
    finally:
        direct.close()

    def assert_same_ranking(got, want, rows, why):
        """The same top classes, in the same order, but for classes whose scores tie: the engine's
        TopK may order those differently on another optimization profile (a stream of its own)."""
        s = scores[np.asarray(rows)]
        np.testing.assert_array_equal(np.take_along_axis(s, got, 1), np.take_along_axis(s, want, 1), err_msg=why)

    assert (np.ptp(scores, axis=1) > 0).all()  # scores that rank: not all tied

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
                for rows, a, b in zip(_BATCHES, got, expected):
                    assert_same_ranking(a, b, rows, f"{transport}: rows {rows}")
                # A batch from anywhere (staged, then uploaded with cuda) answers the same.
                assert_same_ranking(client.classify(x[:8]), expected[-1], _BATCHES[-1], f"{transport}: classify")
            finally:
                client.close()
    log = (server.workspace / "tritonserver.log").read_text()
    counts = [(int(a), int(b)) for a, b in re.findall(r"ran (\d+) requests \((\d+) read in GPU memory\)", log)]
    assert len(counts) == 2, log[-2000:]  # both instances said what they ran
    per_transport = len(_BATCHES) + 1
    assert sum(a for a, _ in counts) == 3 * per_transport
    assert sum(b for _, b in counts) == per_transport  # exactly the cuda transport's requests
