"""One image file -> one model input, exactly as the MLCommons inference reference does it.

The reference (vision/classification_and_detection/python/dataset.py, ``pre_process_vgg``) decodes
with OpenCV, converts BGR to RGB, resizes with ``cv2.INTER_AREA`` so the shorter side is
``100 * 224 / 87.5 = 256``, takes the centre 224x224, converts to float32 and normalises. Here the
shorter side is ``spec.resize`` and the crop ``spec.size`` (256 and 224 by default, the same
numbers), and the normalisation is the model's own (``PreprocessSpec.mean``/``std``).
"""

from __future__ import annotations

import os

import cv2
import numpy as np
from trtfuse.errors import UserError
from trtfuse.models.prepared import PreprocessSpec

# Bump when the algorithm below changes: it is part of every data cache key.
PREPROCESS_VERSION = 2  # 2: truncated JPEGs are refused (a cache of 1 may hold one)


def read_rgb(path: str | os.PathLike) -> np.ndarray:
    """Decode an image file to uint8 RGB ``[H, W, 3]`` (grey and CMYK JPEGs become 3-channel)."""
    # cv2.imread like the reference (it also applies the EXIF orientation, as the reference gets).
    if not os.path.isfile(path):
        raise UserError(f"image {path} does not exist", "check the dataset folder")
    _check_whole(path)
    bgr = cv2.imread(os.fspath(path), cv2.IMREAD_COLOR)
    if bgr is None:
        raise UserError(
            f"cannot decode image {path}", "remove the file or replace it with a valid JPEG/PNG"
        )
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def _check_whole(path: str | os.PathLike) -> None:
    """A UserError for a truncated JPEG. OpenCV's libjpeg decodes one with a warning on stderr only,
    filling the missing rows with grey: a wrong input, cached and scored as if it were the photo.
    PIL's decoder raises on it; decoded at 1/8 scale (``draft``) it reads every byte cheaply."""
    from PIL import Image, UnidentifiedImageError

    with open(path, "rb") as f:
        if f.read(2) != b"\xff\xd8":  # not a JPEG
            return
    try:
        with Image.open(path) as img:
            img.draft("RGB", (max(1, img.width // 8), max(1, img.height // 8)))
            img.load()
    except UnidentifiedImageError:
        return  # not a JPEG after all: OpenCV's decode says so
    except OSError as e:
        raise UserError(f"image {path} is damaged ({e})",
                        "remove the file or replace it with a whole copy") from None


def resize_shorter_side(img: np.ndarray, shorter: int) -> np.ndarray:
    """Resize keeping the aspect ratio so the shorter side is ``shorter`` (area interpolation).

    Same arithmetic as the reference's ``resize_with_aspectratio``: the longer side is truncated
    with int(), and a square image counts as "wider" (height is the one set exactly).
    """
    height, width = img.shape[:2]
    if height > width:
        new_w, new_h = shorter, int(shorter * height / width)
    else:
        new_w, new_h = int(shorter * width / height), shorter
    return cv2.resize(img, (new_w, new_h), interpolation=cv2.INTER_AREA)


def center_crop(img: np.ndarray, size: int) -> np.ndarray:
    """The centre ``size`` x ``size`` window (the reference's integer rounding)."""
    height, width = img.shape[:2]
    top, left = int((height - size) / 2), int((width - size) / 2)
    return img[top : top + size, left : left + size]


def normalize(rgb: np.ndarray, spec: PreprocessSpec) -> np.ndarray:
    """uint8 RGB ``[H, W, 3]`` -> float32 ``[3, H, W]``: (pixel - mean) / std per channel."""
    mean = np.asarray(spec.mean, dtype=np.float32)
    std = np.asarray(spec.std, dtype=np.float32)
    chw = ((rgb.astype(np.float32) - mean) / std).transpose(2, 0, 1)
    return np.ascontiguousarray(chw)


def preprocess_rgb(rgb: np.ndarray, spec: PreprocessSpec) -> np.ndarray:
    """Decoded uint8 RGB image -> float32 ``[3, size, size]`` model input."""
    return normalize(center_crop(resize_shorter_side(rgb, spec.resize), spec.size), spec)


def preprocess_file(path: str | os.PathLike, spec: PreprocessSpec) -> np.ndarray:
    """Image file -> float32 ``[3, size, size]`` model input."""
    return preprocess_rgb(read_rgb(path), spec)
