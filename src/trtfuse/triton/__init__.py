"""NVIDIA Triton Inference Server: trtfuse's models served by it, and the harness as its client.

- ``model_io``: the one Triton model every path agrees on (name, input, outputs, config.pbtxt).
- ``export``: ``trtfuse triton export``, a model repository for Triton's TensorRT backend.
- ``serve``: ``trtfuse serve``, a real ``tritonserver`` (the one nvidia-pytriton bundles, run by
  ``tritonserver``) serving trtfuse's own backend (TensorRT with the plugins, or ONNX Runtime) under the
  same name and I/O, in Triton's Python backend (``python_model``).
- ``process``: ``trtfuse serve`` as a child process, for scripts and tests.
- the client side is the ``triton`` backend of the harness (``trtfuse.backends.triton_backend``).
"""
