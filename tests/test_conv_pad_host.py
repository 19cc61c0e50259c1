"""The flat padded planes' two kernels run on the host: _pad_x (an element a thread access) and _pad_xv
(XVEC: 16 bytes a thread access where whole), each compiled from the rendered template with the host's
compiler, every block's threads as host threads with __syncthreads a barrier. Both must write the planes
PyTorch's own padding and permute give - zeros around x and past C, channels last - bit for bit: fp16/bf16
(8 elements a vector) and fp32 (4), 1x1 (no padding: every vector whole), 3x3 padded (vectors across the
padding fall back to elements), 3-D, channels not a multiple of the block's 64, and x at an address 16
bytes do not divide (every vector falls back)."""

import ctypes
import re

import pytest

from cuforge.kernels.conv import ConvTf32x3Sm90, flat_lead, flat_padded
from cuforge.kernels.conv_half import ConvHalfSm90
from template_helpers import HOST_CUDA, host_library, problem_from_expr

# The planes' second half (small) is written only in fp32 with three TF32 products; a stand-in split
# (the big part the value, the small part its half) is enough to check where each lands.
SPLIT_HOST = r"""
static inline void split_store(plane_t v, plane_t* big, plane_t* small) { *big = v; if (PLANES == 2 && !HALF) *small = v / 2; }
"""
HOST_RUN = r"""
extern "C" void run(int vec, const plane_t* x, plane_t* y, int NB, int C, int CP, int ID, int IH, int IW, int DP, int HP, int LD, int LH, int LW,
                    int WPX) {
    if (vec) host_grid((HP * WPX + 63) / 64, (CP + 63) / 64, NB * DP, 256, 1, [=] { ENTRY_pad_xv(x, y, C, CP, ID, IH, IW, DP, HP, LD, LH, LW, WPX); });
#if FLAT
    else host_grid((HP * WP + 31) / 32, (CP + 31) / 32, NB * DP, 32, 8, [=] { ENTRY_pad_x(x, y, C, CP, ID, IH, IW, DP, HP, LD, LH, LW); });
#endif
}
"""


def kernel_text(src: str, name: str) -> str:
    start = src.index(f'extern "C" __global__ void __launch_bounds__(256) {name}(')
    return src[start:src.index("\n}\n", start) + 3]


def host_pads(tmp_path, fam, p, config):
    src = fam.render({**config, "XVEC": 1}, p).source
    defines = src[src.index("#define HALF"):src.index("struct __align__(64) TmaDesc")]
    plane = "typedef unsigned short plane_t;\n" if "#define HALF 1" in defines else "typedef float plane_t;\n"
    pitch = re.search(r"#define XV_PITCH .*\n", src).group(0)
    flat = kernel_text(src, f"{fam.name}_pad_x") if config.get("FLAT") else ""
    kernels = flat + pitch + kernel_text(src, f"{fam.name}_pad_xv")
    return host_library(tmp_path, HOST_CUDA + defines + plane + SPLIT_HOST + kernels + HOST_RUN.replace("ENTRY", fam.name))


def conv_case(tmp_path, layer, shape, dtype):
    """(the problem, its implicit-GEMM family, the match) of a bare convolution in `dtype`."""
    p = problem_from_expr(tmp_path, "self.conv(a)", f"torch.randn({shape}, dtype=torch.{dtype})", "a",
                          f"        self.conv = {layer[:-1]}, dtype=torch.{dtype})")
    fam = ConvTf32x3Sm90() if dtype == "float32" else ConvHalfSm90()
    return p, fam, fam.matched(p)


def x_at(f, dtype, offset, seed):
    """(x, the element type its bits move as, CP): x `offset` elements into its storage (1: no row starts on
    16 bytes), a bf16's 16 bits as int16 (moved as they are), channels rounded up to a 16-byte vector."""
    import torch

    elem = torch.float32 if dtype == "float32" else torch.int16
    per = 4 if dtype == "float32" else 8
    g = torch.Generator().manual_seed(seed)
    storage = torch.randn(f.n * f.c * int(torch.tensor(f.spatial).prod()) + 8, generator=g).to(getattr(torch, dtype)).view(elem)
    return storage[offset:offset + storage.numel() - 8].view(f.n, f.c, *f.spatial), elem, -(-f.c // per) * per


def planes_of(x, elem, cp, pads):
    """The big plane x makes: zero-padded by `pads` (F.pad's order) and past its channels to `cp`, channels
    last; fp32's small plane is the stand-in split's half of it."""
    import torch
    import torch.nn.functional as F

    wide = F.pad(x.float() if elem.is_floating_point else x.to(torch.float64), pads + [0, cp - x.shape[1]])
    return wide.movedim(1, -1).reshape(-1)


def assert_planes(y, want, elem):
    import torch

    assert torch.equal(y[:want.numel()].to(want.dtype), want)
    if elem.is_floating_point:  # fp32: three TF32 products read the small plane too
        assert torch.equal(y[want.numel():], (want / 2).to(elem))


CASES = [("nn.Conv2d(40, 16, 1)", "2, 40, 12, 20"), ("nn.Conv2d(72, 16, 3, padding=1)", "2, 72, 13, 21"),
         ("nn.Conv2d(24, 8, (3, 5), padding=(1, 2))", "1, 24, 9, 30"), ("nn.Conv3d(16, 8, 3, padding=1)", "1, 16, 4, 6, 17")]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "x off 16 bytes"])
