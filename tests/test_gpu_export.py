"""Exports on a GPU, end to end: a real template search, then the exported torch package (its own
generated tests, run against the references on this GPU) and the CMake library (built with nvcc,
its C++ test run, and its C API called through ctypes against torch)."""

import ctypes
import os
import shutil
import subprocess
import sys

import pytest
import torch

from cuforge.agent.config import RunConfig
from cuforge.agent.run import execute
from cuforge.export import export_run
from cuforge.results.store import Store

pytestmark = pytest.mark.gpu
HGEMM = ["hgemm/64_64_64", "hgemm/128_128_128", "hgemm/256_64_1024", "hgemm/1024_1024_1024"]


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """Two real runs: hgemm shapes and the level1 softmax (a generic operator)."""
    d = tmp_path_factory.mktemp("gpu-export")
    store = Store(d / "cuforge.db")
    hgemm_run, _ = execute(RunConfig(suite="hgemm-small", problems=HGEMM, islands=1, generations=4, gpus="0"),
                           store, None, False)
    softmax_run, _ = execute(RunConfig(suite="level1", problems=["softmax"], islands=1, generations=3, gpus="0"),
                             store, None, False)
    return d, hgemm_run, softmax_run


def _install(pkg_dir, site):
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
                        str(site), str(pkg_dir)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.parametrize("which", ["hgemm", "softmax"])
def test_exported_torch_package_passes_its_generated_gpu_tests(searched, which, tmp_path):
    d, hgemm_run, softmax_run = searched
    run_id = hgemm_run if which == "hgemm" else softmax_run
    name = f"gpu_{which}_ops"
    # min_speedup 0: every correct exportable kernel goes in, whether or not it won, so this test
    # checks the export's mechanics deterministically (benchmarks/export_speed.py measures speed).
    result = export_run(d / "cuforge.db", run_id, "torch", tmp_path / "pkg", name, min_speedup=0.0)
    assert result.plan.kernels
    _install(tmp_path / "pkg", tmp_path / "site")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"))
    t = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "pkg" / "tests")],
                       capture_output=True, text=True, env=env, timeout=900, cwd=tmp_path)
    assert t.returncode == 0, t.stdout[-4000:] + t.stderr[-2000:]
    assert "skipped" not in t.stdout.splitlines()[-1]  # every GPU test ran


def test_exported_cmake_library_builds_passes_ctest_and_matches_torch(searched, tmp_path):
    if shutil.which("cmake") is None:
        pytest.skip("cmake not installed")
    d, hgemm_run, _ = searched
    result = export_run(d / "cuforge.db", hgemm_run, "cmake", tmp_path / "lib", "cuforge", archs="sm_90a",
                        min_speedup=0.0)
    build = tmp_path / "build"
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    for cmd in (["cmake", "-S", str(tmp_path / "lib"), "-B", str(build), *gen, "-DCMAKE_BUILD_TYPE=Release"],
                ["cmake", "--build", str(build), "-j", "8"],
                ["ctest", "--test-dir", str(build), "--output-on-failure"]):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    lib = ctypes.CDLL(str(build / "libcuforge.so"))
    tuned = {e.shapes for op in result.plan.ops for e in op.entries}
    for m, n, k in [(64, 64, 64), (128, 128, 128), (256, 64, 1024), (1024, 1024, 1024), (72, 40, 24)]:
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        b = torch.randn(k, n, device="cuda", dtype=torch.float16)
        c = torch.empty(m, n, device="cuda", dtype=torch.float16)
        torch.cuda.synchronize()
        rc = lib.cuforge_hgemm(ctypes.c_void_p(a.data_ptr()), ctypes.c_void_p(b.data_ptr()), ctypes.c_void_p(c.data_ptr()),
                               m, n, k, ctypes.c_void_p(0))
        torch.cuda.synchronize()
        assert rc == 0, (m, n, k, rc)
        want = (a.double() @ b.double())
        torch.testing.assert_close(c.double(), want, atol=1e-2, rtol=1e-2, msg=lambda s: f"{(m, n, k)} tuned={((m, k), (k, n)) in tuned}: {s}")


CLUSTER16 = r"""
extern "C" __global__ void __cluster_dims__(16, 1, 1) cluster16(int* out) {
    unsigned rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    if (threadIdx.x == 0) out[blockIdx.x] = (int)rank;
}
"""


class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


