"""Labelled image sets, preprocessed once into a memory-mapped float32 cache.

``open_dataset(source, spec)`` finds the images and their labels, and returns a
``PreprocessedDataset`` backed by ``$TRTFUSE_HOME/data/<dataset-key>-<spec-key>.npy``. The first
call decodes and preprocesses every image (progress bar on stderr); later calls only map the file,
so no timed run ever decodes a JPEG. The dataset key hashes the image names, sizes and mtimes, so
an edited folder gets a fresh cache.

Sources:
  * an ImageNet validation folder in the MLPerf layout: images + ``val_map.txt``
    (lines ``<file> <label>``)
  * a folder of ``<wnid>_*.JPEG`` files, labelled through a synset list (class index = line number):
    ``synsets=``, else ``synsets.txt`` in the folder or its parent, else the standard list shipped
    with trtfuse
  * ``"demo"``: the 20 labelled ImageNet photos shipped inside the foolbox package
"""

from __future__ import annotations

import errno
import hashlib
import importlib.resources
import importlib.util
import os
import re
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from trtfuse.errors import UserError
from trtfuse.models.prepared import PreprocessSpec, trtfuse_home
from trtfuse.preprocess import PREPROCESS_VERSION, preprocess_file

IMAGE_SUFFIXES = {".jpeg", ".jpg", ".png"}
VAL_MAP = "val_map.txt"
SYNSETS = "synsets.txt"
WNID_NAME = re.compile(r"^(n\d{8})_")
# foolbox/data/imagenet_<nn>_<class index>.jpg
DEMO_NAME = re.compile(r"^imagenet_\d+_(\d+)\.jpg$")
SOURCE_HELP = (
    "pass an ImageNet validation folder (images + val_map.txt), a folder of "
    "<wnid>_*.JPEG files (+ synsets.txt), or 'demo'"
)


@dataclass
class ImageList:
    """The images of a source, in dataset order, and their ImageNet class indices (0..999)."""

    folder: Path
    names: list[str]
    labels: np.ndarray


class PreprocessedDataset:
    """Preprocessed images (a read-only memory map of the cache) with their labels."""

    def __init__(
        self,
        names: list[str],
        labels: np.ndarray,
        array: np.ndarray,
        spec: PreprocessSpec,
        cache_path: Path,
        folder: Path,
    ):
        self.names = names
        self.labels = labels
        self.spec = spec
        self.cache_path = cache_path
        self.folder = folder
        self._array = array

    def __len__(self) -> int:
        return len(self.names)

    def images(self, indices) -> np.ndarray:
        """float32 ``[n, C, H, W]`` copy in RAM of the samples at ``indices``."""
        return self._array[np.asarray(indices, dtype=np.int64).reshape(-1)]

    def __repr__(self) -> str:
        return f"PreprocessedDataset({self.folder}, {len(self)} images, cache={self.cache_path})"


def open_dataset(
    source: str | os.PathLike,
    spec: PreprocessSpec,
    count: int | None = None,
    progress: bool = True,
    synsets: str | os.PathLike | None = None,
) -> PreprocessedDataset:
    """The first ``count`` images (all when None) of ``source``, preprocessed as ``spec`` says."""
    listing = list_images(source, synsets)
    if count is not None:
        if count < 1 or count > len(listing.names):
            raise UserError(
                f"asked for {count} images but {listing.folder} has {len(listing.names)}",
                f"ask for 1 to {len(listing.names)} images",
            )
        listing = ImageList(listing.folder, listing.names[:count], listing.labels[:count])

    paths = [listing.folder / name for name in listing.names]
    cache = trtfuse_home() / "data" / f"{dataset_key(paths)}-{spec.key()}.npy"
    shape = (len(paths), 3, spec.size, spec.size)
    array = _open_cache(cache, shape)
    if array is None:
        try:
            _build_cache(cache, paths, spec, progress)
        except OSError as e:  # unreadable images are UserErrors already: this is the cache side
            raise UserError(
                f"cannot write the image cache {cache} ({e.strerror or e})",
                "free disk space or set TRTFUSE_HOME to a writable folder with room for it",
            ) from e
        array = _open_cache(cache, shape)
        assert array is not None, f"{cache} was just written but cannot be read back"
    return PreprocessedDataset(listing.names, listing.labels, array, spec, cache, listing.folder)


def list_images(source: str | os.PathLike, synsets: str | os.PathLike | None = None) -> ImageList:
    """Find the images of ``source`` and their labels (no decoding)."""
    if str(source) == "demo":
        return _demo_images()
    folder = Path(source).expanduser()
    if not folder.exists():
        raise UserError(f"dataset folder {folder} does not exist", SOURCE_HELP)
    if not folder.is_dir():
        raise UserError(f"dataset {folder} is not a folder", SOURCE_HELP)
    if (folder / VAL_MAP).is_file():
        return _val_map_images(folder)
    return _wnid_named_images(folder, synsets)


