"""The convolution kernel's two epilogues run on the host: a tile's sums in fragment order straight to the
output (store_tile, the one the GPU tests have checked for long) and staged in shared memory then run over 8
pixels of a channel a thread (store_tile_runs, EPI_RUNS). The template's own code for both - its defines,
the traced chain's epilogue, the tile walk - is compiled with the host's compiler; each warpgroup's 128
threads run as host threads with its named barrier a pthread barrier, over every tile of the output. Both
must write the same values to the same places, and every output: flat padded planes whose runs cross a
row's padded end, tiles of rows past the image's edge, a channel tile past C_out, a transposed
convolution's phases (pixels S apart), 16-byte stores of 4 (fp32) or 8 (bf16) values, and the staged tiles
in the stage ring (a block of one tile) or in their own shared memory (PERSIST)."""

import ctypes
import re

import pytest

from cuforge.kernels.conv import ConvTf32x3Sm90
from cuforge.kernels.conv_half import ConvHalfSm90
from template_helpers import HOST_CONVERT, HOST_CUDA, NARROW16, device_function, host_library, problem_from_expr

HOST_PRELUDE = HOST_CUDA + r"""
static pthread_barrier_t consumer_bars[2], both_bar;
static inline void host_bar(int ci) { pthread_barrier_wait(&consumer_bars[ci]); }
static inline void host_bar_both() { pthread_barrier_wait(&both_bar); }
"""

# Each tile: the two consumer warpgroups' 256 threads at once, each filling its fragment of the tile's sums
# (acc[i * 4 + 2 h + j] holds pixel warp * 16 + lane / 4 + 8 h, channel 8 i + 2 (lane % 4) + j) from
# value(tile, pixel, channel), then storing them by the chosen epilogue.
HOST_RUN = r"""
static float value(int pid, int p, int col) { return sinf(0.37f * pid + 0.11f * p + 0.053f * col) * 3.f; }
extern "C" int run(int runs, out_t* out, int NB, int CO, int OD, int OH, int OW, EPI_PARAMS) {
    static float sm[2 * BN * EPI_PITCH + 4] __attribute__((aligned(16)));
    const int tiles = tile_count(NB, CO, OD, OH, OW);
    for (int pid = 0; pid < tiles; ++pid) {
        const Tile T = tile_at(pid, NB, CO, OD, OH, OW, true);
        pthread_barrier_init(&consumer_bars[0], nullptr, 128);
        pthread_barrier_init(&consumer_bars[1], nullptr, 128);
        pthread_barrier_init(&both_bar, nullptr, 256);
        std::vector<std::thread> threads;
        for (int k = 0; k < 256; ++k) threads.emplace_back([=] {
            const int ci = k / 128, t = k % 128, warp = t / 32, lane = t % 32;
            float acc[BN / 2];
            for (int h = 0; h < 2; ++h)
                for (int i = 0; i < BN / 8; ++i)
                    for (int j = 0; j < 2; ++j)
                        acc[i * 4 + 2 * h + j] = value(pid, ci * 64 + warp * 16 + lane / 4 + 8 * h, i * 8 + (lane % 4) * 2 + j);
            if (runs) store_tile_runs(T, acc, sm + ci * BN * EPI_PITCH, out, ci, t, NB, CO, OD, OH, OW, EPI_ARGS);
            else store_tile(T, acc, out, ci, t, NB, CO, OD, OH, OW, EPI_ARGS);
        });
        for (auto& th : threads) th.join();
        pthread_barrier_destroy(&consumer_bars[0]);
        pthread_barrier_destroy(&consumer_bars[1]);
        pthread_barrier_destroy(&both_bar);
    }
    return tiles;
}
"""


def host_epilogues(tmp_path, fam, p, config):
    """The rendered kernel's defines, tap windows, epilogue and tile walk with the harness, built for the
    host; (the library, the epilogue's operand count)."""
    src = fam.render({**config, "EPI_RUNS": 1}, p).source
    defines = src[src.index("#define HALF"):src.index("struct __align__(64) TmaDesc")]
    taps = src[src.index("__device__ __forceinline__ bool window("):src.index("__device__ __forceinline__ void split_store(")]
    body = src[src.index("__device__ __forceinline__ float epilogue("):src.index("#define STORE_TILE")] + "#endif\n"  # EPI_RUNS's
    # the warpgroup's named barrier (split_x's, under DIRECT, is compiled out here like the rest of DIRECT), and
    # both warpgroups' where the staged tiles lie in the stage ring
    body = body.replace('asm volatile("barrier.sync %0, 128;\\n" :: "r"(2 + ci) : "memory");', "host_bar(ci);")
    body = body.replace('asm volatile("barrier.sync 1, 256;\\n" ::: "memory");', "host_bar_both();")
    params = re.search(r"float epilogue\(float v, long long r, int c, int cols(.*?)\) \{", body).group(1)
    args = ", ".join(re.findall(r"(e\d+)\b", params))
    harness = HOST_RUN.replace("EPI_PARAMS", params.lstrip(", ")).replace("EPI_ARGS", args)
    types = HOST_CONVERT + f"typedef {'__nv_bfloat16' if '#define HALF 1' in defines else 'float'} out_t;\n" + device_function(src, NARROW16)
    return host_library(tmp_path, HOST_PRELUDE + defines + types + taps + body + harness), args.count("e")


