"""`trtfuse serve`'s model without a server: Triton's Python backend hands it the requests of one
dynamic batch; it must answer each request with its own rows, dequantize int8 pixels for a float
backend exactly as the network's DequantizeLinear would, and compute the scores only when asked."""

import numpy as np
import pytest
from conftest_harness import tiny_model
from trtfuse.backends import top_k_classes
from trtfuse.backends.onnxruntime_backend import OnnxRuntimeBackend
from trtfuse.triton.model_io import triton_model
from trtfuse.triton.python_model import ServedModel


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
    served_model = ServedModel(backend, spec, scale=None)
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, *model.input_shape)).astype(np.float32) for n in (3, 5))
    answers = served_model.run([a, b], scores=False)
    assert [set(r) for r in answers] == [{"top_classes"}, {"top_classes"}]  # no scores computed
    for x, answer in zip((a, b), answers):
        np.testing.assert_array_equal(answer["top_classes"], top_k_classes(x.mean(axis=(2, 3)), 5))
    assert served_model.requests == 2 and served_model.samples == 8

    (both,) = served_model.run([a], scores=True)
    np.testing.assert_allclose(both[model.output_name], a.mean(axis=(2, 3)), rtol=1e-5)
    assert both[model.output_name].dtype == np.float32 and both["top_classes"].dtype == np.int32


def test_int8_pixels_are_dequantized_for_a_float_backend(served):
    model, backend = served
    scale = 0.05
    spec = triton_model(model, "INT8", 16)
    q = np.random.default_rng(1).integers(-128, 128, (4, *model.input_shape), dtype=np.int8)
    (answer,) = ServedModel(backend, spec, scale).run([q], scores=False)
    np.testing.assert_array_equal(backend.seen[-1], q.astype(np.float32) * np.float32(scale))
    np.testing.assert_array_equal(answer["top_classes"],
                                  top_k_classes((q.astype(np.float32) * np.float32(scale)).mean(axis=(2, 3)), 5))


# ------------------------------------------------------------------ the Python backend's execute
class FakeTensor:
    """A Python-backend tensor: host memory, or (``on_gpu``) memory it reports as the GPU's, whose
    address the model reads through DLPack."""

    def __init__(self, array, on_gpu=False):
        self.array, self.on_gpu = array, on_gpu

    def is_cpu(self):
        return not self.on_gpu

    def as_numpy(self):
        assert not self.on_gpu, "the model asked a GPU tensor for a numpy array"
        return self.array

    def to_dlpack(self):
        return self.array.__dlpack__()


class DeviceRecording(Recording):
    """Reads "device" images from their addresses (host memory here) and records the runs."""

    def __init__(self):
        super().__init__()
        self.device_parts = []

    def _gather(self, parts):
        import ctypes

        shape, dtype = self.seen_shape, np.float32
        rows = [np.frombuffer((ctypes.c_byte * (n * int(np.prod(shape)) * 4)).from_address(a), dtype).reshape(n, *shape)
                for a, n in parts]
        self.device_parts.append([n for _, n in parts])
        return np.concatenate(rows)

    def stage_device(self, parts):  # the rows copied, as into an engine's input
        return self._gather(parts)

    def run_staged(self, staged, top, release=True):
        return self.classify(staged, 5) if top else self.infer(staged)

    def release_staged(self, staged):
        pass