def dataset_key(paths: list[Path]) -> str:
    """Hash of the image names, sizes and modification times (and the preprocessing version)."""
    digest = hashlib.sha256(f"trtfuse-preprocess-v{PREPROCESS_VERSION}\n".encode())
    for path in paths:
        try:
            st = path.stat()
        except OSError as e:
            raise UserError(
                f"cannot read image {path} ({e.strerror})",
                "check the dataset folder and its label list",
            ) from e
        digest.update(f"{path.name}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def _val_map_images(folder: Path) -> ImageList:
    names, labels = [], []
    for number, line in enumerate((folder / VAL_MAP).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split()
        if len(fields) != 2 or not fields[1].isdigit() or int(fields[1]) >= 1000:
            raise UserError(
                f"{folder / VAL_MAP} line {number} is not '<file> <label 0..999>': {line!r}",
                "fix or regenerate val_map.txt",
            )
        names.append(fields[0])
        labels.append(int(fields[1]))
    if not names:
        raise UserError(f"{folder / VAL_MAP} lists no images", "fix or regenerate val_map.txt")
    return ImageList(folder, names, np.asarray(labels, dtype=np.int64))


def _wnid_named_images(folder: Path, synsets: str | os.PathLike | None) -> ImageList:
    names = sorted(
        p.name for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES
    )
    if not names:
        raise UserError(f"dataset folder {folder} holds no images and no {VAL_MAP}", SOURCE_HELP)
    index = _synset_index(folder, synsets)
    labels = []
    for name in names:
        match = WNID_NAME.match(name)
        if not match:
            raise UserError(
                f"{folder} has no {VAL_MAP} and {name} is not named <wnid>_*.JPEG",
                f"add {VAL_MAP} (lines '<file> <label>') or rename the images",
            )
        if match.group(1) not in index:
            raise UserError(
                f"{name}: {match.group(1)} is not in the synset list",
                "pass the 1000-class ImageNet synset list (synsets=/--synsets)",
            )
        labels.append(index[match.group(1)])
    return ImageList(folder, names, np.asarray(labels, dtype=np.int64))


def _synset_index(folder: Path, synsets: str | os.PathLike | None) -> dict[str, int]:
    """wnid -> class index from the synset list that applies to ``folder``."""
    if synsets is not None:
        path = Path(synsets).expanduser()
        if not path.is_file():
            raise UserError(
                f"synset list {path} does not exist",
                "pass a text file with the 1000 ImageNet wnids, one per line",
            )
        text = path.read_text()
    else:
        candidates = [folder / SYNSETS, folder.parent / SYNSETS]
        found = next((p for p in candidates if p.is_file()), None)
        text = (
            found.read_text()
            if found
            else importlib.resources.files("trtfuse").joinpath("imagenet_synsets.txt").read_text()
        )
        path = found or Path("imagenet_synsets.txt (shipped with trtfuse)")
    wnids = [line.split()[0] for line in text.splitlines() if line.strip()]
    if len(wnids) != 1000 or len(set(wnids)) != 1000:
        raise UserError(
            f"synset list {path} has {len(set(wnids))} distinct wnids, not 1000",
            "use the standard ImageNet-1k list, one wnid per line in class order",
        )
    return {wnid: i for i, wnid in enumerate(wnids)}


def _demo_images() -> ImageList:
    spec = importlib.util.find_spec("foolbox")
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            "the demo images come with foolbox, which is not installed",
            "pip install --no-deps foolbox==3.3.4",
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "data"
    files = sorted(os.listdir(folder)) if folder.is_dir() else []
    matches = [m for m in map(DEMO_NAME.match, files) if m]
    if not matches:
        raise UserError(
            f"{folder} holds no imagenet_*.jpg sample images",
            "reinstall foolbox: pip install --no-deps --force-reinstall foolbox==3.3.4",
        )
    # The number at the end of each name is the image's ImageNet class index (0..999).
    return ImageList(
        folder,
        [m.group(0) for m in matches],
        np.asarray([int(m.group(1)) for m in matches], dtype=np.int64),
    )


def _open_cache(path: Path, shape: tuple[int, ...]) -> np.ndarray | None:
    """The cache as a read-only plain-ndarray view of its memory map; None if absent or unusable."""
    try:
        array = np.load(path, mmap_mode="r")
    except (OSError, ValueError):
        return None
    if array.shape != shape or array.dtype != np.float32:
        return None
    # A plain ndarray view: fancy indexing then yields ordinary in-RAM arrays, not np.memmap.
    return array.view(np.ndarray)


def _build_cache(path: Path, paths: list[Path], spec: PreprocessSpec, progress: bool) -> None:
    """Preprocess every image into ``path``: written to a temporary file, then renamed."""
    from tqdm import tqdm

    path.parent.mkdir(parents=True, exist_ok=True)
    # A unique name beside the target (not mkstemp: its 0600 mode would make the cache private).
    tmp = path.parent / f".{path.stem}.{os.getpid()}.{uuid.uuid4().hex[:8]}.npy.tmp"
    try:
        out = np.lib.format.open_memmap(
            tmp, mode="w+", dtype=np.float32, shape=(len(paths), 3, spec.size, spec.size)
        )
        _reserve_disk_space(tmp)
        bar = tqdm(
            paths, desc="preprocessing images", unit="img", file=sys.stderr, disable=not progress
        )
        for i, image_path in enumerate(bar):
            out[i] = preprocess_file(image_path, spec)
        out.flush()
        del out
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _reserve_disk_space(path: Path) -> None:
    """Allocate the whole (sparse) cache file now: a full disk then fails here with ENOSPC, not
    with a SIGBUS when a page of the memory map is first written."""
    if not hasattr(os, "posix_fallocate"):
        return
    with open(path, "r+b") as f:
        try:
            os.posix_fallocate(f.fileno(), 0, os.fstat(f.fileno()).st_size)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # unsupported: carry on sparse
                raise
