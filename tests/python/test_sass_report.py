"""The parsers of scripts/sass-report (what the Hopper kernels compile to): a ptxas -v log and a
cuobjdump listing with known contents go in, those contents must come out."""

import importlib.machinery
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_loader = importlib.machinery.SourceFileLoader("sass_report",
                                               os.path.join(ROOT, "scripts", "sass-report"))
_spec = importlib.util.spec_from_loader("sass_report", _loader)
sass_report = importlib.util.module_from_spec(_spec)
_loader.exec_module(sass_report)

PTXAS_LOG = """\
ptxas info    : (C7517) warpgroup.wait is injected in around line 4609 by compiler to allow use of registers defined by GMMA in function '_Z6kernelA'
ptxas info    : Compiling entry function '_Z6kernelA' for 'sm_90a'
ptxas info    : Function properties for _Z6kernelA
    72 bytes stack frame, 92 bytes spill stores, 132 bytes spill loads
ptxas info    : Used 168 registers, used 16 barriers, 72 bytes cumulative stack size
ptxas info    : Compiling entry function '_Z6kernelB' for 'sm_90a'
ptxas info    : Function properties for _Z6kernelB
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 38 registers, used 0 barriers
"""

CUOBJDUMP = """\
\t\tFunction : _Z6kernelA
\t.headerflags\t@"EF_CUDA_64BIT_ADDRESS EF_CUDA_SM90"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                 /* 0x00000a00ff017b82 */
                                                                          /* 0x000e640000000800 */
        /*0010*/                   STL [R1], R4 ;                         /* 0x0000000401007387 */
        /*0020*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT ;  /* 0x00000000 */
        /*0030*/                   LDL R9, [R1+0x94] ;                    /* 0x0000940001097983 */
        /*0040*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ; /* 0x00000000 */
        /*0050*/                   STL [R1+0x8], R5 ;                     /* 0x0000080501007387 */
        /*0060*/                   EXIT ;                                 /* 0x000000000000794d */
"""


def test_ptxas_log_gives_each_entry_its_registers_spills_and_notices():
    kernels = sass_report.parse_ptxas_log(PTXAS_LOG)
    assert kernels["_Z6kernelA"] == {"notices": ["C7517"], "stack": 72, "spill_stores": 92,
                                     "spill_loads": 132, "registers": 168}
    assert kernels["_Z6kernelB"] == {"notices": [], "stack": 0, "spill_stores": 0,
                                     "spill_loads": 0, "registers": 38}


def test_sass_is_normalised_and_its_main_loop_spills_counted():
    instructions = sass_report.normalize_sass(CUOBJDUMP)
    assert instructions == ["LDC R1, c[0x0][0x28]", "STL [R1], R4",
                            "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT",
                            "LDL R9, [R1+0x94]",
                            "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24, gsb0",
                            "STL [R1+0x8], R5", "EXIT"]
    assert sass_report.loop_summary(instructions) == {
        "instructions": 7, "stl": 2, "ldl": 1, "loop_stl": 0, "loop_ldl": 1}


def test_a_spec_names_one_instantiation():
    assert "launch_backward<DType::kBFloat16, 128>" in sass_report.translation_unit("bwd:128")
    forward = sass_report.translation_unit("fwd:256:0")
    assert "launch_forward<DType::kBFloat16, 256, 0>" in forward
    assert forward.startswith("#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED")
    for bad in ("bwd", "fwd:128", "gemm:128"):
        with pytest.raises(SystemExit, match=bad):
            sass_report.translation_unit(bad)
