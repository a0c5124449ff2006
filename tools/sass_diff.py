#!/usr/bin/env python3
"""Compare the SASS of every kernel in two builds of the kernels library, per (arch, kernel function).

A refactor of plugins/ that only moves code must leave every kernel's instruction stream as it was; this is the
check that needs no GPU. Each side is a built library (a .so or .o) or a git revision of this checkout, whose
plugins/ folder is exported and built with ``trtfuse.plugin_build`` (kernels only) into a cache folder:

    tools/sass_diff.py rev:HEAD~1 rev:HEAD                       # two commits
    tools/sass_diff.py /tmp/before/libtrtfuse_kernels.so build/plugins/libtrtfuse_kernels.so
    tools/sass_diff.py rev:main . --archs 80,90a                 # '.': the working tree's plugins/

Kernels compare by their instructions with the encodings (register allocation included) and, where those differ,
by their opcodes and operands with register numbers masked, so that a report says whether only the allocation
moved. Exit status: 0 when every kernel is byte-identical and both sides have the same kernels, 1 otherwise,
2 on a usage or build error. Needs nvcc (to build revisions), cuobjdump and nvdisasm: the CUDA toolkit's, or the
wheels `pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm` (found through the `nvidia` package).
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(tempfile.gettempdir()) / "trtfuse_sass_diff"

_CODE_FOR = re.compile(r"^\s*code for (sm_\w+)")
_FUNCTION = re.compile(r"^\s*Function : (\S+)")
# /*0040*/   IMAD.MOV.U32 R1, RZ, RZ, c[0x0][0x28] ;   /* 0x000000... */  (the second encoding word is on its own line)
_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*/\*\s*(0x[0-9a-f]+)\s*\*/")
_ENC2 = re.compile(r"^\s*/\*\s*(0x[0-9a-f]+)\s*\*/\s*$")
_ANON = re.compile(r"_GLOBAL__N__[0-9a-f]+_")
_REG = re.compile(r"\b(U?R|U?P|B)\d+\b")


def die(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def build_side(spec: str, archs: str) -> Path:
    """A library path for `spec`: a file as is; 'rev:REV' or '.' (the working tree) built from its plugins/."""
    if not spec.startswith("rev:") and spec != ".":
        path = Path(spec)
        if not path.is_file():
            die(f"{spec} is not a file (give a built .so/.o, 'rev:REV' or '.')")
        return path
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "plugins"
        if spec == ".":
            shutil.copytree(ROOT / "plugins", src)
        else:
            rev = spec[4:]
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "plugins"], capture_output=True)
            if archive.returncode != 0:
                die(f"git archive {rev} plugins failed: {archive.stderr.decode().strip()}")
            subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        digest = hashlib.sha256()
        for p in sorted(src.rglob("*")):
            if p.is_file():
                digest.update(str(p.relative_to(src)).encode() + b"\0" + p.read_bytes())
        out = CACHE / f"{digest.hexdigest()[:16]}-{archs.replace(',', '_')}"
        lib = out / "libtrtfuse_kernels.so"
        if lib.is_file():
            print(f"sass_diff: {spec}: cached {lib}", file=sys.stderr)
            return lib
        print(f"sass_diff: {spec}: building the kernels library for {archs} (minutes)", file=sys.stderr)
        res = subprocess.run([sys.executable, "-m", "trtfuse.plugin_build", "build", "--kernels-only",
                              "--source", str(src), "--build-dir", str(out), "--archs", archs],
                             capture_output=True, text=True)
        if res.returncode != 0 or not lib.is_file():
            die(f"building {spec} failed:\n{res.stdout}{res.stderr}")
        return lib


def find_cuobjdump() -> str:
    """$CUOBJDUMP, PATH, the CUDA toolkit beside nvcc, or the nvidia-cuda-cuobjdump wheel (pip install it)."""
    import os

    candidates = [os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(os.path.realpath(nvcc)).parent / "cuobjdump"))
        text = Path(nvcc).read_bytes()[:4096]
        if m := re.search(rb"(/\S+)/nvcc", text):   # a wrapper script that execs the real nvcc
            candidates.append(m.group(1).decode() + "/cuobjdump")
    try:
        import nvidia

        for base in nvidia.__path__:
            candidates += [str(p) for p in Path(base).glob("*/bin/cuobjdump")]
    except ImportError:
        pass
    for c in candidates:
        if c and Path(c).is_file():
            return c
    die("cuobjdump not found: set CUOBJDUMP, install the CUDA toolkit's, or `pip install nvidia-cuda-cuobjdump`")
    return ""


def disasm_env() -> dict[str, str]:
    """The environment for cuobjdump: with nvdisasm on PATH (it runs it; the nvidia-cuda-nvdisasm wheel's too)."""
    import os

    env = dict(os.environ)
    if shutil.which("nvdisasm"):
        return env
    dirs = []
    try:
        import nvidia

        dirs = [str(p.parent) for base in nvidia.__path__ for p in Path(base).glob("*/bin/nvdisasm")]
    except ImportError:
        pass
    env["PATH"] = os.pathsep.join(dirs + [env.get("PATH", "")])
    return env


def kernels(lib: Path) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """{(arch, function): [(instruction text, encoding)]} from cuobjdump -sass."""
    cuobjdump = find_cuobjdump()
    res = subprocess.run([cuobjdump, "-sass", str(lib)], capture_output=True, text=True, env=disasm_env())
    if res.returncode != 0:
        die(f"cuobjdump -sass {lib} failed: {res.stderr.strip()}")
    return parse_sass(res.stdout)


def parse_sass(text: str) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """{(arch, function): [(instruction text, encoding)]} of cuobjdump -sass's output."""
    out: dict[tuple[str, str], list[tuple[str, str]]] = {}
    arch, cur, dup = None, None, set()
    for line in text.splitlines():
        if m := _CODE_FOR.match(line):
            arch, cur = m.group(1), None
        elif m := _FUNCTION.match(line):
            # an anonymous namespace's mangled name carries a hash of the source's path: the same kernel built from
            # another folder (a revision's export) has another name
            key = (arch, _ANON.sub("_GLOBAL__N__anon_", m.group(1)))
            if key in out:
                dup.add(key)
            cur = out.setdefault(key, [])
        elif cur is not None and (m := _INSTR.match(line)):
            cur.append((" ".join(m.group(2).split()), m.group(3)))
        elif cur is not None and cur and (m := _ENC2.match(line)):
            text, enc = cur[-1]
            cur[-1] = (text, enc + m.group(1)[2:])
    for key in sorted(dup):
        print(f"warning: {key[1]} ({key[0]}) is compiled in more than one translation unit", file=sys.stderr)
    return out


def short(name: str) -> str:
    demangled = subprocess.run(["c++filt", name], capture_output=True, text=True).stdout.strip()
    return demangled or name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("before", help="a built library, rev:REV, or '.' (the working tree)")
    ap.add_argument("after", help="as before")
    ap.add_argument("--archs", default="80,90a", help="archs to build revisions for (default %(default)s)")
    ap.add_argument("--only-arch", action="append", default=[],
                    help="compare only this SASS arch (e.g. sm_90a; repeatable): for a single-arch .o against a library")
    args = ap.parse_args(argv)
    a, b = kernels(build_side(args.before, args.archs)), kernels(build_side(args.after, args.archs))
    if args.only_arch:
        a = {k: v for k, v in a.items() if k[0] in args.only_arch}
        b = {k: v for k, v in b.items() if k[0] in args.only_arch}
    same = changed_regs = changed = 0
    ok = True
    for key in sorted(set(a) | set(b)):
        arch, fn = key
        if key not in a or key not in b:
            print(f"ONLY IN {'AFTER' if key in b else 'BEFORE'}  {arch}  {short(fn)}")
            ok = False
            continue
        if a[key] == b[key]:
            same += 1
            continue
        ok = False
        masked_a = [_REG.sub(r"\1#", t) for t, _ in a[key]]
        masked_b = [_REG.sub(r"\1#", t) for t, _ in b[key]]
        first = next((i for i, (x, y) in enumerate(zip(a[key], b[key])) if x != y), min(len(a[key]), len(b[key])))
        what = "registers only" if masked_a == masked_b else "instructions"
        changed_regs += what == "registers only"
        changed += what != "registers only"
        print(f"CHANGED ({what})  {arch}  {short(fn)}: {len(a[key])} -> {len(b[key])} instructions, first "
              f"difference at #{first}")
    print(f"sass_diff: {same} kernels byte-identical, {changed} with other instructions, {changed_regs} with other "
          f"registers only, of {len(set(a) | set(b))} (arch, kernel) pairs")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
