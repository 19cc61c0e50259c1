"""conv_direct's shared-weight kernel (WIN) run on the host with 8 pixels a thread, its rows read and its
outputs written element by element and 16 bytes at a time (VW): compiled from the rendered template with
the host's compiler, each block's threads as host threads (__syncthreads a barrier), every block in turn.
Both must write the same values, and what PyTorch's convolution gives: depthwise 3x3 and 7x7 over rows
whose starts are 16-byte aligned and not, a grouped convolution, a 1-D one; fp32 and bf16 (4 and 8
elements a vector)."""

import ctypes

import pytest

from cuforge.kernels.conv_direct import ConvDirect
from template_helpers import HOST_CONVERT, HOST_CUDA, NARROW16, device_function, host_library, problem_from_expr

HOST_PRELUDE = HOST_CUDA + "static float4 host_smem[1 << 14];  // the WIN kernel's dynamic shared memory\n"
HOST_RUN = r"""
extern "C" void run(const elem_t* x, const elem_t* w, elem_t* y, long long items, int gx, int gy, int threads) {
    host_grid(gx, gy, 1, threads, 1, [=] { conv_direct(x, w, y, items); });
}
"""


def host_kernel(tmp_path, fam, p, config, half):
    src = fam.render(config, p).source
    body = src[src.index("__device__ __forceinline__ float epilogue("):]
    body = body[:body.index("{| else |}")] if "{| else |}" in body else body
    end = body.index('extern "C" __global__ void __launch_bounds__')
    kernel = body[end:]
    kernel = kernel[:kernel.index("\n}\n") + 3]
    text = body[:end] + kernel.replace("extern __shared__ float4 weights4[];", "float4* weights4 = host_smem;")
    types = f"typedef {'__nv_bfloat16' if half else 'float'} elem_t;\n" + device_function(src, NARROW16)
    return host_library(tmp_path, HOST_PRELUDE + HOST_CONVERT + types + text + HOST_RUN)


CASES = [("nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False)", "2, 16, 9, 56"),   # rows 16-byte aligned
         ("nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False)", "2, 16, 9, 30"),   # rows alternately not
         ("nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False)", "1, 16, 16, 31"),  # a last group of 7 pixels
         ("nn.Conv2d(8, 8, 7, padding=3, groups=8, bias=False)", "1, 8, 12, 40"),      # ConvNeXt's 7x7
         ("nn.Conv2d(16, 32, 3, padding=1, groups=4, bias=False)", "1, 16, 6, 24"),    # grouped, 8 channels a thread
         ("nn.Conv1d(8, 8, 5, padding=2, groups=8, bias=False)", "2, 8, 64")]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layer,shape", CASES, ids=[f"{c[0].split('(')[0]}-{i}" for i, c in enumerate(CASES)])
def test_rows_and_outputs_moved_16_bytes_at_a_time_compute_the_same(tmp_path, layer, shape, dtype):
    import torch

    p = problem_from_expr(tmp_path, "self.conv(a)", f"torch.randn({shape}, dtype=torch.{dtype})", "a",
                          f"        self.conv = {layer[:-1]}, dtype=torch.{dtype})")
    fam = ConvDirect()
    f = fam.matched(p)
    cog = f.c_out // f.groups
    base = dict(BLOCK=128, OCT=min(cog, 8), PW=8, WIN=1)
    assert fam.valid(base, p) and fam.valid({**base, "VW": 1}, p) and not fam.valid({**base, "VW": 1, "PW": 4}, p)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(*map(int, shape.split(",")), generator=g).to(getattr(torch, dtype))
    w = (torch.randn(f.c_out, f.c // f.groups, *f.kernel, generator=g) / 3).to(getattr(torch, dtype))
    bits = torch.float32 if dtype == "float32" else torch.int16
    outs = []
    for vw in (0, 1):
        config = {**base, "VW": vw}
        launch = fam.render(config, p).launch
        lib = host_kernel(tmp_path, fam, p, config, dtype != "float32")
        items = int(dict(launch.bindings)["items"])
        gx, gy = -(-items // base["BLOCK"]), f.c_out // base["OCT"]
        y = torch.full((f.n, f.c_out, *f.out_spatial), float("nan"), dtype=getattr(torch, dtype))
        lib.run(ctypes.c_void_p(x.view(bits).data_ptr()), ctypes.c_void_p(w.view(bits).data_ptr()), ctypes.c_void_p(y.view(bits).data_ptr()),
                ctypes.c_longlong(items), ctypes.c_int(gx), ctypes.c_int(gy), ctypes.c_int(base["BLOCK"]))
        outs.append(y)
    assert not torch.isnan(outs[0].float()).any()
    assert torch.equal(outs[0].view(bits), outs[1].view(bits))
    conv = getattr(torch.nn.functional, f"conv{f.dims}d")
    want = conv(x.double(), w.double(), padding=f.padding, groups=f.groups)
    assert torch.allclose(outs[1].double(), want, atol=1e-4 if dtype == "float32" else 5e-2, rtol=1e-2)
