"""The Hopper backward's fragment and layout assumptions, checked on the host: nvcc builds
tests/emulation/hopper_backward_fragments.cu against the kernel's own CuTe types and runs it (CuTe
layouts evaluate on the CPU). It exits 0 and prints OK when every assumption of
csrc/attention/hopper/backward_kernel.cuh holds for every instantiated head dim and schedule,
the column split of head dims 192 and 256 and head dim 96's 32-column dQ fragments included. No GPU needed; skipped without nvcc or the
nvidia-cutlass headers."""

import importlib.util
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE = os.path.join(ROOT, "tests", "emulation", "hopper_backward_fragments.cu")


def cutlass_include():
    """The nvidia-cutlass wheel's header folder (as csrc/CMakeLists.txt finds it), or None."""
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or spec.origin is None:
        return None
    include = os.path.join(os.path.dirname(spec.origin), "source", "include")
    return include if os.path.isfile(os.path.join(include, "cute", "tensor.hpp")) else None


def test_hopper_backward_fragment_layouts(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs nvcc on PATH")
    include = cutlass_include()
    if include is None:
        pytest.skip("needs the nvidia-cutlass headers (pip install --no-deps nvidia-cutlass)")
    # With CUDA 13 the CCCL headers (cuda/std) live under the toolkit's include/cccl.
    cccl = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), "include",
                        "cccl")
    program = tmp_path / "hopper_backward_fragments"
    build = subprocess.run(
        [nvcc, "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "--expt-relaxed-constexpr",
         "-I", os.path.join(ROOT, "csrc", "include"), "-I", os.path.join(ROOT, "csrc"),
         "-isystem", include, "-isystem", cccl, SOURCE, "-o", str(program)],
        capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([str(program)], capture_output=True, text=True, timeout=300)
    lines = run.stdout.strip().splitlines()
    assert run.returncode == 0 and lines and lines[-1] == "OK", run.stdout[-4000:]
    # Every head dim of the Hopper backward was checked, the column split's among them.
    for head_dim in (64, 96, 128, 192, 256):
        assert any(f"D={head_dim} " in line and "0 problems" in line for line in lines), head_dim
    assert sum("column split: 0 problems" in line for line in lines) == 4
    assert sum("D=96 M=64 alternating dQ: 0 problems" in line for line in lines) == 2
