"""What a prepared model is (``PreprocessSpec``, ``PreparedModel``) and how it is stored on disk.

A prepared model is a folder holding ``model.onnx`` and ``model.json``: the ``PreparedModel``
fields, paths relative to the folder so it can be moved, and the key of the inputs it came from.
``model.json`` is written last and removed first, so it marks a complete, consistent folder.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from trtfuse.errors import UserError

MODEL_FILE = "model.onnx"
META_FILE = "model.json"


def trtfuse_home() -> Path:
    """Root of trtfuse's caches: ``$TRTFUSE_HOME``, default ``~/.cache/trtfuse``."""
    return Path(os.environ.get("TRTFUSE_HOME") or Path.home() / ".cache" / "trtfuse").expanduser()


# torchvision's ImageNet mean (0.485, 0.456, 0.406) and std (0.229, 0.224, 0.225) times 255, written
# out (0.224 * 255 computes to 57.120000000000005; the key hashes the printed value).
TORCHVISION_MEAN = (123.675, 116.28, 103.53)
TORCHVISION_STD = (58.395, 57.12, 57.375)


@dataclass(frozen=True)
class PreprocessSpec:
    """How an RGB image becomes the model's input; every field is part of the data cache key."""

    # Field order as in docs/ARCHITECTURE.md; the defaults are torchvision's at 224 x 224.
    size: int = 224  # centre crop
    resize: int = 256  # shorter side before the crop (cv2.INTER_AREA)
    mean: tuple[float, float, float] = TORCHVISION_MEAN  # subtracted, 0..255 pixel units
    std: tuple[float, float, float] = TORCHVISION_STD  # divided, 0..255 units (1,1,1: mean only)
    layout: str = "NCHW"

    def __post_init__(self):
        # JSON round trips give lists; keep tuples so specs compare and hash equal.
        object.__setattr__(self, "mean", tuple(float(v) for v in self.mean))
        object.__setattr__(self, "std", tuple(float(v) for v in self.std))
        if self.layout != "NCHW":
            raise UserError(
                f"preprocess layout {self.layout!r} is not supported",
                "trtfuse feeds NCHW float32 tensors",
            )
        if not 0 < self.size <= self.resize:
            raise UserError(
                f"preprocess crop {self.size} must be positive and at most the "
                f"resize {self.resize}",
                "fix the model's preprocess settings",
            )

    def key(self) -> str:
        """Short stable hash of the spec (names the cached .npy)."""
        text = json.dumps(dataclasses.asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class PreparedModel:
    name: str  # "resnet50", "efficientnet-lite0", or the ONNX file's stem
    onnx_path: Path
    input_name: str
    input_shape: tuple[int, int, int]  # C, H, W
    num_classes: int  # 1000, or 1001 for MLPerf's resnet50_v1.onnx
    label_offset: int  # 1 when class 0 is "background", else 0
    preprocess: PreprocessSpec
    random_weights: bool  # True: reports say "random weights: performance only"
    output_name: str  # the logits/probabilities output
    source_key: str = ""  # hash of what it was prepared from (prepare's cache key)
    notes: dict = field(default_factory=dict)  # provenance for reports (weights file, opset, ...)

    @property
    def dir(self) -> Path:
        return Path(self.onnx_path).parent

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        data["onnx_path"] = Path(self.onnx_path).name  # relative: the folder may move
        data["input_shape"] = list(self.input_shape)
        return data

    @classmethod
    def from_json(cls, data: dict, folder: Path) -> PreparedModel:
        data = dict(data)
        data["onnx_path"] = Path(folder) / data["onnx_path"]
        data["input_shape"] = tuple(data["input_shape"])
        data["preprocess"] = PreprocessSpec(**data["preprocess"])
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def load_prepared(folder: str | os.PathLike) -> PreparedModel:
    """The prepared model in ``folder`` (its ``model.json`` beside ``model.onnx``)."""
    folder = Path(folder)
    meta = folder / META_FILE
    if not meta.is_file():
        raise UserError(
            f"{folder} holds no prepared model ({META_FILE} is missing)",
            "prepare it first with `trtfuse prepare`",
        )
    try:
        prepared = PreparedModel.from_json(json.loads(meta.read_text()), folder)
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(
            f"{meta} is not a trtfuse model description ({e})",
            "delete the folder and prepare the model again",
        ) from e
    if not Path(prepared.onnx_path).is_file():
        raise UserError(f"{prepared.onnx_path} is missing", "prepare the model again")
    return prepared


def write_prepared(
    onnx_model, prepared: PreparedModel, out_dir: str | os.PathLike
) -> PreparedModel:
    """Check ``onnx_model`` (an ``onnx.ModelProto``); store it and its description in ``out_dir``.

    ``prepared.onnx_path`` is ignored and set to ``out_dir/model.onnx``. Each file is written to a
    temporary name and renamed; the description goes last, so a crash leaves no folder that looks
    complete but is not.
    """
    import onnx

    out_dir = Path(out_dir)
    onnx.checker.check_model(onnx_model, full_check=False)
    prepared = dataclasses.replace(prepared, onnx_path=out_dir / MODEL_FILE)
    text = json.dumps(prepared.to_json(), indent=2, sort_keys=True) + "\n"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / META_FILE).unlink(missing_ok=True)
        _atomic_write(out_dir / MODEL_FILE, onnx_model.SerializeToString())
        _atomic_write(out_dir / META_FILE, text.encode())
    except OSError as e:
        raise UserError(
            f"cannot write the prepared model to {out_dir} ({e.strerror or e})",
            "choose a writable output folder (--out) or set TRTFUSE_HOME",
        ) from e
    return prepared


def _atomic_write(path: Path, data: bytes) -> None:
    # A unique name beside the target (not mkstemp: its 0600 mode would make the file private).
    tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "xb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
