"""The dynamic section of a shared library, read without binutils: its SONAME and DT_NEEDED names.

``trtfuse triton serve`` checks with it that the TensorRT backend it runs was linked against the
server library and CUDA runtime of the installed tritonserver, and that a plugin library links the
TensorRT major version of the backend; the build checks what it produced. 64-bit little-endian ELF
(x86_64, aarch64) only: what Triton and TensorRT ship for.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from trtfuse.errors import UserError

_DT_NEEDED, _DT_STRTAB, _DT_SONAME = 1, 5, 14
_PT_LOAD, _PT_DYNAMIC = 1, 2


@dataclass(frozen=True)
class Dynamic:
    soname: str | None
    needed: tuple[str, ...]


def read_dynamic(path: str | os.PathLike) -> Dynamic:
    """SONAME and DT_NEEDED of ``path``; a UserError if it is not a 64-bit little-endian ELF library."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}", "check the path") from None
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise UserError(f"{path} is not a 64-bit little-endian ELF shared library",
                        "pass a .so built for this machine (x86_64 Linux)")
    try:
        phoff, = struct.unpack_from("<Q", data, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
        loads, dynamic = [], None
        for i in range(phnum):
            p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from("<IIQQQQQQ", data,
                                                                                phoff + i * phentsize)
            if p_type == _PT_LOAD:
                loads.append((p_vaddr, p_offset, p_filesz))
            elif p_type == _PT_DYNAMIC:
                dynamic = (p_offset, p_filesz)
        if dynamic is None:
            return Dynamic(None, ())
        entries = []
        for off in range(dynamic[0], dynamic[0] + dynamic[1], 16):
            tag, val = struct.unpack_from("<qQ", data, off)
            if tag == 0:
                break
            entries.append((tag, val))

        def file_offset(vaddr: int) -> int:  # DT_STRTAB is an address: find the segment that maps it
            for start, offset, size in loads:
                if start <= vaddr < start + size:
                    return vaddr - start + offset
            raise ValueError(f"address {vaddr:#x} outside the loaded segments")

        strtab = file_offset(next(v for t, v in entries if t == _DT_STRTAB))

        def string(index: int) -> str:
            end = data.index(b"\0", strtab + index)
            return data[strtab + index:end].decode("utf-8", "replace")

        soname = next((string(v) for t, v in entries if t == _DT_SONAME), None)
        return Dynamic(soname, tuple(string(v) for t, v in entries if t == _DT_NEEDED))
    except (struct.error, StopIteration, ValueError) as e:
        raise UserError(f"{path} is a damaged ELF file ({e})", "rebuild or reinstall it") from None
