"""The nvcc-style flags NVRTC compiles take (runtime._with_extra): the fast compile the tests' compile
checks use still fails on what a full compile fails on, and an unknown flag or level is refused by name."""

import pytest

from cuforge.runtime import CompileError, compile_cuda

KERNEL = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }\n'


def test_the_fast_compile_gives_a_kernel_and_fails_where_a_full_compile_fails():
    assert "k" in compile_cuda(KERNEL, arch="sm_90a", options=("-Ofast-compile=max",)).signatures
    for broken in (KERNEL.replace("*=", "*=="),  # C++
                   'extern "C" __global__ void k(float* x) { asm volatile("mov.b32 %0, %1, %1;" : "=f"(x[0]) : "f"(x[1])); }\n'):
        for options in ((), ("-Ofast-compile=max",)):
            with pytest.raises(CompileError):
                compile_cuda(broken, arch="sm_90a", options=options)


@pytest.mark.parametrize("flag, named", [("-Ofast-compile=fastest", "0, min, mid or max"), ("-Xptxas", "-Xptxas")])
def test_an_unknown_flag_or_level_is_refused_by_name(flag, named):
    with pytest.raises(CompileError, match=named):
        compile_cuda(KERNEL, arch="sm_90a", options=(flag,))

