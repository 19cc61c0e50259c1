"""conv_rows_f32 (a 2-D fp32 convolution of stride 1 as W times the input's patches, read from a ring of
input rows) on the CPU: what it covers and refuses, one TF32 product only where the contract allows TF32,
every seed compiling for sm_90a without spills, and the kernel itself run on the host: compiled from the
rendered template with the host's compiler, each block's threads as host threads (__syncthreads a
barrier), the m16n8k8 TF32 product emulated warp by warp from the lanes' fragments as the PTX ISA lays
them out, cp.async as a plain copy. Its output must be the convolution of the TF32-rounded operands (one
product), or within fp32 rounding of the exact one (three): ragged channel, column and row tiles,
padding, input channels not a multiple of 8, a 5x5 kernel, a band of rows cut short."""

import ctypes
import subprocess

import numpy as np
import pytest
import torch

from cuforge.kernels.conv_rows import ConvRowsF32
from cuforge.kernels.families import families_for
from template_helpers import HOST_CUDA, conv_problem, family_configs, host_library

FAM = ConvRowsF32()

# The device helpers the template includes, on the host. A warp's mma gathers its lanes' fragments
# (each lane one host thread) behind a barrier of the warp's 32 threads, each lane computes its four
# sums from the whole 16x8 and 8x8 operands, and a second barrier frees the staging for the next mma.
HOST_MMA = r"""
#define __align__(n)
struct float2 { float x, y; };
static inline float2 make_float2(float x, float y) { return {x, y}; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static float host_smem[1 << 16];
static pthread_barrier_t warp_barrier[8];
static unsigned stage_a[8][32][4], stage_b[8][32][2];
static inline unsigned to_tf32(float x) {  // cvt.rna.tf32.f32: to nearest, ties away from zero
    unsigned u; memcpy(&u, &x, 4); return (u + 0x1000u) & ~0x1fffu;
}
static inline void split_tf32(float x, unsigned& big, unsigned& small) {
    big = to_tf32(x); small = to_tf32(x - __uint_as_float(big));
}
static void mma(float* d, const unsigned* a, const unsigned* b, bool add) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    memcpy(stage_a[w][lane], a, 16); memcpy(stage_b[w][lane], b, 8);
    pthread_barrier_wait(&warp_barrier[w]);
    for (int e = 0; e < 4; ++e) {
        const int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
        double s = 0;
        for (int k = 0; k < 8; ++k) {
            const float av = __uint_as_float(stage_a[w][(row % 8) * 4 + k % 4][(row >= 8) + 2 * (k >= 4)]);
            const float bv = __uint_as_float(stage_b[w][col * 4 + k % 4][k >= 4]);
            s += (double)av * bv;
        }
        d[e] = (add ? d[e] : 0.f) + (float)s;
    }
    pthread_barrier_wait(&warp_barrier[w]);
}
static inline void mma_tf32_first(float* d, const unsigned* a, const unsigned* b) { mma(d, a, b, false); }
static inline void mma_tf32(float* d, const unsigned* a, const unsigned* b) { mma(d, a, b, true); }
static inline void cp_async4(float* smem, const float* gmem, bool ok) { *smem = ok ? *gmem : 0.f; }
static inline void cp_async_commit() {}
template <int N> static inline void cp_async_wait() {}
"""
HOST_RUN = r"""
extern "C" void run(const float* x, const float* w, float* y, int H, int W, int H_out, int W_out, int C_out,
                    int gx, int gy, int threads) {
    for (int i = 0; i < threads / 32; ++i) pthread_barrier_init(&warp_barrier[i], nullptr, 32);
    host_grid(gx, gy, 1, threads, 1, [=] { conv_rows_f32(x, w, y, H, W, H_out, W_out, C_out); });
    for (int i = 0; i < threads / 32; ++i) pthread_barrier_destroy(&warp_barrier[i]);
}
"""


def host_kernel(tmp_path, p, config):
    src = FAM.render(config, p).source
    head = src[:src.index("__device__ __forceinline__ void split_tf32")]
    body = src[src.index("__device__ __forceinline__ float epilogue("):]
    body = body.replace("extern __shared__ __align__(16) float smem[];", "float* smem = host_smem;")
    assert FAM.smem_bytes(config, FAM.matched(p)) <= 4 << 16
    return host_library(tmp_path, HOST_CUDA + HOST_MMA + head + body + HOST_RUN)


