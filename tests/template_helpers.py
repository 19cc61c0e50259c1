"""Shared by the template-family tests: writing a KernelBench-format problem file around one forward
expression, compiling a family's seeds plus random valid configs with NVRTC, running an fp32 chain's
C body on the CPU, and judging kernels on a GPU."""

import random

import pytest

from cuforge.problems.loader import load_files
from cuforge.runtime import compile_cuda
from cuforge.sandbox.protocol.evaluation import EvalConfig

# What the GPU family tests judge with: eager as the one baseline, short timing, no profile. They judge
# correctness; speed is the benchmarks' (benchmarks/), measured side by side.
CFG = EvalConfig(baselines=("torch",), max_timing_s=0.3, min_samples=5, profile=False)

PROBLEM = """
import torch
import torch.nn as nn
import torch.nn.functional as F
{cuforge}
class Model(nn.Module):
    def __init__(self):
        super().__init__()
{init}
    def forward(self, {args}):
        return {expr}
def get_inputs():
    return [{inputs}]
def get_init_inputs():
    return []
"""


def problem_from_expr(tmp_path, expr, inputs, args="a, b", init="        pass", cuforge="", prefix="t"):
    """Load a problem whose forward returns `expr` over `args` (built from `inputs`)."""
    f = tmp_path / f"p{abs(hash((expr, inputs, init, cuforge))) % 10**12}.py"
    f.write_text(PROBLEM.format(expr=expr, inputs=inputs, args=args, init=init, cuforge=cuforge))
    (p,), skipped = load_files([f], id_prefix=prefix)
    assert not skipped, skipped
    return p


def conv_problem(tmp_path, layer, x_shape, tail="y"):
    """A problem whose forward is `tail` over y = self.conv(a) (`layer`, an nn.Conv*d expression), with
    self.bias a (C_out, 1, 1) parameter the tail may use."""
    out_channels = layer.split("(")[1].split(",")[1]
    return problem_from_expr(tmp_path, f"(lambda y: {tail})(self.conv(a))", f"torch.randn{x_shape}", args="a",
                             init=f"        self.conv = {layer}\n        self.bias = nn.Parameter(torch.randn({out_channels}, 1, 1))")


def family_configs(fam, p, n_random, seed=0):
    """The family's seeds plus up to `n_random` other distinct valid configs, drawn at random; fewer
    when the knob space holds no more (a draw-until-enough loop never ends on a family with four valid
    configs, so the draws are bounded)."""
    rng = random.Random(seed)
    configs = fam.seeds(p)
    extra = 0
    for _ in range(256 * n_random):
        if extra == n_random:
            break
        c = {k: rng.choice(v) for k, v in fam.knobs.items()}
        if c not in configs and fam.valid(c, p):
            configs.append(c)
            extra += 1
    return configs


# What a compile check asks for: NVRTC's fastest compile (nvcc's -Ofast-compile=max). It parses, checks
# and assembles the same source (a C++ or inline-PTX error fails as at full optimization) without the
# optimizer, about 4x less CPU for the suite's ~2,000 compiles; kernels that run (the sandbox's, the GPU
# tests') and the spill checks (nvcc -Xptxas -v) compile at full optimization.
CHECK_COMPILE = ("-Ofast-compile=max",)


def smoke_compile(fam, p, n_random):
    """The family's seeds and `n_random` random valid configs compile with NVRTC for sm_90a, and each
    wrapper is valid Python."""
    for c in family_configs(fam, p, n_random):
        cand = fam.render(c, p)
        compile(cand.module_source(), "<wrapper>", "exec")
        stages = [(fam, c, p)]
        if hasattr(fam, "split"):  # a staged family: each stage's kernel, rendered by its own family
            cut, (h, t) = fam.matched(p), fam.split(fam.complete(c))
            stages = [(fam.head, h, cut.head), (fam.tail, t, cut.tail)]
        if hasattr(fam, "stage_configs"):  # a pipeline: likewise, stage by stage
            parts = fam.matched(p)
            stages = [(s.family, sc, s.problem) for s, sc in zip(parts, fam.stage_configs(fam.complete(c), parts))]
        for family, config, part in stages:
            stage = family.render(config, part)
            if "torch_call" in stage.meta:  # a PyTorch call between the kernels (a dropout): nothing to compile
                continue
            mod = compile_cuda(stage.source, arch="sm_90a", options=(*stage.launch.options, *CHECK_COMPILE))
            assert family.name in mod.signatures and len(mod.cubin) > 0, config


def assert_all_ok(sup, fam, p, configs, cfg=CFG, what=()):
    """Each config's kernel judged by the GPU worker `sup`: every one must come out ok (`what` names the
    case in a failure)."""
    for c in configs:
        ev = sup.evaluate(p, fam.render(c, p), cfg)
        assert ev.status == "ok", (*what, p.id, c, ev.status, ev.message)


