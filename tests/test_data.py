"""open_dataset: sources, labels, the .npy cache and its key, errors."""

import importlib.util
import os
import re

import cv2
import numpy as np
import pytest
from trtfuse import data
from trtfuse.data import list_images, open_dataset
from trtfuse.errors import UserError
from trtfuse.models import PreprocessSpec
from trtfuse.preprocess import preprocess_file

SPEC = PreprocessSpec()
SMALL = PreprocessSpec(size=16, resize=20)  # cheap to build and compare


@pytest.fixture(autouse=True)
def trtfuse_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("TRTFUSE_HOME", str(home))
    return home


def write_image(path, seed: int, shape=(40, 60)) -> None:
    rgb = np.random.default_rng(seed).integers(0, 256, size=(*shape, 3), dtype=np.uint8)
    assert cv2.imwrite(str(path), rgb)


@pytest.fixture
def wnid_folder(tmp_path):
    """Three images named <wnid>_*.JPEG beside a 1000-line synsets.txt of made-up wnids."""
    root = tmp_path / "imagenet"
    folder = root / "images"
    folder.mkdir(parents=True)
    (root / "synsets.txt").write_text("".join(f"n{i:08d}\n" for i in range(1000)))
    for seed, (wnid, name) in enumerate([(7, "cat"), (999, "dog"), (0, "fish")]):
        write_image(folder / f"n{wnid:08d}_{name}.JPEG", seed)
    return folder


def cache_files(home):
    folder = home / "data"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_wnid_folder_labels_and_pixels(wnid_folder, trtfuse_home):
    ds = open_dataset(wnid_folder, SMALL, progress=False)
    # Sorted by name; class index = the wnid's line in synsets.txt.
    assert ds.names == ["n00000000_fish.JPEG", "n00000007_cat.JPEG", "n00000999_dog.JPEG"]
    assert ds.labels.tolist() == [0, 7, 999] and ds.labels.dtype == np.int64
    assert len(ds) == 3
    batch = ds.images([2, 0])
    assert batch.shape == (2, 3, 16, 16) and batch.dtype == np.float32
    np.testing.assert_array_equal(batch[0], preprocess_file(wnid_folder / ds.names[2], SMALL))
    np.testing.assert_array_equal(batch[1], preprocess_file(wnid_folder / ds.names[0], SMALL))
    assert re.fullmatch(r"[0-9a-f]{16}-[0-9a-f]{16}\.npy", ds.cache_path.name)
    assert cache_files(trtfuse_home) == [ds.cache_path.name]  # no temporary file left behind


def test_images_is_an_independent_in_ram_copy(wnid_folder):
    ds = open_dataset(wnid_folder, SMALL, progress=False)
    batch = ds.images(np.array([1]))
    assert type(batch) is np.ndarray and batch.flags.writeable
    batch[:] = 0
    assert np.any(ds.images([1]) != 0)


def test_cache_is_reused_without_decoding(wnid_folder, monkeypatch):
    first = open_dataset(wnid_folder, SMALL, progress=False)

    def no_decoding(*args, **kwargs):
        raise AssertionError("the cache should have been used")

    monkeypatch.setattr(data, "preprocess_file", no_decoding)
    second = open_dataset(wnid_folder, SMALL, progress=False)
    assert second.cache_path == first.cache_path
    np.testing.assert_array_equal(second.images(range(3)), first.images(range(3)))


def test_cache_key_follows_content_and_spec(wnid_folder, trtfuse_home):
    base = open_dataset(wnid_folder, SMALL, progress=False).cache_path
    other_spec = open_dataset(
        wnid_folder, PreprocessSpec(size=16, resize=24), progress=False
    ).cache_path
    assert other_spec.name.split("-")[0] == base.name.split("-")[0] != ""
    assert other_spec != base

    target = wnid_folder / "n00000007_cat.JPEG"
    write_image(target, seed=42)  # new content ...
    st = target.stat()
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # ... and a different mtime
    edited = open_dataset(wnid_folder, SMALL, progress=False)
    assert edited.cache_path != base
    np.testing.assert_array_equal(edited.images([1])[0], preprocess_file(target, SMALL))


def test_count_takes_the_first_images(wnid_folder):
    ds = open_dataset(wnid_folder, SMALL, count=2, progress=False)
    assert ds.names == ["n00000000_fish.JPEG", "n00000007_cat.JPEG"] and len(ds) == 2
    with pytest.raises(UserError, match="asked for 4 images"):
        open_dataset(wnid_folder, SMALL, count=4, progress=False)
    with pytest.raises(UserError, match="asked for 0 images"):
        open_dataset(wnid_folder, SMALL, count=0, progress=False)


def test_val_map_folder(tmp_path):
    folder = tmp_path / "val"
    folder.mkdir()
    for i in range(3):
        write_image(folder / f"ILSVRC2012_val_{i + 1:08d}.JPEG", seed=i)
    # val_map order is dataset order, not file-name order.
    (folder / "val_map.txt").write_text(
        "ILSVRC2012_val_00000003.JPEG 65\nILSVRC2012_val_00000001.JPEG 970\n\n"
        "ILSVRC2012_val_00000002.JPEG 230\n"
    )
    ds = open_dataset(folder, SMALL, progress=False)
    assert ds.names == [
        "ILSVRC2012_val_00000003.JPEG",
        "ILSVRC2012_val_00000001.JPEG",
        "ILSVRC2012_val_00000002.JPEG",
    ]
    assert ds.labels.tolist() == [65, 970, 230]
    np.testing.assert_array_equal(ds.images([0])[0], preprocess_file(folder / ds.names[0], SMALL))


