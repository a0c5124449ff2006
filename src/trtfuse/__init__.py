"""trtfuse: TensorRT plugins and an MLPerf LoadGen inference-benchmark harness."""

__version__ = "0.1.0"