# The fp32 convolution families on mma.sync TF32: judged under PyTorch's default flags (one product
# allowed where cuDNN runs TF32) and under strict fp32.
TF32_DEFAULT = EvalConfig(baselines=("torch",), max_timing_s=0.3, min_samples=5, profile=False, precision="pytorch")
TF32_STRICT = EvalConfig(baselines=("torch",), max_timing_s=0.3, min_samples=5, profile=False, precision="fp32")


def assert_three_products_ok(sup, fam, p, configs, what=()):
    """Under the fp32 contract `fam` (MATH tf32 or tf32x3) offers three products only, each judged ok."""
    assert fam.supports(p) is None, fam.supports(p)
    assert {c["MATH"] for c in configs} == {"tf32x3"}
    assert_all_ok(sup, fam, p, configs, CFG, what=what)


def conv_bn_residual_problem(tmp_path, layer, x_shape, out_shape):
    """A ResNet block's tail in eval mode: relu(batch_norm(`layer`(a)) + r), r of `out_shape`, the batch
    norm's running statistics not the identity (so its channel must be read at the flat row)."""
    channels = out_shape[1]
    return problem_from_expr(tmp_path, "torch.relu(self.bn(self.conv(a)) + r)",
                             f"torch.randn{tuple(x_shape)}, torch.randn{tuple(out_shape)}", "a, r",
                             f"        self.conv = {layer}\n        self.bn = nn.BatchNorm2d({channels})\n"
                             "        self.bn.running_mean.uniform_(-1, 1)\n        self.bn.running_var.uniform_(0.5, 2)\n"
                             "        self.eval()", prefix="gpu")


def assert_one_product_ok_and_a_downgrade_under_fp32(sup, fam, p, what=()):
    """`p` under the pytorch contract: `fam`'s first one-TF32-product seeds judged ok, and the first of
    them judged a downgrade (or wrong) under the fp32 contract."""
    ones = [c for c in fam.seeds(p) if c["MATH"] == "tf32"]
    assert ones
    assert_all_ok(sup, fam, p, ones[:3], TF32_DEFAULT, what=what)
    strict = sup.evaluate(p, fam.render(ones[0], p), TF32_STRICT)
    assert strict.status in ("cheat:precision_downgrade", "wrong_output"), (*what, strict.status, strict.message)


def check_family(sup, fam, p, cfg=CFG, n_random=2):
    """The family covers `p`, and its seeds plus `n_random` random valid configs all come out ok."""
    assert fam.supports(p) is None, fam.supports(p)
    assert_all_ok(sup, fam, p, family_configs(fam, p, n_random), cfg)


def skip_unless_sm90(sup, why):
    import pytest

    if (sup.info or sup.start()).get("compute_capability") != "9.0":
        pytest.skip(why)


def half_gemm_problem(tmp_path, m, n, k, dtype="bfloat16"):
    """C = A @ B over [M, K] and [K, N] inputs of `dtype`."""
    return problem_from_expr(tmp_path, "a @ b", f"torch.randn({m}, {k}, dtype=torch.{dtype}), torch.randn({k}, {n}, dtype=torch.{dtype})")


def half_linear_problem(tmp_path, m, n, k, expr="self.linear(x)", dtype="bfloat16"):
    """`expr` over x [M, K] and self.linear, an nn.Linear(K, N) of `dtype` with a bias."""
    return problem_from_expr(tmp_path, expr, f"torch.randn({m}, {k}, dtype=torch.{dtype})", "x",
                             f"        self.linear = nn.Linear({k}, {n}, dtype=torch.{dtype})")


HOST_CHAIN = r"""
#include <math.h>
#include <string.h>
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
extern "C" void run(long long n, long long cols, const float* x, float* out, const void* const* t) {
    for (long long i = 0; i < n; ++i) {
        const long long r = i / cols, c = i % cols;
        float v = x ? x[i] : 0.f;
PARAMS
BODY
        out[i] = v;
    }
}
"""