@pytest.mark.parametrize("layer,shape", CASES, ids=[c[0].split("(")[0] + f"-{i}" for i, c in enumerate(CASES)])
def test_the_vector_padding_kernel_writes_the_planes_the_element_one_does(tmp_path, layer, shape, dtype, offset):
    import torch

    p, fam, f = conv_case(tmp_path, layer, shape, dtype)
    config = {"BN": 16, "TW": 128, "TH": 1, "FLAT": 1, "GROUP_M": 8, "FOLD": 0, "STAGES": 2}
    assert fam.valid({**config, "XVEC": 1}, p)
    lib = host_pads(tmp_path, fam, p, config)
    x, elem, cp = x_at(f, dtype, offset, 1)
    dp, ld = (flat_padded(f, 0), flat_lead(f, 0)) if f.dims == 3 else (1, 0)
    hp, wp = flat_padded(f, -2), flat_padded(f, -1)
    outs = []
    for vec in (0, 1):
        y = torch.full(((2 if elem.is_floating_point else 1) * f.n * dp * hp * wp * cp,), -7 if elem == torch.int16 else float("nan"), dtype=elem)
        lib.run(ctypes.c_int(vec), ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()), *(ctypes.c_int(v) for v in (
            f.n, f.c, cp, f.spatial[0] if f.dims == 3 else 1, f.spatial[-2], f.spatial[-1], dp, hp, ld, flat_lead(f, -2), flat_lead(f, -1), wp)))
        outs.append(y)
    assert torch.equal(outs[0], outs[1])
    pads = []  # what they both must be: x zero-padded, the lead before and the rest after, per dim innermost first
    for axis in range(-1, -f.dims - 1, -1):
        lead, size = flat_lead(f, axis), flat_padded(f, axis)
        pads += [lead, size - lead - f.spatial[axis]]
    assert_planes(outs[0], planes_of(x, elem, cp, pads), elem)


PLAIN = [("nn.Conv2d(40, 16, 3, stride=2, padding=1)", "2, 40, 13, 24"), ("nn.Conv1d(24, 8, 5, padding=2)", "3, 24, 70"),
         ("nn.Conv3d(16, 8, 3, stride=(1, 2, 2))", "1, 16, 4, 9, 16"), ("nn.ConvTranspose2d(72, 8, 3, stride=2)", "2, 72, 7, 8")]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "x off 16 bytes"])
@pytest.mark.parametrize("layer,shape", PLAIN, ids=[c[0].split("(")[0] + f"-{i}" for i, c in enumerate(PLAIN)])
def test_the_vector_kernel_writes_the_plain_planes_of_tiles_of_rows(tmp_path, layer, shape, dtype, offset):
    """Without FLAT the same kernel writes _split's planes (x channels last, unpadded): strided, 1-D, 3-D and
    transposed convolutions, against PyTorch's permute."""
    import torch

    p, fam, f = conv_case(tmp_path, layer, shape, dtype)
    config = next(c for c in fam.seeds(p) if not c.get("FLAT") and not c.get("FOLD") and not c.get("DIRECT"))
    assert fam.valid({**config, "XVEC": 1}, p) and not fam.valid({**config, "XVEC": 1, "FOLD": 1}, p)
    launch = fam.render({**config, "XVEC": 1}, p).launch
    assert launch.pre[0][0] == f"{fam.name}_pad_xv" and launch.pre[0][2] == "(256,)"
    lib = host_pads(tmp_path, fam, p, config)
    x, elem, cp = x_at(f, dtype, offset, 2)
    depth, ih, iw = ((f.spatial[0] if f.dims == 3 else 1), (f.spatial[-2] if f.dims >= 2 else 1), f.spatial[-1])
    y = torch.full(((2 if elem.is_floating_point else 1) * f.n * depth * ih * iw * cp,), -7 if elem == torch.int16 else float("nan"), dtype=elem)
    lib.run(ctypes.c_int(1), ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()), *(ctypes.c_int(v) for v in (
        f.n, f.c, cp, depth, ih, iw, depth, ih, 0, 0, 0, iw)))
    assert_planes(y, planes_of(x, elem, cp, [0, 0] * f.dims), elem)