CASES = [  # (layer, x shape, residual shape, config)
    ("nn.Conv2d(144, 24, 3, padding=1, bias=False)", "2, 144, 19, 23", "2, 24, 19, 23", {"BN": 32, "FLAT": 1, "TW": 128, "TH": 1}),
    ("nn.Conv2d(144, 24, 3, padding=1, bias=False)", "2, 144, 19, 23", "2, 24, 19, 23", {"BN": 64, "TW": 32, "TH": 4}),
    ("nn.Conv2d(64, 256, 1, bias=False)", "2, 64, 20, 20", "2, 256, 20, 20", {"BN": 128, "FLAT": 1, "TW": 128, "TH": 1}),
    ("nn.Conv2d(64, 256, 1, bias=False)", "2, 64, 20, 20", "2, 256, 20, 20", {"BN": 64, "TW": 32, "TH": 4, "PERSIST": 1}),
    ("nn.Conv2d(32, 64, 3, stride=2, padding=1, bias=False)", "3, 32, 29, 30", "3, 64, 15, 15", {"BN": 64, "TW": 16, "TH": 8}),
    ("nn.ConvTranspose2d(48, 32, 3, stride=2, padding=1, output_padding=1, bias=False)", "2, 48, 9, 11", "2, 32, 18, 22",
     {"BN": 32, "TW": 32, "TH": 4}),
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layer,x_shape,res_shape,layout", CASES, ids=[f"{c[0].split('(')[0]}-{i}" for i, c in enumerate(CASES)])
def test_the_epilogue_by_runs_writes_what_fragment_order_writes(tmp_path, layer, x_shape, res_shape, layout, dtype):
    import torch

    out_channels = layer.split("(")[1].split(",")[1].strip()
    p = problem_from_expr(tmp_path, "torch.relu(self.bn(self.conv(a)) + b)",
                          f"torch.randn({x_shape}, dtype=torch.{dtype}), torch.randn({res_shape}, dtype=torch.{dtype})", "a, b",
                          f"        self.conv = {layer[:-1]}, dtype=torch.{dtype})\n        self.bn = nn.BatchNorm2d({out_channels}, dtype=torch.{dtype})\n"
                          "        with torch.no_grad():\n            self.bn.running_var.uniform_(0.5, 1.5)\n"
                          "            self.bn.running_mean.uniform_(-0.5, 0.5)\n        self.eval()")
    fam = ConvTf32x3Sm90() if dtype == "float32" else ConvHalfSm90()
    f = fam.matched(p)
    config = {"GROUP_M": 8, "FOLD": 0, "STAGES": 2, **layout}
    assert fam.valid({**config, "EPI_RUNS": 1}, p), config
    lib, n_operands = host_epilogues(tmp_path, fam, p, config)
    g = torch.Generator().manual_seed(0)
    shapes = {"rc": (f.n, f.c_out, *f.out_spatial), "bn_ch": (f.c_out,)}  # the residual; batch norm's vectors
    operands = [(torch.rand(shapes[kind], generator=g) + 0.5).to(getattr(torch, dtype)) for _, kind in f.epilogue.tensors]
    assert len(operands) == n_operands == 5  # batch norm's four vectors and the residual
    outs = []
    for runs in (0, 1):
        out = torch.full((f.n, f.c_out, *f.out_spatial), float("nan"), dtype=getattr(torch, dtype))
        ptrs = [ctypes.c_void_p(t.data_ptr()) for t in operands]
        tiles = lib.run(ctypes.c_int(runs), ctypes.c_void_p(out.data_ptr()), ctypes.c_int(f.n), ctypes.c_int(f.c_out),
                        ctypes.c_int(1), *(ctypes.c_int(d) for d in f.out_spatial), *ptrs)
        assert tiles > 1
        outs.append(out)
    written = ~torch.isnan(outs[0])
    assert bool(written.all()), f"{int((~written).sum())} outputs never written"
    assert torch.equal(outs[0], outs[1])