def test_synsets_argument_and_shipped_fallback(tmp_path):
    folder = tmp_path / "a" / "b"
    folder.mkdir(parents=True)
    write_image(folder / "n01443537_goldfish.JPEG", 0)
    # No synsets.txt in the folder or its parent: the standard list shipped with trtfuse applies.
    assert list_images(folder).labels.tolist() == [1]
    custom = tmp_path / "custom.txt"
    custom.write_text("".join(f"n{i:08d}\n" for i in range(999)) + "n01443537\n")
    assert list_images(folder, synsets=custom).labels.tolist() == [999]


def test_shipped_synsets_match_the_shared_list(imagenet_sample):
    import importlib.resources

    shipped = importlib.resources.files("trtfuse").joinpath("imagenet_synsets.txt").read_text()
    assert shipped.split() == (imagenet_sample.parent / "synsets.txt").read_text().split()


def test_imagenet_sample_listing(imagenet_sample):
    listing = list_images(imagenet_sample)
    assert len(listing.names) == 750
    wnids = (imagenet_sample.parent / "synsets.txt").read_text().split()
    for name, label in zip(listing.names, listing.labels):
        assert wnids[label] == name.split("_")[0]
    assert listing.labels[listing.names.index("n01440764_tench.JPEG")] == 0


def test_demo_images():
    if (
        importlib.util.find_spec("foolbox") is None
    ):  # foolbox is installed --no-deps: not importable
        pytest.skip("foolbox is not installed")
    listing = list_images("demo")
    assert len(listing.names) == 20
    for name, label in zip(listing.names, listing.labels):
        assert name == f"imagenet_{name.split('_')[1]}_{label}.jpg" and 0 <= label < 1000


def test_demo_without_foolbox(monkeypatch):
    monkeypatch.setattr(data.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError, match="foolbox") as err:
        list_images("demo")
    assert "pip install --no-deps foolbox==3.3.4" in str(err.value)


def test_progress_bar_on_stderr(wnid_folder, capsys):
    open_dataset(wnid_folder, SMALL, progress=True)
    captured = capsys.readouterr()
    assert "preprocessing images" in captured.err and "3/3" in captured.err
    assert captured.out == ""


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda root: root / "absent", "does not exist"),
        (lambda root: root, "holds no images"),
        (lambda root: (root / "file.txt").write_text("x") and root / "file.txt", "is not a folder"),
    ],
)
def test_bad_sources(tmp_path, make, message):
    root = tmp_path / "src"
    root.mkdir()
    with pytest.raises(UserError, match=message):
        open_dataset(make(root), SPEC, progress=False)


def test_badly_named_images_and_unknown_wnids(tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    write_image(folder / "holiday.jpg", 0)
    with pytest.raises(UserError, match="not named <wnid>_"):
        list_images(folder)
    (folder / "holiday.jpg").rename(folder / "n99999999_unknown.jpg")
    with pytest.raises(UserError, match="n99999999 is not in the synset list"):
        list_images(folder)


def test_bad_val_map(tmp_path):
    folder = tmp_path / "val"
    folder.mkdir()
    (folder / "val_map.txt").write_text("a.JPEG 1\nb.JPEG cat\n")
    with pytest.raises(UserError, match="line 2"):
        list_images(folder)
    (folder / "val_map.txt").write_text("missing.JPEG 3\n")
    with pytest.raises(UserError, match="missing.JPEG"):
        open_dataset(folder, SPEC, progress=False)


def test_unreadable_image_leaves_no_cache(wnid_folder, trtfuse_home):
    (wnid_folder / "n00000005_broken.JPEG").write_bytes(b"\xff\xd8 not really a JPEG")
    with pytest.raises(UserError, match="cannot decode image .*n00000005_broken.JPEG"):
        open_dataset(wnid_folder, SMALL, progress=False)
    assert cache_files(trtfuse_home) == []  # nothing half-written, no temporary file


def test_truncated_cache_is_rebuilt(wnid_folder):
    path = open_dataset(wnid_folder, SMALL, progress=False).cache_path
    path.write_bytes(path.read_bytes()[:200])
    ds = open_dataset(wnid_folder, SMALL, progress=False)
    np.testing.assert_array_equal(
        ds.images([0])[0], preprocess_file(wnid_folder / ds.names[0], SMALL)
    )


def test_unwritable_cache_is_a_user_error(wnid_folder, tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    monkeypatch.setenv("TRTFUSE_HOME", str(blocker))
    with pytest.raises(UserError, match="cannot write the image cache") as err:
        open_dataset(wnid_folder, SMALL, progress=False)
    assert "TRTFUSE_HOME" in str(err.value)


def test_cache_file_follows_the_umask(wnid_folder):
    old = os.umask(0o022)
    try:
        path = open_dataset(wnid_folder, SMALL, progress=False).cache_path
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644  # readable by others sharing TRTFUSE_HOME
