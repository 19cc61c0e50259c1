"""The fp16/bf16 implicit-GEMM convolution family on the CPU: what it covers and refuses, that its
seeds and random configs compile for sm_90a, and that the fp32 family keeps fp32 convolutions."""

import pytest

from cuforge.kernels.conv import ConvTf32x3Sm90
from cuforge.kernels.conv_half import ConvHalfSm90
from cuforge.kernels.families import families_for
from template_helpers import problem_from_expr, smoke_compile


def half_conv(tmp_path, layer, shape, dtype="bfloat16", tail="y"):
    return problem_from_expr(tmp_path, f"(lambda y: {tail})(self.conv(a))", f"torch.randn({shape}, dtype=torch.{dtype})", "a",
                             f"        self.conv = {layer[:-1]}, dtype=torch.{dtype})")


@pytest.mark.parametrize("layer,shape,dtype", [("nn.Conv2d(64, 128, 3, padding=1)", "2, 64, 30, 31", "bfloat16"),
                                               ("nn.ConvTranspose2d(32, 16, 3, stride=2, padding=1)", "2, 32, 17, 18", "float16"),
                                               ("nn.Conv3d(16, 32, 3)", "2, 16, 8, 9, 10", "bfloat16"),
                                               ("nn.Conv1d(20, 64, 5, padding=2)", "4, 20, 300", "float16")])
def test_half_convolutions_are_covered_and_compile(tmp_path, layer, shape, dtype):
    p = half_conv(tmp_path, layer, shape, dtype, "torch.relu(y) * 2")
    fam = ConvHalfSm90()
    assert fam.supports(p) is None
    seeds = fam.seeds(p)
    assert seeds and all(fam.valid(c, p) for c in seeds)
    assert not any(k in c for c in seeds for k in ("PASSES", "DIRECT", "DENSE_W"))  # fp32's knobs only
    assert not fam.reduced_precision(seeds[0])  # half products summed in fp32: no contract needed
    # the epilogue by runs and x laid out 16 bytes an access (where its planes are not folded) lead; the
    # first seed without either comes last
    assert seeds[0]["EPI_RUNS"] == 1 and seeds[0].get("XVEC", 0) == int(not seeds[0]["FOLD"])
    assert seeds[-1] == {k: v for k, v in seeds[0].items() if k not in ("EPI_RUNS", "XVEC")}
    assert families_for(p)[0][0].name == "conv_half_sm90"
    src = fam.render(seeds[0], p).source
    assert f"k16.f32.{'bf16' if dtype == 'bfloat16' else 'f16'}" in src and "tf32_split(v" not in src.split("HALF")[0]
    launch = fam.launch(fam.complete(seeds[0]), p)
    assert all(s[1] == dtype for s in launch.scratch) and launch.outputs[0][1] == dtype
    smoke_compile(fam, p, 2)


def test_half_convolutions_refused_where_another_family_serves(tmp_path):
    fam = ConvHalfSm90()
    pooled = half_conv(tmp_path, "nn.Conv2d(32, 64, 3)", "2, 32, 16, 16", tail="torch.mean(y, dim=(2, 3))")
    assert "summed over its pixels" in fam.supports(pooled)
    grouped = half_conv(tmp_path, "nn.Conv2d(32, 32, 3, groups=32)", "2, 32, 16, 16")
    assert "grouped" in fam.supports(grouped)
    few_3d = half_conv(tmp_path, "nn.Conv3d(3, 16, 3)", "1, 3, 8, 9, 10")
    assert "conv_direct's case" in fam.supports(few_3d)
    fp32 = problem_from_expr(tmp_path, "self.conv(a)", "torch.randn(2, 64, 16, 16)", "a", "        self.conv = nn.Conv2d(64, 64, 3)")
    assert "not fp16/bf16" in fam.supports(fp32)
    assert ConvTf32x3Sm90().supports(fp32) is None
    assert "fp32" in ConvTf32x3Sm90().supports(half_conv(tmp_path, "nn.Conv2d(64, 64, 3)", "2, 64, 16, 16"))


def test_a_1x1_convolution_reads_x_as_it_lies(tmp_path):
    # MobileNetV2's expansion: 24 channels (one k-tile, zero-filled past them), 784 pixels (a ragged last tile)
    p = half_conv(tmp_path, "nn.Conv2d(24, 144, 1, bias=False)", "2, 24, 28, 28", tail="torch.clamp(y, 0, 6)")
    fam = ConvHalfSm90()
    nchw = fam.seeds(p)[0]  # first: timed faster than every other seed
    assert nchw["NCHW"] == 1 and nchw["FLAT"] == 1 and not nchw.get("XVEC")
    cand = fam.render(nchw, p)
    # no channels-last planes: only the weight's layout kernel runs first, and TMA reads x's planes of pixels
    assert [pre[0] for pre in cand.launch.pre] == ["conv_half_sm90_split"] and cand.launch.scratch[0][0] == "(1,)"
    assert cand.launch.args[0] == "tma_nd(in0, (64, 64, 1), view=(NB, C, -1))"
    assert "#define NCHW 1" in cand.source and "WGMMA_ONE wgmma_half_mn_a" in cand.source
    assert not fam.valid({**nchw, "XVEC": 1}, p) and not fam.valid({**nchw, "FLAT": 0, "TW": 32, "TH": 4}, p)
    # a 3x3, a strided or a padded 1x1, planes of no whole 16 bytes (7 x 7 pixels), fp32: x goes through planes
    for layer, shape, dtype in [("nn.Conv2d(24, 144, 3, padding=1)", "2, 24, 28, 28", "bfloat16"),
                                ("nn.Conv2d(24, 144, 1, stride=2)", "2, 24, 28, 28", "bfloat16"),
                                ("nn.Conv2d(24, 144, 1, padding=1)", "2, 24, 28, 28", "float16"),
                                ("nn.Conv2d(24, 144, 1)", "2, 24, 7, 7", "bfloat16"),
                                ("nn.Conv2d(24, 144, 1)", "2, 24, 28, 28", "float32")]:
        q = half_conv(tmp_path, layer, shape, dtype)
        f = ConvHalfSm90() if dtype != "float32" else ConvTf32x3Sm90()
        flat = {k: v for k, v in f.seeds(q)[0].items() if k not in ("XVEC", "TW", "TH")} | {"FLAT": 1, "TW": 128, "TH": 1}
        assert not f.valid({**flat, "NCHW": 1}, q) and not any(c.get("NCHW") for c in f.seeds(q)), layer
    smoke_compile(fam, p, 1)
