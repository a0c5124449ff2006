"""NVIDIA Triton Inference Server: trtfuse's models served by it, and the harness as its client.

- ``model_io``: the one Triton model every path agrees on (name, input, outputs, config.pbtxt).
- ``export``: ``trtfuse triton export``, a model repository for Triton's TensorRT backend.
- ``serve``: ``trtfuse serve``, a real ``tritonserver`` (PyTriton's) serving trtfuse's own backend
  (TensorRT with the plugins, or ONNX Runtime) under the same name and I/O.
- the client side is the ``triton`` backend of the harness (``trtfuse.backends.triton_backend``).
"""
