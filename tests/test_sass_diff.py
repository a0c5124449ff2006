"""tools/sass_diff.py's reading of cuobjdump -sass output (no CUDA needed): kernels keyed by (arch, function), the
encodings joined, anonymous namespaces' path hashes ignored."""

import importlib.util
from pathlib import Path

TOOL = Path(__file__).resolve().parent.parent / "tools" / "sass_diff.py"


def load():
    spec = importlib.util.spec_from_file_location("sass_diff", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


SAMPLE = """
Fatbin elf code:
================
arch = sm_90a
code version = [1,8]
host = linux
compile_size = 64bit

	code for sm_90a
		Function : _ZN7trtfuse7avgpool43_GLOBAL__N__13d6f974_10_avgpool_cu_fabb897119avgpool_int8_kernelEPKaPaS4_iii
	.headerflags	@"EF_CUDA_TEXMODE_UNIFIED EF_CUDA_64BIT_ADDRESS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                       /* 0x00000a00ff017b82 */
                                                                                /* 0x000fe20000000800 */
        /*0010*/                   S2R R0, SR_TID.X ;                           /* 0x0000000000007919 */
                                                                                /* 0x000e220000002100 */
		..........

	code for sm_80
		Function : _Z3fooPi
        /*0000*/                   EXIT ;                                       /* 0x000000000000794d */
                                                                                /* 0x000fea0003800000 */
"""


def test_parse_keys_by_arch_and_function_and_joins_encodings():
    sd = load()
    k = sd.parse_sass(SAMPLE)
    assert set(k) == {("sm_90a", "_ZN7trtfuse7avgpool43_GLOBAL__N__anon_10_avgpool_cu_fabb897119avgpool_int8_kernelEPKaPaS4_iii"),
                      ("sm_80", "_Z3fooPi")}
    avg = k[("sm_90a", next(n for a, n in k if a == "sm_90a"))]
    assert avg == [("LDC R1, c[0x0][0x28]", "0x00000a00ff017b82000fe20000000800"),
                   ("S2R R0, SR_TID.X", "0x0000000000007919000e220000002100")]
    # the same kernel built from another folder (another anonymous-namespace hash) has the same key
    other = sd.parse_sass(SAMPLE.replace("13d6f974", "e4960134"))
    assert other == k
