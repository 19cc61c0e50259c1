"""fp32 1x1 convolutions as a GEMM of x as it lies (conv_pointwise_f32), on the CPU: what it covers and
refuses, one TF32 product only where the precision contract allows TF32, the launch (W shared by every
image, rows of the output over (image, channel) for the epilogue's channel), and every seed compiling for
sm_90a without spills (the first for sm_80 too)."""

import subprocess

import pytest

from cuforge.kernels.conv_pointwise import ConvPointwiseF32
from cuforge.kernels.families import families_for
from cuforge.runtime import compile_cuda
from template_helpers import conv_problem, family_configs

FAM = ConvPointwiseF32()


def test_a_1x1_convolution_is_covered_and_launched_as_a_gemm_of_x_as_it_lies(tmp_path):
    # KernelBench level1/87's kind (64 -> 128 channels), small; a bias, a per-channel operand, a ReLU
    p = conv_problem(tmp_path, "nn.Conv2d(64, 128, 1)", "(2, 64, 20, 24)", "torch.relu(y) * self.bias")
    assert FAM.supports(p) is None
    names = [f.name for f in families_for(p)[0]]
    assert names.index("conv_tf32x3_sm90") < names.index(FAM.name)  # three products: not yet timed against it
    assert families_for(p.under("pytorch"))[0][0].name == FAM.name  # one product: faster than the implicit GEMM
    launch = FAM.render(FAM.seeds(p)[0], p).launch
    assert launch.args[:6] == ("param1", "in0", "out0", "M", "N", "K")  # the weight (param0 is self.bias)
    assert dict(launch.bindings) == {"M": "param1.shape[0]", "K": "param1.shape[1]",
                                     "N": "in0.numel() // (in0.shape[0] * in0.shape[1])", "BATCH": "in0.shape[0]"}
    assert launch.outputs == (("(2, 128, 20, 24)", "float32"),) and launch.grid.endswith(", BATCH)")
    assert not launch.pre and not launch.scratch  # no layout pass over x or W
    src = FAM.render(FAM.seeds(p)[0], p).source
    assert "#define A_SHARED 1" in src and "#define BATCHED 1" in src
    assert "(r % 128)" in src  # the bias and the operand per channel: the flat row's channel


def test_one_tf32_product_only_where_the_contract_allows_tf32(tmp_path):
    p = conv_problem(tmp_path, "nn.Conv2d(32, 64, 1, bias=False)", "(2, 32, 16, 16)")
    strict = FAM.seeds(p)
    assert strict and {c["MATH"] for c in strict} == {"tf32x3"}
    assert not FAM.valid({**strict[0], "MATH": "tf32"}, p)
    default = FAM.seeds(p.under("pytorch"))
    assert default[0]["MATH"] == "tf32" and {c["MATH"] for c in default} == {"tf32", "tf32x3"}
    assert FAM.reduced_precision(default[0]) and not FAM.reduced_precision(strict[0])
    assert [c for c in default if c["MATH"] == "tf32x3"] == strict  # the same tiles, three products, after


@pytest.mark.parametrize("layer, shape, why", [
    ("nn.Conv2d(32, 64, 3, padding=1)", "(2, 32, 16, 16)", "not 1x1"),
    ("nn.Conv2d(32, 64, 1, stride=2)", "(2, 32, 16, 16)", "not 1x1"),
    ("nn.Conv2d(32, 64, 1, padding=1)", "(2, 32, 16, 16)", "not 1x1"),
    ("nn.Conv2d(32, 64, 1, groups=2)", "(2, 32, 16, 16)", "grouped convolution"),
    ("nn.ConvTranspose2d(32, 64, 1)", "(2, 32, 16, 16)", "transposed or grouped"),
])
def test_other_convolutions_are_left_to_the_implicit_gemm(tmp_path, layer, shape, why):
    p = conv_problem(tmp_path, layer, shape)
    assert why in FAM.supports(p)


def test_half_convolutions_are_not_taken(tmp_path):
    from template_helpers import problem_from_expr

    p = problem_from_expr(tmp_path, "self.conv(a)", "torch.randn(2, 32, 16, 16, dtype=torch.bfloat16)", "a",
                          "        self.conv = nn.Conv2d(32, 64, 1, dtype=torch.bfloat16)")
    assert "fp32" in FAM.supports(p)


@pytest.mark.parametrize("layer, shape", [("nn.Conv1d(30, 50, 1)", "(3, 30, 37)"),  # rows of odd lengths: 4-byte copies
                                          ("nn.Conv3d(16, 24, 1)", "(2, 16, 4, 5, 6)")])
def test_other_pixel_layouts_compile(tmp_path, layer, shape):
    p = conv_problem(tmp_path, layer, shape).under("pytorch")
    assert FAM.supports(p) is None
    configs = family_configs(FAM, p, 1)
    for c in (configs[0], configs[-1]):  # the first seed and a random config
        cand = FAM.render(c, p)
        compile(cand.module_source(), "<wrapper>", "exec")
        assert len(compile_cuda(cand.source, arch="sm_90a").cubin) > 0, c


def test_no_seed_spills(tmp_path):
    # every seed through ptxas -v (which names any spill); a random config and the wrappers as Python too
    p = conv_problem(tmp_path, "nn.Conv2d(64, 128, 1)", "(2, 64, 20, 24)", "torch.relu(y) * self.bias").under("pytorch")
    for c in family_configs(FAM, p, 1)[len(FAM.seeds(p)):]:
        assert len(compile_cuda(FAM.render(c, p).source, arch="sm_90a").cubin) > 0, c
    for i, c in enumerate(FAM.seeds(p)):
        compile(FAM.render(c, p).module_source(), "<wrapper>", "exec")
        src = tmp_path / "k.cu"
        src.write_text(FAM.render(c, p).source)
        for arch in ("sm_90a", "sm_80")[:2 if i == 0 else 1]:  # spills counted on Hopper; the first seed on Ampere too
            r = subprocess.run(["nvcc", f"-arch={arch}", "-cubin", "-Xptxas", "-v", "-o", str(tmp_path / "k.cubin"), str(src)],
                               capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, r.stderr[-2000:]
            assert arch != "sm_90a" or "0 bytes spill stores" in r.stderr, (c, arch, r.stderr[-2000:])


def test_w_resident_configs_and_configs_from_before_the_knobs(tmp_path):
    p = conv_problem(tmp_path, "nn.Conv2d(64, 256, 1)", "(2, 64, 20, 24)", "y").under("pytorch")
    c = dict(BM=128, BN=64, BK=32, WM=2, WN=2, STAGES=3, GROUP_M=8, MATH="tf32", PROMOTE=1, NT=4, A_RES=1)
    assert FAM.valid(c, p)
    assert not FAM.valid({**c, "NT": 1}, p)  # one tile a block: nothing to keep W for
    # W's 128 rows of 64 channels (+8) once, beside three stages of x's tiles
    assert FAM.smem_bytes(c, 64) == (128 * 72 + 3 * 32 * 68) * 4
    # two block rows of W (256 channels out), each over its own stretch of 480 pixels in tiles of 64
    assert FAM.launch(c, p).grid == "(cdiv(M, 128) * cdiv(cdiv(N, 64), 4), BATCH)"
    assert len(compile_cuda(FAM.render(c, p).source, arch="sm_90a").cubin) > 0
    # a config stored before NT and A_RES existed means one tile a block, W loaded for it
    old = {k: v for k, v in c.items() if k not in ("NT", "A_RES")}
    assert FAM.render(old, p).source == FAM.render({**old, "NT": 1, "A_RES": 0}, p).source