def tf32(t: torch.Tensor) -> torch.Tensor:
    """Round to TF32 as cvt.rna does (to nearest, ties away from zero)."""
    u = t.float().contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    return (((u + 0x1000) & ~0x1FFF) & 0xFFFFFFFF).to(torch.int32).view(torch.float32).to(t.dtype)


def run_on_host(tmp_path, p, config, x, w):
    f = FAM.matched(p)
    h_out, w_out = f.out_spatial
    y = np.zeros((f.n, f.c_out, h_out, w_out), dtype=np.float32)
    xs, ws = np.ascontiguousarray(x.numpy()), np.ascontiguousarray(w.numpy())
    ptr = ctypes.POINTER(ctypes.c_float)
    threads = config["WM"] * config["WN"] * 32
    gx = -(-f.c_out // config["BM"]) * -(-w_out // config["BN"]) * -(-h_out // config["NT"])
    host_kernel(tmp_path, p, config).run(xs.ctypes.data_as(ptr), ws.ctypes.data_as(ptr), y.ctypes.data_as(ptr),
                                         f.spatial[0], f.spatial[1], h_out, w_out, f.c_out, gx, f.n, threads)
    return torch.from_numpy(y)


HOST_CASES = [
    # 40 channels out (a short channel block), 21 columns (a short column tile), 7 rows in bands of 4
    ("nn.Conv2d(16, 40, 3, padding=1, bias=False)", "(2, 16, 7, 21)",
     dict(BM=32, BN=64, WM=1, WN=2, NT=4, STAGES=2)),
    # 3 input channels padded to 8 with zeros, a 5x5 kernel, 2 rows of padding, one stage
    ("nn.Conv2d(3, 16, 5, padding=2, bias=False)", "(1, 3, 6, 9)", dict(BM=32, BN=64, WM=1, WN=2, NT=8, STAGES=1)),
    # unpadded: the output shrinks by the kernel; two column tiles; three stages, rows cut short
    ("nn.Conv2d(8, 16, 3, bias=False)", "(1, 8, 9, 70)", dict(BM=32, BN=64, WM=2, WN=1, NT=4, STAGES=3)),
]


@pytest.mark.parametrize("layer, x_shape, config", HOST_CASES, ids=[c[0] + c[1] for c in HOST_CASES])
@pytest.mark.parametrize("math", ["tf32", "tf32x3"])
def test_the_kernel_on_the_host_computes_the_convolution(tmp_path, layer, x_shape, config, math):
    p = conv_problem(tmp_path, layer, x_shape).under("pytorch")
    c = {**config, "MATH": math}
    assert FAM.valid(c, p), c
    torch.manual_seed(0)
    conv = eval(layer, {"nn": torch.nn})
    x = torch.randn(*eval(x_shape))
    w = conv.weight.detach()
    y = run_on_host(tmp_path, p, c, x, w)
    pad = conv.padding
    if math == "tf32":  # the products of the rounded operands, summed in fp32 (here: exactly)
        want = torch.nn.functional.conv2d(tf32(x).double(), tf32(w).double(), padding=pad)
        assert torch.allclose(y.double(), want, rtol=1e-5, atol=1e-5), (y.double() - want).abs().max()
    else:  # three products: fp32 accuracy against the exact convolution
        want = torch.nn.functional.conv2d(x.double(), w.double(), padding=pad)
        assert torch.allclose(y.double(), want, rtol=1e-5, atol=1e-5), (y.double() - want).abs().max()
        # and further from the one-product result than from the exact one: the small parts were summed
        once = torch.nn.functional.conv2d(tf32(x).double(), tf32(w).double(), padding=pad)
        assert (y.double() - want).abs().max() < (once - want).abs().max()


def test_covers_2d_stride_1_convolutions_after_the_implicit_gemm(tmp_path):
    p = conv_problem(tmp_path, "nn.Conv2d(16, 128, 3)", "(2, 16, 20, 24)", "torch.relu(y) + self.bias")
    assert FAM.supports(p) is None
    names = [f.name for f in families_for(p)[0]]
    assert names.index("conv_tf32x3_sm90") < names.index("conv_rows_f32")  # three products: not timed against it
    launch = FAM.launch(FAM.seeds(p)[0], p)
    assert launch.grid.startswith("(cdiv(C_out, ") and launch.grid.endswith(", 2)")


@pytest.mark.parametrize("layer, shape, first", [
    ("nn.Conv2d(16, 128, 3)", "(2, 16, 66, 130)", "conv_rows_f32"),          # level1/63's kind: 64 of W's rows fit
    ("nn.Conv2d(64, 128, 3)", "(2, 64, 66, 130)", "conv_tf32x3_sm90"),       # level1/55's kind: only 32 fit
    ("nn.Conv2d(64, 128, 1)", "(2, 64, 66, 130)", "conv_pointwise_f32"),     # a 1x1: the GEMM of x as it lies
])
def test_leads_under_pytorch_only_where_w_fits_64_rows_at_a_time(tmp_path, layer, shape, first):
    p = conv_problem(tmp_path, layer, shape)
    assert FAM.supports(p) is None
    assert families_for(p.under("pytorch"))[0][0].name == first
    assert not FAM.leads(p)  # under fp32 (three products) it is not measured against the implicit GEMM


@pytest.mark.parametrize("layer, shape, why", [
    ("nn.Conv2d(16, 32, 3, stride=2)", "(1, 16, 12, 12)", "stride 1"),
    ("nn.Conv2d(16, 32, 3, dilation=2)", "(1, 16, 12, 12)", "stride 1"),
    ("nn.Conv2d(16, 32, 3, groups=2)", "(1, 16, 12, 12)", "grouped"),
    ("nn.Conv1d(16, 32, 3)", "(1, 16, 12)", "2-D"),
    ("nn.Conv3d(4, 8, 3)", "(1, 4, 6, 6, 6)", "2-D"),
    ("nn.ConvTranspose2d(16, 8, 3)", "(1, 16, 6, 6)", "transposed"),
    ("nn.Conv2d(64, 64, 7)", "(1, 64, 12, 12)", "too large"),  # K = 64 x 49: W's rows do not fit
])
def test_other_convolutions_are_refused_with_the_reason(tmp_path, layer, shape, why):
    p = conv_problem(tmp_path, layer, shape)
    assert why in (FAM.supports(p) or ""), FAM.supports(p)


def test_whatever_it_covers_has_seeds(tmp_path):
    # the last preset takes the least shared memory of any config: where it fits, a seed exists
    for layer, shape in (("nn.Conv2d(64, 64, 3, padding=1)", "(1, 64, 14, 14)"), ("nn.Conv2d(24, 8, 5)", "(1, 24, 9, 9)")):
        p = conv_problem(tmp_path, layer, shape)
        assert FAM.supports(p) is None and FAM.seeds(p), layer


def test_one_tf32_product_only_where_the_contract_allows_tf32(tmp_path):
    p = conv_problem(tmp_path, "nn.Conv2d(16, 64, 3, padding=1)", "(2, 16, 32, 32)")
    assert {c["MATH"] for c in FAM.seeds(p)} == {"tf32x3"}
    assert not FAM.valid({**FAM.seeds(p)[0], "MATH": "tf32"}, p)
    q = p.under("pytorch")
    assert FAM.seeds(q)[0]["MATH"] == "tf32"


def test_no_seed_spills(tmp_path):
    # level1/63's kind (3x3 over 16 channels into 128), small: every seed through ptxas -v (which names any
    # spill), and a random config compiled as well
    p = conv_problem(tmp_path, "nn.Conv2d(16, 128, 3)", "(2, 16, 40, 40)", "torch.relu(y) * self.bias").under("pytorch")
    seeds = FAM.seeds(p)
    for c in family_configs(FAM, p, 1)[len(seeds):]:
        compile(FAM.render(c, p).module_source(), "<wrapper>", "exec")
    for c in seeds:
        compile(FAM.render(c, p).module_source(), "<wrapper>", "exec")
        src = tmp_path / "k.cu"
        src.write_text(FAM.render(c, p).source)
        r = subprocess.run(["nvcc", "-arch=sm_90a", "-cubin", "-Xptxas", "-v", "-o", str(tmp_path / "k.cubin"), str(src)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        assert "0 bytes spill stores" in r.stderr, (c, r.stderr[-2000:])