def _cubin(tmp_path, source):
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    cubin = tmp_path / "k.cubin"
    r = subprocess.run([nvcc, "-cubin", "-arch=sm_90a", "-o", str(cubin), "-x", "cu", "-"], input=source,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return cubin.read_bytes()


def _launcher_library(tmp_path, symbol, source):
    """The kernel unit with cuforge's C launcher appended, built as a shared library."""
    from cuforge.export.cmake_lib import kernel_unit

    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    src = tmp_path / "unit.cu"
    src.write_text("#include <cuda_runtime.h>\n" + kernel_unit(symbol, source))
    so = tmp_path / "libunit.so"
    r = subprocess.run([nvcc, "-shared", "-Xcompiler", "-fPIC", "-arch=sm_90a", "-o", str(so), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lib = ctypes.CDLL(str(so))
    fn = getattr(lib, f"{symbol}_launch")
    fn.argtypes = [Dim3, Dim3, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p]
    return fn


def _loaded_function(cubin, symbol, shared_mem):
    from cuforge.export.torch_runtime._loader import _Driver

    torch.cuda.init()
    drv = _Driver()
    drv.make_current(drv.primary_context(0))
    code, module = drv.load(cubin)
    assert code == 0
    return drv, drv.function(module, symbol, shared_mem)


def test_exported_launchers_allow_clusters_past_the_portable_size(tmp_path):
    """A kernel compiled for 16-block clusters (cluster split-K of 16) launches from both exports: the
    torch package's driver loader and the C library's launcher allow non-portable cluster sizes for it."""
    drv, fn = _loaded_function(_cubin(tmp_path, CLUSTER16), "cluster16", 0)
    allowed = ctypes.c_int()
    assert drv.lib.cuFuncGetAttribute(ctypes.byref(allowed), 14, fn) == 0 and allowed.value == 1
    out = torch.full((32,), -1, dtype=torch.int32, device="cuda")
    holder = ctypes.c_uint64(out.data_ptr())
    params = (ctypes.c_void_p * 1)(ctypes.addressof(holder))
    drv.launch(fn, (32, 1, 1), (32, 1, 1), 0, torch.cuda.current_stream().cuda_stream, params)
    torch.cuda.synchronize()
    assert out.tolist() == list(range(16)) * 2
    launch = _launcher_library(tmp_path, "cluster16", CLUSTER16)
    out.fill_(-1)
    torch.cuda.synchronize()
    pointer = ctypes.c_void_p(out.data_ptr())
    args = (ctypes.c_void_p * 1)(ctypes.addressof(pointer))
    assert launch(Dim3(32, 1, 1), Dim3(32, 1, 1), 0, None, args) == 0
    torch.cuda.synchronize()
    assert out.tolist() == list(range(16)) * 2


# 40 KB of static shared memory: with 16 KB of dynamic, 56 KB in all, past the 48 KB a kernel may use
# without the opt-in, though the dynamic part alone is under it (top-k's histograms and cached row).
STATIC40 = r"""
extern "C" __global__ void static40(int* out, int n_dynamic) {
    __shared__ int fixed[10240];
    extern __shared__ int dynamic[];
    for (int i = threadIdx.x; i < 10240; i += blockDim.x) fixed[i] = 1;
    for (int i = threadIdx.x; i < n_dynamic; i += blockDim.x) dynamic[i] = 2;
    __syncthreads();
    if (threadIdx.x == 0) {
        int s = 0;
        for (int i = 0; i < 10240; ++i) s += fixed[i];
        for (int i = 0; i < n_dynamic; ++i) s += dynamic[i];
        out[blockIdx.x] = s;
    }
}
"""


def test_launchers_opt_in_when_static_and_dynamic_shared_memory_pass_48_kb(tmp_path):
    """cuforge's runtime, the torch package's loader and the C library's launcher each launch a kernel whose
    static (40 KB) and dynamic (16 KB) shared memory together pass 48 KB."""
    from cuforge.runtime import compile_cuda

    n_dynamic, dynamic_bytes, want = 4096, 16384, [10240 + 2 * 4096] * 2
    out = torch.full((2,), -1, dtype=torch.int32, device="cuda")
    compile_cuda(STATIC40).kernel("static40")((2,), (256,), out, n_dynamic, shared_mem=dynamic_bytes)
    torch.cuda.synchronize()
    assert out.tolist() == want
    drv, fn = _loaded_function(_cubin(tmp_path, STATIC40), "static40", dynamic_bytes)
    out.fill_(-1)
    holder, count = ctypes.c_uint64(out.data_ptr()), ctypes.c_int(n_dynamic)
    params = (ctypes.c_void_p * 2)(ctypes.addressof(holder), ctypes.addressof(count))
    drv.launch(fn, (2, 1, 1), (256, 1, 1), dynamic_bytes, torch.cuda.current_stream().cuda_stream, params)
    torch.cuda.synchronize()
    assert out.tolist() == want
    launch = _launcher_library(tmp_path, "static40", STATIC40)
    out.fill_(-1)
    torch.cuda.synchronize()
    pointer = ctypes.c_void_p(out.data_ptr())
    args = (ctypes.c_void_p * 2)(ctypes.addressof(pointer), ctypes.addressof(count))
    assert launch(Dim3(2, 1, 1), Dim3(256, 1, 1), dynamic_bytes, None, args) == 0
    torch.cuda.synchronize()
    assert out.tolist() == want
