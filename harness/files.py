"""Folders that appear whole or not at all: built beside their place, then swapped in."""

from __future__ import annotations

from pathlib import Path


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
