"""Model preparation: a named model (or a user's ONNX file) -> ``model.onnx`` + ``model.json``.

``prepare(name, out_dir, weights=None, onnx=None)`` exports or imports the model, checks it with
onnx.checker and writes it (see ``prepared.write_prepared``); a folder already prepared from the
same inputs is returned as it is. torch and the model packages are imported only when a model is
built.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
from pathlib import Path

from trtfuse.errors import UserError
from trtfuse.models.prepared import (
    META_FILE,
    PreparedModel,
    PreprocessSpec,
    load_prepared,
    trtfuse_home,
    write_prepared,
)

__all__ = [
    "MODELS",
    "PreparedModel",
    "PreprocessSpec",
    "default_model_dir",
    "load_prepared",
    "prepare",
    "trtfuse_home",
    "write_prepared",
]

# Registered models -> the module that builds them (``build(weights) -> (module, random_weights)``
# plus NAME, NUM_CLASSES, INPUT_SHAPE, PREPROCESS).
MODELS = {
    "resnet50": "trtfuse.models.resnet50",
    "efficientnet-lite0": "trtfuse.models.efficientnet_lite",
}
# Bump when an export changes its output for the same inputs: it is part of the cache key.
EXPORT_VERSION = 1


def default_model_dir(name: str) -> Path:
    """``$TRTFUSE_HOME/models/<name>/``."""
    return trtfuse_home() / "models" / name


def prepare(
    name: str | None,
    out_dir: str | os.PathLike | None = None,
    weights: str | os.PathLike | None = None,
    onnx: str | os.PathLike | None = None,
) -> PreparedModel:
    """Prepare a registered model (``name``, optional torchvision-style ``weights`` state dict) or
    any ONNX classifier (``onnx``; ``name`` then defaults to the file's stem).

    ``out_dir`` defaults to ``default_model_dir(name)``.
    """
    if onnx is not None:
        if weights is not None:
            raise UserError(
                "--weights applies to the built-in models, not to an --onnx file",
                "pass either --onnx FILE or a model name with --weights FILE",
            )
        onnx_path = Path(onnx).expanduser()
        name = name or onnx_path.stem
        key_inputs = {"onnx": _file_digest(onnx_path, "ONNX file", "check the --onnx path")}
    else:
        if name not in MODELS:
            raise UserError(
                f"unknown model {name!r}",
                f"choose one of {', '.join(MODELS)}, or give an ONNX classifier (`trtfuse run --model "
                "FILE.onnx`, `trtfuse prepare --onnx FILE`)"
            )
        weights_digest = None
        if weights is not None:
            weights_digest = _file_digest(
                Path(weights).expanduser(), "weights file", "check the --weights path"
            )
        key_inputs = {"weights": weights_digest}
    key = _digest({"name": name, "export_version": EXPORT_VERSION, **key_inputs})
    out_dir = Path(out_dir).expanduser() if out_dir is not None else default_model_dir(name)

    if (out_dir / META_FILE).is_file():
        try:
            existing = load_prepared(out_dir)
        except UserError:
            existing = None  # broken or foreign folder: prepare it again
        if existing is not None and existing.source_key == key:
            return existing

    if onnx is not None:
        onnx_model, prepared = _import_onnx(Path(onnx).expanduser(), name)
    else:
        onnx_model, prepared = _export_registered(name, weights)
    prepared.source_key = key
    return write_prepared(onnx_model, prepared, out_dir)


def _export_registered(name: str, weights):
    from trtfuse.models.onnx_model import INPUT_NAME, OPSET, OUTPUT_NAME, export_torch

    try:
        import torch  # noqa: F401
    except ImportError as e:
        raise UserError(
            f"exporting {name} needs torch, which is not installed", "pip install 'trtfuse[models]'"
        ) from e
    builder = importlib.import_module(MODELS[name])
    module, random_weights = builder.build(weights)
    onnx_model = export_torch(module, builder.INPUT_SHAPE)
    prepared = PreparedModel(
        name=name,
        onnx_path=Path("model.onnx"),
        input_name=INPUT_NAME,
        input_shape=builder.INPUT_SHAPE,
        num_classes=builder.NUM_CLASSES,
        label_offset=0,
        preprocess=builder.PREPROCESS,
        random_weights=random_weights,
        output_name=OUTPUT_NAME,
        notes={"weights": _describe_weights(weights, random_weights), "opset": OPSET},
    )
    return onnx_model, prepared


def _describe_weights(weights, random_weights: bool) -> str:
    if weights is not None:
        return str(weights)
    return "random (seeded)" if random_weights else "packaged ImageNet weights"


def _import_onnx(path: Path, name: str):
    from trtfuse.models.onnx_model import classifier_io, load_onnx

    onnx_model = load_onnx(path)
    io = classifier_io(onnx_model)
    prepared = PreparedModel(
        name=name,
        onnx_path=Path("model.onnx"),
        random_weights=False,
        notes={"source_onnx": str(path)},
        **io,
    )
    return onnx_model, prepared


def _file_digest(path: Path, what: str, fix: str) -> str:
    if not path.is_file():
        raise UserError(f"{what} {path} does not exist", fix)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _digest(data: dict) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
