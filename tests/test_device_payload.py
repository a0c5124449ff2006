"""The device payload's pieces (tools/pieces.sh, as tools/stage_payload.sh and tools/stage_triton.sh write them) and
their gatherer on the GPU machine (tools/payload_unpack.sh), one piece a call, in folders moved for a dry run."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("zstd") is None, reason="needs the zstd command")


def _payload(tmp_path: Path) -> Path:
    """A small payload (the real one's folders, incompressible bytes) as tar.zst."""
    root = tmp_path / "root"
    rng = np.random.default_rng()
    for rel, size in (("e2e/models/resnet50/model.int8.onnx", 70_000), ("e2e/images0/eval_int8_0.npy", 30_000),
                      ("mlperf/tools/accuracy-imagenet.py", 500), ("native/tomli-2.5.0-py3-none-any.whl", 900)):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    plain = tmp_path / "payload.tar"
    with tarfile.open(plain, "w") as t:
        t.add(root, arcname=".")
    subprocess.run(["zstd", "-q", "--long=27", str(plain), "-o", str(tmp_path / "payload.tar.zst")], check=True)
    return root


def _write_pieces(tmp_path: Path, archive: Path, out: Path, first: int, piece: int) -> str:
    script = f'source {REPO}/tools/pieces.sh; write_pieces "$@"'
    p = subprocess.run(["bash", "-c", script, "-", str(archive), str(out), str(REPO / "tools" / "payload_unpack.sh"),
                        str(first), str(piece)], capture_output=True, text=True, check=True)
    return p.stdout


def _call(tmp_path: Path, pieces: Path, names: list[str]) -> subprocess.CompletedProcess:
    """One device call: a fresh tree carrying these pieces, unpack.sh and MANIFEST."""
    call = tmp_path / f"call-{'-'.join(names)}" / "pay"
    shutil.rmtree(call.parent, ignore_errors=True)
    call.mkdir(parents=True)
    for name in [*names, "unpack.sh", "MANIFEST"]:
        shutil.copy(pieces / name, call / name)
    env = {**os.environ, "PAYLOAD_DEST": str(tmp_path / "dest"), "PAYLOAD_PIECES": str(tmp_path / "keep"),
           "TRTFUSE_E2E_STASH": str(tmp_path / "stash")}
    return subprocess.run(["bash", str(call / "unpack.sh")], env=env, capture_output=True, text=True)


def test_pieces_gathered_over_calls_unpack_once_whole(tmp_path):
    root = _payload(tmp_path)
    archive, pieces = tmp_path / "payload.tar.zst", tmp_path / "pay"
    said = _write_pieces(tmp_path, archive, pieces, 40_000, 30_000)
    names = sorted(p.name for p in pieces.glob("piece*"))
    assert names == ["piece00", "piece01", "piece02", "piece03"][:len(names)] and len(names) >= 3, names
    assert (pieces / "MANIFEST").read_text().split()[0] == str(len(names)) and f"{len(names)} piece(s)" in said
    assert b"".join((pieces / n).read_bytes() for n in names) == archive.read_bytes()
    assert (pieces / "piece00").stat().st_size == 40_000

    for i, name in enumerate(names[:-1]):
        p = _call(tmp_path, pieces, [name])
        said = f"payload: {i + 1} of {len(names)} pieces; missing"
        assert p.returncode == 0 and said in p.stdout, p.stdout + p.stderr
        assert not (tmp_path / "dest").exists()
    p = _call(tmp_path, pieces, [names[-1]])
    assert p.returncode == 0 and "PAYLOAD READY: e2e mlperf native" in p.stdout, p.stdout + p.stderr
    for f in root.rglob("*"):
        if f.is_file():
            assert (tmp_path / "dest" / f.relative_to(root)).read_bytes() == f.read_bytes(), f
    assert (tmp_path / "stash" / "models" / "resnet50" / "model.int8.onnx").is_file()
    assert not (tmp_path / "keep").exists()
    assert "READY (already)" in _call(tmp_path, pieces, [names[0]]).stdout


def test_a_piece_of_another_staging_is_refused_in_one_line(tmp_path):
    _payload(tmp_path)
    pieces = tmp_path / "pay"
    _write_pieces(tmp_path, tmp_path / "payload.tar.zst", pieces, 60_000, 60_000)
    first = bytearray((pieces / "piece00").read_bytes())
    first[100] ^= 0xFF
    (pieces / "piece00").write_bytes(bytes(first))
    _call(tmp_path, pieces, ["piece00"])
    p = _call(tmp_path, pieces, ["piece01"])
    assert p.returncode == 1 and "checksum mismatch" in p.stderr and "rm -rf" in p.stderr
    assert not (tmp_path / "dest").exists()


def test_the_triton_payload_gathers_the_same_way(tmp_path):
    root = tmp_path / "root"
    for rel in ("triton/site-packages/tritonclient/__init__.py", "triton/numpy1/numpy/__init__.py",
                "triton/backend/tensorrt/libtriton_tensorrt.so", "triton/e2e/models/efficientnet-lite0/model.json"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(os.urandom(20_000))
    with tarfile.open(tmp_path / "t.tar", "w") as t:
        t.add(root / "triton", arcname="triton")
    subprocess.run(["zstd", "-q", "--long=27", str(tmp_path / "t.tar"), "-o", str(tmp_path / "t.tar.zst")], check=True)
    pieces = tmp_path / "triton"
    subprocess.run(["bash", "-c", f'source {REPO}/tools/pieces.sh; write_pieces "$@"', "-", str(tmp_path / "t.tar.zst"),
                    str(pieces), str(REPO / "tools" / "triton_unpack.sh"), "50000", "50000"], check=True,
                   capture_output=True)
    env = {**os.environ, "TRITON_DEST": str(tmp_path / "dest"), "TRITON_PIECES": str(tmp_path / "keep"),
           "TRTFUSE_E2E_STASH": str(tmp_path / "stash"), "TRT85": str(tmp_path / "trt")}
    said = [subprocess.run(["bash", str(pieces / "unpack.sh")], env=env, capture_output=True, text=True).stdout
            for _ in range(2)]
    assert "TRITON READY: " in said[0] and "READY (already)" in said[1], said
    assert (tmp_path / "dest" / "backend" / "tensorrt" / "libtriton_tensorrt.so").is_file()
    assert (tmp_path / "stash" / "models" / "efficientnet-lite0" / "model.json").is_file()
