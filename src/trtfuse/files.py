"""Folders that appear whole or not at all (built beside their place, then swapped in), and files' digests."""

from __future__ import annotations

import hashlib
from pathlib import Path

from trtfuse.errors import UserError


def swap_into_place(built: Path, target: Path, old: Path) -> None:
    """Rename ``built`` to ``target``; an existing ``target`` is first renamed to ``old`` (the caller
    removes it) and put back if the swap fails, so ``target`` is always the old folder or the new one.
    Renames within one file system: ``built`` and ``old`` must be on ``target``'s."""
    if not (target.exists() or target.is_symlink()):
        built.rename(target)
        return
    target.rename(old)
    try:
        built.rename(target)
    except BaseException:
        old.rename(target)
        raise


def _file_in_the_way(path: Path) -> Path | None:
    """The first part of ``path`` that is there but not a folder, if any."""
    for part in [*reversed(path.parents), path]:
        if part.exists() and not part.is_dir():
            return part
    return None


def check_folder_path(path, flag: str) -> None:
    """A UserError now, before any long work, if a file sits where ``path``'s folders must go."""
    path = Path(path).expanduser()
    blocker = _file_in_the_way(path)
    if blocker is not None:
        raise UserError(f"{flag} {path}: {blocker} is a file, not a folder",
                        f"give {flag} a folder (or a path where one can be made)")


def new_folder(path: Path, flag: str = "--output-dir") -> None:
    """Make the new folder ``path`` and its parents; a UserError naming the path if it cannot be."""
    check_folder_path(path, flag)
    try:
        path.mkdir(parents=True)
    except FileExistsError:
        raise UserError(f"{path} already exists", "give a new folder") from None
    except OSError as e:
        raise UserError(f"cannot make the folder {path}: {e.strerror}",
                        f"give {flag} a folder you can write to") from None


def sha256(path: Path) -> str:
    """The file's SHA-256, read in 1 MiB blocks (accuracy logs and plugin libraries run to hundreds of MB)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