def test_execute_answers_gpu_and_host_requests_in_order(tmp_path, monkeypatch):
    import json
    import sys
    import types

    from trtfuse.triton import python_model
    from trtfuse.triton.model_io import model_config

    model = tiny_model(tmp_path)
    spec = triton_model(model, "FP32", 16)
    backend = DeviceRecording()
    backend.load(model, 16)
    backend.seen_shape = model.input_shape
    pb = types.SimpleNamespace(
        get_input_tensor_by_name=lambda r, name: r["tensors"][name],
        InferenceResponse=lambda output_tensors=None, error=None: {"outputs": output_tensors, "error": error},
        Tensor=lambda name, array: (name, array), TritonError=str,
        using_decoupled_model_transaction_policy=lambda cfg: cfg.get("model_transaction_policy", {}).get("decoupled",
                                                                                                     False))
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    instance = python_model.TritonPythonModel.__new__(python_model.TritonPythonModel)
    instance.pb, instance.name, instance.workers = pb, "tiny_0", None
    instance.model = python_model.ServedModel(backend, spec, None)

    class Request(dict):
        def __init__(self, array, on_gpu, outputs):
            super().__init__(tensors={"input": FakeTensor(array, on_gpu)})
            self.outputs = outputs

        def requested_output_names(self):
            return self.outputs

    rng = np.random.default_rng(2)
    arrays = [rng.standard_normal((n, *model.input_shape)).astype(np.float32) for n in (2, 3, 1, 4)]
    on_gpu = [True, False, True, False]
    responses = instance.execute([Request(a, g, ["top_classes"]) for a, g in zip(arrays, on_gpu)])
    assert backend.device_parts == [[2, 1]]  # the GPU requests, in one run, in their order
    for a, r in zip(arrays, responses):
        assert r["error"] is None and [name for name, _ in r["outputs"]] == ["top_classes"]
        np.testing.assert_array_equal(r["outputs"][0][1], top_k_classes(a.mean(axis=(2, 3)), 5))
    assert instance.model.device_requests == 2 and instance.model.requests == 4

    # Scores asked for by one request: computed for the batch, sent only to that request.
    responses = instance.execute([Request(arrays[0], True, ["top_classes", model.output_name]),
                                  Request(arrays[1], True, ["top_classes"])])
    assert [len(r["outputs"]) for r in responses] == [2, 1]
    np.testing.assert_allclose(dict(responses[0]["outputs"])[model.output_name], arrays[0].mean(axis=(2, 3)),
                               rtol=1e-5)

    # A failing batch: every request gets the error, none a half answer.
    def fail(*_):
        raise RuntimeError("the GPU fell off")

    monkeypatch.setattr(backend, "classify", fail)
    responses = instance.execute([Request(arrays[1], False, ["top_classes"]), Request(arrays[0], True, ["top_classes"])])
    assert all(r["outputs"] is None and r["error"] == "trtfuse: RuntimeError: the GPU fell off" for r in responses)
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)

    # The settings serve writes reach initialize through the config's JSON, as Triton passes it.
    cfg = model_config(spec, backend="python")
    import onnx
    from trtfuse.models.prepared import write_prepared

    prepared = write_prepared(onnx.load(model.onnx_path), model, tmp_path / "prepared")
    cfg.parameters[python_model.PARAMETER].string_value = python_model.settings(str(prepared.dir), "onnxruntime",
                                                                                {}, None)
    from google.protobuf import json_format

    args = {"model_config": json.dumps(json_format.MessageToDict(cfg, preserving_proto_field_name=True)),
            "model_instance_kind": "CPU", "model_instance_name": "tiny_0"}
    fresh = python_model.TritonPythonModel()
    fresh.initialize(args)
    try:
        (r,) = fresh.execute([Request(arrays[3], False, ["top_classes"])])
        np.testing.assert_array_equal(r["outputs"][0][1], top_k_classes(arrays[3].mean(axis=(2, 3)), 5))
    finally:
        fresh.finalize()


def test_dlpack_placement_is_the_array_memory():
    from trtfuse.triton.dlpack import CPU, placement

    a = np.arange(2 * 3 * 4, dtype=np.int8).reshape(2, 3, 4)
    p = placement(a.__dlpack__())
    assert (p.address, p.shape, p.itemsize, p.device_type) == (a.ctypes.data, (2, 3, 4), 1, CPU)
    assert placement(a[1:].__dlpack__()).address == a.ctypes.data + 12
    assert placement(np.zeros((5, 2), np.float32).__dlpack__()).itemsize == 4
    with pytest.raises(ValueError, match="not C-contiguous"):
        placement(a[:, :, ::2].__dlpack__())


