"""Graph passes over ONNX models: canonical form, BN folding, int8 quantization (Q/DQ), and the rewrites that put
trtfuse's plugins into a graph, listed once in the fusion registry (``fusions.FUSIONS``)."""