# CUDA C++ on the host: what a kernel template's code needs to compile with the host's compiler and run with
# real threads. A block's threads run at once as host threads (host_grid), __syncthreads a barrier among
# them and a kernel's __shared__ variables its function statics: the block's own interleavings, on the CPU.
HOST_CUDA = r"""
#include <math.h>
#include <string.h>
#include <pthread.h>
#include <algorithm>
#include <thread>
#include <vector>
using std::min;
using std::max;
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(...)
#define __shared__ static
struct Dim3 { int x, y, z; };
static thread_local Dim3 threadIdx = {0, 0, 0};
static Dim3 blockIdx = {0, 0, 0}, gridDim = {1, 1, 1};
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
template <typename T> static inline T __ldg(const T* p) { return *p; }
static inline float rsqrtf(float x) { return 1.f / sqrtf(x); }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static pthread_barrier_t block_barrier;
static inline void __syncthreads() { pthread_barrier_wait(&block_barrier); }
template <typename F> static void host_grid(int gx, int gy, int gz, int bx, int by, F kernel) {
    gridDim = {gx, gy, gz};
    for (int z = 0; z < gz; ++z) for (int y = 0; y < gy; ++y) for (int x = 0; x < gx; ++x) {
        blockIdx = {x, y, z};
        pthread_barrier_init(&block_barrier, nullptr, bx * by);
        std::vector<std::thread> threads;
        for (int t = 0; t < bx * by; ++t) threads.emplace_back([=] { threadIdx = {t % bx, t / bx, 0}; kernel(); });
        for (auto& th : threads) th.join();
        pthread_barrier_destroy(&block_barrier);
    }
}
"""
# bf16 on the host: its 16 bits as storage, widened by shifting them into a float's top half and rounded to
# nearest even the other way, as cuda_bf16.h computes them.
HOST_BF16 = r"""
typedef unsigned short __nv_bfloat16;
static inline float __bfloat162float(__nv_bfloat16 b) { unsigned u = (unsigned)b << 16; float f; memcpy(&f, &u, 4); return f; }
static inline __nv_bfloat16 __float2bfloat16_rn(float v) {
    unsigned u; memcpy(&u, &v, 4);
    return (__nv_bfloat16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
"""
# _convert.cu.j2's conversions on the host, for fp32 and bf16 elements (the template's own specializations use
# CUDA's intrinsics); its narrow16 comes from the rendered kernel itself (device_function).
HOST_CONVERT = HOST_BF16 + r"""
static inline float to_float(float x) { return x; }
static inline float to_float(__nv_bfloat16 b) { return __bfloat162float(b); }
static inline void store_as(float v, float& o) { o = v; }
static inline void store_as(float v, __nv_bfloat16& o) { o = __float2bfloat16_rn(v); }
template <typename T> static inline void widen16(const uint4& raw, float* out) {
    const T* e = reinterpret_cast<const T*>(&raw);
    for (int k = 0; k < 16 / (int)sizeof(T); ++k) out[k] = to_float(e[k]);
}
"""


def device_function(src, head):
    """The text of the function in rendered kernel `src` that starts with `head`, to its closing brace."""
    start = src.index(head)
    return src[start:src.index("\n}\n", start) + 3]


NARROW16 = "template <typename T> __device__ __forceinline__ uint4 narrow16("


def host_library(tmp_path, text):
    """C++ source `text` built with the host's compiler into a shared library and loaded (skips the test
    where there is no compiler). One file per source: the loader hands back a library already loaded
    from the same path, whatever the file now holds."""
    import ctypes
    import shutil
    import subprocess

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    name = f"host{abs(hash(text)) % 10**12}"
    src, lib = tmp_path / f"{name}.cpp", tmp_path / f"{name}.so"
    src.write_text(text)
    r = subprocess.run([cxx, "-O1", "-shared", "-fPIC", "-o", str(lib), str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return ctypes.CDLL(str(lib))


def chain_on_host(tmp_path, chain, anchor, operands):
    """An fp32 chain's C body compiled with the host's C++ compiler and run on the CPU over every element
    of `anchor` (row and column as an indexed kernel passes them), reading `operands` (the chain's
    tensors, in its order): the values the GPU kernel computes, checked without a GPU."""
    params = "\n".join(f"        const {'bool' if i in chain.masks else 'float'}* {chain.prefix}{i} = "
                       f"(const {'bool' if i in chain.masks else 'float'}*)t[{i}];" for i in range(len(chain.tensors)))
    body = "\n".join("        " + line for line in chain.body.splitlines())
    return run_on_host(host_library(tmp_path, HOST_CHAIN.replace("PARAMS", params).replace("BODY", body)), anchor, operands)


def run_on_host(lib, anchor, operands):
    """A host library's run(n, cols, x, out, tensors) over `anchor` and the chain's `operands`: its output."""
    import ctypes

    import torch

    x = anchor.contiguous()
    held = [o.contiguous() for o in operands]
    out = torch.empty_like(x)
    ptrs = (ctypes.c_void_p * max(1, len(held)))(*[o.data_ptr() for o in held])
    lib.run(ctypes.c_longlong(x.numel()), ctypes.c_longlong(x.shape[-1]), ctypes.c_void_p(x.data_ptr()),
            ctypes.c_void_p(out.data_ptr()), ptrs)
    return out