def test_a_decoupled_instance_runs_batches_at_once_and_answers_each_request_once(tmp_path, monkeypatch):
    """``serve --concurrency 2``: execute hands each batch to a worker and returns None; two batches run
    at the same time (each waits for the other at a barrier: one at a time would time out); the batches
    run on copies made before execute returned (Triton may reuse the requests' memory from then on:
    poisoned here); every request gets exactly one response, flagged final, its own answer or its
    batch's error."""
    import json
    import sys
    import types

    import onnx
    from google.protobuf import json_format
    from trtfuse.models.prepared import write_prepared
    from trtfuse.triton import python_model
    from trtfuse.triton.model_io import model_config

    FINAL = 1
    pb = types.SimpleNamespace(
        get_input_tensor_by_name=lambda r, name: r.tensor,
        InferenceResponse=lambda output_tensors=None, error=None: {"outputs": output_tensors, "error": error},
        Tensor=lambda name, array: (name, array), TritonError=str, TRITONSERVER_RESPONSE_COMPLETE_FINAL=FINAL,
        using_decoupled_model_transaction_policy=lambda cfg: cfg["model_transaction_policy"]["decoupled"])
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)

    class Request:
        def __init__(self, array):
            self.tensor, self.sent = FakeTensor(array), []

        def requested_output_names(self):
            return ["top_classes"]

        def get_response_sender(self):
            return types.SimpleNamespace(send=lambda response, flags=0: self.sent.append((response, flags)))

    model = tiny_model(tmp_path)
    spec = triton_model(model, "FP32", 16)
    prepared = write_prepared(onnx.load(model.onnx_path), model, tmp_path / "prepared")
    cfg = model_config(spec, backend="python")
    cfg.model_transaction_policy.decoupled = True
    cfg.parameters[python_model.PARAMETER].string_value = python_model.settings(
        str(prepared.dir), "onnxruntime", {}, None, concurrency=2)
    instance = python_model.TritonPythonModel()
    instance.initialize({"model_config": json.dumps(json_format.MessageToDict(cfg, preserving_proto_field_name=True)),
                         "model_instance_kind": "CPU", "model_instance_name": "tiny_0"})
    import threading

    both_running, poisoned = threading.Barrier(2, timeout=10), threading.Event()
    classify = instance.model.backend.classify

    def classify_when_both_run(images, k=5):
        if np.isnan(images).any():
            raise RuntimeError("this batch fails")
        both_running.wait()
        assert poisoned.wait(10)
        return classify(images, k)

    monkeypatch.setattr(instance.model.backend, "classify", classify_when_both_run)
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal((n, *model.input_shape)).astype(np.float32) for n in (2, 3, 4)]
    first, second = [Request(arrays[0]), Request(arrays[1])], [Request(arrays[2])]
    assert instance.execute(first) is None and instance.execute(second) is None
    originals = [a.copy() for a in arrays]
    for a in arrays:
        a[...] = np.nan  # the requests' memory, reused by Triton after execute returned
    poisoned.set()
    failing = [Request(np.full((1, *model.input_shape), np.nan, np.float32)), Request(originals[0])]
    instance.execute(failing)  # one batch: both requests get its error
    instance.finalize()  # waits for the workers: every batch handed out is answered
    for request, a in zip(first + second, originals):
        ((response, flags),) = request.sent
        assert flags == FINAL and response["error"] is None
        np.testing.assert_array_equal(response["outputs"][0][1], top_k_classes(a.mean(axis=(2, 3)), 5))
    for request in failing:
        ((response, flags),) = request.sent
        assert flags == FINAL and response["error"] == "trtfuse: RuntimeError: this batch fails"


def test_a_failed_run_gives_its_staged_slot_back(tmp_path):
    """A batch staged on a backend slot whose run fails (the scores asked too: the slot was kept for a
    second run) gives the slot back: one leaked slot and every later batch would wait forever."""
    model = tiny_model(tmp_path)
    returned = []

    class FailingRun(DeviceRecording):
        def run_staged(self, staged, top, release=True):
            raise RuntimeError("engine failed")

        def release_staged(self, staged):
            returned.append(staged)

    backend = FailingRun()
    backend.load(model, 16)
    served = ServedModel(backend, triton_model(model, "FP32", 16), scale=None)
    staged = ("slot", [2])
    with pytest.raises(RuntimeError, match="engine failed"):
        served.run_device(staged, scores=True)
    assert returned == ["slot"]


def test_numpy_2_under_the_python_backend_stub_is_named():
    """nvidia-pytriton 0.7.0's stub answers empty outputs under NumPy 2 (seen with the GPU machine's staged
    Python 3.10: every request answered, no data), so serving refuses it in one line."""
    from trtfuse.triton.tritonserver import numpy_problem

    for pytriton in ("0.7.0", "0.5.5", None):  # None: unzipped without pip's metadata
        e = numpy_problem("2.2.6", pytriton)
        assert e is not None and "answers empty outputs with NumPy 2.2.6" in e.problem
        assert 'numpy<2' in e.fix and "trtfuse triton serve" in e.fix and "\n" not in str(e)
    assert numpy_problem("1.26.4", "0.7.0") is None and numpy_problem("1.26.4", None) is None
    assert numpy_problem("2.2.6", "0.8.0") is None


def test_serve_refuses_numpy_2_before_starting_the_server(tmp_path, monkeypatch):
    import argparse

    from trtfuse.errors import UserError
    from trtfuse.triton import serve, tritonserver

    try:
        tritonserver.stub_for_this_python(tritonserver.bundled())
    except UserError as e:
        pytest.skip(str(e))
    monkeypatch.setattr(np, "__version__", "2.2.6")
    monkeypatch.setattr(serve, "plan", lambda args: pytest.fail("the model was prepared before the refusal"))
    with pytest.raises(UserError, match="empty outputs with NumPy 2.2.6"):
        serve.serve(argparse.Namespace(workspace=str(tmp_path / "ws")))
    assert not (tmp_path / "ws").exists()
