"""Preprocessing against independent numpy computations on synthetic images."""

import cv2
import numpy as np
import pytest
from trtfuse.errors import UserError
from trtfuse.models import PreprocessSpec
from trtfuse.preprocess import center_crop, preprocess_file, read_rgb, resize_shorter_side

# Distinct per-channel values, so a swapped channel order changes the result.
SPEC = PreprocessSpec(mean=(10.0, 20.0, 30.0), std=(2.0, 4.0, 8.0))


def block_mean_uint8(rgb: np.ndarray, factor: int) -> np.ndarray:
    """Area interpolation for an exact integer downscale: each output pixel is the mean of its
    factor x factor input block, rounded to the nearest integer. For factor 2 a mean can end in .5;
    it rounds up ((sum + 2) // 4, OpenCV's fixed-point convention). For factor 3 it never can."""
    h, w, c = rgb.shape
    sums = (
        rgb.astype(np.int64).reshape(h // factor, factor, w // factor, factor, c).sum(axis=(1, 3))
    )
    if factor == 2:
        return ((sums + 2) // 4).astype(np.uint8)
    return np.rint(sums / factor**2).astype(np.uint8)


def write_png_rgb(path, rgb: np.ndarray) -> None:
    assert cv2.imwrite(str(path), rgb[:, :, ::-1])  # OpenCV writes BGR; PNG is lossless


def test_landscape_image_by_hand(tmp_path):
    # 768 x 1161 -> shorter side 256 is exactly a third: 256 x 387. The centre crop then starts at
    # row int((256-224)/2) = 16 and column int((387-224)/2) = 81 (81.5 truncates; round() gives 82).
    # A factor of 3 tells area interpolation (3x3 means) from bilinear (which would sample the
    # middle pixel of each block); at factor 2 the two agree.
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, size=(768, 1161, 3), dtype=np.uint8)
    path = tmp_path / "landscape.png"
    write_png_rgb(path, rgb)

    expected_pixels = block_mean_uint8(rgb, 3)[16 : 16 + 224, 81 : 81 + 224].astype(np.float32)
    expected = ((expected_pixels - np.float32([10, 20, 30])) / np.float32([2, 4, 8])).transpose(
        2, 0, 1
    )

    out = preprocess_file(path, SPEC)
    assert out.shape == (3, 224, 224) and out.dtype == np.float32
    np.testing.assert_array_equal(out, expected)


def test_portrait_image_by_hand(tmp_path):
    # 600 x 512 (taller than wide) -> 300 x 256; the crop starts at row int((300-224)/2) = 38,
    # column 16.
    rng = np.random.default_rng(1)
    rgb = rng.integers(0, 256, size=(600, 512, 3), dtype=np.uint8)
    path = tmp_path / "portrait.png"
    write_png_rgb(path, rgb)
    expected_pixels = block_mean_uint8(rgb, 2)[38 : 38 + 224, 16 : 16 + 224].astype(np.float32)
    mean_only = PreprocessSpec(mean=(123.68, 116.78, 103.94), std=(1, 1, 1))  # MLPerf resnet50_v1
    expected = (expected_pixels - np.float32([123.68, 116.78, 103.94])).transpose(2, 0, 1)
    np.testing.assert_array_equal(preprocess_file(path, mean_only), expected)


@pytest.mark.parametrize(
    "shape, resized",
    [
        ((500, 375), (341, 256)),  # the longer side truncates: int(256 * 500 / 375) = int(341.33)
        ((375, 500), (256, 341)),
        ((600, 350), (438, 256)),  # int(438.86): truncated, not rounded
        ((350, 600), (256, 438)),
        ((300, 300), (256, 256)),
        ((100, 150), (256, 384)),  # upscaling keeps the same rule
    ],
)
def test_resize_shorter_side_sizes(shape, resized):
    img = np.zeros((*shape, 3), dtype=np.uint8)
    assert resize_shorter_side(img, 256).shape[:2] == resized


def test_center_crop_window():
    img = np.arange(7 * 9).reshape(7, 9, 1)
    crop = center_crop(img, 4)
    # top = int(3 / 2) = 1, left = int(5 / 2) = 2
    np.testing.assert_array_equal(crop[:, :, 0], img[1:5, 2:6, 0])


def test_read_rgb_converts_bgr_and_grey(tmp_path):
    rgb = np.zeros((4, 4, 3), dtype=np.uint8)
    rgb[..., 0] = 200  # pure red
    write_png_rgb(tmp_path / "red.png", rgb)
    np.testing.assert_array_equal(read_rgb(tmp_path / "red.png"), rgb)

    grey = np.full((8, 8), 77, dtype=np.uint8)
    assert cv2.imwrite(str(tmp_path / "grey.jpg"), grey)
    decoded = read_rgb(tmp_path / "grey.jpg")
    assert decoded.shape == (8, 8, 3)
    assert np.all(decoded[..., 0] == decoded[..., 1]) and np.all(decoded[..., 1] == decoded[..., 2])


def test_unreadable_and_missing_images_are_user_errors(tmp_path):
    bad = tmp_path / "broken.JPEG"
    bad.write_bytes(b"this is not a JPEG")
    with pytest.raises(UserError, match="cannot decode image .*broken.JPEG"):
        read_rgb(bad)
    with pytest.raises(UserError, match="does not exist"):
        read_rgb(tmp_path / "absent.JPEG")


def test_spec_key_depends_on_every_field():
    base = PreprocessSpec()
    assert base.key() == PreprocessSpec(mean=list(base.mean), std=list(base.std)).key()
    variants = [
        PreprocessSpec(size=192, resize=219),
        PreprocessSpec(resize=288),
        PreprocessSpec(mean=(0, 0, 0)),
        PreprocessSpec(std=(1, 1, 1)),
    ]
    assert len({base.key(), *(v.key() for v in variants)}) == 1 + len(variants)


def test_spec_rejects_other_layouts():
    with pytest.raises(UserError, match="NHWC"):
        PreprocessSpec(layout="NHWC")
